"""Devnet block validation: each of pearld's rules with its text, and their order (§3.4)."""
from __future__ import annotations

import dataclasses

import pytest

from node_client.devnet.chain import Chain
from node_client.devnet.cpu_miner import DEFAULT_CONFIG, MAX_ATTEMPTS
from node_client.devnet.node import DevnetNode
from node_client.devnet.placeholder import build_certificate, placeholder_proof
from node_client.devnet.validate import block_subsidy, go_time
from node_client.forks import get_params
from node_client.pearld import BlockTemplate
from proof import int7
from proof.certificate import CertificateV1, CertificateV3, CertificateV4, placeholder, proof_commitment
from proof.chain import (
    Block,
    BlockHeader,
    TxOut,
    coinbase_transaction,
    display_hex,
    from_display_hex,
    merkle_root,
    p2tr_script,
)

PAYOUT = p2tr_script(bytes(range(32)))
NOW = 1_790_000_000


@dataclasses.dataclass
class Spec:
    """What a test block is made of; every field defaults to the valid choice."""

    version: int = 3
    bits: int | None = None
    timestamp: int | None = None
    height: int | None = None
    value: int | None = None
    payout: bytes = PAYOUT
    config: int7.MiningConfig = DEFAULT_CONFIG
    bad_merkle: bool = False
    commitment: bytes | None = None
    cert_hash: bytes | None = None


def make_block(chain: Chain, spec: Spec) -> Block:
    template = BlockTemplate.from_rpc(DevnetNode(chain).template())
    height = template.height if spec.height is None else spec.height
    value = template.coinbase_value if spec.value is None else spec.value
    coinbase = coinbase_transaction(height, value, PAYOUT, template.default_witness_commitment)
    if spec.payout != PAYOUT:  # proof.chain refuses to build other outputs; a block may still carry one
        outputs = (TxOut(value, spec.payout),) + coinbase.outputs[1:]
        coinbase = dataclasses.replace(coinbase, outputs=outputs)
    root = bytes(32) if spec.bad_merkle else merkle_root([coinbase.txid()])
    bits = template.bits if spec.bits is None else spec.bits
    timestamp = template.curtime if spec.timestamp is None else spec.timestamp
    header76 = BlockHeader(template.version, from_display_hex(template.previous_block_hash), root,
                           timestamp, bits).incomplete_bytes()
    proof = int7.mine_cpu(header76, spec.config, m=80, n=48, bits=bits, cert_version=spec.version,
                          max_attempts=MAX_ATTEMPTS)
    public_data = int7.public_data(header76, proof, cert_version=spec.version)
    commitment = proof_commitment(spec.version, public_data) if spec.commitment is None else spec.commitment
    header = BlockHeader.from_incomplete_bytes(header76, commitment)
    block_hash = header.block_hash() if spec.cert_hash is None else spec.cert_hash
    certificate = build_certificate(spec.version, block_hash, public_data, proof.to_bytes(), chain.proofs)
    return Block(certificate, header, (coinbase,))


@pytest.fixture()
def chain() -> Chain:
    return Chain(get_params("regtest"), clock=lambda: NOW)


def _rejection(chain: Chain, block: Block) -> str | None:
    return chain.submit(block.to_bytes())


def test_a_valid_block_connects_and_a_second_copy_is_a_duplicate(chain: Chain) -> None:
    block = make_block(chain, Spec())
    assert _rejection(chain, block) is None and chain.height == 1
    assert _rejection(chain, block) == f"already have block {display_hex(block.block_hash())}"


def test_merkle_root(chain: Chain) -> None:
    text = _rejection(chain, make_block(chain, Spec(bad_merkle=True)))
    assert text.startswith("block merkle root is invalid - block header indicates 0000")


def test_wrong_version_for_height(chain: Chain) -> None:
    assert _rejection(chain, make_block(chain, Spec(version=2))) == (
        "certificate version 2 is not allowed at height 1 (require version 3)")


def test_rank_penalty_on_regtest(chain: Chain) -> None:
    rank64 = int7.MiningConfig(1024, 64, [0, 8, 64, 72], [0, 1, 8, 9, 32, 33, 40, 41])
    assert _rejection(chain, make_block(chain, Spec(config=rank64))) == (
        "certificate fails the rank penalty rule at height 1 (fork active from height 1): "
        "rank penalty rule violated: Rank must be >= 128 || r=64")


def test_expected_bits(chain: Chain) -> None:
    harder = 0x1E00FFFF
    assert _rejection(chain, make_block(chain, Spec(bits=harder))) == (
        f"block difficulty of {harder} is not the expected value of {0x1E010000}")


def test_bits_above_the_pow_limit(chain: Chain) -> None:
    block = make_block(chain, Spec())
    easier = dataclasses.replace(block.header, bits=0x1F010000)
    text = _rejection(chain, dataclasses.replace(block, header=easier))
    assert text.startswith("block target difficulty of ") and "is higher than max of" in text


def test_timestamp_after_parent_and_not_in_the_future(chain: Chain) -> None:
    parent = chain.tip.block.header.timestamp
    assert _rejection(chain, make_block(chain, Spec(timestamp=parent))) == (
        f"block timestamp of {go_time(parent)} must be at least 1 seconds after previous block timestamp "
        f"{go_time(parent)}")
    future = NOW + 121 * 60
    assert _rejection(chain, make_block(chain, Spec(timestamp=future))) == (
        f"block timestamp of {go_time(future)} is too far in the future")


def test_binding_of_hash_and_commitment(chain: Chain) -> None:
    text = _rejection(chain, make_block(chain, Spec(cert_hash=bytes(32))))
    assert text.startswith("certificate verification failed: block hash mismatch: certificate has 0000")
    text = _rejection(chain, make_block(chain, Spec(commitment=bytes(32))))
    assert text.startswith("certificate verification failed: proof commitment mismatch: header has 0000")


def test_a_proof_for_another_header_fails_verification(chain: Chain) -> None:
    block = make_block(chain, Spec())
    other = make_block(chain, Spec(timestamp=block.header.timestamp + 1))
    certificate = build_certificate(3, block.header.block_hash(), block.certificate.public_data,
                                    other.certificate.proof[17:], chain.proofs)
    text = _rejection(chain, dataclasses.replace(block, certificate=certificate))
    assert text.startswith("certificate verification failed: proof rejected: ")


def test_certificates_that_cannot_be_in_a_regtest_block(chain: Chain) -> None:
    block = make_block(chain, Spec())
    no_cert = dataclasses.replace(block, certificate=None)
    assert _rejection(chain, no_cert) == "block has no certificate"
    v4 = CertificateV4(block.header.block_hash(), b"\x01", b"\x00")
    assert _rejection(chain, dataclasses.replace(block, certificate=v4)) == "certificate version 4 is not allowed"
    zk_like = CertificateV3(block.header.block_hash(), block.certificate.public_data, b"\x01" * 100)
    assert "not a devnet placeholder" in _rejection(chain, dataclasses.replace(block, certificate=zk_like))


def test_coinbase_height_value_and_outputs(chain: Chain) -> None:
    assert _rejection(chain, make_block(chain, Spec(height=2))) == (
        "the coinbase signature script serialized block height is 2 when 1 was expected")
    subsidy = block_subsidy(1)
    assert _rejection(chain, make_block(chain, Spec(value=subsidy + 1))) == (
        f"coinbase transaction for block pays {subsidy + 1} which is more than expected value of {subsidy}")
    assert _rejection(chain, make_block(chain, Spec(payout=b"\x00\x14" + bytes(20)))) == (
        "transaction output 0 has unsupported script type nonstandard")


def test_sanity_runs_before_context(chain: Chain) -> None:
    # Both a bad merkle root (sanity) and a wrong version (context): sanity reports first.
    text = _rejection(chain, make_block(chain, Spec(version=2, bad_merkle=True)))
    assert text.startswith("block merkle root is invalid")


def test_unknown_parent_and_side_chains(chain: Chain) -> None:
    first = make_block(chain, Spec())
    sibling = make_block(chain, Spec(timestamp=first.header.timestamp + 5))
    assert _rejection(chain, first) is None
    assert _rejection(chain, sibling) == (
        f"previous block {display_hex(sibling.header.prev_block)} is not the chain tip "
        "(the devnet keeps no side chains)")
    child = make_block(chain, Spec())
    fresh = Chain(get_params("regtest"), clock=lambda: NOW)
    assert _rejection(fresh, child) == (
        f"previous block {display_hex(first.block_hash())} is unknown (the devnet keeps no orphan blocks)")


def test_v1_block_on_signet() -> None:
    chain = Chain(get_params("signet"), clock=lambda: NOW)
    block = make_block(chain, Spec(version=1))
    assert isinstance(block.certificate, CertificateV1)
    assert chain.submit(block.to_bytes()) is None


def test_simnet_skips_proof_verification() -> None:
    chain = Chain(get_params("simnet"), clock=lambda: NOW)
    block = make_block(chain, Spec())
    unverifiable = build_certificate(3, block.header.block_hash(), block.certificate.public_data, b"x",
                                     chain.proofs)
    assert unverifiable.proof == placeholder_proof(b"x", chain.proofs)
    assert chain.submit(dataclasses.replace(block, certificate=unverifiable).to_bytes()) is None


def _template_block(chain: Chain, version: int = 3, bad_merkle: bool = False) -> Block:
    """A block as a pool proposes it: the template's coinbase and the placeholder certificate."""
    template = BlockTemplate.from_rpc(DevnetNode(chain).template())
    coinbase = coinbase_transaction(template.height, template.coinbase_value, PAYOUT,
                                    template.default_witness_commitment)
    root = bytes(32) if bad_merkle else merkle_root([coinbase.txid()])
    header = BlockHeader(template.version, from_display_hex(template.previous_block_hash), root,
                         template.curtime, template.bits, proof_commitment(version, b""))
    return Block(placeholder(version, header.block_hash()), header, (coinbase,))


def test_proposal_mode_skips_the_proof_and_answers_bip22(chain: Chain) -> None:
    assert chain.propose(_template_block(chain).to_bytes()) is None
    assert chain.submit(_template_block(chain).to_bytes()).startswith(
        "certificate verification failed: empty public data")
    assert chain.propose(_template_block(chain, bad_merkle=True).to_bytes()) == "bad-txnmrklroot"
    assert chain.propose(_template_block(chain, version=2).to_bytes()) == (
        "rejected: certificate version 2 is not allowed at height 1 (require version 3)")
    rank64 = int7.MiningConfig(1024, 64, [0, 8, 64, 72], [0, 1, 8, 9, 32, 33, 40, 41])
    assert chain.propose(make_block(chain, Spec(config=rank64)).to_bytes()) is None  # no rank penalty here
    stale = _template_block(chain)
    assert chain.submit(make_block(chain, Spec()).to_bytes()) is None
    assert chain.propose(stale.to_bytes()) == "bad-prevblk"
    assert chain.propose(make_block(chain, Spec(timestamp=NOW + 3 * 3600)).to_bytes()) == "time-too-new"

"""End to end over real sockets: CPU reference miner → gateway client → devnet → block accepted, and
the chain (blocks decoded and re-validated) survives a restart."""
from __future__ import annotations

import struct

import pytest

from node_client import rules
from node_client.devnet import start_devnet
from node_client.devnet.chain import BLOCKS_FILE, ChainStoreError
from node_client.devnet.cpu_miner import mine_fp8_plain_proof, mine_plain_proof
from node_client.devnet.placeholder import PLACEHOLDER_MAGIC, verify_certificate
from proof import int7
from proof.chain import Block, BlockHeader, display_hex, target_from_bits


def _mine_through_gateway(devnet, seed: int) -> None:
    with devnet.gateway_client() as client:
        job = client.get_mining_info()
        proof = mine_plain_proof(job, seed=seed)
        height = devnet.chain.height + 1
        assert rules.would_accept_plain_proof(devnet.params, height, job.cert_version,
                                              job.incomplete_header_bytes, proof) == (True, "")
        assert client.submit_plain_proof(proof.to_bytes(), job) == "submitted"
    assert devnet.gateway.wait_idle(30)
    outcome = devnet.gateway.results()[-1]
    assert outcome.status == "accepted", outcome
    assert devnet.wait_for_height(height, 5)


def test_cpu_proof_is_accepted_and_the_chain_survives_a_restart(tmp_path) -> None:
    with start_devnet("regtest", datadir=tmp_path) as devnet:
        pearld = devnet.pearld_client(retries=0)
        assert pearld.getblockchaininfo()["blocks"] == 0
        template = pearld.getblocktemplate()
        assert (template.height, template.required_cert_version, template.bits) == (1, 3, 0x1E010000)
        with devnet.gateway_client() as client:
            job = client.get_mining_info()
        assert job.cert_version == 3 and job.target == target_from_bits(0x1E010000)
        assert job.ancestor_headers == ()

        _mine_through_gateway(devnet, seed=0)
        best = pearld.getbestblockhash()
        info = pearld.getblockheader(best)
        assert info["height"] == 1 and info["previousblockhash"] == template.previous_block_hash
        header = BlockHeader.from_bytes(pearld.getblockheader(best, False))
        assert display_hex(header.block_hash()) == best
        assert header.incomplete_bytes() == job.incomplete_header_bytes
        block = Block.from_bytes(bytes.fromhex(pearld.call("getblock", [best, 0])))
        assert block.certificate.version == 3 and block.certificate.proof.startswith(PLACEHOLDER_MAGIC)
        assert display_hex(header.proof_commitment) == info["proofcommitment"]
        _mine_through_gateway(devnet, seed=1)
        hashes = [pearld.call("getblockhash", [h]) for h in (1, 2)]

    with start_devnet("regtest", datadir=tmp_path) as devnet:
        pearld = devnet.pearld_client(retries=0)
        assert pearld.getblockchaininfo()["blocks"] == 2
        assert [pearld.call("getblockhash", [h]) for h in (1, 2)] == hashes
        for h in hashes:
            block = Block.from_bytes(bytes.fromhex(pearld.call("getblock", [h, 0])))
            verify_certificate(block.header, block.certificate, devnet.chain.proofs)  # raises unless it re-verifies
        _mine_through_gateway(devnet, seed=2)
        assert pearld.getblockchaininfo()["blocks"] == 3


def test_a_torn_last_record_is_dropped_and_a_corrupt_block_refused(tmp_path) -> None:
    with start_devnet("regtest", datadir=tmp_path) as devnet:
        _mine_through_gateway(devnet, seed=0)
        _mine_through_gateway(devnet, seed=1)
    path = tmp_path / BLOCKS_FILE
    data = path.read_bytes()
    first = 4 + struct.unpack_from("<I", data, 0)[0]
    path.write_bytes(data[:len(data) - 10])  # a crash mid-write of block 2
    with start_devnet("regtest", datadir=tmp_path) as devnet:
        assert devnet.chain.height == 1
    assert path.stat().st_size == first
    corrupt = bytearray(path.read_bytes())
    corrupt[first - 100] ^= 1  # inside block 1's transactions or certificate
    path.write_bytes(bytes(corrupt))
    with pytest.raises(ChainStoreError, match="height 1"):
        start_devnet("regtest", datadir=tmp_path).__enter__()


def test_a_data_directory_keeps_its_network(tmp_path) -> None:
    with start_devnet("regtest", datadir=tmp_path):
        pass
    with pytest.raises(ChainStoreError, match="regtest"):
        start_devnet("signet", datadir=tmp_path).__enter__()


def test_dense_only_fallback_rehearsal_on_mainnet_rules() -> None:
    """mainnet@91629: V2 blocks; MoE is accepted at 91629 and refused from 91630, dense still mined."""
    with start_devnet("mainnet@91629") as devnet, devnet.gateway_client() as client:
        moe = int7.MiningConfig(2048, 128, [0, 8, 64, 72], [0, 1, 8, 9, 32, 33, 40, 41], experts=2, top_k=1)
        job = client.get_mining_info()
        assert job.cert_version == 2 and devnet.chain.height + 1 == 91629
        proof = mine_plain_proof(job, seed=3, config=moe, m=256)
        client.submit_plain_proof(proof.to_bytes(), job)
        devnet.gateway.wait_idle()
        assert devnet.gateway.results()[-1].status == "accepted"

        job = client.get_mining_info()
        proof = mine_plain_proof(job, seed=4, config=moe, m=256)
        ok, reason = rules.would_accept_plain_proof(devnet.params, 91630, 2, job.incomplete_header_bytes, proof)
        assert not ok and reason.startswith("dense-only: ")
        client.submit_plain_proof(proof.to_bytes(), job)  # the node itself refuses it too
        devnet.gateway.wait_idle()
        outcome = devnet.gateway.results()[-1]
        assert outcome.status == "rejected"
        assert outcome.detail == ("rejected: MoE certificate is not allowed at height 91630 "
                                  "(dense-only fork active from height 91630)")
        assert devnet.chain.height == 91629
        _mine_through_gateway(devnet, seed=5)
        assert devnet.chain.height == 91630


@pytest.mark.parametrize("network,version", [("signet", 1), ("simnet", 3), ("testnet2@54869", 2)])
def test_other_networks_mine_their_required_version(network: str, version: int) -> None:
    with start_devnet(network) as devnet:
        with devnet.gateway_client() as client:
            assert client.get_mining_info().cert_version == version
        _mine_through_gateway(devnet, seed=0)
        assert devnet.chain.tip.block.certificate.version == version


def test_fp8_v4_blocks_with_ancestor_headers_survive_a_restart(tmp_path) -> None:
    with start_devnet("regtest-fp8", datadir=tmp_path) as devnet:
        with devnet.gateway_client() as client:
            job = client.get_mining_info()
        assert job.cert_version == 4
        assert job.ancestor_headers == (devnet.chain.tip.block.header.to_bytes(),)
        _mine_through_gateway(devnet, seed=0)
        with devnet.gateway_client() as client:
            assert len(client.get_mining_info().ancestor_headers) == 2
        # MoE is consensus-valid again as FP8: a V4 MoE proof passes the rules and the node.
        with devnet.gateway_client() as client:
            job = client.get_mining_info()
            proof = mine_fp8_plain_proof(job, seed=1, experts=2)
            assert proof.moe_witness is not None
            assert rules.would_accept_plain_proof("regtest-fp8", 2, 4, job.incomplete_header_bytes, proof) == (True, "")
            client.submit_plain_proof(proof.to_bytes(), job)
        assert devnet.gateway.wait_idle() and devnet.gateway.results()[-1].status == "accepted"
        certificate = devnet.chain.tip.block.certificate
        assert certificate.version == 4 and certificate.proof.startswith(PLACEHOLDER_MAGIC + b"\x02")
        template = devnet.pearld_client(retries=0).call("getblocktemplate", [{}])
        assert template["requiredcertversion"] == 4 and len(template["ancestorheaders"]) == 3
    with start_devnet("regtest-fp8", datadir=tmp_path) as devnet:
        assert devnet.chain.height == 2
        tip = devnet.chain.tip.block
        verify_certificate(tip.header, tip.certificate, devnet.chain.proofs)


def test_cli_mines_and_persists(tmp_path, capsys) -> None:
    import argparse

    from node_client.devnet import add_arguments, cli_main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--datadir", str(tmp_path), "--rpc-port", "0", "--gateway-port", "0", "--mine", "2",
            "--exit-after-mining"]
    assert cli_main(parser.parse_args(argv)) == 0
    assert cli_main(parser.parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert out.count("proof: accepted") == 4 and "height 4" in out
    assert cli_main(parser.parse_args(["--network", "nonet"])) == 2

"""Block validation in pearld's order (node-consensus.md §3.4; blockchain/validate.go @ 2ad4bc25).

checkBlockSanity (transactions, merkle root, then the header: certificate presence, size, allow-list,
time, target range, certificate verification) → checkBlockContext (expected bits, timestamp after the
parent, CheckCertificateRules, witness commitment, BIP34 height) → checkConnectBlock (coinbase value).
Each failure raises BlockRuleError with pearld's text; the devnet answers ``"rejected: <text>"``.
"""
from __future__ import annotations

import dataclasses
import datetime
import math

from node_client import rules
from node_client.devnet.placeholder import PlainProofStore, ProofRejected, verify_certificate
from node_client.forks import NetworkParams
from proof.chain import (
    COINBASE_PREV_INDEX,
    WITNESS_COMMITMENT_PREFIX,
    Block,
    Transaction,
    display_hex,
    push_int,
    target_from_bits,
    merkle_root,
    sha256d,
    write_varint,
)

MAX_BLOCK_VSIZE = 1_000_000
MAX_GRAIN = 2_100_000_000 * 10**8
MIN_COINBASE_SCRIPT = 2
MAX_COINBASE_SCRIPT = 100
TARGET_SECONDS_PER_BLOCK = 194
EMISSION_CONSTANT = 4 * 365 * 86400 // TARGET_SECONDS_PER_BLOCK


class BlockRuleError(Exception):
    """A block pearld would reject; the message is pearld's RuleError text."""


# chainErrToGBTErrString: the BIP22 strings getblocktemplate's proposal mode answers with, keyed by a
# fragment of the rule's text here. Certificate-rule failures have none (answered "rejected: <text>").
_BIP22 = (
    ("transaction has no inputs", "bad-txns-noinputs"),
    ("transaction has no outputs", "bad-txns-nooutputs"),
    ("unsupported script type", "bad-script-malformed"),
    ("transaction output", "bad-txns-outputvalue"),
    ("total value of all transaction outputs", "bad-txns-outputvalue"),
    ("duplicate inputs", "bad-txns-dupinputs"),
    ("coinbase transaction script length", "bad-cb-length"),
    ("previous output that is null", "bad-txns-badinput"),
    ("does not contain any transactions", "bad-txns-none"),
    ("block vsize is too big", "bad-blk-length"),
    ("is not a coinbase", "bad-txns-nocoinbase"),
    ("second coinbase", "bad-txns-multicoinbase"),
    ("merkle root is invalid", "bad-txnmrklroot"),
    ("duplicate transaction", "bad-txns-duplicate"),
    ("too far in the future", "time-too-new"),
    ("block target difficulty", "bad-diffbits"),
    ("certificate verification failed", "high-hash"),
    ("coinbase signature script", "bad-cb-height"),
    ("yet no witness commitment", "unexpected-witness"),
    ("witness stack", "bad-witness-nonce-size"),
    ("witness nonce", "bad-witness-nonce-size"),
    ("witness commitment does not match", "bad-witness-merkle-match"),
    ("block difficulty of", "bad-diffbits"),
    ("seconds after previous block timestamp", "time-too-old"),
    ("either does not exist or has already been spent", "bad-txns-missinginput"),
    ("coinbase transaction for block pays", "bad-cb-value"),
)


def bip22_reason(text: str) -> str:
    """The proposal-mode answer for a rule failure: a BIP22 string, or ``rejected: <text>``."""
    for fragment, code in _BIP22:
        if fragment in text:
            return code
    return f"rejected: {text}"


@dataclasses.dataclass(frozen=True)
class BlockContext:
    """What validation needs to know about the chain the block extends."""

    params: NetworkParams
    height: int
    parent_timestamp: int
    expected_bits: int
    now: int


def block_subsidy(height: int) -> int:
    """CalcBlockSubsidy: 2.1e9·1e8·C / ((h+C)(h−1+C)) grains, 0 at genesis."""
    if height == 0:
        return 0
    c = EMISSION_CONSTANT
    return 2_100_000_000 * 10**8 * c // ((height + c) * (height - 1 + c))


def go_time(timestamp: int) -> str:
    """A unix time as Go's time.Time %v prints it (pearld's texts use it)."""
    moment = datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S +0000 UTC")


def _sizes(block: Block) -> tuple[int, int]:
    """(stripped, total) bytes of header ‖ tx count ‖ transactions: the certificate is not counted."""
    prefix = block.header.to_bytes() + write_varint(len(block.transactions))
    stripped = len(prefix) + sum(len(tx.legacy_bytes()) for tx in block.transactions)
    total = len(prefix) + sum(len(tx.to_bytes()) for tx in block.transactions)
    return stripped, total


def block_vsize(block: Block) -> int:
    stripped, total = _sizes(block)
    return math.ceil((stripped * 3 + total) / 4)


def _script_class(script: bytes) -> str:
    if len(script) == 34 and script[0] == 0x51 and script[1] == 0x20:
        return "witness_v1_taproot"
    if len(script) == 34 and script[0] == 0x52 and script[1] == 0x20:
        return "witness_v2_merkleroot"
    if script[:1] == b"\x6a":
        return "nulldata"
    return "nonstandard"


def _check_transaction_sanity(tx: Transaction) -> None:
    if not tx.inputs:
        raise BlockRuleError("transaction has no inputs")
    if not tx.outputs:
        raise BlockRuleError("transaction has no outputs")
    total = 0
    for i, out in enumerate(tx.outputs):
        script_class = _script_class(out.script_pubkey)
        if script_class == "nonstandard":
            raise BlockRuleError(f"transaction output {i} has unsupported script type {script_class}")
        if out.value < 0:
            raise BlockRuleError(f"transaction output has negative value of {out.value}")
        if out.value > MAX_GRAIN:
            raise BlockRuleError(f"transaction output value is higher than max allowed value: {out.value} > {MAX_GRAIN} ")
        total += out.value
        if total > MAX_GRAIN:
            raise BlockRuleError(
                f"total value of all transaction outputs is {total} which is higher than max allowed value of {MAX_GRAIN}"
            )
    outpoints = [(txin.prev_txid, txin.prev_index) for txin in tx.inputs]
    if len(set(outpoints)) != len(outpoints):
        raise BlockRuleError("transaction contains duplicate inputs")
    if tx.is_coinbase():
        size = len(tx.inputs[0].script_sig)
        if not MIN_COINBASE_SCRIPT <= size <= MAX_COINBASE_SCRIPT:
            raise BlockRuleError(
                f"coinbase transaction script length of {size} is out of range "
                f"(min: {MIN_COINBASE_SCRIPT}, max: {MAX_COINBASE_SCRIPT})"
            )
    elif any(txin.prev_txid == bytes(32) and txin.prev_index == COINBASE_PREV_INDEX for txin in tx.inputs):
        raise BlockRuleError("transaction input refers to previous output that is null")


def check_block_sanity(block: Block, params: NetworkParams, now: int, proofs: PlainProofStore) -> None:
    """checkBlockSanity: transactions and merkle root, then CheckBlockHeaderSanity (last: the proof)."""
    txs = block.transactions
    if not txs:
        raise BlockRuleError("block does not contain any transactions")
    vsize = block_vsize(block)
    if vsize > MAX_BLOCK_VSIZE:
        raise BlockRuleError(f"block vsize is too big - got {vsize}, max {MAX_BLOCK_VSIZE}")
    if not txs[0].is_coinbase():
        raise BlockRuleError("first transaction in block is not a coinbase")
    for i, tx in enumerate(txs[1:], start=1):
        if tx.is_coinbase():
            raise BlockRuleError(f"block contains second coinbase at index {i}")
    for tx in txs:
        _check_transaction_sanity(tx)
    computed = block.computed_merkle_root()
    if computed != block.header.merkle_root:
        raise BlockRuleError(
            f"block merkle root is invalid - block header indicates {display_hex(block.header.merkle_root)}, "
            f"but calculated value is {display_hex(computed)}"
        )
    seen: set[bytes] = set()
    for tx in txs:
        txid = tx.txid()
        if txid in seen:
            raise BlockRuleError(f"block contains duplicate transaction {display_hex(txid)}")
        seen.add(txid)
    check_header_sanity(block, params, now, proofs)


def check_header_sanity(block: Block, params: NetworkParams, now: int, proofs: PlainProofStore) -> None:
    """CheckBlockHeaderSanity: certificate present, allow-list, time, target, verification."""
    header, certificate = block.header, block.certificate
    if certificate is None:
        raise BlockRuleError("block has no certificate")
    # The size cap (65000 bytes) is enforced when the block is decoded, as pearld's LimitReader does.
    if not params.is_cert_version_allowed(certificate.version):
        raise BlockRuleError(f"certificate version {certificate.version} is not allowed")
    if header.timestamp > now + params.max_time_offset_minutes * 60:
        raise BlockRuleError(f"block timestamp of {go_time(header.timestamp)} is too far in the future")
    target = target_from_bits(header.bits)
    pow_limit = target_from_bits(params.pow_limit_bits)
    if target <= 0:
        raise BlockRuleError(f"block target difficulty of {target:064x} is too low")
    if target > pow_limit:
        raise BlockRuleError(f"block target difficulty of {target:064x} is higher than max of {pow_limit:064x}")
    if not params.no_pow_check:
        try:
            verify_certificate(header, certificate, proofs)
        except ProofRejected as exc:
            raise BlockRuleError(f"certificate verification failed: {exc}") from exc


def coinbase_height(script_sig: bytes) -> int:
    """ExtractCoinbaseHeight (BIP34) with pearld's texts; the push must be minimal."""
    if not script_sig:
        raise BlockRuleError(
            "the coinbase signature script for blocks of version 2 or greater must start with the "
            "length of the serialized block height"
        )
    opcode = script_sig[0]
    if opcode == 0x00:
        return 0
    if 0x51 <= opcode <= 0x60:
        return opcode - 0x50
    length = opcode
    if len(script_sig) - 1 < length:
        raise BlockRuleError(
            f"the coinbase signature script for blocks of version {length} or greater must start with the "
            "serialized block height"
        )
    height = int.from_bytes(script_sig[1:1 + min(length, 4)].ljust(4, b"\x00"), "little", signed=True)
    if not script_sig.startswith(push_int(height)):
        raise BlockRuleError(f"the coinbase signature script does not minimally encode the height {height}")
    return height


def check_witness_commitment(block: Block) -> None:
    """ValidateWitnessCommitment (BIP141) with btcd's texts."""
    coinbase = block.transactions[0]
    commitment_outputs = [
        out.script_pubkey for out in coinbase.outputs
        if len(out.script_pubkey) >= 38 and out.script_pubkey.startswith(WITNESS_COMMITMENT_PREFIX)
    ]
    if not commitment_outputs:
        if any(tx.has_witness for tx in block.transactions):
            raise BlockRuleError("block contains transaction with witness data, yet no witness commitment present")
        return
    witness = coinbase.inputs[0].witness
    if len(witness) != 1:
        raise BlockRuleError(
            f"the coinbase transaction has {len(witness)} items in its witness stack, only one 32-byte nonce is allowed"
        )
    if len(witness[0]) != 32:
        raise BlockRuleError(f"the coinbase transaction witness nonce has {len(witness[0])} bytes when it must be 32 bytes")
    claimed = commitment_outputs[-1][6:38]
    wtxids = [bytes(32)] + [tx.wtxid() for tx in block.transactions[1:]]
    computed = sha256d(merkle_root(wtxids) + witness[0])
    if claimed != computed:
        raise BlockRuleError(f"witness commitment does not match: computed {computed.hex()}, coinbase includes {claimed.hex()}")


def check_block_context(block: Block, ctx: BlockContext) -> None:
    """checkBlockContext: bits, timestamp, certificate rules, witness commitment, BIP34 height."""
    header = block.header
    if header.bits != ctx.expected_bits:
        raise BlockRuleError(f"block difficulty of {header.bits} is not the expected value of {ctx.expected_bits}")
    if header.timestamp < ctx.parent_timestamp + 1:
        raise BlockRuleError(
            f"block timestamp of {go_time(header.timestamp)} must be at least 1 seconds after "
            f"previous block timestamp {go_time(ctx.parent_timestamp)}"
        )
    certificate = block.certificate
    assert certificate is not None  # check_header_sanity ran first
    try:
        rules.check_certificate(
            ctx.params, ctx.height, certificate.version,
            getattr(certificate, "public_data", b""), header.bits,
        )
    except rules.RuleViolation as exc:
        raise BlockRuleError(exc.text) from exc
    check_witness_commitment(block)
    height = coinbase_height(block.transactions[0].inputs[0].script_sig)
    if height != ctx.height:
        raise BlockRuleError(
            f"the coinbase signature script serialized block height is {height} when {ctx.height} was expected"
        )


def check_connect_block(block: Block, ctx: BlockContext) -> None:
    """checkConnectBlock's coinbase-value rule; the devnet keeps no UTXO set, so blocks carry only
    their coinbase (any other transaction spends an output the devnet does not know)."""
    if len(block.transactions) > 1:
        tx = block.transactions[1]
        txin = tx.inputs[0]
        raise BlockRuleError(
            f"output {display_hex(txin.prev_txid)}:{txin.prev_index} referenced from transaction "
            f"{display_hex(tx.txid())}:0 either does not exist or has already been spent"
        )
    paid = sum(out.value for out in block.transactions[0].outputs)
    expected = block_subsidy(ctx.height)
    if paid > expected:
        raise BlockRuleError(f"coinbase transaction for block pays {paid} which is more than expected value of {expected}")

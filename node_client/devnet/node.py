"""The devnet's pearld side: getblocktemplate, submitblock and the chain-state RPCs over its Chain.

Replies have pearld's shapes (node-consensus.md §5.2–5.4): display-order hashes, lowercase bits hex,
``requiredcertversion`` always, ``ancestorheaders`` when V4 is required, ``submitblock`` returning
null or ``"rejected: <text>"``, decode failures as RPC error −22 "Block decode failed: …".
"""
from __future__ import annotations

import binascii
from typing import Any

from node_client.devnet.chain import Chain, ChainEntry
from node_client.devnet.rpc_http import (
    ERR_BLOCK_NOT_FOUND,
    ERR_DESERIALIZATION,
    ERR_INVALID_PARAMETER,
    ERR_INVALID_PARAMS,
    ERR_MISC,
    ERR_TYPE,
    Method,
    RpcFault,
)
from node_client.devnet.validate import block_subsidy
from proof.certificate import MAX_V4_ANCESTOR_HEADERS
from proof.chain import (
    DecodeError,
    display_hex,
    from_display_hex,
    merkle_root,
    push_data,
    sha256d,
    target_from_bits,
)

BLOCK_VERSION = 0x20000000
COINBASE_FLAGS = push_data(b"/P2SH/pearld/").hex()
MAX_BLOCK_VSIZE = 1_000_000


def _params(params: list[Any], low: int, high: int) -> None:
    if not low <= len(params) <= high:
        expected = str(low) if low == high else f"{low} to {high}"
        raise RpcFault(ERR_INVALID_PARAMS, f"wrong number of params (expected {expected}, received {len(params)})")


def _typed(value: Any, kind: type, name: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RpcFault(ERR_INVALID_PARAMS, f"parameter {name} must be type {kind.__name__} (got {type(value).__name__})")
    return value


def _unhex(block_hex: str) -> bytes:
    """Block hex as pearld reads it (an odd length gets a leading 0)."""
    if len(block_hex) % 2:
        block_hex = "0" + block_hex
    try:
        return binascii.unhexlify(block_hex)
    except (binascii.Error, ValueError) as exc:
        raise RpcFault(ERR_DESERIALIZATION, f"Argument must be hexadecimal string (not {block_hex[:64]!r})") from exc


def _difficulty(bits: int, pow_limit_bits: int) -> float:
    return target_from_bits(pow_limit_bits) / target_from_bits(bits)


class DevnetNode:
    """pearld's RPC methods over a Chain."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    def methods(self) -> dict[str, Method]:
        return {
            "getblocktemplate": self.getblocktemplate,
            "submitblock": self.submitblock,
            "getblockchaininfo": self.getblockchaininfo,
            "getbestblockhash": self.getbestblockhash,
            "getblockcount": self.getblockcount,
            "getblockhash": self.getblockhash,
            "getblockheader": self.getblockheader,
            "getblock": self.getblock,
        }

    # --- mining ------------------------------------------------------------------------------------

    def template(self) -> dict[str, Any]:
        """The getblocktemplate result for the block after the current tip (coinbasevalue mode)."""
        chain = self.chain
        tip = chain.tip
        height = tip.height + 1
        now = chain.now()
        required = chain.params.required_cert_version(height)
        result: dict[str, Any] = {
            "bits": f"{chain.bits:x}",
            "curtime": max(now, tip.block.header.timestamp + 1),
            "height": height,
            "previousblockhash": display_hex(tip.hash),
            "vsizelimit": MAX_BLOCK_VSIZE,
            "transactions": [],
            "version": BLOCK_VERSION,
            "coinbaseaux": {"flags": COINBASE_FLAGS},
            "coinbasevalue": block_subsidy(height),
            # Only the coinbase: the witness merkle root is over the zero coinbase wtxid.
            "default_witness_commitment": sha256d(merkle_root([bytes(32)]) + bytes(32)).hex(),
            "longpollid": f"{display_hex(tip.hash)}-{now}",
            "target": f"{target_from_bits(chain.bits):064x}",
            "mintime": tip.block.header.timestamp + 1,
            "maxtime": now + chain.params.max_time_offset_minutes * 60,
            "mutable": ["time", "transactions/add", "prevblock", "coinbase/append"],
            "noncerange": "00000000ffffffff",
            "capabilities": ["proposal"],
            "requiredcertversion": required,
        }
        if required == 4:
            result["ancestorheaders"] = [
                e.block.header.to_bytes().hex() for e in chain.ancestors(MAX_V4_ANCESTOR_HEADERS + 1)
            ]
        return result

    def getblocktemplate(self, params: list[Any]) -> dict[str, Any] | str | None:
        _params(params, 0, 1)
        request = params[0] if params else {}
        _typed(request, dict, "template_request")
        mode = request.get("mode", "template")
        if mode == "template":
            return self.template()
        if mode != "proposal":
            raise RpcFault(ERR_INVALID_PARAMETER, "Invalid mode")
        data = request.get("data")
        if not isinstance(data, str) or not data:
            raise RpcFault(ERR_TYPE, "Data must contain the hex-encoded serialized block that is being proposed")
        try:
            return self.chain.propose(_unhex(data))
        except DecodeError as exc:
            raise RpcFault(ERR_DESERIALIZATION, f"Block decode failed: {exc}") from exc

    def submit_block_bytes(self, raw: bytes) -> str | None:
        """submitblock on bytes: None or ``"rejected: <text>"``; RpcFault −22 when it does not decode."""
        try:
            rejection = self.chain.submit(raw)
        except DecodeError as exc:
            raise RpcFault(ERR_DESERIALIZATION, f"Block decode failed: {exc}") from exc
        return None if rejection is None else f"rejected: {rejection}"

    def submitblock(self, params: list[Any]) -> str | None:
        _params(params, 1, 2)
        return self.submit_block_bytes(_unhex(_typed(params[0], str, "hexblock")))

    # --- chain state -------------------------------------------------------------------------------

    def getblockchaininfo(self, params: list[Any]) -> dict[str, Any]:
        _params(params, 0, 0)
        tip = self.chain.tip
        return {
            "chain": self.chain.params.name,
            "blocks": tip.height,
            "headers": tip.height,
            "bestblockhash": display_hex(tip.hash),
            "difficulty": _difficulty(tip.block.header.bits, self.chain.params.pow_limit_bits),
            "mediantime": tip.block.header.timestamp,
            "verificationprogress": 1.0,
            "pruned": False,
        }

    def getbestblockhash(self, params: list[Any]) -> str:
        _params(params, 0, 0)
        return display_hex(self.chain.tip.hash)

    def getblockcount(self, params: list[Any]) -> int:
        _params(params, 0, 0)
        return self.chain.height

    def getblockhash(self, params: list[Any]) -> str:
        _params(params, 1, 1)
        entry = self.chain.entry_at(_typed(params[0], int, "index"))
        if entry is None:
            raise RpcFault(ERR_MISC, "Block number out of range")
        return display_hex(entry.hash)

    def _entry(self, value: Any) -> ChainEntry:
        text = _typed(value, str, "hash")
        try:
            # chainhash.NewHashFromStr: a short string is a number with its leading zeros left out.
            block_hash = from_display_hex(text.rjust(64, "0") if len(text) <= 64 else text)
        except ValueError as exc:
            raise RpcFault(ERR_DESERIALIZATION, f"Argument must be hexadecimal string (not {text[:64]!r})") from exc
        entry = self.chain.entry_by_hash(block_hash)
        if entry is None:
            raise RpcFault(ERR_BLOCK_NOT_FOUND, "Block not found")
        return entry

    def _header_json(self, entry: ChainEntry) -> dict[str, Any]:
        header = entry.block.header
        tip_height = self.chain.height
        successor = self.chain.entry_at(entry.height + 1)
        result: dict[str, Any] = {
            "hash": display_hex(entry.hash),
            "confirmations": tip_height - entry.height + 1,
            "height": entry.height,
            "version": header.version,
            "versionHex": f"{header.version & 0xFFFFFFFF:08x}",
            "merkleroot": display_hex(header.merkle_root),
            "time": header.timestamp,
            "bits": f"{header.bits:08x}",
            "difficulty": _difficulty(header.bits, self.chain.params.pow_limit_bits),
            "previousblockhash": display_hex(header.prev_block),
            "proofcommitment": display_hex(header.proof_commitment),
        }
        if successor is not None:
            result["nextblockhash"] = display_hex(successor.hash)
        return result

    def getblockheader(self, params: list[Any]) -> dict[str, Any] | str:
        _params(params, 1, 2)
        entry = self._entry(params[0])
        verbose = _typed(params[1], bool, "verbose") if len(params) > 1 else True
        return self._header_json(entry) if verbose else entry.block.header.to_bytes().hex()

    def getblock(self, params: list[Any]) -> dict[str, Any] | str:
        _params(params, 1, 2)
        entry = self._entry(params[0])
        verbosity = _typed(params[1], int, "verbosity") if len(params) > 1 else 1
        if verbosity == 0:
            return entry.raw.hex()
        result = self._header_json(entry)
        certificate = entry.block.certificate
        result.update({
            "size": len(entry.raw),
            "certificateversion": certificate.version if certificate is not None else 0,
            "tx": [display_hex(tx.txid()) for tx in entry.block.transactions],
        })
        return result

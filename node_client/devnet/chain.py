"""The devnet's chain: one best chain, extended by validated blocks and persisted in a data directory.

The chain starts from regtest's genesis block (rebuilt from node-consensus.md §6.1 and checked
against its pinned hash), placed at height ``start_height − 1`` so that a ``<network>@H`` profile's
first block has height H. Difficulty never retargets. Blocks are appended to ``blocks.dat``
(u32 length ‖ block) with an fsync each; on restart every stored block is decoded and re-validated
in order, exactly as a submitted block would be.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Callable

from node_client.devnet.validate import (
    BlockContext,
    BlockRuleError,
    bip22_reason,
    check_block_context,
    check_block_sanity,
    check_connect_block,
)
from node_client.devnet.placeholder import PlainProofStore
from node_client.devnet.records import RecordFile
from node_client.forks import NetworkParams
from proof.chain import (
    Block,
    BlockHeader,
    Transaction,
    TxIn,
    TxOut,
    display_hex,
    target_from_bits,
)
from proof.certificate import CertificateV1


GENESIS_TIME = 1776675600
GENESIS_BITS = 0x1E010000
GENESIS_HASH_DISPLAY = "78d0ab27df6a51a8e9dbbdefffca1ebbbeb3818cb083ce2c2f43b047247e5832"
GENESIS_TEXT = (
    "The native currency for machines and humans. Total 2.1e9 Pearls, Cumulative emission "
    "h/(h+650226), WTEMA 3m14s 7d, Bitcoin block #946842 with MTP 1777270524 is "
    "000000000000000000003a9221861ec7411427dd24f979fb91a3b8f7265e1dbc."
)
BLOCKS_FILE = "blocks.dat"
META_FILE = "devnet.json"
PROOFS_FILE = "plainproofs.dat"


class ChainStoreError(RuntimeError):
    """A data directory that cannot be loaded (another network's chain, or a block that fails)."""


def genesis_block() -> Block:
    """Regtest/simnet genesis (§6.1): V1 certificate with zero public data and proof ``deadbeef``."""
    script_sig = bytes.fromhex("04ffff001d0104") + b"\x4c" + bytes([len(GENESIS_TEXT)]) + GENESIS_TEXT.encode()
    coinbase = Transaction(1, (TxIn(bytes(32), 0xFFFFFFFF, script_sig),), (TxOut(0, b"\x6a"),), 0)
    header = BlockHeader(1, bytes(32), coinbase.txid(), GENESIS_TIME, GENESIS_BITS)
    if display_hex(header.block_hash()) != GENESIS_HASH_DISPLAY:
        raise AssertionError("regtest genesis does not rebuild to its pinned hash")
    certificate = CertificateV1(header.block_hash(), bytes(164), bytes.fromhex("deadbeef"))
    return Block(certificate, header, (coinbase,))


@dataclasses.dataclass(frozen=True)
class ChainEntry:
    height: int
    block: Block
    raw: bytes

    @property
    def hash(self) -> bytes:
        return self.block.header.block_hash()


class Chain:
    """Thread-safe best chain with pearld's validation; ``submit`` is pearld's ProcessBlock."""

    def __init__(self, params: NetworkParams, *, bits: int | None = None, datadir: str | Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.params = params
        self.bits = params.pow_limit_bits if bits is None else bits
        if not 0 < target_from_bits(self.bits) <= target_from_bits(params.pow_limit_bits):
            raise ValueError(f"devnet bits {self.bits:#010x} must give a target in (0, {params.name}'s pow limit]")
        self._clock = clock
        self._lock = threading.RLock()
        self.tip_changed = threading.Condition(self._lock)
        genesis = genesis_block()
        self._entries: list[ChainEntry] = [ChainEntry(params.start_height - 1, genesis, genesis.to_bytes())]
        self._by_hash: dict[bytes, ChainEntry] = {self._entries[0].hash: self._entries[0]}
        self._datadir = Path(datadir) if datadir is not None else None
        if self._datadir is not None:
            self._datadir.mkdir(parents=True, exist_ok=True)
        self.proofs = PlainProofStore(self._datadir / PROOFS_FILE if self._datadir is not None else None)
        if self._datadir is not None:
            self._open_store()

    # --- persistence -------------------------------------------------------------------------------

    def _meta(self) -> dict[str, object]:
        return {"network": self.params.to_json(), "bits": self.bits}

    def _open_store(self) -> None:
        assert self._datadir is not None
        meta_path = self._datadir / META_FILE
        if meta_path.exists():
            stored = json.loads(meta_path.read_text())
            if stored != json.loads(json.dumps(self._meta())):
                raise ChainStoreError(
                    f"{self._datadir} holds a chain for {stored.get('network', {}).get('name')!r} with "
                    f"different parameters; use another data directory"
                )
        else:
            meta_path.write_text(json.dumps(self._meta(), indent=1))
        store = RecordFile(self._datadir / BLOCKS_FILE)
        for raw in store.records:
            rejection = self._process(raw, persist=False)
            if rejection is not None:
                store.close()
                raise ChainStoreError(f"stored block at height {self.height + 1} fails validation: {rejection}")
        store.records.clear()  # replayed into the chain; no second copy kept
        self._store = store

    def close(self) -> None:
        with self._lock:
            store = getattr(self, "_store", None)
            if store is not None:
                store.close()
                self._store = None
            self.proofs.close()

    def _append(self, raw: bytes) -> None:
        if self._datadir is None:
            return
        self._store.append(raw)

    # --- queries -----------------------------------------------------------------------------------

    @property
    def tip(self) -> ChainEntry:
        with self._lock:
            return self._entries[-1]

    @property
    def height(self) -> int:
        return self.tip.height

    def entry_by_hash(self, block_hash: bytes) -> ChainEntry | None:
        with self._lock:
            return self._by_hash.get(block_hash)

    def entry_at(self, height: int) -> ChainEntry | None:
        with self._lock:
            index = height - self._entries[0].height
            return self._entries[index] if 0 <= index < len(self._entries) else None

    def ancestors(self, count: int) -> list[ChainEntry]:
        """The last ``count`` blocks, tip first."""
        with self._lock:
            return list(reversed(self._entries[-count:]))

    def now(self) -> int:
        return int(self._clock())

    # --- extension ---------------------------------------------------------------------------------

    def propose(self, raw: bytes) -> str | None:
        """getblocktemplate proposal mode (CheckConnectBlockTemplate): every rule but the proof and
        the rank penalty; None when the block would connect, else a BIP22 string."""
        block = Block.from_bytes(raw)
        template_params = dataclasses.replace(self.params, no_pow_check=True)
        with self._lock:
            tip = self._entries[-1]
            if block.header.prev_block != tip.hash:
                return "bad-prevblk"
            ctx = BlockContext(params=template_params, height=tip.height + 1,
                               parent_timestamp=tip.block.header.timestamp, expected_bits=self.bits, now=self.now())
            try:
                check_block_sanity(block, template_params, ctx.now, self.proofs)
                check_block_context(block, ctx)
                check_connect_block(block, ctx)
            except BlockRuleError as exc:
                return bip22_reason(str(exc))
        return None

    def submit(self, raw: bytes) -> str | None:
        """Decode, validate and connect a serialized block: None when accepted, else the rejection text.

        Raises DecodeError when the bytes are not a block (pearld answers that with an RPC error).
        """
        return self._process(raw, persist=True)

    def _process(self, raw: bytes, *, persist: bool) -> str | None:
        block = Block.from_bytes(raw)
        with self._lock:
            block_hash = block.header.block_hash()
            if block_hash in self._by_hash:
                return f"already have block {display_hex(block_hash)}"
            try:
                check_block_sanity(block, self.params, self.now(), self.proofs)
            except BlockRuleError as exc:
                return str(exc)
            tip = self._entries[-1]
            if block.header.prev_block != tip.hash:
                known = block.header.prev_block in self._by_hash
                return (
                    f"previous block {display_hex(block.header.prev_block)} is "
                    + ("not the chain tip (the devnet keeps no side chains)" if known
                       else "unknown (the devnet keeps no orphan blocks)")
                )
            ctx = BlockContext(
                params=self.params, height=tip.height + 1, parent_timestamp=tip.block.header.timestamp,
                expected_bits=self.bits, now=self.now(),
            )
            try:
                check_block_context(block, ctx)
                check_connect_block(block, ctx)
            except BlockRuleError as exc:
                return str(exc)
            entry = ChainEntry(ctx.height, block, bytes(raw))
            if persist:
                self._append(entry.raw)
            self._entries.append(entry)
            self._by_hash[entry.hash] = entry
            self.tip_changed.notify_all()
            return None


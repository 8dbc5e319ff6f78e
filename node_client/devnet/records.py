"""Append-only files of length-prefixed records (u32 LE length ‖ bytes): the devnet's stores.

A crash can leave a partly written last record; opening the file drops it (with a warning) so
the next append starts on a record boundary.
"""
from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

log = logging.getLogger(__name__)


class RecordFile:
    """Opens (or creates) `path`, reads its complete records, and appends new ones durably."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[bytes] = []
        data = path.read_bytes() if path.exists() else b""
        offset = 0
        while offset + 4 <= len(data):
            (size,) = struct.unpack_from("<I", data, offset)
            if offset + 4 + size > len(data):
                break
            self.records.append(data[offset + 4:offset + 4 + size])
            offset += 4 + size
        if offset != len(data):
            log.warning("devnet: dropping %d bytes of a partly written record in %s", len(data) - offset, path)
            with open(path, "r+b") as f:
                f.truncate(offset)
        self._file = open(path, "ab")

    def append(self, record: bytes) -> None:
        self._file.write(struct.pack("<I", len(record)) + record)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

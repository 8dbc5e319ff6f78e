"""FP8 (certificate V4) transcript: labels and keyed-BLAKE3 subkeys (fp8-and-integration.md §3)."""
from __future__ import annotations

import blake3

LABEL_PREFIX = b"pearl/v4/FP8/"


def subkey(label: str, parent: bytes | None = None) -> bytes:
    """Subkey(label, parent): BLAKE3 of the full label, keyed by `parent` when one is given.

    Unkeyed is deliberately distinct from keyed with a zero key.
    """
    message = LABEL_PREFIX + label.encode("ascii")
    if parent is None:
        return blake3.blake3(message).digest()
    return blake3.blake3(message, key=parent).digest()

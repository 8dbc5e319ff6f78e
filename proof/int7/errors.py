"""The one exception the INT protocol raises for bad input or a rejected proof."""
from __future__ import annotations


class Int7Error(ValueError):
    """Bad INT-protocol input; the message names what is wrong (the verifier returns it as its reason)."""

"""Per-device constants of the FP8 protocol (fp8-and-integration.md §7, §8, §11).

A proof commits one Device byte: 0 = Hopper (H100/H200, sm_90), 1 = Blackwell (B200, sm_100).
Everything that differs between the two datapaths is gathered here so no other module branches on
device names.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceModel:
    """The arithmetic profile of one committed device."""

    name: str
    device_byte: int
    window_width: int  # W: bits of the group-sum window, the anchor bit included
    promotion_groups: int | None  # K=32 groups per promoted window; None = one unbroken chain
    delta_log2: int  # log2 of the noise fraction δ (δ is a power of two)
    sigma_encoding_offset: int  # the λ rule's offset in enc(σ)

    @property
    def window_bits(self) -> int:
        """Fractional bits below the anchor (fp8_window_bits: 13 on Hopper, 25 on Blackwell)."""
        return self.window_width - 1

    @property
    def delta(self) -> float:
        """The noise fraction δ (1 on Hopper, 1/2 on Blackwell)."""
        return 2.0**self.delta_log2


HOPPER = DeviceModel("hopper", 0, window_width=14, promotion_groups=4, delta_log2=0, sigma_encoding_offset=14)
BLACKWELL = DeviceModel("blackwell", 1, window_width=26, promotion_groups=None, delta_log2=-1, sigma_encoding_offset=13)

_BY_NAME = {"hopper": HOPPER, "h100": HOPPER, "h200": HOPPER, "blackwell": BLACKWELL, "b200": BLACKWELL}
_BY_BYTE = {HOPPER.device_byte: HOPPER, BLACKWELL.device_byte: BLACKWELL}


def device_model(device: str | int | DeviceModel) -> DeviceModel:
    """Resolve a device name ("hopper"/"blackwell", or h100/h200/b200) or its committed byte."""
    if isinstance(device, DeviceModel):
        return device
    if isinstance(device, str):
        model = _BY_NAME.get(device.lower())
    elif isinstance(device, int):  # includes IntEnum device types
        model = _BY_BYTE.get(int(device))
    else:
        model = None
    if model is None:
        raise ValueError(f"unknown FP8 device {device!r}: expected 'hopper', 'blackwell' or the byte 0/1")
    return model

"""Per-network fork tables (pearld's chaincfg): which certificate a height requires and which rules apply.

Heights are node-consensus.md §1.2 (pearld commits 2ad4bc25 / ab65118c). A fork field of 0 means
disabled; a fork is active at height h when ``H != 0 and h >= H`` (§1.1). Network names:

- the shipped networks ``mainnet``, ``testnet``, ``testnet2``, ``regtest``, ``simnet``, ``signet``
  (mainline v1.4.x: no FP8 fork) and ``regtest-fp8`` / ``simnet-fp8`` (the ``fp8-scheme`` build,
  V4 required from height 1);
- ``<network>@H``: that network's fork table, rehearsed on a devnet whose first block has height H;
- a path to a JSON profile file (see ``load_profile``).
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

REGTEST_POW_LIMIT_BITS = 0x1E010000
MAINNET_POW_LIMIT_BITS = 0x1B00FFFF
SIGNET_POW_LIMIT_BITS = 0x1D0FFFFF

MAINLINE_ALLOWED_VERSIONS = (1, 2, 3)
FP8_ALLOWED_VERSIONS = (1, 2, 3, 4)

_FORK_FIELDS = (
    "moe_fork_height",
    "dense_only_fork_height",
    "rank_penalty_fork_height",
    "salted_seed_fork_height",
    "fp8_fork_height",
    "fp16_fork_height",
)


class ProfileError(ValueError):
    """A network name or profile file that does not describe a valid network."""


@dataclasses.dataclass(frozen=True)
class NetworkParams:
    """The consensus parameters of one network that a miner needs (a subset of chaincfg.Params)."""

    name: str
    moe_fork_height: int = 0
    dense_only_fork_height: int = 0
    rank_penalty_fork_height: int = 0
    salted_seed_fork_height: int = 0
    fp8_fork_height: int = 0
    fp16_fork_height: int = 0
    pow_limit_bits: int = REGTEST_POW_LIMIT_BITS
    allowed_versions: tuple[int, ...] = MAINLINE_ALLOWED_VERSIONS
    no_pow_check: bool = False
    max_time_offset_minutes: int = 120
    rpc_port: int = 18334
    start_height: int = 1

    def __post_init__(self) -> None:
        for field in _FORK_FIELDS:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
                raise ProfileError(f"{self.name}: {field} must be an int32 >= 0, got {value!r}")
        # The same constraints blockchain.New enforces on chaincfg.Params.
        _require_not_below(self, "rank_penalty_fork_height", "moe_fork_height")
        _require_not_below(self, "salted_seed_fork_height", "moe_fork_height")
        floor = "salted_seed_fork_height" if self.salted_seed_fork_height else "moe_fork_height"
        _require_not_below(self, "fp8_fork_height", floor)
        _require_not_below(self, "fp16_fork_height", "fp8_fork_height")
        if not self.allowed_versions or any(v not in (1, 2, 3, 4, 5) for v in self.allowed_versions):
            raise ProfileError(f"{self.name}: allowed_versions must be a subset of 1..5")
        if self.start_height < 1:
            raise ProfileError(f"{self.name}: start_height must be >= 1, got {self.start_height}")

    @staticmethod
    def _active(fork_height: int, height: int) -> bool:
        return fork_height != 0 and height >= fork_height

    def moe_fork_active(self, height: int) -> bool:
        return self._active(self.moe_fork_height, height)

    def dense_only_active(self, height: int) -> bool:
        return self._active(self.dense_only_fork_height, height)

    def rank_penalty_active(self, height: int) -> bool:
        return self._active(self.rank_penalty_fork_height, height)

    def salted_seed_active(self, height: int) -> bool:
        return self._active(self.salted_seed_fork_height, height)

    def fp8_active(self, height: int) -> bool:
        return self._active(self.fp8_fork_height, height)

    def fp16_active(self, height: int) -> bool:
        return self._active(self.fp16_fork_height, height)

    def required_cert_version(self, height: int) -> int:
        """The one certificate version valid at ``height`` (pearld RequiredCertVersion, §1.1)."""
        if self.fp16_active(height):
            return 5
        if self.fp8_active(height):
            return 4
        if self.salted_seed_active(height):
            return 3
        if self.moe_fork_active(height):
            return 2
        return 1

    def is_cert_version_allowed(self, version: int) -> bool:
        """pearld's context-free allow-list (IsCertVersionAllowed, §2.1)."""
        return version in self.allowed_versions

    def moe_allowed(self, height: int) -> bool:
        """Whether a block at ``height`` may carry an MoE proof.

        V1 has no MoE form; V2/V3 MoE is refused once dense-only is active; V4 certificates are never
        classed as MoE by pearld (IsMoE is false), so FP8 MoE proofs pass; V5 carries no MoE.
        """
        version = self.required_cert_version(height)
        if version in (2, 3):
            return not self.dense_only_active(height)
        return version == 4

    def fork_heights(self) -> dict[str, int]:
        return {field: getattr(self, field) for field in _FORK_FIELDS}

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["allowed_versions"] = list(self.allowed_versions)
        return data


def _require_not_below(params: NetworkParams, field: str, floor_field: str) -> None:
    value, floor = getattr(params, field), getattr(params, floor_field)
    if value != 0 and value < floor:
        raise ProfileError(f"{params.name}: {field}={value} is below {floor_field}={floor}")


_TESTNET_COMMON = dict(pow_limit_bits=MAINNET_POW_LIMIT_BITS, max_time_offset_minutes=5)

NETWORKS: dict[str, NetworkParams] = {
    "mainnet": NetworkParams(
        "mainnet", moe_fork_height=71935, dense_only_fork_height=91630,
        rank_penalty_fork_height=96251, salted_seed_fork_height=99000, rpc_port=44107, **_TESTNET_COMMON,
    ),
    "testnet": NetworkParams(
        "testnet", moe_fork_height=1, dense_only_fork_height=28262,
        rank_penalty_fork_height=36761, salted_seed_fork_height=38648, rpc_port=44109, **_TESTNET_COMMON,
    ),
    "testnet2": NetworkParams(
        "testnet2", moe_fork_height=54869, dense_only_fork_height=80051,
        rank_penalty_fork_height=80627, salted_seed_fork_height=83109, rpc_port=44111, **_TESTNET_COMMON,
    ),
    "regtest": NetworkParams(
        "regtest", moe_fork_height=1, rank_penalty_fork_height=1, salted_seed_fork_height=1, rpc_port=18334,
    ),
    "simnet": NetworkParams(
        "simnet", moe_fork_height=1, salted_seed_fork_height=1, no_pow_check=True, rpc_port=18556,
    ),
    "signet": NetworkParams(
        "signet", pow_limit_bits=SIGNET_POW_LIMIT_BITS, max_time_offset_minutes=5, rpc_port=38332,
    ),
    "regtest-fp8": NetworkParams(
        "regtest-fp8", moe_fork_height=1, rank_penalty_fork_height=1, salted_seed_fork_height=1,
        fp8_fork_height=1, allowed_versions=FP8_ALLOWED_VERSIONS, rpc_port=18334,
    ),
    "simnet-fp8": NetworkParams(
        "simnet-fp8", moe_fork_height=1, salted_seed_fork_height=1, fp8_fork_height=1,
        allowed_versions=FP8_ALLOWED_VERSIONS, no_pow_check=True, rpc_port=18556,
    ),
}

_AT_HEIGHT = re.compile(r"^(?P<base>[A-Za-z0-9_-]+)@(?P<height>[0-9]+)$")


def load_profile(path: str | Path) -> NetworkParams:
    """Load a network profile from a JSON file.

    The file is an object with ``name`` and any of the NetworkParams fields; ``base`` (optional)
    names a shipped network whose values fill the fields the file leaves out.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"cannot read network profile {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"network profile {path} must be a JSON object")
    base_name = data.pop("base", None)
    base = NETWORKS.get(base_name) if base_name is not None else NetworkParams(name="custom")
    if base is None:
        raise ProfileError(f"network profile {path}: unknown base network {base_name!r}")
    known = {f.name for f in dataclasses.fields(NetworkParams)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"network profile {path}: unknown fields {unknown}")
    if "allowed_versions" in data:
        data["allowed_versions"] = tuple(data["allowed_versions"])
    data.setdefault("name", path.stem)
    try:
        return dataclasses.replace(base, **data)
    except TypeError as exc:
        raise ProfileError(f"network profile {path}: {exc}") from exc


def get_params(network: "str | NetworkParams") -> NetworkParams:
    """Resolve a network name, a ``<network>@H`` rehearsal profile, or a JSON profile path
    (a NetworkParams passes through, so loaded profiles can be handed around directly)."""
    if isinstance(network, NetworkParams):
        return network
    if not isinstance(network, str) or not network:
        raise ProfileError(f"network must be a non-empty string, got {network!r}")
    if network in NETWORKS:
        return NETWORKS[network]
    match = _AT_HEIGHT.match(network)
    if match:
        base = NETWORKS.get(match["base"])
        if base is None:
            raise ProfileError(f"unknown network {match['base']!r} in {network!r}")
        # A rehearsal runs on a CPU-mineable devnet: the regtest pow limit, no retargeting.
        return dataclasses.replace(
            base, name=network, start_height=max(1, int(match["height"])),
            pow_limit_bits=REGTEST_POW_LIMIT_BITS, max_time_offset_minutes=120,
        )
    if network.endswith(".json"):
        return load_profile(network)
    raise ProfileError(
        f"unknown network {network!r}: expected one of {sorted(NETWORKS)}, '<network>@HEIGHT' "
        "or a .json profile path"
    )


def _check_height(height: int) -> int:
    if not isinstance(height, int) or isinstance(height, bool) or height < 0:
        raise ValueError(f"height must be an int >= 0, got {height!r}")
    return height


def required_cert_version(network: str | NetworkParams, height: int) -> int:
    """The certificate version a block at ``height`` must carry on ``network``."""
    return get_params(network).required_cert_version(_check_height(height))


def moe_allowed(network: str | NetworkParams, height: int) -> bool:
    """Whether an MoE proof can be accepted in a block at ``height`` on ``network``."""
    return get_params(network).moe_allowed(_check_height(height))


def dense_only_active(network: str | NetworkParams, height: int) -> bool:
    return get_params(network).dense_only_active(_check_height(height))


def rank_penalty_active(network: str | NetworkParams, height: int) -> bool:
    return get_params(network).rank_penalty_active(_check_height(height))

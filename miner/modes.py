"""Which proof kind to mine, chosen from the job's certificate version and the network's forks.

| job says                      | mode        |
|-------------------------------|-------------|
| cert V4                       | fp8-moe     |
| cert V2/V3, dense-only active | int7-dense  (each expert GEMM its own dense instance) |
| cert V2/V3, MoE allowed       | int7-moe    |
| cert V1                       | int7-dense  |
| anything else / no job        | off         |

The height comes from the job when the source knows it (pearld, the devnet); a gateway job has
none, so the highest height at which the network still requires the job's version is used: the
soft forks (dense-only, rank penalty) only ever switch on, so whatever the rules accept there they
accept at every height of that version (docs/miner.md).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from node_client import forks

from miner.jobs import MiningJob


class Mode(str, enum.Enum):
    FP8_MOE = "fp8-moe"
    INT7_MOE = "int7-moe"
    INT7_DENSE = "int7-dense"
    OFF = "off"


AUTO = "auto"
CHOICES = (AUTO, *(m.value for m in Mode))


@dataclass(frozen=True)
class ModeDecision:
    mode: Mode
    reason: str


MAX_HEIGHT = 2**31 - 1


def last_height_for_version(network: str, cert_version: int) -> int | None:
    """The last height at which ``network`` requires ``cert_version`` (None if it never does)."""
    params = forks.get_params(network)
    starts = sorted({params.start_height, *(h for h in params.fork_heights().values()
                                            if h > params.start_height)})
    last = None
    for i, start in enumerate(starts):
        if params.required_cert_version(start) == cert_version:
            last = starts[i + 1] - 1 if i + 1 < len(starts) else MAX_HEIGHT
    return last


def job_height(job: MiningJob, network: str) -> int | None:
    """The job's height, or the conservative stand-in when its source does not say."""
    return job.height if job.height is not None else last_height_for_version(network, job.cert_version)


def allowed_modes(job: MiningJob, network: str) -> tuple[Mode, ...]:
    """Every mode whose proofs the network's rules accept for this job."""
    height = job_height(job, network)
    if height is None:
        return ()
    params = forks.get_params(network)
    if params.required_cert_version(height) != job.cert_version:
        return ()
    if job.cert_version == 4:
        return (Mode.FP8_MOE,)
    if job.cert_version in (2, 3):
        return (Mode.INT7_MOE, Mode.INT7_DENSE) if params.moe_allowed(height) else (Mode.INT7_DENSE,)
    if job.cert_version == 1:
        return (Mode.INT7_DENSE,)
    return ()


def choose_mode(job: MiningJob | None, network: str, preference: str = AUTO) -> ModeDecision:
    """The mode for ``job``: the preferred one if the rules allow it, else the automatic one."""
    if preference not in CHOICES:
        raise ValueError(f"mode preference {preference!r} is not one of {CHOICES}")
    if preference == Mode.OFF.value:
        return ModeDecision(Mode.OFF, "mining switched off")
    if job is None:
        return ModeDecision(Mode.OFF, "no current job")
    allowed = allowed_modes(job, network)
    if not allowed:
        return ModeDecision(Mode.OFF, f"cert version {job.cert_version} is not mineable on {network} "
                                      f"at height {job_height(job, network)}")
    if preference != AUTO:
        if Mode(preference) in allowed:
            return ModeDecision(Mode(preference), "set by operator")
        auto = allowed[0]
        return ModeDecision(auto, f"{preference} refused by the rules for cert V{job.cert_version}; "
                                  f"using {auto.value}")
    reason = {4: "cert V4 requires FP8", 1: "cert V1 is dense only"}.get(job.cert_version)
    if reason is None:
        reason = "MoE allowed" if allowed[0] == Mode.INT7_MOE else "dense-only fork active"
    return ModeDecision(allowed[0], reason)

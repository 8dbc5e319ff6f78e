"""Fork tables: every network and every fork boundary (h−1, h, h+1), node-consensus.md §1.2 and §6.7."""
from __future__ import annotations

import json

import pytest

from node_client import forks

# node-consensus.md §1.2, typed in from the spec (MoE, DenseOnly, RankPenalty, SaltedSeed, Fp8).
SPEC_TABLE = {
    "mainnet": (71935, 91630, 96251, 99000, 0),
    "testnet": (1, 28262, 36761, 38648, 0),
    "testnet2": (54869, 80051, 80627, 83109, 0),
    "regtest": (1, 0, 1, 1, 0),
    "simnet": (1, 0, 0, 1, 0),
    "signet": (0, 0, 0, 0, 0),
    "regtest-fp8": (1, 0, 1, 1, 1),
    "simnet-fp8": (1, 0, 0, 1, 1),
}


def _on(fork: int, h: int) -> bool:
    return fork != 0 and h >= fork


def _expected(network: str, h: int) -> tuple[int, bool, bool]:
    moe, dense_only, rank, salted, fp8 = SPEC_TABLE[network]
    version = 4 if _on(fp8, h) else 3 if _on(salted, h) else 2 if _on(moe, h) else 1
    moe_ok = version == 4 or (version in (2, 3) and not _on(dense_only, h))
    return version, moe_ok, _on(rank, h)


def _boundary_cases() -> list[tuple[str, int]]:
    cases = []
    for network, heights in SPEC_TABLE.items():
        for fork in heights:
            if fork:
                cases += [(network, h) for h in (fork - 1, fork, fork + 1) if h >= 0]
        cases.append((network, 0))
    return sorted(set(cases))


@pytest.mark.parametrize("network,height", _boundary_cases())
def test_every_fork_boundary(network: str, height: int) -> None:
    version, moe_ok, rank = _expected(network, height)
    assert forks.required_cert_version(network, height) == version
    assert forks.moe_allowed(network, height) is moe_ok
    assert forks.rank_penalty_active(network, height) is rank
    assert forks.dense_only_active(network, height) is _on(SPEC_TABLE[network][1], height)


def test_every_network_is_in_the_table() -> None:
    assert set(forks.NETWORKS) == set(SPEC_TABLE)
    for name, heights in SPEC_TABLE.items():
        p = forks.NETWORKS[name]
        assert (p.moe_fork_height, p.dense_only_fork_height, p.rank_penalty_fork_height,
                p.salted_seed_fork_height, p.fp8_fork_height, p.fp16_fork_height) == (*heights, 0)


def test_mainnet_pinned_points() -> None:
    assert forks.required_cert_version("mainnet", 71934) == 1
    assert forks.required_cert_version("mainnet", 71935) == 2
    assert forks.required_cert_version("mainnet", 98999) == 2
    assert forks.required_cert_version("mainnet", 99000) == 3
    assert forks.moe_allowed("mainnet", 91629) is True
    assert forks.moe_allowed("mainnet", 91630) is False
    assert forks.moe_allowed("mainnet", 120000) is False
    assert forks.rank_penalty_active("mainnet", 96250) is False
    assert forks.rank_penalty_active("mainnet", 96251) is True


def test_allow_lists() -> None:
    assert [v for v in range(6) if forks.get_params("mainnet").is_cert_version_allowed(v)] == [1, 2, 3]
    assert [v for v in range(6) if forks.get_params("regtest-fp8").is_cert_version_allowed(v)] == [1, 2, 3, 4]


def test_mainnet_at_height_profile_uses_mainnet_forks_and_a_cpu_pow_limit() -> None:
    p = forks.get_params("mainnet@91628")
    assert p.start_height == 91628
    assert p.pow_limit_bits == forks.REGTEST_POW_LIMIT_BITS
    assert p.fork_heights() == forks.NETWORKS["mainnet"].fork_heights()
    assert forks.moe_allowed("mainnet@91628", 91629) and not forks.moe_allowed("mainnet@91628", 91630)
    assert forks.required_cert_version("testnet2@5", 83109) == 3


def _write(tmp_path, data: dict) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_profile_file_reproduces_the_pearld_fork_unit_tests(tmp_path) -> None:
    # moe_fork_test / salted_seed_fork_test / fp8_fork_test heights (§6.7).
    path = _write(tmp_path, {"name": "unit", "moe_fork_height": 100, "salted_seed_fork_height": 200,
                             "dense_only_fork_height": 150, "allowed_versions": [1, 2, 3]})
    assert [forks.required_cert_version(path, h) for h in (0, 99, 100, 101, 199, 200, 201)] == [1, 1, 2, 2, 2, 3, 3]
    assert [forks.moe_allowed(path, h) for h in (99, 100, 149, 150)] == [False, True, True, False]
    fp8 = _write(tmp_path, {"base": "regtest", "fp8_fork_height": 4, "allowed_versions": [1, 2, 3, 4]})
    assert [forks.required_cert_version(fp8, h) for h in (3, 4)] == [3, 4]
    no_moe = _write(tmp_path, {"name": "nomoe"})
    assert {forks.required_cert_version(no_moe, h) for h in (0, 1, 10**6)} == {1}


@pytest.mark.parametrize("data,needle", [
    ({"moe_fork_height": 10, "rank_penalty_fork_height": 5}, "rank_penalty_fork_height"),
    ({"moe_fork_height": 10, "salted_seed_fork_height": 5}, "salted_seed_fork_height"),
    ({"salted_seed_fork_height": 10, "moe_fork_height": 1, "fp8_fork_height": 5}, "fp8_fork_height"),
    ({"moe_fork_height": -1}, "moe_fork_height"),
    ({"bogus": 1}, "unknown fields"),
    ({"base": "nonet"}, "unknown base"),
])
def test_bad_profiles_are_refused_with_the_field_named(tmp_path, data, needle) -> None:
    with pytest.raises(forks.ProfileError, match=needle):
        forks.get_params(_write(tmp_path, data))


@pytest.mark.parametrize("bad", ["", "mainnet2", "nonet@5", "mainnet@x"])
def test_unknown_network_names(bad: str) -> None:
    with pytest.raises(forks.ProfileError):
        forks.required_cert_version(bad, 1)


def test_bad_height() -> None:
    with pytest.raises(ValueError, match="height"):
        forks.required_cert_version("mainnet", -1)

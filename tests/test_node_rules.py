"""Pre-submit certificate rules: pearld's order and texts, §3.1/§3.2 and the §6.6/§6.7 test values."""
from __future__ import annotations

import struct

import pytest

from node_client import forks, rules
from proof import int7

from test_node_forks import _boundary_cases  # the same network × fork-boundary table

EASY_BITS = 0x1E010000
DEFAULT_ROWS = [0, 8, 64, 72]
DEFAULT_COLS = [0, 1, 8, 9, 32, 33, 40, 41]


def public_data(k: int = 2048, rank: int = 128, jackpot: int = 0, moe_tail: int = 0) -> bytes:
    """Literal INT public data: config ‖ hash_a ‖ hash_b ‖ jackpot (LE) ‖ m, n, t_rows, t_cols."""
    config = int7.MiningConfig(k, rank, DEFAULT_ROWS, DEFAULT_COLS).to_bytes()
    body = config + bytes(64) + jackpot.to_bytes(32, "little") + struct.pack("<4I", 80, 48, 0, 0)
    assert len(body) == 164
    return body + bytes(moe_tail)


def _expect(network: str, height: int, version: int, data: bytes, rule: str | None) -> None:
    ok, reason = rules.would_accept(network, height, version, data, EASY_BITS)
    if rule is None:
        assert ok and reason == "", reason
        rules.check_certificate(network, height, version, data, EASY_BITS)
    else:
        assert not ok and reason.startswith(rule + ": "), reason
        with pytest.raises(rules.RuleViolation) as info:
            rules.check_certificate(network, height, version, data, EASY_BITS)
        assert info.value.rule == rule


@pytest.mark.parametrize("network,height", _boundary_cases())
def test_rules_at_every_fork_boundary(network: str, height: int) -> None:
    params = forks.get_params(network)
    required = params.required_cert_version(height)
    rank_rule = params.rank_penalty_active(height) and not params.no_pow_check and required != 4
    dense = public_data() if required != 4 else b"\x01"
    _expect(network, height, required, dense, None)
    for wrong in {1, 2, 3, 4} - {required}:
        if params.is_cert_version_allowed(wrong):
            _expect(network, height, wrong, public_data(), "version-for-height")
    if required in (2, 3):
        moe = public_data(moe_tail=59)
        _expect(network, height, required, moe, "dense-only" if params.dense_only_active(height) else None)
    if required in (1, 2, 3):
        _expect(network, height, required, public_data(rank=64), "rank-penalty" if rank_rule else None)


def test_pearld_texts() -> None:
    with pytest.raises(rules.RuleViolation) as info:
        rules.check_certificate("mainnet", 120001, 2, public_data(), EASY_BITS)
    assert info.value.text == "certificate version 2 is not allowed at height 120001 (require version 3)"
    with pytest.raises(rules.RuleViolation) as info:
        rules.check_certificate("mainnet", 95000, 2, public_data(moe_tail=35), EASY_BITS)
    assert info.value.text == "MoE certificate is not allowed at height 95000 (dense-only fork active from height 91630)"
    with pytest.raises(rules.RuleViolation) as info:
        rules.check_certificate("mainnet", 96251, 2, public_data(rank=64), EASY_BITS)
    assert info.value.text == (
        "certificate fails the rank penalty rule at height 96251 (fork active from height 96251): "
        "rank penalty rule violated: Rank must be >= 128 || r=64"
    )
    with pytest.raises(rules.RuleViolation, match="version-allowed: certificate version 4 is not allowed"):
        rules.check_certificate("regtest", 5, 4, b"\x01", EASY_BITS)


# node-consensus.md §6.6: DefaultNBits 0x1E01FFFF, tile 32, k = 8192; bound(128) = 0x1ffff << 234.
RP_BITS = 0x1E01FFFF
RP_BOUND_128 = 0x1FFFF << 234


def test_rank_penalty_bound_is_inclusive() -> None:
    assert RP_BOUND_128 == 0x7FFFC << 232
    assert public_data(k=8192, jackpot=RP_BOUND_128)[116:148].hex().endswith("00fcff07")
    assert rules.rank_penalty_error(RP_BITS, public_data(k=8192, jackpot=RP_BOUND_128)) is None
    assert "rank-penalized difficulty target" in rules.rank_penalty_error(
        RP_BITS, public_data(k=8192, jackpot=RP_BOUND_128 + 1))


@pytest.mark.parametrize("rank", [32, 64])
def test_rank_floor(rank: int) -> None:
    assert rules.rank_penalty_error(RP_BITS, public_data(k=8192, rank=rank)) == (
        f"rank penalty rule violated: Rank must be >= 128 || r={rank}")


def test_rank_128_k_2048_zero_jackpot_passes() -> None:
    assert rules.rank_penalty_error(RP_BITS, public_data(k=2048)) is None


@pytest.mark.parametrize("data", [bytes(163), bytes(164)])
def test_malformed_public_data_is_refused(data: bytes) -> None:
    assert rules.rank_penalty_error(RP_BITS, data) is not None
    ok, reason = rules.would_accept("mainnet", 120000, 3, data, RP_BITS)
    assert not ok and reason.startswith("rank-penalty: ")


def test_empty_public_data() -> None:
    assert rules.rank_penalty_error(RP_BITS, b"") == "empty public data"
    for network, version, text in (("mainnet", 3, "empty public data"), ("regtest-fp8", 4, "empty fp8 proof")):
        ok, reason = rules.would_accept(network, 120000, version, b"", RP_BITS)
        assert (ok, reason) == (False, f"empty-public-data: certificate verification failed: {text}")
    # §6.7: the placeholder V2 with no public data passes where proofs are not checked.
    rules.check_certificate("simnet", 5, 3, b"", RP_BITS)


def test_placeholder_and_simnet_skip_the_rank_penalty() -> None:
    # §6.7: the all-zero 164-byte certificate passes below the fork and without proof checks.
    rules.check_certificate("mainnet", 96250, 2, bytes(164), EASY_BITS)
    rules.check_certificate("simnet", 10, 3, bytes(164), EASY_BITS)
    rules.check_certificate("regtest-fp8", 10, 4, b"\x01", EASY_BITS)


def test_size_caps() -> None:
    ok, reason = rules.would_accept("signet", 5, 1, bytes(165), EASY_BITS)
    assert not ok and reason.startswith("public-data-size: ")
    ok, reason = rules.would_accept("regtest", 5, 3, public_data(moe_tail=4807 - 163), EASY_BITS)
    assert not ok and reason.startswith("public-data-size: ")
    ok, reason = rules.would_accept("regtest-fp8", 5, 4, bytes(60001), EASY_BITS)
    assert not ok and reason.startswith("public-data-size: ")


@pytest.mark.parametrize("kwargs,error", [
    (dict(public_data="abc"), TypeError),
    (dict(bits=-1), ValueError),
    (dict(bits=2**32), ValueError),
    (dict(height=True), ValueError),
    (dict(network="nonet"), forks.ProfileError),
])
def test_bad_arguments_raise_clear_errors(kwargs, error) -> None:
    args = dict(network="mainnet", height=1, cert_version=1, public_data=public_data(), bits=EASY_BITS)
    args.update(kwargs)
    with pytest.raises(error):
        rules.check_certificate(**args)


# --- real proofs from the CPU reference miner, refused before any submission ----------------------

HEADER76 = bytes(range(72)) + struct.pack("<I", EASY_BITS)


@pytest.fixture(scope="module")
def moe_v2_proof() -> int7.PlainProof:
    config = int7.MiningConfig(2048, 128, DEFAULT_ROWS, DEFAULT_COLS, experts=2, top_k=1)
    return int7.mine_cpu(HEADER76, config, m=256, n=48, bits=EASY_BITS, cert_version=2, seed=1)


@pytest.fixture(scope="module")
def rank64_dense_proof() -> int7.PlainProof:
    config = int7.MiningConfig(1024, 64, DEFAULT_ROWS, DEFAULT_COLS)
    return int7.mine_cpu(HEADER76, config, m=80, n=48, bits=EASY_BITS, cert_version=2, seed=1)


@pytest.mark.parametrize("network", ["mainnet", "mainnet@91630"])
def test_moe_proof_refused_from_dense_only_height(network: str, moe_v2_proof) -> None:
    assert rules.would_accept_plain_proof(network, 91629, 2, HEADER76, moe_v2_proof) == (True, "")
    for height in (91630, 91631, 96000):
        ok, reason = rules.would_accept_plain_proof(network, height, 2, HEADER76, moe_v2_proof)
        assert not ok
        assert reason == (f"dense-only: MoE certificate is not allowed at height {height} "
                          "(dense-only fork active from height 91630)")


def test_rank64_dense_proof_refused_from_rank_penalty_height(rank64_dense_proof) -> None:
    assert rules.would_accept_plain_proof("mainnet", 96250, 2, HEADER76, rank64_dense_proof) == (True, "")
    for height in (96251, 96252, 98999):
        ok, reason = rules.would_accept_plain_proof("mainnet", height, 2, HEADER76, rank64_dense_proof)
        assert not ok and reason.startswith("rank-penalty: ") and "Rank must be >= 128 || r=64" in reason


def test_plain_proof_against_another_header_is_invalid(rank64_dense_proof) -> None:
    other = bytes(72) + struct.pack("<I", EASY_BITS)
    ok, reason = rules.would_accept_plain_proof("mainnet", 96250, 2, other, rank64_dense_proof)
    assert not ok and reason.startswith("invalid-proof: ")

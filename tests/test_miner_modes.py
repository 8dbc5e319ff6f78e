"""Mode choice from the job's certificate version and the network's fork table."""
import pytest

from miner.jobs import MiningJob
from miner.modes import MAX_HEIGHT, Mode, allowed_modes, choose_mode, last_height_for_version
from node_client import forks, rules


def job(cert: int, height: int | None = None) -> MiningJob:
    return MiningJob.of(bytes(76), 1, cert, height=height)


@pytest.mark.parametrize("network, cert, height, mode", [
    ("regtest-fp8", 4, 5, Mode.FP8_MOE),
    ("mainnet", 3, 120_000, Mode.INT7_DENSE),  # dense-only since 91630
    ("mainnet", 2, 91_629, Mode.INT7_MOE),  # the last MoE height
    ("mainnet", 2, 91_630, Mode.INT7_DENSE),
    ("regtest", 3, 7, Mode.INT7_MOE),  # mainline regtest keeps MoE
    ("testnet2", 3, 83_109, Mode.INT7_DENSE),
    ("signet", 1, 10, Mode.INT7_DENSE),
    ("mainnet", 1, 100, Mode.INT7_DENSE),
    ("mainnet", 3, 100, Mode.OFF),  # V3 is not the version mainnet requires at 100
    ("regtest", 4, 5, Mode.OFF),  # mainline regtest never requires V4
])
def test_mode_table(network: str, cert: int, height: int, mode: Mode) -> None:
    assert choose_mode(job(cert, height), network).mode == mode


def test_every_auto_choice_is_accepted_by_the_fork_rules() -> None:
    for network in ("mainnet", "testnet", "testnet2", "regtest", "signet", "regtest-fp8"):
        params = forks.get_params(network)
        for height in sorted({1, 2, *(h + d for h in params.fork_heights().values() if h for d in (-1, 0, 1))}):
            if height < 1:
                continue
            cert = params.required_cert_version(height)
            mode = choose_mode(job(cert, height), network).mode
            if mode == Mode.INT7_MOE:
                assert forks.moe_allowed(network, height)
            assert mode != Mode.OFF or cert == 5


def test_unknown_height_is_judged_at_the_versions_last_height() -> None:
    # A gateway job carries no height: V2 on mainnet spans 71935..98998 and dense-only starts
    # inside that span, so MoE must not be chosen.
    assert last_height_for_version("mainnet", 2) == 98_999
    assert last_height_for_version("mainnet", 3) == MAX_HEIGHT
    assert last_height_for_version("regtest", 2) is None
    assert choose_mode(job(2), "mainnet").mode == Mode.INT7_DENSE
    assert choose_mode(job(3), "regtest").mode == Mode.INT7_MOE
    assert choose_mode(job(2), "mainnet@80000").mode == Mode.INT7_DENSE


def test_preferences() -> None:
    assert choose_mode(job(3, 5), "regtest", "int7-dense").mode == Mode.INT7_DENSE
    refused = choose_mode(job(3, 100_000), "mainnet", "int7-moe")
    assert refused.mode == Mode.INT7_DENSE and "refused" in refused.reason
    assert choose_mode(job(3, 5), "regtest", "off").mode == Mode.OFF
    assert choose_mode(None, "regtest").mode == Mode.OFF
    assert allowed_modes(job(4, 1), "regtest-fp8") == (Mode.FP8_MOE,)
    with pytest.raises(ValueError, match="mode preference"):
        choose_mode(job(3, 5), "regtest", "turbo")


def test_dense_only_rule_matches_the_node_rules() -> None:
    # The MoE public-data tail is what the node refuses under dense-only: modes never pick it there.
    moe_public = bytes(164 + 40)
    with pytest.raises(rules.RuleViolation, match="dense-only"):
        rules.check_certificate("mainnet", 95_000, 2, moe_public, 0x1D00FFFF)
    assert choose_mode(job(2, 95_000), "mainnet").mode == Mode.INT7_DENSE

"""The slowdown budget (miner.governor): the cap holds on simulated serving, the bank is bounded,
warm-up launches and failures cost nothing, and the layer and the CLI use it."""
import argparse
import json
import time

import pytest
import torch

from miner.accounting import MiningStats
from miner.backend import LaunchResult
from miner.cli import slowdown_fraction
from miner.gpu import governor_cost
from miner.governor import (BASELINE_EVERY, SAMPLE_EVERY, WARMUP_LAUNCHES, GovernorError, SlowdownGovernor,
                            size_class)
from miner.layer import MinedLayer
from miner.model.moe import grouped_fc1

CPU = torch.zeros(1)


class FakeClock:
    """Wall time and launch time in one: a launch advances it by what it costs."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def serve(governor: SlowdownGovernor, clock: FakeClock, launches: int, unmined_s: float, mined_s: float,
          tokens: int = 256) -> int:
    """Serve `launches` launches of one size; returns how many mined."""
    mined = 0
    for _ in range(launches):
        reserved = governor.admit(tokens)
        with governor.timed(CPU, tokens, mined=reserved is not None, reserved=reserved or 0.0):
            clock.now += unmined_s if reserved is None else mined_s
        mined += reserved is not None
    return mined


def governor_on(clock: FakeClock, cap: float | None, **kwargs) -> SlowdownGovernor:
    return SlowdownGovernor(cap, clock=clock, timer=clock, **kwargs)


@pytest.mark.parametrize("sample_every", [1, SAMPLE_EVERY])
@pytest.mark.parametrize("cap, mined_s", [(0.1, 3.0), (0.05, 1.25), (0.5, 10.0), (0.3, 1.5)])
def test_the_measured_slowdown_stays_within_the_cap_and_uses_it(cap, mined_s, sample_every) -> None:
    clock = FakeClock()
    governor = governor_on(clock, cap, sample_every=sample_every)
    mined = serve(governor, clock, 3000, unmined_s=1.0, mined_s=mined_s)
    measured = governor.measured_slowdown()
    assert measured is not None and measured <= cap * 1.02
    assert measured >= cap * 0.8  # the budget is spent, not left idle
    # a share f of the launches mined adds f·extra per unmined second: the cap is f = cap / extra
    assert mined == pytest.approx(3000 * cap / (mined_s - 1.0), rel=0.05)


def test_a_launch_cheaper_than_the_cap_always_mines_after_warm_up() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.5)
    mined = serve(governor, clock, 200, unmined_s=1.0, mined_s=1.2)
    assert mined >= 200 - 2 * (WARMUP_LAUNCHES + 1)  # only the unmined baseline launches are held


def test_the_unmined_time_is_learned_before_any_launch_mines() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.2)
    decisions = []
    for _ in range(WARMUP_LAUNCHES + 2):
        reserved = governor.admit(256)
        decisions.append(reserved is not None)
        with governor.timed(CPU, 256, mined=reserved is not None, reserved=reserved or 0.0):
            clock.now += 1.0
    assert decisions == [False] * (WARMUP_LAUNCHES + 1) + [True]
    assert governor.admit(2048) is None  # another size: its own baseline first


def test_warm_up_launches_cost_no_credit() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.1)
    serve(governor, clock, WARMUP_LAUNCHES + 1, unmined_s=1.0, mined_s=1.0)  # the baseline
    reserved = governor.admit(256)
    assert reserved == 0.0
    with governor.timed(CPU, 256, mined=True, reserved=reserved):
        clock.now += 500.0  # kernels compile on the first mined launch
    assert governor.admit(256) is not None  # not held back for the compile time
    assert governor.measured_slowdown() == 0.0  # and not counted as slowdown


def test_a_failed_launch_gives_its_reservation_back() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.1)
    serve(governor, clock, 40, unmined_s=1.0, mined_s=2.0)
    clock.now += 100.0  # bank credit
    before = governor.admit(256)
    assert before is not None and before > 0
    with pytest.raises(RuntimeError):
        with governor.timed(CPU, 256, mined=True, reserved=before):
            raise RuntimeError("mining failed")
    assert governor.admit(256) == pytest.approx(before)


def test_idle_time_buys_no_long_burst() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.1, window_s=30.0)
    serve(governor, clock, 50, unmined_s=1.0, mined_s=2.0)
    clock.now += 10_000.0  # paused or idle for hours
    burst = 0
    while governor.admit(256) is not None:  # launches of ~0 s: only banked credit pays
        with governor.timed(CPU, 256, mined=True, reserved=0.0):
            clock.now += 2.0
        burst += 1
        assert burst < 100
    assert burst <= 30 * 0.1 / (1.1 * 1.0) + 2  # the bank holds WINDOW_S seconds' credit, not 1000 s'


def test_uncapped_it_admits_everything_and_measures_once_there_is_a_baseline() -> None:
    clock = FakeClock()
    governor = governor_on(clock, None)
    assert governor.snapshot() == {"max_slowdown": 0.0, "measured_slowdown": -1.0}
    for mined in [False] * 3 + [True] * 8:
        assert governor.admit(256) == 0.0
        with governor.timed(CPU, 256, mined=mined):
            clock.now += 1.5 if mined else 1.0
    # 7 mined launches past warm-up, 0.5 s extra each, over 3 + 8·1.5 = 15 s of wall time
    extra = 7 * 0.5
    assert governor.measured_slowdown() == pytest.approx(extra / (15.0 - extra))


def test_sizes_are_power_of_two_classes() -> None:
    assert size_class(1) == size_class(1) != size_class(2)
    assert size_class(256) == size_class(511) != size_class(512)
    assert size_class(0) == size_class(1)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1000.0])
def test_a_bad_cap_is_refused(bad) -> None:
    with pytest.raises(GovernorError, match="max_slowdown"):
        SlowdownGovernor(bad)
    with pytest.raises(GovernorError, match="sample_every"):
        SlowdownGovernor(0.1, sample_every=0)
    with pytest.raises(argparse.ArgumentTypeError, match="above 0"):
        slowdown_fraction(str(bad))
    with pytest.raises(argparse.ArgumentTypeError, match="not a number"):
        slowdown_fraction("ten percent")
    assert slowdown_fraction("0.1") == 0.1


class SlowBackend:
    """Mines by serving the same GEMM, taking a fixed extra time on the fake clock."""

    name = "slow"

    def __init__(self, clock: FakeClock, extra_s: float, w13: torch.Tensor) -> None:
        self.clock, self.extra_s, self.w13 = clock, extra_s, w13

    def mine_launch(self, x: torch.Tensor, ids: torch.Tensor) -> LaunchResult:
        self.clock.now += self.extra_s
        return LaunchResult(grouped_fc1(x, ids, self.w13), winners=[], credited_work=1, tickets=1)


def test_the_layer_holds_launches_the_budget_cannot_pay_and_serves_them() -> None:
    gen = torch.Generator().manual_seed(3)
    w13 = torch.randn(4, 32, 64, generator=gen)
    x = torch.randn(24, 64, generator=gen)
    ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(24)])
    clock = FakeClock()
    governor = governor_on(clock, 0.25)
    stats = MiningStats()
    layer = MinedLayer(0, stats, lambda: True, lambda b, r: None, lambda exc: None, min_tokens=1, governor=governor)
    layer.backend = SlowBackend(clock, 4.0, w13)  # type: ignore[assignment]
    reference = grouped_fc1(x, ids, w13)
    for _ in range(60):
        clock.now += 1.0  # the rest of the step
        torch.testing.assert_close(layer.launch(x, ids, w13), reference)
    assert stats.launches_mined > 0 and stats.launches_held > 0
    assert stats.launches_mined + stats.launches_unmined == 60
    assert stats.launches_held <= stats.launches_unmined
    measured = governor.measured_slowdown()
    assert measured is not None and measured <= 0.25 * 1.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_launches_are_timed_by_events_read_only_once_done() -> None:
    governor = SlowdownGovernor(None, sample_every=1)
    a = torch.randn(8192, 8192, device="cuda")
    for mined in (False, False, True, True):
        with governor.timed(a, 4096, mined=mined):
            for _ in range(8 if mined else 4):
                a @ a
    start = time.perf_counter()
    with governor.timed(a, 16, mined=True):  # a launch of another size reads what is done as it begins
        pass
    waited = time.perf_counter() - start
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert busy and waited < 0.05  # the queued launches were not waited for
    with governor.timed(a, 16, mined=True):  # reads them now
        pass
    means = next(row for row in governor.launch_means() if row["tokens"] == 4096)
    assert means["mined_ms"] > 1.5 * means["unmined_ms"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_timing_events_are_reused_once_read(monkeypatch: pytest.MonkeyPatch) -> None:
    created = []

    class CountedEvent(torch.cuda.Event):
        def __new__(cls, *args, **kwargs):
            event = super().__new__(cls, *args, **kwargs)
            created.append(event)
            return event

    monkeypatch.setattr(torch.cuda, "Event", CountedEvent)
    governor = SlowdownGovernor(None, sample_every=1)
    a = torch.randn(256, 256, device="cuda")
    for _ in range(50):
        with governor.timed(a, 16, mined=True):
            a @ a
        torch.cuda.synchronize()
    assert len(created) <= 4  # two events a launch, read and recorded again
    assert governor.launch_means()[-1]["mined_ms"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_launches_between_the_samples_record_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = []
    monkeypatch.setattr(torch.cuda.Event, "record", lambda event, stream=None: recorded.append(stream))
    governor = SlowdownGovernor(None)
    a = torch.randn(256, 256, device="cuda")
    for _ in range(WARMUP_LAUNCHES + 1 + 4 * SAMPLE_EVERY):
        with governor.timed(a, 16, mined=True):
            a @ a
    assert len(recorded) == 2 * (WARMUP_LAUNCHES + 1 + 4)  # the warm-up, the first after it, then one in SAMPLE_EVERY


def test_a_new_cap_starts_an_empty_bank_and_keeps_the_times_learned() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.5)
    serve(governor, clock, 40, unmined_s=1.0, mined_s=2.0)
    clock.now += 100.0  # a full bank under the loose cap
    governor.set_cap(0.05)
    assert governor.admit(256) is None  # the tight cap has earned nothing yet
    clock.now += 30.0
    assert governor.admit(256) == pytest.approx(1.05 * 1.0)  # the mined and unmined means were kept
    governor.set_cap(None)
    assert governor.admit(256) == 0.0
    with pytest.raises(GovernorError):
        governor.set_cap(0.0)


def serve_mixture(governor: SlowdownGovernor, clock: FakeClock, steps: int) -> dict[str, int]:
    """GLM-5-like INT7 serving on the H200 (eleventh-session times): each step one prefill launch
    (65536 rows: 2.538 ms unmined, 4.711 mined) and 64 decode launches (512 rows: 0.205 / 0.260)."""
    tokens = {"prefill": 0, "decode": 0}
    for _ in range(steps):
        for kind, rows, unmined_s, mined_s in [("prefill", 65536, 2.538e-3, 4.711e-3)] + \
                [("decode", 512, 0.205e-3, 0.260e-3)] * 64:
            reserved = governor.admit(rows)
            with governor.timed(CPU, rows, mined=reserved is not None, reserved=reserved or 0.0):
                clock.now += unmined_s if reserved is None else mined_s
            tokens[kind] += rows if reserved is not None else 0
    return tokens


def test_the_budget_goes_to_the_launches_that_mine_most_per_second_of_slowdown(monkeypatch) -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.1)
    mined = serve_mixture(governor, clock, 3000)
    assert governor.measured_slowdown() <= 0.1 * 1.02
    # a prefill launch costs 2.173 ms extra a step's 1.566 ms of credit: 72 % of them can mine
    assert mined["prefill"] >= 0.68 * 3000 * 65536
    assert mined["decode"] <= 0.01 * mined["prefill"]  # decode only while exploring
    monkeypatch.setattr("miner.governor.EFFICIENCY_SLACK", 0.0)  # first come, first served
    fcfs_clock = FakeClock()
    fcfs = governor_on(fcfs_clock, 0.1)
    first_come = serve_mixture(fcfs, fcfs_clock, 3000)
    assert fcfs.measured_slowdown() <= 0.1 * 1.02
    assert sum(mined.values()) >= 2.2 * sum(first_come.values())  # 2.35× the rows for the same slowdown


def test_a_loose_cap_still_refreshes_the_unmined_time() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 100.0)  # never binds: measures without limiting
    unmined_s = 1.0
    held = 0
    for i in range(3 * BASELINE_EVERY):
        if i == BASELINE_EVERY:
            unmined_s = 2.0  # the unmined launch got slower (e.g. clocks, another model)
        reserved = governor.admit(256)
        held += reserved is None
        with governor.timed(CPU, 256, mined=reserved is not None, reserved=reserved or 0.0):
            clock.now += unmined_s if reserved is None else unmined_s + 0.5
    assert held <= WARMUP_LAUNCHES + 1 + 3  # the baseline, then one launch in BASELINE_EVERY
    assert governor._mean(size_class(256), False) > 1.1  # the new unmined time was seen


def test_without_a_cap_one_launch_in_baseline_every_measures_the_slowdown() -> None:
    clock = FakeClock()
    governor = governor_on(clock, None)
    held = 0
    for _ in range(3 * (BASELINE_EVERY + 1)):
        reserved = governor.admit(256)
        held += reserved is None
        with governor.timed(CPU, 256, mined=reserved is not None, reserved=reserved or 0.0):
            clock.now += 1.0 if reserved is None else 1.5
    assert held == 3  # every eligible launch mines but these
    measured = governor.measured_slowdown()
    assert measured is not None and abs(measured - 0.5) < 0.03


class CountingTimer:
    """The host timer of a FakeClock, counting how often a launch is timed."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.calls = clock, 0

    def __call__(self) -> float:
        self.calls += 1
        return self.clock.now


def test_one_launch_in_sample_every_is_timed_and_the_slowdown_counts_them_all() -> None:
    clock = FakeClock()
    timer = CountingTimer(clock)
    governor = SlowdownGovernor(None, clock=clock, timer=timer, sample_every=8)
    launches = 1 + 2 * (BASELINE_EVERY + 1)
    held = 0
    for _ in range(launches):
        reserved = governor.admit(256)
        held += reserved is None
        with governor.timed(CPU, 256, mined=reserved is not None, reserved=reserved or 0.0):
            clock.now += 1.0 if reserved is None else 1.5
    assert held == 2  # the launches served unmined to measure: each of them timed
    mined_timed = WARMUP_LAUNCHES + 1 + (launches - held - WARMUP_LAUNCHES - 1) // 8
    assert timer.calls == 2 * (mined_timed + held)
    # every mined launch but the warm-up is 0.5 s over the unmined second, timed or not
    extra = (launches - held - WARMUP_LAUNCHES) * 0.5
    assert governor.measured_slowdown() == pytest.approx(extra / (clock.now - 1000.0 - extra))


def test_an_untimed_launch_that_fails_gives_its_reservation_back() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.1, sample_every=1000)
    serve(governor, clock, 40, unmined_s=1.0, mined_s=2.0)
    clock.now += 100.0
    before = governor.admit(256)
    assert before is not None and before > 0
    with pytest.raises(RuntimeError):
        with governor.timed(CPU, 256, mined=True, reserved=before):  # between two samples
            raise RuntimeError("mining failed")
    assert governor.admit(256) == pytest.approx(before)


def test_launch_means_report_each_size() -> None:
    clock = FakeClock()
    governor = governor_on(clock, None)
    for tokens, mined, seconds in [(256, False, 1.0)] * 2 + [(256, True, 1.5)] * 2 + [(4, False, 0.1)]:
        with governor.timed(CPU, tokens, mined=mined):
            clock.now += seconds
    assert governor.launch_means() == [{"tokens": None, "unmined_ms": None, "mined_ms": None},  # warm-up only
                                       {"tokens": 256, "unmined_ms": 1000.0, "mined_ms": 1500.0}]


def test_a_size_seen_mined_once_does_not_take_the_priority_away() -> None:
    clock = FakeClock()
    governor = governor_on(clock, 0.1)
    for _ in range(WARMUP_LAUNCHES + 2):  # a rare size: its baseline, then one (warm-up) mined launch
        reserved = governor.admit(3000)
        with governor.timed(CPU, 3000, mined=reserved is not None, reserved=reserved or 0.0):
            clock.now += 0.03 if reserved is None else 0.06
    mined = serve_mixture(governor, clock, 3000)
    assert mined["prefill"] >= 0.68 * 3000 * 65536 and governor.measured_slowdown() <= 0.1 * 1.02


def test_a_launch_whose_time_cannot_be_read_is_left_out_and_serving_goes_on() -> None:
    governor = SlowdownGovernor(0.1, timer=object)  # end − start raises
    for _ in range(5):
        reserved = governor.admit(256)
        with governor.timed(CPU, 256, mined=reserved is not None, reserved=reserved or 0.0):
            pass
    assert governor.launch_means() == [] and governor.measured_slowdown() == 0.0  # nothing mined counted


def test_the_host_cost_probe_times_every_variant_on_the_cpu(tmp_path, monkeypatch) -> None:
    assert governor_cost.main(["--device", "cpu", "--launches", "40", "--reps", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "governor_cost.json").read_text())
    medians = result["host us a launch (median)"]
    assert set(medians) == set(governor_cost.variants()) and all(us > 0 for us in medians.values())
    assert set(result["governor host us a launch over the bare launch"]) == set(medians) - {"bare launch"}
    with pytest.raises(SystemExit):
        governor_cost.main(["--device", "cpu", "--launches", "0"])
    with pytest.raises(SystemExit):
        governor_cost.main(["--device", "bogus"])
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setattr(governor_cost, "measure", lambda *args: pytest.fail("measured before checking --out"))
    assert governor_cost.main(["--device", "cpu", "--launches", "4", "--reps", "1", "--out", str(blocker / "out")]) == 2

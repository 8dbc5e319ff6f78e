"""The slowdown budget: mine only as much as keeps serving within a chosen slowdown.

A mined launch costs more than the same launch served unmined (on the H200 the INT7 prefill pass
is ~1.9× its unmined GEMM and decode ~1.25×; on the CPU several times). An operator who accepts,
say, 10 % fewer tokens per second sets ``max_slowdown = 0.10``. The governor times layer
launches (CUDA events on the launch's stream, read once they have completed, so serving never waits
for them; host time on the CPU), learns per launch size what a mined launch costs over an unmined
one, and lets a launch mine only while the credit that serving time earns pays for its extra time.

Timing a CUDA launch costs ~22 µs of host time (H200: stream and capture checks, two event
records), a tenth of a decode launch, so one launch in ``SAMPLE_EVERY`` of each size and kind is
timed (and every launch the governor serves unmined to measure); an untimed launch is settled at
its size's expected cost and counted, so the measured slowdown extrapolates over every launch.

Credit accrues at ``max_slowdown`` seconds per second of wall time and a mined launch spends
(1 + max_slowdown) × its extra time, so over any stretch that starts with an empty bank the
extra time is at most ``max_slowdown`` × the time serving would have taken unmined. The bank
holds at most ``WINDOW_S`` seconds' worth (or one launch's need, if larger), so idle or paused
time buys no long burst of mining later. Without a cap every eligible launch mines except one in
``BASELINE_EVERY`` + 1 of each size, served unmined so the slowdown is measured all the same.

Launch sizes compete for the credit by what they mine per second of slowdown (tokens ÷ extra
time; the mined layers share one GEMM shape, so work is proportional to tokens). On the H200 an
INT7 prefill launch mines ~3× the rows per extra µs of a decode launch, and decode launches come
tens of times more often: first come, first served, they would take every credit as it accrues
and no prefill launch would ever mine. So a size below ``EFFICIENCY_SLACK`` of the best mines
only from a bank over half full, that is from credit the better sizes leave unused.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

WINDOW_S = 30.0  # the most serving time whose credit is banked
SMOOTHING = 0.2  # weight of the newest launch in a size's running mean
WARMUP_LAUNCHES = 1  # the first launches of each size and kind compile kernels: never used as times
EFFICIENCY_SLACK = 0.9  # sizes within this share of the best tokens per extra second count as the best
BASELINE_EVERY = 256  # after this many mined launches in a row a size serves one unmined (drift; uncapped: a measure)
SAMPLE_EVERY = 16  # past warm-up, one launch in this many of a size and kind is timed


class GovernorError(ValueError):
    """A bad slowdown cap."""


def slowdown_cap_text(max_slowdown: float | None) -> str:
    """The event a new cap publishes."""
    return "no slowdown cap" if max_slowdown is None else f"slowdown cap set to {100 * max_slowdown:.1f} %"


def check_cap(max_slowdown: float | None) -> None:
    """Refuse (GovernorError) a cap that is not a fraction above 0, or None."""
    if max_slowdown is not None and not 0 < max_slowdown <= 100:
        raise GovernorError(f"max_slowdown must be a fraction above 0 (0.1 = at most 10 % slower), "
                            f"got {max_slowdown}")


def _capturing(device: torch.device) -> bool:
    """Whether the current stream of `device` is capturing a CUDA graph."""
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def size_class(tokens: int) -> int:
    """Launches are compared within power-of-two token counts: a decode launch and a prefill launch
    differ by far more than the launches inside one class."""
    return max(tokens, 1).bit_length()


@dataclass
class _Times:
    """Running mean of one size and kind's launch seconds, past the warm-up launches."""

    seen: int = 0
    mean_s: float | None = None
    mean_tokens: float = 0.0
    total_s: float = 0.0  # the timed launches past warm-up, summed
    counted: int = 0
    untimed: int = 0  # launches served between the samples, each taken at the timed mean

    def extra_s(self, unmined_s: float) -> float:
        """Time over `unmined_s` a launch, summed over every launch past warm-up, timed or not."""
        if not self.counted:
            return 0.0
        return max(0.0, self.total_s - self.counted * unmined_s) * (1 + self.untimed / self.counted)

    def add(self, seconds: float, tokens: int) -> bool:
        """Take one launch's time; False for a warm-up launch (not used)."""
        self.seen += 1
        if self.seen <= WARMUP_LAUNCHES:
            return False
        first = self.mean_s is None
        self.mean_s = seconds if first else (1 - SMOOTHING) * self.mean_s + SMOOTHING * seconds
        self.mean_tokens = tokens if first else (1 - SMOOTHING) * self.mean_tokens + SMOOTHING * tokens
        self.total_s += seconds
        self.counted += 1
        return True


@dataclass
class _Launch:
    size: int
    tokens: int
    mined: bool
    reserved: float  # credit taken when the launch was admitted
    start: torch.cuda.Event | float
    end: torch.cuda.Event | float
    device: torch.device | None  # the events' device; None: host times


class SlowdownGovernor:
    """Decides which eligible launches mine under a slowdown cap and measures the slowdown.

    Called from the serving thread (``admit``, ``timed``); ``snapshot`` from any thread.
    """

    def __init__(self, max_slowdown: float | None = None, *, window_s: float = WINDOW_S,
                 sample_every: int = SAMPLE_EVERY, clock: Callable[[], float] = time.monotonic,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        """clock: wall time (credit, the measured base); timer: host launch time on the CPU;
        sample_every: 1 times every launch."""
        check_cap(max_slowdown)
        if window_s <= 0:
            raise GovernorError(f"window_s must be positive, got {window_s}")
        if sample_every < 1:
            raise GovernorError(f"sample_every must be at least 1, got {sample_every}")
        self.max_slowdown, self.window_s, self.clock, self.timer = max_slowdown, window_s, clock, timer
        self.sample_every = sample_every
        self._times: dict[tuple[int, bool], _Times] = {}
        self._started: dict[tuple[int, bool], int] = {}  # launches begun per size and kind: the sampling count
        self._measure: set[int] = set()  # sizes whose next unmined launch is served to be timed
        self._mined_in_a_row: dict[int, int] = {}  # per size, admitted since its last unmined launch
        self._pending: deque[_Launch] = deque()
        # read events, recorded again: no event is created per launch (an event stays on one device)
        self._spare_events: dict[torch.device, list[torch.cuda.Event]] = {}
        self._credit = 0.0
        self._refilled: float | None = None
        self._first: float | None = None
        self._lock = threading.Lock()
        self._replan()

    def set_cap(self, max_slowdown: float | None) -> None:
        """A new cap (None: none), from the next launch on. The bank restarts empty, so credit
        banked under a looser cap buys no burst under a tighter one; the times learned stay."""
        check_cap(max_slowdown)
        with self._lock:
            self.max_slowdown, self._credit, self._refilled = max_slowdown, 0.0, None
            self._replan()

    # -- decisions (serving thread) -----------------------------------------------------------
    def admit(self, tokens: int) -> float | None:
        """Whether a launch of `tokens` may mine: the credit it reserves (pass it to `timed`), or
        None to serve it unmined. Uncapped: 0.0, except one launch of a size in BASELINE_EVERY + 1,
        served unmined so that the slowdown is measured without a cap too. A launch served unmined
        to measure is always timed."""
        size = size_class(tokens)
        with self._lock:  # the cap may change from the control thread (set_cap)
            in_a_row = self._mined_in_a_row.get(size, 0)
            if self.max_slowdown is None:  # mine, but one launch in BASELINE_EVERY + 1 measures
                if in_a_row >= BASELINE_EVERY:
                    return self._to_measure(size)
                self._mined_in_a_row[size] = in_a_row + 1
                return 0.0
            self._refill()
            if self._mean(size, False) is None or in_a_row >= BASELINE_EVERY:
                return self._to_measure(size)  # learn (or refresh) the unmined time of this size first
            need = self._needs.get(size, 0.0)  # 0 until a mined launch of this size was timed
            floor = max(need, self._bank_s / 2) if size in self._lagging else need
            if self._credit < floor or self._credit < 0:
                return None
            self._credit -= need
            self._mined_in_a_row[size] = in_a_row + 1
            return need

    def _to_measure(self, size: int) -> None:
        self._mined_in_a_row[size] = 0
        self._measure.add(size)
        return None

    def _sampled(self, size: int, mined: bool) -> bool:
        """Whether this launch is timed: the warm-up launches and the first after them, then one
        in `sample_every`, and every launch served unmined to measure."""
        key = (size, mined)
        begun = self._started.get(key, 0)
        self._started[key] = begun + 1
        if not mined and size in self._measure:
            self._measure.discard(size)
            return True
        return begun <= WARMUP_LAUNCHES or (begun - WARMUP_LAUNCHES) % self.sample_every == 0

    @contextmanager
    def timed(self, device_tensor: torch.Tensor, tokens: int, mined: bool, reserved: float = 0.0) -> Iterator[None]:
        """Serve the launch run inside (on `device_tensor`'s device), timed if it is sampled;
        an untimed one is settled at its reservation and counted. If it raises, its reservation
        is returned and it is not counted. Nothing is timed while a CUDA graph is being captured
        (its replays are launches of their own; an untimed launch is not checked for that)."""
        size = size_class(tokens)
        sampled = self._sampled(size, mined)
        stream = None
        if sampled:
            self._collect()
            stream = torch.cuda.current_stream(device_tensor.device) if device_tensor.is_cuda else None
            if stream is not None and _capturing(device_tensor.device):
                with self._lock:
                    self._credit += reserved  # nothing is measured, so nothing is spent
                yield
                return
        start = self._mark(stream) if sampled else None
        if self._first is None:  # written by the serving thread alone
            with self._lock:
                self._first = self.clock()
        try:
            yield
        except BaseException:
            with self._lock:
                self._credit += reserved
            raise
        if not sampled:
            times = self._times.get((size, mined))
            if times is None:  # a new entry under the lock: readers iterate the dict
                with self._lock:
                    times = self._times.setdefault((size, mined), _Times())
            times.untimed += 1  # an int the serving thread alone writes
            return
        self._pending.append(_Launch(size, tokens, mined, reserved, start, self._mark(stream),
                                    None if stream is None else stream.device))
        self._collect()

    def _mark(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event | float:
        """A point in time: an event recorded on the launch's CUDA stream, or the host timer."""
        if stream is None:
            return self.timer()
        spare = self._spare_events.get(stream.device)
        event = spare.pop() if spare else torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    # -- measurement --------------------------------------------------------------------------
    def _collect(self) -> None:
        """Account every finished timed launch, oldest first (a CUDA launch once its end event is
        done): called as a sampled launch begins and ends, so at most every `sample_every` launches.
        Never raises: a launch whose time cannot be read is dropped (serving must not fail for a
        measurement), and nothing is read while a CUDA graph is captured (queries are not allowed)."""
        while self._pending:
            launch = self._pending[0]
            try:
                if isinstance(launch.end, torch.cuda.Event):
                    if torch.cuda.is_current_stream_capturing() or not launch.end.query():
                        return
                    seconds = launch.start.elapsed_time(launch.end) / 1000.0
                else:
                    seconds = launch.end - launch.start
            except Exception as exc:  # noqa: BLE001 — the measurement is lost, the launch was served
                self._pending.popleft()
                log.warning("slowdown budget: a launch's time could not be read (%s); left out", exc)
                with self._lock:
                    self._credit += launch.reserved
                continue
            self._pending.popleft()
            if launch.device is not None:
                self._spare_events.setdefault(launch.device, []).extend((launch.start, launch.end))
            self._account(launch, seconds)

    def _account(self, launch: _Launch, seconds: float) -> None:
        with self._lock:
            times = self._times.setdefault((launch.size, launch.mined), _Times())
            used = times.add(seconds, launch.tokens)
            if not launch.mined:
                self._mined_in_a_row[launch.size] = 0  # a fresh unmined time, whatever the reason
            elif self.max_slowdown is not None:
                unmined = self._mean(launch.size, False)
                spent = (1 + self.max_slowdown) * max(0.0, seconds - unmined) if used and unmined is not None else 0.0
                self._credit += launch.reserved - spent  # a warm-up launch gets its reservation back
            self._replan()

    def _mean(self, size: int, mined: bool) -> float | None:
        times = self._times.get((size, mined))
        return None if times is None else times.mean_s

    def _refill(self) -> None:
        now = self.clock()
        if self._refilled is not None:
            self._credit = min(self._bank_s, self._credit + self.max_slowdown * (now - self._refilled))
        self._refilled = now

    def _replan(self) -> None:
        """From the means and the cap, what `admit` looks up: each mined size's need, the bank's
        size (WINDOW_S seconds' worth, or the largest need) and the sizes that mine clearly fewer
        tokens per second of credit than the best (they wait for a bank over half full). Redone
        when either changes (a timed launch accounted, a new cap), not on every launch."""
        if self.max_slowdown is None:
            self._needs, self._lagging, self._bank_s = {}, set(), 0.0
            return
        self._needs = {size: self._need(size) for size, mined in self._times if mined}
        self._bank_s = max(self.max_slowdown * self.window_s, max(self._needs.values(), default=0.0))
        # tokens mined per second of credit; a free or untimed size is always among the best,
        # without setting the bar
        efficiency = {size: self._times[(size, True)].mean_tokens / need for size, need in self._needs.items()
                      if need > 0}
        best = max(efficiency.values(), default=0.0)
        self._lagging = {size for size, value in efficiency.items() if value < EFFICIENCY_SLACK * best}

    def _need(self, size: int) -> float:
        mined, unmined = self._mean(size, True), self._mean(size, False)
        return 0.0 if mined is None or unmined is None else (1 + self.max_slowdown) * max(0.0, mined - unmined)

    # -- reporting (any thread) ---------------------------------------------------------------
    def launch_means(self) -> list[dict[str, float | None]]:
        """Per launch size (smallest first): the mean tokens and the running means of a launch's
        milliseconds unmined and mined (None where not timed yet), past warm-up."""
        with self._lock:
            sizes = sorted({size for size, _ in self._times})
            rows = []
            for size in sizes:
                unmined, mined = self._mean(size, False), self._mean(size, True)
                timed = [self._times[(size, kind)] for kind, mean in ((True, mined), (False, unmined)) if mean is not None]
                rows.append({"tokens": timed[0].mean_tokens if timed else None,
                             "unmined_ms": None if unmined is None else unmined * 1e3,
                             "mined_ms": None if mined is None else mined * 1e3})
        return rows

    def measured_slowdown(self) -> float | None:
        """Extra time of the mined launches over the same launches unmined, as a fraction of the
        wall time since the first launch less that extra (how much longer serving took than it
        would have unmined). None until a mined launch of every mined size has an unmined time."""
        with self._lock:
            if self._first is None:
                return None
            extra = 0.0
            for (size, mined), times in self._times.items():
                if not mined or not times.counted:
                    continue
                unmined = self._mean(size, False)
                if unmined is None:
                    return None
                extra += times.extra_s(unmined)
            base = self.clock() - self._first - extra
        return extra / base if base > 0 else None

    def snapshot(self) -> dict[str, float]:
        """The cap (0 = none) and the measured slowdown (−1 = not known yet), for the status."""
        measured = self.measured_slowdown()
        return {"max_slowdown": self.max_slowdown or 0.0,
                "measured_slowdown": -1.0 if measured is None else measured}

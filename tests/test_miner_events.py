"""Event bus, counters and the progress display."""
import io

from miner.accounting import MiningStats
from miner.events import EventBus
from miner.progress import ProgressDisplay, human, slowdown_text, status_line


def test_bus_replays_history_and_never_blocks_on_a_slow_subscriber() -> None:
    bus = EventBus(history=3, queue_size=2)
    for i in range(5):
        bus.publish("info", f"m{i}")
    assert [e.message for e in bus.recent()] == ["m2", "m3", "m4"]
    replayed = bus.subscribe(replay=True)
    live = bus.subscribe(replay=False)
    assert replayed.qsize() == 2  # the replay keeps to the queue's size: the newest history
    bus.publish("job", "new")  # the replay queue is full: its oldest entry gives way
    assert [replayed.get_nowait().message for _ in range(2)] == ["m4", "new"]
    assert live.get_nowait().message == "new" and live.empty()
    seqs = [e.seq for e in bus.recent()]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    bus.unsubscribe(live)
    bus.publish("x", "y")
    assert live.empty()


def test_stats_snapshot_and_hashrate() -> None:
    stats = MiningStats(window_s=60)
    stats.credit(1000, 4)
    stats.credit(3000, 6)
    stats.add("winners", 2)
    stats.reject("stale")
    stats.reject("stale")
    snap = stats.snapshot()
    assert (snap["credited_work"], snap["tickets"], snap["launches_mined"], snap["winners"]) == (4000, 10, 2, 2)
    assert snap["rejected"] == 2 and snap["rejected_reasons"] == {"stale": 2}
    assert 0 < snap["hashrate"] <= 4000  # at most all the work over the 1 s floor


def test_progress_display_prints_events_and_a_status_line() -> None:
    bus, out = EventBus(), io.StringIO()
    display = ProgressDisplay(bus, interval=0.0, out=out)
    bus.publish("accepted", "block for job abc accepted")
    bus.publish("mode_preference", "quiet")
    status = {"uptime_s": 12.0, "state": "mining", "mode": "int7-moe", "height": 5, "job_id": "abcdef0123",
              "serving": {"tokens_per_s": 100.0, "decode_tokens_per_s": 20.0, "requests": 3},
              "mining": {"credited_work": 2_500_000_000, "hashrate": 1.5e9, "tickets": 7, "winners": 1,
                         "submitted": 1, "accepted": 1, "rejected": 0, "max_slowdown": 0.1,
                         "measured_slowdown": 0.082}}
    display.tick(status)
    text = out.getvalue()
    assert "accepted: block for job abc accepted" in text and "quiet" not in text
    assert status_line(status) in text and "work 2.50G (1.50G/s)" in text and "h=5" in text
    assert "slowdown 8.2 % measured, cap 10.0 %" in text
    assert slowdown_text({}) == "not measured yet, cap none"
    assert human(999) == "999" and human(1234) == "1.23k" and human(3e15) == "3.00P"

"""A small publish/subscribe bus: the worker's events for WatchEvents, the log and the display."""
from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Event:
    kind: str
    message: str
    seq: int = 0
    time: float = field(default_factory=time.time)


class EventBus:
    """Fan-out to bounded subscriber queues; a slow subscriber loses its oldest events, never
    blocks the publisher. The last ``history`` events are replayed to new subscribers."""

    def __init__(self, history: int = 64, queue_size: int = 1024) -> None:
        self._subs: list[queue.Queue[Event]] = []
        self._history: list[Event] = []
        self._limit, self._queue_size = history, queue_size
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def publish(self, kind: str, message: str) -> Event:
        with self._lock:
            event = Event(kind, message, next(self._seq))
            self._history = (self._history + [event])[-self._limit:]
            subs = list(self._subs)
        for sub in subs:
            while True:
                try:
                    sub.put_nowait(event)
                    break
                except queue.Full:
                    try:
                        sub.get_nowait()
                    except queue.Empty:
                        pass
        return event

    def subscribe(self, replay: bool = True) -> queue.Queue[Event]:
        sub: queue.Queue[Event] = queue.Queue(self._queue_size)
        with self._lock:
            for event in self._history[-self._queue_size:] if replay else []:
                sub.put_nowait(event)
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: queue.Queue[Event]) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    def recent(self) -> list[Event]:
        with self._lock:
            return list(self._history)

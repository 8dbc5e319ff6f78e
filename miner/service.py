"""The gRPC control service (GetStatus, WatchEvents, Pause, Resume, SetMode) and its client."""
from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent import futures
from typing import Any, Protocol

import grpc

from miner.events import EventBus
from miner.proto import control_pb2 as pb
from miner.proto import control_pb2_grpc as pb_grpc

DEFAULT_CONTROL = "127.0.0.1:50551"
ADDRESS_FILE = "control.addr"  # written into the data directory by `pearl-moe run`


class Controllable(Protocol):
    """What the service needs from a worker."""

    events: EventBus

    def status(self) -> dict[str, Any]: ...

    def pause(self, reason: str) -> None: ...

    def resume(self) -> None: ...

    def set_mode(self, mode: str) -> None: ...

    def set_max_slowdown(self, max_slowdown: float | None) -> None: ...


def status_message(status: dict[str, Any]) -> pb.Status:
    """Build the Status message from a worker's status dict (the same dict the display uses)."""
    mining = dict(status["mining"])
    reasons = mining.pop("rejected_reasons", {})
    return pb.Status(
        **{k: v for k, v in status.items() if k not in ("mining", "serving")},
        serving=pb.Serving(**status["serving"]),
        mining=pb.Mining(rejected_reasons=reasons, **mining),
    )


class ControlServicer(pb_grpc.MinerControlServicer):
    def __init__(self, worker: Controllable, poll_s: float = 0.2) -> None:
        self.worker, self.poll_s = worker, poll_s

    def GetStatus(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.Status:
        return status_message(self.worker.status())

    def Pause(self, request: pb.PauseRequest, context: grpc.ServicerContext) -> pb.Status:
        self.worker.pause(request.reason or "paused over gRPC")
        return status_message(self.worker.status())

    def Resume(self, request: pb.ResumeRequest, context: grpc.ServicerContext) -> pb.Status:
        self.worker.resume()
        return status_message(self.worker.status())

    def SetMode(self, request: pb.SetModeRequest, context: grpc.ServicerContext) -> pb.Status:
        try:
            self.worker.set_mode(request.mode)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return status_message(self.worker.status())

    def SetMaxSlowdown(self, request: pb.SetMaxSlowdownRequest, context: grpc.ServicerContext) -> pb.Status:
        try:
            self.worker.set_max_slowdown(request.max_slowdown or None)  # 0: no cap
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return status_message(self.worker.status())

    def WatchEvents(self, request: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.Event]:
        sub = self.worker.events.subscribe(replay=request.replay)
        try:
            while context.is_active():
                try:
                    event = sub.get(timeout=self.poll_s)
                except queue.Empty:
                    continue
                yield pb.Event(seq=event.seq, time=event.time, kind=event.kind, message=event.message)
        finally:
            self.worker.events.unsubscribe(sub)


def serve(worker: Controllable, address: str = "127.0.0.1:0") -> tuple[grpc.Server, int]:
    """Start the service on ``address``; returns the server and the bound port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="grpc"))
    pb_grpc.add_MinerControlServicer_to_server(ControlServicer(worker), server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the control service to {address}")
    server.start()
    return server, port


class ControlClient:
    """The CLI's side: a channel to a running worker."""

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.MinerControlStub(self.channel)
        self.timeout = timeout

    def status(self) -> pb.Status:
        return self.stub.GetStatus(pb.StatusRequest(), timeout=self.timeout)

    def pause(self, reason: str = "") -> pb.Status:
        return self.stub.Pause(pb.PauseRequest(reason=reason), timeout=self.timeout)

    def resume(self) -> pb.Status:
        return self.stub.Resume(pb.ResumeRequest(), timeout=self.timeout)

    def set_mode(self, mode: str) -> pb.Status:
        return self.stub.SetMode(pb.SetModeRequest(mode=mode), timeout=self.timeout)

    def set_max_slowdown(self, max_slowdown: float) -> pb.Status:
        """0: no cap."""
        return self.stub.SetMaxSlowdown(pb.SetMaxSlowdownRequest(max_slowdown=max_slowdown), timeout=self.timeout)

    def events(self, replay: bool = True) -> Iterator[pb.Event]:
        return self.stub.WatchEvents(pb.WatchRequest(replay=replay))

    def close(self) -> None:
        self.channel.close()

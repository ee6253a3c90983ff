"""The XID listener: one thread that registers NVML's critical-XID event (and the ECC
double/single-bit events where the GPU supports them) on every GPU, waits on the event set
with a short timeout until it is stopped, and hands each event to a callback at once.

The daemon's callback records the event and re-evaluates (`record_into(buffer)` is the
part that files XIDs into the recent-XID buffer the `gpu_xid` check reads). A GPU that is
lost at registration or while waiting is reported through the callback (kind GPU_LOST) and
the listener keeps listening on the others. `stop()` returns within about one wait period.

Typical wiring:

    buffer = XidBuffer()
    listener = XidListener(client, record_into(buffer, then=daemon.on_gpu_event))
    listener.start()            # True once every GPU is registered (or reported lost)
    ...
    listener.stop()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from healthd.nvml_client import (
    EVENT_DBE,
    EVENT_SBE,
    EVENT_XID,
    NvmlError,
    NvmlEvents,
    NvmlGpuLost,
)
from healthd.xid import MEMORY_CHECKS, MEMORY_XIDS, XidBuffer

# NVML returns from a wait as soon as an event arrives; the timeout only bounds how long
# stop() takes, so a long one costs nothing in latency and saves wake-ups.
DEFAULT_WAIT_MS = 1000
ERROR_BACKOFF_SECONDS = 0.2  # after a failed wait, so a broken NVML does not spin a CPU


class EventKind(StrEnum):
    XID = "xid"
    ECC_DBE = "ecc_dbe"
    ECC_SBE = "ecc_sbe"
    GPU_LOST = "gpu_lost"  # registration or a wait answered NVML_ERROR_GPU_IS_LOST
    ERROR = "error"  # the listener could not register or wait; detail says why


_KINDS = {EVENT_XID: EventKind.XID, EVENT_DBE: EventKind.ECC_DBE, EVENT_SBE: EventKind.ECC_SBE}


@dataclass(frozen=True)
class GpuEvent:
    kind: EventKind
    gpu: int | None  # NVML index; None when unknown
    monotonic: float  # when the listener received it (time.monotonic)
    xid: int | None = None
    detail: str = ""


@dataclass
class ListenerStatus:
    registered: dict[int, int] = field(default_factory=dict)  # GPU -> event mask
    lost: set[int] = field(default_factory=set)
    # Monotonic time the thread last showed progress: started, or came back from NVML (a
    # registration attempt or an event wait). None before start().
    heartbeat: float | None = None
    events: int = 0
    errors: int = 0


class XidListener:
    def __init__(
        self,
        events: NvmlEvents,
        on_event: Callable[[GpuEvent], None],
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        include_ecc: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._events = events
        self._on_event = on_event
        self.wait_ms = wait_ms
        self.wanted = EVENT_XID | (EVENT_DBE | EVENT_SBE if include_ecc else 0)
        self._clock = clock
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.status = ListenerStatus()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, ready_timeout: float = 10.0) -> bool:
        """Start the thread; True once registration finished (events injected after that
        are delivered), False if it did not within `ready_timeout` (it keeps trying)."""
        if self.running:
            return self._ready.is_set()
        self._stop.clear()
        self._ready.clear()
        self.status.heartbeat = self._clock()
        self._thread = threading.Thread(target=self._main, name="xid-listener", daemon=True)
        self._thread.start()
        return self._ready.wait(ready_timeout)

    def stop(self, timeout: float | None = None) -> bool:
        """Ask the thread to stop; True when it has (False: stuck in a hung NVML call).
        By default waits one wait period and a half second more."""
        if timeout is None:
            timeout = self.wait_ms / 1000 + 0.5
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def stalled_for(self) -> float | None:
        """Seconds since the thread last showed progress (it started, or a registration
        attempt or an event wait returned), for the daemon's watchdog: a hung NVML call
        leaves it stuck in C. None before start()."""
        beat = self.status.heartbeat
        return None if beat is None else self._clock() - beat

    def _emit(self, event: GpuEvent) -> None:
        self.status.events += 1
        try:
            self._on_event(event)
        except Exception:  # a broken callback must not kill the listener
            self.status.errors += 1

    def _register(self) -> Any | None:
        try:
            event_set = self._events.event_set_create()
            count = self._events.device_count()
        except NvmlError as exc:
            self.status.errors += 1
            self._emit(GpuEvent(EventKind.ERROR, None, self._clock(), detail=str(exc)))
            return None
        for index in range(count):
            try:
                mask = self._events.register_events(event_set, index, self.wanted)
                self.status.registered[index] = mask
            except NvmlGpuLost as exc:
                self.status.lost.add(index)
                self._emit(GpuEvent(EventKind.GPU_LOST, index, self._clock(), detail=str(exc)))
            except NvmlError as exc:
                self.status.errors += 1
                self._emit(GpuEvent(EventKind.ERROR, index, self._clock(), detail=str(exc)))
        return event_set

    def _main(self) -> None:
        event_set = None
        while event_set is None and not self._stop.is_set():
            event_set = self._register()
            self.status.heartbeat = self._clock()  # back from NVML, registered or not
            if event_set is None:
                self._stop.wait(ERROR_BACKOFF_SECONDS * 5)
        self._ready.set()
        if event_set is None:
            return
        try:
            while not self._stop.is_set():
                self._wait_once(event_set)
        finally:
            with suppress(NvmlError):
                self._events.event_set_free(event_set)

    def _wait_once(self, event_set: Any) -> None:
        try:
            raw = self._events.event_wait(event_set, self.wait_ms)
        except NvmlGpuLost as exc:
            self.status.heartbeat = self._clock()
            self._emit(GpuEvent(EventKind.GPU_LOST, exc.gpu, self._clock(), detail=str(exc)))
            self._stop.wait(ERROR_BACKOFF_SECONDS)
            return
        except NvmlError as exc:
            self.status.heartbeat = self._clock()
            self.status.errors += 1
            self._emit(GpuEvent(EventKind.ERROR, exc.gpu, self._clock(), detail=str(exc)))
            self._stop.wait(ERROR_BACKOFF_SECONDS)
            return
        now = self._clock()
        self.status.heartbeat = now
        if raw is None:
            return
        kind = _KINDS.get(raw.event_type)
        if kind is None:
            return
        xid = raw.data if kind is EventKind.XID else None
        self._emit(GpuEvent(kind, raw.gpu, now, xid=xid, detail=f"event type 0x{raw.event_type:x}"))


# The checks worth re-running at once when the listener reports an event of each kind.
RERUN_ON: dict[EventKind, tuple[str, ...]] = {
    EventKind.XID: ("gpu_xid",),
    EventKind.ECC_DBE: ("gpu_ecc", "gpu_remapped_rows", "gpu_retired_pages"),
    EventKind.ECC_SBE: ("gpu_ecc",),
    EventKind.GPU_LOST: ("gpu_count",),
    EventKind.ERROR: (),
}


def checks_for(event: GpuEvent) -> tuple[str, ...]:
    """The check names to re-run for `event` (the daemon's on_xid takes names)."""
    if event.kind is EventKind.XID and event.xid in MEMORY_XIDS:
        return (*RERUN_ON[event.kind], *MEMORY_CHECKS)
    return RERUN_ON[event.kind]


def record_into(
    buffer: XidBuffer, then: Callable[[GpuEvent], None] | None = None
) -> Callable[[GpuEvent], None]:
    """A listener callback that files XID events into `buffer`, then calls `then` (the
    daemon's "record an event and re-evaluate") with every event."""

    def on_event(event: GpuEvent) -> None:
        if event.kind is EventKind.XID and event.xid is not None:
            buffer.add(event.xid, event.gpu, source="nvml", monotonic=event.monotonic)
        if then is not None:
            then(event)

    return on_event

"""The daemon's GPU side: one NVML client, the recent-XID buffer and the XID listener thread,
wired so an NVML event reaches the checks that read it at once.

`start_gpu_plumbing` decides whether this node is a GPU node: `[healthd] gpus = "auto"`
(default) starts the plumbing when NVML initialises and leaves it out when the library is
absent (a CPU-only node); "required" starts it regardless, so a node whose driver fails to
load reports `gpu.nvml.unavailable` instead of silently looking like a CPU node; "none"
never touches NVML.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from healthd.checks.base import CheckContext
from healthd.checks.gpu_common import GpuContext, JobStateProvider
from healthd.nvml_client import NvmlError, NvmlUnavailable, PynvmlClient
from healthd.xid import XidBuffer
from healthd.xid_listener import GpuEvent, XidListener, checks_for, record_into

log = logging.getLogger("medic.healthd.gpu")

GPU_MODES = ("auto", "required", "none")
INIT_WAIT = 2.0  # seconds start-up waits for nvmlInit before it goes on without it


@dataclass
class _Opening:
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


def _open_in_background(client: PynvmlClient) -> _Opening:
    opening = _Opening()

    def run() -> None:
        try:
            client.open()
        except Exception as exc:
            opening.error = exc
        finally:
            opening.done.set()

    threading.Thread(target=run, name="nvml-init", daemon=True).start()
    return opening


@dataclass
class GpuPlumbing:
    client: PynvmlClient
    jobs: JobStateProvider | None = None
    xids: XidBuffer = field(default_factory=XidBuffer)
    # Set by the daemon: called with the names of the checks to run now.
    on_xid: Callable[[Iterable[str]], None] | None = None
    # Set by the daemon: called with every listener event (to record it).
    on_event: Callable[[GpuEvent], None] | None = None
    listener: XidListener | None = None

    def start(self, ready_timeout: float = 10.0) -> bool:
        self.listener = XidListener(self.client, record_into(self.xids, then=self._dispatch))
        return self.listener.start(ready_timeout)

    def _dispatch(self, event: GpuEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)
        if self.on_xid is not None:
            self.on_xid(checks_for(event))

    def stalled_for(self) -> float | None:
        """Seconds since the XID listener last showed progress (None: not started); the
        listener is a new one after a driver reload, so this always asks the current one."""
        listener = self.listener
        return None if listener is None else listener.stalled_for()

    def extend(self, ctx: CheckContext) -> CheckContext:
        return dataclasses.replace(ctx, nvml=GpuContext(self.client, self.xids, self.jobs))

    def release(self) -> None:
        """Before a GPU reset or a driver reload (the ladder): no NVML handle of ours may stay
        open, so the listener stops, NVML is shut down and kept shut (the GPU checks say
        UNKNOWN meanwhile), and the watchdog stops judging the listener until reacquire()."""
        self.client.hold_closed("NVML released for a repair in progress")
        self.stop()
        self.listener = None

    def reacquire(self) -> None:
        """After the repair, whatever its outcome: handles and event registrations from
        before it are stale, so NVML opens afresh and a new listener starts."""
        self.client.hold_closed("")
        self.restart()

    def restart(self) -> None:
        """NVML afresh: handles and event registrations are stale."""
        if self.listener is not None:
            self.listener.stop()
        self.client.close()
        try:
            self.client.open()
        except NvmlError as exc:
            log.error("NVML did not come back after the driver reload: %s", exc)
        self.start()

    def stop(self) -> None:
        if self.listener is not None and not self.listener.stop():
            log.warning("the XID listener is stuck in an NVML call; leaving it behind")
        self.client.close()


def start_gpu_plumbing(
    mode: str,
    jobs: JobStateProvider | None = None,
    *,
    call_timeout: float = 3.0,
    client: PynvmlClient | None = None,
    init_wait: float = INIT_WAIT,
) -> GpuPlumbing | None:
    if mode == "none":
        return None
    client = client or PynvmlClient(call_timeout=call_timeout)
    opened = _open_in_background(client)
    if not opened.done.wait(init_wait):
        # A driver whose nvmlInit hangs is a GPU node in trouble: the daemon starts and
        # answers without it (the GPU checks time out and say so until it returns).
        log.error("nvmlInit has not returned after %gs: starting without waiting for it", init_wait)
        plumbing = GpuPlumbing(client, jobs)
        plumbing.start(ready_timeout=0)
        return plumbing
    try:
        if opened.error is not None:
            raise opened.error
    except NvmlUnavailable as exc:
        if mode == "auto":
            log.info("NVML unavailable (%s): no GPU checks on this node", exc)
            return None
        log.error("NVML unavailable but [healthd] gpus = 'required': %s", exc)
    except NvmlError as exc:  # a timeout or driver error: a GPU node in trouble, keep trying
        log.error("NVML did not initialise: %s", exc)
    plumbing = GpuPlumbing(client, jobs)
    if not plumbing.start():
        log.warning("the XID listener has not registered every GPU yet; it keeps trying")
    return plumbing

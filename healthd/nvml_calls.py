"""The pynvml call engine under healthd.nvml_client.PynvmlClient: NVML's life (load, init,
shutdown, a hold while a repair needs it shut), every call on a worker under its deadline
(healthd.deadlines), a check's sweep over the GPUs on one worker, the calls that overran
remembered as hung, NVML's error codes as typed errors, and the per-GPU streaks of timeouts
and lost answers (`call_health`). The readers (what each NVML call means) are the client's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, Self, TypeVar

from healthd.deadlines import Abandoned, Item, Lane, Timekeeper
from healthd.nvml_types import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_INIT_TIMEOUT,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    UNAVAILABLE_CODES,
    CallHealth,
    NvmlError,
    NvmlGpuLost,
    NvmlNotSupported,
    NvmlTimeout,
    NvmlUnavailable,
    Reading,
    Sweep,
    measure,
    problem_of,
    run_sweep,
)
from healthd.workers import WorkerPool

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class _Slot:
    """What one call returned or raised."""

    value: Any = None
    error: BaseException | None = None


_FIRST: Any = object()  # a sweep's first step: next(plan), nothing to send yet


@dataclass(eq=False)
class _SweepRun:
    """One `sweep()`: the plan, its calls' time kept by `keeper` (each call an item tagged
    with its GPU), and how it ended (set under the keeper's cond by the lane that ends it)."""

    plan: Sweep[Any]
    keeper: Timekeeper[int | None]
    result: Any = None
    error: BaseException | None = None


@dataclass
class _Streak:
    timeouts: int = 0
    lost: int = 0
    last_problem: str = ""
    last_function: str = ""
    since: float | None = None


def _load_pynvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


class NvmlCalls:
    """Every NVML call under its deadline; see the module's docstring. Thread-safe."""

    def __init__(
        self,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        init_timeout: float = DEFAULT_INIT_TIMEOUT,
        loader: Callable[[], ModuleType] = _load_pynvml,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.call_timeout = call_timeout
        self.init_timeout = init_timeout
        self._loader = loader
        self._clock = clock
        self._nv: ModuleType | None = None
        self._opened = False
        self._lock = threading.Lock()
        self._init_lock = threading.Lock()
        self._hung: dict[tuple[str, int | None], Item[int | None]] = {}  # calls that overran
        self._workers = WorkerPool("nvml-call")
        self._local = threading.local()  # .on: (sweep, lane) on a sweep's worker
        self._streaks: dict[int, _Streak] = {}
        self._held = ""  # why NVML must stay shut ("": it may open)

    # -- lifecycle

    def open(self) -> Self:
        self._ensure_open()
        return self

    def close(self) -> None:
        with self._init_lock:
            if self._opened and self._nv is not None:
                nv = self._nv
                with suppress(NvmlError):
                    self._run("nvmlShutdown", None, nv.nvmlShutdown, self.init_timeout)
            self._opened = False

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _module(self) -> ModuleType:
        if self._nv is None:
            try:
                self._nv = self._loader()
            except ImportError as exc:
                raise NvmlUnavailable("import pynvml", None, str(exc)) from exc
        return self._nv

    def _opened_anew(self) -> None:
        """NVML was initialised (again): a new driver may answer differently."""

    def hold_closed(self, why: str) -> None:
        """While `why` is set, NVML is not initialised again: a call fails as unavailable
        with that reason (a repair needs every handle of ours shut). "" lifts the hold."""
        self._held = why

    def _ensure_open(self) -> ModuleType:
        nv = self._module()
        if self._opened:
            return nv
        with self._init_lock:
            if self._held:  # under the lock: close() for a repair waits for an init under way
                raise NvmlUnavailable("nvmlInit", None, self._held)
            if not self._opened:
                with self._off_sweep(self.init_timeout + self.call_timeout):
                    self._run("nvmlInit", None, nv.nvmlInit, self.init_timeout)
                self._opened_anew()
                self._opened = True
        return nv

    @contextmanager
    def _off_sweep(self, allow: float) -> Iterator[None]:
        """On a sweep's worker, run the body's calls on a worker of their own with their own
        deadline (the init: a hung one must not keep the init lock on the sweep's worker);
        the sweep's caller gives the body `allow` seconds."""
        on = getattr(self._local, "on", None)
        if on is None:
            yield
            return
        run, lane = on
        self._local.on = None
        try:
            with run.keeper.item(lane, "nvmlInit", None, allow):
                yield
        finally:
            self._local.on = on

    # -- the deadline wrapper

    def _translate(self, function: str, gpu: int | None, exc: BaseException) -> BaseException:
        nv = self._nv
        if nv is None or not isinstance(exc, nv.NVMLError):
            return exc
        code = getattr(exc, "value", None)
        detail = str(exc)
        if code == NVML_ERROR_GPU_IS_LOST:
            return NvmlGpuLost(function, gpu, detail, code=code)
        if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
            return NvmlNotSupported(function, gpu, detail, code=code)
        if code == NVML_ERROR_TIMEOUT:
            return NvmlTimeout(function, gpu, 0.0)
        if code in UNAVAILABLE_CODES:
            if code == NVML_ERROR_UNINITIALIZED:
                self._opened = False
            return NvmlUnavailable(function, gpu, detail, code=code)
        return NvmlError(function, gpu, detail, code=code)

    def _record(self, gpu: int | None, function: str, problem: str) -> None:
        if gpu is None:
            return
        with self._lock:
            streak = self._streaks.setdefault(gpu, _Streak())
            if not problem:
                self._streaks[gpu] = _Streak()
                return
            if streak.since is None:
                streak.since = self._clock()
            streak.last_problem, streak.last_function = problem, function
            if problem == "timeout":
                streak.timeouts += 1
            elif problem == "gpu_lost":
                streak.lost += 1

    def _run(self, function: str, gpu: int | None, call: Callable[[], T], timeout: float) -> T:
        key = (function, gpu)
        with self._lock:
            hung = self._hung.get(key)
            if hung is not None and hung.returned():
                del self._hung[key]
                hung = None
        if hung is not None:
            self._record(gpu, function, "timeout")
            raise NvmlTimeout(function, gpu, timeout, still_hung=True)
        slot = _Slot()

        def make_call() -> None:
            try:
                slot.value = call()
            except BaseException as exc:
                slot.error = exc

        on = getattr(self._local, "on", None)
        if on is not None:  # a sweep's worker: call directly, the sweep's caller keeps time
            run, lane = on
            with run.keeper.item(lane, function, gpu, timeout):
                make_call()
        else:
            keeper: Timekeeper[int | None] = Timekeeper(self._workers)

            def one_call(lane: Lane[int | None]) -> None:
                with keeper.item(lane, function, gpu, timeout):
                    make_call()

            keeper.start(one_call, f"nvml-{function}")
            overran = [item for _, item in keeper.overran()]
            if overran:
                with self._lock:
                    self._hung[key] = overran[0]
                self._record(gpu, function, "timeout")
                raise NvmlTimeout(function, gpu, timeout)
        if slot.error is not None:
            error = self._translate(function, gpu, slot.error)
            if isinstance(error, NvmlGpuLost):
                self._record(gpu, function, "gpu_lost")
            elif isinstance(error, NvmlTimeout):
                self._record(gpu, function, "timeout")
            elif isinstance(error, NvmlNotSupported):
                self._record(gpu, function, "")  # the GPU answered
            raise error
        self._record(gpu, function, "")
        return slot.value  # type: ignore[no-any-return]

    # -- sweeps: one worker for a check's pass over the GPUs

    def sweep(self, plan: Sweep[R]) -> R:
        """Run `plan` on one worker: its calls run there one after another, each under its
        deadline (healthd.deadlines); this thread waits for the end of the sweep, waking
        only when the call in progress reaches its deadline. A call that overran is handled
        as `_run` handles it (NvmlTimeout reading, remembered as hung, streak counted) and
        the rest of the plan goes on on a new worker. A sweep inside a sweep runs in place."""
        if getattr(self._local, "on", None) is not None:
            return run_sweep(plan)
        run = _SweepRun(plan, Timekeeper(self._workers))
        with run.keeper.cond:
            run.keeper.start(partial(self._drive, run, _FIRST), "nvml-sweep")
            for _, overran in run.keeper.overran():
                timed_out = self._timed_out(overran)
                run.keeper.start(partial(self._drive, run, timed_out), "nvml-sweep")
        if run.error is not None:
            raise run.error
        return run.result  # type: ignore[no-any-return]

    def _timed_out(self, overran: Item[int | None]) -> Reading[Any]:
        """A sweep's call that overran, left to its worker: remembered as hung, counted."""
        function, gpu = overran.name, overran.tag
        with self._lock:
            self._hung[(function, gpu)] = overran
        self._record(gpu, function, "timeout")
        error = NvmlTimeout(function, gpu, overran.timeout)
        return Reading(None, problem_of(error), str(error))

    def _drive(self, run: _SweepRun, send: Any, lane: Lane[int | None]) -> None:
        """A sweep's lane: advance the plan (sending `send`, the reading of the call the
        previous lane was abandoned in) until it ends or this lane is abandoned."""
        self._local.on = (run, lane)
        result: Any = None
        error: BaseException | None = None
        try:
            call = next(run.plan) if send is _FIRST else run.plan.send(send)
            while True:
                call = run.plan.send(measure(call))
        except StopIteration as stop:
            result = stop.value
        except Abandoned:
            raise
        except BaseException as exc:  # a bug in the plan or a call: the caller raises it
            error = exc
        finally:
            self._local.on = None
        with run.keeper.cond:
            if not lane.abandoned:
                run.result, run.error = result, error

    def _device(self, function: str, index: int, call: Callable[[ModuleType, Any], T]) -> T:
        """Look the handle up and make the call in one worker thread, under one deadline."""
        nv = self._ensure_open()

        def both() -> T:
            return call(nv, nv.nvmlDeviceGetHandleByIndex(index))

        return self._run(function, index, both, self.call_timeout)

    def _node(self, function: str, call: Callable[[ModuleType], T]) -> T:
        nv = self._ensure_open()
        return self._run(function, None, lambda: call(nv), self.call_timeout)

    def call_health(self) -> dict[int, CallHealth]:
        with self._lock:
            return {
                gpu: CallHealth(s.timeouts, s.lost, s.last_problem, s.last_function, s.since)
                for gpu, s in self._streaks.items()
            }

    # -- direct calls (the event listener owns its thread)

    @contextmanager
    def _direct(self, function: str, gpu: int | None) -> Iterator[ModuleType]:
        nv = self._ensure_open()
        try:
            yield nv
        except nv.NVMLError as exc:
            raise self._translate(function, gpu, exc) from exc

"""`PynvmlClient.sweep`: a check's pass over the GPUs on one worker thread, with every
per-call rule of the single-call path (deadline, NvmlTimeout for the call that overran,
still-hung fast fail, streaks, error translation, re-init after UNINITIALIZED).

Unit tests drive the client with a fake pynvml module whose calls answer as the test says
(a hang waits on an Event the test sets); the last test runs the real pynvml against the
NVML injection library with a `hang.` rule.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Generator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.lab.nvml.build import build_library
from cli.lab.scenario import default_scenario, inject, write_scenario
from healthd.checks.base import CheckContext
from healthd.checks.gpu_common import (
    GpuContext,
    GpuSamples,
    JobState,
    StaticJobState,
    sample_gpus,
)
from healthd.checks.gpu_processes import GpuProcessesCheck, GpuProcessesConfig
from healthd.nvml_client import (
    CallHealth,
    Problem,
    PynvmlClient,
    Reading,
    Sweep,
    Thermal,
    run_sweep,
)
from tests.conftest import poll
from tests.fakes import FakeNvml, NVMLError, NVMLError_NotSupported

# --- a fake pynvml ------------------------------------------------------------------------


class _Pci:
    def __init__(self, index: int) -> None:
        self.busId = f"00000000:{index:02x}:00.0".encode()


HANGS = ("hang", "hang2")  # released at the end of this round, of the next one


class TemperatureNvml(FakeNvml):
    """Answers each temperature read as `answers[gpu]` says: ok, not_supported, lost,
    uninit (NVML_ERROR_UNINITIALIZED), hang / hang2 (wait for `release[gpu]`), bug."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: int) -> None:
        super().__init__(gpus)
        self.answers: dict[int, str] = {}
        self.release: dict[int, threading.Event] = {}
        self.in_call: set[int] = set()  # GPUs with a temperature read under way
        self.temperature_calls = 0
        self._lock = threading.Lock()

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}"

    def nvmlDeviceGetSerial(self, handle: int) -> str:
        return f"S{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H100"

    def nvmlDeviceGetPciInfo(self, handle: int) -> _Pci:
        return _Pci(handle)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return 0

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        answer = self.answers.get(handle, "ok")
        with self._lock:
            self.temperature_calls += 1
            self.in_call.add(handle)
        try:
            if answer in HANGS:
                assert self.release.setdefault(handle, threading.Event()).wait(30)
            elif answer == "not_supported":
                raise NVMLError_NotSupported(3)
            elif answer == "lost":
                raise NVMLError(15)
            elif answer == "uninit":
                raise NVMLError(1)
            elif answer == "bug":
                raise ZeroDivisionError("a bug in a call")
            return 40 + handle
        finally:
            with self._lock:
                self.in_call.discard(handle)


def client_for(
    nv: TemperatureNvml, timeout: float = 0.2, kind: type[PynvmlClient] = PynvmlClient
) -> PynvmlClient:
    loader: Any = lambda: nv  # noqa: E731 (a module, as far as the client knows)
    return kind(call_timeout=timeout, loader=loader, clock=lambda: 7.0).open()


def thermals(client: PynvmlClient) -> GpuSamples[Thermal]:
    return sample_gpus(client, client.thermal)


def problems(samples: GpuSamples[Any]) -> list[Problem | None]:
    return [s.reading.problem for s in samples.samples]


def nvml_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("nvml"))


def settled(client: PynvmlClient) -> int:
    """The NVML threads once a worker waits idle in the pool (the last sweep's worker goes
    back after its caller woke): a sweep then starts no thread unless it must."""
    poll("an idle worker", lambda: client._workers.idle() >= 1)
    return nvml_threads()


# --- unit tests -----------------------------------------------------------------------------


def test_a_sweep_is_one_worker_hop_with_every_reading() -> None:
    nv = TemperatureNvml(8)
    nv.answers = {2: "not_supported", 5: "lost"}
    client = client_for(nv)
    hops: list[str] = []
    start = client._workers.start

    def counting(call: Callable[[], object], name: str = "") -> Any:
        hops.append(name)
        return start(call, name)

    client._workers.start = counting  # type: ignore[method-assign]
    samples = thermals(client)
    assert hops == ["nvml-sweep"]
    assert samples.count == Reading(8)
    lost, unsupported = Problem.GPU_LOST, Problem.NOT_SUPPORTED
    assert problems(samples) == [None, None, unsupported, None, None, lost, None, None]
    temperatures = [s.reading.value.temperature_c for s in samples.samples if s.reading.value]
    assert temperatures == [40, 41, 43, 44, 46, 47]
    assert [s.info.uuid if s.info else None for s in samples.samples] == [
        f"GPU-{i}" for i in range(8)
    ]
    health = client.call_health()
    assert health[5] == CallHealth(0, 1, "gpu_lost", "nvmlDeviceGetTemperature", 7.0)
    assert health[2] == CallHealth()  # NOT_SUPPORTED: the GPU answered
    # a single call outside a sweep still takes its own hop
    assert client.thermal(0).temperature_c == 40
    assert hops == ["nvml-sweep", "nvml-nvmlDeviceGetTemperature"]


def test_a_hang_on_gpu_3_of_8_times_out_that_gpu_only_then_fails_fast_then_recovers() -> None:
    nv = TemperatureNvml(8)
    nv.answers = {3: "hang"}
    client = client_for(nv)
    first = thermals(client)
    assert [s.index for s in first.samples if s.reading.ok] == [0, 1, 2, 4, 5, 6, 7]
    three = first.samples[3].reading
    assert three.problem is Problem.TIMEOUT and "no answer within 0.2s" in three.detail
    assert client.call_health()[3].consecutive_timeouts == 1
    # the next sweep: GPU 3 fails fast (still hung), no call reaches NVML, no thread more
    threads, calls = settled(client), nv.temperature_calls
    second = thermals(client)
    assert [s.index for s in second.samples if s.reading.ok] == [0, 1, 2, 4, 5, 6, 7]
    assert "still hung" in second.samples[3].reading.detail
    assert (nvml_threads(), nv.temperature_calls) == (threads, calls + 7)
    assert client.call_health()[3].consecutive_timeouts == 2
    # the hang ends: the hung worker's late answer is dropped, the next sweep reads GPU 3
    nv.answers = {}
    nv.release[3].set()
    poll("the hung call to return", lambda: not nv.in_call)
    assert client.call_health()[3].consecutive_timeouts == 2  # the late answer counts nothing
    third = thermals(client)
    assert all(s.reading.ok for s in third.samples)
    assert client.call_health()[3] == CallHealth()
    poll("the abandoned worker to exit", lambda: nvml_threads() <= threads - 1)


def test_two_hangs_in_one_sweep_each_get_their_own_deadline_and_worker() -> None:
    nv = TemperatureNvml(4)
    nv.answers = {0: "hang", 3: "hang"}
    client = client_for(nv, timeout=0.1)
    samples = thermals(client)
    assert problems(samples) == [Problem.TIMEOUT, None, None, Problem.TIMEOUT]
    assert {g: h.consecutive_timeouts for g, h in client.call_health().items()} == {
        0: 1,
        1: 0,
        2: 0,
        3: 1,
    }
    for event in nv.release.values():
        event.set()


def test_an_exception_in_a_call_or_the_plan_is_raised_and_the_next_sweep_runs() -> None:
    nv = TemperatureNvml(4)
    nv.answers = {1: "bug"}
    client = client_for(nv)
    with pytest.raises(ZeroDivisionError, match="a bug in a call"):
        thermals(client)  # as run_sweep raises it: the runner reports check.error

    def broken() -> Sweep[int]:
        yield client.device_count
        raise KeyError("a bug in the plan")

    with pytest.raises(KeyError, match="a bug in the plan"):
        client.sweep(broken())
    nv.answers = {}
    threads = settled(client)
    assert all(s.reading.ok for s in thermals(client).samples)
    assert nvml_threads() == threads  # the workers went back to the pool


def test_uninitialized_reinitialises_inside_a_sweep() -> None:
    nv = TemperatureNvml(3)
    nv.answers = {1: "uninit"}
    client = client_for(nv)
    samples = thermals(client)
    assert problems(samples) == [None, Problem.UNAVAILABLE, None]
    assert nv.inits == 2  # GPU 2's call opened NVML again first


def test_a_sweep_started_inside_a_sweep_runs_in_place() -> None:
    nv = TemperatureNvml(2)
    client = client_for(nv)

    def outer() -> Generator[Callable[[], Any], Reading[Any], list[Any]]:
        inner = yield partial(thermals, client)
        count = yield client.device_count
        return [inner, count]

    inner, count = client.sweep(outer())
    assert count == Reading(2) and all(s.reading.ok for s in inner.value.samples)


# --- the same answers, swept or call by call ------------------------------------------------

ANSWERS = st.sampled_from(["ok", "ok", "not_supported", "lost", "uninit", "hang", "hang2"])


class CallByCall(PynvmlClient):
    """The reference: every call its own hop, as before sweeps."""

    def sweep(self, plan: Sweep[Any]) -> Any:
        return run_sweep(plan)


def _end_round(
    client: PynvmlClient, nv: TemperatureNvml, round_no: int, hangs: dict[int, int]
) -> None:
    """Release the hangs due at the end of this round; wait until the client saw their
    calls return (so both clients start the next round in the same state)."""
    for gpu, until in list(hangs.items()):
        if until <= round_no:
            nv.release.setdefault(gpu, threading.Event()).set()
            del hangs[gpu]

    def returned() -> bool:
        live = [h for (_, gpu), h in client._hung.items() if gpu not in hangs]
        return not (nv.in_call - set(hangs)) and all(h.returned() for h in live)

    poll("released calls to return", returned)
    for gpu in hangs:
        nv.release.setdefault(gpu, threading.Event())
    nv.release = {g: e for g, e in nv.release.items() if g in hangs}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(ANSWERS, min_size=3, max_size=3), min_size=1, max_size=3))
def test_swept_and_call_by_call_give_the_same_readings_and_streaks(
    rounds: list[list[str]],
) -> None:
    results = []
    for swept in (False, True):
        nv = TemperatureNvml(3)
        client = client_for(nv, timeout=0.1, kind=PynvmlClient if swept else CallByCall)
        hangs: dict[int, int] = {}
        seen = []
        for round_no, answers in enumerate(rounds):
            for gpu, answer in enumerate(answers):
                if answer in HANGS and gpu not in hangs:
                    hangs[gpu] = round_no + HANGS.index(answer)
            nv.answers = dict(enumerate(answers))
            samples = thermals(client)
            readings = [samples.count, *(s.reading for s in samples.samples)]
            seen.append((readings, client.call_health(), nv.inits))
            _end_round(client, nv, round_no, hangs)
        _end_round(client, nv, len(rounds), hangs)
        results.append(seen)
    assert results[0] == results[1]


# --- the real pynvml against the injection library ------------------------------------------


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_library(tmp_path_factory.mktemp("nvml"))
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # before pynvml's first nvmlInit
    return path


@pytest.fixture
def injected(
    nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[PynvmlClient, Path]]:
    path = tmp_path / "scenario.txt"
    write_scenario(path, default_scenario("sweep-test", 8))
    monkeypatch.setenv("NVML_INJECT_SCENARIO", str(path))
    client = PynvmlClient(call_timeout=0.3).open()
    try:
        yield client, path
    finally:
        write_scenario(path, default_scenario("sweep-test", 8))  # ends any injected hang
        client.close()


def test_a_forever_hang_through_pynvml_is_swept_around_and_recovers(
    injected: tuple[PynvmlClient, Path],
) -> None:
    client, path = injected
    hang = "hang.nvmlDeviceGetTemperature=forever"
    write_scenario(path, inject(default_scenario("sweep-test", 8), 3, hang))
    first = thermals(client)
    assert [s.index for s in first.samples if s.reading.ok] == [0, 1, 2, 4, 5, 6, 7]
    assert "no answer within 0.3s" in first.samples[3].reading.detail
    threads = settled(client)
    second = thermals(client)
    assert "still hung" in second.samples[3].reading.detail and nvml_threads() == threads
    assert client.call_health()[3].consecutive_timeouts == 2
    write_scenario(path, default_scenario("sweep-test", 8))
    poll("GPU 3 to answer again", lambda: all(s.reading.ok for s in thermals(client).samples))
    assert client.call_health()[3] == CallHealth()


class _Process:
    def __init__(self, pid: int) -> None:
        self.pid, self.usedGpuMemory = pid, 512 << 20


class ProcessesNvml(TemperatureNvml):
    """Processes and memory too: GPU 1's memory read hangs, GPU 2's processes are lost."""

    nvmlMemory_v2 = 2

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Process]:
        if handle == 2:
            raise NVMLError(15)
        return [_Process(100 + handle)]

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int = 1) -> Any:
        if handle == 1:
            assert self.release.setdefault(handle, threading.Event()).wait(30)

        class Memory:
            total, used = 80 << 30, 1 << 30

        return Memory()


def test_gpu_processes_keeps_the_processes_when_only_the_memory_read_hangs(
    tmp_path: Path,
) -> None:
    """The check's sweep yields processes, then memory: a timeout ends the memory read only,
    as when `_usage` caught the memory call's NvmlError."""
    nv = ProcessesNvml(3)
    client = client_for(nv, timeout=0.1)
    jobs = StaticJobState(JobState(running=False, idle_seconds=600))
    ctx = CheckContext.for_root(tmp_path, nvml=GpuContext(client, jobs=jobs))
    try:
        observation = GpuProcessesCheck().gather(ctx, GpuProcessesConfig())
    finally:
        nv.release[1].set()
    usage = [s.reading.value for s in observation.samples.samples]
    assert usage[0] is not None and usage[0].memory is not None
    assert usage[1] is not None and usage[1].memory is None
    assert [p.pid for p in usage[1].processes] == [101]
    assert observation.samples.samples[2].reading.problem is Problem.GPU_LOST
    assert client.call_health()[1].last_function == "nvmlDeviceGetMemoryInfo"

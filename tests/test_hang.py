"""Hangs (issue 14, part 1): the job's progress heartbeat (writer, file format, the root
daemon's reader), the pure hang evaluation, the watch that hands a hung job over, and the
ladder's answer through the decision core. Fakes and a fake clock only; the lab test is
tests/test_hang_lab.py."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import statistics
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.ckpt import ckpt
from healthd import progress as hb_reader
from healthd.hang import (
    HangSettings,
    Progress,
    Sample,
    State,
    evaluate,
    observe,
    pace,
    slower_than_others,
    step_times,
)
from healthd.hang import Pace as HangPace
from healthd.hang_watch import IDLE_POLLS, Hang, HangWatch, WatchSettings
from healthd.nvml_client import GpuProcess, Utilization
from healthd.progress import BeatRead, prepare_dir, read_beat
from medic_core import heartbeat, proc
from medic_core.heartbeat import Beat
from medic_core.slurm import JobInfo
from slurm_hooks.checkpoint import CheckpointError
from slurm_hooks.checkpoint import Progress as Writer
from tests.conftest import poll
from tests.fakes import FakeClock, FakeSlurm

S = HangSettings(factor=3.0, floor=2.0, window=5, min_steps=3)
NODE = "n1"


def beat(step: int, at: float, seq: int = 2) -> Beat:
    return Beat(seq=seq, step=step, ns=int(at * 1e9), pid=1)


def steady(n: int, every: float, start: float = 100.0) -> Progress:
    """A job that reported steps 0..n-1, one every `every` s, each seen at once."""
    p = Progress("7")
    for i in range(n):
        t = start + i * every
        p = observe(p, beat(i, t), t, S)
    return p


# ---- the pure evaluation ---------------------------------------------------------------


def test_a_job_that_never_reported_is_not_judged() -> None:
    p = observe(Progress("7"), None, 1000.0, S)
    assert evaluate(p, 10_000.0, S).state is State.NO_HEARTBEAT
    # A run that opened its heartbeat but reported no step yet (ns 0): the same.
    p = observe(p, Beat(seq=2, step=0, ns=0, pid=1), 1000.0, S)
    assert evaluate(p, 10_000.0, S).state is State.NO_HEARTBEAT


def test_a_job_that_just_started_is_not_judged_however_long_it_stalls() -> None:
    p = steady(3, 0.5)  # two step times, min_steps is 3
    verdict = evaluate(p, 10_000.0, S)
    assert verdict.state is State.STARTING and verdict.steps_timed == 2


def test_median_times_k_with_a_floor() -> None:
    p = steady(6, 1.0)  # 1 s per step: threshold max(2, 3 x 1) = 3 s
    last = p.samples[-1].seen
    assert evaluate(p, last + 2.9, S).state is State.ADVANCING
    v = evaluate(p, last + 3.1, S)
    assert v.hung and v.threshold == 3.0 and v.median == 1.0 and v.step == 5
    fast = steady(6, 0.1)  # 3 x 0.1 s = 0.3 s, below the 2 s floor
    last = fast.samples[-1].seen
    assert evaluate(fast, last + 1.9, S).state is State.ADVANCING
    assert evaluate(fast, last + 2.1, S).hung


def test_the_median_ignores_one_slow_step_and_follows_the_recent_window() -> None:
    p = steady(6, 1.0)
    t = p.samples[-1].seen + 50.0  # one checkpoint step of 50 s
    p = observe(p, beat(6, t), t, S)
    assert evaluate(p, t + 3.1, S).median == 1.0
    # Window 5: after five 10 s steps the median is 10 s.
    for i in range(7, 12):
        t += 10.0
        p = observe(p, beat(i, t), t, S)
    assert evaluate(p, t, S).median == 10.0
    assert len(p.samples) == S.window + 1


def test_a_counter_going_backwards_starts_over_and_is_no_hang() -> None:
    p = steady(8, 1.0)
    t = p.samples[-1].seen + 1.0
    p = observe(p, beat(2, t), t, S)  # a new run resumed from step 2
    assert p.restarts == 1 and len(p.samples) == 1
    assert evaluate(p, t + 1000.0, S).state is State.STARTING


def test_stall_is_timed_by_the_daemon_not_by_the_jobs_clock() -> None:
    p = steady(6, 1.0)
    seen = p.samples[-1].seen
    # The same step read again much later changes nothing: the stall runs from `seen`.
    again = observe(p, beat(5, 99999.0), seen + 10.0, S)
    assert again == p and evaluate(again, seen + 10.0, S).stalled == 10.0
    # A job clock that runs backwards gives no step time (the pair is skipped).
    assert step_times((Sample(1, 5.0, 0.0), Sample(2, 4.0, 1.0))) == []


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.floats(0.001, 1000.0), min_size=0, max_size=40),
    jumps=st.lists(st.integers(1, 50), min_size=40, max_size=40),
    stall=st.floats(0.0, 1e6),
    factor=st.floats(1.5, 100.0),
    floor=st.floats(1.0, 1000.0),
    window=st.integers(1, 30),
    min_steps=st.integers(1, 10),
)
def test_property_hung_exactly_when_stalled_past_max_floor_k_median(
    gaps: list[float],
    jumps: list[int],
    stall: float,
    factor: float,
    floor: float,
    window: int,
    min_steps: int,
) -> None:
    cfg = HangSettings(factor=factor, floor=floor, window=window, min_steps=min_steps)
    p, t, step = Progress("1"), 1.0, 0
    per_step: list[float] = []
    p = observe(p, beat(step, t), t, cfg)
    for gap, jump in zip(gaps, jumps, strict=False):
        t += gap
        step += jump
        p = observe(p, beat(step, t), t, cfg)
        per_step.append(gap / jump)
    v = evaluate(p, t + stall, cfg)
    assert len(p.samples) <= max(window, min_steps) + 1
    if len(per_step) < min_steps:
        assert v.state is State.STARTING and not v.hung
        return
    median = statistics.median(per_step[-window:])
    assert v.median == pytest.approx(median, rel=1e-5)
    threshold = max(floor, factor * median)
    assert v.threshold is not None and v.threshold >= floor
    if stall > threshold * (1 + 1e-4):
        assert v.hung
    elif stall < threshold * (1 - 1e-4):
        assert not v.hung


# ---- the writer and the file -----------------------------------------------------------


def env_for(directory: Path, job: str = "42") -> dict[str, str]:
    return {"SLURM_JOB_ID": job, "SLURMD_NODENAME": NODE, heartbeat.DIR_ENV: str(directory)}


@pytest.fixture
def hb_dir(tmp_path: Path) -> Path:
    d = tmp_path / "progress"
    assert prepare_dir(d) == ""
    return d


def test_writer_reports_steps_the_reader_reads(hb_dir: Path) -> None:
    w = Writer(env=env_for(hb_dir))
    assert w.active and w.path == hb_dir / "42.n1"
    assert oct(hb_dir.stat().st_mode & 0o7777) == oct(heartbeat.DIR_MODE)
    first = read_beat(hb_dir, "42", NODE)
    assert first.beat is not None and first.beat.ns == 0  # opened, no step yet
    w.step(7)
    got = read_beat(hb_dir, "42", NODE)
    assert got.problem == "" and got.owner == os.geteuid()
    assert got.beat is not None and (got.beat.step, got.beat.pid) == (7, os.getpid())
    assert got.beat.seq % 2 == 0 and got.beat.ns > 0
    with pytest.raises(CheckpointError, match="expected an integer >= 0"):
        w.step(-1)
    after = read_beat(hb_dir, "42", NODE).beat
    assert after is not None and after.step == 7  # a refused step leaves the record whole
    # A second run of the job on this node starts with no step reported, seq still rising.
    w2 = Writer(env=env_for(hb_dir))
    again = read_beat(hb_dir, "42", NODE).beat
    assert again is not None and again.ns == 0 and again.seq > after.seq
    w.close()
    w2.close()


def test_writer_reports_the_busy_time_when_given(hb_dir: Path) -> None:
    w = Writer(env=env_for(hb_dir))
    w.step(3, busy=0.25)
    got = read_beat(hb_dir, "42", NODE).beat
    assert got is not None and (got.step, got.busy_ns) == (3, 250_000_000)
    for bad in (-1.0, float("nan"), 1e12):
        with pytest.raises(CheckpointError, match="busy"):
            w.step(4, busy=bad)
    after = read_beat(hb_dir, "42", NODE).beat
    assert after is not None and after.step == 3 and after.seq % 2 == 0
    w.close()


def test_writer_off_outside_a_job_or_without_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = Writer(env={})
    assert not w.active and "SLURM_JOB_ID" in w.why
    w.step(1)  # a no-op, never an error
    w = Writer(env=env_for(tmp_path / "missing"))
    assert not w.active and "No such file" in w.why
    assert "progress heartbeat off" in capsys.readouterr().err
    w.step(1)


def test_writer_refuses_a_symlink(hb_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x")
    (hb_dir / "42.n1").symlink_to(target)
    w = Writer(env=env_for(hb_dir))
    assert not w.active and target.read_bytes() == b"x"


def test_ckpt_progress_cli(hb_dir: Path) -> None:
    result = CliRunner().invoke(ckpt, ["progress", "12"], env=env_for(hb_dir))
    assert result.exit_code == 0, result.output
    got = read_beat(hb_dir, "42", NODE).beat
    assert got is not None and got.step == 12
    result = CliRunner().invoke(ckpt, ["progress", "3"], env={"SLURM_JOB_ID": ""})
    assert result.exit_code == 0 and "not reported" in result.output


def test_file_names_never_leave_the_directory() -> None:
    assert heartbeat.file_name("123", "gpu-01.rack2") == "123.gpu-01.rack2"
    for job, node in [("1/2", "n"), ("..", "n"), ("1", "../x"), ("1", ".n"), ("", "n")]:
        with pytest.raises(ValueError):
            heartbeat.file_name(job, node)


# ---- the root daemon's reader, fuzzed --------------------------------------------------


def put(hb_dir: Path, data: bytes, name: str = "42.n1") -> Path:
    path = hb_dir / name
    path.write_bytes(data)
    return path


@settings(max_examples=400, deadline=None)
@given(data=st.binary(min_size=0, max_size=200))
def test_reader_never_raises_on_any_bytes(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    d = tmp_path_factory.mktemp("fuzz") / "p"
    prepare_dir(d)
    put(d, data)
    got = read_beat(d, "42", NODE)
    assert (got.beat is None) == bool(got.problem)
    if len(data) != heartbeat.SIZE:
        assert got.beat is None and "bytes" in got.problem


@settings(max_examples=300, deadline=None)
@given(
    seq=st.integers(0, 2**64 - 1),
    step=st.integers(0, 2**64 - 1),
    ns=st.integers(0, 2**64 - 1),
    pid=st.integers(0, 2**32 - 1),
    magic=st.sampled_from([heartbeat.MAGIC, b"MEDICHB\x02", b"\0" * 8]),
)
def test_reader_on_any_record(
    tmp_path_factory: pytest.TempPathFactory, seq: int, step: int, ns: int, pid: int, magic: bytes
) -> None:
    d = tmp_path_factory.mktemp("rec") / "p"
    prepare_dir(d)
    put(d, heartbeat.RECORD.pack(magic, seq, step, ns, pid))
    got = read_beat(d, "42", NODE)
    whole = magic == heartbeat.MAGIC and seq % 2 == 0 and step < 2**63 and ns < 2**63
    assert (got.beat is not None) == whole
    if got.beat is not None:
        assert (got.beat.step, got.beat.ns, got.beat.pid) == (step, ns, pid)


def test_reader_short_file_symlink_fifo_hardlink_and_directory(
    hb_dir: Path, tmp_path: Path
) -> None:
    good = heartbeat.RECORD.pack(heartbeat.MAGIC, 2, 5, 10, 1)
    put(hb_dir, good[:30])
    assert "30 bytes" in read_beat(hb_dir, "42", NODE).problem
    (hb_dir / "42.n1").unlink()
    secret = tmp_path / "secret"
    secret.write_bytes(good)
    (hb_dir / "42.n1").symlink_to(secret)
    got = read_beat(hb_dir, "42", NODE)
    assert got.beat is None and got.problem  # ELOOP: never followed
    (hb_dir / "42.n1").unlink()
    os.mkfifo(hb_dir / "42.n1")  # never blocks the daemon
    assert "not a regular file" in read_beat(hb_dir, "42", NODE).problem
    (hb_dir / "42.n1").unlink()
    os.link(secret, hb_dir / "42.n1")
    assert "2 links" in read_beat(hb_dir, "42", NODE).problem
    (hb_dir / "42.n1").unlink()
    (hb_dir / "42.n1").mkdir()
    assert read_beat(hb_dir, "42", NODE).beat is None
    assert read_beat(hb_dir, "43", NODE) == BeatRead()  # never reported
    assert "expected digits" in read_beat(hb_dir, "../x", NODE).problem


def test_prepare_dir_says_why_it_cannot_create_never_raises(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert "cannot create it" in prepare_dir(tmp_path / "file" / "progress")
    w = HangWatch(NODE, lambda: WatchSettings(directory=tmp_path / "file" / "p"),
                  lambda: ("1",), lambda h: True)  # fmt: skip
    assert w.look() == []  # no heartbeat there: nothing watched, and no exception


def test_reader_refuses_a_directory_that_is_a_symlink_or_not_roots(tmp_path: Path) -> None:
    real = tmp_path / "real"
    assert prepare_dir(real) == ""
    link = tmp_path / "link"
    link.symlink_to(real)
    assert read_beat(link, "42", NODE).problem
    assert "symlink" in prepare_dir(link)
    if os.geteuid() == 0:
        os.chown(real, 65534, 65534)
        assert "not owned" in read_beat(real, "42", NODE).problem
        assert "owned by uid 65534" in prepare_dir(real)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_wrong_owner_is_reported_and_the_answer_ignores_it(hb_dir: Path) -> None:
    path = put(hb_dir, heartbeat.RECORD.pack(heartbeat.MAGIC, 2, 5, 10, 1))
    os.chown(path, 65534, 65534)
    got = read_beat(hb_dir, "42", NODE)
    assert got.owner == 65534 and got.beat is not None  # judged later against the job's user


def test_reader_retries_a_torn_record(hb_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put(hb_dir, heartbeat.RECORD.pack(heartbeat.MAGIC, 4, 5, 10, 1))
    torn = heartbeat.RECORD.pack(heartbeat.MAGIC, 5, 6, 11, 1)
    whole = heartbeat.RECORD.pack(heartbeat.MAGIC, 6, 6, 11, 1)
    reads = iter([torn, whole, whole])
    monkeypatch.setattr(hb_reader.os, "pread", lambda fd, n, off: next(reads))
    got = read_beat(hb_dir, "42", NODE)
    assert got.beat is not None and got.beat.seq == 6


def test_evidence_of_a_real_process_and_its_children(tmp_path: Path) -> None:
    child = proc.spawn(
        [sys.executable, "-c", "import time; time.sleep(30)"], log_path=tmp_path / "log"
    )
    try:
        # Until the child has exec'd, its command line is its parent's (or empty).
        poll(
            "the child's exec",
            lambda: b"time.sleep" in Path(f"/proc/{child}/cmdline").read_bytes(),
            timeout=10,
        )
        pids = hb_reader.job_processes(Path("/proc"), os.getpid(), os.geteuid())
        assert pids[0] == os.getpid() and child in pids
        assert hb_reader.job_processes(Path("/proc"), os.getpid(), os.geteuid() + 1) == []
        ev = hb_reader.process_evidence(Path("/proc"), [child], py_spy_timeout=2)
        [p] = ev.processes
        assert p.state in "SR" and "time.sleep" in p.command
        assert p.threads and {"tid", "state", "wchan", "stack"} <= set(p.threads[0])
        gone = hb_reader.process_evidence(Path("/proc"), [2**22 + 7])
        assert gone.processes[0].problem == "gone or unreadable"
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed")
def test_evidence_has_py_spys_dump_when_it_is_installed(tmp_path: Path) -> None:
    blocked = "import os; os.read(os.pipe()[0], 1)"
    child = proc.spawn([sys.executable, "-c", blocked], log_path=tmp_path / "log")
    try:

        def dumped() -> bool:
            ev = hb_reader.process_evidence(Path("/proc"), [child], py_spy_timeout=5)
            return "<module>" in ev.processes[0].py_spy

        poll("py-spy to see the blocked interpreter", dumped, timeout=20)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


class FakeGpus:
    """Two GPUs: 0 runs the job's process at 100 %, 1 does not answer."""

    def __init__(self, job_pid: int) -> None:
        self.job_pid = job_pid

    def device_count(self) -> int:
        return 2

    def utilization(self, index: int) -> Utilization:
        if index == 1:
            raise TimeoutError("nvmlDeviceGetUtilizationRates: no answer after 3.0s")
        return Utilization(100, 7)

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        return (GpuProcess(self.job_pid, 1000), GpuProcess(4242, 10))


def test_gpu_evidence_names_the_jobs_gpus_and_survives_a_hung_call() -> None:
    found = hb_reader.gpu_evidence(FakeGpus(77), [77, 78])
    assert found == (
        {"index": 0, "gpu_pct": 100, "memory_pct": 7, "job_pids": [77]},
        {"index": 1, "problem": "nvmlDeviceGetUtilizationRates: no answer after 3.0s"},
    )

    class NoNvml(FakeGpus):
        def device_count(self) -> int:
            raise RuntimeError("NVML is held closed for a repair")

    assert hb_reader.gpu_evidence(NoNvml(1), [1])[0]["problem"].startswith("NVML:")


# ---- the watch, with fakes and a fake clock --------------------------------------------


class FakeJob:
    """A job's heartbeat as the reader would return it."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.at = 0.0

    def read(self, clock: FakeClock) -> BeatRead:
        if self.step is None:
            return BeatRead()
        return BeatRead(beat(self.step, self.at), owner=os.geteuid())


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[tuple[HangWatch, FakeClock, dict[str, FakeJob], list[Hang]]]:
    clock = FakeClock()
    jobs: dict[str, FakeJob] = {"7": FakeJob(), "8": FakeJob()}
    hangs: list[Hang] = []
    w = HangWatch(
        NODE,
        lambda: WatchSettings(hang=S, directory=tmp_path),
        lambda: tuple(jobs),
        lambda h: hangs.append(h) or True,
        proc_root=tmp_path / "no-proc",
        clock=clock,
        read=lambda d, job, node: jobs[job].read(clock),
    )
    yield w, clock, jobs, hangs


def advance(jobs: dict[str, FakeJob], job: str, clock: FakeClock, every: float = 1.0) -> None:
    j = jobs[job]
    j.step = 0 if j.step is None else j.step + 1
    j.at = clock.now


def test_watch_hands_a_hung_job_over_once_per_stall(watch: Any) -> None:
    w, clock, jobs, hangs = watch
    for _ in range(6):
        advance(jobs, "7", clock)
        w.look()
        clock.now += 1.0
    clock.now += 2.5  # 3.5 s since step 5 was seen: past 3 x 1 s
    verdicts = {v.job_id: v for v in w.look()}
    assert verdicts["7"].hung and "8" not in verdicts  # 8 never reported: not watched
    assert [h.verdict.job_id for h in hangs] == ["7"]
    assert hangs[0].evidence.problems == (f"pid 1 not found under {w.proc_root} as uid 0",)
    clock.now += 10.0
    w.look()
    assert len(hangs) == 1  # answered: not again for the same stall
    advance(jobs, "7", clock)  # it moves again: watched afresh
    w.look()
    assert w._answered == {}


def test_watch_collects_the_writers_stacks_from_proc(tmp_path: Path) -> None:
    clock, hangs = FakeClock(), []
    me = os.getpid()
    stopped: list[float] = []

    def read(d: Path, job: str, node: str) -> BeatRead:
        at = stopped[0] if stopped else clock.now  # the job stops moving once stopped
        return BeatRead(Beat(2, int(at), int(at * 1e9), me), os.geteuid())

    w = HangWatch(NODE, lambda: WatchSettings(hang=S, directory=tmp_path), lambda: ("7",),
                  lambda h: hangs.append(h) or True, clock=clock, read=read,
                  gpus=FakeGpus(me))  # fmt: skip
    for _ in range(6):
        w.look()
        clock.now += 1.0
    stopped.append(clock.now - 1.0)
    clock.now += 5.0
    w.look()
    [hang] = hangs
    assert hang.pid == me and hang.evidence.processes[0].pid == me
    assert hang.evidence.processes[0].threads[0]["tid"] == str(me)
    assert hang.evidence.gpus[0]["job_pids"] == [me]
    assert hang.evidence.to_json()["gpus"][0]["gpu_pct"] == 100


def test_watch_tries_again_when_slurm_failed(watch: Any) -> None:
    w, clock, jobs, _ = watch
    calls: list[Hang] = []
    w.respond = lambda h: calls.append(h) and False
    for _ in range(6):
        advance(jobs, "7", clock)
        w.look()
        clock.now += 1.0
    clock.now += 3.0
    w.look()
    clock.now += 1.0
    w.look()
    assert len(calls) == 1
    clock.now += 5.0
    w.look()
    assert len(calls) == 2


def test_watch_forgets_a_job_that_left_and_removes_its_file(tmp_path: Path) -> None:
    d = tmp_path / "p"
    prepare_dir(d)
    put(d, heartbeat.RECORD.pack(heartbeat.MAGIC, 2, 5, 10, 1))
    ids: list[str] = ["42"]
    current = WatchSettings(hang=S, directory=d)
    w = HangWatch(NODE, lambda: current, lambda: tuple(ids), lambda h: True, clock=FakeClock())
    w.look()
    assert "42" in w.progress
    ids.clear()
    w.look()
    assert w.progress == {} and not (d / "42.n1").exists()
    assert w.look() == []
    w.job_ids = lambda: None  # spool unreadable: nothing judged, nothing forgotten
    assert w.look() == []
    # A reload that turns it off: nothing watched; a new directory is prepared when named.
    ids.append("42")
    w.job_ids = lambda: tuple(ids)
    current = WatchSettings(enabled=False, hang=S, directory=d)
    assert w.look() == [] and w.progress == {}
    current = WatchSettings(hang=S, directory=tmp_path / "moved")
    w.look()
    assert oct((tmp_path / "moved").stat().st_mode & 0o7777) == oct(heartbeat.DIR_MODE)


# ---- the answer: one decision point, one charge, no drain ------------------------------


def slurm_with(*jobs: JobInfo) -> FakeSlurm:
    """The node running `jobs`; a hang's answer reads them, requeues, comments (and must not
    drain): any other Slurm call fails the test."""
    others = ("nodes", "node", "jobs", "resume", "reboot", "release", "hold", "start_now")
    return FakeSlurm([NODE], jobs, forbid=others)


def requeued(slurm: FakeSlurm) -> list[str]:
    return [job_id for _, job_id in slurm.called("requeue")]


def comment(slurm: FakeSlurm, job_id: str) -> str:
    return slurm.jobs_[job_id].admin_comment


class FakeStore:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add_event(self, **event: Any) -> None:
        self.events.append(event)


def answer(monkeypatch: pytest.MonkeyPatch, slurm: FakeSlurm, hang: Hang) -> tuple[bool, FakeStore]:
    from healthd import ladder_thread
    from healthd.progress_answers import ProgressAnswers
    from medic_core.config import MedicConfig
    from remediation import actions

    store = FakeStore()

    class Daemon:
        node = NODE
        config = MedicConfig(source=None, node_name=NODE, tables={"hooks": {"release_held": False}})

    daemon: Any = Daemon()
    daemon.store = store
    monkeypatch.setattr(actions, "slurm_client", lambda config, settings, **_: slurm)
    thread = ladder_thread.LadderThread(daemon, ladder=None, episodes=None)  # type: ignore[arg-type]
    monkeypatch.setattr(thread.seen, "wrap", lambda client: client)
    return ProgressAnswers(thread).respond_hang(hang), store


def job(
    job_id: str = "7", comment: str = "medic:resilient=2", admin: str = "", restarts: int = 0
) -> JobInfo:
    import pwd

    return JobInfo(
        job_id=job_id, name="train", user=pwd.getpwuid(os.geteuid()).pw_name, state="RUNNING",
        reason="None", nodes=NODE, requeue=True, restart_count=restarts, comment=comment,
        admin_comment=admin,
    )  # fmt: skip


def a_hang(owner: int | None = None) -> Hang:
    from healthd.hang import Verdict
    from healthd.progress import Evidence

    v = Verdict("7", State.HUNG, 5, 12.0, 1.0, 3.0, 5)
    return Hang(NODE, v, os.geteuid() if owner is None else owner, 1, Evidence(), 0.0)


def test_a_hang_requeues_the_resilient_job_charged_once_and_never_drains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slurm = slurm_with(job(), job("9"))
    ok, store = answer(monkeypatch, slurm, a_hang())
    assert ok and requeued(slurm) == ["7"] and slurm.called("drain") == []  # only the hung job
    assert "requeued off n1 (job.hang); restart 1/2" in comment(slurm, "7")
    assert "medic-ledger:restarts=1;charged=run0" in comment(slurm, "7")
    actions = [e["evidence"]["action"] for e in store.events]
    assert actions == ["hang", "requeued"]
    assert {e["kind"] for e in store.events} == {"job_action"}
    assert store.events[0]["evidence"]["stalled_s"] == 12.0
    # The same run reported hung again (another node of the job): no second charge.
    again = slurm_with(job(admin=comment(slurm, "7")))
    answer(monkeypatch, again, a_hang())
    assert "medic-ledger:restarts=1;charged=run0" in comment(again, "7")


def test_a_hang_past_the_budget_or_not_resilient_is_left_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spent = slurm_with(job(admin="medic-ledger:restarts=2;charged=run0,run1", restarts=2))
    answer(monkeypatch, spent, a_hang())
    assert requeued(spent) == [] and "restart budget spent (2/2)" in comment(spent, "7")
    plain = slurm_with(job(comment=""))
    answer(monkeypatch, plain, a_hang())
    assert requeued(plain) == [] and "not resilient" in comment(plain, "7")


def test_a_heartbeat_not_owned_by_the_jobs_user_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = slurm_with(job())
    ok, store = answer(monkeypatch, slurm, a_hang(owner=os.geteuid() + 4242))
    assert ok and requeued(slurm) == [] and store.events == []


def test_the_writer_keeps_every_step_in_its_shared_page(hb_dir: Path) -> None:
    """20,000 steps in a row land in the page the daemon reads (the last one wins). Their
    cost, ~0.25 us a step, is bench/heartbeat.py's to measure: a timed unit test failed
    under a loaded full suite (7 us) without anything being wrong."""
    w = Writer(env=env_for(hb_dir))
    n = 20_000
    for i in range(n):
        w.step(i)
    assert struct.unpack_from("<Q", Path(w.path or "").read_bytes(), 16)[0] == n - 1


def test_events_carry_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    _, store = answer(monkeypatch, slurm_with(job()), a_hang())
    assert all(isinstance(e["at"], dt.datetime) for e in store.events)


def test_a_failing_look_is_logged_once_while_it_repeats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    looks: list[int] = []

    def broken() -> tuple[str, ...] | None:
        looks.append(1)
        if len(looks) >= 5:
            w.stop()
        raise OSError("spool: I/O error")

    w = HangWatch(NODE, lambda: WatchSettings(directory=tmp_path, poll=0.1), broken,
                  lambda h: True)  # fmt: skip
    w.loop()
    assert len(looks) == 5
    assert [r.message for r in caplog.records].count(
        "hang watch: a look failed (logged once while it repeats)"
    ) == 1


# ---- stragglers ------------------------------------------------------------------------


def paced(step_s: float, busy: float | None = None, n: int = 8) -> Progress:
    p, t = Progress("5"), 100.0
    for i in range(n):
        b = Beat(2, i, int(t * 1e9), 1, int(busy * 1e9) if busy else 0)
        p = observe(p, b, t, S)
        t += step_s
    return p


def test_pace_is_the_busy_time_when_reported_else_the_step_time() -> None:
    assert pace(paced(0.1), S) == HangPace("5", pytest.approx(0.1), "step", 5)
    assert pace(paced(0.1, busy=0.03), S) == HangPace("5", pytest.approx(0.03), "busy", 5)
    assert pace(paced(0.1, n=3), S) is None  # two step times: not yet


def test_slower_than_others_compares_like_with_like() -> None:
    mine = HangPace("5", 0.3, "busy", 5)
    others = [HangPace("5", 0.1, "busy", 5), HangPace("5", 0.12, "busy", 5)]
    assert slower_than_others(mine, others, 1.25) == pytest.approx(0.3 / 0.11)
    assert slower_than_others(HangPace("5", 0.12, "busy", 5), others, 1.25) is None
    assert slower_than_others(mine, [HangPace("5", 0.1, "step", 5)], 1.25) is None
    assert slower_than_others(mine, [], 1.25) is None


class PaceBoard:
    """What the store does for compare_pace: each node's latest pace of each job."""

    def __init__(self) -> None:
        self.paces: dict[tuple[str, str], HangPace] = {}

    def compare(self, node: str) -> Any:
        def share(mine: HangPace, window: float) -> list[HangPace]:
            self.paces[(node, mine.job_id)] = mine
            return [p for (n, j), p in self.paces.items() if n != node and j == mine.job_id]

        return share


def test_only_the_slow_node_is_reported_once_after_repeats(tmp_path: Path) -> None:
    board, clock = PaceBoard(), FakeClock()
    reports: list[Any] = []
    step = {"n1": 0, "n2": 0}
    busy = {"n1": 0.1, "n2": 0.3}  # n2 works 3x longer per step; both step in lockstep
    cfg = WatchSettings(hang=S, directory=tmp_path, straggler_every=1.0)

    def watch(node: str) -> HangWatch:
        def read(d: Path, job: str, n: str) -> BeatRead:
            b = Beat(2, step[node], int(clock.now * 1e9), 1, int(busy[node] * 1e9))
            return BeatRead(b, os.geteuid())

        return HangWatch(node, lambda: cfg, lambda: ("5",), lambda h: True, clock=clock,
                         read=read, compare=board.compare(node), report=reports.append)  # fmt: skip

    w1, w2 = watch("n1"), watch("n2")
    for _ in range(12):
        for node in step:
            step[node] += 1
        w1.look()
        w2.look()
        clock.now += 0.5
    assert [(r.node, r.pace.basis) for r in reports] == [("n2", "busy")]
    assert reports[0].times == pytest.approx(3.0)


def test_compare_pace_shares_mine_and_reads_the_others_latest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from healthd import ladder_thread
    from healthd.progress_answers import ProgressAnswers
    from medic_core.config import MedicConfig
    from medic_core.store import Event, Severity

    class Store:
        def __init__(self) -> None:
            self.added: list[dict[str, Any]] = []

        def add_event(self, **event: Any) -> None:
            self.added.append(event)

        def events(self, **query: Any) -> list[Event]:
            assert query["kind"] == "job_pace"
            rows = [
                Event(i, e["node"], e["at"], e["kind"], "", e["target"], Severity.INFO, "",
                      e["evidence"], "healthd")
                for i, e in enumerate(self.added)
            ]  # fmt: skip
            return rows[::-1]

    def thread_on(node: str, store: Store) -> Any:
        class Daemon:
            config = MedicConfig(source=None, node_name=node)

        daemon: Any = Daemon()
        daemon.node, daemon.store = node, store
        thread = ladder_thread.LadderThread(daemon, ladder=None, episodes=None)  # type: ignore[arg-type]
        return ProgressAnswers(thread)

    store = Store()
    n1, n2 = thread_on("n1", store), thread_on("n2", store)
    assert n1.compare_pace(HangPace("5", 0.1, "busy", 5), 30.0) == []
    n1.compare_pace(HangPace("5", 0.11, "busy", 5), 30.0)  # n1's newer pace
    n2.compare_pace(HangPace("9", 0.5, "busy", 5), 30.0)  # another job
    assert n2.compare_pace(HangPace("5", 0.3, "busy", 5), 30.0) == [HangPace("5", 0.11, "busy", 5)]


# ---- a repeat straggler drains after its job -------------------------------------------


@given(st.lists(st.sampled_from("abcdef"), max_size=12), st.integers(0, 8))
def test_repeat_straggler_counts_different_jobs_and_zero_means_report_only(
    jobs: list[str], threshold: int
) -> None:
    from healthd.hang import repeat_straggler

    assert repeat_straggler(jobs, threshold) == (threshold > 0 and len(set(jobs)) >= threshold)
    assert not repeat_straggler(jobs * 3, 0)


def test_a_repeat_straggler_starts_at_a_reboot_unless_an_override_says_otherwise() -> None:
    from remediation.policy import Rung, first_rung

    assert first_rung("node.straggler", "drain_after_job") is Rung.REBOOT
    assert first_rung("node.straggler", "drain_after_job", {"node": "none"}) is None
    assert first_rung("gpu.trend.ecc_corrected", "drain_after_job") is Rung.GPU_RESET


def straggler_thread(earlier: list[str], drain_jobs: int, store_down: bool = False) -> Any:
    """The progress answers of a ladder thread whose store holds `earlier` straggler reports
    of n2 (job ids) and whose respond() is recorded instead of carried out."""
    from healthd import ladder_thread
    from healthd.progress_answers import ProgressAnswers
    from medic_core.config import MedicConfig
    from medic_core.store import Event, Severity

    class Store:
        def __init__(self) -> None:
            self.added: list[dict[str, Any]] = []

        def add_event(self, **event: Any) -> None:
            self.added.append(event)

        def events(self, node: str, **query: Any) -> list[Event]:
            if store_down:
                raise OSError("database is locked")
            assert node == "n2" and query["kind"] == "straggler"
            now = dt.datetime.now(dt.UTC)
            return [
                Event(i, "n2", now, "straggler", "node.straggler", f"job:{j}", Severity.WARN,
                      "", {"job_id": j}, "healthd")
                for i, j in enumerate(earlier)
            ]  # fmt: skip

    class Daemon:
        config = MedicConfig(
            source=None,
            node_name="n2",
            tables={"healthd": {"straggler_drain_jobs": drain_jobs}},
        )

    daemon: Any = Daemon()
    daemon.node, daemon.store = "n2", Store()
    thread = ladder_thread.LadderThread(daemon, ladder=None, episodes=None)  # type: ignore[arg-type]
    answers: Any = ProgressAnswers(thread)
    answers.responded = []
    thread.respond = lambda faults, again=False: answers.responded.append(faults)
    return answers


def found_in(job_id: str) -> Any:
    from healthd.hang_watch import Straggler

    mine = HangPace(job_id, 0.3, "busy", 5)
    return Straggler("n2", mine, (HangPace(job_id, 0.1, "busy", 5),), 3.0)


def test_a_node_slow_in_a_second_job_drains_after_it_and_the_first_job_only_reports() -> None:
    from medic_core.vocabulary import Recommendation

    first = straggler_thread([], drain_jobs=2)
    first.report_straggler(found_in("7"))
    assert first.responded == []  # one job: reported (the event), nothing else
    assert [e["kind"] for e in first.daemon.store.added] == ["straggler"]

    second = straggler_thread(["7"], drain_jobs=2)
    second.report_straggler(found_in("9"))
    [[fault]] = second.responded
    assert (fault.status.value, fault.fault_class, fault.target) == ("WARN", "node.straggler", None)
    assert fault.remediation is Recommendation.DRAIN_AFTER_JOB
    assert fault.evidence["jobs"] == ["7", "9"] and "2 jobs" in fault.message


def test_the_same_job_reported_again_is_one_job_and_zero_reports_only() -> None:
    again = straggler_thread(["9", "9"], drain_jobs=2)
    again.report_straggler(found_in("9"))
    assert again.responded == []
    off = straggler_thread(["1", "2", "3"], drain_jobs=0)
    off.report_straggler(found_in("4"))
    assert off.responded == []


def test_with_the_store_down_this_report_alone_counts(caplog: pytest.LogCaptureFixture) -> None:
    down = straggler_thread(["1", "2"], drain_jobs=2, store_down=True)
    down.report_straggler(found_in("3"))
    assert down.responded == []
    assert "earlier reports of n2 unknown" in caplog.text
    alone = straggler_thread([], drain_jobs=1, store_down=True)
    alone.report_straggler(found_in("3"))
    assert len(alone.responded) == 1


class CountedStop:
    """The watch's stop event: records each wait's timeout, stops the loop after `looks`."""

    def __init__(self, looks: int, between: Any = None) -> None:
        self.waits: list[float] = []
        self.looks = looks
        self.between = between  # called after each wait: the world changes between looks

    def is_set(self) -> bool:
        return len(self.waits) >= self.looks

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        if self.between is not None:
            self.between()
        return self.is_set()


def test_the_watch_looks_every_poll_while_a_job_reports_and_seldom_while_none_does(
    watch: Any,
) -> None:
    w, clock, jobs, _ = watch
    poll = WatchSettings().poll
    seen: list[int] = []

    def between() -> None:  # job 7 starts beating after the 2nd look, ends after the 4th
        seen.append(len(seen))
        if len(seen) in (2, 3):
            advance(jobs, "7", clock)
        if len(seen) == 4:
            jobs.pop("7")
        clock.now += 1.0

    w._stop = CountedStop(6, between)
    w.loop()
    idle, busy = poll * IDLE_POLLS, poll
    # looks 1-2: nothing reports; 3-4: job 7 watched; 5: it ended (forgotten); 6: idle again
    assert w._stop.waits == [idle, idle, busy, busy, idle, idle]

"""Post-job hygiene (issue 26.2): what a job left is found, cleaned, and what survives drains
the node as user_problem through the decision core; hostile input (symlinks in /dev/shm,
another user's files and processes, reused pids, a user with another job) is never touched."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medic_core import proc
from medic_core.config import ConfigError, NodePaths, parse_config
from medic_core.drain_book import DrainBook
from medic_core.drain_reason import is_user_problem_reason
from medic_core.hygiene_settings import HygieneSettings
from medic_core.slurm import JobInfo, NodeInfo
from medic_core.store import Store, open_store
from remediation.decide import NodeFacts, cap_reason
from remediation.hygiene_report import summarise
from remediation.user_problem import decide_user_problem, still_left
from slurm_hooks import hygiene as hy
from slurm_hooks import hygiene_run as run
from slurm_hooks import hygiene_watch as watch
from tests.conftest import poll
from tests.fakes import FakeSlurm

JOB = hy.JobOwner("4242", 1500, "alice", "n1")
ALONE = hy.Scope(JOB, by_user=True, user_files=True)
NOT_ALONE = hy.Scope(JOB, by_user=False, user_files=False)


@dataclass
class FakeProc:
    """A /proc tree: one directory per pid with stat, status, environ and cgroup."""

    root: Path
    pids: dict[int, dict[str, object]] = field(default_factory=dict)

    def add(
        self, pid: int, *, uid: int = 1500, env: dict[str, str] | None = None,
        comm: str = "python", state: str = "S", ppid: int = 1, start: int = 100,
        flags: int = 0, cgroup: str = "0::/user.slice",
    ) -> None:  # fmt: skip
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        fields = [state, str(ppid), "0", "0", "0", "0", str(flags)] + ["0"] * 12 + [str(start)]
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)} 0 0\n")
        (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        raw = b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {}).items())
        (d / "environ").write_bytes(raw)
        (d / "cgroup").write_text(cgroup + "\n")

    def remove(self, pid: int) -> None:
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def fake_proc(tmp_path: Path) -> FakeProc:
    (tmp_path / "proc").mkdir()
    return FakeProc(tmp_path / "proc")


def job_env(job: str = "4242", node: str = "n1") -> dict[str, str]:
    return {"SLURM_JOB_ID": job, "SLURMD_NODENAME": node, "HOME": "/home/alice"}


# -- finding processes -------------------------------------------------------------------


def test_the_jobs_processes_are_found_and_nothing_else(fake_proc: FakeProc) -> None:
    fake_proc.add(10, env=job_env())  # the job's, escaped proctrack
    fake_proc.add(11, uid=0, cgroup="0::/system.slice/slurmstepd.scope/job_4242/step_0")
    fake_proc.add(12, env=job_env("4243"))  # the user's other job: not while by_user is off
    fake_proc.add(13, uid=1600, env=job_env())  # another user claiming our job id
    fake_proc.add(14, env={**job_env(), "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"})  # a hook
    fake_proc.add(15, env=job_env(node="n2"))  # the same job on another node (the lab)
    fake_proc.add(16, env=job_env(), state="Z")  # a zombie holds nothing
    fake_proc.add(17, uid=1500, flags=hy.PF_KTHREAD)
    fake_proc.add(18, env=job_env())  # spared: the epilog's own line
    fake_proc.add(1, uid=1500, env=job_env())
    found = hy.find_processes(fake_proc.root, NOT_ALONE, spare={18})
    assert [(p.pid, p.why) for p in found] == [(10, "job environment"), (11, "job cgroup")]


def test_the_users_other_processes_only_when_they_have_no_other_job(fake_proc: FakeProc) -> None:
    fake_proc.add(20, env={})  # the user's, from no job (a login, an old job)
    fake_proc.add(21, uid=1600)
    assert [p.pid for p in hy.find_processes(fake_proc.root, NOT_ALONE)] == []
    assert [(p.pid, p.why) for p in hy.find_processes(fake_proc.root, ALONE)] == [(20, "user")]


def test_a_user_with_another_job_here_keeps_it_and_root_is_never_swept_by_user() -> None:
    settings = HygieneSettings(min_uid=0)
    assert run.scope_of(JOB, True, settings).by_user is False
    assert run.scope_of(JOB, None, settings).by_user is False  # Slurm did not answer
    assert run.scope_of(JOB, False, settings).by_user is True
    root = hy.JobOwner("1", 0, "root", "n1")
    assert run.scope_of(root, False, settings) == hy.Scope(root, False, True)
    assert run.scope_of(root, False, HygieneSettings()).user_files is False  # min_uid 1000


def test_other_jobs_reads_slurmds_spool_and_asks_slurm_only_when_another_job_is_there(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    config = parse_config({"healthd": {"slurmd_spool_dir": str(spool)}}, None, "n1")

    def job(job_id: str, user: str) -> JobInfo:
        return JobInfo(job_id, "j", user, "RUNNING", "None", "n1", False, 0)

    for name in ("n1_4242.0", "n1_4242.4294967291", "n2_77.0", "cred_state"):
        (spool / name).touch()
    never = FakeSlurm(["n1"], forbid=["jobs", "jobs_on"])
    assert run.other_jobs(config, JOB, never) is False  # only our job (and n2's) there
    (spool / "n1_8.0").touch()
    assert run.other_jobs(config, JOB, FakeSlurm(["n1"], [job("8", "bob")])) is False
    assert run.other_jobs(config, JOB, FakeSlurm(["n1"], [job("8", "alice")])) is True
    down = FakeSlurm(["n1"])
    down.unreachable = True
    assert run.other_jobs(config, JOB, down) is None


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    table=st.lists(
        st.tuples(
            st.sampled_from([0, 1500, 1600]),
            st.sampled_from(["4242", "4243", ""]),
            st.sampled_from(["n1", "n2", None]),
            st.booleans(),  # a hook's process
            st.sampled_from(["R", "S", "D", "Z"]),
            st.text(alphabet="ab )( x", max_size=12),  # hostile command names
        ),
        max_size=12,
    ),
    alone=st.booleans(),
)
def test_found_processes_are_always_the_jobs_or_the_lone_users(
    tmp_path_factory: pytest.TempPathFactory,
    table: list[tuple[int, str, str | None, bool, str, str]],
    alone: bool,
) -> None:
    fake = FakeProc(tmp_path_factory.mktemp("proc"))
    for i, (uid, job, node, hook, state, comm) in enumerate(table):
        env = {"SLURM_JOB_ID": job} if job else {}
        if node:
            env["SLURMD_NODENAME"] = node
        if hook:
            env["SLURM_SCRIPT_CONTEXT"] = "epilog_slurmd"
        fake.add(100 + i, uid=uid, env=env, state=state, comm=comm)
    scope = ALONE if alone else NOT_ALONE
    for p in hy.find_processes(fake.root, scope):
        uid, job, node, hook, state, comm = table[p.pid - 100]
        assert state != "Z" and uid == JOB.uid and p.comm == comm[:32]
        if not alone:
            assert job == "4242" and node in ("n1", None) and not hook


@given(comm=st.text(max_size=40).filter(lambda c: "\0" not in c and "\n" not in c))
def test_stat_is_read_whatever_the_command_name(comm: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeProc(Path(tmp))
        fake.add(7, comm=comm, start=12345, state="D")
        got = hy.read_stat(fake.root, 7)
        assert got is not None and (got.state, got.start, got.comm) == ("D", 12345, comm[:32])


# -- ending processes --------------------------------------------------------------------


def test_term_then_kill_after_the_grace_and_what_survives_is_returned(fake_proc: FakeProc) -> None:
    for pid in (30, 31, 32):
        fake_proc.add(pid, env=job_env(), start=pid)
    found = hy.find_processes(fake_proc.root, NOT_ALONE)
    sent: list[tuple[int, int]] = []

    def send(p: hy.ProcessLeft, sig: int) -> bool:
        sent.append((p.pid, sig))
        if (p.pid, sig) in ((30, signal.SIGTERM), (31, signal.SIGKILL)):
            fake_proc.remove(p.pid)
        return True

    left = hy.end_processes(
        found, lambda p: hy.alive(fake_proc.root, p), send,
        grace=0.05, kill_wait=0.05, deadline=time.monotonic() + 5,
    )  # fmt: skip
    assert [p.pid for p in left] == [32]
    assert sent == [(30, signal.SIGTERM), (31, signal.SIGTERM), (32, signal.SIGTERM),
                    (31, signal.SIGKILL), (32, signal.SIGKILL)]  # fmt: skip


def test_a_reused_pid_is_neither_alive_nor_signalled(fake_proc: FakeProc) -> None:
    fake_proc.add(40, env=job_env(), start=500)
    [p] = hy.find_processes(fake_proc.root, NOT_ALONE)
    fake_proc.add(40, env=job_env(), start=900)  # the job's process died; a new one took 40
    assert not hy.alive(fake_proc.root, p)


@pytest.fixture
def real_process(tmp_path: Path) -> Iterator[int]:
    """A real process of 'job 990000002' that ignores SIGTERM."""
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    env = {"SLURM_JOB_ID": "990000002", "SLURMD_NODENAME": "hyg-node"}
    pid = proc.spawn([sys.executable, "-c", code], log_path=tmp_path / "p.log", env=env)
    poll("the process to start", lambda: b"990000002" in Path(f"/proc/{pid}/environ").read_bytes())
    yield pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_real_process_that_ignores_term_is_killed(real_process: int) -> None:
    job = hy.JobOwner("990000002", os.getuid(), "root", "hyg-node")
    proc_root = Path("/proc")
    found = hy.find_processes(proc_root, hy.Scope(job, False, False))
    assert [p.pid for p in found] == [real_process]
    left = hy.end_processes(
        found, lambda p: hy.alive(proc_root, p), hy.pidfd_signaller(proc_root),
        grace=0.2, kill_wait=2, deadline=time.monotonic() + 10,
    )  # fmt: skip
    assert left == []


def test_the_signaller_refuses_a_pid_whose_start_time_changed(real_process: int) -> None:
    proc_root = Path("/proc")
    st_ = hy.read_stat(proc_root, real_process)
    assert st_ is not None
    stale = hy.ProcessLeft(real_process, st_.start - 1, 0, "python", "S", "job environment")
    assert hy.pidfd_signaller(proc_root)(stale, signal.SIGKILL) is False
    assert hy.alive(proc_root, hy.ProcessLeft(real_process, st_.start, 0, "", "S", ""))


# -- /dev/shm and scratch ----------------------------------------------------------------


def test_shm_the_users_files_go_symlinks_are_never_followed_others_stay(tmp_path: Path) -> None:
    shm, elsewhere = tmp_path / "shm", tmp_path / "elsewhere"
    shm.mkdir()
    elsewhere.mkdir()
    victim = elsewhere / "bobs-file"
    victim.write_text("bob")
    os.chown(victim, 1600, 1600)
    for name, uid in (("psm_alice", 1500), ("sem.alice", 1500), ("bob_seg", 1600)):
        (shm / name).write_text("x")
        os.chown(shm / name, uid, uid)
    (shm / "link").symlink_to(victim)
    os.chown(shm / "link", 1500, 1500, follow_symlinks=False)
    (shm / "adir").mkdir()
    os.chown(shm / "adir", 1500, 1500)
    found = hy.find_shm(shm, 1500)
    assert found == ["link", "psm_alice", "sem.alice"]
    assert hy.remove_shm(shm, found, 1500) == []
    assert sorted(p.name for p in shm.iterdir()) == ["adir", "bob_seg"]
    assert victim.read_text() == "bob"


@settings(max_examples=40, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["file", "link", "dir", "fifo"]), st.sampled_from([1500, 1600, 0])
        ),
        max_size=8,
    )
)
def test_shm_only_the_users_own_files_and_links_go_whatever_is_there(
    entries: list[tuple[str, int]],
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shm, target = Path(tmp) / "shm", Path(tmp) / "target"
        shm.mkdir()
        target.write_text("keep")
        for i, (kind, uid) in enumerate(entries):
            path = shm / f"e{i}"
            if kind == "file":
                path.write_text("x")
            elif kind == "link":
                path.symlink_to(target)
            elif kind == "dir":
                path.mkdir()
            else:
                os.mkfifo(path)
            os.chown(path, uid, uid, follow_symlinks=False)
        hy.remove_shm(shm, hy.find_shm(shm, 1500), 1500)
        for i, (kind, uid) in enumerate(entries):
            gone = kind in ("file", "link") and uid == 1500
            assert os.path.lexists(shm / f"e{i}") is not gone, (kind, uid)
        assert target.read_text() == "keep"


def test_shm_a_name_swapped_for_another_users_file_is_kept(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "seg").write_text("x")
    os.chown(shm / "seg", 1500, 1500)
    found = hy.find_shm(shm, 1500)
    os.chown(shm / "seg", 1600, 1600)  # between the look and the unlink
    assert hy.remove_shm(shm, found, 1500) == []
    assert (shm / "seg").exists()


def test_a_symlinked_shm_directory_is_not_entered(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "f").write_text("x")
    os.chown(real / "f", 1500, 1500)
    (tmp_path / "shm").symlink_to(real)
    assert hy.find_shm(tmp_path / "shm", 1500) == []
    assert hy.remove_shm(tmp_path / "shm", ["f"], 1500) == ["f"] and (real / "f").exists()


def _own(path: Path, uid: int) -> None:
    os.chown(path, uid, uid, follow_symlinks=False)


def test_scratch_is_emptied_of_the_users_files_only(tmp_path: Path) -> None:
    scratch, outside = tmp_path / "scratch" / "alice", tmp_path / "outside"
    (scratch / "run" / "deep").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep").write_text("x")
    _own(outside / "keep", 1500)
    (scratch / "run" / "deep" / "ckpt").write_text("x")
    (scratch / "run" / "bobs").write_text("x")
    (scratch / "out").symlink_to(outside)
    (scratch / "gone").mkdir()
    for p in (scratch, scratch / "run", scratch / "run" / "deep", scratch / "run" / "deep" / "ckpt",
              scratch / "out", scratch / "gone"):  # fmt: skip
        _own(p, 1500)
    _own(scratch / "run" / "bobs", 1600)
    found, left = hy.empty_owned(scratch, 1500, time.monotonic() + 5)
    assert left == []
    assert sorted(Path(f).relative_to(scratch).as_posix() for f in found) == [
        "gone", "out", "run/deep", "run/deep/ckpt",
    ]  # fmt: skip
    assert scratch.exists() and (scratch / "run" / "bobs").exists()  # bob's file and its dir stay
    assert (outside / "keep").exists()  # the symlink went, never what it pointed to


def test_scratch_templates_need_a_safe_user_and_a_lone_user_unless_per_job() -> None:
    templates = ("/s/{user}", "/j/{job}", "/u/{uid}")
    assert hy.scratch_paths(templates, JOB, True) == [
        Path("/s/alice"),
        Path("/j/4242"),
        Path("/u/1500"),
    ]
    assert hy.scratch_paths(templates, JOB, False) == [Path("/j/4242")]
    evil = hy.JobOwner("1", 1500, "../etc", "n1")
    assert hy.scratch_paths(templates, evil, True) == [Path("/j/1"), Path("/u/1500")]


# -- decisions, settings, views ----------------------------------------------------------


def test_only_what_survives_drains_and_only_a_node_in_service() -> None:
    up = NodeFacts(True, False, False, "", False)
    assert decide_user_problem([], up, drain_enabled=True).drain is False
    d = decide_user_problem(["1 processes 9:cat:D"], up, drain_enabled=True)
    assert d.drain and d.reason.startswith("medic: user_problem node 1 processes")
    assert is_user_problem_reason(d.reason)
    assert not decide_user_problem(["x"], up, drain_enabled=False).drain
    admin = NodeFacts(True, True, False, "admin: reseat", False)
    assert "kept" in decide_user_problem(["x"], admin, drain_enabled=True).why
    assert still_left([]) == [] and still_left(["x"])[0].fault_class == "user_problem"


def test_user_problem_drains_are_not_counted_by_the_drain_cap() -> None:
    def node(name: str, reason: str = "") -> NodeInfo:
        flags = frozenset({"DRAIN"}) if reason else frozenset()
        return NodeInfo(name, "IDLE", flags, reason, ("gpu",))

    nodes = [node("n1"), node("n2", "medic: user_problem node 1 processes"), node("n3")]
    assert cap_reason(nodes, "n1", 0.3, 1) == ""
    nodes[1] = node("n2", "medic: gpu.xid.79 gpu2 fell off the bus")
    assert cap_reason(nodes, "n1", 0.3, 1) != ""


def test_settings_name_the_bad_key() -> None:
    def config(text: dict[str, object]) -> HygieneSettings:
        return HygieneSettings.from_config(parse_config({"hygiene": text}, Path("m.toml"), "n1"))

    assert config({"enabled": True, "scratch_dirs": ["/s/{user}"]}).enabled
    for bad in ({"scratch_dirs": ["s/{user}"]}, {"scratch_dirs": ["/s/{home}"]},
                {"term_grace": 0}, {"shm_dir": "dev/shm"}, {"bogus": 1}):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            config(bad)
        assert str(err.value).startswith("m.toml: hygiene.") and "\n" not in str(err.value)


def test_medic_nodes_shows_a_user_problem_apart() -> None:
    from cli.node_view import USER_PROBLEM, StoreFacts, node_state, summary_counts

    reason = "medic: user_problem node 1 processes 9:cat:D"
    slurm = NodeInfo("n1", "IDLE", frozenset({"DRAIN"}), reason, ("gpu",))
    state = node_state(slurm, StoreFacts(drain_record=reason), dt.datetime.now(dt.UTC))
    assert state.word == USER_PROBLEM and "SIGKILL" in state.why
    assert "1 drained for a user problem" in summary_counts([state])
    typed = node_state(slurm, StoreFacts(), dt.datetime.now(dt.UTC))  # an admin's text
    assert typed.word == "drained"


def test_the_report_counts_cleanings_and_user_problem_drains_apart() -> None:
    t0 = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)
    reason = "medic: user_problem node 1 processes"

    def ev(kind: str, secs: int, node: str = "n1", **evidence: object) -> SimpleNamespace:
        return SimpleNamespace(kind=kind, at=t0 + dt.timedelta(seconds=secs), node=node,
                               evidence=evidence)  # fmt: skip

    events = [
        ev("hygiene", 0, found={"processes": 2, "shm": 1, "scratch": 0}),
        ev("hygiene", 10, found={"processes": 1, "shm": 0, "scratch": 3}),
        ev("medic.drain", 11, reason=reason),
        ev("medic.resume", 41, reason=reason),
        ev("medic.drain", 50, node="n2", reason="medic: gpu.xid.79 gpu1 x"),
    ]
    [row] = summarise(events, t0, t0 + dt.timedelta(hours=1))
    assert (row.node, row.jobs, row.processes, row.files, row.drains, row.resumed) == (
        "n1", 2, 3, 4, 1, 1,
    )  # fmt: skip
    assert row.median_out == 30


# -- the drain and the give-back -----------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as s:
        yield s


def _config(tmp_path: Path, proc_root: Path, shm: Path) -> object:
    data = {
        "node": {"state_dir": str(tmp_path / "state"), "socket": str(tmp_path / "no.sock")},
        "hygiene": {"enabled": True, "proc_dir": str(proc_root), "shm_dir": str(shm),
                    "term_grace": 0.1, "kill_wait": 0.1},
    }  # fmt: skip
    return parse_config(data, tmp_path / "medic.toml", "n1")


def test_a_survivor_drains_as_user_problem_and_the_node_is_given_back_once_clean(
    tmp_path: Path, fake_proc: FakeProc, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    config = _config(tmp_path, fake_proc.root, shm)
    fake_proc.add(50, env=job_env(), state="D")  # stuck in the kernel: no signal ends it
    slurm = FakeSlurm(["n1"])
    book = DrainBook.of(store)
    monkeypatch.setattr("remediation.actions.slurm_client", lambda *a, **k: slurm)
    monkeypatch.setattr("medic_core.drain_book.node_book", lambda c: book)
    monkeypatch.setattr(run, "start_watch", lambda c: 0)
    monkeypatch.setattr(run, "_record", lambda *a, **k: None)
    monkeypatch.setattr(hy, "pidfd_signaller", lambda root: lambda p, sig: True)
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1500", "SLURM_JOB_USER": "alice"}
    outcome = run.run_hygiene(config, env, time.monotonic())  # type: ignore[arg-type]
    assert outcome.drained, outcome.line
    info = slurm.node("n1")
    assert info is not None and info.drained and is_user_problem_reason(info.reason)
    assert store.open_drain("n1") is not None  # Medic's own, recorded

    still = watch.resume_if_clean(config, slurm, book)  # type: ignore[arg-type]
    assert (still.action, still.done) == ("kept", False) and "50:python:D" in still.message
    # A second job of the user's (a shared node) leaves another: the drain stands for both.
    fake_proc.add(51, env=job_env("4243"), state="D")
    second = run.run_hygiene(config, {**env, "SLURM_JOB_ID": "4243"}, time.monotonic())  # type: ignore[arg-type]
    assert not second.drained and "already drained as user_problem" in second.line
    fake_proc.remove(50)  # the first process finally exits
    still = watch.resume_if_clean(config, slurm, book)  # type: ignore[arg-type]
    assert still.action == "kept" and "job 4243" in still.message
    fake_proc.remove(51)
    monkeypatch.setattr("slurm_hooks.ownership.remediation_owns", lambda c, n: "")
    back = watch.resume_if_clean(config, slurm, book)  # type: ignore[arg-type]
    assert back.action == "resumed", back.message
    info = slurm.node("n1")
    assert info is not None and not info.drained
    assert store.open_drain("n1") is None
    assert not run.record_path(config).exists()  # type: ignore[arg-type]


def test_a_clean_job_drains_nothing_and_records_nothing(
    tmp_path: Path, fake_proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    config = _config(tmp_path, fake_proc.root, shm)
    slurm = FakeSlurm(["n1"])
    monkeypatch.setattr("remediation.actions.slurm_client", lambda *a, **k: slurm)
    monkeypatch.setattr(run, "_record", lambda *a, **k: pytest.fail("recorded"))
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1500", "SLURM_JOB_USER": "alice"}
    outcome = run.run_hygiene(config, env, time.monotonic())  # type: ignore[arg-type]
    assert outcome.found.empty and outcome.line == "" and slurm.calls == []


def test_a_job_without_its_uid_is_left_alone() -> None:
    assert run.job_owner({"SLURM_JOB_ID": "5"}, "n1") == "SLURM_JOB_UID is not set"
    assert run.job_owner({"SLURM_JOB_ID": "5;rm", "SLURM_JOB_UID": "1"}, "n1") != ""
    assert isinstance(run.job_owner({"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "7"}, "n1"), hy.JobOwner)


def test_node_paths_default_to_the_host_root(tmp_path: Path) -> None:
    config = parse_config({"node": {"host_root": str(tmp_path)}}, None, "n1")
    s = HygieneSettings()
    assert s.proc_root(config) == tmp_path / "proc" and s.shm_root(config) == tmp_path / "dev/shm"
    assert NodePaths().proc == Path("/proc")

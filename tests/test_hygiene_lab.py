"""Post-job hygiene on the lab's real Slurm (issue 26.2). The lab's jobs run as root and all
its nodes share this host, so the lab's medic.toml sets `min_uid = 0` (root's files in the
shared-memory directory count) and `shm_dir` to a directory of the test's standing for
/dev/shm; processes are read from the host's /proc. Root is never swept by user: a job's
processes are known by its environment (proctrack/linuxproc lets a daemonised one escape).

1. A job leaving a daemonised `sleep` and a shared-memory file: both gone after its epilog
   (the compiled front hands over to `medic-epilog --hygiene`), the node never drained.
2. A job leaving a reader stuck in a hung FUSE file system (tests/test_hygiene_fuse.py: a
   task in D state that SIGKILL does not end, what "Kill task failed" is about): the node
   drained as user_problem, recorded as Medic's; once the server goes, the reader exits and
   the epilog's watcher gives the node back through the decision core.
3. The epilog's added time with hygiene on (p50 of 20 runs, each with a process and a file
   to clean) against off, run as slurmd runs it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from medic_core import proc
from medic_core.drain_reason import is_user_problem_reason
from medic_core.store import open_store
from remediation.episodes import EpisodeStore
from slurm_hooks import hygiene as hy
from tests.conftest import poll
from tests.lab_views import node_info
from tests.test_defects_lab import in_service, only_on, submit
from tests.test_hygiene_fuse import needs_fuse, start_server, stop_server

pytestmark = pytest.mark.lab
NODE = "n1"


@pytest.fixture
def hygiene_on(lab: Lab, tmp_path: Path) -> Iterator[Path]:
    """The lab's medic.toml (every hook's) with [hygiene] on, put back after; the node's
    daemon started on it (its job_end reply tells the compiled front)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    original = lab.layout.medic_conf.read_text()
    lab.layout.medic_conf.write_text(
        original + '\n[hygiene]\nenabled = true\nmin_uid = 0\nproc_dir = "/proc"\n'
        f'shm_dir = "{shm}"\nterm_grace = 1.0\nkill_wait = 1.0\nwatch_every = 0.25\n'
        "watch_for = 300\n"
    )
    try:
        lab.start_healthd(NODE)
        yield shm
    finally:
        lab.layout.medic_conf.write_text(original)
        lab.stop_healthd(NODE)


def job_processes(job_id: str) -> list[hy.ProcessLeft]:
    job = hy.JobOwner(job_id, 0, "root", NODE)
    return hy.find_processes(Path("/proc"), hy.Scope(job, False, False), {os.getpid()})


def wait_done(lab: Lab, job_id: str) -> None:
    """The job gone from the queue and its node no longer COMPLETING: the epilog ran."""

    def done() -> bool:
        active = {str(j["job_id"]) for j in lab.active_jobs()}
        return job_id not in active and "COMPLETING" not in str(node_info(lab, NODE)["state"])

    poll(f"job {job_id} and its epilog to end", done, timeout=60)


def test_a_job_leaving_a_process_and_a_shm_file_is_cleaned_without_a_drain(
    lab: Lab, hygiene_on: Path, tmp_path: Path
) -> None:
    shm = hygiene_on
    mark = tmp_path / "left"
    script = (
        f"setsid sleep 600 </dev/null >/dev/null 2>&1 & echo data > {shm}/psm_job; echo $! > {mark}"
    )
    job_id = submit(lab, only_on(lab, NODE), "--wrap", script)
    poll("the job to leave its process", mark.exists, timeout=60)
    wait_done(lab, job_id)
    assert job_processes(job_id) == []
    assert list(shm.iterdir()) == []
    assert in_service(lab, NODE), node_info(lab, NODE)
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        [event] = store.events(node=NODE, kind="hygiene")
    assert event.evidence["found"] == {"processes": 1, "shm": 1, "scratch": 0}, event.message
    assert event.evidence["left"] == {"processes": 0, "shm": 0, "scratch": 0}
    print(f"cleaned: {event.message}")


@needs_fuse
def test_an_unkillable_leftover_drains_as_user_problem_and_is_given_back_once_it_exits(
    lab: Lab, hygiene_on: Path, tmp_path: Path
) -> None:
    mnt, log = tmp_path / "mnt", tmp_path / "fuse.log"
    server = start_server(mnt, log)
    try:
        script = (
            f"setsid cat {mnt}/stuck </dev/null >/dev/null 2>&1 & "
            f"for i in $(seq 200); do grep -q holding {log} && break; sleep 0.05; done"
        )
        job_id = submit(lab, only_on(lab, NODE), "--wrap", script)

        def drained() -> bool:
            info = node_info(lab, NODE)
            return "DRAIN" in info.get("state_flags", []) and is_user_problem_reason(
                info.get("reason", "")
            )

        poll("the node drained as user_problem", drained, timeout=90)
        [stuck] = job_processes(job_id)
        assert hy.read_stat(Path("/proc"), stuck.pid).state == "D"  # type: ignore[union-attr]
        with open_store(f"sqlite:///{lab.layout.store_db}") as store:
            record = store.open_drain(NODE)
            assert record is not None and record.actor == "hook", record
            assert EpisodeStore(store).find(node=NODE) == []  # no episode: no lemon
        reason = str(node_info(lab, NODE)["reason"])
        assert f"{stuck.pid}:cat:D" in reason, reason
    finally:
        stop_server(server, mnt)
    stopped = time.monotonic()
    poll("the stuck reader to exit", lambda: not hy.alive(Path("/proc"), stuck), timeout=30)
    exited = time.monotonic()
    poll("the node given back", lambda: in_service(lab, NODE), timeout=60)
    back = time.monotonic() - exited
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        assert store.open_drain(NODE) is None
    print(f"server stopped -> reader gone {exited - stopped:.2f} s -> node resumed {back:.2f} s")


def _epilog(lab: Lab, job_id: str) -> float:
    env = {
        "SLURMD_NODENAME": NODE, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
        "SLURM_JOB_ID": job_id, "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
    }  # fmt: skip
    started = time.monotonic()
    done = proc.run([str(lab.layout.bin_dir / "medic-epilog")], timeout=60, env=env)
    took = time.monotonic() - started
    assert done.ok, done.describe_failure()
    return took


def _leave(tmp_path: Path, shm: Path, job_id: str) -> int:
    env = {"SLURM_JOB_ID": job_id, "SLURMD_NODENAME": NODE, "PATH": "/usr/bin:/bin"}
    (shm / f"psm_{job_id}").write_text("x")
    return proc.spawn(["sleep", "600"], log_path=tmp_path / "leave.log", env=env)


def test_the_epilogs_added_time_with_hygiene_on(lab: Lab, hygiene_on: Path, tmp_path: Path) -> None:
    runs = 20
    on = []
    for i in range(runs):
        job_id = str(880000000 + i)
        pid = _leave(tmp_path, hygiene_on, job_id)
        poll("the leftover to start", lambda: bool(job_processes(job_id)))  # noqa: B023
        on.append(_epilog(lab, job_id))
        assert job_processes(job_id) == [] and list(hygiene_on.iterdir()) == [], pid
    original = lab.layout.medic_conf.read_text()
    lab.layout.medic_conf.write_text(original.replace("enabled = true", "enabled = false"))
    lab.start_healthd(NODE)
    off = [_epilog(lab, str(881000000 + i)) for i in range(runs)]
    p50_on, p50_off = statistics.median(on), statistics.median(off)
    ours = {str(880000000 + i) for i in range(runs)}  # the store is the session lab's
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        events = store.events(node=NODE, kind="hygiene")
        inside = [e.evidence["seconds"] for e in events if e.evidence.get("job_id") in ours]
    assert len(inside) == runs
    print(
        f"epilog p50 over {runs} runs: hygiene on {p50_on * 1000:.0f} ms (a process and a file"
        f" cleaned each run), off {p50_off * 1000:.0f} ms: added {(p50_on - p50_off) * 1000:.0f}"
        f" ms; max on {max(on) * 1000:.0f} ms; hygiene itself (from the Python epilog's start)"
        f" p50 {statistics.median(inside) * 1000:.0f} ms",
        file=sys.stderr,
    )
    assert p50_on < 5.0

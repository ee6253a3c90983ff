"""Hot spares on the lab's real Slurm 22.05 (issues 14.4 and 22.8): n2-n4 busy with exclusive
jobs, n5 the pool's spare (it joined after the deep tier through its own medic-healthd), a
resilient job of a user without privileges (`medic-mallory`) on n1, and another job
waiting for any node. XID 95 on n1: the job runs again on n5 (its own reservation: the
waiting job does not get it); once the bound job runs, the reservation is gone and the
spare is held by the run's allocation only, so it serves the queue again when the run ends.
Once the ladder has reset n1's GPU and n1 passed the deep tier, n1 refills the pool
instead of returning to general service. The same user's second job naming the spare's
reservation: Slurm refuses it once the bound run holds the spare; before that,
tests/test_spare_refusal_lab.py (refused in its prolog, never run).
bench/spares.py measures the same run against an idle cluster's requeue.

This module runs on tests/test_unprivileged_lab's lab (a root directory every user may
traverse, so the user's sbatch reads slurm.conf)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.spares import BUSY, SPARE, VICTIM, pool, spares_config, submit
from cli.lab.cluster import Lab
from medic_core import proc
from medic_core.store import Store, open_store
from remediation import episodes as ep
from tests.conftest import poll
from tests.test_unprivileged_lab import Intruder, user_env
from tests.test_unprivileged_lab import home as home  # the fixtures
from tests.test_unprivileged_lab import intruder as intruder
from tests.test_unprivileged_lab import lab_session as lab_session


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def sbatch_as(user: Intruder, lab: Lab, home: Path, *args: str) -> proc.CommandResult:
    argv = user.argv("sbatch", "--parsable", f"--chdir={home}", f"--output={home}/%j.out",
                     *args)  # fmt: skip
    return proc.run(argv, env=user_env(lab, home), cwd=home, timeout=30)


def squeue(lab: Lab, job_id: str) -> str:
    """`<state> <nodes> <reservation>` of a job not yet finished ("" once it is)."""
    out = lab.slurm(["squeue", "-h", "-j", job_id, "-o", "%T %N %v"], check=False)
    return out.stdout.strip()


def reservation_exists(lab: Lab, name: str) -> bool:
    return lab.slurm(["scontrol", "show", "reservation", name], check=False).returncode == 0


def spare_events(store: Store, action: str) -> list[dict[str, object]]:
    return [
        {"node": e.node, "target": e.target, "at": e.at, **e.evidence}
        for e in store.events(kind="spare")
        if e.evidence.get("action") == action
    ]


def marked(path: Path) -> bool:
    """The job's mark is there and written (`echo` creates the file before it writes)."""
    return path.exists() and path.read_text().endswith("\n")


def test_a_spare_admits_only_the_run_it_was_handed_to_and_serves_the_queue_after_it(
    lab: Lab, store: Store, tmp_path: Path, intruder: Intruder, home: Path
) -> None:
    conf = spares_config(lab, tmp_path / "medic.toml")
    lab.start_healthd(SPARE, config=conf)
    poll("n5 in the spare pool", lambda: pool(lab) == [SPARE], timeout=30)
    lab.start_healthd(VICTIM, config=conf)
    for name in BUSY:
        submit(lab, "--exclusive", "-N1", "-w", name, "--wrap", "sleep 600")
    mark = f'echo "$SLURMD_NODENAME" > {home}/run-${{SLURM_RESTART_COUNT:-0}}'
    bound = sbatch_as(intruder, lab, home, "--resilient=2", "--exclusive", "-N1", "--wrap",
                      f"{mark}; sleep 600")  # fmt: skip
    assert bound.returncode == 0, bound.stderr
    job_id = bound.stdout.strip().split(";")[0]
    poll("the job running", lambda: marked(home / "run-0"), timeout=30)
    assert (home / "run-0").read_text().strip() == VICTIM  # the only node left
    waiting = submit(lab, "--exclusive", "-N1", "--wrap", "sleep 600")
    name = f"medic-spare-{job_id}"

    lab.inject(VICTIM, 5, ["xid=95"])
    poll("the job running again", lambda: marked(home / "run-1"), timeout=30)
    assert (home / "run-1").read_text().strip() == SPARE
    poll("the spare's reservation released", lambda: not reservation_exists(lab, name),
         timeout=15)  # fmt: skip
    assert squeue(lab, job_id) == f"RUNNING {SPARE} (null)"  # the allocation holds it
    assert squeue(lab, waiting).startswith("PENDING")  # the spare was the run's, not the queue's
    [released] = spare_events(store, "released")
    assert (released["node"], released["target"]) == (SPARE, f"job:{job_id}")
    assert (released["by"], released["actor"]) == (SPARE, "daemon")  # the spare's own daemon
    # Now the reservation is gone, nothing names the spare: Slurm refuses the same request.
    again = sbatch_as(intruder, lab, home, f"--reservation={name}", "--exclusive", "-N1",
                      "--wrap", "sleep 600")  # fmt: skip
    assert again.returncode != 0 and "reservation" in again.stderr.lower(), again.stderr
    on_spare = lab.slurm(["squeue", "-h", "-w", SPARE, "-t", "RUNNING", "-o", "%i"]).stdout.split()
    assert on_spare == [job_id]

    # The ladder resets n1's GPU; n1 passes the deep tier and joins the pool, not the queue.
    poll("the pool refilled with n1", lambda: pool(lab) == [VICTIM], timeout=60)
    episodes = ep.EpisodeStore(store)
    poll("n1's episode resolved", lambda: episodes.find(node=VICTIM)[-1].state == ep.RESOLVED,
         timeout=10)  # fmt: skip
    joined = [e for e in store.events(VICTIM, kind="spare") if e.evidence.get("action") == "joined"]
    assert joined and "deep tier" in joined[0].message

    # The bound run ends: the spare serves the queue at once (no reservation to purge).
    lab.slurm(["scancel", job_id])
    poll("a queued job on the given-back spare", lambda: any(
        j != job_id for j in lab.slurm(["squeue", "-h", "-w", SPARE, "-t", "RUNNING",
                                        "-o", "%i"]).stdout.split()), timeout=30)  # fmt: skip
    assert not [r for r in pool(lab) if r == SPARE]
    lab.slurm(["scancel", waiting])

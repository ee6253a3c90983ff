"""A handed spare refuses the same user's other job in its prolog, on the lab's real Slurm
22.05 (issue 22: a user cannot run a second job on a spare handed to their first).

Made deterministic: n2-n4 busy, n5 in the pool through its own medic-healthd, the user's
resilient job held (as a job Medic just requeued is, until its releaser makes it eligible)
and handed n5 through `SparePool.hand_over` as n1's daemon would. The user's second job
naming the spare's reservation is given n5 first: its prolog is refused, so Slurm never
starts its script; the drain that refusal leaves is Medic's and is lifted once Slurm has
requeued the job; the bound run, released, then runs on n5 and holds it.
tests/test_spares_lab.py runs the whole story from an XID."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.spares import BUSY, SPARE, VICTIM, pool, spares_config, submit
from cli.lab.cluster import Lab
from medic_core.settings import SpareSettings
from medic_core.spare_names import job_reservation
from medic_core.store import Store, open_store
from remediation.spares import SparePool, SparesSlurm
from tests.conftest import poll
from tests.test_spares_lab import sbatch_as, spare_events, squeue
from tests.test_unprivileged_lab import Intruder
from tests.test_unprivileged_lab import home as home  # the fixtures
from tests.test_unprivileged_lab import intruder as intruder
from tests.test_unprivileged_lab import lab_session as lab_session


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def drained(lab: Lab, name: str) -> bool:
    node = next(n for n in lab.nodes() if n.name == name)
    return "DRAIN" in node.flags


def test_the_users_other_job_is_refused_in_its_prolog_and_never_runs_on_the_spare(
    lab: Lab, store: Store, tmp_path: Path, intruder: Intruder, home: Path
) -> None:
    lab.start_healthd(SPARE, config=spares_config(lab, tmp_path / "medic.toml"))
    poll("n5 in the spare pool", lambda: pool(lab) == [SPARE], timeout=30)
    for name in BUSY:
        submit(lab, "--exclusive", "-N1", "-w", name, "--wrap", "sleep 600")
    submit(lab, "--exclusive", "-N1", "-w", VICTIM, "--wrap", "sleep 600")
    busy = {VICTIM, *BUSY}
    poll("n1-n4 busy", lambda: {n.name for n in lab.nodes() if n.state == "ALLOCATED"} >= busy,
         timeout=30)  # fmt: skip
    bound = sbatch_as(intruder, lab, home, "--hold", "--exclusive", "-N1", "--wrap",
                      f'echo "$SLURMD_NODENAME" > {home}/bound; sleep 600')  # fmt: skip
    assert bound.returncode == 0, bound.stderr
    job_id = bound.stdout.strip().split(";")[0]
    slurm = SparesSlurm(env=lab.env(), timeout=30)
    handed = SparePool(SpareSettings(size=1, nodes=(SPARE, VICTIM)), slurm, store, VICTIM)
    given = handed.hand_over(job_id, 0)
    assert given.node == SPARE, given.why

    name = job_reservation(job_id)
    # The spare's daemon clears a job waiting in the reservation at its next loop, often
    # before Slurm gives it the node; paused (a busy daemon), the job gets n5 first and
    # meets the daemon in its prolog, which waits for the answer.
    daemon = lab.healthd_pids()[SPARE]
    os.kill(daemon, signal.SIGSTOP)
    try:
        other = sbatch_as(intruder, lab, home, f"--reservation={name}", "--exclusive", "-N1",
                          "--wrap", f'echo "$SLURMD_NODENAME" > {home}/other')  # fmt: skip
        assert other.returncode == 0, other.stderr  # Slurm admits the user's job: Medic must not
        other_id = other.stdout.strip().split(";")[0]
        poll("the other job given n5", lambda: squeue(lab, other_id).startswith(
            ("CONFIGURING", "RUNNING")), timeout=30)  # fmt: skip
    finally:
        os.kill(daemon, signal.SIGCONT)

    def in_its_prolog() -> list[dict[str, object]]:
        return [r for r in spare_events(store, "refused_job") if r.get("drained")]

    try:
        poll("the other job refused in its prolog", lambda: bool(in_its_prolog()), timeout=30)
    except AssertionError as exc:  # where it stood: read once, in CI
        said = [f"{e.at.time()} {e.node} {e.kind} {e.message[:160]}" for e in store.events()]
        log = lab.node(SPARE).healthd_log.read_text().splitlines()[-30:]
        jobs = f"other: {squeue(lab, other_id)!r}, bound: {squeue(lab, job_id)!r}"
        raise AssertionError("\n".join([str(exc), jobs, *said, *log])) from None
    assert {r["refused"] for r in spare_events(store, "refused_job")} == {other_id}
    poll("the refusal's drain lifted", lambda: bool(spare_events(store, "refusal_lifted")),
         timeout=30)  # fmt: skip
    assert not drained(lab, SPARE)
    [record] = [r for r in store.drain_records(SPARE) if "spare.handed" in r.reason]
    assert (record.actor, record.closed_by, record.open) == ("spares", "spares", False)
    # Slurm requeues the refused job held, as a rule; on a loaded CI machine it was once
    # gone from the queue instead (what Slurm makes of a failed prolog is Slurm's). Medic's
    # part: it never runs on the spare (below).
    assert not squeue(lab, other_id).startswith(("RUNNING", "CONFIGURING"))
    gates = [e for e in store.events(SPARE, kind="gate") if e.target == f"job:{other_id}"]
    said = [f"{e.id} {e.node} {e.kind} {e.message[:160]}" for e in store.events()]
    assert gates and not any(g.evidence["allow"] for g in gates), "\n".join(said)

    # The bound run keeps the spare (it sleeps): once it ends the spare is free and the
    # other job, cleared of the reservation, may rightly run there (it did in CI).
    lab.slurm(["scontrol", "release", job_id])
    poll("the bound run on the spare", lambda: (home / "bound").exists(), timeout=30)
    assert (home / "bound").read_text().strip() == SPARE
    assert not (home / "other").exists(), "the other job's script ran on the spare"
    assert not squeue(lab, other_id).startswith(("RUNNING", "CONFIGURING"))
    gates = [e for e in store.events(SPARE, kind="gate") if e.target == f"job:{other_id}"]
    assert not any(g.evidence["allow"] for g in gates), gates

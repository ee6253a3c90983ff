"""Hot spares: a fault under a resilient job, from the fault to the job running again, on a
lab whose other nodes are all busy (Medic hands it the spare n5) against the same fault on
an idle lab (the queue places the job on any free node, no spare pool).

Each run: a resilient one-node job runs on n1 (busy: n2-n4 hold exclusive jobs, n5 is the
pool's spare, one more exclusive job waits in the queue); XID 95 is injected on n1's GPU 5
at t0; "running again" is the job's own mark of its next run (written by its script, with
the node it runs on), "pool refilled" is n1 back in the spare reservation after the ladder
reset the GPU and the deep tier passed (busy runs only). The lab runs with cred_expire=10.

The "bound_spare" mode (issue 22.8; needs a user without privileges, `--user`, e.g. the
lab tests' medic-mallory): the same busy run with the resilient job submitted by that user,
who, as soon as the spare's reservation `medic-spare-<job>` exists, submits a second
exclusive job naming it. Measured: whether Slurm accepted it, how long its script ran on the
spare (its own start mark to Medic's `refused_job` event), and the bound job's start on the
spare to the `released` event (the reservation deleted; from then on Slurm refuses it).

Prints one JSON object. Run: .venv/bin/python -m bench.spares --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cli.lab.cluster import SYSTEM_PATH, Lab, LabError, wait_for
from cli.lab.slurm_conf import LabSpec
from medic_core import proc

POOL = "medic-spares"
SPARE = "n5"
VICTIM = "n1"
BUSY = ("n2", "n3", "n4")


def spares_config(lab: Lab, path: Path, *, size: int = 1) -> Path:
    """The lab's medic.toml with a one-node pool: n5 to start with, n1 may refill it; the
    deep tier a spare passes is the lab's DCGM diagnostic. Lemon and fleet rails aside:
    the same fault on n1 run after run is what they stop."""
    text = lab.layout.medic_conf.read_text()
    rails = "[remediation]\nlemon_episodes = 1000\nfleet_signature_nodes = 1000\n"
    text = text.replace("[remediation]\n", rails, 1)
    if size:
        text += (
            f'\n[remediation.spares]\nsize = {size}\nnodes = ["{SPARE}", "{VICTIM}"]\n'
            'checks = ["deep_dcgm"]\n'
        )
    path.write_text(text)
    return path


def pool(lab: Lab) -> list[str]:
    out = lab.slurm(["scontrol", "-o", "show", "reservation", POOL], check=False)
    if out.returncode != 0:
        return []
    nodes = next((w for w in out.stdout.split() if w.startswith("Nodes=")), "Nodes=")
    hosts = lab.slurm(["scontrol", "show", "hostnames", nodes.removeprefix("Nodes=")])
    return hosts.stdout.split()


def submit(lab: Lab, *args: str) -> str:
    out = lab.slurm(["sbatch", "--parsable", *args])
    return out.stdout.strip().split(";")[0]


def in_service(lab: Lab, name: str) -> bool:
    found = next(n for n in lab.sinfo_nodes() if n["name"] == name)
    return "DRAIN" not in found["state_flags"] and str(found["state"]).upper() != "DOWN"


def one_run(lab: Lab, work: Path, busy: bool) -> dict[str, object]:
    """One fault under a resilient job on n1; the figures of that run."""
    work.mkdir(parents=True)
    fillers = []
    if busy:
        wait_for("the spare in the pool", lambda: pool(lab) == [SPARE], 60, 0.1)
        for name in BUSY:
            fillers.append(submit(lab, "--exclusive", "-N1", "-w", name, "--wrap", "sleep 900"))
    mark = f'echo "$SLURMD_NODENAME" > {work}/run-${{SLURM_RESTART_COUNT:-0}}'
    job_id = submit(lab, "--resilient=3", "--exclusive", "-N1", "--wrap", f"{mark}; sleep 900")
    wait_for("the job running", (work / "run-0").exists, 60, 0.02)
    first = (work / "run-0").read_text().strip()
    if busy:  # one more job waits for any node: without the spare's reservation it would win
        fillers.append(submit(lab, "--exclusive", "-N1", "--wrap", "sleep 900"))
    t0 = time.monotonic()
    lab.inject(first, 5, ["xid=95"])
    try:
        wait_for("the job running again", (work / "run-1").exists, 120, 0.02)
    except LabError:
        explain(lab)
        raise
    running = time.monotonic() - t0
    second = (work / "run-1").read_text().strip()
    figures: dict[str, object] = {"first": first, "again_on": second, "running_again_s": running}
    if busy:
        wait_for("the pool refilled", lambda: VICTIM in pool(lab), 180, 0.1)
        figures["pool_refilled_s"] = time.monotonic() - t0
    else:
        wait_for("the node back", lambda: in_service(lab, first), 180, 0.1)
    for job in [job_id, *fillers]:
        lab.slurm(["scancel", job])
    return figures


def explain(lab: Lab) -> None:
    """What Slurm and the store show when a run failed (to stderr)."""
    for argv in (["squeue", "-o", "%i %T %N %R %v"], ["scontrol", "-o", "show", "reservation"],
                 ["sinfo", "-N", "-o", "%N %T %E"]):  # fmt: skip
        print(lab.slurm(argv, check=False).stdout, file=sys.stderr)
    from medic_core.store import open_store

    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        for e in reversed(store.events(since=None, limit=60)):
            print(e.at, e.node, e.kind, e.message[:160], file=sys.stderr)


def submit_as(lab: Lab, user: str, home: Path, *args: str) -> proc.CommandResult:
    """sbatch as `user` (setpriv), working in `home`."""
    entry = pwd.getpwnam(user)
    argv = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
            "--", "sbatch", "--parsable", f"--chdir={home}", f"--output={home}/%j.out",
            *args]  # fmt: skip
    env = {"PATH": SYSTEM_PATH, "HOME": str(home), "LANG": "C.UTF-8", **lab.env()}
    return proc.run(argv, env=env, cwd=home, timeout=30)


def spare_event_at(lab: Lab, action: str, job: str) -> float | None:
    """Epoch seconds of the first spare event `action` about job `job` (refused or bound)."""
    from medic_core.store import open_store

    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        for e in reversed(store.events(kind="spare")):
            ev = e.evidence
            if ev.get("action") == action and job in (
                str(ev.get("refused")),
                str(ev.get("job_id")),
            ):
                return e.at.timestamp()
    return None


def bound_run(lab: Lab, home: Path, user: str) -> dict[str, object]:
    """One fault under the user's resilient job on n1 with n5 the only spare, and the same
    user's second job naming the spare's reservation as soon as it exists."""
    wait_for("the spare in the pool", lambda: pool(lab) == [SPARE], 60, 0.1)
    for name in BUSY:
        submit(lab, "--exclusive", "-N1", "-w", name, "--wrap", "sleep 900")
    mark = f'echo "$SLURMD_NODENAME" > {home}/run-${{SLURM_RESTART_COUNT:-0}}'
    bound = submit_as(lab, user, home, "--resilient=3", "--exclusive", "-N1", "--wrap",
                      f"{mark}; sleep 900")  # fmt: skip
    job_id = bound.stdout.strip().split(";")[0]
    wait_for("the job running", (home / "run-0").exists, 60, 0.02)
    submit(lab, "--exclusive", "-N1", "--wrap", "sleep 900")  # waits for any node
    name = f"medic-spare-{job_id}"
    t0 = time.monotonic()
    lab.inject(VICTIM, 5, ["xid=95"])

    def exists() -> bool:
        return lab.slurm(["scontrol", "show", "reservation", name], check=False).ok

    wait_for("the spare's reservation", lambda: exists() or (home / "run-1").exists(), 60, 0.01)
    other_mark = f'echo "$SLURMD_NODENAME" > {home}/other-${{SLURM_RESTART_COUNT:-0}}'
    other = submit_as(lab, user, home, f"--reservation={name}", "--exclusive", "-N1",
                      "--wrap", f"{other_mark}; sleep 900")  # fmt: skip
    other_id = other.stdout.strip().split(";")[0] if other.ok else ""
    wait_for("the job running again", (home / "run-1").exists, 120, 0.02)
    running = time.monotonic() - t0
    wait_for("the reservation released", lambda: not exists(), 60, 0.05)
    figures: dict[str, object] = {
        "again_on": (home / "run-1").read_text().strip(),
        "running_again_s": running,
        "other_accepted": bool(other_id),
    }
    released = spare_event_at(lab, "released", job_id)
    if released is not None:
        figures["bound_running_to_released_s"] = released - (home / "run-1").stat().st_mtime
    ran = home / "other-0"
    if other_id:
        wait_for("the other job refused", lambda: spare_event_at(lab, "refused_job", other_id)
                 is not None, 30, 0.05)  # fmt: skip
        refused = spare_event_at(lab, "refused_job", other_id)
        figures["other_ran_on"] = ran.read_text().strip() if ran.exists() else ""
        if ran.exists() and refused is not None:
            figures["other_on_spare_s"] = refused - ran.stat().st_mtime
    return figures


def measure_bound(runs: int, user: str) -> dict[str, object]:
    """Each run on a lab of its own below a directory every user may traverse (the user's
    sbatch reads slurm.conf); the user's jobs work in a directory of its own."""
    entry = pwd.getpwnam(user)
    again, released, on_spare, accepted = [], [], [], 0
    for _ in range(runs):
        top = Path(tempfile.mkdtemp(prefix="medic-bench-"))
        top.chmod(0o711)
        lab = Lab(top / "lab")
        lab.up(LabSpec(nodes=5))
        try:
            conf = spares_config(lab, top / "medic.toml")
            lab.start_healthd(SPARE, config=conf)
            wait_for("the spare in the pool", lambda: pool(lab) == [SPARE], 60, 0.1)  # noqa: B023
            for name in lab.node_names():
                if name != SPARE:
                    lab.start_healthd(name, config=conf)
            home = top / "home"
            home.mkdir()
            os.chown(home, entry.pw_uid, entry.pw_gid)
            got = bound_run(lab, home, user)
            print(f"bound_spare: {got}", file=sys.stderr)
            again.append(float(str(got["running_again_s"])))
            if "bound_running_to_released_s" in got:
                released.append(float(str(got["bound_running_to_released_s"])))
            if "other_on_spare_s" in got:
                on_spare.append(float(str(got["other_on_spare_s"])))
            accepted += bool(got["other_accepted"])
        finally:
            lab.down()
            shutil.rmtree(top, ignore_errors=True)
    result: dict[str, object] = {
        "fault_to_job_running_again": stats(again),
        "other_job_accepted": f"{accepted} of {runs}",
    }
    if released:
        result["bound_running_to_reservation_released"] = stats(released)
    if on_spare:
        result["other_job_on_the_spare_until_refused"] = stats(on_spare)
    return result


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_s": round(statistics.median(values), 2),
        "max_s": round(ordered[-1], 2),
    }


def measure(runs: int, only: tuple[str, ...] = ()) -> dict[str, object]:
    """The idle runs on one lab; each busy run on a lab of its own (a fresh pool, n5 joined
    by its daemon after the deep tier, as an operator would start one)."""
    figures: dict[str, object] = {"benchmark": "spares", "runs": runs, "cred_expire_seconds": 10}
    modes = (("idle_cluster_requeue", False), ("busy_cluster_spare", True))
    for label, busy in [m for m in modes if m[0] in only] if only else modes:
        running, refilled, where = [], [], []
        labs = runs if busy else 1
        per_lab = 1 if busy else runs
        for n in range(labs):
            with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
                lab = Lab(Path(tmp))
                lab.up(LabSpec(nodes=5))
                try:
                    conf = spares_config(lab, Path(tmp) / "medic.toml", size=1 if busy else 0)
                    # n5 first, in the pool before n1 (also listed) could join a short pool.
                    lab.start_healthd(SPARE, config=conf)
                    if busy:
                        wait_for(
                            "the spare in the pool", lambda lab=lab: pool(lab) == [SPARE], 60, 0.1
                        )
                    for name in lab.node_names():
                        if name != SPARE:
                            lab.start_healthd(name, config=conf)
                    for run in range(per_lab):
                        got = one_run(lab, Path(tmp) / f"{label}-{n}-{run}", busy)
                        print(f"{label}: {got}", file=sys.stderr)
                        running.append(float(str(got["running_again_s"])))
                        where.append(f"{got['first']}->{got['again_on']}")
                        if busy:
                            refilled.append(float(str(got["pool_refilled_s"])))
                finally:
                    lab.down()
        result: dict[str, object] = {"fault_to_job_running_again": stats(running), "moves": where}
        if refilled:
            result["fault_to_pool_refilled"] = stats(refilled)
        figures[label] = result
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", action="append", default=[], help="one mode's label")
    parser.add_argument("--user", default="", help="bound_spare: a user without privileges")
    args = parser.parse_args()
    if "bound_spare" in args.only and not args.user:
        parser.error("bound_spare needs --user: a user without privileges (e.g. medic-mallory)")
    only = tuple(o for o in args.only if o != "bound_spare")
    figures: dict[str, object] = {"benchmark": "spares"}
    if only or not args.only:
        figures = measure(args.runs, only)
    if args.user and (not args.only or "bound_spare" in args.only):
        figures["bound_spare"] = measure_bound(args.runs, args.user)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

"""A scripted day on the lab (issue 13's proof): resilient jobs, a dozen faults of different
classes, one lemon node, then `medic report` checked against what was measured.

Each job is a real resilient Slurm job that trains in steps of 0.1 s through Medic's
checkpoint helper (a commit every 10 steps, progress heartbeats, the resume mark after a
requeue). Faults come one after the other, each on the node of the job it is aimed at:

    xid=N       NVML's XID event and the driver's NVRM line in the node's kernel log
    kmsg:N      the NVRM line only (the kernel log is the only sensor that sees it)
    ecc.dbe     a double-bit ECC error NVML counts (no sensor time: detection unknown)
    hang        the job blocks (a rank stuck in a collective); the hang watch finds it

The lemon job is pinned to the lemon node (`--nodelist`), so the lemon's faults all land
there: at its third episode in the lemon window the ladder sends it to RMA, and the pinned
job waits for it (the report shows it not running again).

Measured for each fault: `fault` (the script's clock just before it injects, or the time
the job wrote when it blocked) and `resumed` (the time in the checkpoint helper's resume
mark of the job's next run). `medic report --json` then gives each interruption's
components; for a fault the report can date, detection + isolation + scheduling + restart
must equal resumed - fault within 1 s. For an undated one (ECC) the report's wall time
starts when Medic knew: what it misses is its unknown detection, printed as `gap_s`.

Prints one JSON object. Run: .venv/bin/python -m bench.scripted_day [--html PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.lab import scenario
from cli.lab.cluster import Lab, LabError, wait_for
from cli.lab.slurm_conf import LabSpec
from healthd.kmsg import format_record, parse_records, read_boot_wall
from medic_core import journal, proc
from medic_core.config import NodePaths
from medic_core.store import open_store
from slurm_hooks.checkpoint import CheckpointDir

TOLERANCE_S = 1.0
JOB = """\
import json, sys, time
from pathlib import Path
from slurm_hooks.checkpoint import CheckpointDir, progress, restart_count

ckpt = CheckpointDir()
last = ckpt.resume_step()  # a restarted run marks when it resumed, and from which step
hang = Path(sys.argv[1])
for step in range(0 if last is None else last + 1, 10**9):
    progress(step)
    if step % 10 == 0:
        with ckpt.writing(step) as tmp:
            (tmp / "w").write_text(str(step))
    if hang.exists() and hang.read_text().strip() == str(restart_count()):
        (hang.parent / (hang.name + ".at")).write_text(json.dumps({"time": time.time()}))
        import os
        os.read(os.pipe()[0], 1)  # blocks for ever: the hang
    time.sleep(0.1)
"""

# The full day: (job, fault). Jobs a-d run anywhere but the lemon; "lemon" is pinned there.
DAY: tuple[tuple[str, str], ...] = (
    ("a", "xid=79"),
    ("b", "xid=95"),
    ("lemon", "xid=95"),
    ("c", "kmsg:79"),
    ("d", "xid=13"),
    ("a", "ecc.dbe"),
    ("b", "hang"),
    ("lemon", "xid=48"),
    ("c", "xid=95"),
    ("d", "kmsg:95"),
    ("a", "xid=31"),
    ("lemon", "xid=95"),
)
SHORT: tuple[tuple[str, str], ...] = (("a", "xid=79"), ("b", "kmsg:95"), ("a", "xid=13"))
LEMON_NODE = "n2"


@dataclasses.dataclass
class Job:
    name: str
    job_id: str
    ckpt: Path
    hang_flag: Path


def day_config(lab: Lab, path: Path, *, hangs: bool = True) -> Path:
    """The lab's medic.toml with the fleet-wide signature rail out of the way (a dozen faults
    on six nodes in minutes would pause the fleet: that rail is for storms, not for this day)
    and, for a day with a hang in it (`hangs`), the hang watch's small thresholds
    (tests/test_hang_lab.py). A day without one keeps the default 60 s floor: at 2 s a CI
    machine at load 16 stalls a healthy job long enough to be judged hung."""
    text = lab.layout.medic_conf.read_text()
    if hangs:
        hang = "hang_floor = 2.0\nhang_factor = 3.0\nhang_poll = 0.2\nhang_min_steps = 3\n"
        text = text.replace("[healthd]\n", f"[healthd]\n{hang}", 1)
    text = text.replace("[remediation]\n", "[remediation]\nfleet_signature_nodes = 1000\n", 1)
    path.write_text(text)
    return path


def squeue(lab: Lab, job_id: str) -> dict[str, Any]:
    jobs = json.loads(lab.slurm(["squeue", "--json", "--jobs", job_id]).stdout)["jobs"]
    found: dict[str, Any] = next(j for j in jobs if str(j["job_id"]) == job_id)
    return found


def submit(lab: Lab, work: Path, name: str, where: Sequence[str]) -> Job:
    script = work / "train.py"
    if not script.exists():
        script.write_text(JOB)
    ckpt, flag = work / f"ckpt-{name}", work / f"hang-{name}"
    env = lab.process_env()
    env.update({"MEDIC_CHECKPOINT_DIR": str(ckpt), "PYTHONPATH": str(Path(__file__).parents[1])})
    out = proc.run(
        ["sbatch", "--parsable", "--resilient=20", "-N1", "--exclusive", f"--job-name=day-{name}",
         f"--output={work / f'{name}.out'}", "--open-mode=append", *where,
         "--wrap", f"{sys.executable} {script} {flag}"],
        timeout=15, env=env, check=True,
    )  # fmt: skip
    return Job(name, out.stdout.strip().split(";")[0], ckpt, flag)


def running(lab: Lab, job: Job, restarts: int) -> dict[str, Any] | None:
    """The job's squeue entry once its run number `restarts` runs and (after a restart) has
    marked its resume; None before."""
    info = squeue(lab, job.job_id)
    if info["job_state"] != "RUNNING" or int(info["restart_cnt"]) != restarts:
        return None
    marks = [r for r in CheckpointDir(job.ckpt).resumes() if r.restart_count == restarts]
    return info if marks or not restarts else None


def _kmsg_line(lab: Lab, node: str, gpu: int, xid: int) -> tuple[float, str]:
    """An NVRM Xid record after the node's last one, stamped now (CLOCK_MONOTONIC)."""
    kmsg = lab.node(node).host_root / "dev/kmsg"
    records, _ = parse_records(kmsg.read_text() if kmsg.exists() else "")
    seq = max((r.seq for r in records), default=0) + 1
    now = scenario.read_scenario(lab.node(node).scenario)
    bus = now.gpus[gpu].pci_bus_id.lower()
    pci = "0000:" + bus.split(":", 1)[1].rsplit(".", 1)[0]
    # The wall time and the stamp from one mapping, read as the daemon reads it: two plain
    # reads a preemption apart put a loaded CI run's fault 7 ms off the report's.
    boot = read_boot_wall(time.monotonic, time.time)
    stamp_us = int(time.monotonic() * 1e6)
    line = format_record(
        seq,
        f"NVRM: Xid (PCI:{pci}): {xid}, pid=0, name=lab, in the kernel log only",
        level=4,
        timestamp_us=stamp_us,
    )
    return boot + stamp_us / 1e6, line


def inject(lab: Lab, job: Job, node: str, fault: str) -> float:
    """Cause `fault` on `node` (GPU 0) for `job`; the wall time it happened."""
    if fault == "hang":
        job.hang_flag.write_text(str(squeue(lab, job.job_id)["restart_cnt"]))
        at = job.hang_flag.with_name(job.hang_flag.name + ".at")
        wait_for("the job to block", at.exists, 30, 0.05)
        happened = float(json.loads(at.read_text())["time"])
        at.unlink()
        return happened
    if fault.startswith("kmsg:"):
        wall, line = _kmsg_line(lab, node, 0, int(fault.split(":")[1]))
        with (lab.node(node).host_root / "dev/kmsg").open("a") as log:
            log.write(line)
        return wall
    spec = "ecc.dbe=1" if fault == "ecc.dbe" else fault
    wall = time.time()
    lab.inject(node, 0, [spec])
    return wall


def in_service(lab: Lab, node: str) -> bool:
    n = next(x for x in lab.sinfo_nodes() if x["name"] == node)
    return "DRAIN" not in n["state_flags"] and str(n["state"]).upper() in (
        "IDLE", "MIXED", "ALLOCATED",
    )  # fmt: skip


def run_day(
    lab: Lab,
    work: Path,
    plan: Sequence[tuple[str, str]],
    *,
    lemon: str | None = LEMON_NODE,
    recovery_timeout: float = 90.0,
) -> list[dict[str, Any]]:
    """Run `plan` on a lab whose daemons run `day_config`; one record per fault."""
    names = sorted({j for j, _ in plan})
    jobs: dict[str, Job] = {}
    for name in names:
        if name == "lemon":
            assert lemon is not None
            jobs[name] = submit(lab, work, name, [f"--nodelist={lemon}"])
        else:
            jobs[name] = submit(lab, work, name, [f"--exclude={lemon}"] if lemon else [])
    restarts = dict.fromkeys(names, 0)
    for job in jobs.values():
        wait_for(f"job {job.name} running", lambda j=job: running(lab, j, 0), 60, 0.1)
    faults = []
    for name, fault in plan:
        faults.append(one_fault(lab, jobs[name], fault, restarts[name], recovery_timeout))
        restarts[name] += 1
    return faults


def one_fault(lab: Lab, job: Job, fault: str, run: int, timeout: float) -> dict[str, Any]:
    """`fault` on the node of `job`'s run number `run`: when it happened, when the job's
    next run resumed, and the node back in service (or not, for an RMA) before the next."""

    def stepping() -> bool:  # ten steps into this run: the hang watch has timed its pace
        return bool(running(lab, job, run)) and _commits(job, run) >= 2

    wait_for("steps", stepping, 60, 0.1)
    node = str(squeue(lab, job.job_id)["nodes"])
    happened = inject(lab, job, node, fault)
    record: dict[str, Any] = {"job": job.name, "job_id": job.job_id, "fault": fault,
                              "node": node, "fault_at": happened, "resumed_at": None}  # fmt: skip
    try:
        wait_for(f"job {job.name} again after {fault}", lambda: running(lab, job, run + 1),
                 timeout, 0.1)  # fmt: skip
    except LabError:
        print(f"{fault} on {node} ({job.name}): not running again", file=sys.stderr)
        return record
    [mark] = [r for r in CheckpointDir(job.ckpt).resumes() if r.restart_count == run + 1]
    record["resumed_at"] = mark.time
    record["measured_wall_s"] = round(mark.time - happened, 3)
    print(f"{fault} on {node} ({job.name}): running again after {mark.time - happened:.2f} s",
          file=sys.stderr)  # fmt: skip
    # The next fault on a node the ladder is still repairing would join its episode.
    try:
        wait_for(f"{node} back in service", lambda: in_service(lab, node), timeout, 0.2)
    except LabError:
        record["node_back"] = False
        print(f"{node} not back in service after {timeout:.0f} s", file=sys.stderr)
    return record


def _commits(job: Job, restarts: int) -> int:
    """Checkpoints the job's run number `restarts` committed (one every 10 steps)."""
    return sum(1 for c in CheckpointDir(job.ckpt).checkpoints() if c.restart_count == restarts)


def report_argv(lab: Lab, since: float, jobs: dict[str, str], work: Path) -> list[str]:
    """`medic report` over the day with each job's checkpoint directory."""
    window = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since - 60))
    argv = [str(Path(sys.executable).parent / "medic"), "report", "--since", window,
            "--store", f"sqlite:///{lab.layout.store_db}"]  # fmt: skip
    for job_id, name in jobs.items():
        argv += ["--checkpoints", f"{job_id}={work / f'ckpt-{name}'}"]
    return argv


def report_json(lab: Lab, since: float, jobs: dict[str, str], work: Path) -> dict[str, Any]:
    """`medic report --json` over the day, as an operator would run it: once the store has
    what the nodes hold. A daemon writes its queued gate decisions within 2 s (the gate
    recorder's linger) or at once when it stops; the day is over, so each node's daemon is
    stopped first and the newest restarts' decisions are in the store."""
    for name in lab.node_names():
        lab.stop_healthd(name)
    deliver_journals(lab)
    out = proc.run([*report_argv(lab, since, jobs, work), "--json"], timeout=60, check=True)
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def deliver_journals(lab: Lab) -> None:
    """What each node's journal still holds (a daemon that could not write it in its exit
    grace, a prolog that found the store locked), into the store: on a fleet the health
    check does this every interval, 60 s in the lab, and the day is over now."""
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        for name in lab.node_names():
            node = lab.layout.node(name)
            paths = NodePaths(state_dir=node.state_dir, socket=node.socket)
            done = journal.replay(paths, lambda e: store.add_event(**e.store_fields()))
            if done.delivered or done.left or done.set_aside:
                print(f"{name}: journal: {done.delivered} delivered, {done.left} left"
                      f" {done.stopped} {done.set_aside}", file=sys.stderr)  # fmt: skip


def compare(faults: list[dict[str, Any]], report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each fault beside the report's interruption of its job that it caused: components,
    their sum, and the sum's error against the measured wall time."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for job in report["jobs"]:
        by_job[str(job["job_id"])] = list(job["interruptions"])
    rows = []
    for f in faults:
        candidates = by_job.get(f["job_id"], [])
        # The job's interruptions come in order; this fault's is the first one left.
        i = candidates.pop(0) if candidates else None
        row = {k: f[k] for k in ("job", "fault", "node")}
        if i is None:
            row["report"] = "missing"
            rows.append(row)
            continue
        parts = {k: i[f"{k}_s"] for k in ("detection", "isolation", "scheduling", "restart")}
        total = sum(v for v in parts.values() if v is not None)
        row.update({k: v for k, v in parts.items()})
        row.update({"fault_class": i["fault_class"], "wall_s": i["wall_s"],
                    "components_sum_s": round(total, 3), "lost_work_s": i["lost_work_s"],
                    "recovered": i["recovered"]})  # fmt: skip
        if f.get("measured_wall_s") is not None and i["recovered"]:
            row["measured_wall_s"] = f["measured_wall_s"]
            if parts["detection"] is None:
                row["gap_s"] = round(f["measured_wall_s"] - total, 3)  # the unknown detection
            else:
                row["error_s"] = round(total - f["measured_wall_s"], 3)
        rows.append(row)
    return rows


def measure(plan: Sequence[tuple[str, str]], html: Path | None) -> dict[str, Any]:
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="medic-day-") as tmp:
        lab = Lab(Path(tmp) / "lab")
        lab.up(LabSpec(nodes=6))
        try:
            work = Path(tmp) / "work"
            work.mkdir()
            # The lab's own medic.toml: a simulated reboot restarts the node's daemon with it.
            day_config(lab, lab.layout.medic_conf)
            for name in lab.node_names():
                lab.start_healthd(name)
            faults = run_day(lab, work, plan)
            jobs = {f["job_id"]: f["job"] for f in faults}
            report = report_json(lab, started, jobs, work)
            if html is not None:  # the page, and beside it the store and jobs it shows
                argv = [*report_argv(lab, started, jobs, work), "--html", str(html)]
                proc.run(argv, timeout=60, check=True)
                shutil.copy(lab.layout.store_db, html.with_suffix(".db"))
                shutil.copytree(work, html.with_suffix(".work"), dirs_exist_ok=True)
        finally:
            lab.down()
    rows = compare(faults, report)
    errors = [abs(r["error_s"]) for r in rows if "error_s" in r]
    fleet = report["fleet"]
    return {
        "benchmark": "scripted_day",
        "faults": len(plan),
        "seconds": round(time.time() - started, 1),
        "interruptions": rows,
        "dated": len(errors),
        "max_sum_error_s": max(errors, default=None),
        "mttr_s": report["mttr_s"],
        "lemons": [n["node"] for n in fleet["by_node"] if n.get("lemon")],
        "rma_s": fleet.get("rma_s"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--short", action="store_true", help="three faults, not the day")
    parser.add_argument(
        "--html", type=Path, help="also write the HTML page (and its store PATH.db, jobs PATH.work)"
    )
    args = parser.parse_args()
    print(json.dumps(measure(SHORT if args.short else DAY, args.html)))


if __name__ == "__main__":
    main()

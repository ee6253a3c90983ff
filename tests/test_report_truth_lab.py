"""Issue 22's "done when" for the report, on the lab's real Slurm and medic-healthd: a
resilient job that commits every step and runs `prune(keep=2)` after each commit (as
docs/resilient-jobs.md recommends), interrupted twice, gets a `medic report` whose lost work
and ETTR agree with a hand computation from the job's own log within 1 %.

The faults are kernel-log XIDs (`kmsg:79`): the report dates them by the kernel log's stamp,
which this test writes, so the fault time both sides use is the same to microseconds."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.scripted_day import (
    Job,
    day_config,
    in_service,
    inject,
    report_json,
    running,
    squeue,
)
from cli.lab.cluster import Lab, wait_for
from medic_core import proc
from slurm_hooks.checkpoint import CheckpointDir

STEPS = 1500  # 0.1 s each and a commit: long enough to outlast two node repairs
PRUNING_JOB = """\
import json, os, sys, time
from pathlib import Path
from slurm_hooks.checkpoint import CheckpointDir, restart_count, step_name

ckpt = CheckpointDir()
log = Path(sys.argv[1]).open("a")
def say(what, **values):
    log.write(json.dumps({"what": what, "run": restart_count(), **values}) + "\\n")
    log.flush()

last = ckpt.resume_step()  # a restarted run marks when it resumed, and from which step
say("resumed", at=time.time(), step=last)
stop = Path(sys.argv[2])
for step in range(0 if last is None else last + 1, STEPS):
    time.sleep(0.1)  # the step's work
    if stop.exists() and stop.read_text().strip() == str(restart_count()):
        say("stopped", at=time.time())  # its GPU is gone: the step is never committed
        os.read(os.pipe()[0], 1)
    with ckpt.writing(step) as tmp:
        (tmp / "w").write_text(str(step))
    committed = ckpt.load(ckpt.root / step_name(step))
    say("committed", at=committed.time, step=step)
    ckpt.prune(keep=2)
say("done", at=time.time())
""".replace("STEPS", str(STEPS))


def _next_run(lab: Lab, job: Job, after: int) -> int | None:
    """The restart count of the job's run after run `after`, once it runs and has marked its
    resume; None before. Not always `after` + 1: a launch its prolog refused in between
    counts in Slurm's restart count too (its script never ran: the job's log skips it)."""
    info = squeue(lab, job.job_id)
    count = int(info.get("restart_cnt") or 0) if info.get("job_state") == "RUNNING" else -1
    return count if count > after and running(lab, job, count) else None


def _log(path: Path) -> list[dict[str, Any]]:
    """The job's log so far ([] before it started); a line being written is left out."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines(True) if line.endswith("\n")]


@pytest.mark.timeout(900)
def test_a_pruning_job_interrupted_twice_is_reported_as_its_log_says(
    lab: Lab, tmp_path: Path
) -> None:
    conf = day_config(lab, tmp_path / "medic.toml", hangs=False)
    for name in lab.node_names():
        lab.start_healthd(name, config=conf)
    started = time.time()
    work = tmp_path / "work"
    work.mkdir()
    script, ckpt, log = work / "train.py", work / "ckpt-prune", work / "job.log"
    stop = work / "stop"
    script.write_text(PRUNING_JOB)
    env = lab.process_env()
    env.update({"MEDIC_CHECKPOINT_DIR": str(ckpt), "PYTHONPATH": str(Path(__file__).parents[1])})
    out = proc.run(
        ["sbatch", "--parsable", "--resilient=5", "-N1", "--exclusive", "--job-name=prune",
         f"--output={work / 'prune.out'}", "--open-mode=append",
         "--wrap", f"{sys.executable} {script} {log} {stop}"],
        timeout=15, env=env, check=True,
    )  # fmt: skip
    job_id = out.stdout.strip().split(";")[0]

    job = Job("prune", job_id, ckpt, work / "hang-prune")
    faults = []
    run = 0  # Slurm's restart count of the run now: a launch refused in between adds one
    for _ in range(2):
        wait_for(f"run {run} committing", lambda r=run: running(lab, job, r) and sum(
            1 for e in _log(log) if e["what"] == "committed" and e["run"] == r) >= 30,
            120, 0.1)  # fmt: skip
        node = str(squeue(lab, job_id)["nodes"])
        # A GPU that falls off the bus stops the job's CUDA work at once: the job stops
        # mid-step (never committing it), then the XID comes.
        stop.write_text(str(run))
        wait_for("the job to stop", lambda r=run: any(
            e["what"] == "stopped" and e["run"] == r for e in _log(log)), 30, 0.02)  # fmt: skip
        faults.append(inject(lab, job, node, "kmsg:79"))  # the whole node: every job on it
        wait_for(f"the run after run {run}", lambda r=run: _next_run(lab, job, r) is not None,
                 120, 0.1)  # fmt: skip
        run = _next_run(lab, job, run) or run + 1
        # A second fault while the first node is still out would meet the drain cap.
        wait_for(f"{node} back in service", lambda n=node: in_service(lab, n), 180, 0.2)
    wait_for("the job to finish", lambda: any(e["what"] == "done" for e in _log(log)), 400, 0.2)
    wait_for("the job to leave Slurm", lambda: squeue(lab, job_id)["job_state"] != "RUNNING",
             30, 0.2)  # fmt: skip
    assert len(list(ckpt.glob("step-*"))) == 2  # pruned as it went

    # By hand, from the job's log: the work since the commit of the step each next run
    # resumed from is done again; the job is down from the fault to that run's resume.
    entries = _log(log)
    resumes = [e for e in entries if e["what"] == "resumed"]
    commit_at = {e["step"]: e["at"] for e in entries if e["what"] == "committed"}
    lost = [f - commit_at[r["step"]] for f, r in zip(faults, resumes[1:], strict=True)]
    assert all(x > 0 for x in lost)  # the job stopped before the fault: some work is lost
    down = sum(r["at"] - f for f, r in zip(faults, resumes[1:], strict=True))

    report = report_json(lab, started, {job_id: "prune"}, work)
    [found] = [j for j in report["jobs"] if str(j["job_id"]) == job_id]
    interruptions = found["interruptions"]
    print(json.dumps({"hand_lost": lost, "report_lost": [i["lost_work_s"] for i in interruptions],
                      "detection": [i["detection_s"] for i in interruptions],
                      "report_ettr": found["ettr"], "wall": found["wall_s"]}))  # fmt: skip
    assert [i["resumed_from_step"] for i in interruptions] == [r["step"] for r in resumes[1:]]
    # Each fault is dated by its kernel-log line: lost work runs to it, not to Medic's knowing.
    assert all(i["detection_s"] is not None for i in interruptions), interruptions
    assert [i["lost_work_s"] for i in interruptions] == pytest.approx(lost, rel=0.01)
    # ETTR over the report's wall (its first prolog to its last epilog): what is left after
    # the outages and the lost work of the job's own log.
    wall = float(found["wall_s"])
    assert found["ettr"] == pytest.approx((wall - down - sum(lost)) / wall, rel=0.01)
    assert not found["ettr_is_upper_bound"]
    assert CheckpointDir(ckpt).ledger()  # what the report read

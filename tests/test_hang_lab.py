"""Hangs on the lab (issue 14, part 1): real slurmctld and slurmd, the real medic-healthd
on the node, a real resilient job that reports its steps through the checkpoint helper's
heartbeat, then blocks (a read nobody will ever answer, as a rank stuck in a collective).

The daemon runs with small thresholds (floor 2 s, k 3, a look every 0.2 s): the job is
requeued from its last checkpoint and runs again within 2 x the threshold + 5 s of its last
step, the node stays in service, the restart is charged once. The same for a 2-node job
whose rank on one node blocks while the other waits for it in a "collective" (issue 14's
lab proof).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from cli.lab import scenario
from cli.lab.cluster import Lab
from medic_core.store import open_store
from remediation.decide import Ledger
from slurm_hooks.checkpoint import CheckpointDir
from tests.conftest import poll
from tests.lab_views import drained_by_medic, job, node_info

FLOOR = 2.0  # hang_floor: the threshold here (k x median = 3 x 0.1 s is below it)
HUNG_AT = 25  # the step after which the first run blocks

JOB = """\
import os, sys, time
from slurm_hooks.checkpoint import CheckpointDir, progress, restart_count

ckpt = CheckpointDir()
last = ckpt.resume_step()  # a restarted run marks when it resumed, and from which step
first = 0 if last is None else last + 1
print(f"run={restart_count()} resume={last}", flush=True)
for step in range(first, first + 1000):
    progress(step)
    if step % 10 == 0:
        with ckpt.writing(step) as tmp:
            (tmp / "w").write_text(str(step))
    if restart_count() == 0 and step == HUNG_AT:
        with open(sys.argv[1], "w") as f:
            json.dump({"time": time.time(), "pid": os.getpid()}, f)
        r, w = os.pipe()
        os.read(r, 1)  # blocks for ever: the hang
    if restart_count() > 0 and step >= first + 5:
        break
    time.sleep(0.1)
print(f"done at {step}", flush=True)
""".replace("HUNG_AT", str(HUNG_AT)).replace("import os, sys", "import json, os, sys")


def test_a_hung_resilient_job_is_requeued_and_resumes_from_its_checkpoint(
    lab: Lab, tmp_path: Path
) -> None:
    conf = tmp_path / "medic.toml"
    extra = f"hang_floor = {FLOOR}\nhang_factor = 3.0\nhang_poll = 0.2\nhang_min_steps = 3\n"
    conf.write_text(
        lab.layout.medic_conf.read_text().replace("[healthd]\n", f"[healthd]\n{extra}", 1)
    )
    lab.start_healthd("n1", config=conf)
    script, hung, out, ckpt_dir = (tmp_path / n for n in ("train.py", "hung", "out", "ckpt"))
    script.write_text(JOB)
    env = lab.process_env()
    env.update(
        {"MEDIC_CHECKPOINT_DIR": str(ckpt_dir), "PYTHONPATH": str(Path(__file__).parents[1])}
    )
    others = ",".join(n for n in lab.node_names() if n != "n1")
    from medic_core import proc

    submitted = proc.run(
        ["sbatch", "--parsable", "--resilient=2", f"--exclude={others}", f"--output={out}",
         "--open-mode=append", "--wrap", f"{sys.executable} {script} {hung}"],
        timeout=15, env=env, check=True,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    # A hung collective often spins: GPU 3 at 100 % (written into the node's scenario, which
    # the injection library reads; `medic lab inject` has no spec for utilisation).
    node_scenario = lab.layout.node("n1").scenario
    now = scenario.read_scenario(node_scenario)
    gpus = tuple(
        dataclasses.replace(g, util_gpu=100) if i == 3 else g for i, g in enumerate(now.gpus)
    )
    scenario.write_scenario(node_scenario, dataclasses.replace(now, gpus=gpus))
    poll("the job to hang", hung.exists, timeout=60)
    stopped = json.loads(hung.read_text())["time"]
    checkpoints = CheckpointDir(ckpt_dir)
    poll("the job to run again", lambda: bool(checkpoints.resumes()), timeout=30)
    [resumed] = checkpoints.resumes()
    recovery = resumed.time - stopped
    print(f"\nlast step -> running again from its checkpoint: {recovery:.2f} s "
          f"(threshold {FLOOR:g} s, budget {2 * FLOOR + 5:g} s)")  # fmt: skip
    assert recovery <= 2 * FLOOR + 5
    assert resumed.step == 20  # the last checkpoint before the hang at step 25
    poll("the job to complete", lambda: job(lab, job_id)["job_state"] == "COMPLETED", timeout=30)
    runs = [line for line in out.read_text().splitlines() if line.startswith("run=")]
    assert runs == ["run=0 resume=None", "run=1 resume=20"]
    info = job(lab, job_id)
    assert not drained_by_medic(lab, "n1")  # a job fault: the node stays in service
    assert Ledger.parse(str(info.get("admin_comment") or "")) == Ledger(1, ("run0",))
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        events = [e for e in store.events("n1", kind="job_action") if e.target == f"job:{job_id}"]
    [hang] = [e for e in events if e.evidence.get("action") == "hang"]
    assert hang.fault_class == "job.hang" and hang.evidence["step"] == HUNG_AT
    assert FLOOR <= hang.evidence["stalled_s"] < FLOOR + 1.5
    assert hang.evidence["threshold_s"] == FLOOR
    assert 0.05 < hang.evidence["median_step_s"] < 0.5
    assert [e.evidence["action"] for e in events].count("requeued") == 1
    # The lab's /proc below the node's host tree is a fixture: the job's pid is not there
    # (evidence from the real /proc: tests/test_hang.py).
    assert hang.evidence["processes"] == []
    assert "not found under" in hang.evidence["problems"][0]
    gpus = {g["index"]: g for g in hang.evidence["gpus"]}
    assert len(gpus) == 8 and gpus[3]["gpu_pct"] == 100 and gpus[0]["gpu_pct"] == 0
    assert hang.evidence["evidence_s"] < 1.0  # measured 1-3 ms: stacks, wchan, 8 GPUs


# Two ranks, one per node, that step together as in data-parallel training: before each
# step a rank waits for the other to reach it (as a collective does). The rank on the
# blocking node blocks after step 25; the other then waits for ever in its "collective".
JOB_2N = """\
import json, os, sys, time
from pathlib import Path
from typing import Any
from slurm_hooks.checkpoint import CheckpointDir, progress, restart_count

hung_mark, blocking_node, sync = sys.argv[1], sys.argv[2], Path(sys.argv[3])
rank, node, run = int(os.environ["SLURM_PROCID"]), os.environ["SLURMD_NODENAME"], restart_count()
ckpt = CheckpointDir()
last = ckpt.resume_step()
first = 0 if last is None else last + 1
print(f"run={run} rank={rank} node={node} resume={last}", flush=True)


def collective(step):
    mine = sync / f"{run}.{rank}"
    (sync / f".{run}.{rank}").write_text(str(step))
    os.replace(sync / f".{run}.{rank}", mine)
    other = sync / f"{run}.{1 - rank}"
    while True:
        try:
            if int(other.read_text()) >= step:
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.01)


for step in range(first, first + 1000):
    collective(step)
    progress(step)
    if rank == 0 and step % 10 == 0:
        with ckpt.writing(step) as tmp:
            (tmp / "w").write_text(str(step))
    if run == 0 and node == blocking_node and step == HUNG_AT:
        with open(hung_mark, "w") as f:
            json.dump({"time": time.time(), "pid": os.getpid()}, f)
        os.read(os.pipe()[0], 1)  # blocks for ever: the hang
    if run > 0 and step >= first + 5:
        break
    time.sleep(0.1)
print(f"rank {rank} done at {step}", flush=True)
""".replace("HUNG_AT", str(HUNG_AT))


def test_a_two_node_job_whose_rank_on_one_node_blocks_is_requeued_once(
    lab: Lab, tmp_path: Path
) -> None:
    """Issue 14's lab proof: a 2-node resilient job whose process on one node blocks (and
    the other's then waits in its collective) is requeued and resumes within 2 x the
    threshold + 5 s. Both nodes' daemons see the hang; the restart is charged once."""
    conf = tmp_path / "medic.toml"
    extra = f"hang_floor = {FLOOR}\nhang_factor = 3.0\nhang_poll = 0.2\nhang_min_steps = 3\n"
    conf.write_text(
        lab.layout.medic_conf.read_text().replace("[healthd]\n", f"[healthd]\n{extra}", 1)
    )
    for name in ("n1", "n2"):
        lab.start_healthd(name, config=conf)
    script, hung, out, ckpt_dir = (tmp_path / n for n in ("train.py", "hung", "out", "ckpt"))
    sync = tmp_path / "sync"
    sync.mkdir()
    script.write_text(JOB_2N)
    env = lab.process_env()
    env.update(
        {"MEDIC_CHECKPOINT_DIR": str(ckpt_dir), "PYTHONPATH": str(Path(__file__).parents[1])}
    )
    others = ",".join(n for n in lab.node_names() if n not in ("n1", "n2"))
    from medic_core import proc

    run = f"srun --ntasks-per-node=1 {sys.executable} {script} {hung} n2 {sync}"
    submitted = proc.run(
        ["sbatch", "--parsable", "--resilient=2", "-N2", f"--exclude={others}",
         f"--output={out}", "--open-mode=append", "--wrap", run],
        timeout=15, env=env, check=True,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    poll("the rank on n2 to hang", hung.exists, timeout=60)
    stopped = json.loads(hung.read_text())["time"]
    checkpoints = CheckpointDir(ckpt_dir)
    poll("the job to run again", lambda: bool(checkpoints.resumes()), timeout=30)
    recovery = checkpoints.resumes()[0].time - stopped
    print(f"\n2 nodes: last step -> running again from its checkpoint: {recovery:.2f} s "
          f"(threshold {FLOOR:g} s, budget {2 * FLOOR + 5:g} s)")  # fmt: skip
    assert recovery <= 2 * FLOOR + 5
    assert {r.step for r in checkpoints.resumes()} == {20}
    poll("the job to complete", lambda: job(lab, job_id)["job_state"] == "COMPLETED", timeout=30)
    runs = sorted(line for line in out.read_text().splitlines() if line.startswith("run="))
    assert runs == [
        "run=0 rank=0 node=n1 resume=None",
        "run=0 rank=1 node=n2 resume=None",
        "run=1 rank=0 node=n1 resume=20",
        "run=1 rank=1 node=n2 resume=20",
    ]
    info = job(lab, job_id)
    assert info["restart_cnt"] == 1
    assert Ledger.parse(str(info.get("admin_comment") or "")) == Ledger(1, ("run0",))
    assert not drained_by_medic(lab, "n1") and not drained_by_medic(lab, "n2")
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        hangs = {
            name: [
                e
                for e in store.events(name, kind="job_action")
                if e.target == f"job:{job_id}" and e.evidence.get("action") == "hang"
            ]
            for name in ("n1", "n2")
        }
    # Whichever daemon saw it first requeued the job; the other then found it no longer
    # running there (seen: n2 at 2.08 s, n1 nothing) and charged nothing.
    assert any(hangs.values())
    for events in hangs.values():
        assert all(e.evidence["step"] == HUNG_AT for e in events)


# Two ranks in lockstep again; the rank on the slow node works 3x longer per step (0.3 s
# against 0.1 s), so both step every ~0.3 s: only the busy time tells the nodes apart.
JOB_SLOW = """\
import os, sys, time
from pathlib import Path
from typing import Any
from slurm_hooks.checkpoint import progress

slow_node, sync = sys.argv[1], Path(sys.argv[2])
rank, node = int(os.environ["SLURM_PROCID"]), os.environ["SLURMD_NODENAME"]
work = 0.3 if node == slow_node else 0.1


def collective(step):
    (sync / f".{rank}").write_text(str(step))
    os.replace(sync / f".{rank}", sync / str(rank))
    while True:
        try:
            if int((sync / str(1 - rank)).read_text()) >= step:
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.005)


for step in range(40):
    started = time.monotonic()
    time.sleep(work)  # this node's share of the step
    busy = time.monotonic() - started
    collective(step)
    progress(step, busy)
print(f"rank {rank} on {node} done", flush=True)
"""


def test_a_two_node_job_with_one_slow_node_flags_that_node_and_drains_it_after_the_job(
    lab: Lab, tmp_path: Path
) -> None:
    conf = tmp_path / "medic.toml"
    # straggler_drain_jobs = 1: drained after its first slow job (the default waits for 2).
    # The ladder is off: the drain is the decision core's; no reboot follows in this test.
    extra = (
        "hang_poll = 0.2\nstraggler_every = 1.0\nstraggler_ratio = 1.5\nstraggler_repeats = 2\n"
        "straggler_drain_jobs = 1\n"
    )
    text = lab.layout.medic_conf.read_text().replace("[healthd]\n", f"[healthd]\n{extra}", 1)
    conf.write_text(text.replace("[remediation]\n", "[remediation]\nenabled = false\n", 1))
    for name in ("n1", "n2"):
        lab.start_healthd(name, config=conf)
    script, sync = tmp_path / "slow.py", tmp_path / "sync"
    sync.mkdir()
    script.write_text(JOB_SLOW)
    env = lab.process_env()
    env["PYTHONPATH"] = str(Path(__file__).parents[1])
    others = ",".join(n for n in lab.node_names() if n not in ("n1", "n2"))
    from medic_core import proc

    run = f"srun --ntasks-per-node=1 {sys.executable} {script} n2 {sync}"
    submitted = proc.run(
        ["sbatch", "--parsable", "--resilient=1", "-N2", f"--exclude={others}",
         f"--output={tmp_path / 'out'}", "--wrap", run],
        timeout=15, env=env, check=True,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    target = f"job:{job_id}"

    def flagged(store: Any, name: str) -> list[Any]:
        return [e for e in store.events(name, kind="straggler") if e.target == target]

    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        poll("n2 flagged", lambda: bool(flagged(store, "n2")), timeout=40)
        # Drained after the job: DRAIN while the job still runs there (DRAINING), not requeued.
        poll("n2 drained by Medic", lambda: drained_by_medic(lab, "n2"), timeout=20)
        reason = node_info(lab, "n2")["reason"]
        poll("the job to complete", lambda: job(lab, job_id)["job_state"] == "COMPLETED", 40)
        [event] = flagged(store, "n2")
        assert flagged(store, "n1") == []
        paces = {e.node for e in store.events(kind="job_pace") if e.target == target}
    assert paces == {"n1", "n2"}
    assert event.fault_class == "node.straggler" and event.evidence["basis"] == "busy"
    assert 2.0 < event.evidence["times"] < 4.0  # 0.3 s against 0.1 s
    print(f"\n{event.message}")
    info = job(lab, job_id)
    assert info["restart_cnt"] == 0  # the job ran to its end where it was
    assert "node.straggler" in reason and not drained_by_medic(lab, "n1"), reason

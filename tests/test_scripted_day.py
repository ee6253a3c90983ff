"""Issue 13's proof, short: on the lab's real Slurm and medic-healthd, two resilient jobs
and three faults of different classes (an XID 79 NVML and the kernel log both report, an
XID 95 only the kernel log has, a RESTART_APP XID 13 that leaves the node in service); then
`medic report --json` gives each interruption's components, whose sum must be the wall time
measured from the fault to the job's resume mark within 1 s. The full day (a dozen faults,
a lemon, an RMA) is bench/scripted_day.py."""

from __future__ import annotations

import time
from pathlib import Path

from bench.scripted_day import SHORT, TOLERANCE_S, compare, day_config, report_json, run_day
from cli.lab.cluster import Lab


def test_a_short_day_on_the_lab_reports_components_summing_to_the_measured_wall(
    lab: Lab, tmp_path: Path
) -> None:
    conf = day_config(lab, tmp_path / "medic.toml", hangs=False)
    for name in lab.node_names():
        lab.start_healthd(name, config=conf)
    started = time.time()
    work = tmp_path / "work"
    work.mkdir()
    faults = run_day(lab, work, SHORT, lemon=None)
    report = report_json(lab, started, {f["job_id"]: f["job"] for f in faults}, work)
    rows = compare(faults, report)
    print("\n" + "\n".join(str(r) for r in rows))
    assert [r["fault"] for r in rows] == [f for _, f in SHORT]
    # A "missing" row has no key: print every row and what the report built for each job
    # (an action it folded into an earlier outage is under that interruption's "also").
    assert all(r.get("recovered") for r in rows), (rows, report["jobs"])
    # Every fault here is in the kernel log: each is dated, and the sum is the wall time.
    for r in rows:
        assert r["detection"] is not None, r
        assert abs(r["error_s"]) <= TOLERANCE_S, r
        # The job's resume mark follows its prolog: the next run's, not the ended run's own.
        assert r["restart"] is not None and r["restart"] > 0 and r["lost_work_s"] is not None
    assert {r["fault_class"] for r in rows} == {"gpu.xid.79", "gpu.xid.95", "gpu.xid.13"}

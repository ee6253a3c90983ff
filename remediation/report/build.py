"""`medic report`'s Report from a window's rows: the rows grouped by job, each job's
interruptions and ETTR (remediation.report.jobs), MTTR's components over the recovered
interruptions and the fleet's figures (remediation.report.fleet). Pure."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from remediation.report.durations import in_window, spread
from remediation.report.figures import Report
from remediation.report.fleet import fleet_report
from remediation.report.jobs import interruptions_of, job_report
from remediation.report.rows import INTERRUPTING, CheckpointMark, FaultSeen, JobAction, ReportInput


def build_report(data: ReportInput) -> Report:
    since, until = data.since, data.until
    faults_by_node: dict[str, list[FaultSeen]] = defaultdict(list)
    for f in sorted(data.faults, key=lambda f: f.at):
        faults_by_node[f.node].append(f)
    gates: dict[str, list[dt.datetime]] = defaultdict(list)
    gate_nodes: dict[str, list[str]] = defaultdict(list)
    for s in sorted(data.starts, key=lambda s: s.at):
        if s.allowed:
            gates[s.job_id].append(s.at)
            gate_nodes[s.job_id].append(s.node)
    ends: dict[str, list[dt.datetime]] = defaultdict(list)
    for e in data.ends:
        ends[e.job_id].append(e.at)
    resumes: dict[str, list[CheckpointMark]] = defaultdict(list)
    commits: dict[str, list[CheckpointMark]] = defaultdict(list)
    for c in sorted(data.checkpoints, key=lambda c: c.at):
        (resumes if c.kind == "resume" else commits)[c.job_id].append(c)
    by_job: dict[str, list[JobAction]] = defaultdict(list)
    for a in sorted(data.actions, key=lambda a: (a.at, a.node)):
        if a.action in INTERRUPTING and in_window(a.at, since, until):
            by_job[a.job_id].append(a)

    jobs = []
    for job_id in sorted(by_job, key=lambda j: (by_job[j][0].at, j)):
        found = interruptions_of(
            job_id,
            by_job[job_id],
            gates[job_id],
            resumes[job_id],
            commits[job_id],
            faults_by_node,
            gate_nodes[job_id],
        )
        job_gates = [g for g in gates[job_id] if in_window(g, since, until)]
        job_ends = [e for e in ends[job_id] if in_window(e, since, until)]
        job_resumes = [r.at for r in resumes[job_id] if in_window(r.at, since, until)]
        starts_ = [*job_gates, *job_resumes]
        records = [*starts_, *job_ends, *(a.at for a in by_job[job_id])]
        last_is_start = bool(starts_) and (not job_ends or max(starts_) > max(job_ends))
        last_is_start = last_is_start and max(starts_) >= max(records)
        job_commits = [c for c in commits[job_id] if in_window(c.at, since, until)]
        jobs.append(job_report(job_id, found, records, last_is_start, since, until, job_commits))

    every = [i for j in jobs for i in j.interruptions]
    recovered = [i for i in every if i.recovered]
    components = {
        "detection": spread(i.detection_s for i in recovered),
        "isolation": spread(i.isolation_s for i in recovered),
        "scheduling": spread(i.scheduling_s for i in recovered),
        "restart": spread(i.restart_s for i in recovered),
        "reload": spread(i.reload_s for i in recovered),  # part of restart, not added to wall
        "wall": spread(i.wall_s for i in recovered),
        "lost_work": spread(i.lost_work_s for i in every),
    }
    mttr = components["wall"].mean_s
    return Report(
        since=since,
        until=until,
        jobs=tuple(jobs),
        components=components,
        mttr_s=mttr,
        fleet=fleet_report(data, every),
    )

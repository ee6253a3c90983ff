"""The report `medic report`'s options name (the window, jobs, checkpoint directories, fleet
size): read from the store (remediation/report_store.py) and the jobs' checkpoint
directories, and built by remediation/report (pure)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from cli.admin import EXIT_USAGE, AdminError, load, now_utc, opened_store, parse_since, when
from remediation import report as rp


def _time(option: str, text: str, now: dt.datetime) -> dt.datetime:
    try:
        return parse_since(text, now)
    except click.BadParameter as exc:
        raise AdminError(f"{option} {exc.message}", code=EXIT_USAGE) from None


def gather(
    store: Any,
    since: dt.datetime,
    until: dt.datetime,
    *,
    fleet_nodes: int | None,
    gpus_per_node: int,
    lemon: rp.LemonRule,
    checkpoints: Sequence[rp.CheckpointMark] = (),
    job_ids: Sequence[str] = (),
) -> rp.ReportInput:
    from remediation import report_store as rs

    scan = rs.scan_whole_table(store, since, until)
    actions = rs.job_actions(store, since, until, scan=scan)
    if job_ids:
        actions = [a for a in actions if a.job_id in job_ids]
    interrupted = rs.interrupted_job_ids(actions)
    starts, ends = rs.job_records(store, interrupted, since, until, scan=scan)
    wanted = set(interrupted)
    nodes = {a.node for a in actions if a.job_id in wanted}
    episodes, steps = rs.episodes_and_steps(store, since, until)
    return rp.ReportInput(
        since=since,
        until=until,
        fleet_nodes=rs.fleet_nodes(store) if fleet_nodes is None else fleet_nodes,
        gpus_per_node=gpus_per_node,
        faults=rs.faults(store, nodes, since, until),
        actions=actions,
        starts=starts,
        ends=ends,
        checkpoints=checkpoints,
        episodes=episodes,
        steps=steps,
        tickets=rs.tickets(store, since, until),
        lemon=lemon,
    )


def checkpoint_marks(pairs: Sequence[str]) -> list[rp.CheckpointMark]:
    """JOB=DIR: the job's checkpoint directory, read for its commits and resume marks: its
    ledger (which `prune` never deletes), plus what manifests and mark files it lacks."""
    from slurm_hooks.checkpoint import CheckpointDir, CheckpointError

    marks: list[rp.CheckpointMark] = []
    for pair in pairs:
        job_id, sep, root = pair.partition("=")
        if not sep or not job_id or not root:
            raise AdminError(f"--checkpoints {pair!r}: expected JOB=DIR", code=EXIT_USAGE)
        try:
            directory = CheckpointDir(Path(root))
        except CheckpointError as exc:
            raise AdminError(f"--checkpoints {pair!r}: {exc}", code=EXIT_USAGE) from None
        commits, resumes = directory.history()
        for c in commits:
            at = dt.datetime.fromtimestamp(c.time, dt.UTC)
            marks.append(
                rp.CheckpointMark(job_id, at, "commit", c.step, c.restart_count, c.duration)
            )
        for r in resumes:
            at = dt.datetime.fromtimestamp(r.time, dt.UTC)
            mark = rp.CheckpointMark(job_id, at, "resume", r.step, r.restart_count, None, r.tier)
            marks.append(dataclasses.replace(mark, reload_s=r.reload_s))
    return marks


def measured(params: Mapping[str, Any]) -> rp.Report:
    """The report over the window and store the `medic report` options name."""
    now = now_utc()
    since = _time("--since", params["since_text"], now)
    until = _time("--until", params["until_text"], now) if params["until_text"] else now
    if until <= since:
        raise AdminError(
            f"--since {when(since)} is not before --until {when(until)}", code=EXIT_USAGE
        )
    for job in params["job_ids"]:
        if not _JOB.match(job):
            raise AdminError(
                f"--job {job!r}: expected a Slurm job id (1234 or 1234_5)", code=EXIT_USAGE
            )
    marks = checkpoint_marks(params["checkpoint_dirs"])
    config = load(params["config_path"])
    from medic_core.config import ConfigError
    from medic_core.settings import RemediationSettings

    try:
        settings = RemediationSettings.from_config(config)
    except ConfigError as exc:
        raise AdminError(
            "the configuration has a bad [remediation] table", str(exc), "fix it", EXIT_USAGE
        ) from exc
    lemon = rp.LemonRule(
        settings.lemon_episodes, settings.lemon_days, settings.lemon_failed_requalifications
    )
    with opened_store(config, params["store_url"]) as store:
        data = gather(
            store,
            since,
            until,
            fleet_nodes=params["fleet_nodes"],
            gpus_per_node=params["gpus_per_node"],
            lemon=lemon,
            checkpoints=marks,
            job_ids=params["job_ids"],
        )
    return rp.build_report(data)


_JOB = re.compile(r"^\d+(_\d+)?$")

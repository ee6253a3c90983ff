"""The daemon's check scheduler: checks due close together run in one round, each at its own
pace (healthd.scheduler.CheckScheduler.run_due)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from healthd.scheduler import COALESCE_SECONDS
from medic_core.store import Store
from tests.test_cpu_node import cpu_config, daemon_for, store  # noqa: F401 - the fixture


def test_a_check_due_within_the_window_joins_the_round_and_keeps_its_pace(
    tmp_path: Path,
    store: Store,  # noqa: F811
) -> None:
    daemon = daemon_for(cpu_config(tmp_path), store)
    daemon.settings = dataclasses.replace(daemon.settings, jitter=0.0)
    names = sorted(daemon.scheduler.due)
    now_due, soon, later = names[:3]
    for name in (now_due, soon, later):
        assert daemon.checks.specs[name].interval_for(daemon.checks.configs[name]) >= 4 * (
            COALESCE_SECONDS
        )
    base = time.monotonic()
    daemon.scheduler.due = {now_due: base - 1, soon: base + COALESCE_SECONDS / 2, later: base + 60}
    report = daemon.scheduler.run_due()
    assert report is not None
    assert sorted(o.name for o in report.outcomes) == sorted([now_due, soon])
    assert daemon.scheduler.due[later] == base + 60  # not due: left alone
    interval = {n: daemon.checks.specs[n].interval_for(daemon.checks.configs[n]) for n in names}
    assert base <= daemon.scheduler.due[now_due] - interval[now_due] <= time.monotonic()
    # The one run early counts its next time from when it was due, not from now.
    assert daemon.scheduler.due[soon] == base + COALESCE_SECONDS / 2 + interval[soon]


def test_nothing_due_within_the_window_runs_nothing(tmp_path: Path, store: Store) -> None:  # noqa: F811
    daemon = daemon_for(cpu_config(tmp_path), store)
    base = time.monotonic()
    daemon.scheduler.due = {name: base + 30 for name in daemon.scheduler.due}
    assert daemon.scheduler.run_due() is None

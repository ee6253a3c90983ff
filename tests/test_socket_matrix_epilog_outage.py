"""The epilog's job summary survives a store outage (issue 23, finding 6): job_end's post-job
checks still run with the store down, and the job_summary event goes to the node's journal
(the gate recorder's path, like the gate decisions), replayed with its own time once the
store takes writes again. Before, the summary's first store read raised and it was lost.
A real daemon on a real SQLite store behind a switch (tests/test_store_outage_daemon.py),
its checks scripted; the socket's job_end drives the worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.checks.base import CheckContext, Result, Status, fault, ok
from healthd.daemon import HealthDaemon
from healthd.launch_gate import POST_JOB_CHECKS
from healthd.runner import Runner
from healthd.socket_api import SocketApi
from medic_core import journal
from medic_core.config import load_config
from medic_core.store import open_configured_store
from tests.conftest import poll
from tests.test_checks_runner import make_spec
from tests.test_daemon import plain_config
from tests.test_store_outage_daemon import SwitchedStore


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[HealthDaemon, SwitchedStore, SocketApi, list[str]]]:
    config = load_config(plain_config(tmp_path))
    real = open_configured_store(config)
    store = SwitchedStore(real)
    ran: list[str] = []
    bad = {"gpu_ecc"}  # a finding of the post-job checks, for the summary to carry

    def behaviour(name: str) -> Any:
        def run() -> list[Result]:
            ran.append(name)
            if name in bad:
                return [fault(name, Status.WARN, "gpu.ecc.sbe", "SBE storm", target="1")]
            return [ok(name, "fine")]

        return run

    try:
        daemon = HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))  # type: ignore[arg-type]
        daemon.recorder.store_retry = 0.0
        daemon.runner = Runner(
            daemon.ctx, specs=[make_spec(n, behaviour(n)) for n in POST_JOB_CHECKS]
        )
        api = SocketApi(daemon, daemon.gate)
        yield daemon, store, api, ran
        daemon.gate.recorder.close()
    finally:
        real.close()


def summaries(store: SwitchedStore, job: str) -> list[Any]:
    return [e for e in store.real.events(kind="job_summary") if e.target == f"job:{job}"]


def test_a_job_summary_taken_during_an_outage_is_journaled_and_replayed(rig: Any) -> None:
    daemon, store, api, ran = rig
    paths = daemon.config.paths
    store.down = True
    assert api.handle({"op": "job_end", "job_id": "77"})["queued"] is True
    poll("the post-job checks run", lambda: api.after_jobs.pending() == 0, timeout=30)
    assert sorted(ran) == sorted(POST_JOB_CHECKS)  # the checks ran, the store down or not
    kept = [journal.read_entry(p) for p in journal.pending(paths)]
    [entry] = [e for e in kept if e.event.get("kind") == "job_summary"]
    assert entry.event["target"] == "job:77" and entry.event["source"] == "epilog"
    assert entry.event["evidence"]["faults"] == ["gpu.ecc.sbe"]
    assert entry.event["evidence"]["store"].startswith("unavailable: connection refused")
    assert not summaries(store, "77")

    store.down = False  # the next summary's write replays the journal first
    api.handle({"op": "job_end", "job_id": "78"})
    poll("both summaries in the store", lambda: summaries(store, "77") and summaries(store, "78"))
    [first], [second] = summaries(store, "77"), summaries(store, "78")
    assert first.at == entry.at < second.at  # replayed with its own time
    assert first.message.endswith(": faults gpu.ecc.sbe"), first.message
    assert "store" not in second.evidence
    assert not journal.pending(paths)


def test_a_job_summary_with_the_store_up_is_written_at_once(rig: Any) -> None:
    daemon, store, _, _ = rig
    daemon.gate.after_job("79")  # what the worker calls; returns once written
    [summary] = summaries(store, "79")
    assert summary.source == "epilog" and summary.evidence["job_id"] == "79"
    assert not journal.pending(daemon.config.paths)

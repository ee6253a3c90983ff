"""Observe-only mode on the lab (issue 26.7): with `[remediation] observe_only = true` in the
medic.toml every hook and the daemon read, an XID 79 under a running resilient job changes
nothing in Slurm (the node stays in service, the job runs on with no restart and no comment,
no drain record) while the events record the drain, the requeue and the reboot Medic would
have done; the HealthCheckProgram's drain and the prolog's refusal are recorded the same way,
and `medic report` shows them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.lab.cluster import Lab
from cli.lab.slurm_conf import with_check_options
from cli.main import medic
from healthd.checks import registry
from medic_core import proc
from medic_core.store import DRAIN_KINDS, Store, open_store
from remediation import episodes as ep
from remediation.observe import OBSERVED
from tests.conftest import poll
from tests.lab_views import job
from tests.test_attribution_lab import runs, state
from tests.test_defects_lab import admin_comment, in_service, only_on, run_hook, submit

pytestmark = pytest.mark.lab


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


@pytest.fixture
def observing(lab: Lab) -> Iterator[Path]:
    """The lab's own medic.toml (the hooks read it too) in observe-only mode, every check
    every 2 s; put back afterwards."""
    conf = lab.layout.medic_conf
    before = conf.read_text()
    options = {s.name: "interval = 2\n" for s in registry()}
    text = with_check_options(before, options)
    conf.write_text(text.replace("[remediation]\n", "[remediation]\nobserve_only = true\n", 1))
    try:
        yield conf
    finally:
        conf.write_text(before)


def would(store: Store, node: str) -> list[tuple[str, str, str]]:
    """(actor, action, subject) of the observed events on `node`, oldest first."""
    found = reversed(store.events(node, kind=OBSERVED))
    return [(e.source, str(e.evidence["action"]), e.target) for e in found]


def test_an_xid_changes_nothing_in_slurm_and_every_decision_is_recorded(
    lab: Lab, store: Store, observing: Path, tmp_path: Path
) -> None:
    lab.start_healthd("n1", config=observing)
    marks = tmp_path / "runs"
    job_id = submit(
        lab, "--resilient=3", only_on(lab, "n1"), "--job-name=observed",
        "--wrap", f"echo run >> {marks}; sleep 600",
    )  # fmt: skip
    poll("the job runs", lambda: runs(marks) == 1, timeout=60)
    before = job(lab, job_id)

    injected = time.monotonic()
    lab.inject("n1", 2, ["xid=79"])
    wanted = {("daemon", "drain", "n1"), ("daemon", "requeue", f"job:{job_id}"),
              ("ladder", "reboot", "n1")}  # fmt: skip
    poll("the three decisions recorded", lambda: wanted <= set(would(store, "n1")), timeout=30)
    recorded_in = time.monotonic() - injected
    print(f"observe only: drain, requeue and reboot recorded {recorded_in:.1f}s after the XID")

    # The HealthCheckProgram and the prolog of a new job decide too: recorded, not done.
    checked = run_hook(lab, "medic-healthcheck", "n1")
    assert "would drain" in checked.stdout, checked.stdout + checked.stderr
    prolog = proc.run(
        [str(lab.layout.bin_dir / "medic-prolog")], timeout=60,
        env={"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "999999"},
    )  # fmt: skip
    assert prolog.returncode == 0, prolog.stderr  # allowed
    poll(
        "the prolog's would-have-refused",
        lambda: any(e.evidence.get("would_refuse") for e in store.events("n1", kind="gate")),
        timeout=10,
    )
    assert ("healthcheck", "drain", "n1") in would(store, "n1")

    # Nothing changed in Slurm: the node in service, the job running its first run, untouched.
    assert in_service(lab, "n1")
    assert state(lab, job_id) == "RUNNING" and runs(marks) == 1
    after = job(lab, job_id)
    assert after.get("restart_cnt") == before.get("restart_cnt")
    assert admin_comment(lab, job_id) == ""
    assert [e for e in store.events("n1") if e.kind in DRAIN_KINDS] == []
    (episode,) = ep.EpisodeStore(store).find(node="n1")
    assert episode.state == ep.NEEDS_HUMAN and "observe only: would start reboot" in episode.message
    assert ep.EpisodeStore(store).steps(episode.id) == []

    report = CliRunner().invoke(
        medic, ["report", "--store", f"sqlite:///{lab.layout.store_db}", "--since", "1h"]
    )
    assert report.exit_code == 0, report.output
    section = report.output.split("What Medic would have done (observe only)")[1]
    for actor, action, subject in wanted:
        assert any(
            line.split()[1:4] == [actor, action, subject] for line in section.splitlines()
        ), section
    assert "refuse_launch" in section and "job:999999" in section

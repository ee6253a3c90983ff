"""Observe-only mode (remediation.observe): every automatic decision is recorded as what Medic
would have done, and nothing changes in Slurm: no drain, requeue, resume, reboot, comment,
drain record, repair command or RMA ticket. The ladder's world (tests/test_ladder_unit.py:
the real Ladder and store, FakeSlurm, a fake node) with its Slurm client observed."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medic_core.config import load_config
from medic_core.drain_book import DrainBook
from medic_core.drain_reason import DrainOutcome, format_reason
from medic_core.settings import HookSettings, RemediationSettings
from medic_core.status import Status
from medic_core.vocabulary import Finding, Verdict
from remediation import episodes as ep
from remediation import tickets
from remediation.actions import carry_out, job_facts, slurm_client
from remediation.decide import decide_launch
from remediation.give_back import give_back
from remediation.ladder import Ladder
from remediation.observe import (
    OBSERVED,
    REPEAT_SECONDS,
    Observer,
    ObservingSlurm,
    observed_gate,
    observer_of,
    would_refuse,
)
from tests.fakes import FakeClock, FakeSlurm
from tests.test_ladder_unit import (  # noqa: F401 (fixtures)
    REMAP,
    XID_79,
    XID_95,
    World,
    template_db,
    world,
)

WRITES = ("drain", "resume", "reboot", "requeue", "release", "hold", "start_now")


class Observed:
    """The world's Slurm seen through an observing client, with the events it recorded."""

    def __init__(self, world: World, *, on: bool = True) -> None:  # noqa: F811
        self.world = world
        self.on = on
        self.events: list[dict[str, Any]] = []
        self.observer = Observer("daemon", self.events.append, lambda: self.on)
        self.client = ObservingSlurm(world.slurm, self.observer)
        world.configure(observe_only=on)
        ladder = Ladder("n1", world.episodes, self.client, world.nodes["n1"], world.settings)
        ladder.book = DrainBook.of(world.store, observing=lambda: self.on)
        self.ladder = ladder

    def fault(self, *findings: Finding) -> tuple[DrainOutcome | None, list[str], list[str]]:
        """The daemon's answer (healthd.ladder_thread.respond): admit, carry out."""
        self.world.nodes["n1"].findings = list(findings)
        admission = self.ladder.admit(findings, job_facts(self.client, "n1"))
        episode = admission.episode.id if admission.episode is not None else None
        made_eligible: list[str] = []
        drained, actions = carry_out(
            self.client, "n1", admission.decision,
            lambda job, _: made_eligible.append(job), book=self.ladder.book, episode_id=episode,
        )  # fmt: skip
        return drained, [a.action for a in actions], made_eligible

    def would(self) -> list[tuple[str, str]]:
        return [(e["evidence"]["action"], e["target"]) for e in self.events]


def slurm_writes(slurm: FakeSlurm) -> list[tuple[str, ...]]:
    return [c for c in slurm.calls if c[0] in (*WRITES, "set_admin_comment")]


def test_an_xid_on_a_busy_node_changes_nothing_and_records_every_decision(world: World) -> None:  # noqa: F811
    job = world.slurm.start_job("42", "n1", comment="medic:resilient=3")
    seen = Observed(world)
    drained, actions, made_eligible = seen.fault(XID_79)
    assert drained is DrainOutcome.WOULD_DRAIN
    assert actions == ["would_requeue"] and made_eligible == []  # no releaser, no spare
    episode = seen.ladder.tick()  # jobs still run: the rung is recorded now all the same
    assert episode is not None and episode.state == ep.NEEDS_HUMAN
    assert episode.message.startswith("observe only: would start reboot for gpu.xid.79")
    assert seen.would() == [("drain", "n1"), ("requeue", "job:42"), ("reboot", "n1")]
    drain, requeue, reboot = seen.events
    assert drain["evidence"]["decision"] == format_reason("gpu.xid.79", "2", "off the bus")
    assert "requeued off n1 (gpu.xid.79)" in requeue["evidence"]["decision"]
    assert reboot["evidence"]["episode"] == episode.id and reboot["source"] == "daemon"
    assert all(e["kind"] == OBSERVED and e["message"].startswith("would ") for e in seen.events)
    # Nothing changed in Slurm, no drain record, no repair, no step, no comment.
    assert slurm_writes(world.slurm) == []
    assert world.slurm.by_name["n1"].in_service and job.running and job.admin_comment == ""
    assert world.store.open_drain("n1") is None
    assert not world.nodes["n1"].commands and world.steps("n1") == []


def test_an_rma_and_a_gpu_reset_are_recorded_not_made(world: World) -> None:  # noqa: F811
    seen = Observed(world)
    seen.fault(REMAP)
    assert seen.ladder.tick().state == ep.NEEDS_HUMAN  # type: ignore[union-attr]
    assert tickets.list_tickets(world.store, node="n1") == []
    assert seen.would() == [("drain", "n1"), ("rma", "n1")]
    world.clock.advance(3600)  # a later, other fault
    seen.fault(XID_95)
    seen.ladder.tick()
    assert seen.would()[-1] == ("gpu_reset", "n1") and not world.nodes["n1"].commands
    assert slurm_writes(world.slurm) == []


def test_the_same_decision_is_recorded_once_per_window() -> None:
    clock = FakeClock()
    events: list[dict[str, Any]] = []
    slurm = ObservingSlurm(
        FakeSlurm(["n1"]), Observer("healthcheck", events.append, lambda: True, clock)
    )
    for _ in range(5):
        slurm.drain("n1", "medic: gpu.xid.79 2 off the bus")
        clock.advance(REPEAT_SECONDS / 5 - 1)
    slurm.drain("n1", "medic: other 1 another reason")
    assert len(events) == 2
    clock.advance(REPEAT_SECONDS)
    slurm.drain("n1", "medic: gpu.xid.79 2 off the bus")
    assert len(events) == 3 and slurm.client.calls == []  # type: ignore[attr-defined]


def test_switched_off_at_run_time_the_client_acts_again(world: World) -> None:  # noqa: F811
    seen = Observed(world)
    seen.on = False
    assert observer_of(seen.client) is None
    drained, _, _ = seen.fault(XID_95)
    assert drained is DrainOutcome.DRAINED and seen.events == []
    assert world.slurm.called("drain", "n1") and world.store.open_drain("n1") is not None


def test_a_resume_is_recorded_not_made(world: World) -> None:  # noqa: F811
    world.medic_drained("n1", "medic: gpu.xid.95 3 XID 95")
    seen = Observed(world)
    done = give_back(seen.client, seen.ladder.book, "n1", actor="ladder")
    assert done.outcome is DrainOutcome.WOULD_RESUME and not done.resumed
    assert seen.would() == [("resume", "n1")]
    assert world.slurm.called("resume") == [] and not world.slurm.by_name["n1"].in_service
    assert world.store.open_drain("n1") is not None  # the record stays: the drain stays


@settings(max_examples=200, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from((*WRITES, "set_admin_comment")), st.sampled_from(["1", "2"])),
        max_size=20,
    )
)
def test_no_write_reaches_slurm_while_observing(calls: list[tuple[str, str]]) -> None:
    fake = FakeSlurm(["n1", "n2"])
    fake.start_job("1", "n1")
    fake.start_job("2", "n2")
    events: list[dict[str, Any]] = []
    client = ObservingSlurm(fake, Observer("x", events.append, lambda: True))
    for method, which in calls:
        node, job = f"n{which}", which
        if method == "drain":
            client.drain(node, "medic: a b c")
        elif method == "reboot":
            client.reboot(node, "medic: a b c", "DOWN")
        elif method == "resume":
            client.resume(node)
        elif method == "set_admin_comment":
            client.set_admin_comment(job, "medic: why")
        else:
            getattr(client, method)(job)
    assert fake.calls == []
    recorded = [(e["evidence"]["action"], e["target"], e["evidence"]["decision"]) for e in events]
    assert len(recorded) == len(set(recorded))  # a repeat within the window: once
    wanted = {(m, f"n{w}" if m in ("drain", "reboot", "resume") else f"job:{w}")
              for m, w in calls if m != "set_admin_comment"}  # fmt: skip
    assert {(a, t) for a, t, _ in recorded} == wanted


# --- the prolog ------------------------------------------------------------------------------

CRITICAL = Verdict(
    Status.CRITICAL,
    (Finding("gpu_xid", Status.CRITICAL, "gpu.xid.79", "2", "off the bus"),),
    "healthd",
    0.1,
)


@pytest.mark.parametrize("rma", [(), (7,)])
def test_the_prolog_allows_and_says_what_would_have_refused(rma: tuple[int, ...]) -> None:
    refused = decide_launch(CRITICAL, HookSettings(), rma_open=rma)
    assert not refused.allow
    allowed = observed_gate(refused, True)
    assert allowed.allow and would_refuse(allowed) and allowed.blocking == refused.blocking
    assert allowed.why.endswith(refused.blocking[0].message)
    assert observed_gate(refused, False) is refused
    fine = decide_launch(Verdict(Status.OK, (), "healthd", 0.1), HookSettings())
    assert observed_gate(fine, True) is fine and not would_refuse(fine)


def test_the_hooks_client_observes_only_when_configured(tmp_path: Path) -> None:
    path = tmp_path / "medic.toml"
    path.write_text("[remediation]\nobserve_only = true\n")
    config = load_config(path)
    assert RemediationSettings.from_config(config).observe_only
    assert observer_of(slurm_client(config, HookSettings(), actor="prolog")) is not None
    path.write_text("")
    assert observer_of(slurm_client(load_config(path), HookSettings())) is None


# --- medic report ----------------------------------------------------------------------------


def test_medic_report_shows_what_medic_would_have_done(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cli.main import medic
    from medic_core.store import open_store
    from remediation.observe import observed_event

    url = f"sqlite:///{tmp_path / 'medic.db'}"
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    with open_store(url) as store:
        for minutes, (actor, action, subject, why) in enumerate(
            [
                ("daemon", "drain", "n1", "medic: gpu.xid.79 2 off the bus"),
                ("daemon", "requeue", "job:42", "medic: requeued off n1 (gpu.xid.79)"),
                ("ladder", "reboot", "n1", "episode 1: gpu.xid.79 2"),
                ("healthcheck", "drain", "n1", "medic: gpu.xid.79 2 off the bus"),
                ("healthcheck", "drain", "n1", "medic: gpu.xid.79 2 off the bus"),
            ]
        ):
            event = observed_event(actor, action, subject, why)
            at = now - dt.timedelta(minutes=30 - minutes)
            store.add_event("n1", at=at, **event)
        store.add_event(
            "n1", at=now - dt.timedelta(minutes=5), kind="gate", severity="INFO",
            source="prolog", target="job:43",
            message="job 43 allowed (CRITICAL): observe only: would have refused: off the bus",
            evidence={"job_id": "43", "allow": True, "would_refuse": True},
        )  # fmt: skip
        store.add_event(
            "n2", at=now - dt.timedelta(minutes=5), kind="gate", severity="INFO",
            source="prolog", target="job:44", message="job 44 allowed (OK)",
            evidence={"job_id": "44", "allow": True, "would_refuse": False},
        )  # fmt: skip
    window = ["report", "--store", url, "--since", "1h", "--nodes", "4"]
    text = CliRunner().invoke(medic, window)
    assert text.exit_code == 0, text.output
    section = text.output.split("What Medic would have done (observe only): ")[1]
    assert section.startswith("5 decisions, 6 times")
    lines = section.splitlines()[2:]
    assert [line.split()[:5] for line in lines] == [
        ["n1", "daemon", "drain", "n1", "1"],
        ["n1", "daemon", "requeue", "job:42", "1"],
        ["n1", "ladder", "reboot", "n1", "1"],
        ["n1", "healthcheck", "drain", "n1", "2"],
        ["n1", "prolog", "refuse_launch", "job:43", "1"],
    ]
    assert "would have refused: off the bus" in lines[-1]
    out = CliRunner().invoke(medic, [*window, "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)["would_have_done"]
    assert [(r["actor"], r["action"], r["times"]) for r in rows][-2:] == [
        ("healthcheck", "drain", 2),
        ("prolog", "refuse_launch", 1),
    ]
    quiet = CliRunner().invoke(medic, ["report", "--store", url, "--since", "10m"])
    assert "would have done" in quiet.output  # the gate record is 5 minutes old
    empty = CliRunner().invoke(medic, ["report", "--store", url, "--since", "1m"])
    assert empty.exit_code == 0 and "would have done" not in empty.output

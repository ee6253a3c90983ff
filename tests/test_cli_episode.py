"""`medic episode list|show|close|retry` and the one word every view gives a node
(cli.node_view), on a real SQLite store in tmp_path with a fake Slurm."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import cli.admin
import cli.episode
import cli.node_commands
import cli.nodes
from cli import node_view
from cli.admin import jobs, remediation
from cli.episode import episode
from cli.node_commands import node
from cli.nodes import nodes
from medic_core.drain_book import DrainBook
from medic_core.drain_reason import is_medic_reason
from medic_core.settings import RemediationSettings
from medic_core.slurm import JobInfo, NodeInfo
from medic_core.status import Status
from medic_core.store import ConditionUpdate, Event, Severity, Store, open_store
from medic_core.vocabulary import Finding
from remediation import episodes as ep
from remediation import tickets
from remediation.ladder import Ladder
from tests.fakes import FakeSlurm

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """Nodes added by each test; the commands' drains and resumes change them, recorded."""
    fake = FakeSlurm()
    for module in (cli.admin, cli.nodes, cli.node_commands, cli.episode):
        monkeypatch.setattr(module, "slurm_client", lambda config: fake)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.delenv("SUDO_USER", raising=False)
    return fake


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[Store, list[str]]]:
    path = tmp_path / "medic.db"
    conf = tmp_path / "medic.toml"
    conf.write_text(f'[store]\nurl = "sqlite:///{path}"\n')
    with open_store(f"sqlite:///{path}") as store:
        yield store, ["--config", str(conf)]


def run(command: Any, *args: str) -> Result:
    return CliRunner().invoke(command, list(args), catch_exceptions=False)


def as_json(command: Any, *args: str) -> Any:
    result = run(command, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def opened(store: Store, node: str, state: str, rung: int = 1, **values: Any) -> ep.Episode:
    episodes = ep.EpisodeStore(store)
    e = episodes.open_episode(
        node, state=state, fault_class="gpu.xid.79", target="2", check="gpu_xid",
        recommendation="gpu_reset", rung=rung, message="GPU 2 fell off the bus", evidence={},
    )  # fmt: skip
    return episodes.update(e.id, **values) if values else e


# --- close ----------------------------------------------------------------------------------


def test_close_records_who_and_why_leaves_slurm_alone_and_refuses_twice(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n3", "IDLE", ("DRAIN",), "medic: gpu.xid.79 gpu2")
    e = opened(store, "n3", ep.NEEDS_HUMAN)
    DrainBook.of(store).record_drain(
        "n3", "medic: gpu.xid.79 gpu2", actor="daemon", episode_id=e.id
    )

    empty = run(episode, "close", str(e.id), "--reason", "  ", *conf)
    assert empty.exit_code == 2 and "--reason is empty" in empty.stderr

    closed = run(episode, "close", str(e.id), "--reason", "reseated GPU 2", *conf)
    assert closed.exit_code == 0, closed.output
    assert f"episode {e.id} on n3 closed (was needs_human): reseated GPU 2" in closed.stdout
    assert "n3: NOT resumed" in closed.stdout and "medic node resume n3" in closed.stdout
    assert slurm.calls == []  # closing touches no node
    held = store.open_drain("n3")  # Medic's drain now waits for a human (issue 22)
    assert held is not None and "closed without --resume" in held.held

    after = ep.EpisodeStore(store).get(e.id)
    assert after is not None and after.state == ep.CLOSED and after.closed_at is not None
    assert after.evidence["closed_by"]["actor"] == "alice"
    assert after.evidence["closed_by"]["reason"] == "reseated GPU 2"
    assert after.evidence["closed_by"]["from_state"] == ep.NEEDS_HUMAN
    assert after.message.endswith("; closed by alice: reseated GPU 2")
    [audit] = store.events(node="n3", kind="admin")
    assert audit.evidence["action"] == "episode_close" and audit.evidence["episode_id"] == e.id

    again = run(episode, "close", str(e.id), "--reason", "again", *conf)
    assert again.exit_code == 1
    assert f"episode {e.id} is already closed (by alice)" in again.stderr
    assert len(store.events(node="n3", kind="admin")) == 1

    shown = run(episode, "show", str(e.id), *conf)
    assert "closed by alice" in shown.stdout and "reseated GPU 2" in shown.stdout
    assert run(episode, "close", "999", "--reason", "x", *conf).exit_code == 1


def test_a_resolved_episode_is_neither_closed_nor_retried(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n1")
    e = opened(store, "n1", ep.RESOLVED)
    close = run(episode, "close", str(e.id), "--reason", "done", *conf)
    assert close.exit_code == 1 and "already resolved" in close.stderr
    retry = run(episode, "retry", str(e.id), *conf)
    assert retry.exit_code == 1 and "is resolved" in retry.stderr
    assert ep.EpisodeStore(store).get(e.id).state == ep.RESOLVED  # type: ignore[union-attr]
    assert slurm.calls == []


def test_an_rma_episode_with_an_open_ticket_is_neither_closed_nor_retried(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n2", "DOWN", (), "medic: gpu.xid.79 gpu2")
    ticket = tickets.open_ticket(store, "n2", "gpu.xid.79", "GPU 2 gone", [], {}, "medic")
    e = opened(store, "n2", ep.RMA, rung=4, ticket_id=ticket.id)
    close = run(episode, "close", str(e.id), "--reason", "x", *conf)
    assert close.exit_code == 1 and f"RMA ticket {ticket.id} (open)" in close.stderr
    retry = run(episode, "retry", str(e.id), *conf)
    assert retry.exit_code == 1 and f"RMA ticket {ticket.id} (open) is open" in retry.stderr
    assert ep.EpisodeStore(store).get(e.id).state == ep.RMA  # type: ignore[union-attr]
    assert slurm.calls == []
    # Every view says rma for that node, whatever the episode says.
    assert words(conf, "n2") == {"rma"}


# --- retry ----------------------------------------------------------------------------------


def test_retry_goes_back_to_waiting_idle_at_its_rung_with_that_rungs_attempts_reset(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n4")  # in service: the cap kept it there, say
    e = opened(store, "n4", ep.NEEDS_HUMAN, rung=2, attempts={"1": 2, "2": 1})

    result = run(episode, "retry", str(e.id), "--reason", "cap freed", *conf)
    assert result.exit_code == 0, result.output
    assert "needs_human -> waiting_idle at rung driver_reload" in result.stdout
    after = ep.EpisodeStore(store).get(e.id)
    assert after is not None and after.state == ep.WAITING_IDLE and after.closed_at is None
    assert after.rung == 2 and after.attempts_at(2) == 0 and after.attempts_at(1) == 2
    assert after.evidence["retries"][0]["attempts_before"] == 1
    assert ep.EpisodeStore(store).open_for("n4") == after  # the ladder's next tick takes it
    # Drained with Medic's reason first, so the ladder never acts on a node in service and
    # lifts the drain itself once repaired.
    [(method, node, reason)] = slurm.calls
    assert (method, node) == ("drain", "n4")
    assert reason.startswith("medic: gpu.xid.79 gpu2 retry of episode")
    assert is_medic_reason(slurm.by_name["n4"].reason)
    [audit] = store.events(node="n4", kind="admin")
    assert audit.evidence["action"] == "episode_retry" and audit.evidence["drain"] == "drained"

    twice = run(episode, "retry", str(e.id), *conf)
    assert twice.exit_code == 1 and "the ladder is working on it" in twice.stderr


def test_retry_is_refused_while_another_episode_is_open_on_the_node(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n5", "IDLE", ("DRAIN",), "medic: gpu.xid.48 gpu1")
    old = opened(store, "n5", ep.NEEDS_HUMAN)
    other = opened(store, "n5", ep.WAITING_IDLE)
    result = run(episode, "retry", str(old.id), *conf)
    assert result.exit_code == 1
    assert f"episode {other.id} (waiting_idle) is open on n5" in result.stderr
    assert ep.EpisodeStore(store).get(old.id).state == ep.NEEDS_HUMAN  # type: ignore[union-attr]
    assert slurm.calls == []  # refused before Slurm was touched


def test_retry_without_slurm_changes_nothing(db: tuple[Store, list[str]], slurm: FakeSlurm) -> None:
    store, conf = db
    slurm.add_node("n6")
    e = opened(store, "n6", ep.CLOSED)
    slurm.unreachable = True
    result = run(episode, "retry", str(e.id), *conf)
    assert result.exit_code == 1 and "cannot make sure n6 is drained" in result.stderr
    assert ep.EpisodeStore(store).get(e.id).state == ep.CLOSED  # type: ignore[union-attr]
    slurm.unreachable = False
    no_rung = opened(store, "n7", ep.NEEDS_HUMAN, rung=0)
    refused = run(episode, "retry", str(no_rung.id), *conf)
    assert refused.exit_code == 1 and "has no ladder rung" in refused.stderr


def test_close_then_lemon_count(db: tuple[Store, list[str]], slurm: FakeSlurm) -> None:
    store, conf = db
    settings = RemediationSettings(lemon_episodes=3)
    ladder = Ladder("n8", ep.EpisodeStore(store), slurm, None, settings)  # type: ignore[arg-type]
    first = opened(store, "n8", ep.NEEDS_HUMAN, attempts={"1": 2})  # both tried a reset
    opened(store, "n8", ep.RESOLVED, attempts={"1": 1})
    again = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.79", "2", "off the bus")
    assert ladder.lemon_score(again).episodes_recent == 3  # two, and the one being admitted
    assert ladder.lemon_score(again).is_lemon
    assert (
        run(episode, "close", str(first.id), "--reason", "cap, not the node", *conf).exit_code == 0
    )
    assert ladder.lemon_score(again).episodes_recent == 2
    assert not ladder.lemon_score(again).is_lemon


def test_resume_refused_by_a_stuck_episode_says_how_to_close_it(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n4", "IDLE", ("DRAIN",), "medic: gpu.xid.48 gpu1")
    stuck = opened(store, "n4", ep.PAUSED)
    DrainBook.of(store).record_drain("n4", "medic: gpu.xid.48 gpu1", actor="daemon")
    refused = run(node, "resume", "n4", "--reason", "done", *conf)
    assert refused.exit_code == 1
    assert f"close it (medic episode close {stuck.id} --reason TEXT)" in refused.stderr
    assert run(episode, "close", str(stuck.id), "--reason", "done by hand", *conf).exit_code == 0
    resumed = run(node, "resume", "n4", "--reason", "done", *conf)
    assert resumed.exit_code == 0, resumed.output
    assert slurm.calls == [("resume", "n4")]


def test_list_shows_what_waits_and_all_shows_everything(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    waiting = opened(store, "n1", ep.NEEDS_HUMAN)
    done = opened(store, "n1", ep.RESOLVED)
    other = opened(store, "n2", ep.ACTING)
    assert [e["id"] for e in as_json(episode, "list", *conf)] == [waiting.id, other.id]
    assert [e["id"] for e in as_json(episode, "list", "--all", *conf)] == [
        waiting.id, done.id, other.id,
    ]  # fmt: skip
    assert [e["id"] for e in as_json(episode, "list", "--node", "n2", *conf)] == [other.id]
    table = run(episode, "list", *conf).stdout.splitlines()
    assert table[0].split()[:3] == ["EPISODE", "NODE", "STATE"]
    assert [line.split()[:3] for line in table[1:]] == [
        [str(waiting.id), "n1", "needs_human"], [str(other.id), "n2", "acting"],
    ]  # fmt: skip


# --- one word per node, in every view -------------------------------------------------------


def words(conf: list[str], name: str) -> set[str]:
    """The word `medic nodes`, `medic node show` and `medic remediation status` give `name`
    (None: `remediation status` does not list it), as JSON and as text."""
    found: set[Any] = set()
    listed = [n for n in as_json(nodes, "--all", *conf)["nodes"] if n["node"] == name]
    found.add(listed[0]["medic"] if listed else None)
    found.add(as_json(node, "show", name, *conf)["medic"])
    status = {n["node"]: n["word"] for n in as_json(remediation, "status", *conf)["nodes"]}
    found.add(status.get(name))  # it lists only the ladder's words
    table = run(nodes, "--all", *conf).stdout.splitlines()
    column = table[1].split().index("MEDIC")
    found |= {line.split()[column] for line in table[2:] if line.startswith(name + " ")}
    shown = run(node, "show", name, *conf).stdout.splitlines()
    found |= {line.split()[1].rstrip(":") for line in shown if line.startswith("medic: ")}
    text = run(remediation, "status", *conf).stdout.splitlines()
    found |= {line.split()[1] for line in text if line.startswith(name + " ")}
    return found


def test_a_healthy_node_with_a_stuck_episode_is_not_being_repaired(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n1")  # in service
    store.set_conditions("n1", [ConditionUpdate("gpu.ecc", "OK", "0")], NOW)
    stuck = opened(store, "n1", ep.WAITING_IDLE)
    assert words(conf, "n1") == {"needs_human"}
    summary = run(nodes, *conf).stdout.splitlines()[0]
    assert "0 being repaired, 1 waiting for a human" in summary
    [doc] = as_json(remediation, "status", *conf)["episodes"]
    assert doc["id"] == stuck.id and doc["medic"] == "needs_human"
    assert f"stuck (medic episode close {stuck.id})" in doc["why"]

    slurm.add_node("n1", "IDLE", ("DRAIN",), "medic: gpu.xid.79 gpu2")  # now drained: a repair
    assert words(conf, "n1") == {"repairing"}
    assert "1 being repaired" in run(nodes, *conf).stdout.splitlines()[0]


def test_an_open_needs_human_episode_is_in_every_view_until_a_human_closes_it(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n2", "IDLE", ("DRAIN",), "medic: gpu.xid.79 gpu2")
    slurm.add_node("n3")
    human = opened(store, "n2", ep.NEEDS_HUMAN)
    opened(store, "n2", ep.RESOLVED)  # a later repair does not answer the human's question
    assert words(conf, "n2") == {"needs_human"}
    assert [n["node"] for n in as_json(nodes, *conf)["nodes"]] == ["n2"]
    status = as_json(remediation, "status", *conf)
    assert [(e["id"], e["medic"]) for e in status["episodes"]] == [(human.id, "needs_human")]

    assert run(episode, "close", str(human.id), "--reason", "fixed by hand", *conf).exit_code == 0
    # Closed: the node is only drained (the human resumes it), and the ladder views drop it.
    assert words(conf, "n2") == {"drained", None}
    assert as_json(remediation, "status", *conf)["episodes"] == []
    assert words(conf, "n3") == {"no_data", None}


def test_every_word_from_one_function() -> None:
    """node_state's order: the ticket first, then the open episode, then a human's."""
    info = NodeInfo("n", "IDLE", frozenset({"DRAIN"}), "medic: x node")
    in_service = NodeInfo("n", "IDLE", frozenset())
    e = ep.Episode(1, "n", ep.WAITING_IDLE, "gpu.xid.79", "2", "c", "reboot", 3, 3, {}, "m",
                   {}, 0, None, NOW, NOW, None)  # fmt: skip
    paused = ep.Episode(**{**e.__dict__, "state": ep.PAUSED})
    human = ep.Episode(**{**e.__dict__, "id": 2, "state": ep.NEEDS_HUMAN})
    facts = node_view.StoreFacts
    ticket = [node_view.TicketBrief(7, "submitted", False)]
    state = node_view.node_state
    assert state(in_service, facts(tickets=ticket, open_episode=e), NOW).word == "rma"
    assert "IN SERVICE" in state(in_service, facts(tickets=ticket), NOW).why
    assert state(info, facts(open_episode=e), NOW).word == "repairing"
    assert state(None, facts(open_episode=e), NOW).word == "repairing"  # Slurm not asked
    assert state(in_service, facts(open_episode=e), NOW).word == "needs_human"
    assert state(info, facts(open_episode=paused), NOW).word == "paused"
    assert state(info, facts(human_episode=human), NOW).episode == human
    assert state(info, facts(), NOW).word == "drained"
    sick = facts(health="CRITICAL", last_report=NOW)
    assert state(in_service, sick, NOW).word == "unhealthy"
    old = NOW - node_view.SILENT_AFTER - dt.timedelta(seconds=1)
    assert state(in_service, facts(health="OK", last_report=old), NOW).word == "silent"
    assert state(in_service, facts(health="OK", last_report=NOW), NOW).word == "ok"


# --- medic jobs -----------------------------------------------------------------------------


def test_jobs_shows_the_newest_action_a_requeue_after_a_gate(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_job(
        JobInfo(job_id="41", name="train", user="bob", state="PENDING", reason="",
                nodes="", requeue=True, restart_count=1, comment="medic:resilient=2")
    )  # fmt: skip
    at = NOW - dt.timedelta(minutes=5)
    # Recorded in this order, but the gate was decided before the requeue (same second).
    store.add_event("n2", at=at, kind="job_action", severity=Severity.WARN, source="healthd",
                    message="requeued", fault_class="gpu.xid.79", target="job:41",
                    evidence={"action": "requeued"})  # fmt: skip
    store.add_event("n2", at=at - dt.timedelta(seconds=2), kind="gate", severity="INFO",
                    source="prolog", message="job 41 allowed", target="job:41",
                    evidence={"allow": True})  # fmt: skip
    store.add_event("n2", at=at, kind="gate", severity="INFO", source="prolog",
                    message="job 41 allowed", target="job:41",
                    evidence={"allow": True})  # fmt: skip
    row = run(jobs, *conf).stdout.splitlines()[1]
    assert row.endswith("n2: requeued (gpu.xid.79)"), row
    later = Event(id=0, node="n2", at=at + dt.timedelta(seconds=1), kind="gate",
                  fault_class="", target="job:41", severity=Severity.INFO, message="",
                  evidence={"allow": False}, source="prolog")  # fmt: skip
    assert cli.admin.newest_action([later, *store.events(node="n2")]) is later


class QuietHost:
    """The ladder's host for one tick: an idle node whose repairs work."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def boot_id(self) -> str:
        return "boot-1"

    def jobs_running(self) -> bool:
        return False

    def gpu_busy(self, gpu: int) -> bool:
        return False

    def release_gpus(self) -> None:
        pass

    def reacquire_gpus(self) -> None:
        pass

    def after_repair(self, gpu: int | None, before: float) -> None:
        pass

    def verify(self, extra_checks: Any) -> list[Any]:
        return []

    def event(self, message: str, *, severity: str, fault_class: str, target: str) -> None:
        self.events.append(message)

    def open_rma(self, episode: ep.Episode, why: str) -> int | None:
        raise AssertionError("no RMA expected")


def test_after_a_retry_the_ladder_tries_the_rung_again(
    db: tuple[Store, list[str]], slurm: FakeSlurm
) -> None:
    store, conf = db
    slurm.add_node("n9", "IDLE", ("DRAIN",), "medic: gpu.xid.79 gpu2")
    episodes = ep.EpisodeStore(store)
    settings = RemediationSettings(gpu_reset=("true",), attempts={"gpu_reset": 2})
    ladder = Ladder("n9", episodes, slurm, QuietHost(), settings)  # type: ignore[arg-type]
    e = opened(store, "n9", ep.NEEDS_HUMAN, rung=1, attempts={"1": 2})
    assert ladder.tick() is None  # needs_human: nothing for the ladder to do
    assert episodes.steps(e.id) == []

    assert run(episode, "retry", str(e.id), *conf).exit_code == 0
    ladder.tick()
    [step] = episodes.steps(e.id)
    assert (step.action, step.attempt, step.state) == ("gpu_reset", 1, "done")
    assert episodes.get(e.id).attempts_at(1) == 1  # type: ignore[union-attr]

"""Ownership from records (issue 22, findings 6 and 7): Medic owns a drain only while a drain
record it wrote before asking Slurm matches what Slurm shows; every resume goes through the
decision core and is recorded with its actor; closing a needs-human episode never resumes
silently."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.episode import episode
from cli.node_commands import node
from medic_core import journal
from medic_core.config import NodePaths
from medic_core.drain_book import HOOK, DrainBook, Holding, judge, operator
from medic_core.drain_reason import (
    HOOK_ACTOR,
    DrainOutcome,
    as_slurm_stores,
    drain_if_allowed,
    format_reason,
    take_over_drain,
)
from medic_core.slurm import NodeInfo
from medic_core.store import DRAIN_RECORDED, DRAIN_RESUMED, DrainRecord, Store, open_store
from remediation import episodes as ep
from remediation.decide import NodeFacts
from remediation.decide_resume import Refusal, decide_resume
from remediation.give_back import give_back
from tests.fakes import FakeSlurm
from tests.test_cli_episode import db, opened, run, slurm  # noqa: F401 (fixtures)

OURS = format_reason("gpu.xid.79", "2", "fell off the bus")
ADMIN_TEXTS = ("medic: x", '"medic: x"', '"medic: gpu.xid.79 gpu2"', "bios", '"maintenance"')


class DownStore:
    """A store that cannot be reached (its database down)."""

    def __call__(self) -> contextlib.AbstractContextManager[Store]:
        raise ConnectionError("could not connect to server: Connection refused")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as s:
        yield s


def paths(tmp_path: Path) -> NodePaths:
    return NodePaths(state_dir=tmp_path / "state", socket=tmp_path / "run" / "healthd.sock")


def drained(reason: str, flags: tuple[str, ...] = ("DRAIN",), state: str = "IDLE") -> NodeInfo:
    return NodeInfo("n1", state, frozenset(flags), reason)


class MemorySlurm:
    def __init__(self, info: NodeInfo | None = None) -> None:
        self.info = info or NodeInfo("n1", "IDLE", frozenset())
        self.calls: list[str] = []

    def node(self, name: str) -> NodeInfo | None:
        return self.info

    def drain(self, name: str, reason: str) -> None:
        self.calls.append("drain")
        self.info = drained(as_slurm_stores(reason))

    def resume(self, name: str) -> None:
        self.calls.append("resume")
        self.info = NodeInfo("n1", "IDLE", frozenset())


# --- the records ------------------------------------------------------------------------------


def test_a_drain_is_recorded_before_slurm_is_asked_and_a_resume_closes_it(store: Store) -> None:
    fake = MemorySlurm()
    book = DrainBook.of(store)
    seen: list[DrainRecord | None] = []
    real_drain = fake.drain

    def drain(name: str, reason: str) -> None:
        seen.append(store.open_drain(name))  # what the store holds when Slurm is asked
        real_drain(name, reason)

    fake.drain = drain  # type: ignore[method-assign]
    outcome = drain_if_allowed(fake, "n1", OURS, book, actor="daemon", episode_id=7)  # type: ignore[arg-type]
    assert outcome is DrainOutcome.DRAINED
    [before] = seen
    assert before is not None and (before.reason, before.actor, before.episode_id) == (
        OURS,
        "daemon",
        7,
    )
    done = give_back(fake, book, "n1", actor="ladder", resolving=7)  # type: ignore[arg-type]
    assert done.resumed and fake.calls == ["drain", "resume"]
    assert store.open_drain("n1") is None
    [record] = store.drain_records("n1")
    assert record.closed_by == "ladder" and record.closed_at is not None
    [resume] = store.events("n1", kind=DRAIN_RESUMED)
    assert resume.evidence["actor"] == "ladder" and resume.evidence["episode_id"] == 7


def test_the_health_checks_drain_becomes_the_episodes_when_the_daemon_answers_the_fault(
    store: Store,
) -> None:
    """slurmd's HealthCheckProgram, run while the daemon was starting, drained the node for a
    fault (no episode); the daemon's answer to the same fault opens an episode: the drain is
    the episode's from then on, and the health check no longer resumes it (a CI run saw it
    resumed while the episode waited for a human)."""
    fake = MemorySlurm()
    book = DrainBook.of(store)
    assert drain_if_allowed(fake, "n1", OURS, book, actor="hook") is DrainOutcome.DRAINED  # type: ignore[arg-type]
    outcome = drain_if_allowed(fake, "n1", OURS, book, actor="daemon", episode_id=7)  # type: ignore[arg-type]
    assert outcome is DrainOutcome.ALREADY_MEDIC and fake.calls == ["drain"]
    record = store.open_drain("n1")
    assert record is not None and (record.actor, record.episode_id) == ("daemon", 7)
    assert "taken over from hook by episode 7" in record.note
    own = book.ownership("n1", fake.info)
    facts = NodeFacts(True, True, False, fake.info.reason, own.recorded, drain_episode=7)
    assert decide_resume(facts).refusal is Refusal.HELD  # the episode's or a human's
    # Already an episode's, or held by a human: left as it is.
    drain_if_allowed(fake, "n1", OURS, book, actor="daemon", episode_id=8)  # type: ignore[arg-type]
    again = store.open_drain("n1")
    assert again is not None and again.episode_id == 7
    assert len(store.drain_records("n1")) == 2


def test_an_answer_that_drains_nothing_still_takes_the_hooks_drain_for_its_episode(
    store: Store,
) -> None:
    """Remediation off (or the node already out): the answer decides no drain, but the
    episode it opens takes over Medic's drain without one; an admin's drain never."""
    fake = MemorySlurm()
    book = DrainBook.of(store)
    drain_if_allowed(fake, "n1", OURS, book, actor="hook")  # type: ignore[arg-type]
    take_over_drain(fake, "n1", book, actor="daemon", episode_id=3)  # type: ignore[arg-type]
    record = store.open_drain("n1")
    assert record is not None and record.episode_id == 3 and fake.calls == ["drain"]
    # Another actor's drain without an episode (burn-in's, spares', hygiene's): its own.
    fake.resume("n1")
    book.record_resume("n1", OURS, actor="daemon")
    drain_if_allowed(fake, "n1", OURS, book, actor="burn-in")  # type: ignore[arg-type]
    take_over_drain(fake, "n1", book, actor="daemon", episode_id=5)  # type: ignore[arg-type]
    burnt = store.open_drain("n1")
    assert burnt is not None and (burnt.actor, burnt.episode_id) == ("burn-in", None)
    # Slurm down: nothing taken over, nothing raised (the answer goes on).
    down = FakeSlurm(["n1"])
    down.unreachable = True
    take_over_drain(down, "n1", book, actor="daemon", episode_id=5)  # type: ignore[arg-type]
    assert HOOK_ACTOR == HOOK
    admins = MemorySlurm(drained("bios"))
    take_over_drain(admins, "n1", DrainBook.of(store), actor="daemon", episode_id=4)  # type: ignore[arg-type]
    mine = store.open_drain("n1")
    assert mine is not None and mine.episode_id is None  # the admin's drain: no record made
    assert admins.calls == []


@pytest.mark.parametrize("typed", ADMIN_TEXTS)
def test_an_admins_drain_is_never_medics_whatever_its_text(store: Store, typed: str) -> None:
    fake = MemorySlurm(drained(as_slurm_stores(typed)))
    book = DrainBook.of(store)
    assert book.ownership("n1", fake.info).holding is Holding.UNRECORDED
    assert drain_if_allowed(fake, "n1", OURS, book) is DrainOutcome.NOT_OURS_KEPT  # type: ignore[arg-type]
    for actor in ("hook", "ladder", "isolator", "spares", "burn-in"):
        done = give_back(fake, book, "n1", actor=actor, resolving_its_episode=True)  # type: ignore[arg-type]
        assert done.outcome is DrainOutcome.NOT_OURS, done.text
    # a human without --force is refused too: it is not Medic's drain to give back
    assert not give_back(fake, book, "n1", actor="cli:x", human=True).resumed  # type: ignore[arg-type]
    assert fake.calls == [] and store.events("n1", kind=DRAIN_RESUMED) == []


def test_a_record_matches_only_the_reason_slurm_shows(store: Store) -> None:
    book = DrainBook.of(store)
    book.record_drain("n1", OURS, actor="daemon")
    assert book.ownership("n1", drained(OURS)).holding is Holding.RECORDED
    assert book.ownership("n1", drained(OURS, ("DOWN",), "DOWN")).recorded  # reboot nextstate=DOWN
    # an admin replaced Medic's reason with their own (or a copy that differs at all)
    assert book.ownership("n1", drained(OURS + " ")).holding is Holding.UNRECORDED
    assert book.ownership("n1", drained("medic: x")).holding is Holding.UNRECORDED
    assert not book.ownership("n1", NodeInfo("n1", "IDLE", frozenset(), OURS)).recorded


def test_slurms_reboot_marks_after_the_recorded_reason_keep_it_medics(store: Store) -> None:
    """`scontrol reboot ASAP nextstate=DOWN reason=R` leaves "R : reboot issued : reboot
    complete" on the node (22.05, seen in the lab): still Medic's drain, given back whole."""
    book = DrainBook.of(store)
    book.record_drain("n1", OURS, actor="ladder", episode_id=4)
    rebooted = drained(f"{OURS} : reboot issued : reboot complete", ("DOWN",), "DOWN")
    assert book.ownership("n1", rebooted).holding is Holding.RECORDED
    timed_out = drained(f"{OURS} : reboot issued : reboot timed out", ("DOWN",), "DOWN")
    assert book.ownership("n1", timed_out).recorded
    for other in (f"{OURS} : admin was here", f"{OURS} : reboot", f"x{OURS}"):
        assert not book.ownership("n1", drained(other)).recorded, other
    fake = MemorySlurm(rebooted)
    assert give_back(fake, book, "n1", actor="ladder", resolving=4).resumed  # type: ignore[arg-type]
    assert store.open_drain("n1") is None  # the record closed by the resume


def test_a_new_drain_replaces_the_open_record_and_a_replay_is_not_a_second_drain(
    store: Store,
) -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    first = {"reason": "medic: a", "actor": "daemon", "episode_id": None, "note": ""}
    event = {"kind": DRAIN_RECORDED, "severity": "WARN", "source": "daemon"}
    store.add_event("n1", at=t0, **event, evidence=first)
    store.add_event("n1", at=t0, **event, evidence=first)  # the journal replays at least once
    second = {**first, "reason": "medic: b"}
    store.add_event("n1", at=t0 + dt.timedelta(seconds=5), **event, evidence=second)
    # an older entry replayed late never replaces the newer record
    older = {**first, "reason": "medic: old"}
    store.add_event("n1", at=t0 - dt.timedelta(seconds=5), **event, evidence=older)
    records = store.drain_records("n1")
    assert [r.reason for r in records] == ["medic: b", "medic: a", "medic: old"]
    current = store.open_drain("n1")
    assert current is not None and current.reason == "medic: b"
    with pytest.raises(ValueError, match="evidence reason and actor"):
        store.add_event("n1", at=t0, **event, evidence={"reason": "medic: c"})


# --- the store down: the journal; both down: the prefix decides drains, never a resume -------


def test_with_the_store_down_the_journal_keeps_the_record_and_it_is_replayed(
    store: Store, tmp_path: Path
) -> None:
    where = paths(tmp_path)
    down = DrainBook(DownStore(), where)
    fake = MemorySlurm()
    assert drain_if_allowed(fake, "n1", OURS, down, actor="daemon") is DrainOutcome.DRAINED  # type: ignore[arg-type]
    assert len(journal.pending(where)) == 1
    assert down.ownership("n1", fake.info).holding is Holding.RECORDED  # from the journal
    done = replay(where, store)
    assert done.delivered == 1 and journal.pending(where) == []
    up = DrainBook.of(store, where)
    assert up.ownership("n1", fake.info).holding is Holding.RECORDED  # from the store now
    assert give_back(fake, up, "n1", actor="hook").resumed  # type: ignore[arg-type]


def test_a_hold_made_before_the_journal_is_replayed_holds_the_journaled_drain(
    store: Store, tmp_path: Path
) -> None:
    """A drain journaled while the store was down, then held by a human once the store is
    back but before any replay: the hold applies to that drain (the book delivers the
    node's journaled drains first), so no automatic resume gives it back (found by the
    drain-ownership model in a CI run: the hold went to the store, the record stayed in the
    journal, and the ladder resumed a drain kept for a human)."""
    where = paths(tmp_path)
    fake = MemorySlurm()
    drain_if_allowed(fake, "n1", OURS, DrainBook(DownStore(), where), actor="daemon")  # type: ignore[arg-type]
    up = DrainBook.of(store, where)
    assert up.hold("n1", fake.info.reason, actor="cli:alice", note="closed") == "store"
    assert journal.pending(where) == []
    record = store.open_drain("n1")
    assert record is not None and record.held == "cli:alice: closed"
    assert not give_back(fake, up, "n1", actor="ladder").resumed  # type: ignore[arg-type]
    assert give_back(fake, up, "n1", actor="cli:alice(uid 1000)", human=True).resumed  # type: ignore[arg-type]


def test_a_resume_while_the_store_is_down_is_journaled_and_closes_the_record_on_replay(
    store: Store, tmp_path: Path
) -> None:
    where = paths(tmp_path)
    DrainBook.of(store).record_drain("n1", OURS, actor="daemon")
    fake = MemorySlurm(drained(OURS))
    # the store went down: the journal alone cannot say whose the drain is, so no resume
    down = DrainBook(DownStore(), where)
    assert down.ownership("n1", fake.info).holding is Holding.UNREACHABLE
    assert give_back(fake, down, "n1", actor="hook").outcome is DrainOutcome.NOT_OURS  # type: ignore[arg-type]
    # a drain the journal itself holds is Medic's: given back, the resume journaled
    fake.info = NodeInfo("n1", "IDLE", frozenset())
    drain_if_allowed(fake, "n1", format_reason("gpu.ecc.dbe", "1"), down, actor="daemon")  # type: ignore[arg-type]
    assert give_back(fake, down, "n1", actor="hook").resumed  # type: ignore[arg-type]
    assert len(journal.pending(where)) == 2
    replay(where, store)
    assert store.open_drain("n1") is None
    assert [e.evidence["actor"] for e in store.events("n1", kind=DRAIN_RESUMED)] == ["hook"]


def test_with_store_and_journal_unreachable_medic_drains_but_never_resumes() -> None:
    book = DrainBook(DownStore(), None)
    fake = MemorySlurm()
    assert drain_if_allowed(fake, "n1", OURS, book, actor="daemon") is DrainOutcome.DRAINED  # type: ignore[arg-type]
    assert book.ownership("n1", fake.info).holding is Holding.UNREACHABLE
    # the prefix still keeps Medic from drawing over its own drain or another's
    assert drain_if_allowed(fake, "n1", OURS, book) is DrainOutcome.ALREADY_MEDIC  # type: ignore[arg-type]
    done = give_back(fake, book, "n1", actor="hook")  # type: ignore[arg-type]
    assert not done.resumed and "no resume without a record" in done.why
    assert fake.calls == ["drain"]


def replay(where: NodePaths, store: Store) -> journal.Replay:
    return journal.replay(where, lambda e: store.add_event(**e.store_fields()))


# --- the decision core ------------------------------------------------------------------------


def test_decide_resume_needs_a_record_and_keeps_a_human_hold() -> None:
    ours = NodeFacts(drained=True, reason=OURS, recorded=True)
    assert decide_resume(ours).resume
    assert decide_resume(dataclasses.replace(ours, recorded=None)).refusal is Refusal.NO_RECORD
    assert decide_resume(dataclasses.replace(ours, recorded=False)).refusal is Refusal.NOT_OURS
    held = dataclasses.replace(ours, held="alice: episode 3 closed")
    assert decide_resume(held).refusal is Refusal.HELD
    assert decide_resume(held, human=True).resume
    # a drain made for an episode: its ladder (resolving it) or a human, not a bystander
    bound = dataclasses.replace(ours, drain_episode=3)
    assert decide_resume(bound).refusal is Refusal.HELD
    assert decide_resume(bound, resolving=3).resume
    assert decide_resume(bound, human=True).resume
    # --force is a human's alone, and resumes any drain
    admin = NodeFacts(drained=True, reason="medic: x", recorded=False)
    assert not decide_resume(admin, force=True).resume
    assert decide_resume(admin, human=True, force=True).resume
    assert decide_resume(NodeFacts(), human=True, force=True).refusal is Refusal.NOT_DRAINED


def test_owner_is_medic_only_with_a_record_or_the_prefix_while_unreachable() -> None:
    assert NodeFacts(drained=True, reason="medic: x", recorded=False).owner == "other"
    assert NodeFacts(drained=True, reason="medic: x", recorded=True).owner == "medic"
    assert NodeFacts(drained=True, reason="medic: x", recorded=None).owner == "medic"
    assert NodeFacts(drained=True, reason="bios", recorded=None).owner == "other"
    assert judge(drained("medic: x"), None, readable=False).holding is Holding.UNREACHABLE


def test_the_operator_is_named_by_login_and_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    assert operator().endswith(f"(uid {os.getuid()})") and operator().startswith("cli:")

    def no_terminal() -> str:
        raise OSError(6, "No such device or address")

    monkeypatch.setattr(os, "getlogin", no_terminal)
    import pwd

    assert operator() == f"cli:{pwd.getpwuid(os.getuid()).pw_name}(uid {os.getuid()})"


# --- the CLI: closing a needs-human episode, `medic node resume` --------------------------------


def test_closing_a_needs_human_episode_keeps_the_node_for_a_human(
    db: tuple[Store, list[str]],  # noqa: F811
    slurm: FakeSlurm,  # noqa: F811
) -> None:
    store, conf = db
    slurm.add_node("n3", "IDLE", ("DRAIN",), OURS)
    e = opened(store, "n3", ep.NEEDS_HUMAN)
    DrainBook.of(store).record_drain("n3", OURS, actor="daemon", episode_id=e.id)
    closed = run(episode, "close", str(e.id), "--reason", "reseated", *conf)
    assert closed.exit_code == 0 and "NOT resumed" in closed.stdout
    # the health check (any automatic path) finds the drain kept for a human
    hook = give_back(slurm, DrainBook.of(store), "n3", actor="hook")  # type: ignore[arg-type]
    assert hook.outcome is DrainOutcome.KEPT and "kept for a human" in hook.why
    assert slurm.calls == []
    resumed = run(node, "resume", "n3", "--reason", "checked it", *conf)
    assert resumed.exit_code == 0, resumed.output
    assert slurm.calls == [("resume", "n3")]
    [event] = store.events("n3", kind=DRAIN_RESUMED)
    assert event.evidence["actor"] == operator()


def test_close_with_resume_gives_the_node_back_and_names_the_operator(
    db: tuple[Store, list[str]],  # noqa: F811
    slurm: FakeSlurm,  # noqa: F811
) -> None:
    store, conf = db
    slurm.add_node("n3", "IDLE", ("DRAIN",), OURS)
    e = opened(store, "n3", ep.NEEDS_HUMAN)
    DrainBook.of(store).record_drain("n3", OURS, actor="daemon", episode_id=e.id)
    closed = run(episode, "close", str(e.id), "--reason", "reseated", "--resume", *conf)
    assert closed.exit_code == 0, closed.output
    assert "n3: resumed" in closed.stdout and slurm.calls == [("resume", "n3")]
    [event] = store.events("n3", kind=DRAIN_RESUMED)
    assert event.evidence["actor"] == operator() and event.evidence["episode_id"] == e.id


@pytest.mark.parametrize("typed", ["medic: x", '"medic: x"'])
def test_medic_node_resume_refuses_an_unrecorded_medic_looking_drain_unless_forced(
    db: tuple[Store, list[str]],  # noqa: F811
    slurm: FakeSlurm,  # noqa: F811
    typed: str,
) -> None:
    store, conf = db
    slurm.add_node("n5", "IDLE", ("DRAIN",), as_slurm_stores(typed))
    refused = run(node, "resume", "n5", "--reason", "done", *conf)
    assert refused.exit_code == 1 and "was not drained by Medic" in refused.stderr
    assert slurm.calls == []
    forced = run(node, "resume", "n5", "--reason", "mine", "--force", *conf)
    assert forced.exit_code == 0, forced.output
    [event] = store.events("n5", kind=DRAIN_RESUMED)
    assert event.evidence["actor"] == operator() and "forced" in event.message


# --- `medic nodes`: whose a drain is -----------------------------------------------------------


def test_medic_nodes_names_the_drainer_from_the_records_not_the_text(store: Store) -> None:
    """n1: Medic's recorded drain; n2: an admin's "medic: x" on a node whose daemon writes to
    this store (no record holds it); n3: a "medic: " drain of a node this store knows nothing
    of (its daemon keeps a store of its own): only the text can tell there."""
    from cli.nodes import fleet
    from medic_core.store import ConditionUpdate

    now = dt.datetime.now(dt.UTC)
    for name in ("n1", "n2"):
        store.set_condition(name, ConditionUpdate("gpu_count", "OK"), now)
    DrainBook.of(store).record_drain("n1", as_slurm_stores(OURS), actor="ladder")
    infos = [
        NodeInfo("n1", "IDLE", frozenset({"DRAIN"}), as_slurm_stores(OURS) + " : reboot issued"),
        NodeInfo("n2", "IDLE", frozenset({"DRAIN"}), "medic: x"),
        NodeInfo("n3", "IDLE", frozenset({"DRAIN"}), as_slurm_stores(OURS)),
        NodeInfo("n4", "IDLE", frozenset({"DRAIN"}), "bios update"),
    ]
    by = {v.node: v.drained_by for v in fleet(store, infos, now)}
    assert by == {"n1": "medic", "n2": "other", "n3": "medic", "n4": "other"}


def test_a_reason_slurm_keeps_after_a_resume_is_not_a_drain_reason() -> None:
    """24.11 keeps a node's reason after `scontrol update state=resume` (22.05 and 26.05
    clear it): `medic nodes` and `medic node show` name no drain for a node in service."""
    import datetime as dt

    from cli.node_view import StoreFacts
    from cli.nodes import NodeView
    from medic_core.slurm import NodeInfo

    now = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)
    kept = "medic: gpu.xid.79 gpu2 GPU has fallen off the bus"
    facts = StoreFacts(drain_record=None)
    resumed = NodeView.of("n1", NodeInfo("n1", "IDLE", frozenset(), reason=kept), facts, now)
    assert resumed.drain_reason == "" and resumed.drained_by is None
    assert resumed.to_json()["drain_reason"] == ""
    for flags, state in ((frozenset({"DRAIN"}), "IDLE"), (frozenset(), "DOWN")):
        out = NodeView.of("n1", NodeInfo("n1", state, flags, reason=kept), facts, now)
        assert out.drain_reason == kept

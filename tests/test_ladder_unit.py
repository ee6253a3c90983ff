"""The ladder's edges as unit tests: the real `remediation.ladder.Ladder` on a real SQLite
store in tmp_path, with a fake Slurm (nodes and jobs in memory; only the calls the ladder and
the daemon's fault response make, any other call fails), a fake node (its boot id, jobs, GPU
processes, what a verification finds, and its repair commands, which succeed, fail or hang)
and a fake clock (the store's wall clock, the ladder's monotonic clock, Slurm's reason times).

A crash is a `Crash` raised at a named point of a step (the daemon killed there); the daemon's
restart is a new Ladder over a freshly opened store. The lab (tests/test_remediation.py) keeps
the end-to-end paths: the fault matrix, one crash and restart through real Slurm, the IB
re-check, the drain cap and fleet pause on every node at once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from medic_core.drain_book import DrainBook
from medic_core.drain_reason import is_medic_reason
from medic_core.proc import CommandResult
from medic_core.settings import RemediationSettings
from medic_core.slurm import NodeInfo
from medic_core.status import Status
from medic_core.store import Store, open_store
from medic_core.vocabulary import Finding, Recommendation
from remediation import episodes as ep
from remediation import ladder as ladder_module
from remediation import tickets
from remediation.actions import carry_out, job_facts
from remediation.ladder import (
    REBOOT_REFUSALS,
    REBOOT_REFUSED_RETRY,
    REQUALIFY_RETRY,
    Admission,
    Ladder,
)
from remediation.policy import Rung
from tests.fakes import FakeSlurm

NODES = ("n1", "n2", "n3", "n4", "n5")  # one partition: the cap is max(1, 10 % of 5) = 1
START = dt.datetime(2025, 3, 3, 12, 0, tzinfo=dt.UTC)
TICK = 2.0  # the ladder thread's period

XID_95 = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.95", "3", "XID 95", Recommendation.GPU_RESET)
XID_48 = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.48", "1", "XID 48", Recommendation.GPU_RESET)
XID_79 = Finding(
    "gpu_xid", Status.CRITICAL, "gpu.xid.79", "2", "off the bus", Recommendation.REBOOT
)
ECC = Finding("gpu_ecc", Status.CRITICAL, "gpu.ecc.dbe", "1", "DBE", Recommendation.GPU_RESET)
NODE_WIDE = Finding(
    "gpu_count", Status.CRITICAL, "gpu.missing", "", "7 of 8", Recommendation.GPU_RESET
)
REMAP = Finding("gpu_remap", Status.CRITICAL, "gpu.remap.failure", "1", "remap", Recommendation.RMA)


# --- the clock -------------------------------------------------------------------------------


class Clock:
    """Wall time (the store's `now`, Slurm's reason times) and the ladder's monotonic time,
    moved only by the test."""

    def __init__(self) -> None:
        self.wall = START
        self.mono = 50_000.0

    def now(self) -> dt.datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def epoch(self) -> int:
        return int(self.wall.timestamp())

    def advance(self, seconds: float) -> None:
        self.wall += dt.timedelta(seconds=seconds)
        self.mono += seconds


# --- crashes ---------------------------------------------------------------------------------


class Crash(BaseException):
    """The daemon killed at this point (BaseException: nothing in the ladder catches it)."""


class Crasher:
    """One armed crash point; it fires once."""

    def __init__(self) -> None:
        self.armed = ""
        self.fired: list[str] = []

    def point(self, name: str) -> None:
        if self.armed == name:
            self.armed = ""
            self.fired.append(name)
            raise Crash(name)


@dataclass
class CrashingEpisodes(ep.EpisodeStore):
    """The real episode store, with crash points around its writes."""

    crasher: Crasher = field(default_factory=Crasher)

    def record_intent(
        self, episode: ep.Episode, rung: int, action: str, argv: Sequence[str], boot_id: str
    ) -> ep.Step:
        self.crasher.point("before_intent")
        step = super().record_intent(episode, rung, action, argv, boot_id)
        self.crasher.point("after_intent")
        return step

    def finish_step(
        self, step_id: int, state: str, returncode: int | None = None, output: str = ""
    ) -> None:
        if state != "interrupted":
            self.crasher.point("after_action")  # the command ran (Slurm was asked): unrecorded
        super().finish_step(step_id, state, returncode, output)
        if state != "interrupted":
            self.crasher.point("after_outcome")

    def update(self, episode_id: int, **values: Any) -> ep.Episode:
        state = values.get("state")
        if state == ep.VERIFYING:
            self.crasher.point("before_verifying")
        if state == ep.RESOLVED:
            self.crasher.point("after_resume")  # Slurm resumed the node; not recorded yet
        episode = super().update(episode_id, **values)
        if state == ep.REBOOTING:
            self.crasher.point("before_asking")
        return episode


# --- Slurm -----------------------------------------------------------------------------------


class LadderSlurm(FakeSlurm):
    """tests.fakes.FakeSlurm over the five nodes, reason times on the world's clock, every
    call recorded (reads too: a settled ladder asks Slurm nothing). Only the calls the
    ladder and the daemon's fault response (through remediation.actions) make are allowed,
    any other fails the test; a node read while Slurm holds its reboot is a crash point (the
    daemon killed there)."""

    def __init__(self, clock: Clock, crasher: Crasher) -> None:
        unexpected = ("jobs", "release", "hold", "start_now")
        super().__init__(NODES, clock=clock.epoch, forbid=unexpected, record_reads=True)
        self.crasher = crasher

    def node(self, name: str) -> NodeInfo | None:
        found = super().node(name)
        if found is not None and found.reboot_pending:
            self.crasher.point("rebooting")
        return found


# --- the node --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostEvent:
    message: str
    severity: str
    fault_class: str


class FakeNode:
    """The ladder's host: the node's boot id, its jobs (from Slurm), GPU processes, what a
    fresh verification finds, events, RMA tickets, and its repair commands. A successful
    repair (or a reboot) clears the node's findings unless `hardware_fault`."""

    def __init__(self, name: str, world: World) -> None:
        self.name = name
        self.world = world
        self.boot = f"{name}-boot-1"
        self.reboots = 0
        self.findings: list[Finding] = []
        self.hardware_fault = False
        self.busy_gpus: set[int] = set()
        self.outcomes: list[str] = []  # of the next repair commands: ok, fail, hang
        self.commands: list[tuple[tuple[str, ...], int]] = []  # argv, the step it ran for
        self.repaired: list[tuple[int | None, float]] = []
        self.nvml_open = True  # the daemon's NVML session (released around every repair)
        self.verifications = 0
        self.events: list[HostEvent] = []
        self.rma: list[tuple[int, str]] = []

    # LadderHost

    def boot_id(self) -> str:
        return self.boot

    def jobs_running(self) -> bool:
        return self.world.slurm.running_on(self.name)

    def gpu_busy(self, gpu: int) -> bool:
        return gpu in self.busy_gpus

    def release_gpus(self) -> None:
        assert self.nvml_open, "released twice"
        self.nvml_open = False

    def reacquire_gpus(self) -> None:
        assert not self.nvml_open, "reacquired without a release"
        self.nvml_open = True

    def after_repair(self, gpu: int | None, before: float) -> None:
        assert self.nvml_open
        self.repaired.append((gpu, before))

    def verify(self, extra_checks: Sequence[str]) -> list[Finding]:
        self.verifications += 1
        self.world.crasher.point("verifying")
        return list(self.findings)

    def event(self, message: str, *, severity: str, fault_class: str, target: str) -> None:
        self.events.append(HostEvent(message, severity, fault_class))

    def open_rma(self, episode: ep.Episode, why: str) -> int | None:
        ticket = tickets.open_ticket(
            self.world.store, self.name, episode.fault_class, f"{episode.fault_class}: {why}",
            [], {"episode": episode.id, "why": why}, "medic-ladder",
        )  # fmt: skip
        self.rma.append((ticket.id, why))
        self.world.crasher.point("after_ticket")
        return ticket.id

    # the repair commands (medic_core.proc.run, as the ladder calls it)

    def run(self, argv: tuple[str, ...], timeout: float) -> CommandResult:
        steps = self.world.episodes.steps(self.world.last(self.name).id)
        assert steps and steps[-1].state == "intent", "a command without its intent"
        # A client of the GPU (the daemon's NVML) makes a reset refuse, an unload fail.
        assert not self.nvml_open, "a repair run with the daemon's NVML still open"
        self.commands.append((argv, steps[-1].id))
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if outcome == "hang":
            self.world.clock.advance(timeout)
            return CommandResult(argv, None, "", "", timeout, timed_out=True)
        if outcome == "fail":
            return CommandResult(argv, 3, "", "Unable to reset GPU: in use by another client", 1)
        assert outcome == "ok", outcome
        if not self.hardware_fault:
            self.findings.clear()
        return CommandResult(argv, 0, "GPU reset", "", 1.0)

    # views

    def said(self, text: str) -> list[HostEvent]:
        return [e for e in self.events if text in e.message]


# --- the world -------------------------------------------------------------------------------


class World:
    """Five nodes in one partition, the shared store, Slurm, the clock, and each node's
    daemon (its Ladder). `restart(node)` is a daemon restart: a new Ladder over a store opened
    again; nothing survives but what the store and Slurm hold."""

    def __init__(self, db: Path) -> None:
        self.url = f"sqlite:///{db}"
        self.clock = Clock()
        self.crasher = Crasher()
        self.slurm = LadderSlurm(self.clock, self.crasher)
        self.settings = RemediationSettings(
            gpu_reset=("fake-gpu-reset", "{node}", "{gpu}"),
            driver_reload=("fake-driver-reload", "{node}"),
        )
        self.stores: list[Store] = []
        self.store = self._open()
        self.episodes = ep.EpisodeStore(self.store, clock=self.clock.now)
        self.nodes = {n: FakeNode(n, self) for n in NODES}
        self.daemons: dict[str, Ladder] = {}

    def _open(self) -> Store:
        store = open_store(self.url)
        self.stores.append(store)
        return store

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def configure(self, **settings: Any) -> None:
        self.settings = dataclasses.replace(self.settings, **settings)
        self.daemons.clear()

    # the commands the ladder runs (remediation.ladder.proc.run)

    def run_command(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        args = tuple(argv)
        assert args[0] in ("fake-gpu-reset", "fake-driver-reload"), f"unexpected command {args}"
        assert timeout == self.settings.action_timeout
        return self.nodes[args[1]].run(args, timeout)

    # daemons

    def daemon(self, node: str) -> Ladder:
        if node not in self.daemons:
            self.restart(node)
        return self.daemons[node]

    def restart(self, node: str) -> Ladder:
        episodes = CrashingEpisodes(self._open(), clock=self.clock.now, crasher=self.crasher)
        self.daemons[node] = Ladder(node, episodes, self.slurm, self.nodes[node], self.settings)
        return self.daemons[node]

    def tick(self, node: str) -> ep.Episode | None:
        return self.daemon(node).tick()

    def fault(self, node: str, *findings: Finding) -> Admission:
        """The daemon's response to a fresh fault (healthd.ladder_thread.respond): the
        ladder admits it, remediation.actions carries the decision out."""
        self.nodes[node].findings = list(findings)
        ladder = self.daemon(node)
        admission = ladder.admit(findings, job_facts(self.slurm, node))
        episode = admission.episode.id if admission.episode is not None else None
        drained, _ = carry_out(
            self.slurm, node, admission.decision, book=ladder.book, episode_id=episode
        )
        if drained is not None:
            ladder.drained(admission, drained.value)
        return admission

    def reboot_happens(self, node: str) -> None:
        """Slurm's RebootProgram: the node reboots (its daemon with it) and comes back in the
        state the reboot asked for."""
        n = self.slurm.by_name[node]
        assert n.reboot_next and not self.slurm.running_on(node)
        host = self.nodes[node]
        host.reboots += 1
        host.boot = f"{node}-boot-{host.reboots + 1}"
        if not host.hardware_fault:
            host.findings.clear()
        n.state = "DOWN" if n.reboot_next == "DOWN" else "IDLE"
        n.drain, n.reboot_next = False, ""
        self.restart(node)

    def run(self, node: str, *, every: float = 20.0, ticks: int = 80) -> ep.Episode:
        """Tick `node`'s daemon until its last episode closes; a crash restarts the daemon,
        a reboot asked of Slurm happens after the next tick."""
        for _ in range(ticks):
            asked = self.slurm.by_name[node].reboot_next
            try:
                self.tick(node)
            except Crash:
                self.restart(node)
            if asked and self.slurm.by_name[node].reboot_next:
                self.reboot_happens(node)
            self.clock.advance(every)
            last = self.last(node)
            if not last.open:
                return last
        raise AssertionError(f"{node}: episode still {self.last(node).state}")

    # views

    def last(self, node: str) -> ep.Episode:
        return self.episodes.find(node=node)[-1]

    def steps(self, node: str) -> list[ep.Step]:
        return self.episodes.steps(self.last(node).id)

    def opened(self, node: str, state: str, rung: int = 1, **values: Any) -> ep.Episode:
        """An episode written straight into the store (history, or a state to start from)."""
        e = self.episodes.open_episode(
            node, state=state, fault_class="gpu.xid.95", target="3", check="gpu_xid",
            recommendation="gpu_reset", rung=rung, message="earlier", evidence={},
        )  # fmt: skip
        return self.episodes.update(e.id, **values) if values else e

    def medic_drained(self, node: str, reason: str) -> None:
        """A drain Medic made earlier: its record (medic_core.drain_book), then Slurm's."""
        DrainBook.of(self.store).record_drain(node, reason, actor="ladder")
        self.slurm.admin_drain(node, reason)

    def rma_ticket(self, node: str, fault_class: str = "gpu.remap.failure") -> int:
        return tickets.open_ticket(
            self.store, node, fault_class, "earlier RMA", [], {}, "medic-ladder"
        ).id

    def close_ticket(self, ticket_id: int) -> None:
        for state in ("submitted", "acknowledged", "replaced", "closed"):
            tickets.transition(self.store, ticket_id, state, "vendor")


@pytest.fixture(scope="session")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated store, copied for each test (migrating takes longer than a test)."""
    path = tmp_path_factory.mktemp("ladder-template") / "medic.db"
    with open_store(f"sqlite:///{path}"):
        pass
    return path


@pytest.fixture
def world(template_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    db = tmp_path / "medic.db"
    shutil.copyfile(template_db, db)
    w = World(db)
    monkeypatch.setattr(ladder_module, "time", types.SimpleNamespace(monotonic=w.clock.monotonic))
    monkeypatch.setattr(ladder_module, "proc", types.SimpleNamespace(run=w.run_command))
    yield w
    w.close()


def in_service(world: World, node: str) -> bool:
    return world.slurm.by_name[node].in_service


# --- crashes: a daemon killed at every step of every rung -------------------------------------

RUNGS = {
    # rung: the finding, the [remediation.first_rung] override that starts it there
    "gpu_reset": (XID_95, {}),
    "driver_reload": (XID_95, {"gpu.xid.95": "driver_reload"}),
    "reboot": (XID_79, {}),
}
REPAIR_CRASHES = ["before_intent", "after_intent", "after_action", "after_outcome",
                  "before_verifying", "verifying", "after_resume"]  # fmt: skip
REBOOT_CRASHES = ["before_intent", "after_intent", "before_asking", "after_action",
                  "after_outcome", "rebooting", "before_verifying", "verifying",
                  "after_resume"]  # fmt: skip
CRASHES = [(r, p) for r in ("gpu_reset", "driver_reload") for p in REPAIR_CRASHES] + [
    ("reboot", p) for p in REBOOT_CRASHES
]


def assert_repaired_once(world: World, node: str, episode: ep.Episode) -> None:
    """Resolved, back in service through one resume, no step left as a bare intent, and each
    action done at most once per intent: one reboot asked of Slurm (and one reboot), each
    command run for a step of its own."""
    host = world.nodes[node]
    assert episode.state == ep.RESOLVED, episode.message
    assert in_service(world, node)
    assert len(world.slurm.called("resume", node)) == 1
    steps = world.episodes.steps(episode.id)
    assert all(s.state != "intent" for s in steps), [(s.action, s.state) for s in steps]
    ran_for = [step for _, step in host.commands]
    assert len(ran_for) == len(set(ran_for)), "a command ran twice for one intent"
    assert host.nvml_open, "NVML left released after a repair"
    assert len(world.slurm.called("reboot", node)) == host.reboots <= 1
    assert not host.findings


@pytest.mark.parametrize(("rung", "crash"), CRASHES, ids=[f"{r}-{p}" for r, p in CRASHES])
def test_a_crash_at_any_step_never_repeats_the_action_and_finishes(
    world: World, rung: str, crash: str
) -> None:
    finding, first_rung = RUNGS[rung]
    world.configure(first_rung=first_rung)
    admission = world.fault("n1", finding)
    assert admission.episode is not None and admission.episode.rung == int(Rung.from_word(rung))
    world.crasher.armed = crash
    episode = world.run("n1")
    assert world.crasher.fired == [crash]
    assert_repaired_once(world, "n1", episode)
    host = world.nodes["n1"]
    if crash != "after_intent":  # the rung's own action, once
        if rung == "reboot":
            assert host.reboots == 1 and not host.commands
        else:
            assert [argv[0] for argv, _ in host.commands] == [f"fake-{rung.replace('_', '-')}"]
    elif rung == "gpu_reset":
        # Killed before the reset ran: the intent counts as attempt 1 (interrupted); the
        # node is verified, still faulty, and attempt 2 runs: a retry, not a repeat.
        steps = world.episodes.steps(episode.id)
        assert [(s.attempt, s.state) for s in steps] == [(1, "interrupted"), (2, "done")]
    elif rung == "driver_reload":  # its one attempt interrupted: the next rung is a reboot
        steps = world.episodes.steps(episode.id)
        assert [(s.action, s.state) for s in steps] == [
            ("driver_reload", "interrupted"),
            ("reboot", "done"),
        ]
        assert not host.commands and host.reboots == 1
    else:  # the reboot was never asked: asked now, once, as the same attempt
        steps = world.episodes.steps(episode.id)
        assert [(s.attempt, s.state) for s in steps] == [(1, "interrupted"), (1, "done")]


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_a_daemon_restarted_before_every_tick_repairs_the_same_way(world: World, rung: str) -> None:
    """Nothing the ladder needs lives in the Ladder object: a new one at every tick."""
    finding, first_rung = RUNGS[rung]
    world.configure(first_rung=first_rung)
    world.fault("n1", finding)
    for _ in range(5):
        world.restart("n1")
        asked = world.slurm.by_name["n1"].reboot_next
        world.tick("n1")
        if asked:
            world.reboot_happens("n1")
        world.clock.advance(TICK)
    episode = world.last("n1")
    assert_repaired_once(world, "n1", episode)
    assert [s.state for s in world.episodes.steps(episode.id)] == ["done"]


def test_a_crash_mid_reset_is_judged_by_a_fresh_verification_not_run_again(world: World) -> None:
    """The daemon recorded the intent and died while the reset ran (and cured the GPU)."""
    world.fault("n1", XID_95)
    world.crasher.armed = "after_action"
    with pytest.raises(Crash):
        world.tick("n1")
    world.restart("n1")
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.RESOLVED
    [step] = world.steps("n1")
    assert (step.state, step.attempt, step.output) == ("interrupted", 1, "daemon restarted")
    assert len(world.nodes["n1"].commands) == 1


def test_a_restart_while_slurm_holds_the_reboot_waits_and_never_asks_again(world: World) -> None:
    world.fault("n1", XID_79)
    world.tick("n1")
    assert world.last("n1").state == ep.REBOOTING
    for _ in range(5):  # the node takes its time to go down: the daemon restarts meanwhile
        world.restart("n1")
        assert world.tick("n1") is not None
        world.clock.advance(60)
    assert len(world.slurm.called("reboot")) == 1 and world.last("n1").state == ep.REBOOTING
    world.reboot_happens("n1")
    assert_repaired_once(world, "n1", world.run("n1"))


def test_a_crash_after_the_rma_ticket_opened_opens_no_second_one(world: World) -> None:
    world.fault("n1", REMAP)
    world.crasher.armed = "after_ticket"
    with pytest.raises(Crash):
        world.tick("n1")
    world.restart("n1")
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.RMA
    [ticket] = tickets.list_tickets(world.store, node="n1")
    assert episode.ticket_id == ticket.id
    assert [t for t, _ in world.nodes["n1"].rma] == [ticket.id, ticket.id]


def test_a_reboot_that_never_comes_escalates_after_reboot_timeout(world: World) -> None:
    world.fault("n1", XID_79)
    world.tick("n1")
    world.clock.advance(world.settings.reboot_timeout - 1)
    assert world.tick("n1") is not None and world.last("n1").state == ep.REBOOTING
    world.clock.advance(2)
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.RMA
    assert "no new boot within" in world.nodes["n1"].rma[0][1]
    assert len(world.slurm.called("reboot")) == 1


# --- the ladder's climb, attempts and cool-downs -----------------------------------------------


def test_a_fault_no_repair_cures_climbs_every_rung_with_cooldowns_to_rma(world: World) -> None:
    host = world.nodes["n1"]
    host.hardware_fault = True
    world.fault("n1", XID_95)
    timeline: list[tuple[str, float]] = []
    t0 = world.clock.monotonic()
    for _ in range(200):
        asked = world.slurm.by_name["n1"].reboot_next
        before = len(world.steps("n1"))
        world.tick("n1")
        timeline += [(s.action, world.clock.monotonic() - t0) for s in world.steps("n1")[before:]]
        if asked:
            world.reboot_happens("n1")
        if not world.last("n1").open:
            break
        world.clock.advance(5)
    episode = world.last("n1")
    assert episode.state == ep.RMA and episode.rung == int(Rung.RMA)
    assert [a for a, _ in timeline] == ["gpu_reset", "gpu_reset", "driver_reload", "reboot"]
    times = dict(
        zip(["reset1", "reset2", "reload", "reboot"], [t for _, t in timeline], strict=True)
    )
    # Verified a tick after each step; the reset's cool-down is 0, the reload's 60 s.
    assert times["reset2"] - times["reset1"] == 10
    assert times["reload"] - times["reset2"] == 10
    assert times["reboot"] - times["reload"] >= 60
    assert episode.failed_requalifications == 4
    assert host.rma and host.rma[0][0] == episode.ticket_id
    node = world.slurm.by_name["n1"]
    assert not node.in_service and is_medic_reason(node.reason)
    assert host.said("RMA ticket") and host.said("next: rma")


@pytest.mark.parametrize(("action", "seconds"), [("gpu_reset", 90.0), ("driver_reload", 60.0)])
def test_a_cooldown_holds_the_next_step_after_a_failed_one(
    world: World, action: str, seconds: float
) -> None:
    finding, first_rung = RUNGS[action]
    world.configure(first_rung=first_rung, cooldown={action: seconds},
                    attempts={"gpu_reset": 2, "driver_reload": 2})  # fmt: skip
    world.nodes["n1"].outcomes = ["fail"]
    world.fault("n1", finding)
    world.tick("n1")  # the step fails
    world.clock.advance(TICK)
    world.tick("n1")  # verified: still faulty, the same rung again after its cool-down
    assert world.last("n1").state == ep.WAITING_IDLE
    failed = world.steps("n1")[-1]
    assert failed.state == "failed" and failed.ended_at is not None
    while world.clock.now() - failed.ended_at < dt.timedelta(seconds=seconds):
        world.tick("n1")
        assert len(world.steps("n1")) == 1
        world.clock.advance(10)
    world.tick("n1")
    assert [s.state for s in world.steps("n1")] == ["failed", "done"]


@pytest.mark.parametrize("outcome", ["fail", "hang"])
def test_a_failed_or_hung_command_is_a_failed_step_then_retried(world: World, outcome: str) -> None:
    host = world.nodes["n1"]
    host.outcomes = [outcome]
    world.fault("n1", XID_95)
    started = world.clock.monotonic()
    episode = world.run("n1", every=TICK)
    assert episode.state == ep.RESOLVED
    steps = world.steps("n1")
    assert [(s.attempt, s.state) for s in steps] == [(1, "failed"), (2, "done")]
    assert steps[0].returncode == (None if outcome == "hang" else 3)
    said = "timed out after 300.0s" if outcome == "hang" else "exit 3: Unable to reset GPU"
    assert host.said(said)
    # Only a repair that worked clears the GPU's XIDs, from before the command started.
    [(gpu, before)] = host.repaired
    assert gpu == 3 and before > started + (300 if outcome == "hang" else 0)


def test_jobs_and_a_busy_gpu_hold_the_repair(world: World) -> None:
    world.slurm.start_job("5", "n1")
    world.fault("n1", XID_95)
    host = world.nodes["n1"]
    host.busy_gpus = {3}
    for _ in range(3):
        world.tick("n1")
        world.clock.advance(600)
    assert world.last("n1").state == ep.WAITING_IDLE and not host.commands
    world.slurm.end_job("5")
    world.tick("n1")
    assert not host.commands  # a process still holds GPU 3
    host.busy_gpus = set()
    assert world.run("n1").state == ep.RESOLVED and len(host.commands) == 1


def test_a_node_wide_fault_skips_the_per_gpu_reset(world: World) -> None:
    world.fault("n1", NODE_WIDE)
    assert world.run("n1").state == ep.RESOLVED
    assert [s.action for s in world.steps("n1")] == ["driver_reload"]
    assert world.nodes["n1"].said("no single GPU to reset")


def test_dry_run_records_and_does_nothing(world: World) -> None:
    world.configure(dry_run=True)
    admission = world.fault("n1", XID_95)
    assert admission.drain  # a sick node must not take jobs, dry run or not
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.NEEDS_HUMAN
    assert world.steps("n1") == [] and not world.nodes["n1"].commands
    assert world.nodes["n1"].said("dry run: would start gpu_reset")


def test_the_same_fault_reported_twice_joins_the_episode_it_closed(world: World) -> None:
    """A sweep and the node's daemon both see it: one episode, one drain."""
    world.configure(enabled=False)  # every episode goes to a human
    first = world.fault("n1", XID_95)
    assert first.episode is not None and first.episode.state == ep.NEEDS_HUMAN and first.drain
    world.clock.advance(30)
    again = world.fault("n1", XID_95)
    assert again.episode is not None and again.episode.id == first.episode.id
    assert not again.drain and len(world.slurm.called("drain")) == 1
    other = world.fault("n1", ECC)
    assert other.episode is not None and other.episode.id != first.episode.id
    world.clock.advance(120)  # past the join window: a new episode
    late = world.fault("n1", ECC)
    assert late.episode is not None and late.episode.id != other.episode.id


def test_a_repaired_node_sees_the_next_fault(world: World) -> None:
    world.fault("n1", XID_95)
    first = world.run("n1")
    world.clock.advance(5)
    admission = world.fault("n1", XID_95)
    assert admission.drain and admission.episode is not None
    assert admission.episode.id != first.id
    assert world.run("n1").state == ep.RESOLVED
    assert len(world.nodes["n1"].commands) == 2 and len(world.slurm.called("resume")) == 2


# --- the drain cap -------------------------------------------------------------------------------


def test_a_fault_past_the_cap_waits_in_service_and_drains_when_the_cap_frees(
    world: World,
) -> None:
    world.fault("n1", XID_95)
    assert not in_service(world, "n1")
    job = world.slurm.start_job("42", "n2", comment="medic:resilient=3")
    capped = world.fault("n2", ECC)
    assert capped.episode is not None and capped.episode.state == ep.WAITING_CAP
    assert not capped.drain and in_service(world, "n2")
    # The owner is told why the job was left running on a faulty node.
    assert "not requeued: drain cap reached" in job.admin_comment
    assert not world.slurm.called("requeue")
    for _ in range(3):
        assert world.tick("n2") is not None
        world.clock.advance(TICK)
    assert world.last("n2").state == ep.WAITING_CAP and in_service(world, "n2")
    assert world.run("n1").state == ep.RESOLVED  # the slot frees
    episode = world.tick("n2")
    assert episode is not None and episode.state == ep.WAITING_IDLE
    node = world.slurm.by_name["n2"]
    assert node.drain and node.reason.startswith("medic: gpu.ecc.dbe gpu1 drain cap freed")
    assert world.nodes["n2"].said("drain cap freed: drained")
    assert not world.nodes["n2"].commands  # the job still runs: the repair waits
    world.slurm.end_job("42")
    assert world.run("n2").state == ep.RESOLVED


def test_a_freed_slot_goes_to_one_waiting_node(world: World) -> None:
    world.fault("n1", XID_95)
    for node in ("n2", "n3"):
        admission = world.fault(node, ECC)
        assert admission.episode is not None and admission.episode.state == ep.WAITING_CAP
    world.run("n1")
    world.tick("n2")
    world.tick("n3")
    assert world.last("n2").state == ep.WAITING_IDLE and not in_service(world, "n2")
    assert world.last("n3").state == ep.WAITING_CAP and in_service(world, "n3")


def test_an_admitted_episode_holds_its_slot_before_slurm_shows_the_drain(world: World) -> None:
    """Admission counts the episodes it opened a moment ago, whose drain is not in Slurm yet
    (two daemons admitting at once)."""
    world.nodes["n1"].findings = [XID_95]
    first = world.daemon("n1").admit([XID_95])  # n1's drain has not reached Slurm
    assert first.drain and in_service(world, "n1")
    second = world.fault("n2", ECC)
    assert second.episode is not None and second.episode.state == ep.WAITING_CAP
    assert not second.drain


def test_a_capped_node_someone_else_drains_goes_to_a_human(world: World) -> None:
    world.fault("n1", XID_95)
    world.fault("n2", ECC)
    world.slurm.admin_drain("n2", "admin: cable swap")
    world.run("n1")
    episode = world.tick("n2")
    assert episode is not None and episode.state == ep.NEEDS_HUMAN
    assert world.slurm.by_name["n2"].reason == "admin: cable swap"
    assert not world.slurm.called("drain", "n2") and not world.slurm.called("resume", "n2")


def test_the_cap_freeing_while_paused_drains_into_paused(world: World) -> None:
    world.fault("n1", XID_95)
    world.fault("n2", ECC)
    world.episodes.set_paused(True, "maintenance", "alice")
    world.episodes.update(world.last("n1").id, state=ep.CLOSED)  # a human took n1 over
    world.slurm.admin_resume("n1")
    episode = world.tick("n2")
    assert episode is not None and episode.state == ep.PAUSED and not in_service(world, "n2")
    world.episodes.set_paused(False, "", "alice")
    assert world.run("n2").state == ep.RESOLVED


# --- the pause ---------------------------------------------------------------------------------


def test_a_fault_while_paused_is_drained_and_repaired_after_the_resume(world: World) -> None:
    world.episodes.set_paused(True, "maintenance window", "alice")
    admission = world.fault("n1", XID_95)
    assert admission.episode is not None and admission.episode.state == ep.PAUSED
    assert "alice" in admission.why and admission.drain and not in_service(world, "n1")
    for _ in range(5):
        world.tick("n1")
        world.clock.advance(600)
    assert world.last("n1").state == ep.PAUSED and world.steps("n1") == []
    world.episodes.set_paused(False, "window over", "alice")
    episode = world.tick("n1")  # moves on at the first tick after the resume
    assert episode is not None and episode.state == ep.VERIFYING
    assert world.nodes["n1"].said("repairs resumed")
    assert world.run("n1").state == ep.RESOLVED


@pytest.mark.parametrize("where", [ep.WAITING_IDLE, ep.REBOOTING, ep.VERIFYING])
def test_a_pause_holds_an_episode_where_it_is_and_the_resume_carries_on(
    world: World, where: str
) -> None:
    world.fault("n1", XID_79 if where == ep.REBOOTING else XID_95)
    host = world.nodes["n1"]
    if where != ep.WAITING_IDLE:
        world.tick("n1")
    assert world.last("n1").state == where
    world.episodes.set_paused(True, "driver rollout", "bob")
    if where == ep.REBOOTING:
        world.reboot_happens("n1")
    verifications, steps = host.verifications, len(world.steps("n1"))
    for _ in range(4):
        world.tick("n1")
        world.clock.advance(300)
    assert world.last("n1").state == where
    assert (host.verifications, len(world.steps("n1"))) == (verifications, steps)
    world.episodes.set_paused(False, "", "bob")
    assert_repaired_once(world, "n1", world.run("n1"))


def test_a_fleet_wide_signature_pauses_and_a_resume_is_not_undone_by_the_same_faults(
    world: World,
) -> None:
    world.configure(max_drained_share=1.0)  # the cap out of the way
    for node in ("n1", "n2"):
        world.fault(node, XID_48)
    assert not world.episodes.control().paused
    third = world.fault("n3", XID_48)
    control = world.episodes.control()
    assert control.paused and control.actor == "medic" and "gpu.xid.48 on 3 nodes" in control.reason
    assert third.episode is not None and third.episode.state == ep.PAUSED and third.drain
    assert world.nodes["n3"].said("AUTOMATION PAUSED")[0].severity == "CRITICAL"
    world.tick("n1")
    assert world.steps("n1") == []  # repairs wait on every node
    world.clock.advance(60)
    world.episodes.set_paused(False, "checked: bad batch of GPUs, not the driver", "alice")
    world.clock.advance(60)
    fourth = world.fault("n4", XID_48)  # the faults before the resume no longer count
    assert not world.episodes.control().paused
    assert fourth.episode is not None and fourth.episode.state == ep.WAITING_IDLE
    for node in ("n1", "n2", "n3", "n4"):
        assert world.run(node).state == ep.RESOLVED


# --- the lemon rule ----------------------------------------------------------------------------


def test_a_lemon_node_goes_straight_to_rma(world: World) -> None:
    for _ in range(2):  # two earlier episodes of GPU 3's memory this week, both reset
        world.opened("n2", ep.RESOLVED, attempts={"1": 1})
        world.clock.advance(3600)
    admission = world.fault("n2", XID_95)
    assert admission.episode is not None and admission.episode.rung == int(Rung.RMA)
    lemon = "3 gpu-memory episodes on GPU 3 in 7 days"
    assert f"lemon: {lemon}" in admission.why
    episode = world.tick("n2")
    assert episode is not None and episode.state == ep.RMA
    assert world.steps("n2") == [] and not world.nodes["n2"].commands
    [(ticket, why)] = world.nodes["n2"].rma
    assert episode.ticket_id == ticket and why == f"lemon: {lemon}"
    assert tickets.open_tickets(world.store, "n2") == [ticket]
    assert not in_service(world, "n2")


def test_failed_requalifications_make_a_lemon(world: World) -> None:
    world.opened("n2", ep.RESOLVED, failed_requalifications=2, attempts={"1": 2})
    admission = world.fault("n2", XID_95)
    assert admission.episode is not None and admission.episode.rung == int(Rung.RMA)
    assert "2 failed re-qualifications" in admission.why


def test_each_failed_verification_counts_toward_the_lemon_rule(world: World) -> None:
    world.configure(lemon_episodes=10)  # only failed re-qualifications count here
    world.nodes["n1"].outcomes = ["ok"]
    world.nodes["n1"].hardware_fault = True  # the first reset does not cure it
    world.fault("n1", XID_95)
    world.tick("n1")
    world.clock.advance(TICK)
    world.tick("n1")
    assert world.last("n1").failed_requalifications == 1
    world.nodes["n1"].hardware_fault = False
    assert world.run("n1").state == ep.RESOLVED
    assert world.last("n1").failed_requalifications == 1
    world.opened("n1", ep.RESOLVED, failed_requalifications=1, attempts={"1": 2})
    admission = world.fault("n1", XID_95)
    assert admission.episode is not None and admission.episode.rung == int(Rung.RMA)


@pytest.mark.parametrize("earlier", ["old", "closed_by_a_human", "held_by_the_cap"])
def test_episodes_that_do_not_make_a_lemon(world: World, earlier: str) -> None:
    for _ in range(2):
        if earlier == "closed_by_a_human":
            e = world.opened("n2", ep.NEEDS_HUMAN)
            world.episodes.close_by_human(e.id, "alice", "not a fault: a test job")
        else:
            world.opened("n2", ep.WAITING_CAP if earlier == "held_by_the_cap" else ep.RESOLVED,
                         attempts={} if earlier == "held_by_the_cap" else {"1": 1})  # fmt: skip
    if earlier == "old":
        world.clock.advance(8 * 86400)
    assert not world.daemon("n2").lemon_score(XID_95).is_lemon


# --- RMA: keep-out and re-qualification ----------------------------------------------------------


@pytest.mark.parametrize("waiting_on", ["nothing", ep.WAITING_CAP, ep.NEEDS_HUMAN])
def test_a_node_with_an_open_rma_ticket_is_drained_again(world: World, waiting_on: str) -> None:
    ticket = world.rma_ticket("n2")
    world.opened("n2", ep.RMA, rung=4, ticket_id=ticket)
    if waiting_on == ep.WAITING_CAP:  # a human resumed it; a new fault met a full cap
        world.fault("n1", XID_95)
        admission = world.fault("n2", ECC)
        assert admission.episode is not None and admission.episode.state == ep.WAITING_CAP
    elif waiting_on == ep.NEEDS_HUMAN:
        world.opened("n2", ep.NEEDS_HUMAN)
    assert in_service(world, "n2")  # a human's resume, or ReturnToService after a reboot
    world.tick("n2")
    node = world.slurm.by_name["n2"]
    assert node.drain and node.reason == "medic: rma.open node RMA ticket open"
    assert world.nodes["n2"].said("RMA ticket open: node drained again")
    world.slurm.by_name["n2"].state = "DOWN"  # and again after a reboot left it DOWN
    world.slurm.admin_resume("n2")
    world.tick("n2")
    assert world.slurm.by_name["n2"].drain and len(world.slurm.called("drain", "n2")) == 2


def test_keep_out_never_overwrites_someone_elses_reason(world: World) -> None:
    world.rma_ticket("n2")
    world.slurm.admin_drain("n2", "admin: swapping the GPU board")
    world.tick("n2")
    world.rma_ticket("n3")
    world.slurm.by_name["n3"].reason = "bios update pending"  # in service, someone's note
    world.tick("n3")
    assert world.slurm.by_name["n2"].reason == "admin: swapping the GPU board"
    assert in_service(world, "n3") and not world.slurm.called("drain")


def test_a_repair_on_a_node_with_an_open_rma_ticket_never_returns_it_to_service(
    world: World,
) -> None:
    """Another GPU of a node waiting for its RMA faults: the repair runs, but the ticket
    keeps the node out (not resumed, then drained again at the next tick)."""
    ticket = world.rma_ticket("n1")
    world.opened("n1", ep.RMA, rung=4, ticket_id=ticket)
    world.medic_drained("n1", "medic: gpu.xid.95 gpu3 RMA ticket")
    admission = world.fault("n1", XID_79)
    assert admission.episode is not None and admission.episode.state == ep.WAITING_IDLE
    episode = world.run("n1")
    assert episode.state == ep.RESOLVED and world.nodes["n1"].reboots == 1
    assert not world.slurm.called("resume") and tickets.open_tickets(world.store, "n1")
    world.tick("n1")
    assert world.slurm.by_name["n1"].drain


def test_a_closed_rma_ticket_requalifies_the_node(world: World) -> None:
    world.fault("n1", REMAP)
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.RMA and episode.ticket_id is not None
    host = world.nodes["n1"]
    world.tick("n1")
    assert host.verifications == 0  # an open ticket: nothing to re-qualify
    world.close_ticket(episode.ticket_id)
    assert tickets.needs_requalification(world.store, "n1")
    world.tick("n1")  # the part is replaced, but the node still fails its checks
    assert host.verifications == 1 and host.said("re-qualification failed")
    assert not in_service(world, "n1")
    host.findings = []
    world.clock.advance(REQUALIFY_RETRY - 1)
    world.tick("n1")
    assert host.verifications == 1  # retried every REQUALIFY_RETRY, not every tick
    world.clock.advance(1)
    world.tick("n1")
    assert host.verifications == 2
    assert not tickets.needs_requalification(world.store, "n1")
    assert world.last("n1").state == ep.RESOLVED and in_service(world, "n1")
    world.clock.advance(REQUALIFY_RETRY)
    world.tick("n1")
    assert host.verifications == 2 and len(world.slurm.called("resume")) == 1


def test_requalification_waits_out_a_pause_and_never_lifts_anothers_drain(
    world: World,
) -> None:
    ticket = world.rma_ticket("n1")
    world.opened("n1", ep.RMA, rung=4, ticket_id=ticket)
    world.slurm.admin_drain("n1", "admin: burn-in first")
    world.close_ticket(ticket)
    world.episodes.set_paused(True, "maintenance", "alice")
    world.tick("n1")
    assert world.nodes["n1"].verifications == 0
    world.episodes.set_paused(False, "", "alice")
    world.tick("n1")
    assert world.last("n1").state == ep.RESOLVED
    assert world.slurm.by_name["n1"].reason == "admin: burn-in first"
    assert not world.slurm.called("resume")


# --- drains that are not Medic's ------------------------------------------------------------------


def test_an_admin_drained_node_goes_to_a_human_untouched(world: World) -> None:
    world.slurm.admin_drain("n4", "admin: PSU swap")
    admission = world.fault("n4", XID_95)
    assert admission.episode is not None and admission.episode.state == ep.NEEDS_HUMAN
    assert not admission.drain
    for _ in range(3):
        assert world.tick("n4") is None
        world.clock.advance(600)
    assert world.steps("n4") == [] and not world.nodes["n4"].commands
    assert world.slurm.by_name["n4"].reason == "admin: PSU swap"
    assert not [c for c in world.slurm.calls if c[0] in ("drain", "resume", "reboot")]


def test_an_admin_drain_during_the_repair_is_never_resumed(world: World) -> None:
    world.fault("n1", XID_95)
    world.tick("n1")
    world.slurm.admin_drain("n1", "admin: keep it out for the vendor")
    episode = world.run("n1")
    assert episode.state == ep.RESOLVED
    assert world.nodes["n1"].said("repaired and re-qualified: not medic's drain: left alone")
    assert world.slurm.by_name["n1"].reason == "admin: keep it out for the vendor"
    assert not world.slurm.called("resume")


# --- Slurm errors in the middle of a step ---------------------------------------------------------


def test_slurm_unreadable_at_admission_holds_the_fault_until_it_answers(world: World) -> None:
    world.slurm.fail("nodes", times=2)  # the facts' read and the cap's own
    admission = world.daemon("n1").admit([XID_95])
    assert admission.episode is not None and admission.episode.state == ep.WAITING_CAP
    assert "cannot read Slurm" in admission.why and not admission.drain
    world.nodes["n1"].findings = [XID_95]
    world.slurm.fail("nodes")
    assert world.tick("n1") is not None and world.last("n1").state == ep.WAITING_CAP
    world.slurm.fail("drain")
    assert world.tick("n1") is not None and world.last("n1").state == ep.WAITING_CAP
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.WAITING_IDLE and not in_service(world, "n1")
    assert world.run("n1").state == ep.RESOLVED


def test_slurm_unreachable_while_the_node_reboots_is_waited_out(world: World) -> None:
    world.fault("n1", XID_79)
    world.tick("n1")
    world.slurm.unreachable = True
    for _ in range(3):
        assert world.tick("n1") is not None and world.last("n1").state == ep.REBOOTING
        world.clock.advance(60)
    world.slurm.unreachable = False
    assert_repaired_once(world, "n1", world.run("n1"))


def test_a_slurm_error_on_the_resume_is_retried_and_the_episode_stays_open(
    world: World,
) -> None:
    world.fault("n1", XID_95)
    world.tick("n1")
    world.slurm.fail("resume", times=5)
    for _ in range(5):
        world.clock.advance(TICK)
        assert world.tick("n1") is not None and world.last("n1").state == ep.VERIFYING
    assert world.last("n1").message.count("resume:") <= 1  # one note, not one per tick
    assert world.run("n1", every=TICK).state == ep.RESOLVED and in_service(world, "n1")


def test_a_refused_reboot_is_asked_again_and_never_an_rma(world: World) -> None:
    """`scontrol reboot` failing (slurmctld busy) says nothing of the node: the attempt is
    not spent, the reboot is asked again after REBOOT_REFUSED_RETRY, never an RMA ticket."""
    world.fault("n1", XID_79)
    world.slurm.fail("reboot")
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.WAITING_IDLE
    [step] = world.steps("n1")
    assert step.state == "failed" and "Socket timed out" in step.output
    world.tick("n1")
    assert len(world.slurm.called("reboot")) == 1, "asked again before the retry delay"
    world.clock.advance(REBOOT_REFUSED_RETRY)
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.REBOOTING
    assert len(world.slurm.called("reboot")) == 2
    assert world.nodes["n1"].rma == []


def test_a_reboot_slurm_keeps_refusing_goes_to_a_human_not_rma(world: World) -> None:
    world.fault("n1", XID_79)
    world.slurm.fail("reboot", times=REBOOT_REFUSALS)
    for _ in range(REBOOT_REFUSALS):
        episode = world.tick("n1")
        world.clock.advance(REBOOT_REFUSED_RETRY)
    assert episode is not None and episode.state == ep.NEEDS_HUMAN
    assert f"Slurm refused the reboot {REBOOT_REFUSALS} times" in episode.message
    assert len(world.slurm.called("reboot")) == REBOOT_REFUSALS
    assert world.nodes["n1"].rma == []
    assert not in_service(world, "n1")


def test_jobs_running_past_idle_timeout_are_reported_once_and_never_killed(
    world: World,
) -> None:
    world.slurm.start_job("41", "n1")
    world.fault("n1", XID_95)
    world.tick("n1")
    world.clock.advance(3599)
    world.tick("n1")
    assert world.nodes["n1"].said("idle_timeout") == []
    world.clock.advance(2)
    for _ in range(3):
        episode = world.tick("n1")
        world.clock.advance(TICK)
    [said] = world.nodes["n1"].said("idle_timeout")
    assert said.severity == "WARN" and "scancel" in said.message
    assert episode is not None and episode.state == ep.WAITING_IDLE
    assert "waited over 3601s" in episode.message
    assert world.nodes["n1"].commands == [], "never repaired under a running job"


def test_a_node_slurm_returns_after_its_reboot_stays_out_until_verified(world: World) -> None:
    """ReturnToService=2 (or a reboot past ResumeTimeout) puts the rebooted node back IDLE
    with no reason before its daemon verified it: drained again, then given back once it
    passes, or kept out when it fails."""
    world.fault("n1", XID_79)
    world.tick("n1")
    world.nodes["n1"].hardware_fault = True  # the reboot does not cure it
    world.reboot_happens("n1")
    n = world.slurm.by_name["n1"]
    n.state, n.reason = "IDLE", ""  # Slurm returned it on registration
    assert in_service(world, "n1")
    episode = world.tick("n1")
    assert not in_service(world, "n1")
    assert world.nodes["n1"].said("drained again until it is")
    assert episode is not None and episode.state != ep.RESOLVED
    assert "rebooted, verifying" in n.reason or "RMA" in n.reason


def test_a_slurm_error_on_keep_out_is_retried_at_the_next_tick(world: World) -> None:
    world.rma_ticket("n2")
    world.slurm.fail("drain")
    world.tick("n2")
    assert in_service(world, "n2")
    world.tick("n2")
    assert not in_service(world, "n2")


def test_a_slurm_error_on_the_requalification_resume_is_retried(world: World) -> None:
    ticket = world.rma_ticket("n1")
    world.opened("n1", ep.RMA, rung=4, ticket_id=ticket)
    world.medic_drained("n1", "medic: gpu.remap.failure gpu1 RMA")
    world.close_ticket(ticket)
    world.slurm.fail("resume")
    world.tick("n1")
    assert not in_service(world, "n1")
    world.clock.advance(REQUALIFY_RETRY)
    world.tick("n1")
    assert in_service(world, "n1") and world.last("n1").state == ep.RESOLVED
    assert not tickets.needs_requalification(world.store, "n1")


# --- single-GPU isolation (remediation.isolator) through the ladder ---------------------------


class Gres:
    """The site's apply command and the GPU count Slurm shows for each node after it."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.count = dict.fromkeys(NODES, 8)
        self.applied: list[list[str]] = []
        self.fail = False
        real = world.slurm.node

        def node(name: str) -> NodeInfo | None:
            info = real(name)
            return dataclasses.replace(info, gres=f"gpu:{self.count[name]}") if info else None

        world.slurm.node = node  # type: ignore[method-assign]

    def run(self, argv: Sequence[str], *, timeout: float, env: object = None) -> CommandResult:
        self.applied.append(list(argv))
        if self.fail:
            return CommandResult(tuple(argv), 1, "", "slurmctld did not restart", 0.1)
        _, node, _keep, isolated = argv
        self.count[node] = 8 - len(isolated.split(",")) if isolated else 8
        return CommandResult(tuple(argv), 0, "", "", 0.1)


def format_reason(fault_class: str, target: str) -> str:
    from medic_core.drain_reason import format_reason as medic_reason

    return medic_reason(fault_class, target)


def isolating(world: World, monkeypatch: pytest.MonkeyPatch, enabled: bool = True) -> Gres:
    from medic_core.settings import IsolationSettings
    from remediation.isolator import Isolator

    gres = Gres(world)
    settings = IsolationSettings(
        enabled=enabled, apply=("apply", "{node}", "{keep}", "{isolated}"), settle_timeout=1.0
    )

    def isolator() -> Isolator:
        host = world.nodes["n1"]
        return Isolator("n1", world.episodes, world.slurm, settings,  # type: ignore[arg-type]
                        event=lambda m, s: host.event(m, severity=s, fault_class="gpu.isolation",
                                                      target=""),
                        run=gres.run, sleep=lambda _s: None)  # fmt: skip

    monkeypatch.setattr(Ladder, "isolation", staticmethod(isolator))
    return gres


def isolation_state(world: World) -> str:
    from remediation.isolation import recorded

    record = recorded(world.last("n1").evidence)
    return record.state if record else "none"


def test_an_isolated_gpu_is_reset_while_the_node_serves_jobs_then_comes_back(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    gres = isolating(world, monkeypatch)
    world.fault("n1", XID_95)  # GPU 3
    assert not in_service(world, "n1")
    world.tick("n1")  # idle: GPU 3 leaves the GRES, the node is back with 7
    assert isolation_state(world) == "applied" and gres.count["n1"] == 7
    assert gres.applied == [["apply", "n1", "0-2,4-7", "3"]]
    assert in_service(world, "n1") and world.last("n1").state == ep.WAITING_IDLE
    world.slurm.start_job("10", "n1")  # a job on the other GPUs
    world.tick("n1")  # the reset of GPU 3 does not wait for it
    assert [a[0] for a, _ in world.nodes["n1"].commands] == ["fake-gpu-reset"]
    assert world.last("n1").state == ep.VERIFYING
    world.tick("n1")  # re-qualified: the node drains to take GPU 3 back, the job runs on
    assert isolation_state(world) == "restoring" and not in_service(world, "n1")
    assert world.slurm.by_name["n1"].reason == format_reason("gpu.isolation.restore", "gpu3")
    world.tick("n1")
    assert isolation_state(world) == "restoring" and world.last("n1").open
    assert len(gres.applied) == 1  # never under a running job
    world.slurm.end_job("10")
    world.tick("n1")
    done = world.last("n1")
    assert done.state == ep.RESOLVED and isolation_state(world) == "restored"
    assert gres.count["n1"] == 8 and gres.applied[-1] == ["apply", "n1", "0-7", ""]
    assert in_service(world, "n1") and world.nodes["n1"].said("back in the GRES")
    assert world.nodes["n1"].verifications == 1


def test_isolation_off_changes_nothing(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    gres = isolating(world, monkeypatch, enabled=False)
    world.fault("n1", XID_95)
    episode = world.run("n1")
    assert_repaired_once(world, "n1", episode)
    assert gres.applied == [] and isolation_state(world) == "none"
    assert not world.nodes["n1"].said("isolation")


def test_a_fault_policy_refuses_is_repaired_with_the_whole_node_drained(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    gres = isolating(world, monkeypatch)
    world.fault("n1", ECC)  # gpu.ecc.dbe is not among the faults
    world.nodes["n1"].busy_gpus.add(1)  # the reset waits for the GPU: ticks in between
    for _ in range(3):
        world.tick("n1")
        world.clock.advance(TICK)
    world.nodes["n1"].busy_gpus.clear()
    episode = world.run("n1")
    assert_repaired_once(world, "n1", episode)
    assert gres.applied == [] and len(world.nodes["n1"].said("no isolation")) == 1


def test_a_record_left_at_intent_is_carried_out_once_more_without_a_new_decision(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    gres = isolating(world, monkeypatch)
    world.medic_drained("n1", format_reason("gpu.xid.95", "gpu3"))
    record = {"gpus": [3], "gpus_total": 8, "state": "intent"}
    world.opened("n1", ep.WAITING_IDLE, evidence={"isolation": record})
    world.tick("n1")  # the restarted daemon: the same state, applied again, confirmed
    assert isolation_state(world) == "applied" and gres.applied == [["apply", "n1", "0-2,4-7", "3"]]
    assert in_service(world, "n1") and world.nodes["n1"].commands == []


def test_an_apply_that_fails_stops_at_a_human_with_the_node_drained(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    gres = isolating(world, monkeypatch)
    gres.fail = True
    world.fault("n1", XID_95)
    world.tick("n1")
    last = world.last("n1")
    assert last.state == ep.NEEDS_HUMAN and "isolation failed" in last.message
    assert not in_service(world, "n1") and world.nodes["n1"].commands == []


def test_a_rung_past_the_reset_drains_the_isolated_node_whole_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    gres = isolating(world, monkeypatch)
    world.fault("n1", XID_95)
    world.tick("n1")
    assert isolation_state(world) == "applied" and in_service(world, "n1")
    world.nodes["n1"].hardware_fault = True  # the reset does not cure it
    world.slurm.start_job("11", "n1")
    for _ in range(10):  # the resets (each attempt), each verified CRITICAL again
        world.tick("n1")
        world.clock.advance(3600)
        if world.last("n1").rung != int(Rung.GPU_RESET):
            break
    resets = len(world.nodes["n1"].commands)
    assert world.last("n1").rung == int(Rung.DRIVER_RELOAD) and in_service(world, "n1")
    world.tick("n1")  # the driver reload needs the node whole: drained, waits for the job
    assert not in_service(world, "n1") and world.nodes["n1"].said("did not repair")
    assert len(world.nodes["n1"].commands) == resets
    assert gres.count["n1"] == 7


def test_each_tick_tells_the_rails_it_read(world: World) -> None:
    seen: list[tickets.NodeRails] = []
    world.daemon("n2").on_rails = seen.append
    world.tick("n2")
    assert seen == [tickets.NodeRails(None, [], False)]
    admission = world.fault("n2", XID_95)
    world.tick("n2")
    assert seen[-1].episode is not None and seen[-1].episode.id == admission.episode.id  # type: ignore[union-attr]


def test_the_tick_that_opens_an_rma_ticket_tells_the_gate_at_once(world: World) -> None:
    """After a reboot rung, ReturnToService may put the node back in service before the
    keep-out drains it again: the gate must already refuse jobs there, not a tick later."""
    seen: list[tickets.NodeRails] = []
    world.fault("n1", REMAP)
    world.daemon("n1").on_rails = seen.append
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.RMA
    assert seen[-1].open_tickets == [episode.ticket_id]


def test_a_failing_rails_onlooker_does_not_stop_the_tick(world: World) -> None:
    def broken(rails: tickets.NodeRails) -> None:
        raise RuntimeError("the gate is broken")

    admission = world.fault("n2", XID_95)
    world.daemon("n2").on_rails = broken
    episode = world.tick("n2")
    assert episode is not None and episode.id == admission.episode.id  # type: ignore[union-attr]


# --- a GPU's reset beside the jobs on the node's other GPUs --------------------------------------

REMAP_PENDING = Finding(
    "gpu_remapped_rows", Status.WARN, "gpu.remap.pending", "1", "row remap pending",
    Recommendation.GPU_RESET_WHEN_IDLE,
)  # fmt: skip


def test_a_gpu_reset_goes_beside_a_job_on_the_other_gpus_and_the_node_comes_back(
    world: World,
) -> None:
    """Issue 22: XID 94 left a row remap pending on GPU 1; the job on GPUs 4-7 runs on: the
    node is drained (nothing new lands on GPU 1), GPU 1 is reset beside the job, verified,
    and the node given back with the job still running."""
    world.slurm.start_job("20", "n1", gpus=frozenset({4, 5, 6, 7}))
    world.fault("n1", REMAP_PENDING)
    assert not in_service(world, "n1") and world.slurm.jobs_["20"].state == "RUNNING"
    world.tick("n1")
    assert [a for a, _ in world.nodes["n1"].commands] == [("fake-gpu-reset", "n1", "1")]
    episode = world.run("n1")
    assert episode.state == ep.RESOLVED and in_service(world, "n1")
    assert world.slurm.jobs_["20"].state == "RUNNING" and world.slurm.called("requeue") == []


@pytest.mark.parametrize(
    ("gpus", "why"),
    [
        (frozenset({0, 1, 2, 3}), "the job holds GPU 1"),
        (None, "Slurm does not show the job's GPUs: it may hold GPU 1"),
    ],
)
def test_a_gpu_reset_waits_for_the_job_holding_that_gpu(
    world: World, gpus: frozenset[int] | None, why: str
) -> None:
    world.slurm.start_job("21", "n1", gpus=gpus)
    world.fault("n1", REMAP_PENDING)
    for _ in range(3):
        world.tick("n1")
        world.clock.advance(TICK)
    assert world.nodes["n1"].commands == [], why
    assert world.last("n1").state == ep.WAITING_IDLE
    world.slurm.end_job("21")
    episode = world.run("n1")
    assert episode.state == ep.RESOLVED and len(world.nodes["n1"].commands) == 1


@pytest.mark.parametrize(
    "setting",
    [{"gpu_reset_in_service": False}, {"requalify_checks": ("deep_dcgm",)}],
    ids=["off", "a-deep-requalification"],
)
def test_a_gpu_reset_waits_for_every_job_when_it_may_not_go_beside_them(
    world: World, setting: dict[str, Any]
) -> None:
    world.configure(**setting)
    world.slurm.start_job("22", "n1", gpus=frozenset({4, 5, 6, 7}))
    world.fault("n1", REMAP_PENDING)
    for _ in range(3):
        world.tick("n1")
        world.clock.advance(TICK)
    assert world.nodes["n1"].commands == []
    world.slurm.end_job("22")
    assert world.run("n1").state == ep.RESOLVED


def test_a_reset_that_does_not_cure_the_gpu_goes_on_to_a_rung_that_waits_for_every_job(
    world: World,
) -> None:
    world.slurm.start_job("23", "n1", gpus=frozenset({4, 5, 6, 7}))
    world.nodes["n1"].hardware_fault = True
    world.fault("n1", REMAP_PENDING)
    for _ in range(10):
        world.tick("n1")
        world.clock.advance(TICK)
        if world.last("n1").rung != int(Rung.GPU_RESET):
            break
    resets = len(world.nodes["n1"].commands)
    assert resets >= 1 and world.last("n1").rung == int(Rung.DRIVER_RELOAD)
    for _ in range(3):
        world.tick("n1")
        world.clock.advance(TICK)
    assert len(world.nodes["n1"].commands) == resets, "a driver reload under a running job"
    assert world.slurm.jobs_["23"].state == "RUNNING"


def test_a_critical_faults_record_aging_at_warn_after_the_repair_does_not_fail_it(
    world: World,
) -> None:
    """The XID the check still lists for a while after the reset (a WARN) is not the fault
    again: only a WARN fault the repair was for (a pending remap) fails its verification."""
    world.fault("n1", XID_95)
    world.tick("n1")  # the reset
    assert world.last("n1").state == ep.VERIFYING
    aging = dataclasses.replace(XID_95, status=Status.WARN)
    world.nodes["n1"].findings = [aging]
    world.tick("n1")
    assert world.last("n1").state == ep.RESOLVED and in_service(world, "n1")

"""Hot spares as unit tests: the pure decision (remediation.decide_spares.decide_spare), the
reservation parser, and `SparePool` on a real SQLite store with a fake Slurm that keeps
nodes, jobs and reservations in memory and records every command (the lab proof is
tests/test_spares_lab.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medic_core.drain_book import DrainBook
from medic_core.settings import SpareSettings
from medic_core.slurm import JobInfo, NodeInfo, SlurmError
from medic_core.status import Status
from medic_core.store import Severity, Store, open_store
from medic_core.vocabulary import Finding, Recommendation
from remediation import spares as spares_module
from remediation.decide_spares import ReservedJob, decide_spare, decide_spare_tending, spare_key
from remediation.spares import (
    FAILED,
    GIVEN_BACK,
    HANDED,
    HANDING,
    JOINED,
    REFUSED_JOB,
    RELEASED,
    SparePool,
    job_reservation,
    parse_reservations,
    parse_reserved_jobs,
)
from tests.fakes import REQUEUE_DISABLED, FakeSlurm
from tests.test_ladder_unit import XID_95, World, template_db  # noqa: F401 (a fixture)
from tests.test_ladder_unit import world as world  # the fixture


def node(name: str, state: str = "IDLE", *flags: str, reason: str = "") -> NodeInfo:
    return NodeInfo(name, state, frozenset(flags), reason=reason, partitions=("gpu",))


# --- the decision -----------------------------------------------------------------------------


def test_no_pool_no_spare() -> None:
    got = decide_spare("job:1:run0", [node("n5")], 0, set(), size=0)
    assert got.node == "" and "size = 0" in got.why


def test_a_free_healthy_node_leaves_the_job_to_the_queue() -> None:
    got = decide_spare("job:1:run0", [node("n5")], 1, set(), size=1)
    assert got.node == "" and "free" in got.why


def test_one_spare_per_job_run() -> None:
    key = spare_key("7", 0)
    assert decide_spare(key, [node("n5")], 0, set(), size=1).node == "n5"
    again = decide_spare(key, [node("n5"), node("n6")], 0, {key}, size=2)
    assert again.node == "" and "already" in again.why
    # The run after a requeue is another: a fault there may take another spare.
    assert decide_spare(spare_key("7", 1), [node("n6")], 0, {key}, size=2).node == "n6"


def test_a_spare_that_failed_meanwhile_is_never_handed() -> None:
    pool = [
        node("n2", "IDLE", "DRAIN", reason="medic: gpu.xid.79 gpu0"),
        node("n3", "DOWN"),
        node("n4", "ALLOCATED"),
        node("n10"),
        node("n9"),
    ]
    got = decide_spare("job:1:run0", pool, 0, set(), size=5)
    assert got.node == "n9"  # natural order: n9 before n10
    none = decide_spare("job:1:run0", pool[:3], 0, set(), size=5)
    assert none.node == "" and "no idle spare" in none.why


STATES = st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "DOWN"])
FLAGS = st.frozensets(st.sampled_from(["DRAIN", "RESERVED", "NOT_RESPONDING"]), max_size=2)
POOLS = st.lists(
    st.builds(lambda i, s, f: NodeInfo(f"n{i}", s, f), st.integers(0, 40), STATES, FLAGS),
    max_size=6,
    unique_by=lambda n: n.name,
)


@given(POOLS, st.integers(0, 3), st.booleans(), st.integers(0, 3))
def test_decision_invariants(pool: list[NodeInfo], free: int, handed: bool, size: int) -> None:
    key = "job:9:run0"
    got = decide_spare(key, pool, free, {key} if handed else set(), size=size)
    if got.node:
        chosen = next(n for n in pool if n.name == got.node)
        assert chosen.state == "IDLE" and not chosen.drained
        assert size > 0 and free == 0 and not handed
    else:
        assert got.why


# --- the reservation table --------------------------------------------------------------------

# `scontrol -o show reservation` on the lab's Slurm 22.05 (one reservation a line).
SHOWN = (
    "ReservationName=medic-spares StartTime=1795561200 EndTime=1798153200 Duration=30-00:00:00"
    " Nodes=n[4-5] NodeCnt=2 CoreCnt=32 Features=(null) PartitionName=(null) Flags=SPEC_NODES"
    " TRES=cpu=32 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE"
    " BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=medic-spare-4 StartTime=1795561201 EndTime=1798153201"
    " Duration=30-00:00:00 Nodes=n1 NodeCnt=1 CoreCnt=16 Features=(null)"
    " PartitionName=(null) Flags=FLEX,SPEC_NODES,PURGE_COMP=00:01:00 TRES=cpu=16 Users=alice"
    " Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null)"
    " Watts=n/a MaxStartDelay=(null)\n"
)


def test_reservations_parse() -> None:
    assert parse_reservations(SHOWN) == {
        "medic-spares": ("n4", "n5"),
        "medic-spare-4": ("n1",),
    }
    assert parse_reservations("No reservations in the system\n") == {}
    bad = "ReservationName=x Nodes=n[1-99999999999] State=ACTIVE"
    assert parse_reservations(bad) == {"x": ()}  # a host list Medic cannot read: no nodes


# --- the pool's actions -------------------------------------------------------------------------


class SpareSlurm(FakeSlurm):
    """tests.fakes.FakeSlurm with reservations (what `SparesSlurm` adds to the client): the
    reservations Slurm holds and the jobs it shows in each (`squeue -R`), each write
    recorded in `calls`."""

    def __init__(self, nodes: Sequence[NodeInfo], jobs: Sequence[JobInfo] = ()) -> None:
        super().__init__(nodes, jobs)
        self.held: dict[str, tuple[str, ...]] = {}  # reservation -> its nodes
        self.in_res: dict[str, dict[str, ReservedJob]] = {}
        self.not_requeueable: set[str] = set()

    def reservations(self) -> dict[str, tuple[str, ...]]:
        return dict(self.held)

    def create_reservation(
        self, name: str, node: str, minutes: int, user: str, flags: Sequence[str] = ()
    ) -> None:
        self.record("create", name, node, user, ",".join(flags))
        self.held[name] = (node,)

    def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        self.record("set", name, ",".join(nodes))
        self.held[name] = tuple(nodes)

    def delete_reservation(self, name: str) -> bool:
        self.record("delete", name)
        if self.in_res.get(name):  # Slurm: "Requested reservation is in use"
            raise SlurmError(f"cannot give back {name}: Requested reservation is in use")
        return self.held.pop(name, None) is not None

    def move_job(self, job_id: str, reservation: str) -> None:
        self.record("move", job_id, reservation)
        self.in_res.setdefault(reservation, {})[job_id] = ReservedJob(job_id, "PENDING", ())

    def reservation_exists(self, name: str) -> bool:
        self.read("reservation_exists", name)
        return name in self.held

    def reservation_jobs(self, name: str) -> list[ReservedJob]:
        self.read("reservation_jobs", name)
        return list(self.in_res.get(name, {}).values())

    def unbind(self, job_id: str) -> None:
        self.record("unbind", job_id)
        for jobs in self.in_res.values():
            jobs.pop(job_id, None)

    def requeue(self, job_id: str) -> None:
        """A job in a reservation: pending there again (its own record is the pool's)."""
        self.record("requeue", job_id)
        if job_id in self.not_requeueable:
            raise SlurmError(f"scontrol requeue {job_id}: {REQUEUE_DISABLED} for job {job_id}")
        for jobs in self.in_res.values():
            if job_id in jobs:
                jobs[job_id] = ReservedJob(job_id, "PENDING", ())

    def cancel(self, job_id: str) -> None:
        self.record("cancel", job_id)
        for jobs in self.in_res.values():
            jobs.pop(job_id, None)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as opened:
        yield opened


def job(job_id: str = "4", nodes: str = "n1", user: str = "alice") -> JobInfo:
    return JobInfo(job_id, "train", user, "PENDING", "BeginTime", nodes, True, 1)


def busy_lab() -> SpareSlurm:
    """n1 drained by Medic under the requeued job 4, n2-n3 busy, n5 the pool's spare."""
    slurm = SpareSlurm(
        [
            node("n1", "IDLE", "DRAIN", reason="medic: gpu.xid.79 gpu0"),
            node("n2", "ALLOCATED"),
            node("n3", "ALLOCATED"),
            node("n5", "IDLE", "RESERVED"),
        ],
        [job()],
    )
    slurm.held["medic-spares"] = ("n5",)
    return slurm


def pool(slurm: SpareSlurm, store: Store, at: str = "n1", **settings: object) -> SparePool:
    chosen = SpareSettings(**{"size": 1, **settings})  # type: ignore[arg-type]
    # After the prolog had its time: a job running on the spare is past its gate.
    return SparePool(chosen, slurm, store, at, prolog_grace=0.0)  # type: ignore[arg-type]


def spare_events(store: Store) -> list[str]:
    return [str(e.evidence.get("action")) for e in reversed(store.events(kind="spare"))]


def test_hand_over_takes_the_spare_out_of_the_pool_into_the_jobs_reservation(
    store: Store,
) -> None:
    slurm = busy_lab()
    handed = pool(slurm, store).hand_over("4", 0)
    assert (handed.node, handed.reservation) == ("n5", job_reservation("4"))
    assert slurm.calls == [
        # The job's reservation while the spare is still in the pool: never in neither.
        (
            "create",
            "medic-spare-4",
            "n5",
            "alice",
            "FLEX,OVERLAP,NO_HOLD_JOBS_AFTER,PURGE_COMP=00:01:00",
        ),
        ("move", "4", "medic-spare-4"),
        ("delete", "medic-spares"),  # its last spare: the pool's reservation goes
    ]
    assert spare_events(store) == [HANDING, HANDED]
    [done] = [e for e in store.events(kind="spare") if e.evidence["action"] == HANDED]
    assert (done.node, done.target, done.evidence["key"]) == ("n5", "job:4", "job:4:run0")


def test_a_pool_of_two_keeps_its_other_spare(store: Store) -> None:
    slurm = busy_lab()
    slurm.add_node(node("n6", "IDLE", "RESERVED"))
    slurm.held["medic-spares"] = ("n5", "n6")
    assert pool(slurm, store, size=2).hand_over("4", 0).node == "n5"
    assert slurm.calls[-1] == ("set", "medic-spares", "n6")


def test_a_crash_and_the_same_fault_answered_again_hand_no_second_spare(store: Store) -> None:
    slurm = busy_lab()
    slurm.add_node(node("n6", "IDLE", "RESERVED"))
    slurm.held["medic-spares"] = ("n5", "n6")
    # The daemon recorded the intent, then died before Slurm did anything.
    first = pool(slurm, store, size=2)
    first._event("n5", Severity.INFO, "handing", action=HANDING, job_id="4",
                 key=spare_key("4", 0), spare="n5")  # fmt: skip
    again = pool(slurm, store, size=2).hand_over("4", 0)
    assert again.node == "" and "already" in again.why
    # The job's other node answering the same fault: nothing either.
    assert pool(slurm, store, at="n2", size=2).hand_over("4", 0).node == ""
    assert slurm.calls == []


def test_a_free_node_means_no_spare(store: Store) -> None:
    slurm = busy_lab()
    slurm.add_node(node("n3"))  # idle, in service, in no reservation
    got = pool(slurm, store).hand_over("4", 0)
    assert got.node == "" and "free" in got.why
    assert slurm.calls == [] and spare_events(store) == []


def test_the_jobs_own_nodes_and_reserved_nodes_are_not_free(store: Store) -> None:
    slurm = busy_lab()
    slurm.add_job(job(nodes="n[1,3]"))
    slurm.add_node(node("n3"))  # the job's other node, idle after the requeue
    slurm.add_node(node("n7", "IDLE", "RESERVED"))
    slurm.held["someone-else"] = ("n7",)
    assert pool(slurm, store).hand_over("4", 0).node == "n5"


def test_slurm_refusing_leaves_the_job_to_the_queue_and_is_recorded(store: Store) -> None:
    slurm = busy_lab()
    slurm.fail("create", None, "Requested nodes are busy")
    got = pool(slurm, store).hand_over("4", 0)
    assert got.node == "" and "busy" in got.why
    assert spare_events(store) == [HANDING, FAILED]
    assert ("move", "4", "medic-spare-4") not in slurm.calls
    # Capped: the failed hand-over is not tried again for the same run.
    assert pool(slurm, store).hand_over("4", 0).node == ""


def test_a_job_gone_meanwhile_gets_nothing(store: Store) -> None:
    slurm = busy_lab()
    slurm.jobs_.clear()
    got = pool(slurm, store).hand_over("4", 0)
    assert got.node == "" and "not found" in got.why and slurm.calls == []


# --- refilling the pool -----------------------------------------------------------------------

DEEP_PASS = [Finding("deep_dcgm", Status.OK, "", "", "diag passed", Recommendation.NONE)]
DEEP_FAIL = [Finding("deep_dcgm", Status.CRITICAL, "gpu.dcgm", "2", "diag failed")]


def test_a_repaired_node_joins_a_short_pool_after_the_deep_tier(store: Store) -> None:
    slurm = busy_lab()
    del slurm.held["medic-spares"]  # handed away: the pool is empty
    ran: list[str] = []

    def deep() -> list[Finding]:
        ran.append("deep")
        return DEEP_PASS

    # Medic's drain of n1, recorded when it was made (medic_core.drain_book)
    DrainBook.of(store).record_drain("n1", "medic: gpu.xid.79 gpu0", actor="daemon")
    outcome = pool(slurm, store).join("n1", deep)
    assert ran == ["deep"]
    assert outcome.startswith("joined the spare pool medic-spares")
    # Into the reservation first, Medic's drain lifted after: no job lands in between.
    assert [c[0] for c in slurm.calls] == ["create", "resume"]
    assert slurm.held["medic-spares"] == ("n1",)
    assert spare_events(store) == [JOINED]


def test_a_node_failing_the_deep_tier_does_not_join(store: Store) -> None:
    slurm = busy_lab()
    del slurm.held["medic-spares"]
    assert pool(slurm, store).join("n1", lambda: DEEP_FAIL) == ""
    assert slurm.calls == [] and spare_events(store) == ["refused"]


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"size": 0}, "no spare pool"),
        ({"size": 1, "nodes": ("n9",)}, "not listed"),
        ({"size": 1}, "the pool is full"),
    ],
)
def test_the_pool_takes_only_what_it_wants(
    store: Store, settings: dict[str, object], why: str
) -> None:
    slurm = busy_lab()
    spares = pool(slurm, store, **settings)
    assert why in spares.wants("n1")
    assert spares.join("n1", lambda: pytest.fail("no deep tier for a node not wanted")) == ""
    assert slurm.calls == []


def test_a_node_already_in_a_reservation_is_not_taken(store: Store) -> None:
    slurm = busy_lab()
    slurm.held["maintenance"] = ("n1",)
    assert pool(slurm, store, size=2).wants("n1") == "in another reservation"
    assert pool(slurm, store, size=2).wants("n5") == "already a spare"


def test_a_second_node_extends_the_pool(store: Store) -> None:
    slurm = busy_lab()
    assert pool(slurm, store, size=2).join("n1", lambda: DEEP_PASS)
    assert slurm.calls[0] == ("set", "medic-spares", "n5,n1")


def test_settings_refuse_a_bad_pool() -> None:
    assert list(SpareSettings(size=2, nodes=("n5",)).problems())
    assert list(SpareSettings(reservation="a b").problems())
    assert not list(SpareSettings(size=1, nodes=("n5",)).problems())


# --- the ladder's give-back offers the node to the pool (tests/test_ladder_unit's world) ----


def test_a_repaired_node_is_offered_to_the_pool_before_it_is_given_back(world: World) -> None:
    offered: list[str] = []

    def offer() -> str:
        offered.append("n1")
        world.slurm.resume("n1")  # what SparePool.join does, inside the reservation
        return "joined the spare pool medic-spares; resumed"

    world.fault("n1", XID_95)
    world.daemon("n1").spares = offer
    episode = world.run("n1")
    assert episode.state == "resolved" and offered == ["n1"]
    assert len(world.slurm.called("resume", "n1")) == 1  # the pool's, not a second one
    said = [e.message for e in world.nodes["n1"].events]
    assert any("joined the spare pool" in m for m in said), said


def test_a_pool_that_does_not_take_the_node_leaves_the_usual_give_back(world: World) -> None:
    world.fault("n1", XID_95)
    world.daemon("n1").spares = lambda: ""
    assert world.run("n1").state == "resolved"
    assert len(world.slurm.called("resume", "n1")) == 1


# --- a handed spare, bound to its run ---------------------------------------------------------

BOUND = "4"
RES = job_reservation(BOUND)


def rj(job_id: str, state: str = "PENDING", nodes: tuple[str, ...] = ()) -> ReservedJob:
    return ReservedJob(job_id, state, nodes)


def test_a_bound_job_waiting_keeps_its_spare() -> None:
    got = decide_spare_tending(BOUND, "n5", [rj(BOUND)], moved=True)
    assert got == type(got)((), (), False, "job 4 waits for n5")


def test_the_bound_job_running_on_the_spare_releases_the_reservation() -> None:
    got = decide_spare_tending(BOUND, "n5", [rj(BOUND, "RUNNING", ("n5",))], moved=True)
    assert (got.requeue, got.unbind, got.delete) == ((), (BOUND,), True)
    assert "allocation holds it" in got.why
    flex = decide_spare_tending(BOUND, "n5", [rj(BOUND, "RUNNING", ("n2",))], moved=True)
    assert flex.delete and "without n5: given back" in flex.why


def test_other_jobs_in_the_reservation_are_refused() -> None:
    jobs = [rj(BOUND), rj("9", "RUNNING", ("n5",)), rj("10")]
    got = decide_spare_tending(BOUND, "n5", jobs, moved=True)
    assert got.requeue == ("9",) and got.unbind == ("9", "10") and not got.delete
    assert "2 other job(s) refused" in got.why


def test_a_bound_job_not_in_it_gives_the_spare_back_once_the_move_had_its_time() -> None:
    assert not decide_spare_tending(BOUND, "n5", [], moved=False).delete
    got = decide_spare_tending(BOUND, "n5", [], moved=True)
    assert got.delete and "given back" in got.why


JOB_STATES = st.sampled_from(["PENDING", "RUNNING", "COMPLETING", "SUSPENDED"])
IN_RESERVATION = st.lists(
    st.builds(
        rj,
        st.sampled_from([BOUND, "5", "6", "7"]),
        JOB_STATES,
        st.sampled_from([(), ("n5",), ("n2", "n5")]),
    ),
    max_size=4,
    unique_by=lambda j: j.job_id,
)


@given(IN_RESERVATION, st.booleans())
def test_tending_invariants(jobs: list[ReservedJob], moved: bool) -> None:
    """Only the bound job may stay in the reservation; a job running on the spare that is
    not the bound one is requeued; the bound job is never requeued, and the reservation
    goes only once it is out of it (running) or not in it at all."""
    got = decide_spare_tending(BOUND, "n5", jobs, moved=moved)
    others = {j.job_id for j in jobs if j.job_id != BOUND}
    assert others <= set(got.unbind)
    assert {j.job_id for j in jobs if j.job_id != BOUND and j.state != "PENDING"} == set(
        got.requeue
    )
    assert BOUND not in got.requeue
    bound = next((j for j in jobs if j.job_id == BOUND), None)
    if got.delete:
        assert (bound is None and moved) or (bound is not None and BOUND in got.unbind)
    if bound is not None:
        assert got.delete == (bound.state != "PENDING")
    assert got.why


def test_reserved_jobs_parse() -> None:
    shown = (
        "4|RUNNING|n5\n9|PENDING|\n10|RUNNING|n[2,5]\nodd line\n|RUNNING|n1\n11|X|n[1-9999999999]\n"
    )
    assert parse_reserved_jobs(shown) == [
        rj("4", "RUNNING", ("n5",)),
        rj("9"),
        rj("10", "RUNNING", ("n2", "n5")),
        rj("11", "X", ()),
    ]


@pytest.fixture(autouse=True)
def fresh_looks() -> Iterator[None]:
    spares_module._next_look.clear()
    spares_module._started_seen.clear()
    yield
    spares_module._next_look.clear()
    spares_module._started_seen.clear()


def handed_lab(store: Store) -> SpareSlurm:
    slurm = busy_lab()
    assert pool(slurm, store).hand_over(BOUND, 0).node == "n5"
    slurm.calls.clear()
    return slurm


def start(slurm: SpareSlurm, job_id: str, nodes: tuple[str, ...] = ("n5",)) -> None:
    slurm.in_res.setdefault(RES, {})[job_id] = rj(job_id, "RUNNING", nodes)


def test_the_spare_is_released_once_its_run_runs_and_nothing_names_it_after(
    store: Store,
) -> None:
    slurm = handed_lab(store)
    spares = pool(slurm, store, at="n5")
    assert [t.delete for t in spares.tend()] == [False]  # waiting: kept
    assert slurm.calls == []
    start(slurm, BOUND)
    [done] = spares.tend()
    assert done.delete and slurm.calls == [("unbind", BOUND), ("delete", RES)]
    assert RES not in slurm.held
    assert spare_events(store)[-1] == RELEASED
    [released] = [e for e in store.events(kind="spare") if e.evidence["action"] == RELEASED]
    assert released.evidence["by"] == "n5" and released.evidence["actor"] == "daemon"
    assert released.target == f"job:{BOUND}"
    slurm.calls.clear()
    spares_module._next_look.clear()
    assert spares.tend() == [] and slurm.calls == []  # closed: not tended again


def test_the_users_second_job_on_the_spare_is_requeued_off_it(store: Store) -> None:
    slurm = handed_lab(store)
    start(slurm, "9")  # the same user named the reservation and got in first
    slurm.in_res[RES]["10"] = rj("10")  # and another waits in it
    [done] = pool(slurm, store, at="n5").tend()
    assert not done.delete  # the bound job still waits for the spare
    assert slurm.calls == [("requeue", "9"), ("unbind", "9"), ("unbind", "10")]
    assert list(slurm.in_res[RES]) == [BOUND]
    refused = [e for e in store.events(kind="spare") if e.evidence["action"] == REFUSED_JOB]
    assert sorted(str(e.evidence["refused"]) for e in refused) == ["10", "9"]
    assert all(e.evidence["job_id"] == BOUND and e.node == "n5" for e in refused)


def test_a_job_that_may_not_be_requeued_is_cancelled_off_the_spare(store: Store) -> None:
    slurm = handed_lab(store)
    start(slurm, "9")
    slurm.not_requeueable.add("9")
    pool(slurm, store, at="n5").tend()
    assert slurm.calls[:2] == [("requeue", "9"), ("cancel", "9")]
    assert "9" not in slurm.in_res[RES]
    [refused] = [e for e in store.events(kind="spare") if e.evidence["action"] == REFUSED_JOB]
    assert "cancelled" in refused.message


def test_a_bound_job_that_left_without_running_gives_the_spare_back(store: Store) -> None:
    slurm = handed_lab(store)
    del slurm.in_res[RES][BOUND]  # cancelled by its user while it waited
    [done] = pool(slurm, store, at="n5").tend()
    assert done.delete and slurm.calls == [("delete", RES)]
    assert spare_events(store)[-1] == GIVEN_BACK


def test_a_reservation_slurm_purged_is_recorded_as_given_back_once(store: Store) -> None:
    slurm = handed_lab(store)
    del slurm.held[RES]
    spares = pool(slurm, store, at="n5")
    [gone] = spares.tend()
    assert "purged" in gone.why and spare_events(store)[-1] == GIVEN_BACK
    spares_module._next_look.clear()
    assert spares.tend() == []


def handing_recorded(store: Store, ago: dt.timedelta) -> None:
    """The hand-over's intent, recorded `ago` by the faulty node's daemon (n1)."""
    store.add_event(node="n5", at=dt.datetime.now(dt.UTC) - ago, kind="spare",
                    severity=Severity.INFO, source="spares", message="handing",
                    target=f"job:{BOUND}", evidence={"action": HANDING, "job_id": BOUND,
                    "spare": "n5", "reservation": RES, "by": "n1"})  # fmt: skip


def test_a_hand_over_under_way_is_left_to_move_its_job(store: Store) -> None:
    slurm = busy_lab()
    slurm.held[RES] = ("n5",)
    handing_recorded(store, spares_module.MOVE_GRACE / 2)
    [kept] = pool(slurm, store, at="n5").tend()
    assert not kept.delete and "being moved in" in kept.why and slurm.calls == []


def test_a_crash_mid_hand_over_gives_the_spare_back_after_the_move_grace(store: Store) -> None:
    """The intent and the reservation were made, the faulty node's daemon died before
    moving the job: the spare's daemon deletes the reservation."""
    slurm = busy_lab()
    slurm.held[RES] = ("n5",)
    handing_recorded(store, spares_module.MOVE_GRACE * 2)
    [done] = pool(slurm, store, at="n5").tend()
    assert done.delete and "never moved" in done.why
    assert RES not in slurm.held and spare_events(store)[-1] == GIVEN_BACK


def test_only_the_spares_own_daemon_tends_it(store: Store) -> None:
    slurm = handed_lab(store)  # handed by n1's daemon, which may be rebooting now
    start(slurm, BOUND)
    assert pool(slurm, store, at="n1").tend() == []
    assert pool(slurm, store, at="n2").tend() == []
    assert slurm.calls == [] and RES in slurm.held
    assert pool(slurm, store, at="n5").tend()[0].delete


def test_slurm_failing_while_tending_is_tried_again_at_the_next_loop(store: Store) -> None:
    slurm = handed_lab(store)
    start(slurm, BOUND)
    slurm.fail("unbind", None)
    assert pool(slurm, store, at="n5").tend() == []
    slurm.fail("unbind", 0)
    [done] = pool(slurm, store, at="n5").tend()
    assert done.delete and RES not in slurm.held


def test_an_idle_daemon_reads_the_store_once_a_minute(store: Store) -> None:
    slurm = busy_lab()
    spares = pool(slurm, store, at="n2")
    reads: list[int] = []
    real = store.events

    def counted(*args: object, **kwargs: object) -> object:
        reads.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    store.events = counted  # type: ignore[method-assign]
    spares.tend()
    spares.tend()
    assert len(reads) == 1
    # A node in the pool may be handed any moment: its daemon looks every loop.
    assert pool(busy_lab(), store, at="n2", size=2).join("n2", lambda: DEEP_PASS)
    spares.tend()
    spares.tend()
    assert len(reads) == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["intruder_waits", "intruder_runs", "bound_runs",
                                 "bound_ends", "tend"]), max_size=12))  # fmt: skip
def test_model_no_other_job_keeps_the_spare(tmp_path_factory: pytest.TempPathFactory,
                                            steps: list[str]) -> None:  # fmt: skip
    """Any order of the user's other jobs entering, the bound job starting and ending, and
    the daemon's loops: after a loop no job but the bound one is in the reservation, and
    once the bound job ran (or left), the reservation is gone."""
    spares_module._next_look.clear()
    db = tmp_path_factory.mktemp("model") / "medic.db"
    with open_store(f"sqlite:///{db}") as store:
        slurm = handed_lab(store)
        spares = pool(slurm, store, at="n5")
        intruders = iter(str(n) for n in range(100, 200))
        for step in [*steps, "tend"]:
            jobs = slurm.in_res.get(RES, {})
            if RES not in slurm.held:  # gone: nothing can name it any more
                assert step == "tend" or not jobs
                continue
            if step == "intruder_waits":
                waiting = next(intruders)
                jobs[waiting] = rj(waiting)
            elif step == "intruder_runs":
                start(slurm, next(intruders))
            elif step == "bound_runs" and BOUND in jobs:
                start(slurm, BOUND)
            elif step == "bound_ends":
                jobs.pop(BOUND, None)
            elif step == "tend":
                spares.tend()
                left = slurm.in_res.get(RES, {})
                assert set(left) <= {BOUND}
                if RES in slurm.held:
                    assert left.get(BOUND, rj(BOUND)).state == "PENDING"


def test_a_node_in_the_pool_or_handed_is_watched_at_the_busy_pace(store: Store) -> None:
    slurm = handed_lab(store)
    spare, other = pool(slurm, store, at="n5"), pool(slurm, store, at="n2")
    spare.tend()
    other.tend()
    assert spare.watching() and not other.watching()
    start(slurm, BOUND)
    spare.tend()  # released: the spare is the run's allocation now, nothing to watch
    spares_module._next_look.pop("n5")
    spare.tend()
    assert not spare.watching()


def test_a_watched_spare_stays_watched_while_the_store_cannot_be_read(store: Store) -> None:
    """A store read failing once (SQLite busy on a loaded node) must not leave a handed
    spare unwatched for a minute: its launches would go unguarded."""
    slurm = handed_lab(store)
    spare, other = pool(slurm, store, at="n5"), pool(slurm, store, at="n2")
    spare.tend()
    other.tend()
    assert spare.watching() and not other.watching()
    real = store.events

    def down(*args: object, **kwargs: object) -> object:
        raise OSError("database is locked")

    store.events = down  # type: ignore[method-assign]
    assert spare.tend() == [] and spare.watching()
    assert spare.guard_launch("77") is None  # nothing known: the prolog's own rule stands
    spares_module._next_look.pop("n2")
    other.tend()
    assert not other.watching()  # any other node looks again a minute later, not every loop
    assert spares_module._next_look["n2"] > 0.0
    store.events = real  # type: ignore[method-assign]
    start(slurm, "77")  # the user's other job, in its prolog on the spare
    refusal = spare.guard_launch("77")  # read again: the other job is refused
    assert refusal is not None and refusal.fault_class == "spare.handed"


def test_no_pool_or_a_node_not_listed_reads_nothing(store: Store) -> None:
    slurm = handed_lab(store)
    start(slurm, "9")
    reads: list[int] = []
    real = store.events

    def counted(*args: object, **kwargs: object) -> object:
        reads.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    store.events = counted  # type: ignore[method-assign]
    assert pool(slurm, store, at="n5", size=0).tend() == []
    assert pool(slurm, store, at="n5", nodes=("n6",)).tend() == []
    assert reads == [] and slurm.calls == []
    assert pool(slurm, store, at="n5", nodes=("n5",)).tend()  # listed: tended

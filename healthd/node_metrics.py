"""The node's state now, as Prometheus families built at every scrape (a custom collector, as
client_python's docs describe): nothing here is a gauge cleared and refilled, so a scrape never
sees the state half rebuilt.

Where each family comes from, cheapest first:

* the daemon's last recorded check round (`observe_round`, under the daemon's record lock):
  the node's worst status, its faults, each GPU's worst status, the round's time;
* the daemon's memory: XID counts (the XID buffer), this node as Slurm last showed it to the
  daemon's ladder (`healthd.slurm_seen`: no Slurm call on a scrape);
* one store read per scrape, on a thread of its own with a deadline (STORE_READ_TIMEOUT):
  the pause switch, this node's episodes that wait on something, its open RMA tickets. A
  store that is down or hangs costs a scrape at most the deadline and no more threads than
  one: the scrape answers `medic_store_up 0` with the last values read (if any).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from healthd.checks.base import Result, Status, worst
from healthd.slurm_seen import SlurmSeen
from healthd.xid import XidBuffer
from medic_core.store import Store
from medic_core.store.models import RmaTicketRow
from remediation import episodes as ep

log = logging.getLogger("medic.healthd")

# The value each status is exported as in the *_status_code gauges.
STATUS_CODES = {
    Status.NOT_APPLICABLE: -1,
    Status.OK: 0,
    Status.WARN: 1,
    Status.UNKNOWN: 2,
    Status.CRITICAL: 3,
}
FAULT_STATUSES = (Status.WARN, Status.CRITICAL, Status.UNKNOWN)

# A scrape waits at most this long for the store (Prometheus's default scrape timeout is 10 s).
STORE_READ_TIMEOUT = 2.0
# Episodes that wait on something: the ladder's open states, and a human's (needs_human stays
# until `medic episode close` or `retry`).
WAITING_STATES = (*ep.OPEN_STATES, ep.NEEDS_HUMAN)
TICKET_CLOSED = "closed"


# --- what the metrics read of the daemon ----------------------------------------------------


class _Gpu(Protocol):
    @property
    def xids(self) -> XidBuffer: ...


class _Ladder(Protocol):
    @property
    def seen(self) -> SlurmSeen: ...


class RoundSource(Protocol):
    """The daemon, as the metrics read it (`HealthDaemon` is one)."""

    @property
    def node(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def gpu(self) -> _Gpu | None: ...

    @property
    def ladder(self) -> _Ladder | None: ...

    def current(self) -> list[Result]: ...


# --- the store read ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WaitingEpisode:
    state: str
    rung: int
    opened_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True)
class StoreFacts:
    paused: bool
    episodes: tuple[WaitingEpisode, ...]  # this node's, in WAITING_STATES
    tickets_open: int  # this node's RMA tickets not closed
    oldest_ticket: dt.datetime | None  # when the oldest of them was opened


def _utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def read_store_facts(store: Store, node: str) -> StoreFacts:
    """Three small indexed selects on one connection."""
    e = ep.episodes
    with store.engine.connect() as conn:
        paused = conn.execute(select(ep.control.c.paused).where(ep.control.c.id == 1)).scalar()
        rows = conn.execute(
            select(e.c.state, e.c.rung, e.c.opened_at, e.c.updated_at).where(
                e.c.node == node, e.c.state.in_(WAITING_STATES)
            )
        ).all()
        count, oldest = conn.execute(
            select(func.count(RmaTicketRow.id), func.min(RmaTicketRow.created_at)).where(
                RmaTicketRow.node == node, RmaTicketRow.state != TICKET_CLOSED
            )
        ).one()
    episodes = tuple(
        WaitingEpisode(str(state), int(rung), _utc(opened), _utc(updated))
        for state, rung, opened, updated in rows
    )
    return StoreFacts(bool(paused), episodes, int(count), _utc(oldest) if oldest else None)


class StoreReads:
    """At most one store read in flight; a scrape waits for it `timeout` seconds at most.
    A read that hangs keeps its thread (the scrapes meanwhile wait on that same read rather
    than start more), and its answer, when it comes, serves the next scrape."""

    def __init__(self, timeout: float = STORE_READ_TIMEOUT) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._pending: Future[StoreFacts] | None = None
        self.last: StoreFacts | None = None  # the last good read
        self._up: bool | None = None  # as last logged

    def read(self, fetch: Callable[[], StoreFacts]) -> tuple[StoreFacts | None, bool]:
        """(the facts, fresh) or (the last good facts or None, False)."""
        with self._lock:
            pending = self._pending
            if pending is None or pending.done():
                pending = self._pending = Future()
                threading.Thread(
                    target=_fill, args=(pending, fetch), name="metrics-store", daemon=True
                ).start()
        try:
            facts = pending.result(timeout=self.timeout)
        except Exception as exc:  # a timeout or the read's own error
            self._note(False, str(exc) or f"no answer within {self.timeout:g}s")
            return self.last, False
        self.last = facts
        self._note(True, "")
        return facts, True

    def _note(self, up: bool, why: str) -> None:
        if up == self._up:
            return
        self._up = up
        if up:
            log.info("metrics: the store answers again")
        else:
            log.warning("metrics: store read failed (medic_store_up 0): %s", why)


def _fill(future: Future[StoreFacts], fetch: Callable[[], StoreFacts]) -> None:
    try:
        future.set_result(fetch())
    except BaseException as exc:
        future.set_exception(exc)


# --- the collector ----------------------------------------------------------------------------


class NodeCollector(Collector):
    def __init__(self, node: str, version: str, store_timeout: float = STORE_READ_TIMEOUT) -> None:
        self.node = node
        self.version = version
        self.store_reads = StoreReads(store_timeout)
        self.read_store: Callable[[Store, str], StoreFacts] = read_store_facts
        # The last recorded round: the daemon, its results, and when (Unix time).
        self._round: tuple[RoundSource, tuple[Result, ...], float] | None = None

    def observe_round(self, source: RoundSource) -> None:
        self._round = (source, tuple(source.current()), time.time())

    def collect(self) -> Iterable[Metric]:
        build = InfoMetricFamily(
            "medic_build", "The running Medic's version, and the Slurm node it runs as."
        )
        build.add_metric([], {"version": self.version, "node": self.node})
        yield build
        last = self._round  # one read: a round recorded meanwhile is the next scrape's
        if last is None:
            return
        source, results, at = last
        yield from self._round_families(results, at)
        gpu = source.gpu
        if gpu is not None:
            yield _xids(gpu.xids)
        ladder = source.ladder
        if ladder is not None:
            yield from _slurm(ladder.seen)
        store, node = source.store, source.node
        facts, fresh = self.store_reads.read(lambda: self.read_store(store, node))
        yield GaugeMetricFamily(
            "medic_store_up",
            "1 when this scrape's store read answered in time; 0: the store values are the "
            "last read (if any).",
            value=int(fresh),
        )
        if facts is not None:
            yield from _store_families(facts)

    @staticmethod
    def _round_families(results: tuple[Result, ...], at: float) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "medic_healthd_last_round_timestamp_seconds",
            "When the daemon last recorded check results (Unix time).",
            value=at,
        )
        yield GaugeMetricFamily(
            "medic_node_status_code",
            "Worst status over every check's last run: -1 n/a, 0 OK, 1 WARN, 2 UNKNOWN, "
            "3 CRITICAL.",
            value=STATUS_CODES[worst([r.status for r in results])],
        )
        faults = GaugeMetricFamily(
            "medic_node_faults",
            "Current non-OK findings by status and fault class.",
            labels=["status", "fault_class"],
        )
        tally = Counter(
            (r.status.value, r.fault_class or "") for r in results if r.status in FAULT_STATUSES
        )
        for (status, fault_class), n in sorted(tally.items()):
            faults.add_metric([status, fault_class], n)
        yield faults
        per_gpu: dict[str, list[Status]] = {}
        for r in results:
            if r.check.startswith("gpu_") and r.target is not None and r.target.isdigit():
                per_gpu.setdefault(r.target, []).append(r.status)
        gpus = GaugeMetricFamily(
            "medic_gpu_status_code",
            "Worst status of the GPU checks' last findings about each GPU (same codes).",
            labels=["gpu"],
        )
        for index in sorted(per_gpu, key=int):
            gpus.add_metric([index], STATUS_CODES[worst(per_gpu[index])])
        yield gpus


def _xids(buffer: XidBuffer) -> Metric:
    family = CounterMetricFamily(
        "medic_gpu_xids",
        "XIDs seen since the daemon started (NVML events and kernel log, one per XID), by GPU "
        "('' when the PCI id matched no GPU) and XID code.",
        labels=["gpu", "xid"],
    )
    for (gpu, xid), n in sorted(buffer.counts().items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        family.add_metric(["" if gpu is None else str(gpu), str(xid)], n)
    return family


def _slurm(seen: SlurmSeen) -> Iterable[Metric]:
    view = seen.view
    if view is None:  # the daemon has not called Slurm about its node since it started
        return
    yield GaugeMetricFamily(
        "medic_slurm_node_in_service",
        "1 when Slurm, as the daemon last saw it, would start jobs on this node (no DRAIN, "
        "DOWN or FAIL).",
        value=int(not view.out_of_service),
    )
    yield GaugeMetricFamily(
        "medic_slurm_node_medic_drain",
        "1 when the node is out of service (drained or down) with a reason Medic gave, as the "
        "daemon last saw it.",
        value=int(view.medic_drain),
    )
    yield GaugeMetricFamily(
        "medic_slurm_node_seen_timestamp_seconds",
        "When the daemon last read this node from Slurm or drained, rebooted or resumed it "
        "(Unix time).",
        value=view.at,
    )


def _store_families(facts: StoreFacts) -> Iterable[Metric]:
    yield GaugeMetricFamily(
        "medic_remediation_paused",
        "1 while remediation is paused fleet-wide (`medic remediation pause`, or a fleet "
        "signature).",
        value=int(facts.paused),
    )
    count = GaugeMetricFamily(
        "medic_episodes",
        "This node's remediation episodes that wait on something, by state and rung.",
        labels=["state", "rung"],
    )
    for (state, rung), n in sorted(Counter((e.state, e.rung) for e in facts.episodes).items()):
        count.add_metric([state, str(rung)], n)
    yield count
    opened = GaugeMetricFamily(
        "medic_episode_opened_timestamp_seconds",
        "When the oldest of this node's episodes in each state was opened (Unix time).",
        labels=["state"],
    )
    changed = GaugeMetricFamily(
        "medic_episode_changed_timestamp_seconds",
        "The oldest last change among this node's episodes in each state (Unix time): for "
        "needs_human, when it was handed to a human.",
        labels=["state"],
    )
    for state in sorted({e.state for e in facts.episodes}):
        mine = [e for e in facts.episodes if e.state == state]
        opened.add_metric([state], min(e.opened_at for e in mine).timestamp())
        changed.add_metric([state], min(e.updated_at for e in mine).timestamp())
    yield opened
    yield changed
    yield GaugeMetricFamily(
        "medic_rma_tickets_open",
        "This node's RMA tickets not closed (the node stays out of service while any is).",
        value=facts.tickets_open,
    )
    if facts.oldest_ticket is not None:
        yield GaugeMetricFamily(
            "medic_rma_oldest_open_ticket_timestamp_seconds",
            "When this node's oldest RMA ticket still open was opened (Unix time).",
            value=facts.oldest_ticket.timestamp(),
        )

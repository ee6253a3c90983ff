"""Medic's drain records: which drains are Medic's own, from what it wrote down, never from
the reason's text.

Every drain Medic makes is recorded (node, the reason exactly as Slurm will store it, time,
actor, episode) BEFORE Slurm is asked: in the node's write-ahead journal first when the
caller runs on a node (medic_core.journal), then in the store (`drain_records`, with a
`medic.drain` event); a journal entry the store could not take is replayed into the same
record later. A resume writes `medic.resume` (the actor, the episode) and closes the record,
also before Slurm is asked.

Medic owns a drain only while an open record matches what Slurm shows: the node drained or
down, with exactly the recorded reason. Anyone else's drain, `medic: x` typed by an admin
included, has no record and is left alone. Only while neither the store nor the journal can
tell (`Holding.UNREACHABLE`) is the reason's prefix used, and then only to decide drains
(never over another's reason); a resume always needs a record.
"""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import os
import pwd
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from medic_core import journal
from medic_core.config import MedicConfig, NodePaths
from medic_core.slurm import NodeInfo

if TYPE_CHECKING:
    from medic_core.store import DrainRecord, Store

log = logging.getLogger("medic.drains")

# Actors of automatic drains and resumes (a human's is `operator()`).
DAEMON = "daemon"  # medic-healthd's answer to a fresh fault
LADDER = "ladder"  # the remediation ladder (give-back, reboot, keeping a node out)
HOOK = "hook"  # prolog, epilog, HealthCheckProgram
ISOLATOR = "isolator"
BURN_IN = "burn-in"
SPARES = "spares"

StoreOpener = Callable[[], AbstractContextManager["Store"]]


def operator() -> str:
    """The human running a CLI command: `cli:<login>(uid N)`. The login is the terminal's
    (os.getlogin: the person behind sudo too), else the password entry of the real uid."""
    uid = os.getuid()
    try:
        login = os.getlogin()
    except OSError:  # no controlling terminal (cron, ssh without a tty, a container)
        try:
            login = pwd.getpwuid(uid).pw_name
        except KeyError:
            login = getpass.getuser() if os.environ.get("USER") else f"uid{uid}"
    return f"cli:{login}(uid {uid})"


class Holding(StrEnum):
    RECORDED = "recorded"  # an open record matches what Slurm shows: Medic's drain
    UNRECORDED = "unrecorded"  # the records were read and none matches: not Medic's
    UNREACHABLE = "unreachable"  # neither the store nor the journal could tell


@dataclass(frozen=True)
class Ownership:
    holding: Holding
    record: DrainRecord | None  # the node's open record as read (matching or not)
    why: str

    @property
    def recorded(self) -> bool | None:
        """For NodeFacts.recorded: True, False, or None while the records are unreachable."""
        if self.holding is Holding.UNREACHABLE:
            return None
        return self.holding is Holding.RECORDED

    @property
    def held(self) -> str:
        return self.record.held if self.record is not None and self.recorded else ""


# What slurmctld appends to a node's reason during `scontrol reboot` (22.05, seen in the lab:
# "<reason> : reboot issued : reboot complete"; "... : reboot timed out" past ResumeTimeout).
SLURM_SUFFIXES = (" : reboot issued", " : reboot complete", " : reboot timed out")


def as_recorded(shown: str, recorded: str) -> bool:
    """Slurm's reason `shown` is the `recorded` one, with only Slurm's own reboot marks
    after it."""
    if not shown.startswith(recorded):
        return False
    rest = shown[len(recorded) :]
    while rest:
        mark = next((m for m in SLURM_SUFFIXES if rest.startswith(m)), None)
        if mark is None:
            return False
        rest = rest[len(mark) :]
    return True


def out_of_service(info: NodeInfo | None) -> bool:
    return info is not None and (info.drained or info.down)


def matches(record: DrainRecord | None, info: NodeInfo | None) -> bool:
    """`record` holds the drain Slurm shows: open, and the node drained or down with
    exactly the recorded reason (and at most Slurm's own reboot marks after it)."""
    return (
        record is not None
        and record.open
        and info is not None
        and out_of_service(info)
        and as_recorded(info.reason, record.reason)
    )


def judge(info: NodeInfo | None, record: DrainRecord | None, *, readable: bool) -> Ownership:
    """Whose the drain Slurm shows is, from the node's open record (`readable`: the
    records could be read; False only when neither the store nor the journal could)."""
    if matches(record, info):
        assert record is not None
        by = f"{record.actor}, episode {record.episode_id}" if record.episode_id else record.actor
        return Ownership(Holding.RECORDED, record, f"Medic's drain (recorded by {by})")
    if not readable:
        return Ownership(Holding.UNREACHABLE, record, "Medic's drain records are unreachable")
    shown = info.reason if info is not None else ""
    return Ownership(Holding.UNRECORDED, record, f"no drain record of Medic's holds {shown!r}")


def fold(record: DrainRecord | None, entries: Iterable[journal.Entry]) -> DrainRecord | None:
    """The node's open record after the journal's entries not yet in the store (oldest
    first), as the store will have it once they are replayed."""
    from medic_core.store import DRAIN_HELD, DRAIN_RECORDED, DRAIN_RESUMED, DrainRecord

    for entry in entries:
        evidence = entry.event.get("evidence") or {}
        reason, actor = str(evidence.get("reason", "")), str(evidence.get("actor", ""))
        episode = evidence.get("episode_id")
        kind = entry.event.get("kind")
        if kind == DRAIN_RECORDED:
            if record is None or record.drained_at <= entry.at:
                record = DrainRecord(
                    0, entry.node, reason, actor, episode if isinstance(episode, int) else None,
                    entry.at,
                )  # fmt: skip
        elif record is not None and record.reason == reason and record.drained_at <= entry.at:
            if kind == DRAIN_RESUMED:
                record = None
            elif kind == DRAIN_HELD:
                note = str(evidence.get("note", ""))
                record = replace(record, held=f"{actor}: {note}" if note else actor)
    return record


class DrainBook:
    """Where this process records and reads Medic's drains: `store` (opened per use; a
    long-lived Store goes in through `DrainBook.of`) and, on a node, its journal."""

    def __init__(
        self,
        store: StoreOpener | None,
        paths: NodePaths | None = None,
        observing: Callable[[], bool] | None = None,
    ) -> None:
        self._store = store
        self._paths = paths
        # Observe-only mode (remediation.observe), read at every write: no drain is made, so
        # none is recorded (a record would make Medic own a drain it never made).
        self._observing = observing

    @classmethod
    def of(
        cls,
        store: Store | None,
        paths: NodePaths | None = None,
        observing: Callable[[], bool] | None = None,
    ) -> DrainBook:
        """A book over an open store (the daemon's; never closed here)."""
        return cls((lambda: nullcontext(store)) if store is not None else None, paths, observing)

    # -- reading ------------------------------------------------------------------------

    def ownership(self, node: str, info: NodeInfo | None) -> Ownership:
        """Whose the drain Slurm shows (`info`, read just before) is."""
        record, store_read = None, False
        if self._store is not None:
            try:
                with self._store() as store:
                    record = store.open_drain(node)
                store_read = True
            except Exception as exc:  # the store: down, full, not migrated
                log.warning("%s: drain records: the store is unreachable: %s", node, _line(exc))
        entries, journal_read = self._journal(node)
        folded = fold(record, entries)
        if not store_read and folded is None:
            # Only the journal was read: it holds what the store did not take, not the
            # records the store already has. It cannot say "not Medic's".
            return judge(info, None, readable=False)
        return judge(info, folded, readable=store_read or journal_read)

    def _journal(self, node: str) -> tuple[list[journal.Entry], bool]:
        from medic_core.store import DRAIN_KINDS

        if self._paths is None:
            return [], False
        found = []
        for path in journal.pending(self._paths):
            try:
                entry = journal.read_entry(path)
            except ValueError:
                continue
            if entry.node == node and entry.event.get("kind") in DRAIN_KINDS:
                found.append(entry)
        readable = any(
            d.is_dir() and os.access(d, os.R_OK) for d in journal.journal_dirs(self._paths)
        )
        return found, readable

    # -- writing: always before Slurm is asked ------------------------------------------

    def record_drain(
        self, node: str, reason: str, *, actor: str, episode_id: int | None = None, note: str = ""
    ) -> str:
        """Record the drain Medic is about to ask of Slurm (`reason` as Slurm will store
        it). Returns where it went: "store", "journal" (replayed later) or "" (nowhere: the
        drain goes ahead, and Medic will not resume it by itself)."""
        from medic_core.store import DRAIN_RECORDED

        return self._write(node, DRAIN_RECORDED, reason, actor, episode_id, note)

    def record_resume(
        self, node: str, reason: str, *, actor: str, episode_id: int | None = None, note: str = ""
    ) -> str:
        """Record the resume Medic (or a human through the CLI) is about to ask of Slurm,
        closing the open record with this reason."""
        from medic_core.store import DRAIN_RESUMED

        return self._write(node, DRAIN_RESUMED, reason, actor, episode_id, note)

    def hold(self, node: str, reason: str, *, actor: str, note: str) -> str:
        """From now on only a human gives this drain back (`medic node resume`)."""
        from medic_core.store import DRAIN_HELD

        return self._write(node, DRAIN_HELD, reason, actor, None, note)

    def _write(
        self, node: str, kind: str, reason: str, actor: str, episode_id: int | None, note: str
    ) -> str:
        from medic_core.store.drain_records import drain_event

        if self._observing is not None and self._observing():
            return ""  # observe only: nothing is drained or resumed, so nothing recorded
        at = dt.datetime.now(dt.UTC)
        event = drain_event(kind, reason, at, actor, episode_id, note)
        entry = None
        if self._paths is not None:
            kept = {k: v for k, v in event.items() if k != "at"}
            try:
                entry = journal.write_ahead(self._paths, node, kept, at)
            except journal.JournalFull as exc:
                log.warning("%s: %s not kept in the journal: %s", node, kind, exc)
        if self._store is not None:
            try:
                with self._store() as store:
                    # What the journal holds of this node's drains first (kept while the
                    # store was down): a hold or resume must find the record it applies to.
                    for earlier in self._journal(node)[0]:
                        if earlier.path != entry:
                            store.add_event(**earlier.store_fields())
                            journal.delivered(earlier.path)
                    store.add_event(node, **event)
            except Exception as exc:
                log.warning("%s: %s not stored: %s", node, kind, _line(exc))
            else:
                if entry is not None:
                    journal.delivered(entry)
                return "store"
        if entry is not None:
            return "journal"
        log.error("%s: %s recorded nowhere (no store, no journal): %s", node, kind, reason)
        return ""


def _line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def node_book(config: MedicConfig) -> DrainBook:
    """The book of a process on a node without a store of its own (the hooks, the CLI on
    a node): the configured store, opened per use, and the node's journal."""

    def opener() -> AbstractContextManager[Store]:
        from medic_core.store import open_configured_store

        return open_configured_store(config)

    def observing() -> bool:
        from medic_core.settings import RemediationSettings

        return RemediationSettings.from_config(config).observe_only

    return DrainBook(opener, config.paths, observing)

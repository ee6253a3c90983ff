"""Medic's drain reasons, and the rule that Medic only drains and resumes what is its own.

A Medic drain says `medic: <fault class> <where> <short evidence>`, e.g.
`medic: gpu.xid.79 gpu2 GPU has fallen off the bus`. Whose a drain is comes from Medic's drain
records (medic_core.drain_book), not from this text: an admin may type `medic: x` too. Anything
not recorded (an admin's note, NHC's, Slurm's "Prolog error" or "Not responding") belongs to
someone else: Medic never overwrites it and never resumes such a node (LBNL NHC's rule).
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from medic_core.slurm import SlurmClient
from medic_core.text import sanitised

if TYPE_CHECKING:
    from medic_core.drain_book import DrainBook, Ownership

log = logging.getLogger("medic.drains")
HOOK_ACTOR = "hook"  # medic_core.drain_book.HOOK, spelt out: that module is not imported here

PREFIX = "medic: "
# slurmctld keeps any length (1000 characters tested on 22.05), but slurmdbd stores a node
# event's reason in a MySQL TINYTEXT (255 bytes) and `sinfo -R` shows 20 characters by
# default: stay well under, counted in UTF-8 bytes.
MAX_REASON = 128
NODE_WIDE = "node"  # <where> of a fault that has no narrower target
ELLIPSIS = "..."


@dataclass(frozen=True)
class MedicReason:
    fault_class: str
    where: str
    evidence: str


# An admin's reason: slurmdbd keeps a node event's reason in a TINYTEXT (255 bytes).
MAX_ADMIN_REASON = 255
# Unicode categories never printed as they are into a reason: controls (NUL, BEL, ESC ...),
# format characters (RTL/LTR overrides and isolates, zero-width ones), surrogates, private
# use and unassigned code points. Whitespace controls (\n, \t) collapse to spaces first.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def printable(text: str) -> str:
    """`text` with every character that a terminal, `sinfo` or a log would not show as
    itself (or would use to reorder what follows) replaced by "?", and line breaks and tabs
    by spaces: the one sanitiser, medic_core.text.sanitised."""
    return sanitised(text)


def unprintable(text: str) -> list[str]:
    """The characters of `text` that `printable` would replace, as U+XXXX names."""
    found = {c for c in text if unicodedata.category(c) in _UNPRINTABLE and c not in " \t\n\r"}
    return [f"U+{ord(c):04X}" for c in sorted(found)]


def admin_reason_problem(reason: str) -> tuple[str, str] | None:
    """(problem, fix) when an admin's reason (`medic node drain|reboot --reason`) cannot go
    to Slurm as it is: longer than MAX_ADMIN_REASON UTF-8 bytes, or holding characters that
    would not show as themselves (NUL, BEL, escape sequences, RTL overrides)."""
    size = len(reason.encode("utf-8", errors="surrogatepass"))
    if size > MAX_ADMIN_REASON:
        return (
            f"--reason is {size} bytes, over the {MAX_ADMIN_REASON} bytes Slurm's accounting keeps",
            "say it shortly and put the details in a ticket",
        )
    bad = unprintable(reason)
    if bad:
        return (
            f"--reason holds characters that do not print as themselves ({', '.join(bad[:5])})",
            "type plain text",
        )
    return None


def _word(text: str) -> str:
    return "_".join(printable(text).split())


def _fit(text: str, limit: int) -> str:
    """Cut `text` to `limit` UTF-8 bytes without splitting a character."""
    return text.encode()[:limit].decode(errors="ignore")


def format_reason(fault_class: str, where: str = "", evidence: str = "") -> str:
    """`medic: <fault class> <where> <evidence>` in at most MAX_REASON bytes; the evidence
    is cut first. A bare GPU index becomes `gpuN`; an empty `where` is `node`. Whitespace
    (newlines included) collapses to single spaces, "=" becomes ":" so that tools that
    split `scontrol show node` output on "=" keep the reason whole, and what would not print
    as itself (NUL, BEL, ESC, RTL overrides, zero-width characters) becomes "?"."""
    where = _word(where)
    where = f"gpu{where}" if where.isdigit() else (where or NODE_WIDE)
    head = f"{PREFIX}{_word(fault_class) or 'unknown'} {where}"
    if len(head.encode()) > MAX_REASON:
        return _fit(head, MAX_REASON)
    text = " ".join(printable(evidence).replace("=", ":").split())
    if not text:
        return head
    room = MAX_REASON - len(head.encode()) - 1
    if len(text.encode()) > room:
        if room <= len(ELLIPSIS):
            return head
        text = _fit(text, room - len(ELLIPSIS)).rstrip() + ELLIPSIS
    return f"{head} {text}"


def is_medic_reason(reason: str | None) -> bool:
    """The reason reads like Medic's (its prefix, as Slurm stores it: see as_slurm_stores).
    Not ownership: that is a drain record's (medic_core.drain_book); the prefix decides only
    while the records are unreachable, and never a resume."""
    return bool(reason) and str(reason).startswith(PREFIX)


def as_slurm_stores(reason: str) -> str:
    """The reason slurmctld keeps for `scontrol update ... reason=<reason>`: scontrol drops
    one leading and one trailing double quote (each on its own), so `"medic: x"` typed
    with its quotes is stored as `medic: x`."""
    if reason.startswith('"'):
        reason = reason[1:]
    if reason.endswith('"'):
        reason = reason[:-1]
    return reason


def claims_medic_prefix(reason: str) -> bool:
    """An admin's reason that Slurm would store as (or that reads like) one of Medic's:
    after quotes and whitespace on the left, it starts with `medic:` in any case. Medic
    resumes its own drains by itself, so nobody else may write one."""
    return as_slurm_stores(reason).lstrip(" \t\n\"'").lower().startswith(PREFIX.strip())


# The fault class of a burn-in drain (remediation/burn_in.py): a node not yet qualified, not
# a fault. The drain cap neither holds it back nor counts it (docs/remediation.md).
BURN_IN = "burn-in"


def is_burn_in_reason(reason: str | None) -> bool:
    """Medic's burn-in drain: `medic: burn-in <where> ...`."""
    parsed = parse_reason(reason)
    return parsed is not None and parsed.fault_class == BURN_IN


# The fault class of post-job hygiene's drain (slurm_hooks/hygiene.py): what a job left that
# survived SIGKILL. The user's problem, not the hardware's: neither capped nor counted by the
# drain cap, no episode (so no lemon), given back once the node is clean.
USER_PROBLEM = "user_problem"


def is_user_problem_reason(reason: str | None) -> bool:
    """Medic's post-job hygiene drain: `medic: user_problem <where> ...`."""
    parsed = parse_reason(reason)
    return parsed is not None and parsed.fault_class == USER_PROBLEM


def is_not_a_fault_reason(reason: str | None) -> bool:
    """A drain of Medic's that is no hardware fault (burn-in, user_problem): the drain cap's
    budget does not count it."""
    return is_burn_in_reason(reason) or is_user_problem_reason(reason)


def parse_reason(reason: str | None) -> MedicReason | None:
    """The parts of a Medic reason; None for anyone else's."""
    if not reason or not is_medic_reason(reason):
        return None
    words = reason[len(PREFIX) :].split(" ", 2)
    words += [""] * (3 - len(words))
    return MedicReason(words[0], words[1], words[2])


class DrainOutcome(StrEnum):
    """What drain_if_allowed / remediation.give_back did, for the caller's log line."""

    DRAINED = "drained"
    ALREADY_MEDIC = "already drained by medic"
    NOT_OURS_KEPT = "drained by someone else: reason kept"
    RESUMED = "resumed"
    NOT_DRAINED = "not drained"
    NOT_OURS = "not medic's drain: left alone"
    KEPT = "kept out"  # Medic's drain, but the decision core keeps it (see its why)
    WOULD_DRAIN = "would drain (observe only)"  # remediation.observe: recorded, not made
    WOULD_RESUME = "would resume (observe only)"
    UNKNOWN_NODE = "no such node"


def drain_if_allowed(
    client: SlurmClient,
    node: str,
    reason: str,
    book: DrainBook | None = None,
    *,
    actor: str = "medic",
    episode_id: int | None = None,
) -> DrainOutcome:
    """Drain `node` with Medic's `reason` unless it is already out of service for a reason
    someone else gave (kept as it is), or already drained by Medic (first evidence kept).
    The drain is recorded in `book` before Slurm is asked; whose an existing drain is comes
    from the book's records (the reason's prefix only while they are unreachable, or
    without a book)."""
    if not is_medic_reason(reason):
        raise ValueError(f"not a Medic drain reason (must start with {PREFIX!r}): {reason!r}")
    info = client.node(node)
    if info is None:
        return DrainOutcome.UNKNOWN_NODE
    if (info.drained or info.down) and info.reason:
        own = book.ownership(node, info) if book is not None else None
        ours = own.recorded if own is not None else None
        if ours is None:
            ours = is_medic_reason(info.reason)
        if episode_id is not None and own is not None and own.recorded:
            take_over(book, node, own, actor, episode_id)
        return DrainOutcome.ALREADY_MEDIC if ours else DrainOutcome.NOT_OURS_KEPT
    # Not out of service, or out of service without a word of why: say why.
    if book is not None:
        book.record_drain(node, as_slurm_stores(reason), actor=actor, episode_id=episode_id)
    client.drain(node, reason)
    return DrainOutcome.WOULD_DRAIN if observing(client) else DrainOutcome.DRAINED


def take_over_drain(
    client: SlurmClient, node: str, book: DrainBook, *, actor: str, episode_id: int
) -> None:
    """`take_over` of the drain Slurm shows on `node`, when it is Medic's: for an answer
    that decided no drain of its own (the node already out, or remediation off) but opened
    an episode. Never raises: Slurm or the store unreachable, the drain stays as it is (the
    answer, which records what Medic did, must go on)."""
    try:
        info = client.node(node)
        if info is None or not ((info.drained or info.down) and info.reason):
            return
        own = book.ownership(node, info)
        if own.recorded:
            take_over(book, node, own, actor, episode_id)
    except Exception as exc:
        log.warning("%s: the drain not taken over by episode %s: %s", node, episode_id, exc)


def take_over(
    book: DrainBook | None, node: str, own: Ownership, actor: str, episode_id: int
) -> None:
    """A drain the hooks recorded without an episode (the HealthCheckProgram's backstop,
    which can drain before the daemon answers the same fault) becomes the drain of the
    episode this fault opened: recorded again with it, so that it is the episode's (its
    ladder's or a human's) to give back, never the health check's to resume while the
    episode is open. A drain a human holds, one already an episode's, or another actor's
    (burn-in, spares, post-job hygiene: each gives back its own) stays as it is."""
    record = own.record
    if book is None or record is None or record.episode_id is not None or record.held:
        return
    if record.actor != HOOK_ACTOR:  # burn-in's, spares', hygiene's drains have their own ends
        return
    note = f"taken over from {record.actor} by episode {episode_id}"
    book.record_drain(node, record.reason, actor=actor, episode_id=episode_id, note=note)


def observing(client: object) -> bool:
    """The client records changes instead of making them (observe-only mode:
    remediation.observe.ObservingSlurm)."""
    return bool(getattr(client, "observing", False))

"""Single-GPU isolation, pure: may one bad GPU leave the node's GRES instead of the whole node
being drained, and what the node's GRES becomes.

On Slurm 22.05 a node's GPU count cannot be lowered with `scontrol update` (slurmctld refuses:
"Attempt to change gres/gpu Count on node n1 from 8 to 7 invalid with File configuration");
the node's `Gres=` in slurm.conf and its `File=` list in gres.conf must change together and
slurmctld and the node's slurmd restart (docs/remediation.md, "Single-GPU isolation"). That is
the site's `[remediation.isolation] apply` command; this module decides and plans, and
remediation.isolator carries it out, recorded in the episode's evidence.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from medic_core.settings import IsolationSettings

EVIDENCE_KEY = "isolation"
# The record's states, in the episode's evidence under EVIDENCE_KEY.
INTENT = "intent"  # decided and recorded; the apply command may or may not have run
APPLIED = "applied"  # Slurm shows the lower count; the node is back in service
RESTORING = "restoring"  # the GPU passed its repair: waiting for the node to be idle
RESTORED = "restored"  # Slurm shows every GPU again
STATES = (INTENT, APPLIED, RESTORING, RESTORED)


@dataclass(frozen=True)
class IsolationDecision:
    isolate: bool
    gpus: tuple[int, ...]  # the node's isolated GPUs if this is carried out
    why: str


def _matches(fault_class: str, prefixes: Iterable[str]) -> bool:
    return any(fault_class == p or fault_class.startswith(p + ".") for p in prefixes)


def decide_isolation(
    fault_class: str,
    target: str,
    *,
    gpus_total: int,
    isolated: Collection[int],
    settings: IsolationSettings,
) -> IsolationDecision:
    """Take GPU `target` out of the node's GRES (isolate) or drain the whole node (not).
    `isolated`: the GPUs Medic already keeps out of this node's GRES."""
    kept = tuple(sorted(set(isolated)))

    def no(why: str) -> IsolationDecision:
        return IsolationDecision(False, kept, why)

    if not settings.enabled:
        return no("isolation is off ([remediation.isolation] enabled = false)")
    if not (target.isascii() and target.isdigit()):
        return no(f"{fault_class} is not on one GPU (target {target!r})")
    gpu = int(target)
    if gpu >= gpus_total:
        return no(f"GPU {gpu} is not one of the node's {gpus_total} GPUs")
    if not _matches(fault_class, settings.faults):
        return no(f"{fault_class} is not among the faults that allow isolation")
    if settings.nvswitch and _matches(fault_class, settings.nvswitch_refused):
        return no(f"{fault_class} on an NVSwitch system: the fabric may be affected")
    if gpu in kept:
        return IsolationDecision(True, kept, f"GPU {gpu} is already isolated")
    after = tuple(sorted({*kept, gpu}))
    if len(after) > settings.max_gpus:
        return no(
            f"{len(kept)} GPU(s) already isolated on this node (max_gpus {settings.max_gpus}):"
            " the whole node drains"
        )
    if len(after) >= gpus_total:
        return no("no GPU would be left")
    return IsolationDecision(True, after, f"GPU {gpu} leaves the GRES ({fault_class})")


def index_ranges(indexes: Iterable[int]) -> str:
    """[0, 1, 2, 3, 4, 6, 7] -> "0-4,6-7", as gres.conf's File=/dev/nvidia[...] takes it."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(set(indexes)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


@dataclass(frozen=True)
class GresPlan:
    """What the node's GRES is with `isolated` out: slurm.conf's count, gres.conf's files."""

    count: int
    keep: tuple[int, ...]
    isolated: tuple[int, ...]

    @property
    def files(self) -> str:
        return index_ranges(self.keep)

    @property
    def gres(self) -> str:
        return f"gpu:{self.count}"

    def argv(self, template: Iterable[str], node: str) -> list[str]:
        """The site's apply command for this plan: {node}, {count}, {keep} (e.g. "0-4,6-7")
        and {isolated} (e.g. "5", "" when every GPU returns)."""
        values = {
            "node": node,
            "count": str(self.count),
            "keep": self.files,
            "isolated": ",".join(str(i) for i in self.isolated),
        }
        return [a.format(**values) for a in template]


def plan(gpus_total: int, isolated: Collection[int]) -> GresPlan:
    out = tuple(sorted(i for i in set(isolated) if 0 <= i < gpus_total))
    keep = tuple(i for i in range(gpus_total) if i not in out)
    return GresPlan(len(keep), keep, out)


def gres_count(gres: str, name: str = "gpu") -> int | None:
    """The count of `name` in Slurm's Gres text ("gpu:7", "gpu:h100:8(S:0-1),nic:1") or None."""
    for part in gres.split(","):
        words = part.split("(")[0].split(":")
        if words[0] != name or len(words) < 2:
            continue
        last = words[-1]
        if last.isascii() and last.isdigit():
            return int(last)
    return None


@dataclass(frozen=True)
class IsolationRecord:
    """Medic's own record of what it took out, in the episode's evidence: the only GPUs it
    ever puts back (never one an admin took out by hand)."""

    gpus: tuple[int, ...]
    gpus_total: int
    state: str

    def to_json(self) -> dict[str, Any]:
        return {"gpus": list(self.gpus), "gpus_total": self.gpus_total, "state": self.state}

    def moved(self, state: str) -> IsolationRecord:
        return IsolationRecord(self.gpus, self.gpus_total, state)


def recorded(evidence: Mapping[str, Any]) -> IsolationRecord | None:
    """The record in an episode's evidence; None when there is none or it is not one of ours
    (a malformed record is treated as absent: nothing is put back on its word)."""
    raw = evidence.get(EVIDENCE_KEY)
    if not isinstance(raw, Mapping):
        return None
    gpus, total, state = raw.get("gpus"), raw.get("gpus_total"), raw.get("state")
    if not isinstance(gpus, list) or not all(isinstance(g, int) and g >= 0 for g in gpus):
        return None
    if not isinstance(total, int) or total <= 0 or state not in STATES:
        return None
    return IsolationRecord(tuple(sorted(set(gpus))), total, str(state))


def out_of_gres(record: IsolationRecord | None) -> tuple[int, ...]:
    """The GPUs Slurm no longer hands to jobs on this record's word: applied, or waiting to
    come back (the node is drained for that). At `intent` the command may not have run yet
    (the node is still drained whole), and `restored` gave them back."""
    if record is None or record.state not in (APPLIED, RESTORING):
        return ()
    return record.gpus

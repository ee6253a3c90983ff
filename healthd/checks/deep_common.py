"""What the deep-tier checks share (this module registers no check).

A deep check runs a benchmark or diagnostic tool on an idle node. The tool is looked up on
a configured list of directories (never `PATH`: the daemon's environment is not the
operator's shell), run only through `ctx.commands` with a timeout, and its output parsed
by a pure `parse_<tool>(text)`. The directories are paths of the daemon's own filesystem,
not below `ctx.roots.root`: the host root is where /sys, /proc and /dev are read, and the
lab's fixture trees hold no binaries.

Conventions every deep check follows:

* tool absent -> NOT_APPLICABLE (nothing on this node expects it);
* tool present but failed, timed out, or printed nothing parseable -> UNKNOWN
  `check.command_failed` (never a hardware verdict);
* a measurement below its threshold -> the check's own fault class. A deep finding is a
  reason to look at the node before it takes jobs again, so a fault class with no entry in
  `REMEDIATIONS` is recommended DRAIN here (the recommendation word travels in evidence).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from healthd.checks.base import (
    CheckConfig,
    Kind,
    Recommendation,
    Result,
    Status,
    fault,
    not_applicable,
    setting,
)
from medic_core.proc import CommandResult

# Where benchmark tools usually land: distribution packages, `make install`, NVIDIA's
# packages (DCGM installs to /usr/bin; nccl-tests and perftest are often built to /opt).
DEFAULT_SEARCH_DIRS: tuple[str, ...] = (
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/opt/nccl-tests/build",
    "/opt/stream",
)

# How much of a failed command's output goes into evidence.
EVIDENCE_TAIL_CHARS = 2000


@dataclass(frozen=True, kw_only=True)
class DeepToolConfig(CheckConfig):
    """Keys every deep check that runs a tool accepts."""

    search_dirs: tuple[str, ...] = setting(
        DEFAULT_SEARCH_DIRS,
        doc="absolute directories searched, in order, for the tool (PATH is never used)",
    )
    command_timeout: float = setting(
        600.0, minimum=1, doc="seconds the tool may run before it is killed (UNKNOWN)"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for directory in self.search_dirs:
            if not directory.startswith("/"):
                yield "search_dirs", f"{directory!r} is not absolute", "write it as /path"
        if self.timeout is not None and self.command_timeout >= self.timeout:
            yield (
                "command_timeout",
                f"{self.command_timeout:g}s is not below the check timeout {self.timeout:g}s",
                "lower command_timeout or raise timeout",
            )


def find_tool(names: Sequence[str], search_dirs: Sequence[str]) -> str | None:
    """The first executable regular file named one of `names` in `search_dirs` (directory
    order first, then name order), or None."""
    for directory in search_dirs:
        for name in names:
            candidate = Path(directory) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def threshold_for(model: str | None, table: Mapping[str, float], default: float) -> float | None:
    """The threshold for a GPU (or CPU) model: its own entry, else the default; 0 means
    "no threshold" and comes back as None."""
    value = table.get(model, default) if model is not None else default
    return value if value > 0 else None


def deep_fault(
    check: str,
    status: Status,
    fault_class: str,
    message: str,
    *,
    target: str | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> Result:
    """`fault()`, recommending DRAIN where the remediation table has no entry."""
    result = fault(check, status, fault_class, message, target=target, evidence=evidence)
    if result.remediation is not None:
        return result
    return Result(
        check,
        status,
        fault_class,
        target,
        message,
        {**result.evidence, "recommendation": Recommendation.DRAIN.value},
        Recommendation.DRAIN,
        Kind.CONDITION,
    )


def tool_absent(check: str, tool: str, search_dirs: Sequence[str]) -> Result:
    return not_applicable(
        check,
        f"{tool} not found in {', '.join(search_dirs) or 'no directories'}",
        {"tool": tool, "search_dirs": list(search_dirs)},
    )


def command_failed(
    check: str,
    what: str,
    run: CommandResult | None,
    why: str | None = None,
    *,
    target: str | None = None,
) -> Result:
    """UNKNOWN `check.command_failed`: the tool did not give an answer we can judge."""
    reason = why or (run.describe_failure() if run is not None else "no output")
    evidence: dict[str, Any] = {"why": reason}
    if run is not None:
        evidence.update(
            argv=list(run.argv),
            returncode=run.returncode,
            timed_out=run.timed_out,
            seconds=round(run.seconds, 3),
            output_tail=run.tail(EVIDENCE_TAIL_CHARS),
        )
    return fault(
        check,
        Status.UNKNOWN,
        "check.command_failed",
        f"{what}: {reason}",
        target=target,
        evidence=evidence,
    )


def run_evidence(run: CommandResult | None) -> dict[str, Any]:
    """What a successful run contributes to evidence: the command line and its duration."""
    if run is None:
        return {}
    return {"argv": list(run.argv), "seconds": round(run.seconds, 3)}

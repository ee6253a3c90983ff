"""Site command checks: NHC's `check_cmd_status` / `check_cmd_output` habit, configured, not
coded. Each `[checks.command.<name>]` table of medic.toml is one check named
`command.<name>`, with its own tiers, interval and timeout like any other check:

    [checks.command.gpfs_state]
    argv = ["/usr/lpp/mmfs/bin/mmgetstate", "-Y"]
    tiers = ["periodic"]
    interval = 120
    timeout = 10
    warn_codes = [2]
    fault_pattern = ":(down|arbitrating):"
    recommendation = "drain"

The argv runs without a shell through `medic_core.proc.run_capped` (the whole process group
killed at the timeout, at most OUTPUT_LIMIT bytes of each stream kept, bad UTF-8 replaced):
a command is the site's code and its output is data, never trusted to be small, quick or
text. Exit status 0 is OK; `warn_codes` are WARN, `critical_codes` CRITICAL, any other
non-zero status `other_status`. `fault_pattern` (a match is a finding) and
`require_pattern` (no match is a finding) look at stdout and stderr, with `pattern_status`.
A command that times out or cannot start is UNKNOWN (check.timeout, check.error): a
broken probe is not a hardware verdict.

This module registers no check of its own: `healthd.checks.load_check_configs` parses the
tables and `specs_for` turns them into specs the runner runs beside the registered ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from healthd.checks.base import (
    RECOMMENDATION_WORDS,
    Check,
    CheckConfig,
    CheckContext,
    CheckSpec,
    Fault,
    Kind,
    Recommendation,
    Result,
    Status,
    Tier,
    fault,
    ok,
    setting,
)
from medic_core import proc
from medic_core.text import sanitised

PREFIX = "command."  # a command check's name: command.<name>
TABLE = "command"  # its table: [checks.command.<name>]
OUTPUT_LIMIT = 64 * 1024  # bytes kept of each of stdout and stderr
SHOWN = 200  # characters of an output line put in a finding's message
DEFAULT_INTERVAL = 300.0
DEFAULT_TIMEOUT = 10.0
# Seconds the runner waits past the command's own timeout: proc kills the group at the
# timeout and waits up to 1 s for it, so the check answers UNKNOWN check.timeout itself.
KILL_GRACE = 1.5
NAME_RE = re.compile(r"^[a-z0-9_]{1,64}$")
FINDING_STATUSES = (Status.WARN.value, Status.CRITICAL.value)
OTHER_STATUSES = (Status.WARN.value, Status.CRITICAL.value, Status.UNKNOWN.value)
TIER_WORDS = tuple(t.value for t in Tier)


def _compiles(pattern: str) -> str:
    """'' when `pattern` is a valid regular expression, else why not."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return str(exc)
    return ""


@dataclass(frozen=True, kw_only=True)
class CommandCheckConfig(CheckConfig):
    """One `[checks.command.<name>]` table (`interval`, `timeout`, `enabled` as for any
    check; `timeout` is the command's, default 10 s)."""

    argv: tuple[str, ...] = setting(
        (), doc="the command, program first as an absolute path; run without a shell"
    )
    tiers: tuple[str, ...] = setting(
        ("periodic",), choices=TIER_WORDS, doc="launch, periodic and/or deep"
    )
    description: str = setting("", doc="one line shown in `medic check` and the findings")
    warn_codes: tuple[int, ...] = setting((), minimum=1, maximum=255, doc="exit statuses: WARN")
    critical_codes: tuple[int, ...] = setting(
        (), minimum=1, maximum=255, doc="exit statuses: CRITICAL"
    )
    other_status: str = setting(
        "CRITICAL", choices=OTHER_STATUSES, doc="any other non-zero exit status"
    )
    fault_pattern: str = setting("", doc="regex; a match in the output is a finding")
    require_pattern: str = setting("", doc="regex; output without a match is a finding")
    pattern_status: str = setting(
        "CRITICAL", choices=FINDING_STATUSES, doc="status of a pattern's finding"
    )
    recommendation: str = setting(
        "drain", choices=RECOMMENDATION_WORDS, doc="what to do about a WARN or CRITICAL"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if not self.argv or not self.argv[0]:
            yield "argv", "is missing or empty", 'give the command, e.g. ["/usr/bin/true"]'
        elif not self.argv[0].startswith("/"):
            yield (
                "argv",
                f"{self.argv[0]!r} is not an absolute path",
                "give the program's full path (the daemon's PATH is not your shell's)",
            )
        if not self.tiers:
            yield "tiers", "is empty", 'name at least one tier, e.g. ["periodic"]'
        both = sorted(set(self.warn_codes) & set(self.critical_codes))
        if both:
            yield "critical_codes", f"{both[0]} is also in warn_codes", "list it in one only"
        for key in ("fault_pattern", "require_pattern"):
            why = _compiles(getattr(self, key))
            if why:
                yield key, f"not a valid regular expression: {why}", "fix the pattern"
        if "\n" in self.description:
            yield "description", "is more than one line", "keep it to one line"

    @cached_property
    def compiled(self) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
        """(fault_pattern, require_pattern), compiled; None where not set."""
        return (
            re.compile(self.fault_pattern) if self.fault_pattern else None,
            re.compile(self.require_pattern) if self.require_pattern else None,
        )

    @property
    def command_timeout(self) -> float:
        return self.timeout if self.timeout is not None else DEFAULT_TIMEOUT


@dataclass(frozen=True)
class CommandObservation:
    name: str  # the check's name, command.<name>
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    start_error: str
    dropped: int  # bytes past OUTPUT_LIMIT, read and thrown away


def _line(text: str) -> str:
    """One printable line of at most SHOWN characters (medic_core.text.sanitised)."""
    flat = " ".join(sanitised(text).split())
    return flat if len(flat) <= SHOWN else flat[: SHOWN - 3] + "..."


def _last_line(obs: CommandObservation) -> str:
    for text in (obs.stderr, obs.stdout):
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            return _line(lines[-1])
    return "no output"


def _evidence(obs: CommandObservation, cfg: CommandCheckConfig) -> dict[str, Any]:
    return {
        "argv": list(cfg.argv),
        "exit": obs.returncode,
        "seconds": round(obs.seconds, 3),
        "output_tail": _line((obs.stdout + "\n" + obs.stderr)[-SHOWN:]),
        "dropped_bytes": obs.dropped,
    }


def evaluate_command(obs: CommandObservation, cfg: CommandCheckConfig) -> list[Result]:
    """The verdict on one run: pure, from the observation and the table alone."""
    name = obs.name
    evidence = _evidence(obs, cfg)
    if obs.start_error:
        message = f"{name}: could not start {cfg.argv[0]}: {_line(obs.start_error)}"
        return [fault(name, Status.UNKNOWN, "check.error", message, evidence=evidence)]
    if obs.timed_out:
        message = f"{name}: no answer within {cfg.command_timeout:g}s; its process group killed"
        return [fault(name, Status.UNKNOWN, "check.timeout", message, evidence=evidence)]
    found: list[tuple[Status, str]] = []
    code = obs.returncode
    if code:
        if code in cfg.critical_codes:
            status = Status.CRITICAL
        elif code in cfg.warn_codes:
            status = Status.WARN
        else:
            status = Status(cfg.other_status)
        found.append((status, f"exit {code}: {_last_line(obs)}"))
    fault_re, require_re = cfg.compiled
    output = obs.stdout + "\n" + obs.stderr
    if fault_re is not None:
        match = fault_re.search(output)
        if match is not None:
            start = output.rfind("\n", 0, match.start()) + 1
            end = output.find("\n", match.end())
            line = output[start : end if end >= 0 else len(output)]
            found.append((Status(cfg.pattern_status), f"output matched: {_line(line)}"))
    if require_re is not None and require_re.search(output) is None:
        found.append((Status(cfg.pattern_status), "output lacks the required pattern"))
    if not found:
        return [ok(name, f"{name}: exit 0 in {obs.seconds:.2f}s", evidence=evidence)]
    worst = max(found, key=lambda f: f[0].severity)
    status = worst[0]
    if status is Status.UNKNOWN:
        message = f"{name}: {worst[1]}"
        return [fault(name, status, "check.error", message, evidence=evidence)]
    label = cfg.description or name
    message = f"{label}: " + "; ".join(text for _, text in found)
    # Where the daemon looks for a WARN's word (restart_app, gpu_reset_when_idle act on WARN).
    evidence["recommendation"] = cfg.recommendation
    return [
        Result(
            check=name,
            status=status,
            fault_class=name,  # command.<name>
            target=None,
            message=message,
            evidence=evidence,
            remediation=Recommendation(cfg.recommendation),
            kind=Kind.CONDITION,
        )
    ]


class CommandCheck(Check[CommandObservation, CommandCheckConfig]):
    """A site command (`[checks.command.<name>]`): exit status and output to a verdict."""

    config_type = CommandCheckConfig

    def __init__(self, name: str = "command") -> None:
        self.name = name

    def gather(self, ctx: CheckContext, cfg: CommandCheckConfig) -> CommandObservation:
        # proc directly, not ctx.commands: the capture must be bounded (run_capped), and
        # the command is the site's, not a host reading a test would fake.
        result = proc.run_capped(cfg.argv, timeout=cfg.command_timeout, limit=OUTPUT_LIMIT)
        return CommandObservation(
            name=self.name,
            returncode=result.returncode,
            stdout=result.stdout,
            stderr=result.stderr,
            seconds=result.seconds,
            timed_out=result.timed_out,
            start_error=result.start_error,
            dropped=result.dropped,
        )

    @staticmethod
    def evaluate(observation: CommandObservation, cfg: CommandCheckConfig) -> list[Result]:
        return evaluate_command(observation, cfg)


@dataclass(frozen=True)
class CommandSpec(CheckSpec):
    """A command check's spec: built from its table, not registered."""

    def create(self) -> Check[Any, Any]:
        return CommandCheck(self.name)

    def timeout_for(self, cfg: CheckConfig) -> float:
        own = cfg.timeout if cfg.timeout is not None else DEFAULT_TIMEOUT
        return own + KILL_GRACE


def command_spec(name: str, cfg: CommandCheckConfig) -> CommandSpec:
    """The spec of check `name` (command.<name>) as its table describes it."""
    return CommandSpec(
        name=name,
        tiers=frozenset(Tier(t) for t in cfg.tiers),
        interval=DEFAULT_INTERVAL,
        timeout=DEFAULT_TIMEOUT,
        needs=("commands",),
        description=cfg.description or f"site command {' '.join(cfg.argv)[:SHOWN]}",
        check_class=CommandCheck,
        module=__name__,
        faults={
            name: Fault(
                (Status.WARN, Status.CRITICAL),
                "the site command's exit status or output (its table's recommendation)",
                cfg.recommendation,
            )
        },
    )

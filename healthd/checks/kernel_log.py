"""The kernel log: new /dev/kmsg records since the last run, matched against the rules in
kernel_log_rules.json (data, validated when this module is imported, so a bad rule stops
the daemon at start-up rather than silently never matching).

NVIDIA XID lines are not matched here; the GPU checks own them (through healthd.kmsg)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Kind,
    Result,
    Status,
    Tier,
    fault,
    ok,
    register,
    setting,
)
from healthd.kmsg import KmsgBatch, KmsgRecord, read_since

NAME = "kernel_log"
RULES_FILE = "kernel_log_rules.json"
RULE_KEYS = ("name", "pattern", "fault_class", "status", "description", "source")
EXAMPLE_KEYS = ("match", "no_match")  # sample lines, checked at load
RULE_STATUSES = (Status.WARN, Status.CRITICAL)
SAMPLES_PER_RULE = 3
_FAULT_CLASS = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")


class RuleError(ValueError):
    """A kernel log rule is invalid; the message names the file, the rule and the fix."""


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    fault_class: str
    status: Status
    description: str
    source: str
    match: tuple[str, ...]
    no_match: tuple[str, ...]

    def matches(self, message: str) -> bool:
        return self.pattern.search(message) is not None


def _rule(index: int, raw: Any, origin: str) -> Rule:
    label = f"{origin}: rule {index}"
    if not isinstance(raw, Mapping):
        raise RuleError(f"{label}: expected an object, got {type(raw).__name__}")
    if isinstance(raw.get("name"), str):
        label += f" ({raw['name']!r})"
    missing = [k for k in (*RULE_KEYS, *EXAMPLE_KEYS) if k not in raw]
    if missing:
        raise RuleError(f"{label}: missing {', '.join(missing)}; every rule needs all of them")
    unknown = sorted(set(raw) - set(RULE_KEYS) - set(EXAMPLE_KEYS))
    if unknown:
        raise RuleError(f"{label}: unknown keys {', '.join(unknown)}")
    for key in RULE_KEYS:
        if not isinstance(raw[key], str) or not raw[key]:
            raise RuleError(f"{label}: {key} must be a non-empty string")
    try:
        pattern = re.compile(raw["pattern"])
    except re.error as exc:
        raise RuleError(f"{label}: pattern does not compile: {exc}") from exc
    if not _FAULT_CLASS.match(raw["fault_class"]):
        raise RuleError(f"{label}: fault_class {raw['fault_class']!r} is not dotted lower case")
    if raw["status"] not in {s.value for s in RULE_STATUSES}:
        allowed = ", ".join(s.value for s in RULE_STATUSES)
        raise RuleError(f"{label}: status {raw['status']!r} is not one of {allowed}")
    examples: dict[str, tuple[str, ...]] = {}
    for key in EXAMPLE_KEYS:
        lines = raw[key]
        if not isinstance(lines, list) or not lines or not all(isinstance(s, str) for s in lines):
            raise RuleError(f"{label}: {key} must be a non-empty list of sample lines")
        examples[key] = tuple(lines)
    rule = Rule(
        name=raw["name"],
        pattern=pattern,
        fault_class=raw["fault_class"],
        status=Status(raw["status"]),
        description=raw["description"],
        source=raw["source"],
        match=examples["match"],
        no_match=examples["no_match"],
    )
    for line in rule.match:
        if not rule.matches(line):
            raise RuleError(f"{label}: pattern does not match its sample {line!r}")
    for line in rule.no_match:
        if rule.matches(line):
            raise RuleError(f"{label}: pattern matches its counter-sample {line!r}")
    return rule


def parse_rules(text: str, origin: str = RULES_FILE) -> tuple[Rule, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuleError(f"{origin}: not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise RuleError(f"{origin}: expected a JSON array of rules")
    rules = tuple(_rule(i, raw, origin) for i, raw in enumerate(data))
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if rule.name in seen:
            raise RuleError(f"{origin}: rule {i} ({rule.name!r}): duplicate name")
        seen.add(rule.name)
    return rules


def shipped_rules() -> tuple[Rule, ...]:
    return SHIPPED_RULES


SHIPPED_RULES = parse_rules(
    resources.files(__package__ or "healthd.checks").joinpath(RULES_FILE).read_text()
)


@dataclass(frozen=True, kw_only=True)
class KernelLogConfig(CheckConfig):
    disabled_rules: tuple[str, ...] = setting(
        (), choices=tuple(r.name for r in SHIPPED_RULES), doc="rule names to ignore"
    )
    start_at: str = setting(
        "beginning",
        choices=("beginning", "end"),
        doc="first run: read the whole ring buffer (since boot) or only what comes next",
    )


@dataclass(frozen=True)
class KernelLogObservation:
    batch: KmsgBatch
    rules: tuple[Rule, ...]
    first_run: bool


def match_records(
    records: Sequence[KmsgRecord], rules: Sequence[Rule]
) -> dict[str, list[KmsgRecord]]:
    """Records by the name of every rule they match."""
    found: dict[str, list[KmsgRecord]] = {}
    for record in records:
        for rule in rules:
            if rule.matches(record.message):
                found.setdefault(rule.name, []).append(record)
    return found


@register(
    name=NAME,
    tiers=(Tier.PERIODIC,),
    interval=30,
    timeout=10,
    faults={
        "kernel.*": Fault(
            (Status.WARN, Status.CRITICAL),
            "a kernel log rule matched (an event; see the kernel log rules below)",
        )
    },
)
class KernelLogCheck(Check[KernelLogObservation, KernelLogConfig]):
    """Kernel log: MCE, hung tasks, lockups, PCIe AER, Lustre evictions, NFS, fs errors."""

    config_type = KernelLogConfig

    def __init__(self) -> None:
        self._last_seq: int | None = None
        self._ran = False

    def gather(self, ctx: CheckContext, cfg: KernelLogConfig) -> KernelLogObservation:
        batch = read_since(ctx.roots.dev / "kmsg", self._last_seq)
        first_run = not self._ran
        self._ran, self._last_seq = True, batch.last_seq
        if first_run and cfg.start_at == "end":
            batch = KmsgBatch((), batch.last_seq, 0, batch.malformed, False)
        rules = tuple(r for r in SHIPPED_RULES if r.name not in cfg.disabled_rules)
        return KernelLogObservation(batch, rules, first_run)

    @staticmethod
    def evaluate(observation: KernelLogObservation, cfg: KernelLogConfig) -> list[Result]:
        batch = observation.batch
        by_rule = {r.name: r for r in observation.rules}
        results: list[Result] = []
        for name, records in match_records(batch.records, observation.rules).items():
            rule = by_rule[name]
            last = records[-1]
            count = f"{len(records)}x " if len(records) > 1 else ""
            results.append(
                fault(
                    NAME,
                    rule.status,
                    rule.fault_class,
                    f"{count}{rule.description}: {last.message}",
                    evidence={
                        "rule": rule.name,
                        "count": len(records),
                        "first_seq": records[0].seq,
                        "last_seq": last.seq,
                        "samples": [r.message for r in records[:SAMPLES_PER_RULE]],
                        "lost": batch.lost,
                    },
                    kind=Kind.EVENT,
                )
            )
        if not results:
            results.append(
                ok(
                    NAME,
                    f"{len(batch.records)} new kernel log records, none matched",
                    evidence={
                        "records": len(batch.records),
                        "last_seq": batch.last_seq,
                        "lost": batch.lost,
                        "restarted": batch.restarted,
                    },
                    kind=Kind.EVENT,
                )
            )
        return results

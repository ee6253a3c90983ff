"""The kernel log: new /dev/kmsg records since the last run, matched against the rules in
kernel_log_rules.json (data, validated when this module is imported, so a bad rule stops
the daemon at start-up rather than silently never matching) and the site's own rules,
`[[checks.kernel_log.rules]]` in medic.toml (validated with the rest of the file: a bad
regex refuses the whole file, one line naming the rule and the key).

NVIDIA XID lines are not matched here; the GPU checks own them (through healthd.kmsg)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import Any

from healthd.checks.base import (
    RECOMMENDATION_WORDS,
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Kind,
    Recommendation,
    Result,
    Status,
    Tier,
    fault,
    ok,
    register,
    setting,
)
from healthd.kmsg import KmsgBatch, KmsgRecord, read_boot_wall, read_since, wall_time

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
    # A site rule's own recommendation; None: REMEDIATIONS by fault class (kernel.* -> none).
    recommendation: Recommendation | None = None

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


SITE_REQUIRED = ("name", "pattern", "fault_class", "status", "description")
SITE_OPTIONAL = ("recommendation", "match")


def site_rule_problems(index: int, raw: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """What is wrong with one `[[checks.kernel_log.rules]]` table, as (key, problem, fix)."""
    key = f"rules[{index}]"
    missing = [k for k in SITE_REQUIRED if not raw.get(k)]
    if missing:
        yield (
            f"{key}.{missing[0]}",
            "missing or empty",
            f"every site rule sets {', '.join(SITE_REQUIRED)}",
        )
        return
    unknown = sorted(set(raw) - set(SITE_REQUIRED) - set(SITE_OPTIONAL))
    if unknown:
        allowed = ", ".join((*SITE_REQUIRED, *SITE_OPTIONAL))
        yield f"{key}.{unknown[0]}", "unknown key", f"use only {allowed}"
    if raw["name"] in SHIPPED_NAMES:
        yield f"{key}.name", f"{raw['name']!r} is a shipped rule", "give the site rule its own name"
    try:
        pattern = re.compile(raw["pattern"])
    except re.error as exc:
        yield f"{key}.pattern", f"not a valid regular expression: {exc}", "fix the pattern"
        return
    fault_class = raw["fault_class"]
    if not (_FAULT_CLASS.match(fault_class) and fault_class.startswith("kernel.")):
        yield (
            f"{key}.fault_class",
            f"{fault_class!r} is not a dotted lower-case class under kernel.",
            'e.g. "kernel.site.gpfs_expel"',
        )
    if raw["status"] not in {s.value for s in RULE_STATUSES}:
        yield f"{key}.status", f"{raw['status']!r} is not allowed", "use WARN or CRITICAL"
    word = raw.get("recommendation")
    if word is not None and word not in RECOMMENDATION_WORDS:
        yield (
            f"{key}.recommendation",
            f"{word!r} is not a recommendation",
            f"use one of: {', '.join(RECOMMENDATION_WORDS)}",
        )
    sample = raw.get("match")
    if sample is not None and pattern.search(sample) is None:
        yield f"{key}.match", f"the pattern does not match its sample {sample!r}", "fix either"


def site_rule(raw: Mapping[str, str]) -> Rule:
    """A site rule already checked by `site_rule_problems`."""
    word = raw.get("recommendation")
    return Rule(
        name=raw["name"],
        pattern=re.compile(raw["pattern"]),
        fault_class=raw["fault_class"],
        status=Status(raw["status"]),
        description=raw["description"],
        source="site rule ([[checks.kernel_log.rules]])",
        match=(raw["match"],) if "match" in raw else (),
        no_match=(),
        recommendation=Recommendation(word) if word else None,
    )


SHIPPED_NAMES = frozenset(r.name for r in SHIPPED_RULES)


@dataclass(frozen=True, kw_only=True)
class KernelLogConfig(CheckConfig):
    disabled_rules: tuple[str, ...] = setting(
        (), choices=tuple(r.name for r in SHIPPED_RULES), doc="rule names to ignore"
    )
    rules: tuple[dict[str, str], ...] = setting(
        (),
        doc="site rules added to the shipped ones ([[checks.kernel_log.rules]]: name, pattern,"
        " fault_class under kernel., status WARN or CRITICAL, description; optional"
        " recommendation and a sample line `match`)",
    )
    start_at: str = setting(
        "beginning",
        choices=("beginning", "end"),
        doc="first run: read the whole ring buffer (since boot) or only what comes next",
    )
    history_seconds: float = setting(
        600.0,
        minimum=0,
        maximum=86400 * 30,
        doc="first run: a match older than this is history (recorded, not acted on: a daemon"
        " restarted hours after an MCE must not drain the node for it again)",
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        names: set[str] = set()
        for index, raw in enumerate(self.rules):
            yield from site_rule_problems(index, raw)
            if raw.get("name") in names:
                yield f"rules[{index}].name", f"{raw['name']!r} is used twice", "rename one"
            names.add(raw.get("name", ""))

    @cached_property
    def site_rules(self) -> tuple[Rule, ...]:
        """The site's rules, compiled (the table was checked when it was parsed)."""
        return tuple(site_rule(raw) for raw in self.rules)


@dataclass(frozen=True)
class KernelLogObservation:
    batch: KmsgBatch
    rules: tuple[Rule, ...]
    first_run: bool
    now: float = 0.0  # monotonic, when read
    boot_wall: float | None = None  # wall time of the kernel log's zero (kmsg.boot_wall)


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
        shipped = tuple(r for r in SHIPPED_RULES if r.name not in cfg.disabled_rules)
        rules = shipped + cfg.site_rules
        now = ctx.clock.monotonic()
        boot = read_boot_wall(ctx.clock.monotonic, lambda: ctx.clock.now().timestamp())
        return KernelLogObservation(batch, rules, first_run, now, boot)

    @staticmethod
    def evaluate(observation: KernelLogObservation, cfg: KernelLogConfig) -> list[Result]:
        batch = observation.batch
        by_rule = {r.name: r for r in observation.rules}
        results: list[Result] = []
        for name, records in match_records(batch.records, observation.rules).items():
            rule = by_rule[name]
            last = records[-1]
            count = f"{len(records)}x " if len(records) > 1 else ""
            found = fault(
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
                    **_fault_at(records[0], observation),
                    **_history(last, observation, cfg.history_seconds),
                },
                kind=Kind.EVENT,
            )
            if rule.recommendation is not None:
                found = dataclasses.replace(found, remediation=rule.recommendation)
            results.append(found)
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


def _history(
    last: KmsgRecord, observation: KernelLogObservation, seconds: float
) -> dict[str, bool]:
    """{"history": True} for what the first run found older than `seconds` (its newest
    matching record's kernel time against now, both since boot): a CRITICAL match is acted
    on (the daemon drains for it) only when it is news."""
    if not observation.first_run or observation.now <= 0:
        return {}
    age = observation.now - last.timestamp_us / 1e6
    return {"history": True} if age > seconds else {}


def _fault_at(record: KmsgRecord, observation: KernelLogObservation) -> dict[str, str]:
    """`fault_at`: the first matching record's kernel timestamp as a wall time (for
    `medic report`'s detection; see healthd.kmsg.wall_time)."""
    if observation.boot_wall is None:
        return {}
    at = wall_time(record.timestamp_us, observation.boot_wall, observation.now)
    return {} if at is None else {"fault_at": at.isoformat()}

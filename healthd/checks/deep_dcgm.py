"""DCGM diagnostics: `dcgmi diag -r <level> -j`, every test's verdict for every GPU.

dcgmi prints one JSON document (jsoncpp's styled writer). DCGM 4.x nests the tests under
"DCGM Diagnostic" > "test_categories" > "tests" > "results", one result per entity
(`entity_group` "GPU", `entity_id` the GPU id) with `status` "Pass" / "Fail" / "Warn" /
"Skip" / "Not Run", `warnings` ({"warning": ..., "error_id": ...}) and `info`; the GPUs
are listed under "entity_groups" and versions under "metadata" (the schema is DCGM's
testing/python3/dcgm_diag_schema.json). DCGM 3.x used "DCGM GPU Diagnostic" as the top
key and `gpu_ids` (a string) instead of the entity fields; both are read. dcgmi exits
non-zero when a test fails, so the exit status alone says nothing: the document does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from healthd.checks.base import (
    Check,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    fault,
    ok,
    register,
    setting,
)
from healthd.checks.deep_common import (
    DeepToolConfig,
    command_failed,
    deep_fault,
    find_tool,
    run_evidence,
    tool_absent,
)
from medic_core.proc import CommandResult

NAME = "deep_dcgm"
TOOL = "dcgmi"
FAULT = "gpu.dcgm.diag"

# The statuses DCGM prints, normalised to lower case; anything else is not evidence of
# health and is reported UNKNOWN.
PASS, FAIL, WARN, SKIP, NOT_RUN = "pass", "fail", "warn", "skip", "not run"
KNOWN_STATUSES = frozenset({PASS, FAIL, WARN, SKIP, NOT_RUN})

# Seconds dcgmi needs per level, roughly (NVIDIA's DCGM user guide: r1 seconds, r2 about two
# minutes, r3 about half an hour, r4 one to two hours); the command timeout defaults to
# the level-3 figure with room to spare.
DEFAULT_COMMAND_TIMEOUT = 3000.0


@dataclass(frozen=True, kw_only=True)
class DeepDcgmConfig(DeepToolConfig):
    level: int = setting(2, minimum=1, maximum=4, doc="dcgmi diag run level (-r)")
    command_timeout: float = setting(
        DEFAULT_COMMAND_TIMEOUT, minimum=1, doc="seconds dcgmi may run before it is killed"
    )
    ignore_tests: tuple[str, ...] = setting(
        (),
        doc="test names whose verdicts are kept in evidence but not judged, e.g. "
        "'software' on nodes that run without persistence mode (case-insensitive)",
    )


@dataclass(frozen=True)
class DcgmResult:
    """One test's verdict for one entity (a GPU, a CPU, or the node for DCGM 3.x's
    deployment tests that carry no GPU id)."""

    category: str
    test: str
    entity_group: str  # "GPU", "CPU", or "" for a node-wide result
    entity_id: int | None
    status: str  # lower case: pass, fail, warn, skip, not run, or what DCGM printed
    warnings: tuple[str, ...] = ()
    info: tuple[str, ...] = ()

    @property
    def target(self) -> str | None:
        if self.entity_id is None:
            return None
        return (
            str(self.entity_id)
            if self.entity_group in ("GPU", "")
            else (f"{self.entity_group}:{self.entity_id}")
        )


@dataclass(frozen=True)
class DcgmDiag:
    version: str | None
    driver_version: str | None
    results: tuple[DcgmResult, ...]
    runtime_error: str | None = None
    gpu_device_ids: Mapping[int, str] = field(default_factory=dict)  # GPU id -> PCI device id


@dataclass(frozen=True)
class DeepDcgmObservation:
    tool: str | None  # the dcgmi found, None when absent
    run: CommandResult | None = None
    diag: DcgmDiag | None = None
    parse_error: str | None = None
    level: int = 2


def _texts(value: Any, key: str) -> tuple[str, ...]:
    """`info` is a string in DCGM 3.x and a list in 4.x; `warnings` is a list of objects
    with "warning" (3.x deployment tests wrote the message under "warnings")."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if isinstance(item, Mapping):
            text = item.get(key, item.get(f"{key}s"))
            if text is not None:
                out.append(str(text))
        elif item is not None:
            out.append(str(item))
    return tuple(out)


def _entity_ids(result: Mapping[str, Any]) -> tuple[str, list[int | None]]:
    if "entity_id" in result:
        return str(result.get("entity_group", "GPU")), [int(result["entity_id"])]
    if "cpu_id" in result:  # DCGM 3.x's CPU EUD results
        return "CPU", [int(result["cpu_id"])]
    raw = result.get("gpu_ids", result.get("gpu_id"))
    if raw is None or raw == "":
        return "", [None]
    return "GPU", [int(part) for part in str(raw).split(",") if part.strip()]


def _document(text: str) -> Mapping[str, Any]:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON document in dcgmi's output")
    doc = json.loads(text[start : end + 1])
    if not isinstance(doc, Mapping):
        raise ValueError("dcgmi's JSON is not an object")
    return doc


def parse_dcgmi_diag(text: str) -> DcgmDiag:
    """`dcgmi diag -j` output (DCGM 3.x or 4.x) -> DcgmDiag. Raises ValueError when the
    output holds no diagnostic document."""
    doc = _document(text)
    body = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))
    if not isinstance(body, Mapping):
        raise ValueError("no 'DCGM Diagnostic' object in dcgmi's JSON")
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    version = metadata.get("version", body.get("version", doc.get("version")))
    driver = metadata.get(
        "Driver Version Detected",
        body.get("Driver Version Detected", doc.get("Driver Version Detected")),
    )
    results: list[DcgmResult] = []
    for category in body.get("test_categories") or []:
        cat_name = str(category.get("category", ""))
        for test in category.get("tests") or []:
            name = str(test.get("name", ""))
            entries = test.get("results") or []
            if not entries and isinstance(test.get("test_summary"), Mapping):
                entries = [test["test_summary"]]  # a test that judged the node, not a GPU
            for entry in entries:
                group, ids = _entity_ids(entry)
                for entity in ids:
                    results.append(
                        DcgmResult(
                            cat_name,
                            name,
                            group,
                            entity,
                            str(entry.get("status", "")).strip().lower(),
                            _texts(entry.get("warnings"), "warning"),
                            _texts(entry.get("info"), "info"),
                        )
                    )
    devices: dict[int, str] = {}
    for group in doc.get("entity_groups") or []:
        if group.get("entity_group") == "GPU":
            for entity in group.get("entities") or []:
                devices[int(entity["entity_id"])] = str(entity.get("device_id", ""))
    runtime_error = body.get("runtime_error")
    return DcgmDiag(
        None if version is None else str(version),
        None if driver is None else str(driver),
        tuple(results),
        None if runtime_error is None else str(runtime_error),
        devices,
    )


@register(
    name=NAME,
    tiers=(Tier.DEEP,),
    interval=86400,
    timeout=3600,
    needs=("host", "commands"),
    faults={
        "gpu.dcgm.diag": Fault(
            (Status.WARN, Status.CRITICAL),
            "a DCGM diag test failed (CRITICAL) or warned (WARN)",
            "drain",
        ),
        "check.read_error": Fault(
            Status.UNKNOWN, "DCGM reported a test status Medic does not know"
        ),
        "check.command_failed": Fault(
            Status.UNKNOWN, "the tool failed, timed out or printed nothing parseable"
        ),
    },
)
class DeepDcgmCheck(Check[DeepDcgmObservation, DeepDcgmConfig]):
    """DCGM diagnostics (dcgmi diag -r <level> -j): failing and warning tests per GPU."""

    config_type = DeepDcgmConfig

    def gather(self, ctx: CheckContext, cfg: DeepDcgmConfig) -> DeepDcgmObservation:
        tool = find_tool((TOOL,), cfg.search_dirs)
        if tool is None:
            return DeepDcgmObservation(None, level=cfg.level)
        run = ctx.commands([tool, "diag", "-r", str(cfg.level), "-j"], timeout=cfg.command_timeout)
        if run.timed_out or run.start_error:
            return DeepDcgmObservation(tool, run, level=cfg.level)
        try:
            return DeepDcgmObservation(tool, run, parse_dcgmi_diag(run.stdout), level=cfg.level)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return DeepDcgmObservation(tool, run, parse_error=str(exc), level=cfg.level)

    @staticmethod
    def evaluate(observation: DeepDcgmObservation, cfg: DeepDcgmConfig) -> list[Result]:
        if observation.tool is None:
            return [tool_absent(NAME, TOOL, cfg.search_dirs)]
        diag = observation.diag
        what = f"dcgmi diag -r {observation.level}"
        if diag is None:
            return [command_failed(NAME, what, observation.run, observation.parse_error)]
        if diag.runtime_error:
            return [command_failed(NAME, what, observation.run, diag.runtime_error)]
        ignored = {name.lower() for name in cfg.ignore_tests}
        judged = [r for r in diag.results if r.test.lower() not in ignored]
        if not judged:
            return [command_failed(NAME, what, observation.run, "the diagnostic reported no tests")]
        base = {
            "level": observation.level,
            "dcgm_version": diag.version,
            "driver_version": diag.driver_version,
            **run_evidence(observation.run),
        }
        by_target: dict[str | None, list[DcgmResult]] = {}
        for result in judged:
            by_target.setdefault(result.target, []).append(result)
        results: list[Result] = []
        for target, found in sorted(by_target.items(), key=lambda kv: _order(kv[0])):
            results.extend(_judge_target(target, found, observation.level, base))
        return results


def _order(target: str | None) -> tuple[int, int, str]:
    if target is None:
        return (0, 0, "")
    return (1, int(target), "") if target.isdigit() else (2, 0, target)


def _describe(results: list[DcgmResult]) -> str:
    parts = []
    for r in results:
        first = r.warnings[0] if r.warnings else ""
        parts.append(f"{r.test} ({first})" if first else r.test)
    return "; ".join(parts)


def _judge_target(
    target: str | None, found: list[DcgmResult], level: int, base: Mapping[str, Any]
) -> Iterator[Result]:
    who = "node" if target is None else (f"GPU {target}" if target.isdigit() else target)
    by_status: dict[str, list[DcgmResult]] = {}
    for r in found:
        by_status.setdefault(r.status if r.status in KNOWN_STATUSES else "?", []).append(r)
    evidence = {
        **base,
        "tests": {r.test: r.status for r in found},
        "failed": [r.test for r in by_status.get(FAIL, [])],
        "warned": [r.test for r in by_status.get(WARN, [])],
        "skipped": [r.test for r in by_status.get(SKIP, []) + by_status.get(NOT_RUN, [])],
        "warnings": {r.test: list(r.warnings) for r in found if r.warnings},
    }
    if FAIL in by_status:
        yield deep_fault(
            NAME,
            Status.CRITICAL,
            FAULT,
            f"{who}: DCGM diag level {level} failed: {_describe(by_status[FAIL])}",
            target=target,
            evidence=evidence,
        )
    if "?" in by_status:
        words = sorted({r.status or "<empty>" for r in by_status["?"]})
        yield fault(
            NAME,
            Status.UNKNOWN,
            "check.read_error",
            f"{who}: DCGM reported status {', '.join(words)} for "
            f"{', '.join(r.test for r in by_status['?'])}",
            target=target,
            evidence=evidence,
        )
    if WARN in by_status:
        yield deep_fault(
            NAME,
            Status.WARN,
            FAULT,
            f"{who}: DCGM diag level {level} warned: {_describe(by_status[WARN])}",
            target=target,
            evidence=evidence,
        )
    if not ({FAIL, WARN, "?"} & by_status.keys()):
        passed = len(by_status.get(PASS, []))
        skipped = len(evidence["skipped"])
        note = f", {skipped} skipped" if skipped else ""
        yield ok(
            NAME,
            f"{who}: DCGM diag level {level}: {passed} tests passed{note}",
            target=target,
            evidence=evidence,
        )

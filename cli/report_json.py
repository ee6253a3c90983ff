"""`medic report --json` (and `what-if --json`): the report's dataclasses, datetimes and
tuples as plain JSON values, written on one line."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from remediation import report as rp

REPORT_FORMAT = 1


def plain(value: Any) -> Any:
    """Dataclasses, datetimes and tuples as JSON values (the common cases first: a fleet's
    report is 200,000 values)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):  # milliseconds for durations; rates keep 6 digits
        return round(value, 3) if abs(value) >= 1 else float(f"{value:.6g}")
    if isinstance(value, dt.datetime):
        precision = "microseconds" if value.microsecond else "seconds"
        return value.astimezone(dt.UTC).isoformat(timespec=precision).replace("+00:00", "Z")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: plain(v) for name, v in vars(value).items()}
    raise TypeError(f"{type(value).__name__} is not a report value")


def report_json(report: rp.Report, top: int | None) -> dict[str, Any]:
    body = plain(report)
    assert isinstance(body, dict)
    fleet = body["fleet"]
    if top is not None:
        fleet["by_node_total"] = len(fleet["by_node"])
        fleet["by_node"] = fleet["by_node"][:top]
    return {"format": REPORT_FORMAT, **body}


def report_text(report: rp.Report, top: int | None, would: Sequence[Any] = ()) -> str:
    """The JSON on one line: json's C encoder writes no indentation, and a fleet's report
    runs to megabytes (4 MB for 6,000 interruptions: 0.4 s, against 1.9 s indented)."""
    body = {**report_json(report, top), "would_have_done": plain(list(would))}
    return json.dumps(body, separators=(",", ":"))

"""`medic report what-if`'s options, parsed: rates, durations, measured figures and the
reload time per checkpoint tier (remediation.whatif has the arithmetic)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from cli.common import EXIT_USAGE, AdminError
from remediation import report as rp
from remediation import whatif as wi

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(%?)\s*$", re.IGNORECASE)
_SPAN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d)?\s*$", re.IGNORECASE)
_SPAN_HOURS = {"s": 1 / 3600, "m": 1 / 60, "min": 1 / 60, "h": 1.0, "d": 24.0}


def parse_rate(text: str) -> float:
    match = _RATE.match(text)
    if not match:
        raise AdminError(
            f"--failure-rate {text!r}: expected failures per node-hour, as 0.0005 or 0.05%",
            code=EXIT_USAGE,
        )
    value = float(match.group(1)) / (100 if match.group(2) else 1)
    if value >= 1:
        raise AdminError(
            f"--failure-rate {text!r}: a rate per node-hour must be below 1"
            " (write 0.05% or 0.0005)",
            code=EXIT_USAGE,
        )
    return value


def parse_hours(option: str, text: str, default_unit: str = "m") -> float:
    match = _SPAN.match(text)
    if not match:
        raise AdminError(
            f"{option} {text!r}: expected a duration such as 40m, 4.5h, 90s or 2d", code=EXIT_USAGE
        )
    unit = (match.group(2) or default_unit).lower()
    return float(match.group(1)) * _SPAN_HOURS[unit]


MEASURED = "measured"


def measured_rate(found: rp.Report) -> float:
    if not found.fleet.episodes:
        raise AdminError(
            "--failure-rate measured: no episode in the window to measure a rate from",
            code=EXIT_USAGE,
        )
    return found.fleet.failure_rate_per_node_hour


def measured_mttr(found: rp.Report) -> float:
    """Hours: the mean outage of the recovered interruptions plus their mean lost work (the
    model without --checkpoint-every counts lost work inside the MTTR)."""
    if found.mttr_s is None:
        raise AdminError(
            "--mttr measured: no recovered interruption in the window to measure it from",
            code=EXIT_USAGE,
        )
    lost = found.components["lost_work"].mean_s or 0.0
    return (found.mttr_s + lost) / 3600


def parse_reloads(texts: Sequence[str], local_share: float | None) -> wi.Reloads | None:
    """`--reload TIER=DURATION` (repeatable) and `--local-share`: None without --reload."""
    if not texts:
        if local_share is not None:
            raise AdminError("--local-share needs --reload local=... too", code=EXIT_USAGE)
        return None
    hours: dict[str, float] = {}
    for text in texts:
        tier, sep, span = text.partition("=")
        tier = tier.strip().lower()
        if not sep or tier not in wi.RELOAD_TIERS:
            raise AdminError(
                f"--reload {text!r}: expected TIER=DURATION, TIER one of"
                f" {', '.join(wi.RELOAD_TIERS)} (local=20s, durable=25m)",
                code=EXIT_USAGE,
            )
        hours[tier] = parse_hours("--reload", span, "s")
    try:
        return wi.Reloads.of(hours, local_share)
    except ValueError as exc:
        raise AdminError(str(exc), code=EXIT_USAGE) from None

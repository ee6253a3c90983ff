"""host_trends: EDAC correctable and InfiniBand error counters from /sys below a host root,
in series kept across restarts; a rising one is a WARN reported only (no drain)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cli.trend_view import trend_lines
from healthd.checks import get
from healthd.checks.base import CheckContext, Recommendation, Status
from healthd.checks.host_trends import HostTrendsCheck, HostTrendsConfig, HostTrendsObservation
from medic_core.vocabulary import Finding

T0 = 1_800_000_000.0
CFG = HostTrendsConfig(window=600, min_span=120, min_points=4)


class StepClock:
    def __init__(self) -> None:
        self.t = T0

    def monotonic(self) -> float:
        return self.t

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.t, dt.UTC)


def host(root: Path, ce: tuple[int, int], symbol: int, downed: int = 0) -> None:
    for mc, value in zip(("mc0", "mc1"), ce, strict=True):
        d = root / "sys/devices/system/edac/mc" / mc
        d.mkdir(parents=True, exist_ok=True)
        (d / "ce_count").write_text(f"{value}\n")
    counters = root / "sys/class/infiniband/mlx5_0/ports/1/counters"
    counters.mkdir(parents=True, exist_ok=True)
    (counters / "symbol_error").write_text(f"{symbol}\n")
    (counters / "link_downed").write_text(f"{downed}\n")
    (counters / "link_error_recovery").write_text("0\n")


def test_a_rising_ib_counter_warns_reported_only_and_a_restart_keeps_the_series(
    tmp_path: Path,
) -> None:
    root, clock = tmp_path / "host", StepClock()
    ctx = CheckContext.for_root(root, clock=clock, state_dir=tmp_path / "state")
    spec = get("host_trends")
    check = spec.create()
    statuses = []
    for step, symbol in enumerate([0, 0, 10, 30, 70, 150]):
        host(root, (5, 7), symbol)
        if step == 3:
            check = spec.create()  # the daemon restarted: the saved series come back
        results = check.evaluate(check.gather(ctx, CFG), CFG)
        by_target = {r.target: r for r in results}
        assert set(by_target) == {"edac", "mlx5_0/1"}
        assert by_target["edac"].status is Status.OK  # 12 correctable, constant
        statuses.append(by_target["mlx5_0/1"].status)
        clock.t += 60
    assert statuses == [Status.OK] * 3 + [Status.WARN] * 3
    warn = by_target["mlx5_0/1"]
    assert warn.fault_class == "ib.trend.symbol_error"
    assert warn.message.startswith("mlx5_0/1: IB symbol errors rising")
    assert warn.remediation is Recommendation.NONE
    assert Finding.from_json({**_json(warn)}).recommendation is Recommendation.NONE
    assert [v for _, v in warn.evidence["series"]["symbol_error"]] == [0, 0, 10, 30, 70, 150]
    lines = trend_lines([_row(r) for r in results])
    assert lines == ["  mlx5_0/1  IB symbol errors: 0 0 10 30 70 150 (1800/h)  RISING"]


def test_an_edac_reset_is_not_a_spike_and_no_counters_is_not_applicable(tmp_path: Path) -> None:
    root, clock = tmp_path / "host", StepClock()
    ctx = CheckContext.for_root(root, clock=clock)
    check = HostTrendsCheck()
    for ce in [(5000, 5000), (5000, 5000), (0, 0), (0, 1), (0, 1), (0, 1)]:  # a reboot
        host(root, ce, 0)
        results = check.evaluate(check.gather(ctx, CFG), CFG)
        clock.t += 60
    assert {r.target: r.status for r in results} == {"edac": Status.OK, "mlx5_0/1": Status.OK}
    empty = HostTrendsCheck.evaluate(HostTrendsObservation({}, T0), CFG)
    assert [r.status for r in empty] == [Status.NOT_APPLICABLE]
    (root / "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text("junk\n")
    observed = HostTrendsCheck().gather(ctx, CFG)
    assert any("symbol_error" in f for f in observed.unreadable)
    assert "symbol_error" not in observed.series["mlx5_0/1"]


def _json(r: object) -> dict[str, object]:
    from healthd.results import result_json

    return dict(result_json(r))  # type: ignore[arg-type]


class _Row:
    def __init__(self, type_: str, target: str, evidence: dict[str, object]) -> None:
        self.type, self.target, self.evidence = type_, target, evidence


def _row(r: object) -> _Row:
    return _Row(r.check, r.target, dict(r.evidence))  # type: ignore[attr-defined]

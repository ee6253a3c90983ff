"""The memory check: MemTotal against expectation, EDAC UE and CE rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.checks.base import CheckContext, Result, Status
from healthd.checks.memory import (
    EdacCounts,
    MemoryCheck,
    MemoryConfig,
    MemoryObservation,
    parse_memtotal_kib,
)
from healthd.fixtures import meminfo_text, write_host_tree
from tests.fakes import FakeClock

EDAC = Path("sys/devices/system/edac/mc")
FIXTURE_KIB = 2113561600


def summary(results: list[Result]) -> list[tuple[Status, str | None, str | None]]:
    return [(r.status, r.fault_class, r.target) for r in results]


@pytest.fixture
def host(tmp_path: Path) -> Path:
    write_host_tree(tmp_path)
    return tmp_path


def test_parse_meminfo_from_the_fixture() -> None:
    assert parse_memtotal_kib(meminfo_text()) == FIXTURE_KIB
    assert parse_memtotal_kib("MemFree: 1 kB\n") is None


@pytest.mark.parametrize(
    ("expected_gib", "status"),
    [(None, Status.OK), (2048, Status.OK), (2100, Status.CRITICAL), (1024, Status.OK)],
)
def test_memtotal_against_expected(expected_gib: float | None, status: Status) -> None:
    obs = MemoryObservation(FIXTURE_KIB, None, 0.0)
    (result,) = MemoryCheck.evaluate(obs, MemoryConfig(expected_gib=expected_gib))
    assert result.status is status
    if status is Status.CRITICAL:
        assert result.fault_class == "mem.total.low"
        assert result.evidence["memtotal_gib"] == pytest.approx(2015.6, abs=0.1)


def test_uncorrected_errors_are_critical_rma() -> None:
    obs = MemoryObservation(FIXTURE_KIB, {"mc0": EdacCounts(0, 0), "mc2": EdacCounts(3, 1)}, 0.0)
    results = MemoryCheck.evaluate(obs, MemoryConfig())
    assert summary(results)[1:] == [(Status.CRITICAL, "mem.edac.ue", "mc2")]
    assert results[1].remediation == "rma"


def test_corrected_error_rate() -> None:
    before = {"mc0": EdacCounts(10, 0), "mc1": EdacCounts(0, 0)}
    now = {"mc0": EdacCounts(70, 0), "mc1": EdacCounts(10, 0)}
    obs = MemoryObservation(FIXTURE_KIB, now, 1800.0, before, 0.0)  # half an hour
    results = MemoryCheck.evaluate(obs, MemoryConfig(ce_per_hour=100))
    assert summary(results)[1:] == [(Status.WARN, "mem.edac.ce_rate", "mc0")]
    assert results[1].evidence["per_hour"] == 120.0


def test_gather_reads_the_tree_and_tracks_ce_between_runs(host: Path) -> None:
    clock = FakeClock()
    ctx = CheckContext.for_root(host, clock=clock.checks)
    cfg = MemoryConfig(expected_gib=2048, ce_per_hour=10)
    check = MemoryCheck()
    first = check.gather(ctx, cfg)
    assert first.memtotal_kib == FIXTURE_KIB and set(first.edac or {}) == {
        f"mc{i}" for i in range(4)
    }
    assert summary(MemoryCheck.evaluate(first, cfg)) == [(Status.OK, None, None)]

    (host / EDAC / "mc1/ce_count").write_text("40\n")
    clock.advance(3600)
    second = MemoryCheck.evaluate(check.gather(ctx, cfg), cfg)
    assert summary(second) == [(Status.OK, None, None), (Status.WARN, "mem.edac.ce_rate", "mc1")]

    (host / EDAC / "mc3/ue_count").write_text("1\n")
    (host / "proc/meminfo").write_text(meminfo_text(1056780800))  # half the DIMMs gone
    clock.advance(3600)
    third = MemoryCheck.evaluate(check.gather(ctx, cfg), cfg)
    assert summary(third) == [
        (Status.CRITICAL, "mem.total.low", None),
        (Status.CRITICAL, "mem.edac.ue", "mc3"),
    ]


def test_no_edac_is_fine(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text(meminfo_text())
    obs = MemoryCheck().gather(CheckContext.for_root(tmp_path), MemoryConfig())
    assert obs.edac is None
    assert MemoryCheck.evaluate(obs, MemoryConfig())[0].status is Status.OK

"""The cpus check."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.checks.base import CheckContext, Status
from healthd.checks.cpus import CpusCheck, CpusConfig, CpusObservation
from healthd.fixtures import write_host_tree
from healthd.hostfs import format_range_list, parse_range_list

CPU = Path("sys/devices/system/cpu")


def test_range_lists() -> None:
    assert parse_range_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_range_list("") == frozenset()
    assert format_range_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    with pytest.raises(ValueError):
        parse_range_list("5-2")


def test_all_online_is_ok() -> None:
    (result,) = CpusCheck.evaluate(
        CpusObservation("0-111", "0-111"), CpusConfig(expected_count=112)
    )
    assert result.status is Status.OK and result.message == "112 CPUs online"


def test_offline_cpus_are_critical() -> None:
    (result,) = CpusCheck.evaluate(CpusObservation("0-55,57-111", "0-111"), CpusConfig())
    assert (result.status, result.fault_class) == (Status.CRITICAL, "cpu.offline")
    assert result.evidence["offline"] == "56" and result.remediation == "reboot"
    relaxed = CpusConfig(require_all_online=False)
    assert CpusCheck.evaluate(CpusObservation("0-55", "0-111"), relaxed)[0].status is Status.OK


def test_wrong_count() -> None:
    (result,) = CpusCheck.evaluate(CpusObservation("0-95", "0-95"), CpusConfig(expected_count=112))
    assert (result.status, result.fault_class) == (Status.CRITICAL, "cpu.count")


def test_missing_files_are_unknown() -> None:
    (result,) = CpusCheck.evaluate(CpusObservation(None, "0-3"), CpusConfig())
    assert result.status is Status.UNKNOWN


def test_gather_on_the_tree(tmp_path: Path) -> None:
    write_host_tree(tmp_path)
    ctx, cfg = CheckContext.for_root(tmp_path), CpusConfig(expected_count=112)
    assert CpusCheck.evaluate(CpusCheck().gather(ctx, cfg), cfg)[0].status is Status.OK
    (tmp_path / CPU / "online").write_text("0-63,65-111\n")
    results = CpusCheck.evaluate(CpusCheck().gather(ctx, cfg), cfg)
    assert [r.fault_class for r in results] == ["cpu.offline", "cpu.count"]

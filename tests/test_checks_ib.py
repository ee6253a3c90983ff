"""The InfiniBand check: pure evaluate on observations, gather on fixture trees."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from healthd.checks.base import CheckContext, Result, Status
from healthd.checks.ib import IbCheck, IbConfig, IbObservation, IbPort, parse_rate_gbps
from healthd.fixtures import write_host_tree

IB = Path("sys/class/infiniband")
EXPECT = IbConfig(expected_ports=8, min_rate_gbps=400)


def port(hca: str = "mlx5_0", **changes: object) -> IbPort:
    healthy = IbPort(
        hca, 1, "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand", {"symbol_error": 0}
    )
    return replace(healthy, **changes)  # type: ignore[arg-type]


def statuses(results: list[Result]) -> list[tuple[Status, str | None, str | None]]:
    return [(r.status, r.fault_class, r.target) for r in results]


@pytest.fixture
def host(tmp_path: Path) -> Path:
    write_host_tree(tmp_path)
    return tmp_path


def run(check: IbCheck, root: Path, cfg: IbConfig = EXPECT) -> list[Result]:
    return IbCheck.evaluate(check.gather(CheckContext.for_root(root), cfg), cfg)


# --- evaluate (pure) ---


def test_healthy_port_is_ok() -> None:
    results = IbCheck.evaluate(IbObservation(True, (port(),)), IbConfig(min_rate_gbps=400))
    assert statuses(results) == [(Status.OK, None, "mlx5_0/1")]


@pytest.mark.parametrize(
    ("state", "phys"),
    [("1: DOWN", "3: Disabled"), ("2: INIT", "5: LinkUp"), ("4: ACTIVE", "2: Polling")],
)
def test_port_not_active_or_not_linkup_is_down(state: str, phys: str) -> None:
    obs = IbObservation(True, (port(state=state, phys_state=phys, rate="10 Gb/sec (4X SDR)"),))
    (result,) = IbCheck.evaluate(obs, IbConfig(min_rate_gbps=400))
    assert (result.status, result.fault_class) == (Status.CRITICAL, "ib.port.down")
    assert result.remediation == "recheck" and result.evidence["state"] == state
    assert (result.target, result.evidence["hca"], result.evidence["port"]) == (
        "mlx5_0/1",
        "mlx5_0",
        1,
    )
    assert result.message.startswith("HCA mlx5_0 port 1 is ")


def test_degraded_rate() -> None:
    obs = IbObservation(True, (port(rate="200 Gb/sec (2X NDR)"),))
    (result,) = IbCheck.evaluate(obs, IbConfig(min_rate_gbps=400))
    assert (result.status, result.fault_class) == (Status.CRITICAL, "ib.port.rate")
    assert result.evidence["rate_gbps"] == 200.0
    assert IbCheck.evaluate(obs, IbConfig())[0].status is Status.OK  # no rate expected


def test_missing_ports_against_expected_count() -> None:
    obs = IbObservation(True, tuple(port(f"mlx5_{i}") for i in range(7)))
    results = IbCheck.evaluate(obs, EXPECT)
    assert statuses(results)[0] == (Status.CRITICAL, "ib.port.missing", None)
    assert len(results) == 8


def test_counter_growth_over_the_limit_warns() -> None:
    now = port(counters={"symbol_error": 120, "link_downed": 3, "port_rcv_errors": 4})
    previous = {"mlx5_0/1": {"symbol_error": 100, "link_downed": 2, "port_rcv_errors": 0}}
    results = IbCheck.evaluate(IbObservation(True, (now,), previous), IbConfig())
    assert statuses(results) == [
        (Status.WARN, "ib.errors.link_downed", "mlx5_0/1"),
        (Status.WARN, "ib.errors.symbol", "mlx5_0/1"),
    ]
    assert results[1].evidence == {
        "counter": "symbol_error",
        "before": 100,
        "now": 120,
        "limit": 10,
    }


def test_counter_reset_and_first_run_are_not_errors() -> None:
    now = port(counters={"symbol_error": 5})
    reset = IbObservation(True, (now,), {"mlx5_0/1": {"symbol_error": 500}})
    assert IbCheck.evaluate(reset, IbConfig())[0].status is Status.OK
    first = IbObservation(True, (port(counters={"symbol_error": 10**6}),), None)
    assert IbCheck.evaluate(first, IbConfig())[0].status is Status.OK


def test_absent_infiniband_is_not_applicable_unless_ports_expected() -> None:
    absent = IbObservation(False, ())
    assert IbCheck.evaluate(absent, IbConfig())[0].status is Status.NOT_APPLICABLE
    assert IbCheck.evaluate(absent, IbConfig(expected_ports=0))[0].status is Status.NOT_APPLICABLE
    (result,) = IbCheck.evaluate(absent, EXPECT)
    assert (result.status, result.fault_class) == (Status.CRITICAL, "ib.port.missing")


def test_ethernet_ports_are_skipped_by_default() -> None:
    eth = port("mlx5_8", link_layer="Ethernet", rate="100 Gb/sec (2X HDR)")
    results = IbCheck.evaluate(IbObservation(True, (port(), eth)), IbConfig(min_rate_gbps=400))
    assert [r.target for r in results] == ["mlx5_0/1"]


def test_unreadable_attributes_are_unknown_not_a_verdict() -> None:
    obs = IbObservation(True, (port(state=None, read_errors={"state": "EIO"}),))
    (result,) = IbCheck.evaluate(obs, IbConfig())
    assert result.status is Status.UNKNOWN and result.fault_class == "check.read_error"


def test_parse_rate() -> None:
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate_gbps("garbage") is None and parse_rate_gbps(None) is None


# --- gather on fixture trees ---


def test_fixture_tree_is_healthy(host: Path) -> None:
    results = run(IbCheck(), host)
    assert [r.status for r in results] == [Status.OK] * 8
    assert [r.target for r in results] == [f"mlx5_{i}/1" for i in range(8)]


def test_down_port_in_the_tree(host: Path) -> None:
    (host / IB / "mlx5_3/ports/1/state").write_text("1: DOWN\n")
    (host / IB / "mlx5_3/ports/1/phys_state").write_text("3: Disabled\n")
    bad = [r for r in run(IbCheck(), host) if r.status is not Status.OK]
    assert statuses(bad) == [(Status.CRITICAL, "ib.port.down", "mlx5_3/1")]


def test_down_port_names_the_hca_port_and_node_guid(host: Path) -> None:
    """The exact sysfs formats: state/phys_state "N: NAME", rate "N Gb/sec (..)", node_guid
    four groups of four hex digits; the ticket and the human read them from the finding."""
    (host / IB / "mlx5_3/ports/1/state").write_text("1: DOWN\n")
    (host / IB / "mlx5_3/ports/1/phys_state").write_text("2: Polling\n")
    (host / IB / "mlx5_3/ports/1/rate").write_text("10 Gb/sec (4X SDR)\n")
    (host / IB / "mlx5_3/node_guid").write_text("b8ce:f603:00a1:2f3c\n")
    [down] = [r for r in run(IbCheck(), host) if r.status is not Status.OK]
    assert down.target == "mlx5_3/1"
    assert down.remediation == "recheck"
    assert {k: down.evidence[k] for k in ("hca", "port", "node_guid")} == {
        "hca": "mlx5_3",
        "port": 1,
        "node_guid": "b8ce:f603:00a1:2f3c",
    }
    assert (down.evidence["state"], down.evidence["phys_state"], down.evidence["rate"]) == (
        "1: DOWN",
        "2: Polling",
        "10 Gb/sec (4X SDR)",
    )
    assert "HCA mlx5_3 port 1, node GUID b8ce:f603:00a1:2f3c is 1: DOWN / 2: Polling" in (
        down.message
    )


def test_unreadable_node_guid_is_left_out_not_an_error(host: Path) -> None:
    (host / IB / "mlx5_3/ports/1/state").write_text("1: DOWN\n")
    guid = host / IB / "mlx5_3/node_guid"
    guid.unlink(missing_ok=True)
    guid.mkdir()  # reading it raises IsADirectoryError
    [down] = [r for r in run(IbCheck(), host) if r.status is not Status.OK]
    assert (down.fault_class, down.evidence["node_guid"]) == ("ib.port.down", None)


def test_removed_hca_and_degraded_rate_in_the_tree(host: Path) -> None:
    shutil.rmtree(host / IB / "mlx5_7")
    (host / IB / "mlx5_1/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    bad = [r for r in run(IbCheck(), host) if r.status is not Status.OK]
    assert statuses(bad) == [
        (Status.CRITICAL, "ib.port.missing", None),
        (Status.CRITICAL, "ib.port.rate", "mlx5_1/1"),
    ]


def test_counter_deltas_between_runs_in_the_tree(host: Path) -> None:
    check = IbCheck()
    assert all(r.status is Status.OK for r in run(check, host))
    (host / IB / "mlx5_2/ports/1/counters/symbol_error").write_text("57\n")
    bad = [r for r in run(check, host) if r.status is not Status.OK]
    assert statuses(bad) == [(Status.WARN, "ib.errors.symbol", "mlx5_2/1")]
    # No further growth: healthy again.
    assert all(r.status is Status.OK for r in run(check, host))


def test_no_infiniband_directory(tmp_path: Path) -> None:
    assert run(IbCheck(), tmp_path, IbConfig())[0].status is Status.NOT_APPLICABLE

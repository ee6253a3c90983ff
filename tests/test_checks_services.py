"""The services check."""

from __future__ import annotations

import shutil
from pathlib import Path

from healthd.checks.base import CheckContext, Result, Status
from healthd.checks.services import ServicesCheck, ServicesConfig, ServicesObservation
from healthd.fixtures import write_host_tree, write_process


def run(root: Path, cfg: ServicesConfig) -> list[Result]:
    return ServicesCheck.evaluate(ServicesCheck().gather(CheckContext.for_root(root), cfg), cfg)


def test_defaults_on_the_tree(tmp_path: Path) -> None:
    write_host_tree(tmp_path)
    results = run(tmp_path, ServicesConfig())
    assert [(r.status, r.target) for r in results] == [
        (Status.OK, "munged"),
        (Status.OK, "nvidia-persistenced"),  # found by its 15-character comm
    ]
    assert results[1].evidence["pids"] == [1002]


def test_missing_zombie_and_fabricmanager(tmp_path: Path) -> None:
    write_host_tree(tmp_path)
    shutil.rmtree(tmp_path / "proc/1001")
    write_process(tmp_path, 1002, "nvidia-persistenced", state="Z")
    results = run(tmp_path, ServicesConfig(fabricmanager=True))
    assert [(r.status, r.fault_class, r.target) for r in results] == [
        (Status.CRITICAL, "service.down", "munged"),
        (Status.CRITICAL, "service.down", "nvidia-persistenced"),
        (Status.CRITICAL, "service.down", "nv-fabricmanager"),
    ]
    assert results[0].remediation == "restart_service"
    write_process(tmp_path, 2001, "nv-fabricmanager")
    assert run(tmp_path, ServicesConfig(required=(), fabricmanager=True))[0].status is Status.OK


def test_nothing_required_is_not_applicable() -> None:
    (result,) = ServicesCheck.evaluate(ServicesObservation({}), ServicesConfig(required=()))
    assert result.status is Status.NOT_APPLICABLE


def test_down_service_names_its_systemd_unit(tmp_path: Path) -> None:
    """munged runs as munge.service: the finding names the unit a restart (or a human)
    must act on, and a configured unit replaces the default."""
    write_host_tree(tmp_path)
    shutil.rmtree(tmp_path / "proc/1001")
    write_process(tmp_path, 1002, "nvidia-persistenced", state="Z")
    cfg = ServicesConfig(required=("munged", "nvidia-persistenced", "nv-hostengine"))
    down = [r for r in run(tmp_path, cfg) if r.status is Status.CRITICAL]
    assert [(r.target, r.evidence["unit"]) for r in down] == [
        ("munged", "munge.service"),
        ("nvidia-persistenced", "nvidia-persistenced.service"),
        ("nv-hostengine", "nv-hostengine.service"),
    ]
    assert down[0].message == "munged is not running (unit munge.service)"
    custom = ServicesConfig(units={"munged": "munge-site.service"})
    assert custom.unit("munged") == "munge-site.service"
    assert custom.unit("nvidia-persistenced") == "nvidia-persistenced.service"


def test_a_unit_that_is_not_a_service_is_refused() -> None:
    problems = list(ServicesConfig(units={"munged": "../../bin/sh"}).problems())
    assert [p[0] for p in problems] == ["units.munged"]

"""Shared fixtures. The lab is a real Slurm cluster (munged, slurmctld, one slurmd per node)
started once per test session and reset before each test that uses it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab, slack
from cli.lab.slurm_conf import LabSpec


def poll(what: str, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for `predicate` with a deadline (tests never sleep a fixed time), stretched by
    MEDIC_LAB_SLACK (cli.lab.cluster.slack): a deadline is liveness, not speed."""
    timeout *= slack()
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs the lab (the `lab_session` fixture, however indirectly) is
    marked `lab`, so `pytest -m "not lab"` is the fast tier without a test naming itself."""
    for item in items:
        if "lab_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def lab_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("the lab tests run munged, slurmctld and slurmd: run them as root")
    lab = Lab(tmp_path_factory.mktemp("lab"))
    # MEDIC_LAB_SLURM=24.11 runs the lab tests on that release (cli/lab/debian_root.py).
    release = os.environ.get("MEDIC_LAB_SLURM", LabSpec.slurm)
    lab.up(LabSpec(slurm=release))  # each test worker (pytest-xdist) runs a lab of its own
    if release != LabSpec.slurm:  # a test's own CliSlurm takes the release's scontrol too
        os.environ["MEDIC_SLURM_BIN"] = str(lab.layout.slurm_bin)
    try:
        yield lab
    finally:
        lab.down()
        if release != LabSpec.slurm:
            os.environ.pop("MEDIC_SLURM_BIN", None)


@pytest.fixture
def lab(lab_session: Lab) -> Lab:
    lab_session.reset()
    return lab_session


@pytest.fixture
def probes() -> Path:
    return Path(__file__).parent / "probes"

"""Shared fixtures. The lab is a real Slurm cluster (munged, slurmctld, one slurmd per node)
started once per test session and reset before each test that uses it."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from cli.lab.cluster import Lab, slack
from cli.lab.slurm_conf import LabSpec

# Compiled modules are cached (in __pycache__, which git ignores) even where the environment
# asks Python not to write them (PYTHONDONTWRITEBYTECODE=1 on these machines): else every
# test worker rewrote the asserts of all 176 test modules (11 s of CPU each) and every
# `medic` or hook process a test starts compiled Medic's modules afresh.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# MEDIC_MODEL_PROFILE: how many examples the property and model tests run. "ci" (scripts/test,
# so CI) runs each as written; "dev", a plain `pytest`, a twentieth (at least 10), for the
# local loop; "thorough" as written too, and the fleet model test 10,000 per class with a
# fresh seed (tests/test_decide_model.py).
MODEL_PROFILE = os.environ.get("MEDIC_MODEL_PROFILE", "dev")
DEV_SHARE = 20
DEV_FLOOR = 10


def dev_examples(written: int) -> int:
    return min(written, max(DEV_FLOOR, math.ceil(written / DEV_SHARE)))


# The collected tests are scaled by scale_to_the_profile; the profile's default is for a
# Hypothesis run no collected item carries (a @given function defined inside a test).
settings.register_profile("dev", max_examples=dev_examples(settings.default.max_examples))
if MODEL_PROFILE == "dev":
    settings.load_profile("dev")


def race_rounds(written: int) -> int:
    """Rounds of a test that repeats a race between real processes: one in the dev profile."""
    return 1 if MODEL_PROFILE == "dev" else written


_SCALED: set[int] = set()


def scale_to_the_profile(item: pytest.Item) -> None:
    """In the dev profile, a property test (@given) or a state machine's TestCase runs
    dev_examples of the examples its own settings ask for (each once: the parametrized cases
    of one test share its function)."""
    holder: object = getattr(item, "cls", None)
    attribute = "settings"
    if not isinstance(getattr(holder, attribute, None), settings):
        holder, attribute = getattr(item, "obj", None), "_hypothesis_internal_use_settings"
    written = getattr(holder, attribute, None)
    if not isinstance(written, settings) or id(holder) in _SCALED:
        return
    setattr(holder, attribute, settings(written, max_examples=dev_examples(written.max_examples)))
    _SCALED.add(id(holder))


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
        if MODEL_PROFILE == "dev":
            scale_to_the_profile(item)


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

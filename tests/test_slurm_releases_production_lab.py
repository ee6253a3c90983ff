"""The fault matrix in production mode on Slurm 24.11 and 26.05 (issue 24): each node's
medic-healthd in the shipped unit's sandbox with a store of its own (cli/lab/production.py),
inside the release's Debian root. One row, the one that climbs every rung: a GPU whose every
repair fails (two GPU resets, a driver reload, a reboot through Slurm's RebootProgram, then
RMA), tests/test_production_lab.py's own body. Medic runs there from the source tree on the
root's Python (3.13), not from the wheel: the wheel's venv is the host's Python 3.11."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from cli.lab.production import can_sandbox
from cli.lab.slurm_conf import LabSpec
from medic_core.store import Store
from tests import test_production_lab as production_tests
from tests.test_production_lab import a_production_lab
from tests.test_production_lab import lab as lab  # the fixtures, on this module's lab
from tests.test_production_lab import n2_store as n2_store
from tests.test_remediation import MATRIX

RELEASES = ("24.11", "26.05")
pytestmark = [
    pytest.mark.lab,
    pytest.mark.releases,
    pytest.mark.skipif(bool(can_sandbox()), reason=can_sandbox() or "ok"),
]
ROW = "hardware_fault_everything_fails"


@pytest.fixture(scope="module", params=RELEASES)
def production_lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    spec = LabSpec(slurm=request.param)
    with a_production_lab("rprod-", spec) as lab, pytest.MonkeyPatch.context() as env:
        env.setenv("MEDIC_SLURM_BIN", str(lab.layout.slurm_bin))
        yield lab


def test_every_rung_fails_to_an_rma_in_production_mode(
    lab: Lab, n2_store: Store, tmp_path: Path
) -> None:
    [row] = [m[1:] for m in MATRIX if m[0] == ROW]
    production_tests.test_fault_matrix_in_production_mode(lab, n2_store, tmp_path, *row)
    assert not lab.layout.store_db.exists()  # no shared store in this mode

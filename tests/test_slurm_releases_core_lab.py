"""The end-to-end core on Slurm 24.11 (Debian 13's) and 26.05 (Debian sid's), issue 24: one
representative lab test per path, its own body (imported from its module, not copied), run
on a lab of each release (cli/lab/debian_root.py): the launch gate refusing a job on a sick
node, single-GPU isolation (the isolator tells the apply command the release's way: a
slurmctld restart on 22.05, `scontrol reconfigure` from 24.11; medic_core.slurm_release),
spares (the job's own FLEX/OVERLAP/PURGE_COMP reservation), burn-in without the daemon, and a
sweep. The fault matrix in production mode: tests/test_slurm_releases_production_lab.py.

The spares test runs its user's jobs as root here: an unprivileged user cannot enter the
Debian root (the lab's Slurm client wrappers use `unshare --root`); the reservation is then
`Users=root`, as Medic creates it for whoever owns the requeued job."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import SYSTEM_PATH, Lab
from cli.lab.slurm_conf import LabSpec
from medic_core.store import Store
from tests import test_burn_in_gate_lab as burn_in_tests
from tests import test_hooks as hook_tests
from tests import test_isolation_lab as isolation_tests
from tests import test_spares_lab as spares_tests
from tests import test_sweep as sweep_tests
from tests.test_burn_in_gate_lab import burn_in_on as burn_in_on  # the fixtures
from tests.test_hooks import store as store
from tests.test_isolation_lab import isolated_lab as isolated_lab
from tests.test_unprivileged_lab import Intruder

RELEASES = ("24.11", "26.05")
pytestmark = [pytest.mark.lab, pytest.mark.releases]


@pytest.fixture(scope="module", params=RELEASES)
def lab_session(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """This module's lab on each release (conftest's `lab` resets it before each test), below
    a short directory everyone may traverse (the spares test's job writes its home there)."""
    top = Path(tempfile.mkdtemp(prefix="rcore-", dir="/tmp"))
    top.chmod(0o711)
    lab = Lab(top / "lab")
    try:
        lab.up(LabSpec(slurm=request.param), timeout=60)
    except BaseException:
        shutil.rmtree(top, ignore_errors=True)
        raise
    # The test process's own CliSlurm must take the release's scontrol, not the host's 22.05.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MEDIC_SLURM_BIN", str(lab.layout.slurm_bin))
        try:
            yield lab
        finally:
            lab.down()
            shutil.rmtree(top, ignore_errors=True)


def test_the_launch_gate_refuses_a_job_on_a_sick_node(lab: Lab, store: Store) -> None:
    hook_tests.test_prolog_refuses_a_node_with_a_pre_existing_fault(lab, store)


def test_one_gpu_is_isolated_and_given_back_the_releases_way(
    isolated_lab: Lab, store: Store, tmp_path: Path
) -> None:
    controller = isolated_lab.state().slurmctld_pid
    isolation_tests.test_an_xid_on_gpu5_leaves_seven_gpus_schedulable(isolated_lab, store, tmp_path)
    # Out and back through `scontrol reconfigure` (medic_core.slurm_release): slurmctld
    # re-executed itself in place, never restarted.
    assert isolated_lab.state().slurmctld_pid == controller


@pytest.fixture
def as_root(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> tuple[Intruder, Path]:
    """The spares test's user, root here (module doc), with the release's Slurm client first
    on its PATH; its home below the lab."""
    home = lab.root / "home" / "root"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)

    def user_env(lab: Lab, home: Path) -> dict[str, str]:
        path = f"{lab.layout.slurm_bin}:{SYSTEM_PATH}"
        return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", **lab.env()}

    monkeypatch.setattr(spares_tests, "user_env", user_env)
    return Intruder("root", 0, 0), home


def test_a_spare_takes_the_requeued_run_and_serves_the_queue_after_it(
    lab: Lab, store: Store, tmp_path: Path, as_root: tuple[Intruder, Path]
) -> None:
    user, home = as_root
    try:
        spares_tests.test_a_spare_admits_only_the_run_it_was_handed_to_and_serves_the_queue_after_it(
            lab, store, tmp_path, user, home
        )
    except Exception as exc:  # the daemons' logs go with the lab: say what they said
        logs = [lab.layout.node(n).healthd_log for n in ("n5", "n1")]
        told = "\n".join(f"{p}:\n{p.read_text()[-2000:]}" for p in logs if p.exists())
        raise AssertionError(f"{exc}\n{told}") from exc


def test_burn_in_refuses_a_node_never_burnt_in_without_the_daemon(
    lab: Lab, burn_in_on: Path, tmp_path: Path
) -> None:
    burn_in_tests.test_a_job_on_a_node_never_burnt_in_is_refused_without_the_daemon_and_runs_after_the_pass(
        lab, burn_in_on, tmp_path
    )


def test_a_sweep_returns_healthy_nodes_and_hands_a_latent_fault_to_the_ladder(lab: Lab) -> None:
    sweep_tests.test_a_sweep_returns_healthy_nodes_and_hands_a_latent_fault_to_the_ladder(lab)

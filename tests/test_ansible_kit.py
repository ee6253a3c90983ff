"""The deployment kit (deployment issue): deploy/ansible's role applied to two lab hosts,
a GPU node and a CPU node (ansible-playbook with a local connection, everything under a
per-host `medic_root`), run twice (the second run changes nothing), and then the demo's
fault on what it installed: a lab in production mode running the role's venv in the sandbox
of the unit the role installed, where XID 79 drains the node with Medic's reason."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from cli.lab.production import REPO, can_sandbox
from cli.lab.slurm_conf import LabSpec
from medic_core import proc
from tests.conftest import poll
from tests.lab_views import node_info
from tests.test_production_lab import wheel_venv

KIT = REPO / "deploy" / "ansible"
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        not PLAYBOOK.exists() or bool(can_sandbox()),
        reason="needs ansible-core (the dev extra) and unshare/setpriv",
    ),
]


def play(inventory: Path, wheel: Path) -> proc.CommandResult:
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    return proc.run(
        [str(PLAYBOOK), "-i", str(inventory), str(KIT / "site.yml"),
         "-e", f"medic_wheel={wheel}", "-e", f"medic_source_dir={REPO}",
         "-e", "medic_manage_services=false", "-e", "medic_socket_group=root",
         "-e", f"ansible_python_interpreter={sys.executable}",
         "-e", f"medic_python={base_python}"],
        env={"ANSIBLE_NOCOLOR": "1", "ANSIBLE_ROLES_PATH": str(KIT / "roles"),
             "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"},
        timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """Two hosts applied twice; the root they installed into (`<root>/gpu1`, `<root>/cpu1`,
    one venv shared as a site might share /opt on NFS: the production-mode tests' venv of
    the same wheel, which pip finds satisfied, so the role's install step costs no build)."""
    root = Path(tempfile.mkdtemp(prefix="kit-", dir="/tmp"))
    try:
        venv = wheel_venv().parent
        [wheel] = (venv.parent / "dist").glob("*.whl")
        inventory = root / "inventory.ini"
        inventory.write_text(
            "[gpu_nodes]\n"
            f"gpu1 ansible_connection=local medic_root={root}/gpu1 medic_venv={venv}\n"
            "[cpu_nodes]\n"
            f"cpu1 ansible_connection=local medic_root={root}/cpu1 medic_venv={venv}\n"
        )
        first = play(inventory, wheel)
        assert first.ok, first.stdout[-4000:] + first.stderr[-2000:]
        again = play(inventory, wheel)
        assert again.ok, again.stdout[-4000:]
        for host in ("gpu1", "cpu1"):  # idempotent: nothing changes the second time
            recap = next(line for line in again.stdout.splitlines() if line.startswith(host))
            assert " changed=0 " in recap, recap
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_kit_installs_each_node_class_and_the_demos_fault_runs_on_it(installed: Path) -> None:
    """One test, so one worker applies the role (two would each run the playbook twice)."""
    _installed_per_node_class(installed)
    _demos_fault_on_what_the_kit_installed(installed)


def _installed_per_node_class(installed: Path) -> None:
    venv = wheel_venv().parent
    for host, gpus in (("gpu1", "auto"), ("cpu1", "none")):
        node = installed / host
        toml = (node / "etc/medic/medic.toml").read_text()
        assert f'gpus = "{gpus}"' in toml, toml
        checked = proc.run([str(venv / "bin/medic"), "config", "check", "--config",
                            str(node / "etc/medic/medic.toml")], timeout=60)  # fmt: skip
        assert checked.ok, checked.stdout + checked.stderr
        units = node / "etc/systemd/system"
        service = (units / "medic-healthd.service").read_text()
        assert f"ExecStart={venv}/bin/medic-healthd\n" in service
        shipped = (REPO / "systemd/medic-healthd.service").read_text()
        assert service == shipped.replace("/usr/local/bin/medic-", f"{venv}/bin/medic-")
        assert (
            f"ExecStart={venv}/bin/medic-repair %i" in (units / "medic-repair@.service").read_text()
        )
        lib = node / "usr/local/lib/medic"
        assert (lib / "medic-hook").stat().st_mode & 0o111 and (
            lib / "medic_resilient.so"
        ).is_file()
        slurm_conf = (node / "etc/slurm/slurm.conf").read_text()
        assert slurm_conf.count("# BEGIN MEDIC") == 1
        assert f"Prolog={lib}/medic-hook\n" in slurm_conf
        assert "HealthCheckNodeState=ANY,CYCLE\n" in slurm_conf
        plugstack = (node / "etc/slurm/plugstack.conf").read_text()
        assert plugstack == f"required {lib}/medic_resilient.so\n"
    if shutil.which("systemd-analyze"):
        units = installed / "gpu1/etc/systemd/system"
        done = proc.run(["systemd-analyze", "verify", "--man=no",
                         str(units / "medic-healthd.service")], timeout=60, cwd=units)  # fmt: skip
        assert done.ok and not done.stderr.strip(), done.stderr


def _demos_fault_on_what_the_kit_installed(installed: Path) -> None:
    lab = Lab(installed / "lab", venv_bin=wheel_venv())
    unit = installed / "gpu1/etc/systemd/system/medic-healthd.service"
    lab.up(LabSpec(nodes=2, gpus_per_node=8), sandbox_unit=unit)
    try:
        pid = lab.start_healthd("n1")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert str(wheel_venv() / "medic-healthd").encode() in cmdline
        lab.inject("n1", 2, ["xid=79"])
        poll(
            "n1 drained by Medic",
            lambda: str(node_info(lab, "n1").get("reason", "")).startswith("medic: gpu.xid.79"),
            timeout=30,
        )
    finally:
        lab.down()

"""Privileged repairs outside medic-healthd's sandbox (deployment issue, item 2).

`medic-repair` runs as an instance of `systemd/medic-repair@.service`; here its steps run
against stand-in commands that log their argv (systemctl, modprobe, nvidia-smi), and the
daemon's side (NVML let go of around the repair, held shut meanwhile) against a fake pynvml."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthd import gpu_plumbing
from healthd.gpu_plumbing import GpuPlumbing
from healthd.nvml_client import NvmlUnavailable, PynvmlClient
from medic_core import proc
from medic_core.config import load_config
from medic_core.settings import RemediationSettings
from remediation import repair
from remediation.repair import Tools
from tests.fakes import FakeNvml
from tests.test_systemd_unit import unit_lines

SYSTEMD = Path(__file__).parent.parent / "systemd"
TEMPLATE = SYSTEMD / "medic-repair@.service"

STAND_IN = """#!/bin/sh
line="$(basename "$0") $*"
if [ "$1" = is-active ]; then grep -qxF "$3" {active}; exit $?; fi
echo "$line" >> {log}
if grep -qxF "$line" {failing}; then echo "refused: $line" >&2; exit 1; fi
"""


class Host:
    """A node's commands, as stand-ins: which services are active, which modules loaded,
    which command lines fail; every call in order in `calls`."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.log, self.active, self.failing = (tmp_path / n for n in ("log", "active", "failing"))
        for path in (self.log, self.active, self.failing):
            path.write_text("")
        (tmp_path / "bin").mkdir()
        for name in ("systemctl", "modprobe", "nvidia-smi"):
            tool = tmp_path / "bin" / name
            tool.write_text(STAND_IN.format(log=self.log, active=self.active, failing=self.failing))
            tool.chmod(0o755)
        (tmp_path / "proc").mkdir()
        self.tools = Tools(
            systemctl=str(tmp_path / "bin/systemctl"),
            modprobe=str(tmp_path / "bin/modprobe"),
            nvidia_smi=str(tmp_path / "bin/nvidia-smi"),
            step_timeout=10.0,
        )

    def set(self, active: list[str], modules: list[str], failing: list[str] = []) -> None:  # noqa: B006
        self.active.write_text("".join(f"{s}.service\n" for s in active))
        self.failing.write_text("".join(f"{f}\n" for f in failing))
        (self.dir / "proc/modules").write_text(
            "".join(f"{m} 1234 0 - Live 0x0000000000000000\n" for m in modules)
        )

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def run(self, instance: str) -> tuple[int, list[str]]:
        said: list[str] = []
        return repair.run(instance, self.tools, said.append, root=self.dir), said


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


ALL_MODULES = ["nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia", "nvidia_peermem"]


def test_a_driver_reload_stops_the_users_unloads_loads_and_starts_them_again(host: Host) -> None:
    host.set(["nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm"], ALL_MODULES)
    code, said = host.run("driver-reload")
    assert code == 0, said
    assert host.calls() == [
        "systemctl stop nvidia-dcgm.service",
        "systemctl stop nvidia-fabricmanager.service",
        "systemctl stop nvidia-persistenced.service",
        "modprobe -r nvidia_peermem",
        "modprobe -r nvidia_uvm",
        "modprobe -r nvidia_drm",
        "modprobe -r nvidia_modeset",
        "modprobe -r nvidia",
        "modprobe nvidia",
        "modprobe nvidia_modeset",
        "modprobe nvidia_drm",
        "modprobe nvidia_uvm",
        "modprobe nvidia_peermem",
        "systemctl start nvidia-persistenced.service",
        "systemctl start nvidia-fabricmanager.service",
        "systemctl start nvidia-dcgm.service",
    ]
    assert said[-1].startswith("medic-repair driver-reload: ok in ")


def test_a_failed_unload_still_loads_back_and_starts_every_service_it_stopped(host: Host) -> None:
    host.set(["nvidia-persistenced"], ["nvidia_uvm", "nvidia"], failing=["modprobe -r nvidia"])
    code, said = host.run("driver-reload")
    assert code == 1
    assert host.calls() == [
        "systemctl stop nvidia-persistenced.service",
        "modprobe -r nvidia_uvm",
        "modprobe -r nvidia",
        "modprobe nvidia",
        "modprobe nvidia_uvm",
        "systemctl start nvidia-persistenced.service",
    ]
    assert any("modprobe -r nvidia: FAILED (exit 1: refused" in line for line in said), said


def test_a_service_that_will_not_stop_leaves_the_modules_alone(host: Host) -> None:
    host.set(
        ["nvidia-persistenced", "nvidia-fabricmanager"],
        ALL_MODULES,
        failing=["systemctl stop nvidia-persistenced.service"],
    )
    code, _ = host.run("driver-reload")
    assert code == 1
    assert host.calls() == [
        "systemctl stop nvidia-fabricmanager.service",
        "systemctl stop nvidia-persistenced.service",
        "systemctl start nvidia-fabricmanager.service",  # the one it did stop comes back
    ]


def test_a_gpu_reset_runs_nvidia_smi_on_that_gpu_only(host: Host) -> None:
    host.set([], ALL_MODULES)
    assert host.run("gpu-reset-5")[0] == 0
    assert host.calls() == ["nvidia-smi --gpu-reset -i 5"]


def test_a_hung_step_is_cut_at_its_timeout(host: Host) -> None:
    (host.dir / "bin/nvidia-smi").write_text("#!/bin/sh\nexec sleep 60\n")
    tools = Tools(nvidia_smi=str(host.dir / "bin/nvidia-smi"), step_timeout=0.3)
    said: list[str] = []
    assert repair.run("gpu-reset-0", tools, said.append) == 1
    assert "timed out after 0.3s" in said[0], said


@given(st.text(max_size=40))
def test_anything_but_the_two_repairs_is_refused_with_one_line(instance: str) -> None:
    said: list[str] = []
    ran: list[Any] = []
    tools = Tools(systemctl="/nonexistent", modprobe="/nonexistent", nvidia_smi="/nonexistent")
    valid = instance == "driver-reload" or (
        instance.startswith("gpu-reset-") and instance[10:].isascii() and instance[10:].isdigit()
        and len(instance) <= 13
    )  # fmt: skip
    if valid:
        return
    code = repair.run(instance, tools, said.append)
    assert (code, len(said), ran) == (repair.EXIT_USAGE, 1, [])
    assert said[0].startswith("medic-repair: ") and "gpu-reset-N" in said[0]


@pytest.mark.parametrize(
    "instance", ["gpu-reset", "gpu-reset-", "driver-reload-3", "gpu-reset-1234", "gpu-reset--1"]
)
def test_half_formed_instances_are_refused(host: Host, instance: str) -> None:
    assert host.run(instance)[0] == repair.EXIT_USAGE
    assert host.calls() == []


def test_the_defaults_start_the_shipped_template_and_it_runs_medic_repair() -> None:
    defaults = RemediationSettings.from_config(load_config(None))
    assert defaults.gpu_reset == (
        "/usr/bin/systemctl", "start", "medic-repair@gpu-reset-{gpu}.service",
    )  # fmt: skip
    assert defaults.driver_reload == (
        "/usr/bin/systemctl", "start", "medic-repair@driver-reload.service",
    )  # fmt: skip
    service = unit_lines(TEMPLATE)["Service"]
    assert service["ExecStart"] == ["/usr/local/bin/medic-repair %i"]
    assert service["Type"] == ["oneshot"]
    # It finishes (or systemd stops it) before the ladder gives up on the command.
    [timeout] = service["TimeoutStartSec"]
    assert float(timeout.rstrip("s")) < defaults.action_timeout
    # Nothing in it takes away what the repair needs.
    for key in ("ProtectKernelModules", "CapabilityBoundingSet", "PrivateDevices", "User"):
        assert key not in service


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_template(tmp_path: Path) -> None:
    medic_repair = Path(sys.executable).parent / "medic-repair"
    assert medic_repair.exists(), "the medic-repair entry point is not installed"
    (tmp_path / TEMPLATE.name).write_text(
        TEMPLATE.read_text().replace("/usr/local/bin/medic-repair", str(medic_repair))
    )
    shutil.copy(SYSTEMD / "medic.slice", tmp_path / "medic.slice")
    done = proc.run(
        [
            "systemd-analyze",
            "verify",
            "--man=no",
            str(tmp_path / "medic-repair@gpu-reset-3.service"),
        ],
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


def test_the_entry_point_refuses_a_bad_instance_in_one_line() -> None:
    medic_repair = Path(sys.executable).parent / "medic-repair"
    done = proc.run([str(medic_repair), "reboot-everything"], timeout=30)
    assert done.returncode == repair.EXIT_USAGE
    assert done.stdout.strip().count("\n") == 0 and "is not a repair" in done.stdout


# --- the daemon lets go of NVML around a repair ------------------------------------------------


class StubListener:
    started = 0

    def __init__(self, *_: Any) -> None:
        self.running = False

    def start(self, ready_timeout: float = 10.0) -> bool:
        StubListener.started += 1
        self.running = True
        return True

    def stop(self, timeout: float | None = None) -> bool:
        self.running = False
        return True

    def stalled_for(self) -> float:
        return 999.0  # as a stopped listener's would be: it must no longer be judged


def test_release_shuts_nvml_holds_it_shut_and_reacquire_opens_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_plumbing, "XidListener", StubListener)
    nv = FakeNvml()
    client = PynvmlClient(loader=lambda: nv)  # type: ignore[arg-type, return-value]
    plumbing = GpuPlumbing(client)
    client.open()
    plumbing.start()
    assert nv.open and plumbing.stalled_for() == 999.0

    plumbing.release()
    assert not nv.open and nv.shutdowns == 1
    # The watchdog does not judge a listener stopped on purpose.
    assert plumbing.stalled_for() is None
    # A check running meanwhile cannot open NVML again under the repair.
    with pytest.raises(NvmlUnavailable, match="released for a repair"):
        client.open()
    assert nv.inits == 1

    plumbing.reacquire()
    assert nv.open and nv.inits == 2
    assert plumbing.listener is not None and plumbing.listener.running  # type: ignore[attr-defined]


def test_an_init_under_way_when_the_repair_starts_cannot_reopen_nvml_behind_it() -> None:
    """release() takes the init lock: an nvmlInit that started before the hold finishes,
    then the shutdown runs; no init starts after the hold."""
    nv = FakeNvml()
    entered, go = threading.Event(), threading.Event()
    real_init = nv.nvmlInit

    def slow_init() -> None:
        entered.set()
        go.wait(10)
        real_init()

    nv.nvmlInit = slow_init  # type: ignore[method-assign]
    client = PynvmlClient(loader=lambda: nv)  # type: ignore[arg-type, return-value]
    plumbing = GpuPlumbing(client)
    opener = threading.Thread(target=client.open)
    opener.start()
    assert entered.wait(10)
    releasing = threading.Thread(target=plumbing.release)
    releasing.start()
    go.set()
    opener.join(10)
    releasing.join(10)
    assert not nv.open and (nv.inits, nv.shutdowns) == (1, 1)
    with pytest.raises(NvmlUnavailable):
        client.open()

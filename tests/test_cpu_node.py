"""CPU nodes (deployment issue, item 6): `[healthd] gpus = "none"` is healthy. The daemon's
launch verdict and schedule leave the GPU checks out by the rule `medic check` and the
inline prolog follow (`gpu_checks_skipped`, applied by the runner), and the services check
does not require the GPU daemons."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import check as cli_check
from healthd.checks import load_check_configs, registry
from healthd.checks.base import CheckContext, Status, Tier, gpu_checks_skipped
from healthd.checks.services import ServicesConfig
from healthd.daemon import HealthDaemon
from healthd.fixtures import write_process
from healthd.inline import run_inline
from healthd.runner import Runner
from medic_core.config import MedicConfig, load_config
from medic_core.store import ConditionUpdate, Store, open_configured_store
from tests.test_daemon import plain_config

GPU_CHECKS = sorted(s.name for s in registry() if "nvml" in s.needs)


def cpu_config(tmp_path: Path, extra: str = "", gpus: str = "none") -> MedicConfig:
    """plain_config's node (`gpus = "none"`, or `gpus`) with no nvidia-persistenced running."""
    path = plain_config(tmp_path, extra)
    path.write_text(path.read_text().replace('gpus = "none"', f'gpus = "{gpus}"'))
    shutil.rmtree(tmp_path / "host/proc/1002")  # the fixture's nvidia-persistenced
    return load_config(path)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_configured_store(load_config(plain_config(tmp_path / "for-store"))) as s:
        yield s


def daemon_for(config: MedicConfig, store: Store, **ctx: object) -> HealthDaemon:
    return HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root, **ctx))


def test_the_rule() -> None:
    assert gpu_checks_skipped("none", driver=True) == "not a GPU node ([healthd] gpus = none)"
    assert gpu_checks_skipped("auto", driver=False) == (
        "no NVIDIA driver on this node ([healthd] gpus = auto)"
    )
    assert gpu_checks_skipped("auto", driver=True) == ""
    assert gpu_checks_skipped("required", driver=False) == ""  # the GPU checks report it
    assert GPU_CHECKS and all(name.startswith("gpu_") for name in GPU_CHECKS)


def test_the_daemons_launch_verdict_on_a_cpu_node_is_ok_and_has_no_gpu_checks(
    tmp_path: Path, store: Store
) -> None:
    config = cpu_config(tmp_path)
    daemon = daemon_for(config, store)
    verdict = daemon.gate.launch_verdict(10.0)
    assert verdict["status"] == "OK", verdict
    checks = {r["check"] for r in verdict["results"]}
    assert checks.isdisjoint(GPU_CHECKS)
    assert not [r for r in verdict["results"] if r["status"] in ("UNKNOWN", "CRITICAL")]
    # The services check no longer asks for nvidia-persistenced on a CPU node.
    services = [r for r in verdict["results"] if r["check"] == "services"]
    assert [(r["target"], r["status"]) for r in services] == [("munged", "OK")]
    # One rule: the daemon runs exactly the launch checks `medic check --tier launch` runs
    # on this node, and both name why the GPU checks are left out.
    with cli_check.nvml_for("none") as (client, skip):
        ctx = CheckContext.for_root(config.paths.host_root, nvml=client, gpu_skip=skip)
        plan = cli_check.plan(Runner(ctx, load_check_configs(config)), (Tier.LAUNCH,), ())
    assert sorted(verdict["ran"]) == sorted(plan.names)
    assert {why for name, why in plan.skipped if name in GPU_CHECKS} == {
        daemon.checks.not_here("gpu_ecc")
    }
    # Nor are the GPU checks scheduled, so none is written to the store as UNKNOWN.
    assert set(daemon.scheduler.due).isdisjoint(GPU_CHECKS)
    daemon.scheduler.run_due()
    stored = store.conditions(daemon.node)
    assert stored and not {c.type for c in stored} & set(GPU_CHECKS)
    assert {c.status for c in stored} <= {Status.OK, Status.NOT_APPLICABLE}


def test_an_explicit_gpu_check_through_the_socket_is_left_out_too(
    tmp_path: Path, store: Store
) -> None:
    daemon = daemon_for(cpu_config(tmp_path), store)
    report = daemon.run_checks(["gpu_ecc", "cpus"])
    assert [o.name for o in report.outcomes] == ["cpus"]


def test_conditions_an_earlier_daemon_left_for_gpu_checks_are_retired(
    tmp_path: Path, store: Store
) -> None:
    """A CPU node upgraded from a daemon that reported each GPU check UNKNOWN (and
    nvidia-persistenced down): its store view turns healthy too."""
    config = cpu_config(tmp_path)
    node = config.node_name
    at = dt.datetime.now(dt.UTC)
    store.set_conditions(
        node,
        [
            ConditionUpdate("gpu_ecc", Status.UNKNOWN, "", "check.unavailable", "no nvml"),
            ConditionUpdate("gpu_xid", Status.UNKNOWN, "", "check.unavailable", "no nvml"),
            ConditionUpdate(
                "services", Status.CRITICAL, "nvidia-persistenced", "service.down", "down"
            ),
        ],
        at,
    )
    daemon = daemon_for(config, store)
    gpu = {c.type: c for c in store.conditions(node) if c.type in GPU_CHECKS}
    assert {t: c.status for t, c in gpu.items()} == {
        "gpu_ecc": Status.NOT_APPLICABLE,
        "gpu_xid": Status.NOT_APPLICABLE,
    }
    assert gpu["gpu_ecc"].message == (
        "not run on this node: not a GPU node ([healthd] gpus = none)"
    )
    daemon.scheduler.run_due()  # services no longer reports nvidia-persistenced: cleared
    services = {c.target: c.status for c in store.conditions(node, type="services")}
    assert services == {"munged": Status.OK, "nvidia-persistenced": Status.OK}
    assert {c.status for c in store.conditions(node)} <= {Status.OK, Status.NOT_APPLICABLE}


def test_a_gpu_node_keeps_its_gpu_checks(tmp_path: Path, store: Store) -> None:
    """auto with NVML, and required without it (a driver that did not load is a fault
    the GPU checks report, never a CPU node)."""
    auto = daemon_for(cpu_config(tmp_path / "auto", gpus="auto"), store, nvml=object())
    assert set(GPU_CHECKS) <= set(auto.checks.selected())
    required = daemon_for(cpu_config(tmp_path / "required", gpus="required"), store)
    assert set(GPU_CHECKS) <= set(required.checks.selected())
    outcomes = {o.name: o for o in required.run_checks(["gpu_ecc"]).outcomes}
    assert outcomes["gpu_ecc"].results[0].fault_class == "check.unavailable"
    # auto without a driver: a CPU node for the GPU checks, as `medic check` judges it...
    no_driver = daemon_for(cpu_config(tmp_path / "no-driver", gpus="auto"), store)
    assert no_driver.checks.not_here("gpu_ecc") == (
        "no NVIDIA driver on this node ([healthd] gpus = auto)"
    )
    # ...but only `gpus = "none"` declares a CPU node to the services check: under auto a
    # GPU node whose driver did not load still has nvidia-persistenced missed.
    services = load_check_configs(no_driver.config)["services"]
    assert isinstance(services, ServicesConfig)
    assert "nvidia-persistenced" in services.required


def test_the_services_check_on_a_cpu_node_requires_no_gpu_daemon(tmp_path: Path) -> None:
    config = cpu_config(
        tmp_path,
        '[checks.services]\nrequired = ["munged", "nvidia-persistenced", "nv-hostengine",'
        ' "sssd"]\nfabricmanager = true\n',
    )
    services = load_check_configs(config)["services"]
    assert isinstance(services, ServicesConfig)
    assert services.services == ("munged", "sssd")
    default = ServicesConfig().for_cpu_node()
    assert default.services == ("munged",)
    # The prolog's inline run (no daemon) on the node's tree, with sssd running too.
    write_process(tmp_path / "host", 1003, "sssd")
    verdict = run_inline(config, budget=10.0)
    assert verdict.status is Status.OK, verdict
    found = {(f.check, f.target) for f in verdict.findings}
    assert ("services", "munged") in found and ("services", "sssd") in found
    assert not {f.check for f in verdict.findings} & set(GPU_CHECKS)

"""What repairs clear (the table in docs/nvml-injection.md): `gpu_reset`, `driver_reload` and
`reboot` return the scenario as the repair would leave it; a hardware fault survives them
all (its last XID happens again)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from cli.lab.scenario.injection import add_xid, replace_gpu
from cli.lab.scenario.model import GpuState, NodeScenario


def _recur(scenario: NodeScenario, gpu: int) -> NodeScenario:
    """A hardware fault survives repair: the GPU's last XID happens again, as a new event."""
    last = [e for e in scenario.events if e.gpu == gpu]
    return add_xid(scenario, gpu, last[-1].xid) if last else scenario


def _reset_state(g: GpuState) -> GpuState:
    return replace(
        g,
        ecc_volatile_sbe=0,
        ecc_volatile_dbe=0,
        throttle=0,
        lost=False,
        retired_pending=False,  # the pending pages are retired now (already counted)
        remap_pending=g.remap_pending and g.remap_failure,
        nvlinks_down=frozenset(),
        pcie_gen=g.pcie_max_gen,
        pcie_width=g.pcie_max_width,
        processes=(),
        util_gpu=0,
        util_mem=0,
        pcie_replay=0,
        nvlink_replay=0,
        nvlink_recovery=0,
        nvlink_crc_flit=0,
        nvlink_crc_data=0,
        violation_power_ns=0,
        violation_thermal_ns=0,
    )


def _drop_gpu_rules(scenario: NodeScenario, gpus: Iterable[int]) -> NodeScenario:
    cleared = set(gpus)
    return replace(
        scenario,
        events=tuple(e for e in scenario.events if e.gpu not in cleared),
        failures=tuple(f for f in scenario.failures if f.gpu not in cleared),
        hangs=tuple(h for h in scenario.hangs if h.gpu not in cleared),
    )


def gpu_reset(scenario: NodeScenario, gpu: int) -> NodeScenario:
    """`nvidia-smi -r` on one GPU: clears its volatile state; lifetime counters, retired pages,
    a row-remap failure and a missing GPU stay; a hardware_fault GPU is unchanged."""
    state = scenario.gpus[gpu]
    if state.hardware_fault:
        return _recur(scenario, gpu)
    if state.missing:
        return scenario
    return _drop_gpu_rules(replace_gpu(scenario, gpu, _reset_state(state)), [gpu])


def _restore_missing(scenario: NodeScenario, recovered: tuple[str, ...]) -> NodeScenario:
    gpus = tuple(
        replace(g, missing=False)
        if g.missing and g.recoverable_by in recovered and not g.hardware_fault
        else g
        for g in scenario.gpus
    )
    return replace(scenario, gpus=gpus)


def _recover_node(scenario: NodeScenario, recovered: tuple[str, ...]) -> NodeScenario:
    current = _restore_missing(scenario, recovered)
    for i in range(len(current.gpus)):
        current = gpu_reset(current, i)
    gpus = tuple(g if g.hardware_fault else replace(g, persistence=True) for g in current.gpus)
    return replace(
        current,
        gpus=gpus,
        failures=tuple(f for f in current.failures if f.gpu is not None),
        hangs=tuple(h for h in current.hangs if h.gpu is not None),
    )


def driver_reload(scenario: NodeScenario) -> NodeScenario:
    """Unload and reload the NVIDIA driver: a reset of every GPU, node-wide fail/hang rules
    cleared, persistence back on, and GPUs missing with recoverable_by=reload back."""
    return _recover_node(scenario, ("reload",))


def reboot(scenario: NodeScenario) -> NodeScenario:
    """A reboot: everything driver_reload does, and GPUs missing with recoverable_by=reboot
    come back too. Only hardware_fault GPUs and recoverable_by=never GPUs keep their fault."""
    return _recover_node(scenario, ("reload", "reboot"))

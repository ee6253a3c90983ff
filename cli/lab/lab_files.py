"""What `medic lab up` writes before it starts a daemon: slurm.conf, gres.conf and
medic.toml, the munge key, the hook wrappers (through the compiled front, as on a node)
and, on a Debian root, the Slurm client wrappers that enter it; the NVML injection
library, the SPANK plugin and the native hook; each node's spool, host tree, /dev/nvidiaN
and default scenario.
"""

from __future__ import annotations

import os
import shutil

from cli.lab import scenario as scenario_mod
from cli.lab.debian_root import MARKER, DebianRoot
from cli.lab.host_setup import SYSTEM_PATH, make_gpu_devices
from cli.lab.lab_env import LabEnvironment, LabState
from cli.lab.processes import write_script
from cli.lab.slurm_conf import render_gres_conf, render_medic_conf, render_slurm_conf
from slurm_hooks.native import build as native_build

HOOKS = ("medic-prolog", "medic-epilog", "medic-healthcheck")
# The Slurm client commands a lab on a Debian root wraps for host-side callers.
SLURM_CLIENTS = (
    "scontrol", "squeue", "sinfo", "sbatch", "srun", "salloc", "scancel", "sacct", "sacctmgr",
    "sprio", "sshare", "sstat", "sattach", "sdiag", "sreport", "strigger",
)  # fmt: skip


def enter_root_lines(root: DebianRoot, program: str) -> str:
    """Shell lines that, outside `root`, run `program` "$@" inside it, in the caller's
    directory (/ if the root has no such directory); inside it they do nothing."""
    return (
        f"if [ ! -e {MARKER} ]; then\n"
        f'  wd="$PWD"; [ -d "{root.path}$wd" ] || wd=/\n'
        f'  exec unshare --root="{root.path}" --wd="$wd" {program} "$@"\n'
        "fi\n"
    )


def write_files(lab: LabEnvironment, state: LabState) -> None:
    from cli.lab.nvml.build import build_library
    from healthd.fixtures import write_host_tree
    from slurm_hooks.spank import build as spank_build

    layout = lab.layout
    # A new lab starts from an empty controller state (no jobs, no drains of a past run).
    shutil.rmtree(layout.ctld_dir / "state", ignore_errors=True)
    for d in (layout.etc, layout.ctld_dir / "state", layout.bin_dir, layout.lib_dir):
        d.mkdir(parents=True, exist_ok=True)
    # munged refuses a socket directory that others cannot enter, or a readable key dir.
    layout.munge_dir.mkdir(parents=True, exist_ok=True)
    layout.munge_dir.chmod(0o755)
    key = layout.munge_dir / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    lab.save_state(state)
    layout.slurm_conf.write_text(render_slurm_conf(state.spec, layout, state.ports, state.host))
    (layout.etc / "gres.conf").write_text(render_gres_conf(state.spec, layout))
    layout.medic_conf.write_text(
        render_medic_conf(layout, str(lab.venv_bin / "python"), shared_store=not state.sandbox_unit)
    )
    write_wrappers(lab)
    build_library(layout.lib_dir)
    include_dir = spank_build.INCLUDE_DIR
    root = lab.debian_root()
    if root is not None:  # the plugin must carry the lab's Slurm version, not the host's
        include_dir = layout.lib_dir / "include"
        include_dir.mkdir(exist_ok=True)
        headers = include_dir / "slurm"
        headers.unlink(missing_ok=True)
        headers.symlink_to(root.path / "usr/include/slurm")
        write_slurm_wrappers(lab, root)
    plugin = spank_build.build_plugin(layout.lib_dir, include_dir)
    native_build.build_hook(layout.lib_dir, lab.venv_bin / "medic-prolog")
    (layout.etc / "plugstack.conf").write_text(f"required {plugin}\n")
    shutil.copyfile(spank_build.CLI_FILTER, layout.etc / "cli_filter.lua")
    for name in state.spec.node_names():
        node = layout.node(name)
        for d in (node.spool, node.state_dir):
            d.mkdir(parents=True, exist_ok=True)
        if not node.host_root.exists():
            write_host_tree(node.host_root)
        make_gpu_devices(node.host_root / "dev", state.spec.gpus_per_node)
        scenario_mod.write_scenario(
            node.scenario, scenario_mod.default_scenario(name, state.spec.gpus_per_node)
        )
    layout.env_file.write_text("\n".join(lab.export_lines()) + "\n")


def write_wrappers(lab: LabEnvironment) -> None:
    """Hook scripts named in slurm.conf. Slurm runs hooks with no PATH and nothing of
    slurmd's environment, so the wrapper supplies the lab's config and NVML library;
    in production slurm.conf names the console scripts directly."""
    exports = "".join(f"export {k}='{v}'\n" for k, v in lab.env().items())
    root = lab.debian_root()
    # Run from the host (a test, an operator trying a hook), it enters the root first.
    enter = enter_root_lines(root, '"$0"') if root is not None else ""
    header = (
        f"#!/bin/sh\n# Written by `medic lab up`.\n{enter}export PATH='{SYSTEM_PATH}'\n{exports}"
    )
    # The Prolog and Epilog go through the compiled front, as on a production node; it
    # finds this node's daemon from SLURMD_NODENAME, the one variable every hook gets.
    node_dir = lab.layout.node_template().replace("{node}", "${SLURMD_NODENAME}")
    front = lab.layout.lib_dir / native_build.BINARY_NAME
    fast = f'{header}export MEDIC_SOCKET="{node_dir}/healthd.sock"\nexec "{front}" "$@"\n'
    for hook in HOOKS:
        direct = f'{header}exec "{lab.venv_bin / hook}" "$@"\n'
        text = fast if hook in ("medic-prolog", "medic-epilog") else direct
        write_script(lab.layout.bin_dir / hook, text)
    python = lab.venv_bin / "python"
    reboot = f'{header}exec "{python}" -m cli.lab.reboot --lab-root "{lab.root}"\n'
    write_script(lab.layout.bin_dir / "medic-lab-reboot", reboot)
    # Stand-ins for deep-tier tools, found through [checks.*] search_dirs (docs/lab.md).
    lab.layout.tools_dir.mkdir(parents=True, exist_ok=True)
    dcgmi = f'{header}exec "{python}" -m cli.lab.dcgmi "$@"\n'
    write_script(lab.layout.tools_dir / "dcgmi", dcgmi)


def write_slurm_wrappers(lab: LabEnvironment, root: DebianRoot) -> None:
    """<lab>/slurm-bin/<client>: the root's Slurm client run inside the root, in the
    caller's directory (/ if the root has no such directory)."""
    lab.layout.slurm_bin.mkdir(parents=True, exist_ok=True)
    for name in SLURM_CLIENTS:
        write_script(
            lab.layout.slurm_bin / name,
            "#!/bin/sh\n# Written by `medic lab up`.\n"
            f"{enter_root_lines(root, f'/usr/bin/{name}')}"
            f'exec /usr/bin/{name} "$@"\n',
        )

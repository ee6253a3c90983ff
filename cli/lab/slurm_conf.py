"""slurm.conf, gres.conf and medic.toml for a lab: pure text rendering from a spec."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cli.lab.layout import LabLayout
from remediation.isolation import index_ranges


@dataclass(frozen=True)
class LabSpec:
    nodes: int = 5
    gpus_per_node: int = 8
    cpus_per_node: int = 16
    memory_mb: int = 64000
    partition: str = "gpu"
    cluster_name: str = "medic-lab"
    node_prefix: str = "n"
    # The Slurm release the lab runs: the host's (22.05) or one from a Debian root
    # (cli/lab/debian_root.py).
    slurm: str = "22.05"
    # What the main scheduler waits between passes: Slurm's defaults (batch_sched_delay=3 s)
    # are "" here. The lab's pass at once, as docs/operator-guide.md advises.
    scheduler_parameters: str = "batch_sched_delay=0,sched_min_interval=0"

    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(1, self.nodes + 1)]

    def node_range(self) -> str:
        return f"{self.node_prefix}[1-{self.nodes}]" if self.nodes > 1 else f"{self.node_prefix}1"


@dataclass(frozen=True)
class LabPorts:
    slurmctld: int
    slurmd_first: int  # node i listens on slurmd_first + i - 1

    def slurmd(self, index: int) -> int:
        return self.slurmd_first + index


def render_slurm_conf(
    spec: LabSpec,
    layout: LabLayout,
    ports: LabPorts,
    host: str,
    gres_keep: Mapping[str, Sequence[int]] | None = None,
) -> str:
    """`gres_keep`: nodes whose GRES lists only these GPUs (single-GPU isolation,
    cli/lab/isolate.py); they get a NodeName line of their own with the lower count."""
    nodes = layout.root / "nodes" / "%n"
    last_port = ports.slurmd(spec.nodes - 1)
    port_range = f"{ports.slurmd_first}-{last_port}" if spec.nodes > 1 else str(last_port)
    bin_dir = layout.bin_dir
    gres = f"Gres=gpu:{spec.gpus_per_node} " if spec.gpus_per_node else ""
    lines = [
        "# Written by `medic lab up`: a real slurmctld and one slurmd per node on loopback.",
        f"ClusterName={spec.cluster_name}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports.slurmctld}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire=10 shortens the delay Slurm puts on a requeued job (default 121 s).
        f"AuthInfo=socket={layout.munge_socket},cred_expire=10",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={layout.ctld_dir / 'state'}",
        f"SlurmctldPidFile={layout.ctld_dir / 'slurmctld.pid'}",
        f"SlurmctldLogFile={layout.ctld_dir / 'slurmctld.log'}",
        f"SlurmdSpoolDir={nodes / 'spool'}",
        f"SlurmdPidFile={nodes / 'slurmd.pid'}",
        f"SlurmdLogFile={nodes / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # No cgroups, no accounting daemon: everything runs as plain processes on this host.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        # The node's declared CPUs and memory stand even though all nodes share this host.
        "SlurmdParameters=config_overrides",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        *(
            [f"SchedulerParameters={spec.scheduler_parameters}"]
            if spec.scheduler_parameters
            else []
        ),
        "GresTypes=gpu",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "ResumeTimeout=60",
        "MinJobAge=600",
        "JobRequeue=1",
        "PrologFlags=Alloc",
        f"Prolog={bin_dir / 'medic-prolog'}",
        f"Epilog={bin_dir / 'medic-epilog'}",
        f"HealthCheckProgram={bin_dir / 'medic-healthcheck'}",
        "HealthCheckInterval=60",
        "HealthCheckNodeState=ANY",
        f"RebootProgram={bin_dir / 'medic-lab-reboot'}",
        # --resilient[=N]: Medic's SPANK plugin, and cli_filter.lua next to this file.
        f"PlugStackConfig={layout.etc / 'plugstack.conf'}",
        "CliFilterPlugins=cli_filter/lua",
        *(
            [
                f"NodeName={spec.node_range()} NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={port_range} CPUs={spec.cpus_per_node} RealMemory={spec.memory_mb} "
                f"{gres}State=UNKNOWN"
            ]
            if not gres_keep
            else [
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={ports.slurmd(index)} CPUs={spec.cpus_per_node} "
                f"RealMemory={spec.memory_mb} "
                + (f"Gres=gpu:{len(gres_keep[name])} " if name in gres_keep else gres)
                + "State=UNKNOWN"
                for index, name in enumerate(spec.node_names())
            ]
        ),
        f"PartitionName={spec.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ]
    return "\n".join(lines)


def render_gres_conf(
    spec: LabSpec, layout: LabLayout, gres_keep: Mapping[str, Sequence[int]] | None = None
) -> str:
    # slurmd drops a GPU without a device file ("Removing file-less GPU"), so each node's
    # host tree carries /dev/nvidiaN character devices; nothing ever opens them.
    if spec.gpus_per_node == 0:
        return ""
    last = spec.gpus_per_node - 1
    lines = []
    for name in spec.node_names():
        dev = layout.node(name).host_root / "dev"
        keep = (gres_keep or {}).get(name)
        files = index_ranges(keep) if keep is not None else f"0-{last}"
        lines.append(f"NodeName={name} Name=gpu File={dev}/nvidia[{files}]")
    return "\n".join(lines) + "\n"


def render_medic_conf(layout: LabLayout, python: str = "python3", shared_store: bool = True) -> str:
    """The lab's medic.toml; without `shared_store` each node keeps the default store of its
    own (<node>/state/medic.db), as a node installed without a [store] table does."""
    node_dir = layout.node_template()
    repair = f'"{python}", "-m", "cli.lab.repair", "--lab-root", "{layout.root}"'
    store = (
        ["# One store for the whole lab, as a fleet shares one PostgreSQL.", "[store]",
         f'url = "sqlite:///{layout.store_db}"', ""]
        if shared_store
        else ["# No [store]: each node's default store, <state_dir>/medic.db.", ""]
    )  # fmt: skip
    return "\n".join(
        [
            "# Written by `medic lab up`. {node} is this node's name (SLURMD_NODENAME or",
            "# MEDIC_NODE_NAME): several lab nodes share this host, each with its own paths.",
            "[node]",
            f'host_root = "{node_dir}/host"',
            f'state_dir = "{node_dir}/state"',
            f'socket = "{node_dir}/healthd.sock"',
            "",
            "[slurm]",
            f'conf = "{layout.slurm_conf}"',
            "",
            *store,
            "# Several daemons share this host: no fixed metrics port, and root-only sockets.",
            "[healthd]",
            "metrics_port = 0",
            'socket_group = ""',
            f'slurmd_spool_dir = "{node_dir}/spool"',
            "# Progress heartbeats of every lab node's jobs (the file names carry the node):",
            "# jobs find it through MEDIC_PROGRESS_DIR (env.sh).",
            f'progress_dir = "{layout.progress_dir}"',
            "",
            "# The ladder runs the lab's stand-ins for nvidia-smi -r and a driver reload.",
            "[remediation]",
            f'gpu_reset = [{repair}, "gpu-reset", "--node", "{{node}}", "--gpu", "{{gpu}}"]',
            f'driver_reload = [{repair}, "driver-reload", "--node", "{{node}}"]',
            "action_timeout = 30.0",
            "cooldown = { gpu_reset = 0.0, driver_reload = 1.0, reboot = 1.0 }",
            "reboot_timeout = 120.0",
            "# A failed DCGM diag (the lab's sweeps find them) starts at a reboot, not a human.",
            'first_rung = { "gpu.dcgm.diag" = "reboot" }',
            "",
            "# Burn-in off: each test starts fresh daemons on nodes it expects in service",
            "# (tests/test_burn_in_lab.py switches new_node on for its own daemon).",
            "[remediation.burn_in]",
            "new_node = []",
            "after_rma = []",
            "after_reboot = []",
            "",
            "# The deep tier finds the lab's dcgmi (cli/lab/dcgmi.py), which reads the scenario.",
            "[checks.deep_dcgm]",
            f'search_dirs = ["{layout.tools_dir}"]',
            "command_timeout = 60.0",
            "timeout = 120.0",
            "",
            "# Sweeps run `medic sweep probe` from this venv on each node under srun.",
            "[sweep]",
            f'probe = ["{Path(python).parent / "medic"}", "sweep", "probe"]',
            "timeout = 120.0",
            "immediate = 20.0",
            "",
        ]
    )


def with_check_options(medic_conf: str, options: Mapping[str, str]) -> str:
    """`medic_conf` with TOML lines added to `[checks.<name>]` for each name in `options`:
    into the table where the lab's config already has it (TOML forbids a second one),
    else as a new table at the end."""
    lines = medic_conf.splitlines()
    extra: list[str] = []
    for name, body in options.items():
        header = f"[checks.{name}]"
        if header in lines:
            at = lines.index(header) + 1
            lines[at:at] = body.splitlines()
        else:
            extra += [header, *body.splitlines()]
    return "\n".join([*lines, *extra]) + "\n"

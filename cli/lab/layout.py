"""Where everything of one lab lives below its root directory.

<root>/lab.json                 what `up` started (spec, ports, daemon PIDs)
<root>/env.sh                   the exports a user sources to talk to the lab
<root>/etc/                     slurm.conf, gres.conf, medic.toml
<root>/munge/                   key, socket, pid, log of the lab's own munged
<root>/ctld/                    slurmctld state, pid, log
<root>/bin/                     hook wrappers named in slurm.conf
<root>/slurm-bin/               a newer release's Slurm client, run in its Debian root
<root>/tools/                   stand-ins for deep-tier tools (dcgmi)
<root>/lib/libnvidia-ml.so.1    the NVML injection library
<root>/nodes/<n>/               per node: spool, slurmd pid/log, host tree, state, scenario
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The same per-node paths are written into slurm.conf and medic.toml as templates; slurmd
# expands %n, Medic expands {node}.
NODE_DIR_TEMPLATE = "nodes/{node}"


@dataclass(frozen=True)
class LabLayout:
    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def env_file(self) -> Path:
        return self.root / "env.sh"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def medic_conf(self) -> Path:
        return self.etc / "medic.toml"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munged.sock"

    @property
    def ctld_dir(self) -> Path:
        return self.root / "ctld"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def slurm_bin(self) -> Path:
        """Wrappers running a Debian root's Slurm client (labs on a newer release only)."""
        return self.root / "slurm-bin"

    @property
    def tools_dir(self) -> Path:
        return self.root / "tools"

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"

    @property
    def store_db(self) -> Path:
        return self.root / "medic.db"

    @property
    def progress_dir(self) -> Path:
        """The jobs' progress heartbeats, every node's (see medic_core.heartbeat)."""
        return self.root / "progress"

    @property
    def nodes_dir(self) -> Path:
        return self.root / "nodes"

    def node_template(self) -> str:
        """Per-node directory with Medic's `{node}` placeholder."""
        return str(self.root / NODE_DIR_TEMPLATE)

    def node(self, name: str) -> NodeLayout:
        return NodeLayout(name=name, dir=self.root / NODE_DIR_TEMPLATE.format(node=name))


@dataclass(frozen=True)
class NodeLayout:
    name: str
    dir: Path

    @property
    def spool(self) -> Path:
        return self.dir / "spool"

    @property
    def slurmd_pid(self) -> Path:
        return self.dir / "slurmd.pid"

    @property
    def slurmd_log(self) -> Path:
        return self.dir / "slurmd.log"

    @property
    def healthd_pid(self) -> Path:
        return self.dir / "healthd.pid"

    @property
    def healthd_log(self) -> Path:
        return self.dir / "healthd.log"

    @property
    def host_root(self) -> Path:
        return self.dir / "host"

    @property
    def state_dir(self) -> Path:
        return self.dir / "state"

    @property
    def socket(self) -> Path:
        return self.dir / "healthd.sock"

    @property
    def scenario(self) -> Path:
        return self.dir / "nvml.scenario"

"""Where a lab is and how a process talks to it: its directory and layout, the Slurm
release it runs (on the host, or in a Debian root), the environment a process needs to
reach its Slurm and its nodes, the state `up` saved (lab.json), and running a Slurm client
command against it. The base of cli.lab.cluster.Lab.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from cli.lab.debian_root import HOST_RELEASE, MARKER, REPO, DebianRoot
from cli.lab.host_setup import SYSTEM_PATH
from cli.lab.layout import LabLayout, NodeLayout
from cli.lab.processes import LabError
from cli.lab.slurm_conf import LabPorts, LabSpec
from medic_core import proc
from medic_core import slurm as slurm_json

# Every process the lab starts carries this variable; `down` sweeps stragglers by it
# (slurmstepd and job processes inherit it from slurmd and the submitting shell).
LAB_TAG_ENV = "MEDIC_LAB_ROOT"
CMD_TIMEOUT = 15.0


@dataclass
class LabState:
    """What `up` started, persisted in lab.json so another process can tear it down."""

    spec: LabSpec
    ports: LabPorts
    host: str
    venv_bin: str
    munged_pid: int = 0
    slurmctld_pid: int = 0
    started_at: float = 0.0
    up_seconds: float = 0.0
    # Production mode (cli/lab/production.py): daemons in this unit's sandbox, per-node stores.
    sandbox_unit: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> LabState:
        raw = json.loads(text)
        raw["spec"] = LabSpec(**raw["spec"])
        raw["ports"] = LabPorts(**raw["ports"])
        return cls(**raw)


class LabEnvironment:
    def __init__(self, root: Path, venv_bin: Path | None = None) -> None:
        self.root = root.resolve()
        self.layout = LabLayout(self.root)
        # The venv whose console scripts the hook wrappers exec (hooks get no PATH).
        self.venv_bin = venv_bin or Path(sys.executable).parent
        self._release: str | None = None

    # ---- the Slurm release -------------------------------------------------------------

    def release(self) -> str:
        """The Slurm release this lab runs (its spec's; the host's before `up`)."""
        if self._release is None:
            try:
                self._release = self.state().spec.slurm
            except (LabError, ValueError, KeyError, TypeError):
                return HOST_RELEASE
        return self._release

    def debian_root(self) -> DebianRoot | None:
        """The Debian root a newer release runs in; None for the host's own Slurm."""
        release = self.release()
        return None if release == HOST_RELEASE else DebianRoot.for_release(release)

    def in_root(self, argv: list[str]) -> list[str]:
        """`argv` as this lab runs it: inside its Debian root, entered from the host (inside
        it already, as the RebootProgram is, it runs as it is)."""
        root = self.debian_root()
        if root is None or MARKER.exists():
            return argv
        return root.enter(argv, self.root)

    # ---- environment -------------------------------------------------------------------

    def env(self, node: str | None = None) -> dict[str, str]:
        """What a process needs to talk to this lab (and, with `node`, to act as that node)."""
        env = {
            "SLURM_CONF": str(self.layout.slurm_conf),
            "MEDIC_CONFIG": str(self.layout.medic_conf),
            "MEDIC_PROGRESS_DIR": str(self.layout.progress_dir),
            "LD_LIBRARY_PATH": str(self.layout.lib_dir),
            "NVML_INJECT_SCENARIO": str(self.layout.root / "nodes" / "{node}" / "nvml.scenario"),
            LAB_TAG_ENV: str(self.root),
        }
        if self.release() != HOST_RELEASE:  # Medic runs from the repo in the root's venv
            env["PYTHONPATH"] = str(REPO)
            # Medic's Slurm client finds the release's scontrol, squeue... there first.
            env[slurm_json.BIN_DIRS_ENV] = str(self.layout.slurm_bin)
        if node is not None:
            env["MEDIC_NODE_NAME"] = node
        return env

    def process_env(self, node: str | None = None) -> dict[str, str]:
        """A full environment for a child process: ours plus the lab's."""
        env = dict(os.environ)
        env.setdefault("PATH", SYSTEM_PATH)
        env.update(self.env(node))
        if self.release() != HOST_RELEASE and not MARKER.exists():
            # The host's 22.05 client cannot talk to a newer slurmctld: these wrappers run
            # the root's scontrol, sbatch, srun... (see _write_slurm_wrappers).
            env["PATH"] = f"{self.layout.slurm_bin}:{env['PATH']}"
        return env

    def state(self) -> LabState:
        try:
            return LabState.from_json(self.layout.state_file.read_text())
        except FileNotFoundError:
            raise LabError(f"no lab at {self.root}: run `medic lab up --dir {self.root}`") from None

    def node_names(self) -> list[str]:
        return self.state().spec.node_names()

    def node(self, name: str) -> NodeLayout:
        if name not in self.node_names():
            raise LabError(
                f"no node {name!r} in the lab at {self.root}; nodes: {', '.join(self.node_names())}"
            )
        return self.layout.node(name)

    def save_state(self, state: LabState) -> None:
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(state.to_json())
        tmp.replace(self.layout.state_file)

    def daemon_env(self) -> dict[str, str]:
        env = {"PATH": SYSTEM_PATH, "HOME": str(self.root), "LANG": "C.UTF-8"}
        env.update(self.env())
        return env

    # ---- Slurm's client -----------------------------------------------------------------

    def slurm(
        self, argv: list[str], *, timeout: float = CMD_TIMEOUT, check: bool = True
    ) -> proc.CommandResult:
        """Run a Slurm client command against this lab."""
        return proc.run(argv, timeout=timeout, env=self.process_env(), check=check)

    def export_lines(self) -> list[str]:
        """Shell lines that point a terminal at this lab (printed by `up`, kept in env.sh)."""
        lines = [f"export {key}={shlex.quote(value)}" for key, value in self.env().items()]
        path = [str(self.venv_bin)]
        if self.release() != HOST_RELEASE:  # the root's Slurm client; the host's Medic
            path = [str(self.layout.slurm_bin), str(Path(sys.executable).parent)]
        lines.append(f'export PATH={shlex.quote(":".join(path))}:"$PATH"')
        return lines

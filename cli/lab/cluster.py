"""Bring a lab cluster up and down: munged, slurmctld and one slurmd per node, on loopback,
without systemd. Every daemon runs in the foreground (-D/-F) in its own session; we keep
their PIDs and tear down by PID, never by process name.

The same class serves `medic lab`, the pytest fixtures, the demo and the benchmarks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cli.lab import scenario as scenario_mod
from cli.lab.debian_root import HOST_RELEASE, MARKER, REPO, SHARED_DIRS, DebianRoot, RootError
from cli.lab.host_setup import DAEMONS, ensure_packages, free_port_block, make_gpu_devices
from cli.lab.host_setup import SYSTEM_PATH as SYSTEM_PATH
from cli.lab.layout import LabLayout, NodeLayout
from cli.lab.processes import LabError as LabError
from cli.lab.processes import health_check_running, read_pid, tagged_pids, terminate, write_script
from cli.lab.processes import pid_alive as pid_alive
from cli.lab.processes import process_start as process_start
from cli.lab.processes import slack as slack
from cli.lab.processes import wait_for as wait_for
from cli.lab.slurm_conf import (
    LabPorts,
    LabSpec,
    render_gres_conf,
    render_medic_conf,
    render_slurm_conf,
)
from medic_core import proc
from medic_core import slurm as slurm_json
from slurm_hooks.native import build as native_build

HOOKS = ("medic-prolog", "medic-epilog", "medic-healthcheck")
# The Slurm client commands a lab on a Debian root wraps for host-side callers.
SLURM_CLIENTS = (
    "scontrol", "squeue", "sinfo", "sbatch", "srun", "salloc", "scancel", "sacct", "sacctmgr",
    "sprio", "sshare", "sstat", "sattach", "sdiag", "sreport", "strigger",
)  # fmt: skip
# Every process the lab starts carries this variable; `down` sweeps stragglers by it
# (slurmstepd and job processes inherit it from slurmd and the submitting shell).
LAB_TAG_ENV = "MEDIC_LAB_ROOT"
CMD_TIMEOUT = 15.0
ACTIVE_JOB_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)


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


@dataclass(frozen=True)
class NodeStatus:
    name: str
    state: str
    flags: tuple[str, ...]
    reason: str
    slurmd_pid: int | None
    gpus: int

    @property
    def is_idle(self) -> bool:
        return self.state == "IDLE" and not self.flags


@dataclass
class LabStatus:
    root: Path
    running: bool
    nodes: list[NodeStatus] = field(default_factory=list)


SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un.sun_path, NUL excluded)


def _enter_root_lines(root: DebianRoot, program: str) -> str:
    """Shell lines that, outside `root`, run `program` "$@" inside it, in the caller's
    directory (/ if the root has no such directory); inside it they do nothing."""
    return (
        f"if [ ! -e {MARKER} ]; then\n"
        f'  wd="$PWD"; [ -d "{root.path}$wd" ] || wd=/\n'
        f'  exec unshare --root="{root.path}" --wd="$wd" {program} "$@"\n'
        "fi\n"
    )


class Lab:
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

    # ---- up ----------------------------------------------------------------------------

    def up(
        self, spec: LabSpec | None = None, timeout: float = 30.0, sandbox_unit: Path | None = None
    ) -> LabState:
        """Start the lab; with `sandbox_unit` in production mode (cli/lab/production.py):
        each daemon in that unit's sandbox, each node with the default store of its own."""
        spec = spec or LabSpec()
        self._release = spec.slurm
        if self.layout.state_file.exists() and self.is_running():
            raise LabError(
                f"a lab is already running at {self.root}: `medic lab down --dir {self.root}` first"
            )
        started = time.monotonic()
        # slurmstepd listens on <spool>/<node>_<job>.<step>: a Unix socket path, at most 107
        # bytes; past it every job fails to start ("Unix socket name exceeded maximum length").
        longest = max(len(str(self.layout.node(n).spool)) for n in spec.node_names())
        if longest + len("/n99_4294967294.4294967294") > SUN_PATH_MAX:
            raise LabError(
                f"{self.root} is too long for slurmstepd's sockets ({longest} bytes to a node's"
                f" spool, at most {SUN_PATH_MAX - 26}): use a shorter --dir, e.g. under /tmp"
            )
        root = self.debian_root()
        if root is None:
            ensure_packages()
        else:
            try:
                root.acquire(self.root)
            except RootError as exc:
                raise LabError(f"Slurm {spec.slurm}: {exc}") from None
            self.venv_bin = root.venv_bin
        host = socket.gethostname().split(".")[0]
        # Several labs may start at once on one host (test workers, the demo): one at a time
        # picks a free block of loopback ports and has its daemons bind them.
        ports_lock = open(Path(tempfile.gettempdir()) / "medic-lab-ports.lock", "a")  # noqa: SIM115
        fcntl.flock(ports_lock, fcntl.LOCK_EX)
        ports = LabPorts(slurmctld=free_port_block(spec.nodes + 1), slurmd_first=0)
        ports = LabPorts(slurmctld=ports.slurmctld, slurmd_first=ports.slurmctld + 1)
        state = LabState(
            spec=spec,
            ports=ports,
            host=host,
            venv_bin=str(self.venv_bin),
            started_at=time.time(),
            sandbox_unit=str(sandbox_unit or ""),
        )
        try:
            self._write_files(state)
            state.munged_pid = self._start_munged()
            self._save(state)
            state.slurmctld_pid = self._start_slurmctld()
            self._save(state)
            for name in spec.node_names():
                self.start_slurmd(name)
            ports_lock.close()  # the daemons hold their ports now
            wait_for(
                "all lab nodes to be IDLE",
                lambda: all(n.is_idle for n in self.nodes()),
                timeout,
            )
        except BaseException:
            ports_lock.close()
            self.down()
            raise
        state.up_seconds = time.monotonic() - started
        self._save(state)
        return state

    def _save(self, state: LabState) -> None:
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(state.to_json())
        tmp.replace(self.layout.state_file)

    def _write_files(self, state: LabState) -> None:
        from cli.lab.nvml.build import build_library
        from healthd.fixtures import write_host_tree
        from slurm_hooks.spank import build as spank_build

        layout = self.layout
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
        self._save(state)
        layout.slurm_conf.write_text(render_slurm_conf(state.spec, layout, state.ports, state.host))
        (layout.etc / "gres.conf").write_text(render_gres_conf(state.spec, layout))
        layout.medic_conf.write_text(
            render_medic_conf(
                layout, str(self.venv_bin / "python"), shared_store=not state.sandbox_unit
            )
        )
        self._write_wrappers()
        build_library(layout.lib_dir)
        include_dir = spank_build.INCLUDE_DIR
        root = self.debian_root()
        if root is not None:  # the plugin must carry the lab's Slurm version, not the host's
            include_dir = layout.lib_dir / "include"
            include_dir.mkdir(exist_ok=True)
            headers = include_dir / "slurm"
            headers.unlink(missing_ok=True)
            headers.symlink_to(root.path / "usr/include/slurm")
            self._write_slurm_wrappers(root)
        plugin = spank_build.build_plugin(layout.lib_dir, include_dir)
        native_build.build_hook(layout.lib_dir, self.venv_bin / "medic-prolog")
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
        layout.env_file.write_text("\n".join(self.export_lines()) + "\n")

    def _write_wrappers(self) -> None:
        """Hook scripts named in slurm.conf. Slurm runs hooks with no PATH and nothing of
        slurmd's environment, so the wrapper supplies the lab's config and NVML library;
        in production slurm.conf names the console scripts directly."""
        exports = "".join(f"export {k}='{v}'\n" for k, v in self.env().items())
        root = self.debian_root()
        # Run from the host (a test, an operator trying a hook), it enters the root first.
        enter = _enter_root_lines(root, '"$0"') if root is not None else ""
        header = (
            f"#!/bin/sh\n# Written by `medic lab up`.\n{enter}"
            f"export PATH='{SYSTEM_PATH}'\n{exports}"
        )
        # The Prolog and Epilog go through the compiled front, as on a production node; it
        # finds this node's daemon from SLURMD_NODENAME, the one variable every hook gets.
        node_dir = self.layout.node_template().replace("{node}", "${SLURMD_NODENAME}")
        front = self.layout.lib_dir / native_build.BINARY_NAME
        fast = f'{header}export MEDIC_SOCKET="{node_dir}/healthd.sock"\nexec "{front}" "$@"\n'
        for hook in HOOKS:
            direct = f'{header}exec "{self.venv_bin / hook}" "$@"\n'
            text = fast if hook in ("medic-prolog", "medic-epilog") else direct
            write_script(self.layout.bin_dir / hook, text)
        python = self.venv_bin / "python"
        reboot = f'{header}exec "{python}" -m cli.lab.reboot --lab-root "{self.root}"\n'
        write_script(self.layout.bin_dir / "medic-lab-reboot", reboot)
        # Stand-ins for deep-tier tools, found through [checks.*] search_dirs (docs/lab.md).
        self.layout.tools_dir.mkdir(parents=True, exist_ok=True)
        dcgmi = f'{header}exec "{python}" -m cli.lab.dcgmi "$@"\n'
        write_script(self.layout.tools_dir / "dcgmi", dcgmi)

    def _write_slurm_wrappers(self, root: DebianRoot) -> None:
        """<lab>/slurm-bin/<client>: the root's Slurm client run inside the root, in the
        caller's directory (/ if the root has no such directory)."""
        self.layout.slurm_bin.mkdir(parents=True, exist_ok=True)
        for name in SLURM_CLIENTS:
            write_script(
                self.layout.slurm_bin / name,
                "#!/bin/sh\n# Written by `medic lab up`.\n"
                f"{_enter_root_lines(root, f'/usr/bin/{name}')}"
                f'exec /usr/bin/{name} "$@"\n',
            )

    def _daemon_env(self) -> dict[str, str]:
        env = {"PATH": SYSTEM_PATH, "HOME": str(self.root), "LANG": "C.UTF-8"}
        env.update(self.env())
        return env

    def _start_munged(self) -> int:
        m = self.layout.munge_dir
        pid = proc.spawn(
            self.in_root(
                [
                    DAEMONS["munged"],
                    "-F",
                    "--force",
                    f"--key-file={m / 'munge.key'}",
                    f"--socket={self.layout.munge_socket}",
                    f"--pid-file={m / 'munged.pid'}",
                    f"--log-file={m / 'munged.log'}",
                    f"--seed-file={m / 'munged.seed'}",
                ]
            ),
            log_path=m / "munged.out",
            env=self._daemon_env(),
        )

        def answers() -> bool:
            if not pid_alive(pid):
                raise LabError(f"munged exited: see {self.layout.munge_dir / 'munged.log'}")
            return self.layout.munge_socket.exists()

        wait_for("munged", answers, 10)
        return pid

    def _start_slurmctld(self) -> int:
        pid = proc.spawn(
            self.in_root([DAEMONS["slurmctld"], "-D", "-i", "-f", str(self.layout.slurm_conf)]),
            log_path=self.layout.ctld_dir / "slurmctld.out",
            env=self._daemon_env(),
        )

        def ready() -> bool:
            if not pid_alive(pid):
                raise LabError(f"slurmctld exited: see {self.layout.ctld_dir / 'slurmctld.log'}")
            return "is UP" in self.slurm(["scontrol", "ping"], check=False).stdout

        wait_for("slurmctld to answer", ready, 15, interval=0.1)
        return pid

    def stop_slurmctld(self, timeout: float = 15.0) -> None:
        """Stop the controller (an outage: the nodes' slurmd and the jobs go on); it saves
        its state, so `start_slurmctld` brings it back with every job and node state."""
        state = self.state()
        if pid_alive(state.slurmctld_pid):
            terminate([state.slurmctld_pid], timeout)

    def start_slurmctld(self) -> int:
        """Start the controller again after `stop_slurmctld`; waits until it answers."""
        state = self.state()
        if pid_alive(state.slurmctld_pid):
            return state.slurmctld_pid
        state.slurmctld_pid = self._start_slurmctld()
        self._save(state)
        return state.slurmctld_pid

    def start_slurmd(self, name: str, rebooted: bool = False) -> int:
        """Start one node's slurmd; `rebooted` reports a completed reboot to slurmctld (-b)."""
        node = self.layout.node(name)
        node.slurmd_pid.unlink(missing_ok=True)
        argv = [DAEMONS["slurmd"], "-D", "-N", name, "-f", str(self.layout.slurm_conf)]
        if rebooted:
            argv.insert(1, "-b")
        pid = proc.spawn(
            self.in_root(argv), log_path=node.dir / "slurmd.out", env=self._daemon_env()
        )
        return pid

    # ---- healthd -----------------------------------------------------------------------

    def start_healthd(self, name: str, config: Path | None = None, timeout: float = 20.0) -> int:
        """Start the node's `medic-healthd` (as systemd would on a real node) and wait until
        its socket answers; `config` replaces the lab's medic.toml for this daemon."""
        from medic_core.api import HealthdUnavailable, ask

        node = self.node(name)
        self.stop_healthd(name)
        from cli.lab.production import UNIT, unit_environment

        state = self.state()
        # The shipped unit's Environment= (PYTHONUNBUFFERED, MALLOC_ARENA_MAX), as systemd
        # gives it on a node.
        env = {**unit_environment(Path(state.sandbox_unit or UNIT)), **self._daemon_env()}
        env["MEDIC_NODE_NAME"] = name
        if config is not None:
            env["MEDIC_CONFIG"] = str(config)
        argv = [str(Path(state.venv_bin) / "medic-healthd")]
        if state.sandbox_unit:  # as systemd starts it: in the unit's sandbox
            from cli.lab.production import sandbox_argv

            # The unit's ReadWritePaths= (/var/lib/medic, /run/medic) here: the node's own
            # directory and the jobs' heartbeats (on a node /run/medic/progress).
            writable = [node.dir, self.layout.progress_dir]
            for path in writable:
                path.mkdir(parents=True, exist_ok=True)
            prefix, sandbox_env = sandbox_argv(writable, Path(state.sandbox_unit))
            if self.release() != HOST_RELEASE:  # what a Debian root shares: read-only too
                sandbox_env["MEDIC_LAB_READONLY"] = " ".join(map(str, (*SHARED_DIRS, REPO)))
            argv, env = [*prefix, *argv], {**env, **sandbox_env}
        pid = proc.spawn(self.in_root(argv), log_path=node.healthd_log, env=env)
        node.healthd_pid.write_text(f"{pid}\n")

        def answers() -> bool:
            if not pid_alive(pid):
                raise LabError(f"medic-healthd on {name} exited: see {node.healthd_log}")
            try:  # serving its socket, and its watchers and ladder started ("ready")
                reply = ask(node.socket, {"op": "ping"}, timeout=1.0)
            except HealthdUnavailable:
                return False
            return bool(reply["pid"] == pid and reply.get("ready", True))

        wait_for(f"medic-healthd on {name}", answers, timeout, interval=0.05)
        return pid

    def stop_healthd(self, name: str, timeout: float = 10.0) -> None:
        node = self.layout.node(name)
        pid = read_pid(node.healthd_pid)
        if pid and pid_alive(pid):
            terminate([pid], timeout)
        node.healthd_pid.unlink(missing_ok=True)

    def healthd_pids(self) -> dict[str, int]:
        running = {}
        for name in self.node_names():
            pid = read_pid(self.layout.node(name).healthd_pid)
            if pid and pid_alive(pid):
                running[name] = pid
        return running

    # ---- slurm -------------------------------------------------------------------------

    def slurm(
        self, argv: list[str], *, timeout: float = CMD_TIMEOUT, check: bool = True
    ) -> proc.CommandResult:
        """Run a Slurm client command against this lab."""
        return proc.run(argv, timeout=timeout, env=self.process_env(), check=check)

    def sinfo_nodes(self) -> list[dict[str, Any]]:
        """Every node's record as 22.05's `sinfo --json` prints it. From 23.11 `sinfo --json`
        groups nodes, so newer releases are read from `scontrol show nodes --json` and given
        22.05's shape: `state` one lower-case word, `state_flags` the rest, plain numbers."""
        if self.release() == HOST_RELEASE:
            out = self.slurm(["sinfo", "--json"]).stdout
            nodes: list[dict[str, Any]] = json.loads(out)["nodes"]
            return nodes
        what = "scontrol show nodes --json"
        text = self.slurm(["scontrol", "show", "nodes", "--json"]).stdout
        raw = {str(n.get("name")): n for n in json.loads(text)["nodes"]}
        return [
            {
                **raw[info.name],
                "state": info.state.lower(),
                "state_flags": sorted(info.flags),
                "reason_changed_at": info.reason_time,
                "boot_time": info.boot_time,
            }
            for info in slurm_json.parse_nodes(text, what)
        ]

    def active_jobs(self) -> list[dict[str, Any]]:
        """Jobs not yet finished (squeue --json also lists finished ones until MinJobAge),
        `job_state` one word as in 22.05 (newer releases print a list: base state, flags)."""
        text = self.slurm(["squeue", "--json"]).stdout
        jobs: list[dict[str, Any]] = json.loads(text)["jobs"]
        if self.release() != HOST_RELEASE:
            states = {j.job_id: j.state for j in slurm_json.parse_jobs(text)}
            jobs = [{**j, "job_state": states.get(str(j.get("job_id")), "")} for j in jobs]
        return [j for j in jobs if j["job_state"] in ACTIVE_JOB_STATES]

    def nodes(self) -> list[NodeStatus]:
        state = self.state()
        result = []
        for raw in sorted(
            self.sinfo_nodes(), key=lambda n: int(n["name"][len(state.spec.node_prefix) :])
        ):
            name = raw["name"]
            layout = self.layout.node(name)
            pid = read_pid(layout.slurmd_pid)
            result.append(
                NodeStatus(
                    name=name,
                    state=str(raw["state"]).upper(),
                    flags=tuple(raw.get("state_flags", [])),
                    reason=raw.get("reason", "") or "",
                    slurmd_pid=pid if pid and pid_alive(pid) else None,
                    gpus=len(scenario_mod.read_scenario(layout.scenario).present_gpus()),
                )
            )
        return result

    def status(self) -> LabStatus:
        if not self.layout.state_file.exists():
            return LabStatus(self.root, running=False)
        running = self.is_running()
        return LabStatus(self.root, running=running, nodes=self.nodes() if running else [])

    def is_running(self) -> bool:
        try:
            state = self.state()
        except (LabError, ValueError, KeyError):
            return False
        return pid_alive(state.slurmctld_pid) and pid_alive(state.munged_pid)

    # ---- down --------------------------------------------------------------------------

    def daemon_pids(self) -> list[int]:
        pids: list[int] = []
        try:
            state = self.state()
        except LabError:
            return pids
        for name in state.spec.node_names():
            for pid_file in (self.layout.node(name).slurmd_pid, self.layout.node(name).healthd_pid):
                pid = read_pid(pid_file)
                if pid:
                    pids.append(pid)
        pids += [state.slurmctld_pid, state.munged_pid]
        return [p for p in pids if p > 0]

    def tagged_pids(self) -> list[int]:
        """Processes (slurmstepd, job tasks, stray daemons) carrying this lab's tag, and on
        a Debian root those in it that hold a file of this lab (cli.lab.processes)."""
        return tagged_pids(self.root, LAB_TAG_ENV, self.debian_root())

    def down(self, timeout: float = 15.0) -> None:
        """Cancel jobs, stop every daemon by PID, then sweep anything left with our tag."""
        if self.is_running():
            self.slurm(
                [
                    "scancel",
                    "--full",
                    "--quiet",
                    "--state=RUNNING,PENDING,SUSPENDED",
                    "--user=root",
                ],
                check=False,
            )
        terminate(self.daemon_pids(), timeout)
        terminate(self.tagged_pids(), timeout)
        self.layout.munge_socket.unlink(missing_ok=True)
        root = self.debian_root()
        if root is not None:  # the last lab using the root unmounts it
            try:
                root.release_use(self.root)
            except RootError as exc:
                raise LabError(f"Slurm {self.release()}: {exc}") from None

    # ---- nodes -------------------------------------------------------------------------

    def reboot_node(self, name: str, slurmd_pid: int | None = None, timeout: float = 15.0) -> int:
        """Simulated reboot: stop the node's slurmd, apply what a reboot clears to its GPUs,
        and start slurmd with -b so slurmctld sees the reboot complete."""
        node = self.node(name)
        had_healthd = name in self.healthd_pids()
        if had_healthd:  # a reboot stops every service; its memory (buffered XIDs) is gone
            self.stop_healthd(name)
        pid = slurmd_pid or read_pid(node.slurmd_pid)
        if pid:
            terminate([pid], timeout)
        before = scenario_mod.read_scenario(node.scenario)
        kmsg = node.host_root / "dev/kmsg"
        kmsg.write_text("")  # a new boot starts a new kernel ring buffer
        scenario_mod.publish(node.scenario, kmsg, before, scenario_mod.reboot(before))
        boot_id = node.host_root / "proc/sys/kernel/random/boot_id"
        boot_id.parent.mkdir(parents=True, exist_ok=True)
        boot_id.write_text(f"{uuid.uuid4()}\n")
        if slurmd_pid is not None:  # asked by slurmctld (RebootProgram), not by `medic lab`
            self._after_reboot_stamp(name)
        slurmd = self.start_slurmd(name, rebooted=True)
        if had_healthd:
            self.start_healthd(name)
        return slurmd

    def _after_reboot_stamp(self, name: str, timeout: float = 5.0) -> None:
        """slurmctld takes a node as rebooted only if slurmd's boot time (whole seconds) is
        later than the time it stamped on "reboot issued"; a simulated reboot can be quicker
        than that second. Wait for the stamp, then for the clock to pass it."""

        def stamp() -> int:
            raw = next((n for n in self.sinfo_nodes() if n["name"] == name), {})
            issued = str(raw.get("reason", "")).endswith("reboot issued")
            return int(raw.get("reason_changed_at") or 0) if issued else 0

        with contextlib.suppress(LabError):
            wait_for("slurmctld to stamp the reboot", lambda: stamp() > 0, timeout, 0.05)
        issued = stamp() or int(time.time())
        wait_for("the clock to pass that second", lambda: time.time() >= issued + 1, 2.0, 0.02)

    def inject(self, name: str, gpu: int | None, specs: list[str]) -> None:
        node = self.node(name)
        before = current = scenario_mod.read_scenario(node.scenario)
        for spec in specs:
            current = scenario_mod.inject(current, gpu, spec)
        scenario_mod.publish(node.scenario, node.host_root / "dev/kmsg", before, current)

    def reset(self, timeout: float = 20.0) -> None:
        """Back to a clean lab between tests: no jobs, fresh GPUs and host trees, all IDLE."""
        from healthd.fixtures import write_host_tree

        state = self.state()
        self.slurm(["scancel", "--full", "--quiet", "--user=root"], check=False)
        for name in self.healthd_pids():
            self.stop_healthd(name)
        self.delete_reservations()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.layout.store_db}{suffix}").unlink(missing_ok=True)
        for name in state.spec.node_names():
            node = self.layout.node(name)
            scenario_mod.write_scenario(
                node.scenario, scenario_mod.default_scenario(name, state.spec.gpus_per_node)
            )
            shutil.rmtree(node.host_root, ignore_errors=True)
            write_host_tree(node.host_root)
            make_gpu_devices(node.host_root / "dev", state.spec.gpus_per_node)
            shutil.rmtree(node.state_dir, ignore_errors=True)
            node.state_dir.mkdir(parents=True)
            pid = read_pid(node.slurmd_pid)
            if not (pid and pid_alive(pid)):
                self.start_slurmd(name)

        def settled() -> bool:
            # A HealthCheckProgram that read the host trees while they were rewritten finds
            # the node broken and drains it with Medic's reason after this resumed it; with
            # no daemon to give it back, the next test's fault met the drain cap (a CI run
            # waited 480 s). Settled only once none is running, its drains resumed below.
            if health_check_running(self.tagged_pids()):
                return False
            active = [str(j["job_id"]) for j in self.active_jobs()]
            if active:  # e.g. requeued by a hook while the first scancel ran
                self.slurm(["scancel", "--quiet", *active], check=False)
                return False
            nodes = self.nodes()
            if any("RESERVED" in n.flags for n in nodes):  # its job was still completing
                self.delete_reservations()
                return False
            for n in nodes:
                if not n.is_idle and n.state not in ("ALLOCATED", "MIXED", "COMPLETING"):
                    self.slurm(
                        ["scontrol", "update", f"nodename={n.name}", "state=resume"], check=False
                    )
            return all(n.is_idle for n in nodes)

        try:
            wait_for("lab nodes to return to IDLE", settled, timeout, interval=0.1)
        except LabError as exc:
            jobs = [(j["job_id"], j["job_state"]) for j in self.active_jobs()]
            nodes = [(n.name, n.state, n.flags, n.reason) for n in self.nodes()]
            raise LabError(f"{exc}: jobs {jobs}, nodes {nodes}") from None

    def delete_reservations(self) -> None:
        """Every reservation a test left (a sweep's, the spares pool, a job's spare): a
        reserved node is IDLE+RESERVED and no other test's job may land there."""
        shown = self.slurm(["scontrol", "-o", "show", "reservation"], check=False).stdout
        for name in re.findall(r"^ReservationName=(\S+)", shown, flags=re.MULTILINE):
            self.slurm(["scontrol", "delete", f"reservationname={name}"], check=False)

    def export_lines(self) -> list[str]:
        """Shell lines that point a terminal at this lab (printed by `up`, kept in env.sh)."""
        lines = [f"export {key}={shlex.quote(value)}" for key, value in self.env().items()]
        path = [str(self.venv_bin)]
        if self.release() != HOST_RELEASE:  # the root's Slurm client; the host's Medic
            path = [str(self.layout.slurm_bin), str(Path(sys.executable).parent)]
        lines.append(f'export PATH={shlex.quote(":".join(path))}:"$PATH"')
        return lines

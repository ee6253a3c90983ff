"""Bring a lab cluster up and down: munged, slurmctld and one slurmd per node, on loopback,
without systemd. Every daemon runs in the foreground (-D/-F) in its own session; we keep
their PIDs and tear down by PID, never by process name.

The same class serves `medic lab`, the pytest fixtures, the demo and the benchmarks. `Lab`
is the lab's processes and what happens to its nodes (up, down, daemons, medic-healthd,
reboots, injections, reset between tests); it stands on cli.lab.lab_slurm.LabSlurmView
(what Slurm shows of it), on cli.lab.lab_env.LabEnvironment (where it is, how a process
talks to it), and `up` writes its files with cli.lab.lab_files.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

from cli.lab import scenario as scenario_mod
from cli.lab.debian_root import HOST_RELEASE, REPO, SHARED_DIRS, RootError
from cli.lab.host_setup import DAEMONS, ensure_packages, free_port_block, make_gpu_devices
from cli.lab.host_setup import SYSTEM_PATH as SYSTEM_PATH
from cli.lab.lab_env import LAB_TAG_ENV, LabState
from cli.lab.lab_files import write_files
from cli.lab.lab_slurm import LabSlurmView
from cli.lab.processes import LabError as LabError
from cli.lab.processes import health_check_running, read_pid, tagged_pids, terminate
from cli.lab.processes import pid_alive as pid_alive
from cli.lab.processes import process_start as process_start
from cli.lab.processes import slack as slack
from cli.lab.processes import wait_for as wait_for
from cli.lab.slurm_conf import LabPorts, LabSpec
from medic_core import proc

SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un.sun_path, NUL excluded)


class Lab(LabSlurmView):
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
            write_files(self, state)
            state.munged_pid = self._start_munged()
            self.save_state(state)
            state.slurmctld_pid = self._start_slurmctld()
            self.save_state(state)
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
        self.save_state(state)
        return state

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
            env=self.daemon_env(),
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
            env=self.daemon_env(),
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
        self.save_state(state)
        return state.slurmctld_pid

    def start_slurmd(self, name: str, rebooted: bool = False) -> int:
        """Start one node's slurmd; `rebooted` reports a completed reboot to slurmctld (-b)."""
        node = self.layout.node(name)
        node.slurmd_pid.unlink(missing_ok=True)
        argv = [DAEMONS["slurmd"], "-D", "-N", name, "-f", str(self.layout.slurm_conf)]
        if rebooted:
            argv.insert(1, "-b")
        pid = proc.spawn(
            self.in_root(argv), log_path=node.dir / "slurmd.out", env=self.daemon_env()
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
        env = {**unit_environment(Path(state.sandbox_unit or UNIT)), **self.daemon_env()}
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

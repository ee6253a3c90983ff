"""CliSlurm: the SlurmClient over Slurm's commands. It reads the node table with `sinfo
--json` (from 23.11, which groups nodes by state there, `scontrol show nodes --json`), one node
with `scontrol -o show node NAME`, jobs with `squeue --json`, and writes through `scontrol`;
every call is an argv list through medic_core.proc with a timeout, and a failure raises
SlurmError carrying Slurm's own one-line message.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from medic_core import proc
from medic_core.slurm_clock import parse_sdiag_time
from medic_core.slurm_json import layout_of, load_document, parse_jobs, parse_nodes
from medic_core.slurm_node_line import SCONTROL_ENV, parse_scontrol_node
from medic_core.slurm_types import FINAL_JOB_STATES, NEXT_STATES, JobInfo, NodeInfo, SlurmError

log = logging.getLogger("medic.slurm")
DEFAULT_BIN_DIRS = (Path("/usr/bin"), Path("/usr/local/bin"), Path("/opt/slurm/bin"))
# ':'-separated directories searched before DEFAULT_BIN_DIRS (cli/lab/debian_root.py's).
BIN_DIRS_ENV = "MEDIC_SLURM_BIN"
DEFAULT_TIMEOUT = 15.0


def _holds(job: JobInfo, node: str) -> bool:
    """`node` is in the job's host list; a list Medic cannot read is logged, not raised."""
    if job.nodes == node:
        return True
    try:
        return node in job.node_names
    except ValueError as exc:
        log.warning("job %s: host list %r unreadable (%s); not counted", job.job_id, job.nodes, exc)
        return False


class CliSlurm:
    """`SlurmClient` over Slurm's commands. Hooks get no PATH: binaries are looked up in
    `bin_dirs`. `env` is the whole environment of every command (HealthCheckProgram gets no
    SLURM_CONF: the caller puts it there); None inherits this process's environment."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        bin_dirs: Iterable[Path] | None = None,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.timeout = timeout
        first = [Path(d) for d in os.environ.get(BIN_DIRS_ENV, "").split(":") if d]
        self.bin_dirs = tuple(Path(d) for d in (bin_dirs or (*first, *DEFAULT_BIN_DIRS)))
        self._binaries: dict[str, str] = {}
        # From 23.11 `sinfo --json` groups nodes by state; we then ask scontrol instead.
        self._nodes_from_scontrol = False

    def _binary(self, name: str) -> str:
        if name not in self._binaries:
            for directory in self.bin_dirs:
                candidate = directory / name
                if candidate.is_file() and os.access(candidate, os.X_OK):
                    self._binaries[name] = str(candidate)
                    break
            else:
                where = ", ".join(str(d) for d in self.bin_dirs)
                raise SlurmError(
                    f"{name} not found in {where}: install slurm-client or set bin_dirs"
                )
        return self._binaries[name]

    def _run(self, name: str, *args: str) -> str:
        result = proc.run([self._binary(name), *args], timeout=self.timeout, env=self.env)
        if not result.ok:
            raise self._failure(f"{name} {' '.join(args[:4])}", result)
        return result.stdout

    @staticmethod
    def _failure(what: str, result: proc.CommandResult) -> SlurmError:
        detail = result.describe_failure()
        last = result.stderr.strip().splitlines()
        if result.timed_out and last:  # e.g. a missing SLURM_CONF is retried for 60 s
            detail += f"; last said: {last[-1]}"
        return SlurmError(f"{what}: {detail}")

    def nodes(self) -> list[NodeInfo]:
        if self._nodes_from_scontrol:
            return parse_nodes(self._run("scontrol", "show", "nodes", "--json"), "scontrol --json")
        text = self._run("sinfo", "--json")
        doc = load_document(text, "sinfo --json")
        if "nodes" not in doc and "sinfo" in doc:
            layout_of(doc, "sinfo --json")
            self._nodes_from_scontrol = True
            return self.nodes()
        return parse_nodes(text, "sinfo --json")

    def node(self, name: str) -> NodeInfo | None:
        # `scontrol -o -d show node NAME`: 22.05's `sinfo --json` ignores -n and there is no
        # `scontrol --json` before 23.02. -d adds GresUsed; SLURM_TIME_FORMAT=%s makes times
        # epoch seconds. NOTE: scontrol still asks slurmctld for the whole node table
        # (REQUEST_NODE_INFO) and picks the node itself: the saving is the JSON of every
        # node that sinfo would render and we would parse, not slurmctld's RPC
        # (docs/slurm-client.md has the numbers).
        if not name or name.startswith("-") or any(c in name for c in " \t\n,[]"):
            return None  # not one node's name: a host list or an option, never one record
        argv = ["-o", "-d", "show", "node", name]
        result = proc.run(
            [self._binary("scontrol"), *argv],
            timeout=self.timeout,
            env={**self.env, **SCONTROL_ENV},
        )
        if result.returncode == 1 and result.stdout.strip() == f"Node {name} not found":
            return None
        if not result.ok:
            raise self._failure(f"scontrol show node {name}", result)
        return parse_scontrol_node(result.stdout, name)

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]:
        # 22.05's `squeue --json` ignores --jobs and --nodelist (it prints every job), and
        # newer releases fail on an unknown id: filter here instead.
        found = parse_jobs(self._run("squeue", "--json"))
        if ids is None:
            return found
        wanted = {str(i) for i in ids}
        return [j for j in found if j.job_id in wanted]

    def jobs_on(self, node: str) -> list[JobInfo]:
        return [
            j
            for j in self.jobs()
            if j.state not in FINAL_JOB_STATES and j.state != "PENDING" and _holds(j, node)
        ]

    def drain(self, node: str, reason: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=resume")

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        if nextstate.upper() not in NEXT_STATES:
            raise ValueError(f"nextstate must be one of {', '.join(NEXT_STATES)}: {nextstate!r}")
        self._run(
            "scontrol", "reboot", "ASAP", f"nextstate={nextstate.upper()}", f"reason={reason}", node
        )

    def requeue(self, job_id: str) -> None:
        self._run("scontrol", "requeue", job_id)

    def release(self, job_id: str) -> None:
        self._run("scontrol", "release", job_id)

    def hold(self, job_id: str) -> None:
        self._run("scontrol", "hold", job_id)

    def start_now(self, job_id: str) -> None:
        self._run("scontrol", "update", f"jobid={job_id}", "starttime=now")

    def controller_time(self) -> int:
        second = parse_sdiag_time(self._run("sdiag"))
        if second is None:
            raise SlurmError("sdiag printed no 'sdiag output at ... (SECONDS)' line")
        return second

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self._run("scontrol", "update", f"jobid={job_id}", f"admincomment={text}")

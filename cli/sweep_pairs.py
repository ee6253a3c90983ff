"""`medic sweep pair-probe`: one task of a pair job (remediation/sweep/pair_jobs.py), run by
srun on each node of the pair. Runs each pair test's tool and prints one JSON line:
`{"pair_probe": {"node", "rank", "measured", "errors"}}`.

- allreduce: nccl-tests' all_reduce_perf, one rank per node (an MPI build launched by
  srun); rank 0 prints the table, and reports the bus bandwidth at the largest size (the
  lower of out-of-place and in-place), GB/s.
- ib: perftest's ib_write_bw, the server on the pair's first node, the client on the second,
  retried until the server listens (connect_wait); the client reports the average at the
  largest size, Gb/s.

A tool that ran and failed (exit status, no table) reports 0 for its figure, so the pair
fails; a tool not installed reports nothing (the pair is inconclusive, not failed).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Sequence
from typing import Any

from medic_core import proc
from medic_core.config import MedicConfig, node_name
from medic_core.pair_settings import ALLREDUCE, FIGURE, IB, PROBE_KEY, PairSettings

RETRY_PAUSE = 1.0  # seconds between two connection attempts of the IB client


def _tool(argv: Sequence[str], settings: PairSettings, **values: str) -> list[str] | None:
    path = os.pathsep.join([*settings.search_dirs, os.environ.get("PATH", os.defpath)])
    found = shutil.which(argv[0], path=path)
    if found is None:
        return None
    return [found, *(arg.format(**values) for arg in argv[1:])]


def _gpus(config: MedicConfig) -> int:
    on_node = os.environ.get("SLURM_GPUS_ON_NODE", "")
    if on_node.isdigit() and int(on_node) > 0:
        return int(on_node)
    try:
        devices = [p.name for p in config.paths.dev.iterdir() if re.fullmatch(r"nvidia\d+", p.name)]
    except OSError:
        devices = []
    return max(1, len(devices))


def _tail(result: proc.CommandResult) -> str:
    return (result.stderr or result.stdout).strip()[-300:] or result.describe_failure()


class _Probe:
    def __init__(self, config: MedicConfig, settings: PairSettings, nodes: Sequence[str]) -> None:
        self.config = config
        self.settings = settings
        self.nodes = list(nodes)
        self.rank = int(os.environ.get("SLURM_PROCID", "0") or 0)
        self.measured: dict[str, float] = {}
        self.errors: list[str] = []
        self.env = {**os.environ, "MEDIC_PAIR_NODES": ",".join(self.nodes)}

    def _run(self, argv: list[str]) -> proc.CommandResult:
        return proc.run(argv, timeout=self.settings.command_timeout, env=self.env)

    def allreduce(self) -> None:
        from healthd.checks.deep_nccl import parse_all_reduce_perf

        argv = _tool(self.settings.allreduce_command, self.settings, gpus=str(_gpus(self.config)))
        if argv is None:
            self.errors.append(f"{self.settings.allreduce_command[0]} not found")
            return
        result = self._run(argv)
        figure = FIGURE[ALLREDUCE]
        if result.returncode != 0 or result.timed_out:
            self.measured[figure] = 0.0
            self.errors.append(f"all_reduce_perf failed: {_tail(result)}")
            return
        if self.rank != 0:
            return
        try:
            run = parse_all_reduce_perf(result.stdout)
        except ValueError as exc:
            self.measured[figure] = 0.0
            self.errors.append(f"all_reduce_perf: {exc}")
            return
        largest = max(run.samples, key=lambda s: s.size)
        self.measured[figure] = largest.busbw

    def ib(self) -> None:
        from healthd.checks.deep_ib import parse_perftest_bw

        server = self.nodes[0] if self.nodes else ""
        command = self.settings.ib_server_command if self.rank == 0 else None
        command = command or self.settings.ib_client_command
        argv = _tool(command, self.settings, server=server)
        if argv is None:
            self.errors.append(f"{command[0]} not found")
            return
        figure = FIGURE[IB]
        if self.rank == 0:
            result = self._run(argv)
            if result.returncode != 0 or result.timed_out:
                self.measured[figure] = 0.0
                self.errors.append(f"ib_write_bw server failed: {_tail(result)}")
            return
        deadline = time.monotonic() + self.settings.connect_wait
        while True:  # the server may not listen yet
            result = self._run(argv)
            if result.returncode == 0 or time.monotonic() >= deadline or result.timed_out:
                break
            time.sleep(RETRY_PAUSE)
        try:
            if result.returncode != 0 or result.timed_out:
                raise ValueError(_tail(result))
            table = parse_perftest_bw(result.stdout)
        except ValueError as exc:
            self.measured[figure] = 0.0
            self.errors.append(f"ib_write_bw client: {exc}")
            return
        self.measured[figure] = table.gbps(table.largest.bw_average)

    def report(self) -> dict[str, Any]:
        return {
            PROBE_KEY: {
                "node": node_name(),
                "rank": self.rank,
                "measured": self.measured,
                "errors": self.errors,
            }
        }


def pair_probe(config: MedicConfig, tests: Sequence[str], nodes: Sequence[str]) -> dict[str, Any]:
    settings = PairSettings.from_config(config)
    probe = _Probe(config, settings, nodes)
    for test in tests or settings.tests:
        if test == ALLREDUCE:
            probe.allreduce()
        elif test == IB:
            probe.ib()
    return probe.report()

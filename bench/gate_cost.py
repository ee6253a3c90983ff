"""CPU of the launch gate's work after the reply, in-process (no socket, no daemon):

* event: one gate event recorded and written (EventRecorder.record, then flush), one at a
  time, as a node starting a job now and then meets it;
* burst: --calls events recorded at once, then one flush (what the writer does with a queue);
* rails: one read of the rails (open RMA tickets, the episode) from the store;
* launch_1s: LaunchGate.launch as the hook asks it (fresh_only, a job id), once a second on a
  virtual clock (no sleeping), each followed by a flush: the reply, the gate event and the
  rails reads it leads to, per launch; with how many rails reads --calls launches made.

CPU is the process's (time.process_time), divided by the calls; the median of --rounds rounds.
Prints one JSON object. Run: .venv/bin/python -m bench.gate_cost [--store-url URL]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from healthd import launch_gate
from healthd.checks.base import CheckContext, ok
from healthd.gate_recorder import EventRecorder
from healthd.launch_gate import LaunchGate
from healthd.runner import Runner
from medic_core.config import MedicConfig, NodePaths
from medic_core.store import Store, open_store


def _event(n: int) -> dict[str, Any]:
    return {
        "kind": "gate",
        "severity": "INFO",
        "source": "prolog",
        "message": f"job {n} allowed (OK)",
        "target": f"job:{n}",
        "evidence": {"job_id": str(n), "allow": True, "status": "OK", "ran": [], "seconds": 0.0},
    }


def _cpu_ms(fn: Callable[[], object], calls: int, rounds: int) -> float:
    per = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        per.append((time.process_time() - start) * 1000 / calls)
    return round(statistics.median(per), 4)


class _Clock:
    """launch_gate's `time`, one second a launch."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store-url", default="", help="default: SQLite in a temporary dir")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="medic-gate-cost-") as tmp:
        root = Path(tmp)
        paths = NodePaths(state_dir=root / "state", socket=root / "run" / "healthd.sock")
        store = open_store(args.store_url or f"sqlite:///{root / 'medic.db'}")
        try:
            out = _measure(store, paths, root, args.calls, args.rounds)
        finally:
            store.close()
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


def _measure(store: Store, paths: NodePaths, root: Path, calls: int, rounds: int) -> dict[str, Any]:
    recorder = EventRecorder(lambda: store, paths, "n1")
    counter = iter(range(10**9))

    def one_at_a_time() -> None:
        for _ in range(calls):
            recorder.record(_event(next(counter)), dt.datetime.now(dt.UTC))
            assert recorder.flush(30)

    def burst() -> None:
        for _ in range(calls):
            recorder.record(_event(next(counter)), dt.datetime.now(dt.UTC))
        assert recorder.flush(60)

    one_at_a_time()  # warm: the writer thread, the connection, the statements
    out: dict[str, Any] = {"benchmark": "gate_cost", "backend": store.backend, "calls": calls}
    out["event_cpu_ms"] = _cpu_ms(one_at_a_time, calls, rounds)
    out["burst_event_cpu_ms"] = _cpu_ms(burst, calls, rounds)
    recorder.close()

    clock = _Clock()
    runner = Runner(CheckContext.for_root(root), specs=[])
    runner.selected = lambda **_: ["gpu_count"]  # type: ignore[method-assign]
    result = ok("gpu_count", "8 GPUs")
    host = SimpleNamespace(
        node="n1",
        store=store,
        config=MedicConfig(None, "n1", paths),
        settings=SimpleNamespace(launch_max_age=60.0, launch_budget=5.0),
        checks=runner,
        latest=lambda name: (clock.monotonic(), (result,)),
    )
    gate = LaunchGate(host)  # type: ignore[arg-type]
    out["rails_cpu_ms"] = _cpu_ms(lambda: [gate._rails() for _ in range(calls)], calls, rounds)

    reads = [0]
    rails = gate._rails

    def counted() -> Any:
        reads[0] += 1
        return rails()

    gate._rails = counted  # type: ignore[method-assign]
    real_time = launch_gate.time
    launch_gate.time = clock  # type: ignore[assignment]

    def launches() -> None:
        for _ in range(calls):
            clock.now += 1.0
            gate.launch(5.0, fresh_only=True, job_id=str(next(counter)))
            assert gate.recorder.flush(30)

    try:
        launches()  # warm
        reads[0] = 0
        out["launch_1s_cpu_ms"] = _cpu_ms(launches, calls, rounds)
        out["launch_1s_rails_reads_per_launch"] = round(reads[0] / (calls * rounds), 3)
    finally:
        launch_gate.time = real_time  # type: ignore[assignment]
        gate.recorder.close()
    return out


if __name__ == "__main__":
    main()

"""The launch budget, end to end: one key (`[hooks] launch_budget`), one deadline from the
prolog's start, kept by the compiled front, the Python prolog, the daemon's answer and the
inline path (a hung nvmlInit included). Real processes: medic-hook, medic-prolog and a
Python that runs the inline path against the NVML injection library."""

from __future__ import annotations

import json
import os
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab import scenario as sc
from cli.lab.nvml.build import build_library
from healthd.fixtures import write_host_tree
from medic_core import proc
from medic_core.config import load_config
from medic_core.settings import DaemonSettings, HookSettings, deprecations
from slurm_hooks.native.build import build_hook

# Seconds past the budget the prolog may take, whatever happens. The prolog keeps to its
# deadline on a quiet machine within 0.5 s; under the whole suite (six workers, each with a
# lab, on two cores) the interpreter's own start-up alone overran that (5.05 s against a 4 s
# budget seen once): what is proven here is a bound, not the quiet machine's figure, which
# bench.launch_latency measures.
MARGIN = 1.5
VENV_BIN = Path(sys.executable).parent


class HungDaemon:
    """Accepts, reads the request, never answers: a daemon stuck past any budget."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: list[dict[str, object]] = []
        self.release = threading.Event()
        daemon = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                daemon.requests.append(json.loads(self.rfile.readline()))
                daemon.release.wait(30)

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[HungDaemon]:
    daemon = HungDaemon(tmp_path / "healthd.sock")
    yield daemon
    daemon.close()


def write_config(tmp_path: Path, hooks: str, healthd: str = 'gpus = "none"') -> Path:
    root = tmp_path / "host"
    if not root.exists():
        write_host_tree(root)
    path = tmp_path / "medic.toml"
    path.write_text(
        f"""
[node]
host_root = "{root}"
state_dir = "{tmp_path / "state"}"
socket = "{tmp_path / "healthd.sock"}"
[slurm]
conf = "{tmp_path / "no-slurm.conf"}"
[healthd]
{healthd}
# Burn-in off: these tests judge a node in service, not one never burnt in
# (tests/test_burn_in_gate.py).
[remediation.burn_in]
new_node = []
[hooks]
release_held = false
{hooks}
"""
    )
    return path


def hook_env(tmp_path: Path, config: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "MEDIC_CONFIG": str(config),
        "MEDIC_NODE_NAME": "plain1",
        "MEDIC_SOCKET": str(tmp_path / "healthd.sock"),
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURM_JOB_ID": "42",
    }


def timed(argv: list[str], env: dict[str, str]) -> tuple[proc.CommandResult, float]:
    """Run the hook as slurmd would, timed. At a higher priority when root may give it (as
    root's slurmd runs it on a node): these tests share two cores with several test workers
    and lab daemons, and a starved process keeps no deadline (CI saw +0.61 s at 4 s)."""
    if os.geteuid() == 0:
        argv = ["nice", "-n", "-10", *argv]
    begin = time.monotonic()
    done = proc.run(argv, env=env, timeout=60)
    return done, time.monotonic() - begin


# --- one key ----------------------------------------------------------------------------------


def test_hooks_launch_budget_is_the_one_key_and_healthd_s_is_a_deprecated_alias(
    tmp_path: Path,
) -> None:
    both = load_config(write_config(tmp_path, "launch_budget = 4.0", "launch_budget = 7.0"))
    assert HookSettings.from_config(both).launch_budget == 4.0
    assert DaemonSettings.from_config(both).launch_budget == 4.0  # the daemon reads the same
    assert "ignored" in deprecations(both)[0]
    alias = load_config(write_config(tmp_path, "", "launch_budget = 7.0"))
    assert HookSettings.from_config(alias).launch_budget == 7.0
    assert "deprecated" in deprecations(alias)[0]
    clean = load_config(write_config(tmp_path, "launch_budget = 3.0"))
    assert deprecations(clean) == []
    assert DaemonSettings.from_config(clean).launch_budget == 3.0


def test_config_check_warns_about_the_deprecated_key_and_passes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cli.admin import config

    path = write_config(tmp_path, "", "launch_budget = 7.0")
    done = CliRunner().invoke(config, ["check", "--config", str(path)])
    assert done.exit_code == 0, done.output
    assert "warning: [healthd] launch_budget is deprecated" in done.output
    clean = CliRunner().invoke(config, ["check", "--config", str(write_config(tmp_path, ""))])
    assert clean.exit_code == 0 and "deprecated" not in clean.output


# --- the prolog against a daemon hung past the budget -------------------------------------------


# Not below 2 s: Python's start-up and imports, which no clock can cut short, are spent from
# the same budget, and on this loaded 2-core machine they alone took over 1 s (a 1 s budget
# overshot by that in CI, docs/operator-guide.md "The launch budget").
@pytest.mark.parametrize("budget", [2.0, 4.0])
def test_front_and_prolog_return_within_the_budget_with_a_hung_daemon(
    tmp_path: Path, hung: HungDaemon, budget: float
) -> None:
    """The front waits its fixed 0.5 s, the Python prolog judges inline with what is left
    of the same deadline, and recording (the hung daemon again) is left at the deadline."""
    config = write_config(tmp_path, f"launch_budget = {budget}")
    front = build_hook(tmp_path / "bin", prolog=VENV_BIN / "medic-prolog")
    done, took = timed([str(front)], hook_env(tmp_path, config))
    assert done.returncode == 0, done.stderr
    assert took < budget + MARGIN, f"{took:.2f}s against a {budget}s budget"
    # The front also names the job's partition and account (empty: not set in this test),
    # for [hooks] skip_launch_partitions / skip_launch_accounts.
    assert hung.requests[0] == {
        "op": "launch", "fresh_only": True, "job_id": "42", "partition": "", "account": ""
    }  # fmt: skip


def test_without_the_front_a_hung_daemon_is_unknown_at_the_deadline(
    tmp_path: Path, hung: HungDaemon
) -> None:
    """The Python prolog alone asks the daemon for what is left less the reply reserve, and
    a verdict not reached in time is UNKNOWN: on_unknown = "closed" refuses the node."""
    config = write_config(tmp_path, 'launch_budget = 1.0\non_unknown = "closed"')
    # slurmctld answers at once that it cannot drain: the refusal's drain, which may take
    # up to gate.REFUSAL_GRACE past a verdict, is not what this test times.
    slurm_bin = tmp_path / "slurm-bin"
    slurm_bin.mkdir()
    scontrol = slurm_bin / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    env = hook_env(tmp_path, config) | {"MEDIC_SLURM_BIN": str(slurm_bin)}
    done, took = timed([str(VENV_BIN / "medic-prolog")], env)
    assert done.returncode == 1, done.stderr
    assert "no launch verdict within the launch budget" in done.stderr
    assert took < 1.0 + MARGIN + 0.3, f"{took:.2f}s {done.stderr}"  # + interpreter start
    request, *recording = hung.requests
    assert request["op"] == "launch" and request["job_id"] == "42"
    # The gate record is best effort past the deadline: the prolog exits on time, and on a
    # loaded machine it may do so before its recording thread reached the (hung) daemon.
    assert [r["op"] for r in recording] in ([], ["event"])
    # What was left, less the reserve (how much was left is the machine's: a loaded one took
    # 0.66 s of the second to start the prolog's interpreter).
    assert 0.0 < float(request["budget"]) <= 1.0 - 0.2


# --- the inline path with a hung nvmlInit ------------------------------------------------------

INLINE = """
import json, sys, time
from healthd.inline import run_inline
from medic_core.config import load_config
begin = time.monotonic()
verdict = run_inline(load_config(), float(sys.argv[1]))
print(json.dumps({"status": verdict.status.value, "seconds": time.monotonic() - begin,
                  "messages": [f.message for f in verdict.findings]}))
"""


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nvml")
    build_library(out)
    return out


def test_a_hung_nvml_init_inline_is_unknown_within_the_budget(
    tmp_path: Path, nvml_dir: Path
) -> None:
    scenario = tmp_path / "plain1.scenario"
    sc.write_scenario(scenario, sc.inject(sc.default_scenario("plain1"), None, "hang.nvmlInit=60"))
    config = write_config(tmp_path, "launch_budget = 2.0", 'gpus = "required"')
    env = {
        "PATH": "/usr/bin:/bin",
        "MEDIC_CONFIG": str(config),
        "MEDIC_NODE_NAME": "plain1",
        "LD_LIBRARY_PATH": str(nvml_dir),
        "NVML_INJECT_SCENARIO": str(scenario),
    }
    done, took = timed([sys.executable, "-c", INLINE, "2.0"], env)
    assert done.ok, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["status"] == "UNKNOWN"
    assert any("nvmlInit" in m for m in verdict["messages"]), verdict["messages"]
    # The hung thread is abandoned, not waited for (it never returns): the verdict comes at
    # the budget; 0.5 s of slack for a loaded CI machine (2.15 s seen in a full suite run).
    assert verdict["seconds"] < 2.0 + 0.5
    assert took < 2.0 + MARGIN + 1.0  # and it does not hold the process up at exit


def test_no_time_left_is_unknown_without_touching_nvml(tmp_path: Path) -> None:
    config = write_config(tmp_path, "", 'gpus = "required"')
    from healthd.inline import run_inline

    verdict = run_inline(load_config(config), 0.0)
    assert verdict.status.value == "UNKNOWN"
    assert [f.fault_class for f in verdict.findings] == ["launch.deadline"]


# --- the daemon: waiting for the runner and the run fit in the budget together ----------------


def test_the_daemon_s_runner_wait_and_run_fit_in_the_budget_together(tmp_path: Path) -> None:
    """A periodic run holds the runner for half the budget, then the stale launch check
    hangs: the reply still comes within the budget (before: wait budget/2, then run the
    whole budget again), the check UNKNOWN."""
    from types import SimpleNamespace

    from healthd.checks.base import CheckContext, Tier
    from healthd.launch_gate import LaunchGate
    from healthd.runner import Runner
    from tests.test_checks_runner import make_spec

    release = threading.Event()
    try:
        spec = make_spec("stuck", lambda: [release.wait(30), []][1], tiers=(Tier.LAUNCH,))
        runner = Runner(CheckContext.for_root(tmp_path), specs=[spec])
        latest: dict[str, object] = {}

        def run_checks(names: list[str], budget: float, wait: float) -> None:
            report = runner.run(names, budget=budget, wait=wait)
            latest.update({o.name: (time.monotonic(), o.results) for o in report.outcomes})

        daemon = SimpleNamespace(
            checks=runner,
            node="n1",
            settings=SimpleNamespace(launch_max_age=60.0),
            latest=latest.get,
            run_checks=run_checks,
        )
        runner._lock.acquire()  # a periodic run in progress...
        threading.Timer(0.5, runner._lock.release).start()  # ...that ends half-way
        begin = time.monotonic()
        reply = LaunchGate(daemon).launch_verdict(1.0)  # type: ignore[arg-type]
        took = time.monotonic() - begin
    finally:
        release.set()
    assert took < 1.0 + 0.1, f"{took:.2f}s"
    assert reply["status"] == "UNKNOWN"
    assert [r["fault_class"] for r in reply["results"]] == ["check.timeout"]
    assert reply["ran"] == ["stuck"]


def test_the_daemon_answers_a_fresh_only_question_without_running_anything(
    tmp_path: Path,
) -> None:
    from types import SimpleNamespace

    from healthd.checks.base import CheckContext, Tier, ok
    from healthd.launch_gate import LaunchGate
    from healthd.runner import Runner
    from tests.test_checks_runner import make_spec

    spec = make_spec("quick", lambda: [ok("quick", "fine")], tiers=(Tier.LAUNCH,))
    runner = Runner(CheckContext.for_root(tmp_path), specs=[spec])
    ran: list[list[str]] = []
    latest: dict[str, object] = {}
    daemon = SimpleNamespace(
        checks=runner,
        node="n1",
        settings=SimpleNamespace(launch_max_age=60.0),
        latest=latest.get,
        run_checks=lambda names, budget, wait: ran.append(names),
    )
    gate = LaunchGate(daemon)  # type: ignore[arg-type]
    reply = gate.launch_verdict(10.0, fresh_only=True)
    assert reply == {"node": "n1", "tier": "launch", "stale": ["quick"]} and ran == []
    latest["quick"] = (time.monotonic(), (ok("quick", "fine"),))
    reply = gate.launch_verdict(10.0, fresh_only=True)
    assert reply["status"] == "OK" and reply["ran"] == [] and ran == []

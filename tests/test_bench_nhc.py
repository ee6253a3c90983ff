"""bench.nhc_compare without NHC (Debian 12 has none): it says so and how to get it, and the
NHC configuration it would run holds nine host checks and never marks a node offline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.nhc_compare import NHC_CHECKS, nhc_argv, nhc_conf
from medic_core import proc


def test_without_nhc_the_bench_says_absent_and_how_to_get_it(tmp_path: Path) -> None:
    done = proc.run(
        [sys.executable, "-m", "bench.nhc_compare"],
        timeout=60,
        env={"PATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=Path(__file__).parent.parent,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["nhc"] == "absent" and "github.com/mej/nhc" in out["how"]


def test_the_nhc_configuration_holds_nine_checks_and_never_marks_a_node_offline() -> None:
    lines = nhc_conf().splitlines()
    assert lines[0] == "* || export MARK_OFFLINE=0"
    checks = [line.removeprefix("* || ") for line in lines[1:]]
    assert checks == list(NHC_CHECKS) and len(checks) == 9
    assert all(c.startswith("check_") for c in checks)


def test_the_nhc_command_line_names_the_configuration_and_a_private_result_file() -> None:
    argv = nhc_argv(Path("/usr/sbin/nhc"), Path("/t/nhc.conf"), None, Path("/t/nhc.status"))
    assert argv == ["/usr/sbin/nhc", "-c", "/t/nhc.conf", "-l", "-", "-t", "30",
                    "RESULTFILE=/t/nhc.status"]  # fmt: skip
    with_dir = nhc_argv(Path("nhc"), Path("c"), Path("/opt/nhc"), Path("r"))
    assert with_dir[1:3] == ["-D", "/opt/nhc"]

"""Site extension points: command checks from medic.toml, Python checks from the
`medic.checks` entry-point group, and site kernel-log rules."""

from __future__ import annotations

import json
import logging
import shutil
import sys
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import healthd.checks as checks
from healthd.checks import base, load_check_configs, site
from healthd.checks.base import CheckContext, Kind, Recommendation, Status, Tier
from healthd.checks.command import (
    OUTPUT_LIMIT,
    SHOWN,
    CommandCheck,
    CommandCheckConfig,
    CommandObservation,
    evaluate_command,
)
from healthd.checks.kernel_log import KernelLogCheck, KernelLogConfig
from healthd.fixtures import write_host_tree
from healthd.runner import Runner, RunState
from medic_core.config import ConfigError, MedicConfig, parse_config

SOURCE = Path("/etc/medic/medic.toml")
SLEEP = shutil.which("sleep") or "/bin/sleep"


def _config(toml: str) -> MedicConfig:
    return parse_config(tomllib.loads(toml), SOURCE, "gpu001")


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def _run(argv: list[str], **keys: object) -> tuple[list[base.Result], float]:
    """One command check run (gather + evaluate) and its wall time."""
    cfg = CommandCheckConfig(argv=tuple(argv), **keys)  # type: ignore[arg-type]
    check = CommandCheck("command.t")
    start = time.monotonic()
    results = CommandCheck.evaluate(check.gather(CheckContext.for_root("/"), cfg), cfg)
    return results, time.monotonic() - start


# --- the command check, real subprocesses ---------------------------------------------------


def test_exit_zero_is_ok(tmp_path: Path) -> None:
    results, _ = _run([_script(tmp_path, "ok.sh", "echo all good\n")])
    [result] = results
    assert (result.status, result.fault_class, result.check) == (Status.OK, None, "command.t")
    assert result.evidence["exit"] == 0 and "all good" in result.evidence["output_tail"]


def test_warn_and_critical_codes_and_the_rest(tmp_path: Path) -> None:
    script = _script(tmp_path, "code.sh", 'echo "state: $1" >&2\nexit "$1"\n')
    keys = {"warn_codes": (3,), "critical_codes": (4,), "recommendation": "reboot"}
    [warn], _ = _run([script, "3"], **keys)
    assert (warn.status, warn.fault_class) == (Status.WARN, "command.t")
    assert warn.remediation is Recommendation.REBOOT
    assert warn.evidence["recommendation"] == "reboot"
    assert warn.message == "command.t: exit 3: state: 3"
    [critical], _ = _run([script, "4"], **keys)
    assert critical.status is Status.CRITICAL
    [other], _ = _run([script, "9"], **keys)
    assert other.status is Status.CRITICAL  # other_status
    [other_warn], _ = _run([script, "9"], **keys, other_status="WARN")
    assert other_warn.status is Status.WARN
    [unknown], _ = _run([script, "9"], other_status="UNKNOWN")
    assert (unknown.status, unknown.fault_class) == (Status.UNKNOWN, "check.error")


def test_patterns_on_the_output(tmp_path: Path) -> None:
    script = _script(tmp_path, "state.sh", "echo 'node:gpu001:active:'\necho 'fs:scratch:down:'\n")
    [hit], _ = _run([script], fault_pattern=":down:", pattern_status="WARN")
    assert hit.status is Status.WARN and hit.message.endswith("output matched: fs:scratch:down:")
    [clean], _ = _run([script], fault_pattern=":arbitrating:")
    assert clean.status is Status.OK
    [lacking], _ = _run([script], require_pattern="quorum")
    assert lacking.status is Status.CRITICAL and "lacks the required pattern" in lacking.message
    [present], _ = _run([script], require_pattern="active")
    assert present.status is Status.OK


def test_a_hung_command_is_unknown_within_its_timeout(tmp_path: Path) -> None:
    [result], seconds = _run([SLEEP, "60"], timeout=0.5)
    assert (result.status, result.fault_class) == (Status.UNKNOWN, "check.timeout")
    assert "0.5s" in result.message
    assert seconds < 3.0  # 0.5 s, the kill, at most 1 s reaping: never the minute


def test_a_hung_command_with_a_child_holding_the_pipe_is_killed(tmp_path: Path) -> None:
    script = _script(tmp_path, "fork.sh", f"{SLEEP} 60 &\necho started\nexit 0\n")
    [result], seconds = _run([script], timeout=0.5)
    # The shell exited, its child keeps stdout open: the group is killed at the timeout.
    assert result.status is Status.UNKNOWN and seconds < 3.0


def test_the_runner_answers_promptly_for_a_hung_command(tmp_path: Path) -> None:
    toml = f'[checks.command.hang]\nargv = ["{SLEEP}", "60"]\ntimeout = 0.5\n'
    runner = Runner(CheckContext.for_root(tmp_path), load_check_configs(_config(toml)))
    start = time.monotonic()
    report = runner.run(["command.hang"])
    assert time.monotonic() - start < 3.0
    [outcome] = report.outcomes
    # The check's own answer, not the runner's: the thread returned, nothing is left hung.
    assert outcome.state is RunState.DONE
    assert outcome.results[0].fault_class == "check.timeout"
    deadline = time.monotonic() + 5
    while runner.hung() and time.monotonic() < deadline:
        runner.hung()
    assert runner.hung() == {}


def test_huge_output_is_bounded(tmp_path: Path) -> None:
    script = _script(tmp_path, "flood.sh", "head -c 20000000 /dev/zero | tr '\\0' x\nexit 2\n")
    cfg = CommandCheckConfig(argv=(script,), timeout=20)
    obs = CommandCheck("command.t").gather(CheckContext.for_root("/"), cfg)
    assert obs.returncode == 2 and len(obs.stdout) == OUTPUT_LIMIT
    assert obs.dropped == 20_000_000 - OUTPUT_LIMIT
    [result] = evaluate_command(obs, cfg)
    assert result.status is Status.CRITICAL and len(result.message) < 2 * SHOWN
    assert result.evidence["dropped_bytes"] == obs.dropped


def test_endless_output_times_out_bounded(tmp_path: Path) -> None:
    yes = shutil.which("yes") or "/usr/bin/yes"
    cfg = CommandCheckConfig(argv=(yes,), timeout=0.5)
    start = time.monotonic()
    obs = CommandCheck("command.t").gather(CheckContext.for_root("/"), cfg)
    assert time.monotonic() - start < 3.0
    assert obs.timed_out and len(obs.stdout) <= OUTPUT_LIMIT and obs.dropped > 0


def test_invalid_utf8_output_is_replaced_not_fatal(tmp_path: Path) -> None:
    script = _script(tmp_path, "bytes.sh", "printf 'bad \\377\\376 \\033[31m down\\n'\nexit 1\n")
    [result], _ = _run([script], fault_pattern="down")
    assert result.status is Status.CRITICAL
    assert (
        "\ufffd" in result.message and "\x1b" not in result.message and "\n" not in result.message
    )


def test_a_missing_executable_is_unknown(tmp_path: Path) -> None:
    [result], _ = _run([str(tmp_path / "no-such-probe")])
    assert (result.status, result.fault_class) == (Status.UNKNOWN, "check.error")
    assert "could not start" in result.message


# --- configuration ---------------------------------------------------------------------------


def test_tables_become_checks_with_their_tiers_and_intervals(tmp_path: Path) -> None:
    script = _script(tmp_path, "ok.sh", "exit 0\n")
    toml = f"""
    [checks.command.gpfs]
    argv = ["{script}"]
    tiers = ["launch", "periodic"]
    interval = 45
    timeout = 3
    description = "GPFS is active"

    [checks.command.scratch]
    argv = ["{script}", "--quick"]
    enabled = false
    """
    configs = load_check_configs(_config(textwrap.dedent(toml)))
    runner = Runner(CheckContext.for_root(tmp_path), configs)
    spec = runner.specs["command.gpfs"]
    assert spec.tiers == {Tier.LAUNCH, Tier.PERIODIC}
    assert spec.interval_for(configs["command.gpfs"]) == 45
    assert spec.timeout_for(configs["command.gpfs"]) > 3  # the command's own timeout first
    assert spec.description == "GPFS is active"
    assert "command.gpfs" in runner.selected(tier=Tier.LAUNCH)
    assert "command.scratch" not in runner.selected()
    report = runner.run(["command.gpfs"])
    assert [r.status for r in report.results] == [Status.OK]


def test_a_reload_adds_and_drops_command_checks(tmp_path: Path) -> None:
    script = _script(tmp_path, "ok.sh", "exit 0\n")
    runner = Runner(CheckContext.for_root(tmp_path), load_check_configs(_config("")))
    assert not [n for n in runner.specs if n.startswith("command.")]
    runner.reconfigure(load_check_configs(_config(f'[checks.command.a]\nargv = ["{script}"]\n')))
    assert "command.a" in runner.selected(tier=Tier.PERIODIC)
    assert "kernel_log" in runner.specs
    runner.reconfigure(load_check_configs(_config("")))
    assert "command.a" not in runner.specs and "command.a" not in runner.selected()


@pytest.mark.parametrize(
    ("toml", "line"),
    [
        (
            '[checks.command.x]\nargv = ["true"]',
            "checks.command.x.argv: 'true' is not an absolute path; give the program's full path",
        ),
        ("[checks.command.x]\ntiers = []", "checks.command.x.argv: is missing or empty"),
        (
            '[checks.command.x]\nargv = ["/bin/true"]\ntiers = ["nightly"]',
            "checks.command.x.tiers: 'nightly' is not allowed; use one of: launch, periodic, deep",
        ),
        (
            '[checks.command.x]\nargv = ["/bin/true"]\nfault_pattern = "(down"',
            "checks.command.x.fault_pattern: not a valid regular expression: missing ),",
        ),
        (
            '[checks.command.x]\nargv = ["/bin/true"]\nwarn_codes = [2]\ncritical_codes = [2]',
            "checks.command.x.critical_codes: 2 is also in warn_codes; list it in one only",
        ),
        (
            '[checks.command.x]\nargv = ["/bin/true"]\nwarn_codes = [256]',
            "checks.command.x.warn_codes: 256 is above the maximum 255",
        ),
        (
            '[checks.command.x]\nargv = ["/bin/true"]\nrecommendation = "pray"',
            "checks.command.x.recommendation: 'pray' is not allowed; use one of: none,",
        ),
        (
            '[checks.command.x]\nargv = ["/bin/true"]\nshell = true',
            "checks.command.x.shell: unknown key; use one of:",
        ),
        ('[checks.command."Bad Name"]\nargv = ["/bin/true"]', "checks.command.Bad Name: a command"),
        ("[checks]\ncommand = 3", "checks.command: expected a table"),
        ("[checks.command]\nx = 3", "checks.command.x: expected a table"),
    ],
)
def test_bad_tables_give_one_line_naming_file_table_and_key(toml: str, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_check_configs(_config(toml))
    message = str(err.value)
    assert message.startswith(f"{SOURCE}: ") and line in message and "\n" not in message


def test_one_bad_table_refuses_the_whole_file(tmp_path: Path) -> None:
    good = _script(tmp_path, "ok.sh", "exit 0\n")
    toml = f'[checks.command.a]\nargv = ["{good}"]\n[checks.command.b]\nargv = ["relative"]\n'
    with pytest.raises(ConfigError, match=r"checks\.command\.b\.argv"):
        load_check_configs(_config(toml))


# --- the pure evaluate, fuzzed ----------------------------------------------------------------

_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=400)


@settings(max_examples=300, deadline=None)
@given(
    code=st.one_of(st.none(), st.integers(min_value=-64, max_value=255)),
    stdout=_TEXT,
    stderr=_TEXT,
    timed_out=st.booleans(),
    start_error=st.sampled_from(["", "[Errno 2] No such file or directory: '/x'"]),
    pattern=st.sampled_from(["", "down", r"^\s*$", "(?i)error|fail"]),
)
def test_evaluate_always_gives_one_bounded_line(
    code: int | None,
    stdout: str,
    stderr: str,
    timed_out: bool,
    start_error: str,
    pattern: str,
) -> None:
    cfg = CommandCheckConfig(
        argv=("/x",), warn_codes=(1,), critical_codes=(2,), fault_pattern=pattern
    )
    obs = CommandObservation("command.f", code, stdout, stderr, 0.1, timed_out, start_error, 0)
    [result] = evaluate_command(obs, cfg)
    assert result.check == "command.f" and "\n" not in result.message
    assert len(result.message) < 3 * SHOWN + 100
    assert len(result.evidence["output_tail"]) <= SHOWN
    if result.status in (Status.WARN, Status.CRITICAL):
        assert result.fault_class == "command.f"
    elif result.status is Status.UNKNOWN:
        assert result.fault_class in ("check.error", "check.timeout")
    else:
        assert result.status is Status.OK and result.fault_class is None
    if code == 0 and not timed_out and not start_error and not pattern:
        assert result.status is Status.OK


# --- site checks from entry points --------------------------------------------------------------

SITE_OK = '''
from dataclasses import dataclass
from healthd.checks.base import Check, CheckConfig, Fault, Status, Tier, fault, ok, register


@register(
    name="acme_scratch",
    tiers=(Tier.PERIODIC,),
    interval=60,
    timeout=5,
    faults={"fs.acme_scratch": Fault(Status.WARN, "scratch is nearly full")},
)
class AcmeScratch(Check[int, CheckConfig]):
    """Acme's scratch quota."""

    def gather(self, ctx, cfg):
        return 3

    @staticmethod
    def evaluate(observation, cfg):
        return [ok("acme_scratch", f"{observation} quotas fine")]


@register(name="acme_raises", tiers=(Tier.PERIODIC,), interval=60, timeout=5,
          faults={"fs.acme_x": Fault(Status.WARN, "x")})
class AcmeRaises(Check[int, CheckConfig]):
    """Raises."""

    def gather(self, ctx, cfg):
        raise OSError("the quota server is away")
'''

ENTRY_POINTS = """[medic.checks]
acme_scratch = acme_medic_ok
acme_typo = acme_medic_typo
acme_nothing = acme_medic_nothing
acme_dup = acme_medic_dup
acme_exit = acme_medic_exit
"""
SITE_DUP = """
from healthd.checks.base import Check, CheckConfig, Fault, Status, Tier, register

register(name="ib", tiers=(Tier.PERIODIC,), interval=60, timeout=5,
         faults={"ib.x": Fault(Status.WARN, "x")})(type("Ib", (Check,), {}))
"""


@pytest.fixture
def site_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A site distribution on sys.path with five entry points: one good (two checks, one of
    which raises), one that fails to import, one that registers nothing, one that takes a
    shipped check's name, one that exits at import; the registry as it was afterwards."""
    (tmp_path / "acme_medic_ok.py").write_text(SITE_OK)
    (tmp_path / "acme_medic_typo.py").write_text("import acme_no_such_module\n")
    (tmp_path / "acme_medic_nothing.py").write_text("X = 1\n")
    (tmp_path / "acme_medic_dup.py").write_text(SITE_DUP)
    (tmp_path / "acme_medic_exit.py").write_text("raise SystemExit(3)\n")
    dist = tmp_path / "acme_medic-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-medic\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = dict(base._REGISTRY)
    site.reset_for_tests()
    try:
        yield tmp_path
    finally:
        base._REGISTRY.clear()
        base._REGISTRY.update(saved)
        site.reset_for_tests()
        for module in ("ok", "typo", "nothing", "dup", "exit"):
            module = f"acme_medic_{module}"
            sys.modules.pop(module, None)


def test_entry_point_checks_are_discovered_and_a_broken_one_is_unknown_only(
    site_distribution: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="medic.checks.site")
    shipped_ib = checks.get("ib")
    names = {spec.name for spec in checks.registry()}
    broken = ["acme_typo", "acme_nothing", "acme_dup", "acme_exit"]
    assert {"acme_scratch", "acme_raises", *broken} <= names
    assert "kernel_log" in names and checks.get("ib") is shipped_ib
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 4, errors
    expected = [
        "acme_typo = acme_medic_typo failed to load, reported UNKNOWN: ModuleNotFoundError",
        "acme_nothing = acme_medic_nothing failed to load, reported UNKNOWN: it registered no",
        "acme_dup = acme_medic_dup failed to load, reported UNKNOWN: ValueError: check 'ib'"
        " registered twice",
        "acme_exit = acme_medic_exit failed to load, reported UNKNOWN: SystemExit: 3",
    ]
    for line in expected:
        assert any(e.startswith(f"site check {line}") for e in errors), line
    checks.registry()  # loaded once per process
    assert len(caplog.records) == 4

    ctx = CheckContext.for_root(site_distribution)
    write_host_tree(site_distribution)
    runner = Runner(ctx, load_check_configs(_config("")))
    report = runner.run(["acme_scratch", "acme_raises", *broken, "cpus", "ib"])
    by_name = {o.name: o.results[0] for o in report.outcomes}
    assert by_name["acme_scratch"].status is Status.OK
    for name in ("acme_raises", *broken):
        assert by_name[name].status is Status.UNKNOWN, name
        assert by_name[name].fault_class == "check.error"
    assert "the quota server is away" in by_name["acme_raises"].message
    assert "failed to load" in by_name["acme_typo"].message
    assert by_name["cpus"].status is not Status.UNKNOWN  # the shipped checks run on
    assert by_name["ib"].status is not Status.UNKNOWN
    assert "acme_typo" not in runner.selected(tier=Tier.LAUNCH)  # never a launch verdict


def test_entry_point_checks_take_config_tables(site_distribution: Path) -> None:
    configs = load_check_configs(_config("[checks.acme_scratch]\ninterval = 30\n"))
    assert configs["acme_scratch"].interval == 30


def test_shipped_registry_without_site_checks(site_distribution: Path) -> None:
    assert "acme_scratch" not in {s.name for s in checks.registry(site=False)}


# --- site kernel-log rules ---------------------------------------------------------------------

GPFS_LINE = "3,7001,17305221090,-;mmfs: [E] Node 10.0.0.7 (gpu007) is being expelled"
SITE_RULES = """
[[checks.kernel_log.rules]]
name = "gpfs_expel"
pattern = 'mmfs: \\[E\\] Node .* is being expelled'
fault_class = "kernel.site.gpfs_expel"
status = "CRITICAL"
description = "GPFS expelled a node"
recommendation = "drain"
match = "mmfs: [E] Node 10.0.0.7 (gpu007) is being expelled"
"""


def test_a_site_rule_matches_a_kmsg_line(tmp_path: Path) -> None:
    cfg = load_check_configs(_config(SITE_RULES))["kernel_log"]
    assert isinstance(cfg, KernelLogConfig)
    write_host_tree(tmp_path)
    (tmp_path / "dev/kmsg").write_text(GPFS_LINE + "\n")
    [result] = KernelLogCheck.evaluate(
        KernelLogCheck().gather(CheckContext.for_root(tmp_path), cfg), cfg
    )
    assert (result.status, result.fault_class) == (Status.CRITICAL, "kernel.site.gpfs_expel")
    assert result.remediation is Recommendation.DRAIN and result.kind is Kind.EVENT
    assert result.evidence["rule"] == "gpfs_expel"
    assert result.message == f"GPFS expelled a node: {GPFS_LINE.split(';', 1)[1]}"
    assert base.declared_fault(checks.get("kernel_log").faults, result.fault_class)


def test_a_site_rule_without_recommendation_follows_the_table(tmp_path: Path) -> None:
    toml = SITE_RULES.replace('recommendation = "drain"\n', "").replace("CRITICAL", "WARN")
    cfg = load_check_configs(_config(toml))["kernel_log"]
    write_host_tree(tmp_path)
    (tmp_path / "dev/kmsg").write_text(GPFS_LINE + "\n")
    [result] = KernelLogCheck.evaluate(
        KernelLogCheck().gather(CheckContext.for_root(tmp_path), cfg), cfg
    )
    assert result.status is Status.WARN and result.remediation is Recommendation.NONE


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (("'mmfs", "'(mmfs"), "checks.kernel_log.rules[0].pattern: not a valid regular expression"),
        (
            ("kernel.site.gpfs_expel", "gpfs.expel"),
            "checks.kernel_log.rules[0].fault_class: 'gpfs.expel' is not a dotted lower-case",
        ),
        (('"CRITICAL"', '"FATAL"'), "checks.kernel_log.rules[0].status: 'FATAL' is not allowed"),
        (('"drain"', '"pray"'), "checks.kernel_log.rules[0].recommendation: 'pray' is not a"),
        (("(gpu007) is", "(gpu007) was"), "checks.kernel_log.rules[0].match: the pattern does"),
        (('"gpfs_expel"', '"hung_task"'), "checks.kernel_log.rules[0].name: 'hung_task' is a"),
        (('status = "CRITICAL"', 'status = ""'), "checks.kernel_log.rules[0].status: missing"),
        (('status = "CRITICAL"', 'status = "WARN"\nseverity = "x"'), "rules[0].severity: unknown"),
        (('status = "CRITICAL"', "status = 3"), "checks.kernel_log.rules.status: expected a str"),
    ],
)
def test_bad_site_rules_give_one_line(change: tuple[str, str], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_check_configs(_config(SITE_RULES.replace(*change)))
    assert line in str(err.value) and "\n" not in str(err.value)


def test_two_site_rules_of_one_name_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"rules\[1\]\.name: 'gpfs_expel' is used twice"):
        load_check_configs(_config(SITE_RULES + SITE_RULES))


# --- the CLI and the docs ------------------------------------------------------------------------


def test_medic_checks_list_and_medic_check_show_command_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from cli.check import check as check_command
    from cli.checks import checks as checks_group

    write_host_tree(tmp_path / "host")
    script = _script(tmp_path, "quota.sh", "echo 'quota exceeded' >&2\nexit 2\n")
    conf = tmp_path / "medic.toml"
    conf.write_text(
        f'[node]\nhost_root = "{tmp_path / "host"}"\n[healthd]\ngpus = "none"\n'
        f'[store]\nurl = "sqlite:///{tmp_path / "medic.db"}"\n'
        f'[checks.command.quota]\nargv = ["{script}"]\ntiers = ["launch"]\ncritical_codes = [2]\n'
    )
    monkeypatch.setenv("MEDIC_NODE_NAME", "c1")
    listed = CliRunner().invoke(checks_group, ["list", "--json", "--config", str(conf)])
    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.output)}
    assert rows["command.quota"]["tiers"] == ["launch"]
    assert rows["command.quota"]["interval"] == 300.0 and rows["command.quota"]["timeout"] == 11.5
    assert rows["command.quota"]["faults"] == ["command.quota"]
    ran = CliRunner().invoke(check_command, ["--config", str(conf), "--check", "command.quota"])
    assert ran.exit_code == 1, ran.output
    [row] = [line for line in ran.stdout.splitlines() if line.startswith("command.quota")]
    assert row.split()[2:4] == ["CRITICAL", "command.quota"] and "quota exceeded" in row


def test_the_admin_guides_examples_validate(tmp_path: Path) -> None:
    import re

    from medic_core.config import load_config

    page = (Path(__file__).parents[1] / "docs" / "admin-guide.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 2
    for number, block in enumerate(blocks):
        path = tmp_path / f"example-{number}.toml"
        path.write_text(block)
        configs = load_check_configs(load_config(path))
        assert configs, number
    site_rules = [c for c in configs.values() if isinstance(c, KernelLogConfig)]
    assert site_rules[0].site_rules and site_rules[0].site_rules[0].name == "gpfs_expel"


def test_checks_md_names_every_command_check_key() -> None:
    from healthd.checks.base import describe_config

    page = (Path(__file__).parents[1] / "docs" / "checks.md").read_text()
    for key, _, _ in describe_config(CommandCheckConfig):
        assert f"| `{key}` |" in page, key


# --- the real daemon: command checks follow SIGHUP, a bad table refuses the reload -------------


def test_the_daemon_runs_command_checks_and_reloads_them(tmp_path: Path) -> None:
    import os
    import signal

    from medic_core import proc
    from medic_core.api import HealthdUnavailable, ask
    from tests.conftest import poll

    write_host_tree(tmp_path / "host")
    ran = tmp_path / "ran"
    marker = _script(tmp_path, "marker.sh", f"echo run >> {ran}\necho 'disk: degraded'\nexit 2\n")
    ok_script = _script(tmp_path, "ok.sh", "exit 0\n")
    sock, log = tmp_path / "healthd.sock", tmp_path / "healthd.log"
    base_toml = f"""
[node]
host_root = "{tmp_path / "host"}"
state_dir = "{tmp_path / "state"}"
socket = "{sock}"
[healthd]
gpus = "none"
metrics_port = 0
socket_group = ""
slurmd_spool_dir = "{tmp_path / "spool"}"
[checks.command.marker]
argv = ["{marker}"]
critical_codes = [2]
interval = 1
"""
    config = tmp_path / "medic.toml"
    config.write_text(base_toml)
    env = {**os.environ, "MEDIC_CONFIG": str(config), "MEDIC_NODE_NAME": "site1"}
    pid = proc.spawn([str(Path(sys.executable).parent / "medic-healthd")], log_path=log, env=env)

    def answers() -> bool:
        try:
            ask(sock, {"op": "ping"}, timeout=1)
        except HealthdUnavailable:
            return False
        return True

    def reloads() -> int:
        return log.read_text().count("configuration reloaded")

    try:
        poll("healthd socket", answers, timeout=30)
        poll("two periodic runs of command.marker", lambda: ran.exists() and len(
            ran.read_text().splitlines()) >= 2, timeout=15)  # fmt: skip
        reply = ask(sock, {"op": "check", "checks": ["command.marker"]}, timeout=10)
        [result] = reply["results"]
        assert (result["status"], result["fault_class"]) == ("CRITICAL", "command.marker")
        assert result["remediation"] == "drain" and "disk: degraded" in result["message"]

        config.write_text(base_toml + '[checks.command.bad]\nargv = ["relative"]\n')
        os.kill(pid, signal.SIGHUP)
        poll("reload refusal", lambda: "reload refused" in log.read_text())
        assert "checks.command.bad.argv: 'relative' is not an absolute path" in log.read_text()
        with pytest.raises(HealthdUnavailable, match=r"unknown checks: command\.bad"):
            ask(sock, {"op": "check", "checks": ["command.bad"]}, timeout=10)

        config.write_text(
            base_toml.replace("[checks.command.marker]", "[checks.command.other]").replace(
                str(marker), ok_script
            )
        )
        os.kill(pid, signal.SIGHUP)
        poll("reload", lambda: reloads() == 1)
        reply = ask(sock, {"op": "check", "checks": ["command.other"]}, timeout=10)
        assert [r["status"] for r in reply["results"]] == ["OK"]
        with pytest.raises(HealthdUnavailable, match=r"unknown checks: command\.marker"):
            ask(sock, {"op": "check", "checks": ["command.marker"]}, timeout=10)
    finally:
        os.kill(pid, signal.SIGTERM)
        poll("exit", lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, timeout=15)
    assert "Traceback" not in log.read_text()


def test_medic_config_check_names_a_bad_command_table(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cli.admin import config as config_group

    script = _script(tmp_path, "ok.sh", "exit 0\n")
    path = tmp_path / "medic.toml"
    good = (
        f'[store]\nurl = "sqlite:///{tmp_path / "m.db"}"\n[checks.command.a]\nargv = ["{script}"]\n'
    )
    path.write_text(good)
    ok = CliRunner().invoke(config_group, ["check", "--config", str(path)])
    assert ok.exit_code == 0, ok.output
    total = len(checks.registry()) + 1
    assert f"{total} of {total} checks enabled" in ok.stdout
    path.write_text(good + '[checks.command.b]\nargv = ["/bin/true"]\ntimeout = "soon"\n')
    bad = CliRunner().invoke(config_group, ["check", "--config", str(path)])
    assert bad.exit_code == 1
    assert bad.stderr == (
        f"medic: {path}: checks.command.b.timeout: expected a number, got 'soon'; fix the value\n"
    )


# --- validation, fuzzed: a table is refused with one line or taken whole ---------------------

_VALUES = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["WARN", "CRITICAL", "(", "kernel.site.x", "drain", "/bin/true", "boom"]),
)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.dictionaries(
        st.sampled_from(
            [
                "name",
                "pattern",
                "fault_class",
                "status",
                "description",
                "recommendation",
                "match",
                "other",
            ]
        ),
        _VALUES,
    )
)
def test_site_rule_validation_refuses_or_builds(raw: dict[str, str]) -> None:
    from healthd.checks.kernel_log import site_rule, site_rule_problems

    problems = list(site_rule_problems(0, raw))
    if problems:
        for key, problem, fix in problems:
            assert key.startswith("rules[0].") and problem and fix
            assert "\n" not in f"{key}{problem}{fix}"
        return
    rule = site_rule(raw)
    assert rule.fault_class.startswith("kernel.") and rule.status in (Status.WARN, Status.CRITICAL)
    if "match" in raw:
        assert rule.matches(raw["match"])


@settings(max_examples=300, deadline=None)
@given(
    table=st.dictionaries(
        st.sampled_from(
            [
                "argv",
                "tiers",
                "warn_codes",
                "critical_codes",
                "fault_pattern",
                "timeout",
                "other_status",
                "recommendation",
                "shell",
            ]
        ),
        st.one_of(
            _VALUES,
            st.integers(-5, 300),
            st.floats(allow_nan=True),
            st.lists(_VALUES, max_size=3),
            st.lists(st.integers(-5, 300), max_size=3),
        ),
    )
)
def test_command_tables_are_refused_in_one_line_or_taken(table: dict[str, object]) -> None:
    from healthd.checks.base import parse_check_config

    try:
        cfg = parse_check_config(
            CommandCheckConfig, table, prefix="checks.command.f", source=SOURCE
        )
    except ConfigError as exc:
        assert str(exc).startswith(f"{SOURCE}: checks.command.f.") and "\n" not in str(exc)
        return
    assert cfg.argv and cfg.argv[0].startswith("/") and cfg.tiers
    assert not set(cfg.warn_codes) & set(cfg.critical_codes)
    cfg.compiled  # noqa: B018  (compiles: the table was checked)

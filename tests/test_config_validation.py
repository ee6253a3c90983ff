"""Total configuration validation (issue 23, finding 5): a bounded depth, a range and a unit for
every number, an existing absolute program for every argv this node runs, unknown keys
refused; `medic config check`, the daemon's start and its reload share one validator, print
one line per problem and never a traceback, and the daemon exits 78 (EX_CONFIG) on a bad file,
which its unit does not restart (RestartPreventExitStatus=78, tests/test_systemd_unit.py)."""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.checks import registry
from healthd.checks.base import CheckContext
from healthd.checks.command import CommandCheckConfig
from healthd.config_check import config_problems, validate_config
from healthd.daemon import EXIT_CONFIG, HealthDaemon
from medic_core import proc
from medic_core import settings as ms
from medic_core.config import MAX_DEPTH, ConfigError, load_config, parse_config
from medic_core.store import open_configured_store
from medic_core.typed_config import UNITS, field_range
from tests.test_daemon import plain_config
from tests.test_fuzz_boundaries import _within  # a hang fails the example

VENV_BIN = Path(sys.executable).parent
ENV = {"PATH": "/usr/bin:/bin", "MEDIC_NODE_NAME": "n1"}
FUZZ = settings(max_examples=150, derandomize=True, database=None, deadline=None)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "medic.toml"
    path.write_text(text)
    return path


def _check(path: Path) -> tuple[int, list[str]]:
    """`medic config check` in a process of its own: what an operator sees, exit status and
    lines, with a deadline (a hang fails)."""
    done = proc.run(
        [str(VENV_BIN / "medic"), "config", "check", "--config", str(path)], env=ENV, timeout=60
    )
    return done.returncode, (done.stdout + done.stderr).strip().splitlines()


def _daemon_start(path: Path) -> tuple[int, list[str]]:
    done = proc.run([str(VENV_BIN / "medic-healthd"), "--config", str(path)], env=ENV, timeout=60)
    return done.returncode, done.stderr.strip().splitlines()


# --- the probes of the finding ---------------------------------------------------------------


@pytest.mark.parametrize("depth", [3000, 60])
def test_a_deeply_nested_value_is_one_line_and_exit_78(tmp_path: Path, depth: int) -> None:
    """3000 brackets was a 3,002-line RecursionError and the daemon's exit 1 (systemd
    restarted it every 5 s); 60 parse, but no key of Medic's is 60 levels deep."""
    path = _write(tmp_path, "[checks]\nx = " + "[" * depth + "]" * depth + "\n")
    code, lines = _check(path)
    assert code != 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"medic: {path}: ") and f"at most {MAX_DEPTH} levels" in lines[0]
    code, lines = _daemon_start(path)
    assert code == EXIT_CONFIG and len(lines) == 1 and "Traceback" not in lines[0], lines


def test_a_negative_spare_pool_is_refused_by_the_check_the_start_and_a_reload(
    tmp_path: Path,
) -> None:
    """`size = -1` passed `medic config check` and a reload, then failed every 30 s."""
    good = plain_config(tmp_path)
    config = load_config(good)
    store = open_configured_store(config)
    try:
        daemon = HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))
        good.write_text(good.read_text() + "\n[remediation.spares]\nsize = -1\n")
        code, lines = _check(good)
        assert code != 0 and lines == [
            f"medic: {good}: remediation.spares.size: -1 is below the minimum 0; use at least 0"
        ]
        assert not daemon.reload()  # refused: the running configuration stays
        assert daemon.config is config
    finally:
        store.close()
    code, lines = _daemon_start(good)
    assert code == EXIT_CONFIG and len(lines) == 1 and "remediation.spares.size" in lines[0]


def _executable(tmp_path: Path, name: str, mode: int = 0o755) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('[remediation]\ngpu_reset = ["/no/such/gpu-reset", "{gpu}"]',
         "remediation.gpu_reset: program /no/such/gpu-reset does not exist"),
        ('[remediation]\ngpu_reset = ["nvidia-smi", "-r", "-i", "{gpu}"]',
         "remediation.gpu_reset: program 'nvidia-smi' is not an absolute path"),
        ('[remediation]\ndriver_reload = ["{tmp}/not-executable", "{node}"]',
         "remediation.driver_reload: program {tmp}/not-executable is not executable"),
        ('[remediation]\ndriver_reload = ["{tmp}", "{node}"]',
         "remediation.driver_reload: program {tmp} is not a file"),
        ('[remediation.isolation]\nenabled = true\napply = ["/no/such/isolate", "{node}"]',
         "remediation.isolation.apply: program /no/such/isolate does not exist"),
        ('[checks.command.gpfs]\nargv = ["/no/such/mmgetstate", "-Y"]',
         "checks.command.gpfs.argv: program /no/such/mmgetstate does not exist"),
    ],
)  # fmt: skip
def test_a_program_that_is_not_there_is_refused(tmp_path: Path, body: str, problem: str) -> None:
    _executable(tmp_path, "not-executable", 0o644)
    path = _write(tmp_path, body.replace("{tmp}", str(tmp_path)) + "\n")
    code, lines = _check(path)
    assert code != 0 and len(lines) == 1, lines
    assert problem.replace("{tmp}", str(tmp_path)) in lines[0], lines
    assert _daemon_start(path)[0] == EXIT_CONFIG


def test_existing_absolute_programs_pass(tmp_path: Path) -> None:
    reset = _executable(tmp_path, "reset")
    path = _write(
        tmp_path,
        f'[remediation]\ngpu_reset = ["{reset}", "{{gpu}}"]\ndriver_reload = ["{reset}"]\n'
        f'[remediation.isolation]\nenabled = true\napply = ["{reset}", "{{node}}"]\n'
        f'[checks.command.site]\nargv = ["{reset}"]\n'
        # srun runs the probe on the swept node, not here: its program is not looked for.
        '[sweep]\nprobe = ["medic", "sweep", "probe"]\n',
    )
    code, lines = _check(path)
    assert code == 0 and lines[0].startswith(f"OK {path}"), lines


@pytest.mark.parametrize(
    ("body", "key", "maximum"),
    [
        ("[sweep]\ntimeout = 1e308", "sweep.timeout", "86400 s"),
        ("[checks.memory]\ninterval = 1e30", "checks.memory.interval", "86400 s"),
        ("[checks.ib]\ntimeout = 1e308", "checks.ib.timeout", "86400 s"),
        ("[remediation]\naction_timeout = 1e308", "remediation.action_timeout", "86400 s"),
        ("[remediation]\nlemon_days = 1e9", "remediation.lemon_days", "3650 days"),
        ("[remediation.spares]\nsize = 9223372036854775807", "remediation.spares.size",
         "1000000000"),
        ("[remediation]\ncooldown = { reboot = 1e300 }", "remediation.cooldown.reboot",
         "86400 s"),
        ("[store]\nevent_retention_days = 9223372036854775807", "store.event_retention_days",
         "36500"),
    ],
)  # fmt: skip
def test_a_number_past_its_range_is_refused(
    tmp_path: Path, body: str, key: str, maximum: str
) -> None:
    code, lines = _check(_write(tmp_path, body + "\n"))
    assert code != 0 and len(lines) == 1, lines
    assert f": {key}: " in lines[0] and maximum in lines[0], lines


# --- every number has a range and a unit -----------------------------------------------------


def _setting_types() -> list[type[Any]]:
    tables = [
        ms.DaemonSettings, ms.HookSettings, ms.RemediationSettings, ms.IsolationSettings,
        ms.SpareSettings, ms.BurnInSettings, ms.SweepSettings, ms.WebhookTable,
        CommandCheckConfig,
    ]  # fmt: skip
    return [*tables, *{spec.config_type for spec in registry(site=False)}]


def _number_fields() -> list[tuple[str, dataclasses.Field[Any], Any]]:
    found = []
    for table in _setting_types():
        hints = typing.get_type_hints(table)
        for f in dataclasses.fields(table):
            text = str(hints[f.name])
            if "int" in text or "float" in text:
                found.append((f"{table.__name__}.{f.name}", f, hints[f.name]))
    return found


def test_every_number_of_every_table_has_a_finite_range_and_a_unit() -> None:
    fields = _number_fields()
    assert len(fields) > 100  # every table and check was walked
    for name, f, tp in fields:
        low, high, unit = field_range(f, tp)
        assert unit in UNITS and unit != "number", f"{name}: no unit (add it to UNIT_OF_NAME)"
        assert math.isfinite(low) and math.isfinite(high) and low <= high, name
        default = f.default if f.default is not dataclasses.MISSING else None
        if isinstance(default, int | float) and not isinstance(default, bool):
            assert low <= default <= high, f"{name}: default {default} outside [{low}, {high}]"


# --- unknown keys, one line per problem, hostile keys -----------------------------------------


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("[lab]\ncluster = 3", "lab.cluster"),
        ("[slurm]\nconfig = '/etc/slurm/slurm.conf'", "slurm.config"),
        ("[slurm]\nconf = 'slurm.conf'", "slurm.conf"),
        ("[remediation.spares]\nsise = 2", "remediation.spares.sise"),
    ],
)
def test_an_unknown_or_bad_key_is_refused(tmp_path: Path, body: str, key: str) -> None:
    path = _write(tmp_path, body + "\n")
    code, lines = _check(path)
    assert code != 0 and len(lines) == 1 and lines[0].startswith(f"medic: {path}: {key}: "), lines


def test_every_problem_is_one_line_of_its_own(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "[healthd]\njitter = 5\nhang_poll = -1\n[sweep]\ntimeout = 1e308\n"
        '[remediation]\ngpu_reset = ["nvidia-smi"]\n[remediation.spares]\nsize = -1\n'
        "[checks.memory]\ninterval = 1e30\n",
    )
    code, lines = _check(path)
    assert code != 0
    keys = [line.split(": ")[2] for line in lines]
    assert keys == [
        "healthd.jitter", "healthd.hang_poll", "remediation.gpu_reset",
        "remediation.spares.size", "sweep.timeout", "checks.memory.interval",
    ], lines  # fmt: skip
    code, daemon_lines = _daemon_start(path)
    assert code == EXIT_CONFIG and len(daemon_lines) == len(lines), daemon_lines


def test_a_key_with_terminal_controls_is_shown_escaped_on_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, '["\\u001b]0;PWNED\\u0007\\nx"]\n')
    code, lines = _check(path)
    assert code != 0 and len(lines) == 1, lines
    # The one sanitiser (medic_core.text): a control is "?", a line break a space.
    assert lines[0].startswith(f"medic: {path}: ?]0;PWNED? x: unknown table"), lines


def test_a_huge_config_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "medic.toml"
    with path.open("w") as f:
        f.write("[healthd]\n")
        f.write("# " + "x" * (4 << 20) + "\n")
    code, lines = _check(path)
    assert code != 0 and len(lines) == 1 and "bytes" in lines[0], lines


# --- fuzzing: a Settings or ConfigError lines, nothing else, never a hang ---------------------

_SCALARS = (
    st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.text(max_size=20)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_TABLES = ["node", "slurm", "lab", "checks", "healthd", "hooks", "store", "remediation", "sweep"]


def _known_keys(table: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(table)]


@st.composite
def _configs(draw: st.DrawFn) -> dict[str, Any]:
    """Tables Medic knows with keys it knows (and some it does not), holding any values."""
    known = {
        "healthd": _known_keys(ms.DaemonSettings),
        "hooks": _known_keys(ms.HookSettings),
        "remediation": [*_known_keys(ms.RemediationSettings), "spares", "isolation", "burn_in"],
        "sweep": _known_keys(ms.SweepSettings),
        "store": ["url", "event_retention_days", "pool", "pool_size"],
        "slurm": ["conf"],
        "checks": ["memory", "ib", "gpu_xid", "command"],
        "node": [],
        "lab": [],
    }
    data: dict[str, Any] = {}
    for table in draw(st.lists(st.sampled_from(_TABLES), max_size=4, unique=True)):
        keys = draw(st.lists(st.sampled_from([*known[table], "bogus"]), max_size=4, unique=True))
        data[table] = {key: draw(_VALUES) for key in keys}
    return data


def _one_line_problems(exc: ConfigError) -> None:
    for line in exc.lines():
        assert line and "\n" not in line and "\r" not in line and len(line) < 2000, line


@FUZZ
@given(data=_configs())
def test_any_values_in_any_tables_give_settings_or_one_line_problems(data: dict[str, Any]) -> None:
    config = None
    try:
        parsed = config = parse_config(data, Path("/etc/medic/medic.toml"), "n1")
        _within(10, lambda: validate_config(parsed))
    except ConfigError as exc:
        _one_line_problems(exc)
        if config is not None:  # the validator and the problem list agree
            assert [str(p) for p in config_problems(config)] == exc.lines()


_TOML_BITS = st.sampled_from(
    ["[", "]", "[[", "]]", "{", "}", "=", ",", '"', "'", "\n", " ", "a", "healthd", "checks",
     "remediation.spares", "size", "-1", "1e308", "nan", "inf", "true", "[checks.x]", ".",
     "\\u0000", "\x1b", "9" * 30, "#", '"""', "0x7f", "1979-05-27"]
)  # fmt: skip


@FUZZ
@given(parts=st.lists(_TOML_BITS | st.text(max_size=6), max_size=40))
def test_any_toml_ish_text_gives_settings_or_one_line_problems(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str]
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "medic.toml"
    path.write_text("".join(parts), encoding="utf-8", errors="surrogateescape")
    try:
        _within(10, lambda: validate_config(load_config(path, environ={"MEDIC_NODE_NAME": "n1"})))
    except ConfigError as exc:
        _one_line_problems(exc)


def test_an_unreadable_program_directory_is_one_line(tmp_path: Path) -> None:
    """The program check itself never raises: a directory in the path this process cannot
    search is a problem line, not a PermissionError."""
    locked = tmp_path / "locked"
    locked.mkdir()
    program = _executable(locked, "reset")
    locked.chmod(0)
    try:
        path = _write(tmp_path, f'[remediation]\ngpu_reset = ["{program}"]\n')
        config = load_config(path, environ=ENV)
        problems = config_problems(config)
        if os.geteuid() != 0:  # root searches any directory
            assert [p.key for p in problems] == ["remediation.gpu_reset"]
        else:
            assert problems == []
    finally:
        locked.chmod(stat.S_IRWXU)

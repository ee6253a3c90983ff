"""Configuration is total (hardening issue, items 11-13): every value is checked before it is
used (finite numbers, known placeholders, non-empty argv, node paths that stay what they
say), every bad file is one line naming the file, the key and the fix, and a configuration
the prolog cannot use lets the job run, as documented, with that one line in slurmd's log."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.admin import config as config_cli
from healthd.fixtures import write_host_tree
from medic_core import proc
from medic_core.config import ConfigError, load_config
from medic_core.settings import load_settings
from medic_core.store import store_settings
from medic_core.store.engine import parse_url
from tests.installed import installed_medic

VENV_BIN = Path(sys.executable).parent


def _write(tmp_path: Path, text: str, name: str = "medic.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _check(path: Path) -> tuple[int, str]:
    done = CliRunner().invoke(config_cli, ["check", "--config", str(path)])
    return done.exit_code, done.output


# --- item 12: validation is total ----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("[healthd]\njitter = nan", "healthd.jitter"),
        ("[healthd]\nlaunch_max_age = nan", "healthd.launch_max_age"),
        ("[healthd]\nlaunch_max_age = -nan", "healthd.launch_max_age"),
        ("[hooks]\nrelease_wait = inf", "hooks.release_wait"),
        ("[remediation]\naction_timeout = inf", "remediation.action_timeout"),
        ("[checks.memory]\ninterval = nan", "checks.memory.interval"),
        ("[remediation.webhook]\nurl = 'https://x'\nsecret = 's'\ntimeout = nan",
         "remediation.webhook.timeout"),
    ],
)  # fmt: skip
def test_a_number_that_is_not_finite_is_refused(tmp_path: Path, body: str, key: str) -> None:
    code, output = _check(_write(tmp_path, body))
    assert code != 0
    assert len(output.strip().splitlines()) == 1 and "Traceback" not in output, output
    assert output.startswith(f"medic: {tmp_path / 'medic.toml'}: {key}: ")
    assert output.strip().endswith("is not a finite number; give a plain number")


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('gpu_reset = ["/usr/bin/nvidia-smi", "-i", "{bogus}"]',
         "remediation.gpu_reset: '{bogus}': {bogus} is not a placeholder"),
        ("gpu_reset = []", "remediation.gpu_reset: is empty"),
        ('gpu_reset = ["", "{gpu}"]', "remediation.gpu_reset: starts with an empty program"),
        ('driver_reload = ["/sbin/reload", "{gpu}"]',
         "remediation.driver_reload: '{gpu}': {gpu} is not a placeholder"),
        ('driver_reload = ["/sbin/reload", "{node.__class__}"]',
         "{node.__class__} is not a placeholder"),
        ('gpu_reset = ["/bin/reset", "{gpu:>999999999}"]', "{gpu:>999999999} is not a"),
        ('gpu_reset = ["/bin/reset", "{gpu"]', "'{gpu' is not a valid template"),
        ("driver_reload = []", "remediation.driver_reload: is empty"),
    ],
)  # fmt: skip
def test_repair_commands_are_checked_as_the_ladder_will_run_them(
    tmp_path: Path, body: str, problem: str
) -> None:
    code, output = _check(_write(tmp_path, f"[remediation]\n{body}\n"))
    assert code != 0 and problem in output, output
    assert len(output.strip().splitlines()) == 1


def test_repair_commands_with_known_placeholders_and_literal_braces_pass(tmp_path: Path) -> None:
    # Programs that exist: `medic config check` looks for them (tests/test_config_validation.py).
    body = (
        '[remediation]\ngpu_reset = ["/usr/bin/true", "-r", "-i", "{gpu}", "--on={node}"]\n'
        'driver_reload = ["/usr/bin/env", "{{literal}}", "{node}"]\n'
    )
    code, output = _check(_write(tmp_path, body))
    assert code == 0, output
    settings = load_settings(load_config(tmp_path / "medic.toml"))
    argv = [a.format(gpu=3, node="n1") for a in settings.remediation.driver_reload]
    assert argv == ["/usr/bin/env", "{literal}", "n1"]


def test_an_empty_sweep_probe_program_is_refused(tmp_path: Path) -> None:
    code, output = _check(_write(tmp_path, '[sweep]\nprobe = ["", "sweep"]\n'))
    assert code != 0 and "sweep.probe: starts with an empty program name" in output


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("/var/lib/medic?mode=ro", "holds '?'"),
        ("/var/lib/medic#frag", "holds '#'"),
        ("var/lib/medic", "is not absolute"),
        ("/var/lib/medic/../../etc", "climbs out with '..'"),
        ("/var/lib/{nodes}", "unknown placeholder"),
        ("/var/lib/node}", "unknown placeholder"),
    ],
)
def test_a_state_dir_that_would_put_the_store_elsewhere_is_refused(
    tmp_path: Path, value: str, problem: str
) -> None:
    """A "?" in state_dir made the default store URL `sqlite:////var/lib/medic?mode=ro/
    medic.db`: the SQLite file outside state_dir (before: `config check` said OK)."""
    path = _write(tmp_path, f'[node]\nstate_dir = "{value}"\n')
    with pytest.raises(ConfigError, match=r"node\.state_dir: .*" + problem.replace("?", r"\?")):
        load_config(path)
    code, output = _check(path)
    assert code != 0 and "node.state_dir: " in output and problem in output


def test_the_default_store_is_a_file_inside_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state {node} dir"
    config = load_config(_write(tmp_path, f'[node]\nstate_dir = "{state}"\n'), environ={
        "MEDIC_NODE_NAME": "n1"})  # fmt: skip
    url = parse_url(store_settings(config).url)
    assert Path(str(url.database)).parent == tmp_path / "state n1 dir"
    assert not url.query


def test_a_node_name_that_is_not_a_plain_name_cannot_stand_in_a_path(tmp_path: Path) -> None:
    path = _write(tmp_path, '[node]\nstate_dir = "/var/lib/medic/{node}"\n')
    for bad in ("../../etc", "..", "a/b"):
        with pytest.raises(ConfigError, match="cannot stand in a path; set MEDIC_NODE_NAME"):
            load_config(path, environ={"MEDIC_NODE_NAME": bad})


# --- item 13: one line, never a traceback ---------------------------------------------------


@pytest.mark.parametrize("table", ["healthd", "hooks", "node", "store", "remediation", "slurm"])
def test_a_table_that_is_not_a_table_is_one_line(tmp_path: Path, table: str) -> None:
    """`healthd = 5` was a TypeError traceback from `medic config check`."""
    path = _write(tmp_path, f"{table} = 5\n")
    code, output = _check(path)
    assert code != 0
    assert (
        output.strip() == f"medic: {path}: {table}: expected a table, got 5; write it as [{table}]"
    )


def test_a_config_that_is_a_directory_or_not_utf8_is_one_line(tmp_path: Path) -> None:
    """IsADirectoryError and UnicodeDecodeError were tracebacks."""
    (tmp_path / "medic.toml").mkdir()
    with pytest.raises(ConfigError, match=r"medic.toml: -: is a directory; point at the"):
        load_config(environ={"MEDIC_CONFIG": str(tmp_path / "medic.toml")})
    binary = tmp_path / "latin1.toml"
    binary.write_bytes(b'[healthd]\ngpus = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin1.toml: -: not UTF-8 text \(byte 21\)"):
        load_config(binary)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_an_unreadable_config_is_one_line(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Read as an unprivileged user (root reads any file): PermissionError was a traceback.
    The user runs the installed wheel (tests/installed.py), as on a node."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="medic-unreadable-"))
    try:
        work.chmod(0o755)
        secret = work / "medic.toml"
        secret.write_text("[healthd]\n")
        secret.chmod(0o600)
        code = (
            "import sys\nfrom medic_core.config import ConfigError, load_config\n"
            f"try:\n    load_config(__import__('pathlib').Path({str(secret)!r}))\n"
            "except ConfigError as exc:\n    print(exc)\n    sys.exit(2)\n"
        )
        env = {"PATH": "/usr/bin:/bin"}
        done = proc.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             str(installed_medic().python), "-I", "-c", code],
            env=env, timeout=60, cwd=work,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stdout.strip() == (
            f"{secret}: -: cannot read it (Permission denied); make it readable by root"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- item 11: a configuration the prolog cannot use lets the job run ----------------------------


def _hook_env(tmp_path: Path, config: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "MEDIC_CONFIG": str(config),
        "MEDIC_NODE_NAME": "plain1",
        "SLURM_JOB_ID": "42",
    }


def _config(tmp_path: Path, extra: str) -> Path:
    root = tmp_path / "host"
    if not root.exists():
        write_host_tree(root)
    return _write(
        tmp_path,
        f"""
[node]
host_root = "{root}"
state_dir = "{tmp_path / "state"}"
socket = "{tmp_path / "no-daemon.sock"}"
[slurm]
conf = "{tmp_path / "no-slurm.conf"}"
# Burn-in off: these tests judge a node in service, not one never burnt in
# (tests/test_burn_in_gate.py).
[remediation.burn_in]
new_node = []
[hooks]
release_held = false
{extra}
""",
    )


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[healthd]\ngpus = "none"\njitter = "lots"', "healthd.jitter"),
        ('[healthd]\ngpus = "none"\n[checks.memory]\nbogus = 1', "checks.memory.bogus"),
        ('[healthd]\ngpus = "none"\n[checks.nope]\nenabled = true', "checks.nope"),
        ('[healthd]\ngpus = "maybe"', "healthd.gpus"),
        ("healthd = 5", "healthd"),
        ("[hooks.x]\n", "hooks.x"),
    ],
)
def test_the_inline_prolog_lets_the_job_run_on_a_config_error(
    tmp_path: Path, extra: str, key: str
) -> None:
    """The daemon is down, so the prolog judges inline and reads `[healthd]` and
    `[checks.*]` itself: a mistake there was a traceback and exit 1 (the job requeued and
    the node drained "Prolog error" by Slurm) on every node at once."""
    config = _config(tmp_path, extra)
    done = proc.run([str(VENV_BIN / "medic-prolog")], env=_hook_env(tmp_path, config), timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"medic-prolog: {config}: {key}") or (
        lines[0].startswith(f"medic-prolog: {config}: ") and key in lines[0]
    ), lines[0]
    assert lines[0].endswith("(job 42 allowed)")


@pytest.mark.parametrize("kind", ["directory", "latin-1", "bad TOML"])
def test_a_config_file_the_prolog_cannot_read_lets_the_job_run(tmp_path: Path, kind: str) -> None:
    config = tmp_path / "medic.toml"
    if kind == "directory":
        config.mkdir()
    elif kind == "latin-1":
        config.write_bytes(b'[hooks]\non_unknown = "caf\xe9"\n')
    else:
        config.write_text("[hooks\n")
    done = proc.run([str(VENV_BIN / "medic-prolog")], env=_hook_env(tmp_path, config), timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"medic-prolog: {config}: -: "), done.stderr
    assert lines[0].endswith("(job 42 allowed)")


def test_the_inline_prolog_with_a_good_config_still_judges(tmp_path: Path) -> None:
    """The control: the same setup with a good file runs the launch tier and allows."""
    config = _config(tmp_path, '[healthd]\ngpus = "none"')
    done = proc.run([str(VENV_BIN / "medic-prolog")], env=_hook_env(tmp_path, config), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "allowed)" not in done.stderr


def test_the_daemon_refuses_a_config_it_cannot_read_in_one_line(tmp_path: Path) -> None:
    """`medic-healthd --config DIR` was an IsADirectoryError traceback; a non-UTF-8 file a
    UnicodeDecodeError one."""
    (tmp_path / "dir.toml").mkdir()
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b'[healthd]\ngpus = "caf\xe9"\n')
    for config, problem in ((tmp_path / "dir.toml", "is a directory"), (latin1, "not UTF-8")):
        done = proc.run(
            [str(VENV_BIN / "medic-healthd"), "--config", str(config)],
            env={"PATH": "/usr/bin:/bin", "MEDIC_NODE_NAME": "n1"},
            timeout=60,
        )
        assert done.returncode == 78, done.stderr  # EX_CONFIG: systemd does not restart it
        assert done.stderr.strip().splitlines() == [
            f"medic-healthd: {config}: -: {done.stderr.split(': -: ', 1)[1].strip()}"
        ]
        assert problem in done.stderr and "Traceback" not in done.stderr


def test_the_daemon_on_a_store_it_cannot_open_is_one_line_and_retried(tmp_path: Path) -> None:
    """A corrupt (or unreachable) store at start was a traceback; now one line and exit 1,
    which systemd's Restart= retries (a store may come back; a config will not: 78)."""
    corrupt = tmp_path / "medic.db"
    corrupt.write_bytes(b"not a database" * 100)
    conf = tmp_path / "medic.toml"
    conf.write_text(f'[store]\nurl = "sqlite:///{corrupt}"\n')
    done = proc.run(
        [str(VENV_BIN / "medic-healthd"), "--config", str(conf)],
        env={"PATH": "/usr/bin:/bin", "MEDIC_NODE_NAME": "n1"},
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("medic-healthd: store ") and "file is not a database" in line

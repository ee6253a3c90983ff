"""`medic config check` without importing every check (issue 27: <= 0.15 s as a process).

healthd.checks.check_tables imports only the shipped checks that have a table in the file
and takes the rest at their defaults; healthd.config_check finds every problem through it.
What makes that safe is held here: each check module registers the one check of its own
name, every shipped check's defaults are valid (also on a CPU node), and for any [checks]
tables the lean path gives the very problems, names and switches the full one gives. When a
site ships Python checks (entry points), every check is loaded, in the daemon's order.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import healthd.checks as checks
from healthd.checks import CheckTables, _parse_checks, load_check_configs, shipped_checks, site
from healthd.checks.base import parse_check_config, registered
from medic_core import proc
from medic_core.config import ConfigError, MedicConfig, parse_config

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(shipped_checks())


def _config(tables: dict[str, Any]) -> MedicConfig:
    return parse_config(tables, Path("/etc/medic/medic.toml"), "gpu001")


def test_each_check_module_registers_the_check_of_its_name() -> None:
    shipped = {s.name: s for s in checks.registry(site=False) if s.module.startswith("healthd.")}
    assert set(shipped) == shipped_checks()
    for name, spec in shipped.items():
        assert spec.module == f"healthd.checks.{name}", name


def test_every_shipped_checks_defaults_are_valid_and_enabled() -> None:
    for spec in checks.registry(site=False):
        where = f"checks.{spec.name}"
        cfg = parse_check_config(spec.config_type, {}, prefix=where, source=None)
        assert cfg.enabled, spec.name
        assert cfg.for_cpu_node().enabled, spec.name


def _both(config: MedicConfig) -> tuple[list[str], list[str] | None, CheckTables | None]:
    """The full loader's problems and disabled checks; the lean loader's, given only the
    shipped checks with a table (as check_tables imports them) and the rest at defaults."""
    try:
        full = load_check_configs(config)
        full_problems: list[str] = []
        full_off: list[str] | None = sorted(n for n, c in full.items() if not c.enabled)
    except ConfigError as exc:
        full_problems, full_off = exc.lines(), None
    table = config.table("checks")
    named = set(table) if isinstance(table, dict) else set()
    specs = {s.name: s for s in registered() if s.name in named or s.name not in SHIPPED}
    try:
        lean = _parse_checks(config, specs, frozenset(SHIPPED) - set(specs))
        lean_problems: list[str] = []
    except ConfigError as exc:
        lean, lean_problems = None, exc.lines()
    assert lean_problems == full_problems
    return full_problems, full_off, lean


NAMES = st.sampled_from([*SHIPPED, "command", "disabled", "bogus", "gpu_ecc2", ""])
VALUES = st.one_of(
    st.booleans(),
    st.integers(-5, 500),
    st.floats(-1, 1e4, allow_nan=False),
    st.text(max_size=6),
    st.lists(st.sampled_from([*SHIPPED, "nope", "command.x"]), max_size=3),
)
KEYS = st.sampled_from(["enabled", "interval", "timeout", "expected_count", "required_mounts"])
TABLES = st.one_of(st.dictionaries(KEYS, VALUES, max_size=3), VALUES)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.dictionaries(NAMES, TABLES, max_size=5), st.sampled_from(["auto", "none", 3]))
def test_the_lean_loader_finds_what_the_full_one_finds(
    tables: dict[str, Any], gpus: object
) -> None:
    config = _config({"checks": tables, "healthd": {"gpus": gpus}})
    problems, full_off, lean = _both(config)
    if problems:
        return
    assert lean is not None and full_off is not None
    assert lean.names() == sorted(load_check_configs(config))
    assert lean.disabled() == full_off


def test_disabled_lists_and_own_switches_count_alike() -> None:
    config = _config(
        {"checks": {"disabled": ["gpu_ecc", "memory"], "memory": {}, "ib": {"enabled": False}}}
    )
    _, full_off, lean = _both(config)
    assert lean is not None and lean.disabled() == full_off == ["gpu_ecc", "ib", "memory"]
    assert "gpu_ecc" in lean.at_defaults and "memory" in lean.configs


def test_site_checks_are_seen_where_importlib_metadata_sees_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from importlib.metadata import entry_points

    assert checks.site_checks_declared() == bool(entry_points(group=checks.SITE_GROUP))
    assert site.GROUP == checks.SITE_GROUP
    plain = tmp_path / "plain"
    (plain / "other-1.0.dist-info").mkdir(parents=True)
    (plain / "other-1.0.dist-info" / "entry_points.txt").write_text("[console_scripts]\nx = y\n")
    (plain / "old.egg-info").write_text("Name: old\n")  # a PKG-INFO file, not a directory
    (plain / "missing-2.0.dist-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "absent"), str(plain)])
    assert not checks.site_checks_declared()
    for layout in ("acme-1.0.dist-info", "acme.egg-info"):
        where = tmp_path / layout.split(".")[-1]
        (where / layout).mkdir(parents=True)
        (where / layout / "entry_points.txt").write_text("[medic.checks]\nacme = acme\n")
        monkeypatch.setattr(sys, "path", [str(plain), str(where)])
        assert checks.site_checks_declared(), layout
    bundle = tmp_path / "site.zip"
    bundle.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # what it cannot look into counts as yes
    monkeypatch.setattr(sys, "path", [str(plain), str(bundle)])
    assert checks.site_checks_declared()


# --- in a process of its own, as an operator runs it ---------------------------------------

PROBE = """
import json, sys
from cli.main import medic
try:
    medic.main(sys.argv[1:], prog_name="medic")
except SystemExit as exc:
    code = exc.code
loaded = sorted(m for m in sys.modules if m.startswith("healthd.checks."))
metadata = "importlib.metadata" in sys.modules
print(json.dumps({"code": code, "loaded": loaded, "metadata": metadata}))
"""


def _fresh(config: Path, pythonpath: str | None = None) -> dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = proc.run(
        [sys.executable, "-c", PROBE, "config", "check", "--config", str(config)],
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _modules(names: list[str]) -> list[str]:
    return [f"healthd.checks.{n}" for n in names]


def test_config_check_imports_only_the_checks_with_a_table(tmp_path: Path) -> None:
    config = tmp_path / "medic.toml"
    config.write_text(
        '[checks]\ndisabled = ["gpu_ecc"]\n\n[checks.ib]\nexpected_ports = 8\n\n'
        '[checks.filesystems]\nrequired_mounts = ["/"]\n\n'
        '[checks.command.gpfs]\nargv = ["/bin/true"]\n'
    )
    result = _fresh(config)
    assert result["code"] == 0
    assert set(result["loaded"]) - {"healthd.checks.base", "healthd.checks.command"} == {
        *_modules(["ib", "filesystems"])
    }
    assert not result["metadata"]  # no site check: the entry points are not read


def test_config_check_with_built_in_defaults_imports_no_check(tmp_path: Path) -> None:
    config = tmp_path / "medic.toml"
    config.write_text("")
    result = _fresh(config)
    assert result["code"] == 0
    assert not set(result["loaded"]) & set(_modules(SHIPPED))


def test_a_bad_table_of_an_unimported_check_is_still_found(tmp_path: Path) -> None:
    config = tmp_path / "medic.toml"
    config.write_text('[checks.gpu_thermal]\nwarn_temperature_c = "hot"\n')
    done = proc.run(
        [str(Path(sys.executable).parent / "medic"), "config", "check", "--config", str(config)],
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1
    assert "checks.gpu_thermal.warn_temperature_c" in done.stderr


SITE_QUOTA = """
from healthd.checks.base import Check, Fault, Status, Tier, register

register(name="acme_quota", tiers=(Tier.PERIODIC,), interval=60, timeout=5,
         faults={"fs.acme": Fault(Status.WARN, "x")})(type("Quota", (Check,), {}))
"""
SITE_IB = SITE_QUOTA.replace('"acme_quota"', '"ib"').replace('"fs.acme"', '"ib.acme"')


def test_with_site_checks_every_check_loads_in_the_daemons_order(tmp_path: Path) -> None:
    """A site check taking a shipped name ("ib") loses to the shipped one, as in the daemon:
    so with site checks installed, the shipped checks load first, all of them."""
    (tmp_path / "acme_quota.py").write_text(SITE_QUOTA)
    (tmp_path / "acme_ib.py").write_text(SITE_IB)
    dist = tmp_path / "acme_site-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-site\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[medic.checks]\nacme_quota = acme_quota\nacme_ib = acme_ib\n"
    )
    config = tmp_path / "medic.toml"
    config.write_text("[checks.ib]\nexpected_ports = 8\n\n[checks.acme_quota]\ninterval = 30\n")
    result = _fresh(config, pythonpath=str(tmp_path))
    assert set(_modules(SHIPPED)) <= set(result["loaded"]) and result["metadata"]
    assert result["code"] == 0, result

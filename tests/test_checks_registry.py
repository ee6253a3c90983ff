"""The check registry, the vocabulary and per-check configuration."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

import healthd.checks as checks
from healthd.checks import base
from healthd.checks.base import (
    Check,
    CheckConfig,
    Remediation,
    Result,
    Status,
    Tier,
    parse_check_config,
    register,
    remediation_for,
    setting,
)
from healthd.checks.filesystems import FilesystemsConfig
from healthd.checks.ib import IbConfig
from medic_core.config import ConfigError, MedicConfig, parse_config

HOST_CHECKS = {"ib", "filesystems", "memory", "cpus", "kernel_log", "services"}


def _config(toml: str, path: Path = Path("/etc/medic/medic.toml")) -> MedicConfig:
    return parse_config(tomllib.loads(toml), path, "gpu001")


def test_registry_discovers_every_host_check_module() -> None:
    specs = {s.name: s for s in checks.registry()}
    assert set(specs) >= HOST_CHECKS
    for spec in specs.values():
        assert spec.tiers and spec.interval > 0 and spec.timeout > 0
        assert spec.description and "\n" not in spec.description
        assert set(spec.needs) <= base.CAPABILITIES
        assert issubclass(spec.config_type, CheckConfig)
        assert spec.check_class.spec is spec
    assert Tier.LAUNCH in specs["ib"].tiers
    assert specs["kernel_log"].tiers == {Tier.PERIODIC}
    assert "mounts" in specs["filesystems"].needs


def test_each_check_instance_is_fresh() -> None:
    spec = checks.get("ib")
    assert spec.create() is not spec.create()
    with pytest.raises(KeyError):
        checks.get("no-such-check")


def test_register_rejects_unknown_needs_and_duplicates() -> None:
    class Probe(Check[None, CheckConfig]):
        """A probe."""

    with pytest.raises(ValueError, match="unknown needs"):
        register(name="probe", tiers=(Tier.DEEP,), interval=1, timeout=1, needs=("gpu",))(Probe)
    with pytest.raises(ValueError, match="registered twice"):
        register(name="ib", tiers=(Tier.DEEP,), interval=1, timeout=1)(Probe)
    assert "probe" not in {s.name for s in checks.registry()}


@pytest.mark.parametrize(
    ("fault_class", "expected"),
    [
        ("ib.port.down", Remediation.REBOOT),
        ("ib.errors.symbol", Remediation.NONE),
        ("mem.edac.ue", Remediation.RMA),
        ("fs.hung", Remediation.DRAIN),
        ("fs.full", Remediation.NONE),
        ("kernel.mce", Remediation.DRAIN),
        ("kernel.mce.corrected", Remediation.NONE),
        ("service.down", Remediation.RESTART_SERVICE),
        ("check.timeout", Remediation.NONE),
        ("gpu.xid.79", None),
        (None, None),
    ],
)
def test_remediation_by_longest_prefix(fault_class: str | None, expected: Remediation) -> None:
    assert remediation_for(fault_class) == expected


def test_result_message_is_one_line_and_worst_orders_statuses() -> None:
    r = Result("x", Status.OK, None, None, "two\n  lines")
    assert r.message == "two lines"
    assert base.worst([Status.OK, Status.WARN, Status.NOT_APPLICABLE]) is Status.WARN
    assert base.worst([Status.UNKNOWN, Status.CRITICAL]) is Status.CRITICAL
    assert base.worst([]) is Status.NOT_APPLICABLE


def test_load_check_configs_parses_tables_and_defaults_the_rest() -> None:
    cfg = _config(
        """
        [checks.ib]
        expected_ports = 8
        min_rate_gbps = 400
        counter_limits = { symbol_error = 5 }
        [checks.filesystems]
        required_mounts = ["/home", "/lustre"]
        interval = 30
        """
    )
    configs = checks.load_check_configs(cfg)
    assert set(configs) >= HOST_CHECKS
    ib = configs["ib"]
    assert isinstance(ib, IbConfig)
    assert ib.expected_ports == 8 and ib.min_rate_gbps == 400.0
    assert ib.counter_limits["symbol_error"] == 5
    assert ib.counter_limits["link_downed"] == 0  # the other defaults stay
    fs = configs["filesystems"]
    assert isinstance(fs, FilesystemsConfig)
    assert fs.required_mounts == ("/home", "/lustre") and fs.interval == 30.0
    assert checks.get("filesystems").interval_for(fs) == 30.0
    assert checks.get("filesystems").timeout_for(fs) == checks.get("filesystems").timeout


@pytest.mark.parametrize(
    ("toml", "key", "words"),
    [
        ("[checks.ib]\nmin_rate_gbps = 'fast'", "checks.ib.min_rate_gbps", "expected a number"),
        ("[checks.ib]\nmin_rate_gbps = -1", "checks.ib.min_rate_gbps", "below the minimum"),
        ("[checks.ib]\nexpected_prots = 8", "checks.ib.expected_prots", "unknown key"),
        ("[checks.ib]\nenabled = 1", "checks.ib.enabled", "true or false"),
        (
            "[checks.ib]\ncounter_limits = { symbol_errors = 1 }",
            "checks.ib.counter_limits.symbol_errors",
            "unknown key",
        ),
        ("[checks.ib]\nlink_layers = ['RoCE']", "checks.ib.link_layers", "not allowed"),
        ("[checks.gpu_magic]\nx = 1", "checks.gpu_magic", "unknown check"),
        ("[checks]\nib = 3", "checks.ib", "expected a table"),
        (
            "[checks.filesystems]\nrequired_mounts = ['home']",
            "checks.filesystems.required_mounts",
            "not absolute",
        ),
        (
            "[checks.filesystems]\ntimeout = 2\nmount_timeout = 5",
            "checks.filesystems.mount_timeout",
            "not below",
        ),
        (
            "[checks.kernel_log]\ndisabled_rules = ['no_such_rule']",
            "checks.kernel_log.disabled_rules",
            "not allowed",
        ),
    ],
)
def test_config_errors_name_file_and_key(toml: str, key: str, words: str) -> None:
    path = Path("/etc/medic/medic.toml")
    with pytest.raises(ConfigError) as info:
        checks.load_check_configs(_config(toml, path))
    assert info.value.key == key
    assert info.value.path == path
    text = str(info.value)
    assert text.startswith(f"{path}: {key}: ") and words in text
    assert "\n" not in text


def test_parse_check_config_handles_optional_and_tuple_types() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Sample(CheckConfig):
        limit: int | None = setting(None, minimum=1, maximum=10)
        names: tuple[str, ...] = setting(())

    cfg = parse_check_config(Sample, {"limit": 3, "names": ["a"]}, prefix="checks.s", source=None)
    assert cfg.limit == 3 and cfg.names == ("a",)
    with pytest.raises(ConfigError, match=r"<defaults>: checks.s.limit: 11 is above"):
        parse_check_config(Sample, {"limit": 11}, prefix="checks.s", source=None)
    with pytest.raises(ConfigError, match="expected a list"):
        parse_check_config(Sample, {"names": "a"}, prefix="checks.s", source=None)
    rows = dict((k, (d, doc)) for k, d, doc in base.describe_config(IbConfig))
    assert rows["min_rate_gbps"][0] == "0.0" and rows["enabled"][1]


def test_every_check_is_documented() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "checks.md").read_text()
    for spec in checks.registry():
        assert f"\n## {spec.name}\n" in doc, spec.name
        assert spec.description in doc, spec.name


def test_require_nvml(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        base.CheckContext.for_root(tmp_path).require_nvml()
    client = object()
    assert base.CheckContext.for_root(tmp_path, nvml=client).require_nvml() is client

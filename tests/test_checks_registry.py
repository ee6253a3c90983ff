"""The check registry, the vocabulary and per-check configuration."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import healthd.checks as checks
from healthd import xid
from healthd.checks import base, gpu_common
from healthd.checks.base import (
    RECOMMENDATION_WORDS,
    RUNNER_FAULTS,
    Check,
    CheckConfig,
    CheckSpec,
    Fault,
    Recommendation,
    Result,
    Status,
    Tier,
    parse_check_config,
    register,
    remediation_for,
    setting,
    undeclared,
)
from healthd.checks.filesystems import FilesystemsConfig
from healthd.checks.ib import IbConfig
from healthd.checks.kernel_log import shipped_rules
from healthd.checks.reference import BEGIN, END, generated_block, render_reference, splice
from healthd.xid import CATALOG
from medic_core.config import ConfigError, MedicConfig, parse_config

HOST_CHECKS = {"ib", "filesystems", "memory", "cpus", "kernel_log", "services"}
DOC = Path(__file__).parents[1] / "docs" / "checks.md"
OOPS = Fault(Status.WARN, "x")


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
        register(
            name="probe", tiers=(Tier.DEEP,), interval=1, timeout=1, needs=("gpu",), faults={}
        )(Probe)
    with pytest.raises(ValueError, match="registered twice"):
        register(name="ib", tiers=(Tier.DEEP,), interval=1, timeout=1, faults={})(Probe)
    with pytest.raises(ValueError, match="not dotted lower case"):
        register(name="probe", tiers=(Tier.DEEP,), interval=1, timeout=1, faults={"Probe.X": OOPS})(
            Probe
        )
    with pytest.raises(ValueError, match="unknown recommendation 'fix_it'"):
        register(
            name="probe",
            tiers=(Tier.DEEP,),
            interval=1,
            timeout=1,
            faults={"probe.x": Fault(Status.WARN, "x", "fix_it")},
        )(Probe)
    assert "probe" not in {s.name for s in checks.registry()}


@pytest.mark.parametrize(
    ("fault_class", "expected"),
    [
        ("ib.port.down", Recommendation.RECHECK),
        ("ib.errors.symbol", Recommendation.NONE),
        ("mem.edac.ue", Recommendation.RMA),
        ("fs.hung", Recommendation.DRAIN),
        ("fs.full", Recommendation.NONE),
        ("kernel.mce", Recommendation.DRAIN),
        ("kernel.mce.corrected", Recommendation.NONE),
        ("service.down", Recommendation.RESTART_SERVICE),
        ("check.timeout", Recommendation.NONE),
        ("gpu.xid.79", None),
        (None, None),
    ],
)
def test_remediation_by_longest_prefix(fault_class: str | None, expected: Recommendation) -> None:
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


def test_docs_checks_md_holds_the_generated_reference() -> None:
    text = DOC.read_text()
    assert generated_block(text) == render_reference(), "run `medic checks docs --write`"


def test_splice_replaces_only_the_generated_block() -> None:
    page = f"# Title\n\nprose\n\n{BEGIN}\nold\n{END}\n\ntrailer\n"
    spliced = splice(page, "new\n")
    assert spliced == f"# Title\n\nprose\n\n{BEGIN}\n\nnew\n\n{END}\n\ntrailer\n"
    assert generated_block(spliced) == "new\n"
    with pytest.raises(ValueError, match="markers"):
        generated_block("no markers here")


def test_reference_documents_every_check_and_fault_class() -> None:
    text = render_reference()
    for spec in checks.registry():
        assert f"\n## {spec.name}\n" in text, spec.name
        assert spec.description.replace("<", "&lt;").replace(">", "&gt;") in text
        for fault_class in spec.faults:
            assert f"`{fault_class}`" in text, fault_class
        for key, _, _ in base.describe_config(spec.config_type):
            assert f"`{key}`" in text
    for rule in shipped_rules():
        assert f"`{rule.name}`" in text
    for number in CATALOG.entries:
        assert f"\n| {number} | " in text


# --- declared fault classes -------------------------------------------------------------

# The first segments a fault class may start with. The source scan below looks for these;
# a check using a new area must add it here (test_declared_areas_are_scanned says so).
AREAS = ("check", "cpu", "fs", "gpu", "ib", "kernel", "mem", "nccl", "service")
_SHAPE = re.compile(rf"(?:{'|'.join(AREAS)})(?:\.[a-z0-9_{{}}]+)+")
# Shared helpers whose call emits a fault class the calling check must declare (the
# helpers' check.nvml.* classes are runner-level, in RUNNER_FAULTS).
HELPER_FAULTS = {"command_failed": "check.command_failed"}
# Where the members of each declared family come from.
FAMILY_MEMBERS: dict[str, list[str]] = {
    "kernel.*": [rule.fault_class for rule in shipped_rules()],
    "gpu.xid.*": [entry.fault_class for entry in CATALOG.entries.values()],
    "check.nvml.*": sorted(gpu_common._PROBLEM_CLASSES.values()),
}


def _template(node: ast.JoinedStr) -> str:
    return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)


def emitted_in_source(spec: CheckSpec) -> set[str]:
    """The fault classes a check module's source names outside its register(...) call:
    string literals of a fault-class shape (f-strings with `{}` for each placeholder) and
    the classes of the shared helpers it calls."""
    module = importlib.import_module(spec.module)
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                skip.update(id(n) for n in ast.walk(decorator))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            text = _template(node)
            if _SHAPE.fullmatch(text):
                found.add(text)
                skip.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _SHAPE.fullmatch(node.value):
                found.add(node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in HELPER_FAULTS
        ):
            found.add(HELPER_FAULTS[node.func.id])
    return found


def _declares(keys: Iterable[str], emitted: str) -> bool:
    """Whether a declared key covers an emitted class or f-string template."""
    if "{}" not in emitted:
        return any(base.covers(key, emitted) for key in keys)
    pattern = re.compile(re.escape(emitted).replace(r"\{\}", "[a-z0-9_]+"))
    prefix = emitted.split("{}")[0]
    return any(
        pattern.fullmatch(key) or (key.endswith(".*") and prefix.startswith(key[:-1]))
        for key in keys
    )


SPECS = checks.registry()


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_emitted_fault_class_is_declared(spec: CheckSpec) -> None:
    emitted = emitted_in_source(spec)
    keys = [*spec.faults, *RUNNER_FAULTS]
    missing = sorted(e for e in emitted if not _declares(keys, e))
    assert not missing, f"{spec.module}: add {missing} to register(faults=...)"


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_declared_fault_class_is_emitted(spec: CheckSpec) -> None:
    assert spec.faults, f"{spec.name} declares no fault class"
    emitted = emitted_in_source(spec)
    for key in spec.faults:
        if key.endswith(".*"):
            assert FAMILY_MEMBERS.get(key), f"{key}: say in FAMILY_MEMBERS where members come from"
            continue
        assert any(_declares([key], e) for e in emitted), f"{spec.name} never emits {key}"


def test_data_driven_families_are_covered() -> None:
    declared = {k: s for s in SPECS for k in s.faults}
    for rule in shipped_rules():
        assert base.declared_fault(checks.get("kernel_log").faults, rule.fault_class)
    for entry in CATALOG.entries.values():
        assert base.declared_fault(checks.get("gpu_xid").faults, entry.fault_class)
    for family in FAMILY_MEMBERS:
        assert family in declared or family in RUNNER_FAULTS, family


def test_declared_areas_are_scanned() -> None:
    for key in [*RUNNER_FAULTS, *(k for s in SPECS for k in s.faults)]:
        assert key.split(".")[0] in AREAS, f"add {key.split('.')[0]!r} to AREAS"


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_declared_fault_class_has_a_recommendation(spec: CheckSpec) -> None:
    for key, declared in {**spec.faults, **RUNNER_FAULTS}.items():
        assert set(declared.words()) <= set(RECOMMENDATION_WORDS), key
        if isinstance(declared.recommendation, Mapping):
            assert set(declared.recommendation) == set(declared.statuses), key
        if key.endswith(".*"):
            for member in FAMILY_MEMBERS[key]:
                if key == "gpu.xid.*":
                    assert CATALOG.lookup(int(member.rsplit(".", 1)[1])).recommendation
                else:
                    assert remediation_for(member) is not None, member
            continue
        # exactly one source: the check's own word (GPU, deep) or REMEDIATIONS (host)
        own, table = declared.recommendation is not None, remediation_for(key) is not None
        assert own != table, f"{key}: recommendation {declared.recommendation!r} vs table"


def test_gpu_recommendation_words_are_the_catalogs() -> None:
    assert set(xid.RECOMMENDATIONS) <= set(RECOMMENDATION_WORDS)


def test_undeclared() -> None:
    spec = checks.get("ib")

    def result(fault_class: str | None) -> Result:
        return Result("ib", Status.WARN, fault_class, None, "x")

    assert not undeclared(spec, result("ib.port.down"))
    assert not undeclared(spec, result(None))
    assert not undeclared(spec, result("check.timeout"))
    assert not undeclared(spec, result("check.nvml.gpu_lost"))
    assert undeclared(spec, result("ib.port.flapping"))
    assert undeclared(spec, result("gpu.ecc.dbe"))
    xids = checks.get("gpu_xid")
    assert not undeclared(xids, result("gpu.xid.79"))
    assert undeclared(xids, result("gpu.xidx"))


def test_require_nvml(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        base.CheckContext.for_root(tmp_path).require_nvml()
    client = object()
    assert base.CheckContext.for_root(tmp_path, nvml=client).require_nvml() is client

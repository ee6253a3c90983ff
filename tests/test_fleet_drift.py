"""Fleet drift (issue 26, item 3): each daemon's inventory of its node (healthd.inventory),
its row in the store (schema version 8), the pure comparison (remediation.drift) and
`medic fleet drift` on a real SQLite store."""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.lab import scenario as sc
from cli.lab.nvml import build
from cli.main import medic
from healthd.inventory import (
    RETRY_SECONDS,
    InventoryRecorder,
    cuda_text,
    gather,
    gather_hcas,
)
from healthd.nvml_client import GpuInfo, NvmlGpuLost, NvmlNotSupported, NvmlUnavailable
from medic_core import proc
from medic_core.config import ConfigError, parse_config
from medic_core.inventory import (
    ITEMS,
    NO_GPUS,
    FleetSettings,
    GpuInventory,
    HcaInventory,
    NodeInventory,
)
from medic_core.store import MIGRATIONS, ConditionUpdate, Status, open_store
from remediation.drift import Basis, find_drift
from tests.conftest import poll
from tests.fakes import FakeClock
from tests.test_cli_startup import heavy, modules_loaded

H100 = "NVIDIA H100 80GB HBM3"
AT = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)


# ---- gather: fake NVML answers and a root tree ------------------------------------------------


class FakeVersions:
    """NVML as gather asks it; `fail` maps a call (and GPU) to the error it raises."""

    def __init__(self, gpus: int = 2, vbios: Mapping[int, str] | None = None) -> None:
        self.gpus = gpus
        self.vbios = dict(vbios or {})
        self.fail: dict[tuple[str, int | None], Exception] = {}

    def _maybe_fail(self, call: str, index: int | None = None) -> None:
        error = self.fail.get((call, index))
        if error is not None:
            raise error

    def driver_version(self) -> str:
        self._maybe_fail("driver")
        return "550.127.05"

    def cuda_driver_version(self) -> int:
        self._maybe_fail("cuda")
        return 12040

    def device_count(self) -> int:
        self._maybe_fail("count")
        return self.gpus

    def gpu_info(self, index: int, *, refresh: bool = False) -> GpuInfo:
        self._maybe_fail("info", index)
        return GpuInfo(index, f"GPU-{index}", f"S{index}", H100, f"0000:{index:02X}:00.0")

    def vbios_version(self, index: int) -> str:
        self._maybe_fail("vbios", index)
        return self.vbios.get(index, "96.00.99.00.01")

    def inforom_image_version(self, index: int) -> str:
        self._maybe_fail("inforom", index)
        return "G520.0200.00.05"


def host_tree(root: Path, *, kernel: str | None = "5.15.0-119-generic\n") -> Path:
    def write(rel: str, text: str) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)

    if kernel is not None:
        write("proc/sys/kernel/osrelease", kernel)
    write("sys/class/dmi/id/bios_version", "1.8.2\n")
    write("sys/class/infiniband/mlx5_0/fw_ver", "28.39.1002\n")
    write("sys/class/infiniband/mlx5_1/fw_ver", "28.39.1002\n")
    return root


def test_gather_reads_every_version(tmp_path: Path) -> None:
    inventory = gather(host_tree(tmp_path), FakeVersions(gpus=2, vbios={1: "96.00.74.00.01"}))
    assert inventory == NodeInventory(
        driver="550.127.05",
        cuda="12.4",
        kernel="5.15.0-119-generic",
        bios="1.8.2",
        gpus=(
            GpuInventory(0, H100, "GPU-0", "96.00.99.00.01", "G520.0200.00.05"),
            GpuInventory(1, H100, "GPU-1", "96.00.74.00.01", "G520.0200.00.05"),
        ),
        hcas=(HcaInventory("mlx5_0", "28.39.1002"), HcaInventory("mlx5_1", "28.39.1002")),
    )
    assert inventory.node_class == f"2x {H100}"


def test_what_cannot_be_read_is_none_never_a_guess(tmp_path: Path) -> None:
    root = host_tree(tmp_path, kernel=None)
    (root / "sys/class/dmi/id/bios_version").write_text("two\nlines\n")
    (root / "sys/class/infiniband/mlx5_1/fw_ver").unlink()
    (root / "sys/class/infiniband/mlx5_2").mkdir()
    (root / "sys/class/infiniband/mlx5_2/fw_ver").write_text("x" * 5000)
    nvml = FakeVersions(gpus=3)
    nvml.fail[("vbios", 0)] = NvmlNotSupported("nvmlDeviceGetVbiosVersion", 0, "not supported")
    nvml.fail[("inforom", 2)] = NvmlGpuLost("nvmlDeviceGetInforomImageVersion", 2, "lost")
    nvml.fail[("info", 1)] = NvmlGpuLost("nvmlDeviceGetPciInfo", 1, "lost")
    nvml.fail[("cuda", None)] = NvmlNotSupported("nvmlSystemGetCudaDriverVersion", None, "")
    inventory = gather(root, nvml)
    assert inventory is not None
    assert (inventory.kernel, inventory.bios, inventory.cuda) == (None, None, None)
    assert inventory.driver == "550.127.05"
    assert [(g.index, g.vbios, g.inforom) for g in inventory.gpus] == [
        (0, None, "G520.0200.00.05"),
        (2, "96.00.99.00.01", None),
    ]  # GPU 1 gave not even its name: left out
    assert inventory.hcas == (
        HcaInventory("mlx5_0", "28.39.1002"),
        HcaInventory("mlx5_1", None),
        HcaInventory("mlx5_2", None),
    )


def test_no_nvml_answer_is_no_inventory_not_a_cpu_node(tmp_path: Path) -> None:
    nvml = FakeVersions()
    nvml.fail[("count", None)] = NvmlUnavailable("nvmlDeviceGetCount", None, "driver not loaded")
    assert gather(host_tree(tmp_path), nvml) is None
    cpu = gather(host_tree(tmp_path), None)
    assert cpu is not None and cpu.node_class == NO_GPUS and cpu.driver is None


def test_an_empty_root_gathers_nothing_but_fails_not(tmp_path: Path) -> None:
    assert gather(tmp_path, None) == NodeInventory()
    assert gather_hcas(tmp_path / "nowhere") == ()


@pytest.mark.parametrize(
    ("encoded", "text"),
    [(12040, "12.4"), (13000, "13.0"), (11080, "11.8"), (0, None), (None, None)],
)
def test_cuda_text(encoded: int | None, text: str | None) -> None:
    assert cuda_text(encoded) == text


# ---- the inventory's JSON ------------------------------------------------------------------

versions = st.none() | st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)
gpu_invs = st.builds(
    GpuInventory,
    index=st.integers(0, 15),
    name=st.sampled_from([H100, "NVIDIA A100-SXM4-80GB"]),
    uuid=st.text(max_size=8),
    vbios=versions,
    inforom=versions,
)
inventories = st.builds(
    NodeInventory,
    driver=versions,
    cuda=versions,
    kernel=versions,
    bios=versions,
    gpus=st.lists(gpu_invs, max_size=4).map(tuple),
    hcas=st.lists(st.builds(HcaInventory, st.text(min_size=1, max_size=8), versions), max_size=2)
    .map(tuple),
)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(inventories)
def test_an_inventory_survives_its_json(inventory: NodeInventory) -> None:
    assert NodeInventory.from_json(json.loads(json.dumps(inventory.to_json()))) == inventory


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"format": 2},
        {"format": 1, "gpus": {}},
        {"format": 1, "driver": 5},
        {"format": 1, "driver": "9" * 500},
        {"format": 1, "gpus": [{"index": True, "name": H100}]},
        {"format": 1, "gpus": [{"index": 0, "name": None}]},
        {"format": 1, "gpus": ["x"]},
        {"format": 1, "hcas": [{"device": 3}]},
    ],
)
def test_a_bad_inventory_is_one_clear_line(data: Any) -> None:
    with pytest.raises(ValueError) as caught:
        NodeInventory.from_json(data)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(("inventory", "an "))


# ---- the comparison ------------------------------------------------------------------------


def node(
    driver: str = "550.127.05", vbios: tuple[str, ...] = ("A",) * 4, **kw: Any
) -> NodeInventory:
    gpus = tuple(GpuInventory(i, H100, f"u{i}", v, "G1") for i, v in enumerate(vbios))
    return NodeInventory(driver=driver, cuda="12.4", kernel="k1", bios="b1", gpus=gpus, **kw)


def test_one_gpu_with_another_vbios_is_named_by_node_item_and_gpu() -> None:
    fleet = {f"n{i}": node() for i in range(1, 5)}
    fleet["n3"] = node(vbios=("A", "A", "B", "A"))
    [finding] = find_drift(fleet)
    assert (finding.node, finding.item, finding.target, finding.value) == (
        "n3",
        "vbios",
        "GPU 2",
        "B",
    )
    assert finding.expected == ("A",) and finding.basis is Basis.MAJORITY and finding.is_drift


def test_golden_versions_win_over_the_majority() -> None:
    fleet = {"n1": node(driver="535.1"), "n2": node(driver="535.1"), "n3": node()}
    found = find_drift(fleet, {"driver": ["550.127.05"]})
    assert [(f.node, f.basis) for f in found] == [("n1", Basis.GOLDEN), ("n2", Basis.GOLDEN)]
    assert find_drift(fleet, {"driver": ["535.1", "550.127.05"]}) == []


def test_classes_are_compared_apart() -> None:
    a100 = NodeInventory(driver="535.1", gpus=(GpuInventory(0, "A100", "u", "X", None),))
    fleet = {"n1": node(), "n2": node(), "n3": a100}
    assert find_drift(fleet) == []  # n3 is alone in its class


def test_unknown_values_neither_vote_nor_drift() -> None:
    fleet = {"n1": node(), "n2": NodeInventory(driver=None, gpus=node().gpus), "n3": node()}
    assert find_drift(fleet) == []


def test_a_two_node_split_is_ambiguous_for_both() -> None:
    found = find_drift({"n1": node(), "n2": node(driver="535.1")})
    assert {(f.node, f.basis) for f in found} == {
        ("n1", Basis.AMBIGUOUS),
        ("n2", Basis.AMBIGUOUS),
    }
    assert all(f.expected == ("535.1", "550.127.05") and not f.is_drift for f in found)


def test_gpu_targets_sort_by_number() -> None:
    fleet = {f"n{i}": node(vbios=("A",) * 12) for i in range(3)}
    fleet["n0"] = node(vbios=("A",) * 2 + ("B",) + ("A",) * 7 + ("B", "A"))
    assert [f.target for f in find_drift(fleet)] == ["GPU 2", "GPU 10"]


values = st.sampled_from(["v1", "v2", "v3"])


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=1, max_size=9), st.data())
def test_the_majority_value_is_never_drift_and_ties_are_never_drift(
    drivers: list[str], data: st.DataObject
) -> None:
    fleet = {f"n{i}": node(driver=d) for i, d in enumerate(drivers)}
    found = [f for f in find_drift(fleet) if f.item == "driver"]
    counts = {v: drivers.count(v) for v in set(drivers)}
    top = max(counts.values())
    leaders = {v for v, n in counts.items() if n == top}
    for f in found:
        assert f.value == drivers[int(f.node[1:])]
        if len(leaders) == 1:
            assert f.value not in leaders and f.basis is Basis.MAJORITY
        else:
            assert f.basis is (Basis.AMBIGUOUS if f.value in leaders else Basis.MAJORITY)
    majority = [v for v, n in counts.items() if n * 2 > len(drivers)]
    assert not any(f.value in majority for f in found)
    reported = {f.node for f in found}
    assert reported == {
        n for n, d in zip(fleet, drivers, strict=True) if d not in leaders or len(leaders) > 1
    }


@settings(max_examples=200, deadline=None)
@given(
    peers=st.integers(2, 6),
    item=st.sampled_from(ITEMS),
    odd=st.integers(0, 6),
)
def test_a_node_differing_in_one_item_is_reported_for_exactly_that_item(
    peers: int, item: str, odd: int
) -> None:
    hcas = (HcaInventory("mlx5_0", "28.1"),)
    base = NodeInventory(
        driver="d1", cuda="c1", kernel="k1", bios="b1",
        gpus=tuple(GpuInventory(i, H100, f"u{i}", "A", "G1") for i in range(2)), hcas=hcas,
    )  # fmt: skip
    if item in ("vbios", "inforom"):
        gpus = list(base.gpus)
        gpus[1] = GpuInventory(1, H100, "u1", *(("Z", "G1") if item == "vbios" else ("A", "Z")))
        other = NodeInventory(**{**base.__dict__, "gpus": tuple(gpus)})
    elif item == "hca_fw":
        other = NodeInventory(**{**base.__dict__, "hcas": (HcaInventory("mlx5_0", "Z"),)})
    else:
        other = NodeInventory(**{**base.__dict__, item: "Z"})
    fleet = {f"n{i}": base for i in range(peers + 1)}
    odd_node = f"n{odd % (peers + 1)}"
    fleet[odd_node] = other
    found = find_drift(fleet)
    assert [(f.node, f.item, f.value, f.basis) for f in found] == [
        (odd_node, item, "Z", Basis.MAJORITY)
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(values, min_size=1, max_size=8), st.lists(values, min_size=1, max_size=2))
def test_with_golden_exactly_the_values_outside_it_drift(
    drivers: list[str], golden: list[str]
) -> None:
    fleet = {f"n{i}": node(driver=d) for i, d in enumerate(drivers)}
    found = [f for f in find_drift(fleet, {"driver": golden}) if f.item == "driver"]
    assert {f.node for f in found} == {
        n for n, d in zip(fleet, drivers, strict=True) if d not in golden
    }
    assert all(f.basis is Basis.GOLDEN and f.expected == tuple(golden) for f in found)


# ---- [fleet] ---------------------------------------------------------------------------------


def fleet_config(tmp_path: Path, text: str) -> Any:
    import tomllib

    return parse_config(tomllib.loads(text), tmp_path / "medic.toml", "n1")


def test_fleet_settings_read_golden_lists(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, '[fleet.golden]\nvbios = ["96.00.99.00.01"]\n')
    settings_ = FleetSettings.from_config(config)
    assert settings_.golden == {"vbios": ("96.00.99.00.01",)} and settings_.inventory_every == 3600


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[fleet.golden]\nvbioz = ["1"]\n', "fleet.golden.vbioz"),
        ('[fleet.golden]\nvbios = "96.00"\n', "fleet.golden.vbios"),
        ("[fleet.golden]\nvbios = []\n", "fleet.golden.vbios"),
        ('[fleet.golden]\ndriver = [" 550 "]\n', "fleet.golden.driver"),
        ("[fleet]\ninventory_every = 5\n", "fleet.inventory_every"),
        ("[fleet]\ncolour = 1\n", "fleet.colour"),
    ],
)
def test_a_bad_fleet_table_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        FleetSettings.from_config(fleet_config(tmp_path, text))
    assert f": {key}: " in str(caught.value) and "\n" not in str(caught.value)


# ---- the store -------------------------------------------------------------------------------


def test_the_store_rewrites_an_inventory_only_when_it_changed(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as store:
        first = node().to_json()
        assert store.record_inventory("n1", first, AT) is True
        assert store.record_inventory("n1", first, AT + dt.timedelta(hours=1)) is False
        [row] = store.inventories()
        assert (row.changed_at, row.seen_at) == (AT, AT + dt.timedelta(hours=1))
        later = AT + dt.timedelta(hours=2)
        assert store.record_inventory("n1", node(driver="560.1").to_json(), later) is True
        [row] = store.inventories()
        assert row.changed_at == later and NodeInventory.from_json(row.inventory).driver == "560.1"
        with pytest.raises(ValueError, match="NUL"):
            store.record_inventory("n1", {"format": 1, "driver": "a\x00b"}, AT)
        with pytest.raises(ValueError, match="no time zone"):
            store.record_inventory("n1", first, AT.replace(tzinfo=None))


def test_a_version_7_store_keeps_its_data_and_gains_the_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    with open_store(url, migrations=MIGRATIONS[:7]) as old:
        old.set_condition("n1", ConditionUpdate("cpus", Status.CRITICAL), AT)
        assert old.schema_version() == 7
    with open_store(url) as store:
        assert store.schema_version() == 8
        assert [c.status for c in store.conditions("n1")] == [Status.CRITICAL]
        assert store.inventories() == []
        store.record_inventory("n1", node().to_json(), AT)
        assert [r.node for r in store.inventories()] == ["n1"]


# ---- the recorder ----------------------------------------------------------------------------


class FakeStore:
    def __init__(self) -> None:
        self.rows: dict[str, Mapping[str, Any]] = {}
        self.down = False
        self.writes = 0

    def record_inventory(self, node: str, inventory: Mapping[str, Any], at: dt.datetime) -> bool:
        if self.down:
            raise RuntimeError("database is locked")
        self.writes += 1
        changed = self.rows.get(node) != inventory
        self.rows[node] = inventory
        return changed


def test_the_recorder_looks_at_start_then_when_due_and_retries_a_refusal() -> None:
    clock, store = FakeClock(), FakeStore()
    current: list[NodeInventory | None] = [node()]
    recorder = InventoryRecorder("n1", lambda: current[0], store, lambda: 3600.0, clock)
    assert recorder.record() is True and store.rows["n1"] == node().to_json()
    assert recorder.record() is False  # the same: the store keeps it
    store.down = True
    assert recorder.record() is None
    store.down = False
    current[0] = None  # NVML silent: nothing written, looked at again soon
    assert recorder.record() is None and store.writes == 2
    current[0] = node(driver="560.1")
    assert recorder.record() is True


def test_tick_starts_one_look_when_due_and_never_two_at_once() -> None:
    clock, store = FakeClock(), FakeStore()
    release, looks = threading.Event(), []

    def slow_gather() -> NodeInventory:
        looks.append(1)
        release.wait(10)
        return node()

    recorder = InventoryRecorder("n1", slow_gather, store, lambda: 3600.0, clock)
    recorder.tick()
    poll("the first look to start", lambda: len(looks) == 1)
    clock.advance(4000)
    recorder.tick()  # due again, but the first look still runs
    release.set()
    poll("the first look to be written", lambda: store.writes == 1)
    assert len(looks) == 1
    clock.advance(100)
    recorder.tick()  # written at 4000 + 1000: next at 4000 + 1000 + 3600... not yet
    assert len(looks) == 1
    clock.advance(3600)
    recorder.tick()
    poll("the second look", lambda: store.writes == 2)


def test_a_refused_write_is_tried_again_after_the_retry_delay() -> None:
    clock, store = FakeClock(), FakeStore()
    store.down = True
    recorder = InventoryRecorder("n1", node, store, lambda: 3600.0, clock)
    recorder.record()
    store.down = False
    clock.advance(RETRY_SECONDS - 1)
    recorder.tick()
    assert store.writes == 0
    clock.advance(1)
    recorder.tick()
    poll("the retry", lambda: store.writes == 1)


# ---- the real bindings against the lab's NVML library ---------------------------------------

PROBE_GATHER = """
import json, sys
from pathlib import Path
from healthd.inventory import gather
from healthd.nvml_client import PynvmlClient
with PynvmlClient() as client:
    print(json.dumps(gather(Path(sys.argv[1]), client).to_json()))
"""


def test_the_nvml_client_reads_versions_from_the_injection_library(tmp_path: Path) -> None:
    lib = build.build_library(tmp_path / "lib").parent
    scenario = sc.inject(sc.default_scenario("n1", gpus=2), 1, "vbios=96.00.74.00.01")
    sc.write_scenario(tmp_path / "n1.scenario", sc.inject(scenario, 0, "inforom=G520.0200.00.04"))
    done = proc.run(
        [sys.executable, "-c", PROBE_GATHER, str(host_tree(tmp_path / "root"))],
        timeout=60,
        cwd=Path(__file__).resolve().parent.parent,
        env={
            "LD_LIBRARY_PATH": str(lib),
            "NVML_INJECT_SCENARIO": str(tmp_path / "{node}.scenario"),
            "MEDIC_NODE_NAME": "n1",
        },
    )
    assert done.returncode == 0, done.stderr
    inventory = NodeInventory.from_json(json.loads(done.stdout))
    assert (inventory.driver, inventory.cuda) == (sc.DEFAULT_DRIVER, "12.4")
    assert [(g.vbios, g.inforom) for g in inventory.gpus] == [
        (sc.H100_VBIOS, "G520.0200.00.04"),
        ("96.00.74.00.01", sc.H100_INFOROM_IMAGE),
    ]


@pytest.mark.parametrize(
    "spec", ["vbios=", "vbios=9 6", "vbios=" + "9" * 32, "inforom=" + "1" * 16]
)
def test_a_bad_firmware_injection_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="bad injection spec"):
        sc.inject(sc.default_scenario("n1", gpus=1), 0, spec)


# ---- medic fleet drift ------------------------------------------------------------------------


@pytest.fixture
def fleet_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    with open_store(url) as store:
        for name in ("n1", "n2", "n3", "n4"):
            odd = ("A", "A", "B", "A") if name == "n3" else ("A",) * 4
            store.record_inventory(name, node(vbios=odd).to_json(), AT)
        store.record_inventory("c1", NodeInventory(kernel="k1").to_json(), AT)
    return url


def drift_cli(tmp_path: Path, url: str, *args: str, toml: str = "") -> Any:
    config = tmp_path / "medic.toml"
    config.write_text(toml)
    return CliRunner().invoke(
        medic, ["fleet", "drift", "--config", str(config), "--store", url, *args]
    )


def test_the_table_names_the_node_the_item_and_the_gpu(tmp_path: Path, fleet_store: str) -> None:
    result = drift_cli(tmp_path, fleet_store)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NODE", "CLASS", "ITEM", "TARGET", "VALUE", "EXPECTED", "WHY"]
    assert lines[1].split()[:1] == ["n3"] and "vbios  GPU 2" in lines[1]
    assert lines[1].endswith("not the class majority")
    assert lines[-1] == "1 of 5 nodes drift"


def test_json_lists_findings_and_golden(tmp_path: Path, fleet_store: str) -> None:
    toml = '[fleet.golden]\nkernel = ["k2"]\n'
    result = drift_cli(tmp_path, fleet_store, "--json", toml=toml)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["nodes"] == 5 and data["golden"] == {"kernel": ["k2"]}
    assert data["drifting"] == ["c1", "n1", "n2", "n3", "n4"]  # every kernel is k1
    vbios = [f for f in data["findings"] if f["item"] == "vbios"]
    assert vbios == [
        {"node": "n3", "class": f"4x {H100}", "item": "vbios", "target": "GPU 2", "value": "B",
         "expected": ["A"], "basis": "majority", "drift": True}
    ]  # fmt: skip
    assert data["seen_at"]["n1"].startswith("2026-11-28T12:00:00")


def test_an_unreadable_row_is_left_out_with_a_warning(tmp_path: Path, fleet_store: str) -> None:
    with open_store(fleet_store) as store:
        store.record_inventory("n9", {"format": 99}, AT)
    result = drift_cli(tmp_path, fleet_store)
    assert result.exit_code == 0
    assert "medic: warning: node n9: its inventory is left out" in result.output
    assert "this Medic reads format 1" in result.output and "Traceback" not in result.output


def test_no_inventory_yet_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    with open_store(url):
        pass
    result = drift_cli(tmp_path, url)
    assert result.exit_code == 0 and result.output.startswith("no inventories recorded yet")


def test_a_bad_fleet_table_is_a_usage_error(tmp_path: Path, fleet_store: str) -> None:
    result = drift_cli(tmp_path, fleet_store, toml='[fleet.golden]\nvbios = "x"\n')
    assert result.exit_code == 2
    assert "bad [fleet] table" in result.output and "fleet.golden.vbios" in result.output


def test_drift_reads_the_store_without_sqlalchemy(fleet_store: str) -> None:
    out, loaded = modules_loaded(["fleet", "drift", "--store", fleet_store, "--json"])
    assert json.loads(out)["drifting"] == ["n3"]
    assert heavy(loaded) == []

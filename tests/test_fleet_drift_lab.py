"""Fleet drift on the lab (issue 26, item 3, done when "a node with another VBIOS listed by
`medic fleet drift`"): one GPU of n2 is given another VBIOS in its NVML scenario; the
daemons of n1, n2 and n3 record their inventories when they start, and `medic fleet drift`
names n2, the vbios item and that GPU, and nothing else."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from cli.lab import scenario as sc
from cli.lab.cluster import Lab
from cli.main import medic
from medic_core.store import Store, open_store
from tests.conftest import poll

NODES = ("n1", "n2", "n3")
ODD_VBIOS = "96.00.74.00.01"


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def test_a_gpu_with_another_vbios_is_listed_by_fleet_drift(lab: Lab, store: Store) -> None:
    lab.inject("n2", 3, [f"vbios={ODD_VBIOS}"])
    started = time.monotonic()
    for name in NODES:
        lab.start_healthd(name)
    poll(
        "every daemon's inventory in the store",
        lambda: {r.node for r in store.inventories()} >= set(NODES),
        60,
    )
    recorded_in = time.monotonic() - started
    result = CliRunner().invoke(
        medic,
        [
            "fleet", "drift", "--config", str(lab.layout.medic_conf),
            "--store", f"sqlite:///{lab.layout.store_db}", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["drifting"] == ["n2"], data
    [finding] = data["findings"]
    assert finding["item"] == "vbios" and finding["target"] == "GPU 3", finding
    assert finding["value"] == ODD_VBIOS and finding["expected"] == [sc.H100_VBIOS]
    # The same in the table an operator reads.
    table = CliRunner().invoke(
        medic,
        [
            "fleet", "drift", "--config", str(lab.layout.medic_conf),
            "--store", f"sqlite:///{lab.layout.store_db}",
        ],
    )  # fmt: skip
    assert table.exit_code == 0 and "n2" in table.output and "vbios" in table.output
    print(f"inventories of {len(NODES)} nodes recorded {recorded_in:.1f} s after the first start")

"""The lab's `dcgmi`: `dcgmi diag -r <level> -j` for a node's simulated GPUs.

A stand-in for NVIDIA's tool, as the NVML injection library stands in for the driver: it
reads the node's scenario file (NVML_INJECT_SCENARIO, `{node}` replaced by MEDIC_NODE_NAME,
else SLURMD_NODENAME) and prints the DCGM 4.x diagnostic document in the layout and
formatting of the real captures in tests/fixtures/deep/ (jsoncpp's styled writer: tabs,
" : ", sorted keys). A GPU's `dcgm_diag` scenario key decides its verdict:

* pass: every test passes;
* fail: level 2 and up fail the `memory` test ("Found 4 faulty memory elements on GPU n",
  DCGM_FR_FAULTY_MEMORY, error id 52) and skip `diagnostic` for it, as DCGM does;
* warn: level 2 and up warn in `diagnostic` (DCGM_FR_STRESS_LEVEL, error id 50).

Level 1 runs only the deployment test (`software`), which a latent memory defect passes.
Exit status as dcgmi's: 0 when every test passed or warned, 226 when one failed.
The lab's medic.toml points `[checks.deep_dcgm] search_dirs` at the wrapper `medic lab up`
writes to <lab>/tools/dcgmi; production never runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cli.lab.scenario import GpuState, read_scenario, scenario_path

EXIT_TEST_FAILED = 226
DCGM_VERSION = "4.1.1"
FAULTY_MEMORY_ID = 52
STRESS_LEVEL_ID = 50


def _result(index: int, status: str, warning: str = "", error_id: int = 0) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "entity_group": "GPU",
        "entity_group_id": 1,
        "entity_id": index,
        "status": status,
    }
    if warning:
        entry["warnings"] = [
            {"error_category": 1, "error_id": error_id, "error_severity": 2, "warning": warning}
        ]
    return entry


def _test(name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    statuses = {r["status"] for r in results}
    summary = "Fail" if "Fail" in statuses else "Warn" if "Warn" in statuses else "Pass"
    return {"name": name, "results": results, "test_summary": {"status": summary}}


def _diagnostic(index: int, gpu: GpuState) -> dict[str, Any]:
    if gpu.dcgm_diag == "fail":  # DCGM skips the stress test on a GPU whose memory failed
        return _result(index, "Skip")
    if gpu.dcgm_diag == "warn":
        warning = f"GPU {index} Max stress level 78 below the threshold 80"
        return _result(index, "Warn", warning, STRESS_LEVEL_ID)
    return _result(index, "Pass")


def diag_document(gpus: tuple[GpuState, ...], driver: str, level: int) -> dict[str, Any]:
    present = list(enumerate(gpus))
    categories: list[dict[str, Any]] = [
        {
            "category": "Deployment",
            "tests": [_test("software", [_result(i, "Pass") for i, _ in present])],
        }
    ]
    if level >= 2:
        memory = [
            _result(i, "Fail", f"Found 4 faulty memory elements on GPU {i}", FAULTY_MEMORY_ID)
            if g.dcgm_diag == "fail"
            else _result(i, "Pass")
            for i, g in present
        ]
        diagnostic = [_diagnostic(i, g) for i, g in present]
        categories += [
            {
                "category": "Integration",
                "tests": [_test("pcie", [_result(i, "Pass") for i, _ in present])],
            },
            {"category": "Hardware", "tests": [_test("memory", memory)]},
            {"category": "Hardware", "tests": [_test("diagnostic", diagnostic)]},
        ]
    return {
        "DCGM Diagnostic": {"test_categories": categories},
        "entity_groups": [
            {
                "entities": [
                    {
                        "device_id": f"{g.pci_device_id >> 16:04x}",
                        "entity_id": i,
                        "serial_num": g.serial,
                    }
                    for i, g in present
                ],
                "entity_group": "GPU",
                "entity_group_id": 1,
            }
        ],
        "metadata": {"Driver Version Detected": driver, "version": DCGM_VERSION},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcgmi", description="the lab's dcgmi (diag only)")
    sub = parser.add_subparsers(dest="command", required=True)
    diag = sub.add_parser("diag")
    diag.add_argument("-r", "--run", type=int, default=1, choices=(1, 2, 3, 4))
    diag.add_argument("-j", "--json", action="store_true")
    args = parser.parse_args(argv)
    node = os.environ.get("MEDIC_NODE_NAME") or os.environ.get("SLURMD_NODENAME")
    template = os.environ.get("NVML_INJECT_SCENARIO")
    if not node or not template:
        print(
            "dcgmi (lab): NVML_INJECT_SCENARIO and MEDIC_NODE_NAME or SLURMD_NODENAME must be set",
            file=sys.stderr,
        )
        return 1
    if not args.json:
        print("dcgmi (lab): only -j output is simulated", file=sys.stderr)
        return 1
    scenario = read_scenario(scenario_path(template, node))
    gpus = scenario.present_gpus()
    doc = diag_document(gpus, scenario.driver_version, args.run)
    print(json.dumps(doc, indent="\t", separators=(",", " : "), sort_keys=True))
    failed = args.run >= 2 and any(g.dcgm_diag == "fail" for g in gpus)
    return EXIT_TEST_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())

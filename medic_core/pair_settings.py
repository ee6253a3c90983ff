"""`[sweep.pairs]`: the settings of `medic sweep run --pairs` (docs/operator-guide.md,
"Pair tests"). Floors are data per node class, the class as the daemons' inventory names it
(GPU models and counts: "8x NVIDIA H100 80GB HBM3"); a class not listed takes the default
floor (0: no floor for that test)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from medic_core.argv_template import argv_problems
from medic_core.config import MedicConfig
from medic_core.typed_config import bounds, parse_table, setting

ALLREDUCE, IB = "allreduce", "ib"
TESTS = (ALLREDUCE, IB)
# What each test's figure is called in a pair's measurements, and its unit.
FIGURE = {ALLREDUCE: "allreduce_busbw_gbps", IB: "ib_bw_gbps"}
UNIT = {ALLREDUCE: "GB/s", IB: "Gb/s"}
PROBE_KEY = "pair_probe"  # each pair task's JSON line: {"pair_probe": {...}}

H100 = "8x NVIDIA H100 80GB HBM3"
# Azure's per-SKU thresholds for ND H100 v5 (azurehpc-health-checks): NCCL all-reduce bus
# bandwidth 460 GB/s, IB GPUDirect RDMA write 380 Gb/s per HCA.
DEFAULT_MIN_ALLREDUCE: Mapping[str, float] = {H100: 460.0}
DEFAULT_MIN_IB: Mapping[str, float] = {H100: 380.0}


@dataclass(frozen=True, kw_only=True)
class PairSettings:
    tests: tuple[str, ...] = field(
        default=TESTS, metadata=bounds(choices=TESTS, doc="pair tests run, in order")
    )
    probe: tuple[str, ...] = setting(
        ("medic", "sweep", "pair-probe"), doc="argv srun runs on both nodes of a pair"
    )
    allreduce_command: tuple[str, ...] = setting(
        ("all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "{gpus}"),
        doc="nccl-tests all_reduce_perf, one rank per node ({gpus}: the node's GPUs)",
    )
    ib_server_command: tuple[str, ...] = setting(
        ("ib_write_bw", "--report_gbits"), doc="perftest server, on the pair's first node"
    )
    ib_client_command: tuple[str, ...] = setting(
        ("ib_write_bw", "--report_gbits", "{server}"),
        doc="perftest client on the second node ({server}: the first node's name)",
    )
    search_dirs: tuple[str, ...] = setting((), doc="directories searched for the tools first")
    min_allreduce_gbps: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MIN_ALLREDUCE),
        metadata=bounds(
            minimum=0,
            doc="all-reduce bus bandwidth floor (GB/s) per node class; merged over the defaults",
        ),
    )
    min_ib_gbps: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MIN_IB),
        metadata=bounds(
            minimum=0, doc="IB write bandwidth floor (Gb/s) per node class; merged over defaults"
        ),
    )
    default_min_allreduce_gbps: float = setting(
        0.0, minimum=0, doc="all-reduce floor for a class not listed (GB/s); 0 = none"
    )
    default_min_ib_gbps: float = setting(
        0.0, minimum=0, doc="IB floor for a class not listed (Gb/s); 0 = none"
    )
    confirm: int = setting(
        2, minimum=1, maximum=8, unit="count", doc="failures with known-good nodes to name one"
    )
    max_inconclusive: int = setting(
        2,
        minimum=1,
        maximum=10,
        unit="count",
        doc="pair jobs without a figure before a node is given up",
    )
    timeout: float = setting(900.0, minimum=10, doc="seconds one pair job may take")
    command_timeout: float = setting(600.0, minimum=1, doc="seconds one tool may run")
    connect_wait: float = setting(
        60.0, minimum=1, doc="seconds the IB client retries until the server listens"
    )

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "min_allreduce_gbps", {**DEFAULT_MIN_ALLREDUCE, **self.min_allreduce_gbps}
        )
        object.__setattr__(self, "min_ib_gbps", {**DEFAULT_MIN_IB, **self.min_ib_gbps})

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if not self.tests:
            yield "tests", "is empty", f"name at least one of {', '.join(TESTS)}"
        yield from argv_problems("probe", self.probe, ())
        yield from argv_problems("allreduce_command", self.allreduce_command, ("gpus",))
        yield from argv_problems("ib_server_command", self.ib_server_command, ())
        yield from argv_problems("ib_client_command", self.ib_client_command, ("server",))

    def floors(self, node_class: str | None) -> dict[str, float]:
        """Each test's floor (by its figure's name) for a node of `node_class`."""
        allreduce = self.min_allreduce_gbps.get(node_class or "", self.default_min_allreduce_gbps)
        ib = self.min_ib_gbps.get(node_class or "", self.default_min_ib_gbps)
        return {FIGURE[ALLREDUCE]: allreduce, FIGURE[IB]: ib}

    @classmethod
    def from_config(cls, config: MedicConfig) -> PairSettings:
        table = config.table("sweep").get("pairs", {})
        return parse_table(cls, table, prefix="sweep.pairs", source=config.source)

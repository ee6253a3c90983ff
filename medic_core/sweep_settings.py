"""The `[sweep]` table: the rolling deep-check sweep (remediation/sweep/; its `[sweep.pairs]`
are medic_core.pair_settings')."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from medic_core.config import MedicConfig
from medic_core.per_config import per_config
from medic_core.typed_config import parse_table, setting


@dataclass(frozen=True, kw_only=True)
class SweepSettings:
    share: float = setting(
        0.05, minimum=0, maximum=1, doc="most of each partition a sweep holds at once"
    )
    min_nodes: int = setting(
        1, minimum=0, doc="...but always this many nodes per partition (share rounds down)"
    )
    timeout: float = setting(
        3600.0, minimum=10, doc="seconds one node's deep tier may take; then srun is killed"
    )
    checks: tuple[str, ...] = setting(
        (), doc="deep checks to run (empty: every enabled deep-tier check)"
    )
    min_interval_days: float = setting(
        7.0, minimum=0, doc="a node deep-checked more recently than this is not swept"
    )
    partitions: tuple[str, ...] = setting((), doc="partitions swept (empty: all)")
    max_nodes: int = setting(0, minimum=0, doc="nodes checked per sweep at most (0: no limit)")
    lemon_days: float = setting(30.0, minimum=1, doc="days of episodes the risk score counts")
    probe: tuple[str, ...] = setting(
        ("medic", "sweep", "probe"), doc="argv srun runs on the node (the deep tier, as JSON)"
    )
    srun_args: tuple[str, ...] = setting((), doc='extra srun options, e.g. ["--account=ops"]')
    reservation_user: str = setting("", doc="user the reservations are for (default: ours)")
    immediate: float = setting(
        60.0, minimum=1, doc="seconds srun may wait for the node before giving up"
    )
    slurm_timeout: float = setting(30.0, minimum=1, doc="seconds one Slurm command may take")

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if not self.probe:
            yield "probe", "is empty", 'give the probe argv, e.g. ["medic", "sweep", "probe"]'
        elif not self.probe[0]:
            yield "probe", "starts with an empty program name", "give the program first"
        for arg in self.srun_args:
            if not arg.startswith("-"):
                yield "srun_args", f"{arg!r} is not an option", "write options as --name=value"

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> SweepSettings:
        table = {k: v for k, v in config.table("sweep").items() if k != "pairs"}  # its own
        return parse_table(cls, table, prefix="sweep", source=config.source)

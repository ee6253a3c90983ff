"""A node's inventory: the versions of what it runs (driver, CUDA, kernel, BIOS, each GPU's
VBIOS and InfoROM image, each HCA's firmware), as its daemon records them in the store and
`medic fleet drift` compares them (remediation.drift).

Typed values and their JSON form only: gathering is healthd.inventory's, storing the
store's. Every version is text or None (not known: a file missing, a query the GPU does not
answer); None is never compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from medic_core.config import MedicConfig
from medic_core.typed_config import bounds, parse_table

INVENTORY_FORMAT = 1
MAX_VERSION_LEN = 128  # no version string is longer; a longer one is not one

# The items a drift report compares, in its order. Node-wide items have one value per node;
# GPU items one per GPU; hca_fw one per HCA device.
NODE_ITEMS = ("driver", "cuda", "kernel", "bios")
GPU_ITEMS = ("vbios", "inforom")
HCA_ITEMS = ("hca_fw",)
ITEMS = (*NODE_ITEMS, *GPU_ITEMS, *HCA_ITEMS)
NO_GPUS = "no GPUs"


@dataclass(frozen=True)
class GpuInventory:
    index: int  # NVML index
    name: str  # the model, as NVML names it
    uuid: str
    vbios: str | None
    inforom: str | None  # the InfoROM image version


@dataclass(frozen=True)
class HcaInventory:
    device: str  # mlx5_0
    fw_ver: str | None


@dataclass(frozen=True)
class NodeInventory:
    driver: str | None = None
    cuda: str | None = None  # "12.4", from the driver's CUDA version
    kernel: str | None = None  # /proc/sys/kernel/osrelease
    bios: str | None = None  # /sys/class/dmi/id/bios_version
    gpus: tuple[GpuInventory, ...] = ()
    hcas: tuple[HcaInventory, ...] = ()

    @property
    def node_class(self) -> str:
        """Nodes of one class (same GPU models and counts) are compared with each other:
        "8x NVIDIA H100 80GB HBM3", "no GPUs"."""
        if not self.gpus:
            return NO_GPUS
        counts = Counter(g.name for g in self.gpus)
        return " + ".join(f"{n}x {name}" for name, n in sorted(counts.items()))

    def values(self, item: str) -> Iterator[tuple[str, str | None]]:
        """(target, value) of `item`: target "" for a node-wide item, "GPU <index>" for a
        GPU's, the device for an HCA's."""
        if item in NODE_ITEMS:
            yield "", getattr(self, item)
        elif item in GPU_ITEMS:
            for gpu in self.gpus:
                yield f"GPU {gpu.index}", getattr(gpu, item)
        elif item in HCA_ITEMS:
            for hca in self.hcas:
                yield hca.device, hca.fw_ver
        else:
            raise ValueError(f"unknown inventory item {item!r}; use one of {', '.join(ITEMS)}")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": INVENTORY_FORMAT,
            "driver": self.driver,
            "cuda": self.cuda,
            "kernel": self.kernel,
            "bios": self.bios,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "vbios": g.vbios,
                    "inforom": g.inforom,
                }
                for g in self.gpus
            ],
            "hcas": [{"device": h.device, "fw_ver": h.fw_ver} for h in self.hcas],
        }

    @classmethod
    def from_json(cls, data: Any) -> NodeInventory:
        """The inventory a store row holds; ValueError (one line) for anything else."""
        if not isinstance(data, Mapping):
            raise ValueError(f"an inventory is a JSON object, got {type(data).__name__}")
        if data.get("format") != INVENTORY_FORMAT:
            raise ValueError(
                f"inventory format {data.get('format')!r}: this Medic reads format "
                f"{INVENTORY_FORMAT}; upgrade Medic"
            )
        gpus = data.get("gpus", [])
        hcas = data.get("hcas", [])
        if not isinstance(gpus, list) or not isinstance(hcas, list):
            raise ValueError("inventory gpus and hcas must be lists")
        return cls(
            driver=_version(data.get("driver"), "driver"),
            cuda=_version(data.get("cuda"), "cuda"),
            kernel=_version(data.get("kernel"), "kernel"),
            bios=_version(data.get("bios"), "bios"),
            gpus=tuple(_gpu(g) for g in gpus),
            hcas=tuple(_hca(h) for h in hcas),
        )


def _version(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_VERSION_LEN:
        raise ValueError(f"inventory {what}: not a version string: {str(value)[:40]!r}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"inventory {what}: expected a string, got {type(value).__name__}")
    return value


def _gpu(data: Any) -> GpuInventory:
    if not isinstance(data, Mapping):
        raise ValueError("inventory gpus: each entry is a JSON object")
    index = data.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"inventory GPU index: expected a whole number, got {index!r}")
    return GpuInventory(
        index=index,
        name=_text(data.get("name"), "GPU name"),
        uuid=_text(data.get("uuid", ""), "GPU uuid"),
        vbios=_version(data.get("vbios"), "vbios"),
        inforom=_version(data.get("inforom"), "inforom"),
    )


def _hca(data: Any) -> HcaInventory:
    if not isinstance(data, Mapping):
        raise ValueError("inventory hcas: each entry is a JSON object")
    return HcaInventory(
        device=_text(data.get("device"), "HCA device"),
        fw_ver=_version(data.get("fw_ver"), "hca_fw"),
    )


# -- the [fleet] table ---------------------------------------------------------------------


def clean_version(text: str | None) -> str | None:
    """A version as read from a file or NVML: stripped, None when empty or not one line."""
    if text is None:
        return None
    value = text.strip()
    if not value or "\n" in value or "\x00" in value or len(value) > MAX_VERSION_LEN:
        return None
    return value


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """The `[fleet]` table: what `medic fleet drift` compares against, and how often a
    daemon looks at its node's inventory again."""

    golden: dict[str, tuple[str, ...]] = field(
        default_factory=dict,
        metadata=bounds(
            keys=ITEMS,
            doc='per item, the versions allowed (e.g. vbios = ["96.00.74.00.01"]); an item '
            "not named is compared with the majority of its node class",
        ),
    )
    inventory_every: float = field(
        default=3600.0,
        metadata=bounds(
            minimum=60,
            doc="seconds between a daemon's looks at its node's inventory (written on change)",
        ),
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for item, allowed in self.golden.items():
            if not allowed:
                yield f"golden.{item}", "is empty", "list the versions allowed, or remove the key"
            for value in allowed:
                if clean_version(value) != value:
                    yield (
                        f"golden.{item}",
                        f"{value[:40]!r} is not a version (empty, spaces around, or too long)",
                        "write the version as the node reports it",
                    )

    @classmethod
    def from_config(cls, config: MedicConfig) -> FleetSettings:
        """Raises ConfigError naming the file, the key and the fix."""
        return parse_table(cls, config.table("fleet"), prefix="fleet", source=config.source)


__all__ = [
    "GPU_ITEMS",
    "HCA_ITEMS",
    "ITEMS",
    "NODE_ITEMS",
    "NO_GPUS",
    "FleetSettings",
    "GpuInventory",
    "HcaInventory",
    "NodeInventory",
    "clean_version",
]

"""The node's inventory, gathered and recorded: what `medic fleet drift` compares.

`gather` reads the versions (NVML: driver, CUDA, each GPU's VBIOS and InfoROM image; below
the host root: the kernel release, the BIOS version, each HCA's firmware). A version that
cannot be read is None, never a guess. When NVML is given but does not answer at all, there
is no inventory (None): a GPU node must not be recorded as a CPU node.

`InventoryRecorder` looks once when the daemon's loop starts and then every
`[fleet] inventory_every` (default an hour), on a thread of its own so that the scheduler
never waits for NVML; the store rewrites the inventory only when it changed (its `seen_at`
every look). NCCL and DCGM versions are not gathered: the NCCL a job uses is usually its
container's, not the host's, and DCGM's would cost a command per look.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from healthd.hostfs import list_dir, read_value
from healthd.nvml_client import GpuInfo, NvmlError
from medic_core.config import ConfigError, MedicConfig
from medic_core.inventory import (
    FleetSettings,
    GpuInventory,
    HcaInventory,
    NodeInventory,
    clean_version,
)

log = logging.getLogger("medic.healthd.inventory")

MAX_GPUS = 64
MAX_HCAS = 64
MAX_DEVICE_NAME = 64
RETRY_SECONDS = 60.0  # after NVML did not answer or the store refused the write
OSRELEASE = "proc/sys/kernel/osrelease"
BIOS_VERSION = "sys/class/dmi/id/bios_version"
INFINIBAND = "sys/class/infiniband"


class VersionSource(Protocol):
    """What `gather` asks NVML (healthd.nvml_client.PynvmlClient answers it)."""

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> int: ...

    def device_count(self) -> int: ...

    def gpu_info(self, index: int, *, refresh: bool = False) -> GpuInfo: ...

    def vbios_version(self, index: int) -> str: ...

    def inforom_image_version(self, index: int) -> str: ...


def _file_version(root: Path, rel: str) -> str | None:
    try:
        return clean_version(read_value(root, rel))
    except OSError:
        return None


def _asked(call: Callable[[], Any]) -> Any:
    """The answer, or None when NVML gave none (not supported, timed out, lost)."""
    try:
        return call()
    except NvmlError:
        return None


def cuda_text(encoded: int | None) -> str | None:
    """12040 -> "12.4" (NVML's encoding: major * 1000 + minor * 10)."""
    if encoded is None or encoded <= 0:
        return None
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def gather_hcas(root: Path) -> tuple[HcaInventory, ...]:
    try:
        devices = list_dir(root, INFINIBAND) or []
    except OSError:
        return ()
    return tuple(
        HcaInventory(device, _file_version(root, f"{INFINIBAND}/{device}/fw_ver"))
        for device in devices[:MAX_HCAS]
        if clean_version(device) == device and len(device) <= MAX_DEVICE_NAME
    )


def gather_gpus(nvml: VersionSource) -> tuple[GpuInventory, ...] | None:
    """Each GPU NVML names; None when NVML does not answer at all."""
    count = _asked(nvml.device_count)
    if count is None:
        return None
    gpus = []
    for index in range(min(int(count), MAX_GPUS)):
        info = _asked(partial(nvml.gpu_info, index))
        if info is None:  # not even its name: the gpu_count check tells what is wrong
            continue
        gpus.append(
            GpuInventory(
                index=index,
                name=info.name,
                uuid=info.uuid,
                vbios=clean_version(_asked(partial(nvml.vbios_version, index))),
                inforom=clean_version(_asked(partial(nvml.inforom_image_version, index))),
            )
        )
    return tuple(gpus)


def gather(root: Path, nvml: VersionSource | None) -> NodeInventory | None:
    """The node's inventory below `root` and from `nvml` (None: a node without GPUs)."""
    driver = cuda = None
    gpus: tuple[GpuInventory, ...] = ()
    if nvml is not None:
        found = gather_gpus(nvml)
        if found is None:
            return None
        gpus = found
        driver = clean_version(_asked(nvml.driver_version))
        cuda = cuda_text(_asked(nvml.cuda_driver_version))
    return NodeInventory(
        driver=driver,
        cuda=cuda,
        kernel=_file_version(root, OSRELEASE),
        bios=_file_version(root, BIOS_VERSION),
        gpus=gpus,
        hcas=gather_hcas(root),
    )


class InventoryStore(Protocol):
    def record_inventory(
        self, node: str, inventory: Mapping[str, Any], at: dt.datetime
    ) -> bool: ...


class InventoryRecorder:
    """Records the node's inventory when due, on a short thread of its own."""

    def __init__(
        self,
        node: str,
        gather: Callable[[], NodeInventory | None],
        store: InventoryStore,
        every: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self._gather = gather
        self._store = store
        self._every = every
        self._clock = clock
        self._next = clock()  # due at once
        self._thread: threading.Thread | None = None
        self.last: NodeInventory | None = None  # as last written

    @classmethod
    def for_daemon(
        cls,
        node: str,
        config: Callable[[], MedicConfig],
        nvml: Callable[[], VersionSource | None],
        store: InventoryStore,
    ) -> InventoryRecorder:
        """The daemon's recorder: `config` and `nvml` read at each use (a reload makes a new
        configuration; a node may lose or regain NVML)."""
        settings: dict[int, float] = {}

        def every() -> float:
            current = config()
            if id(current) not in settings:
                try:
                    value = FleetSettings.from_config(current).inventory_every
                except ConfigError:  # validated at start and on reload: not reached
                    value = FleetSettings().inventory_every
                settings.clear()
                settings[id(current)] = value
            return settings[id(current)]

        def gather_now() -> NodeInventory | None:
            return gather(config().paths.host_root, nvml())

        return cls(node, gather_now, store, every)

    def record(self) -> bool | None:
        """Gather and write now: True when the stored inventory changed, False when it did
        not, None when there was nothing to write or the store refused it (tried again
        after RETRY_SECONDS)."""
        inventory = self._gather()
        if inventory is None:
            log.info("inventory: NVML did not answer; looking again in %.0f s", RETRY_SECONDS)
            self._next = self._clock() + RETRY_SECONDS
            return None
        try:
            changed = self._store.record_inventory(
                self.node, inventory.to_json(), dt.datetime.now(dt.UTC)
            )
        except Exception as exc:  # the store down or refusing: the next look tries again
            log.warning("inventory: the store refused it (%s); trying again", exc)
            self._next = self._clock() + RETRY_SECONDS
            return None
        if changed:
            log.info("inventory of %s recorded (%s)", self.node, inventory.node_class)
        self.last = inventory
        self._next = self._clock() + self._every()
        return changed

    def tick(self) -> None:
        """Start a look when one is due and none is running."""
        if self._clock() < self._next or (self._thread is not None and self._thread.is_alive()):
            return
        self._next = self._clock() + self._every()  # a hung look is not started again at once
        self._thread = threading.Thread(target=self._record_logged, name="inventory", daemon=True)
        self._thread.start()

    def _record_logged(self) -> None:
        try:
            self.record()
        except Exception:  # the daemon outlives any single failure
            log.exception("inventory: the look failed")

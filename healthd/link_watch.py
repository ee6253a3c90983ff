"""InfiniBand port states watched from sysfs between the `ib` check's runs.

A port that goes down with no kernel-log line (no mlx5 link message for healthd.kmsg_watch to
wake on) was seen only at the check's next interval: 38 s on average in the lab at 60 s. This
thread reads every port's `state` and `phys_state` under the host root every `tick` seconds
(one small sysfs read per port: tens of microseconds for a node's 4-8 ports) and wakes the
`ib` check when a port's up-or-down differs from what the check last judged (`judged`,
the ports its latest run held down): a port that came back and went down again between two
reads is still seen, because the check judged it up meanwhile. The check itself judges; the
watch only says when to look.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from healthd.checks.ib import CLASS_DIR, parse_state
from healthd.checks.ib import NAME as IB_CHECK
from healthd.hostfs import list_dir, read_value
from healthd.wakeup import Wakeup

log = logging.getLogger("medic.healthd")

LINK_TICK = 1.0  # seconds between two reads of the ports' states
MAX_PORTS = 256  # more is not a node's HCAs: the rest is not read (a bound on a bad tree)


def port_states(root: Path) -> dict[str, tuple[str | None, str | None]]:
    """`{"mlx5_0/1": (state, phys_state)}` for every port under root/sys/class/infiniband
    (a value None when unreadable); {} without the class directory."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for hca in list_dir(root, CLASS_DIR) or ():
        for port in list_dir(root, f"{CLASS_DIR}/{hca}/ports") or ():
            if len(out) >= MAX_PORTS:
                return out
            base = f"{CLASS_DIR}/{hca}/ports/{port}"
            out[f"{hca}/{port}"] = (read_value(root, f"{base}/state"),
                                    read_value(root, f"{base}/phys_state"))  # fmt: skip
    return out


@dataclass(frozen=True)
class Judged:
    """What the `ib` check's latest run judged: the ports it looked at, those it held down."""

    ports: frozenset[str]
    down: frozenset[str]


def is_up(state: str | None, phys_state: str | None) -> bool:
    """As the `ib` check judges a port: ACTIVE and LinkUp."""
    parsed, phys = parse_state(state or ""), parse_state(phys_state or "")
    return parsed is not None and phys is not None and (parsed[1], phys[1]) == ("ACTIVE", "LinkUp")


class LinkWatch:
    """Wakes the `ib` check (`wake`, the scheduler's wake_checks) when the ports' up-or-down
    differs from what it last judged (`judged`: the ports its latest run judged, and those
    it held down; None before it ran, when one read is compared with the next)."""

    def __init__(
        self,
        root: Path,
        wake: Callable[[Iterable[str]], None],
        *,
        judged: Callable[[], Judged | None] | None = None,
        tick: float = LINK_TICK,
    ) -> None:
        self.root = root
        self._wake = wake
        self._judged = judged
        self.tick = tick
        self._stop = Wakeup()
        self._thread: threading.Thread | None = None
        self.last: frozenset[str] | None = None  # the ports down at the last read
        self.wakes = 0

    def look(self) -> bool:
        """One read of the ports; True when it woke the check."""
        try:
            ports = port_states(self.root)
        except OSError as exc:  # a tree that errors: the check's own interval still runs
            log.debug("link watch: %s", exc)
            return False
        down = frozenset(p for p, (s, ph) in ports.items() if not is_up(s, ph))
        judged = self._judged() if self._judged is not None else None
        if judged is not None:
            # Only the ports the check judges (its configuration may leave some out): the
            # same files by the same rule, so a difference is a change the check has not
            # seen yet, never a standing disagreement that would wake it every tick.
            differs = (down & judged.ports) != judged.down
        else:
            differs = self.last is not None and down != self.last
        self.last = down
        if differs:
            self.wakes += 1
            self._wake([IB_CHECK])
        return differs

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._main, name="link-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _main(self) -> None:
        while not self._stop.is_set():  # no InfiniBand: one failed listdir a tick
            self.look()
            self._stop.wait(self.tick)

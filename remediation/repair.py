"""medic-repair: the ladder's privileged repairs, run outside medic-healthd's sandbox.

The daemon's unit forbids what a repair needs (`ProtectKernelModules=yes` blocks rmmod and
modprobe; its capability bounding set has neither CAP_SYS_MODULE nor CAP_SYS_ADMIN). So the
ladder's default commands start an instance of the shipped template `medic-repair@.service`
(`systemctl start medic-repair@driver-reload.service`), which systemd runs as a oneshot
outside the sandbox; its lines are in `journalctl -u 'medic-repair@*'`.

    medic-repair gpu-reset-N     nvidia-smi --gpu-reset -i N
    medic-repair driver-reload   stop the driver's users (those of DRIVER_USERS active), unload
                                 the NVIDIA modules that are loaded, load them again and start
                                 every service it stopped, whatever failed on the way

The daemon lets go of NVML before either (a client of the GPU, it would make the reset
refuse and the unload fail) and opens it again after. Every command has a timeout; the exit
status is 0 only when every step went through."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from medic_core import proc

# Services that hold the driver, stopped first (DCGM talks to the fabric manager, which
# talks to persistenced) and started again in the reverse order.
DRIVER_USERS = ("nvidia-dcgm", "dcgm", "nvidia-fabricmanager", "nvidia-persistenced")
# Unloaded in this order (each needs the ones after it) and loaded back in the reverse one.
MODULES = ("nvidia_peermem", "nvidia_fs", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")
INSTANCE = re.compile(r"(?P<action>gpu-reset|driver-reload)(?:-(?P<gpu>[0-9]{1,3}))?")
EXIT_USAGE = 2


@dataclass(frozen=True)
class Tools:
    systemctl: str = "/usr/bin/systemctl"
    modprobe: str = "/usr/sbin/modprobe"
    nvidia_smi: str = "/usr/bin/nvidia-smi"
    step_timeout: float = 120.0  # one command; the unit's TimeoutStartSec= bounds the whole


Say = Callable[[str], None]


def _step(argv: Sequence[str], tools: Tools, say: Say) -> bool:
    result = proc.run(list(argv), timeout=tools.step_timeout)
    if result.ok:
        say(f"{' '.join(argv)}: ok")
    else:
        say(f"{' '.join(argv)}: FAILED ({result.describe_failure()})")
    return result.ok


def loaded_modules(root: Path) -> set[str]:
    """Module names in <root>/proc/modules (one per line, the name first)."""
    try:
        text = (root / "proc/modules").read_text(errors="replace")
    except OSError:
        return set()
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.strip()}


def gpu_reset(gpu: int, tools: Tools, say: Say) -> bool:
    return _step([tools.nvidia_smi, "--gpu-reset", "-i", str(gpu)], tools, say)


def driver_reload(tools: Tools, say: Say, root: Path = Path("/")) -> bool:
    active = [
        name
        for name in DRIVER_USERS
        if proc.run(
            [tools.systemctl, "is-active", "--quiet", f"{name}.service"],
            timeout=tools.step_timeout,
        ).ok
    ]
    stopped: list[str] = []
    for name in active:
        if not _step([tools.systemctl, "stop", f"{name}.service"], tools, say):
            break  # a user still holds the driver: the unload could only fail
        stopped.append(name)
    ok = stopped == active
    if ok:
        was_loaded = [m for m in MODULES if m in loaded_modules(root)]
        for module in was_loaded:
            if not _step([tools.modprobe, "-r", module], tools, say):
                ok = False
                break
        # Load back what was loaded, the base module first, even after a failed unload: a
        # module left out would leave its users without it.
        for module in reversed(was_loaded or ["nvidia"]):
            ok = _step([tools.modprobe, module], tools, say) and ok
    for name in reversed(stopped):  # whatever failed: the services come back
        ok = _step([tools.systemctl, "start", f"{name}.service"], tools, say) and ok
    say(f"driver reload: {'done' if ok else 'FAILED'}")
    return ok


def run(instance: str, tools: Tools = Tools(), say: Say = print, root: Path = Path("/")) -> int:
    match = INSTANCE.fullmatch(instance)
    if match is None or (match["action"] == "gpu-reset") != (match["gpu"] is not None):
        say(
            f"medic-repair: {instance[:80]!r} is not a repair: give gpu-reset-N (N the"
            " GPU's NVML index) or driver-reload"
        )
        return EXIT_USAGE
    begin = time.monotonic()
    if match["action"] == "gpu-reset":
        done = gpu_reset(int(match["gpu"]), tools, say)
    else:
        done = driver_reload(tools, say, root)
    say(f"medic-repair {instance}: {'ok' if done else 'failed'} in {time.monotonic() - begin:.1f}s")
    return 0 if done else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="medic-repair",
        description="Medic's privileged repairs (run by medic-repair@.service, as root).",
    )
    parser.add_argument("instance", help="gpu-reset-N or driver-reload")
    args = parser.parse_args(argv)
    return run(args.instance, say=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main())

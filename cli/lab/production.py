"""The lab's production mode (`medic lab up --production`, docs/lab.md): what an operator
installs, not the source tree.

* The project as the built wheel, installed with its dependencies into a venv of its own
  (`<lab>/venv`), outside the source tree: every daemon, hook and repair stand-in runs from it.
* Each node's medic-healthd in the shipped unit's sandbox, derived from
  systemd/medic-healthd.service so it cannot drift: a private mount namespace where `/` is
  read-only (`ProtectSystem=strict`, `ProtectHome=read-only`) but for the node's own
  directory (its `ReadWritePaths=`: state, socket, the simulated host), the capability
  bounding set of `CapabilityBoundingSet=`, `NoNewPrivileges=` and `UMask=`.
* The default per-node store (`<node>/state/medic.db`): no `[store] url`.

What it cannot give (no systemd as PID 1 here): the system-call filter, `PrivateTmp=` (the
lab itself lives under /tmp), `ProtectKernel*=`, `RestrictNamespaces=`; and the repairs
run inside the sandbox (the lab's stand-ins write only the node's own directory), where a
node runs them in medic-repair@.service."""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from medic_core import proc

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "medic-healthd.service"

# Mount each writable path on itself (a mount of its own keeps its flags), make `/` (and
# the mounts in $MEDIC_LAB_READONLY: a Debian root's) read-only, set the umask and exec the
# rest under setpriv; one process all along (exec), so the daemon's PID is the one spawned.
SANDBOX_SCRIPT = """set -e
while [ "$1" != "--" ]; do mount --bind "$1" "$1"; shift; done
shift
mount -o remount,bind,ro /
for m in $MEDIC_LAB_READONLY; do mount -o remount,bind,ro "$m"; done
umask "$MEDIC_LAB_UMASK"
exec "$@"
"""


class ProductionError(RuntimeError):
    """The production lab cannot be built; the message says why and what to do."""


def unit_service(unit: Path = UNIT) -> dict[str, list[str]]:
    """The [Service] section's keys and their values (a key may repeat)."""
    values: dict[str, list[str]] = {}
    section = ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, sep, value = line.partition("=")
        if sep and section == "Service":
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def unit_environment(unit: Path = UNIT) -> dict[str, str]:
    """Environment= of `unit` (each line one or more KEY=VALUE words, shell-quoted as
    systemd reads them); {} when the unit is not there (an installed wheel without the
    repository)."""
    if not unit.is_file():
        return {}
    env: dict[str, str] = {}
    for line in unit_service(unit).get("Environment", []):
        for word in shlex.split(line):
            key, sep, value = word.partition("=")
            if sep:
                env[key] = value
    return env


def unit_capabilities(unit: Path = UNIT) -> list[str]:
    """CapabilityBoundingSet= of `unit`, e.g. ["CAP_CHOWN", ...]."""
    return " ".join(unit_service(unit).get("CapabilityBoundingSet", [])).split()


def setpriv_argv(unit: Path = UNIT) -> list[str]:
    """setpriv with `unit`'s capability bounding set and, if it says so, no new privileges;
    the command follows."""
    service = unit_service(unit)
    caps = unit_capabilities(unit)
    bounding = ",".join(["-all", *("+" + c.removeprefix("CAP_").lower() for c in caps)])
    setpriv = ["setpriv", f"--bounding-set={bounding}"]
    if service.get("NoNewPrivileges") == ["yes"]:
        setpriv.append("--no-new-privs")
    return [*setpriv, "--"]


def sandbox_argv(writable: Sequence[Path], unit: Path = UNIT) -> tuple[list[str], dict[str, str]]:
    """argv prefix and environment that run a command in `unit`'s sandbox, with `writable`
    standing in for its ReadWritePaths=. Refuses a unit whose sandbox it cannot reproduce."""
    service = unit_service(unit)
    if service.get("ProtectSystem") != ["strict"]:
        raise ProductionError(f"{unit}: ProtectSystem= is not strict: the lab copies only that")
    umask = (service.get("UMask") or ["0022"])[-1]
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", SANDBOX_SCRIPT]
    argv += ["medic-sandbox", *(str(p) for p in writable), "--", *setpriv_argv(unit)]
    return argv, {"MEDIC_LAB_UMASK": umask}


def can_sandbox() -> str:
    """Why this host cannot run the production lab ("" when it can)."""
    missing = [t for t in ("unshare", "setpriv", "mount") if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} (util-linux)"
    return ""


def install_wheel(root: Path, timeout: float = 900.0) -> Path:
    """Build the wheel from the source tree and install it, with its dependencies, into a
    new venv at `<root>/venv`; its bin directory."""
    dist, venv = root / "dist", root / "venv"
    shutil.rmtree(dist, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    source = root / "source"
    shutil.rmtree(source, ignore_errors=True)
    tracked = proc.run(["git", "-C", str(REPO), "ls-files", "-z"], timeout=60)
    if tracked.ok:  # the tracked files only: no build/ or egg-info of an editable install
        for name in tracked.stdout.split("\0"):
            if name and (REPO / name).is_file():
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, source / name)
    else:
        shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv", "build", "*.egg-info"))
    steps = [
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
        [sys.executable, "-m", "venv", str(venv)],
    ]
    for argv in steps:
        done = proc.run(argv, timeout=timeout)
        if not done.ok:
            raise ProductionError(f"{' '.join(argv[:4])}: {done.describe_failure()}")
    [wheel] = dist.glob("*.whl")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    done = proc.run([*pip, str(wheel)], timeout=timeout)
    if not done.ok:
        raise ProductionError(f"pip install {wheel.name}: {done.describe_failure()}")
    shutil.rmtree(source, ignore_errors=True)
    return venv / "bin"

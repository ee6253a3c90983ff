"""The Slurm release Medic talks to, read from slurmctld itself (`SLURM_VERSION` in `scontrol
show config`: the controller's; `scontrol version` prints only the client's), and what Medic
does differently on it. Each branch is a difference measured on the lab's releases
(22.05.8 on the host, 24.11.5 and 26.05.5 in Debian roots; docs/slurm-client.md's table);
a release between or after them takes the branch that is correct everywhere.

* A node's GPU count (its GRES with `File=`) changes through slurm.conf and gres.conf; 22.05
  takes the new count only at a slurmctld restart (`scontrol reconfigure` keeps the old one:
  the node ends INVAL). From 24.11 `scontrol reconfigure` takes it (slurmctld re-executes
  itself in place, same PID; the node is IDLE with the new count in ~1 s). The isolator gives
  the site's apply command the way (`MEDIC_GRES_CHANGE`, remediation/isolator.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from medic_core import proc

# The apply command's environment: how the new GRES takes effect, and the release read.
GRES_CHANGE_ENV = "MEDIC_GRES_CHANGE"
RELEASE_ENV = "MEDIC_SLURM_RELEASE"
RESTART = "restart"  # stop the node's slurmd, restart slurmctld, start the slurmd
RECONFIGURE = "reconfigure"  # stop the node's slurmd, `scontrol reconfigure`, start the slurmd
# The first release measured to take a GRES count change at `scontrol reconfigure` (24.11.5;
# 26.05.5 too). 23.11 made reconfigure a re-exec of slurmctld, but 23.11 and 24.05 were not
# run here: they get the restart, which every release takes.
RECONFIGURE_FROM = (24, 11)

# YY.MM[.P], then a packager's suffix at most ("-0rc1", "+deb13u1").
_VERSION = re.compile(r"(\d{2})\.(\d{2})(?:\.(\d{1,4}))?(?:[-+~][\w.+~-]{0,40})?")


class ReleaseError(ValueError):
    """What Slurm printed is not a release Medic can read; the message says what it saw."""


@dataclass(frozen=True, order=True)
class SlurmRelease:
    major: int  # the year: 22, 24, 26
    minor: int  # the month: 05, 11
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.patch}"

    @property
    def gres_change(self) -> str:
        """How a node's new GPU count takes effect on this release: RESTART or RECONFIGURE."""
        return RECONFIGURE if (self.major, self.minor) >= RECONFIGURE_FROM else RESTART


def parse_release(text: str) -> SlurmRelease:
    """The release in its last word: `scontrol version`'s line ("slurm-wlm 24.11.5"), show
    config's value ("24.11.5", "26.05.0-0rc1") or a JSON document's `meta`."""
    words = text.strip().split()
    last = words[-1] if words else ""
    found = _VERSION.fullmatch(last)
    if found is None:
        shown = text.strip()[:80] or "nothing"
        raise ReleaseError(f"not a Slurm release (YY.MM[.P]): {shown!r}")
    major, minor, patch = found.groups()
    if not 1 <= int(minor) <= 12:
        raise ReleaseError(f"not a Slurm release (month {minor}): {last[:40]!r}")
    return SlurmRelease(int(major), int(minor), int(patch or 0))


def controller_release(show_config: str) -> SlurmRelease:
    """The release in `scontrol show config`'s `SLURM_VERSION           = 24.11.5` line."""
    for line in show_config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SLURM_VERSION":
            return parse_release(value)
    raise ReleaseError("scontrol show config: no SLURM_VERSION line")


def read_release(
    bin_dirs: Iterable[Path], env: Mapping[str, str] | None, timeout: float
) -> SlurmRelease:
    """slurmctld's release, through `scontrol show config` from the first of `bin_dirs` that
    has scontrol (a CliSlurm's bin_dirs, env and timeout). Raises ReleaseError with one line
    when it cannot be read."""
    dirs = list(bin_dirs)
    scontrol = next((d / "scontrol" for d in dirs if (d / "scontrol").is_file()), None)
    if scontrol is None:
        raise ReleaseError(f"scontrol not found in {', '.join(map(str, dirs)) or 'no directory'}")
    done = proc.run([str(scontrol), "show", "config"], timeout=timeout, env=env)
    if not done.ok:
        raise ReleaseError(f"{scontrol} show config: {done.describe_failure()}")
    return controller_release(done.stdout)


def gres_change_env(slurm: object) -> dict[str, str]:
    """The apply command's environment entries for the release `slurm` (a CliSlurm) talks
    to: {MEDIC_GRES_CHANGE: restart|reconfigure, MEDIC_SLURM_RELEASE: 24.11.5}. A client
    that cannot say (a test's fake) or a release that cannot be read gets the restart,
    which every release takes, and no release."""
    bin_dirs, env, timeout = (getattr(slurm, a, None) for a in ("bin_dirs", "env", "timeout"))
    if bin_dirs is None or not isinstance(timeout, (int, float)):
        return {GRES_CHANGE_ENV: RESTART}
    try:
        release = read_release(bin_dirs, env, float(timeout))
    except ReleaseError:
        return {GRES_CHANGE_ENV: RESTART}
    return {GRES_CHANGE_ENV: release.gres_change, RELEASE_ENV: str(release)}

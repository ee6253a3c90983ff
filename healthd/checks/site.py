"""Site checks in Python, from the `medic.checks` entry-point group.

A site ships its checks as an ordinary Python distribution (a wheel installed beside Medic)
that declares, in its pyproject.toml:

    [project.entry-points."medic.checks"]
    scratch_quota = "acme_medic.scratch_quota"

Loading the entry point imports the module (or class) it names; its `@register(...)` adds the
check to the registry like any shipped check. Entry points are read only where checks are
built (`healthd.checks.registry()`: the daemon, `medic check`, the prolog's inline fallback),
once per process; the prolog's fast path (asking the daemon) never reads them.

A site check that fails to load (an ImportError, a syntax error, a name already taken, an
exception at import) costs one log line and becomes a placeholder of that entry point's name
that reports UNKNOWN `check.error` in the periodic tier: never a launch verdict, never the
daemon's fall. A site check that raises in gather or evaluate is the runner's ordinary
UNKNOWN `check.error`, for that check only.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from healthd.checks import SITE_GROUP
from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Result,
    Status,
    Tier,
    fault,
    register,
    registered,
)

GROUP = SITE_GROUP
log = logging.getLogger("medic.checks.site")

_lock = threading.Lock()
_loaded = False


@dataclass(frozen=True)
class LoadFailure:
    entry_point: str  # "name = value"
    error: str  # "ImportError: no module named ..."


class BrokenSiteCheck(Check[LoadFailure, CheckConfig]):
    """A site check that failed to load; reports UNKNOWN until it is fixed."""

    failure: LoadFailure

    def gather(self, ctx: CheckContext, cfg: CheckConfig) -> LoadFailure:
        return self.failure

    @classmethod
    def evaluate_for(cls, name: str, failure: LoadFailure) -> list[Result]:
        message = f"{name}: site check failed to load ({failure.entry_point}): {failure.error}"
        evidence = {"entry_point": failure.entry_point, "error": failure.error}
        return [fault(name, Status.UNKNOWN, "check.error", message, evidence=evidence)]


def _placeholder(name: str, failure: LoadFailure) -> None:
    """Register check `name` as a placeholder reporting `failure`."""

    def evaluate(observation: LoadFailure, cfg: CheckConfig) -> list[Result]:
        return BrokenSiteCheck.evaluate_for(name, observation)

    cls = type(
        f"BrokenSiteCheck_{name}",
        (BrokenSiteCheck,),
        {"failure": failure, "evaluate": staticmethod(evaluate), "__module__": __name__},
    )
    register(
        name=name,
        tiers=(Tier.PERIODIC,),
        interval=300,
        timeout=5,
        faults={},
        needs=(),
        description=f"site check {failure.entry_point} (failed to load)",
    )(cls)


def _load(ep: EntryPoint) -> None:
    before = {spec.name for spec in registered()}
    label = f"{ep.name} = {ep.value}"
    try:
        ep.load()
    except BaseException as exc:  # a site module's SystemExit must not stop the daemon
        if isinstance(exc, KeyboardInterrupt):
            raise
        failure = LoadFailure(label, f"{type(exc).__name__}: {exc}")
    else:
        if {spec.name for spec in registered()} - before:
            return
        failure = LoadFailure(label, "it registered no check (is @register(...) applied?)")
    one_line = " ".join(failure.error.split())
    if ep.name in {spec.name for spec in registered()}:  # taken, maybe by the module itself
        log.error("site check %s failed to load and is left out: %s", label, one_line)
        return
    log.error("site check %s failed to load, reported UNKNOWN: %s", label, one_line)
    try:
        _placeholder(ep.name, LoadFailure(label, one_line))
    except ValueError as exc:  # never the daemon's fall
        log.error("site check %s: no placeholder either: %s", label, exc)


def load_site_checks() -> None:
    """Load every `medic.checks` entry point once per process (idempotent, thread-safe)."""
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
        for ep in entry_points(group=GROUP):
            _load(ep)


def reset_for_tests() -> None:
    """Forget that the entry points were loaded (tests that install a fake distribution)."""
    global _loaded
    with _lock:
        _loaded = False

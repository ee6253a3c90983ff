"""Whether the daemon's remediation owns a node the hooks would resume: the
HealthCheckProgram and post-job hygiene's watcher ask the same question."""

from __future__ import annotations

from medic_core.config import MedicConfig


def remediation_owns(config: MedicConfig, node: str) -> str:
    """Why the node is not the health check's to resume: an open remediation episode (the
    ladder resumes it itself) or an open RMA ticket (closing it re-qualifies the node)."""
    from medic_core.api import HealthdUnavailable, ask

    try:
        reply = ask(config.paths.socket, {"op": "status"}, timeout=2.0)
    except HealthdUnavailable:
        return "medic-healthd unreachable"
    if reply.get("remediation_episode"):
        return f"remediation episode {reply['remediation_episode'].get('id')} owns it"
    if reply.get("rma_open"):
        return f"RMA ticket {reply['rma_open'][0]} is open"
    return ""

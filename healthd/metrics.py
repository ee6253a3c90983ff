"""Prometheus metrics of the node daemon, named `medic_<subsystem>_<what>_<unit>`.

One registry per daemon (not the process-global default), so tests can run several
daemons in one process and the exposition holds nothing but Medic's own series.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from healthd.checks.base import Result, Status, worst
from healthd.runner import RunReport

# The value each status is exported as in medic_check_status_code / medic_condition_...
STATUS_CODES = {
    Status.NOT_APPLICABLE: -1,
    Status.OK: 0,
    Status.WARN: 1,
    Status.UNKNOWN: 2,
    Status.CRITICAL: 3,
}


class DaemonMetrics:
    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        self.node = node
        self.runs = Counter(
            "medic_check_runs_total",
            "Check runs by outcome (done, error, timeout, hung, unavailable).",
            ["check", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "medic_check_duration_seconds",
            "Wall time of one check run.",
            ["check"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.check_status = Gauge(
            "medic_check_status_code",
            "Worst status of a check's last run: -1 n/a, 0 OK, 1 WARN, 2 UNKNOWN, 3 CRITICAL.",
            ["check"],
            registry=self.registry,
        )
        self.node_status = Gauge(
            "medic_node_status_code",
            "Worst status over every check's last run (same codes).",
            registry=self.registry,
        )
        self.faults = Gauge(
            "medic_node_faults_count",
            "Current non-OK findings by status and fault class.",
            ["status", "fault_class"],
            registry=self.registry,
        )
        self.gpus = Gauge(
            "medic_gpu_devices_count", "GPUs NVML lists on this node.", registry=self.registry
        )
        self.gpu_events = Counter(
            "medic_gpu_events_total",
            "NVML events received by the listener (xid, ecc_dbe, ecc_sbe, gpu_lost, error).",
            ["kind", "gpu"],
            registry=self.registry,
        )
        self.socket_requests = Counter(
            "medic_socket_requests_total",
            "Requests on the local socket by operation.",
            ["op"],
            registry=self.registry,
        )
        self.socket_seconds = Histogram(
            "medic_socket_request_duration_seconds",
            "Time to answer one socket request.",
            ["op"],
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
            registry=self.registry,
        )

    def observe_report(self, report: RunReport) -> None:
        for outcome in report.outcomes:
            self.runs.labels(outcome.name, outcome.state.value).inc()
            self.duration.labels(outcome.name).observe(outcome.seconds)
            status = worst([r.status for r in outcome.results])
            self.check_status.labels(outcome.name).set(STATUS_CODES[status])
            if outcome.name == "gpu_count":
                counts = [r.evidence.get("count") for r in outcome.results]
                count = next((c for c in counts if isinstance(c, int)), None)
                if count is not None:
                    self.gpus.set(count)

    def observe_current(self, results: list[Result]) -> None:
        self.node_status.set(STATUS_CODES[worst([r.status for r in results])])
        self.faults.clear()
        for r in results:
            if r.status in (Status.WARN, Status.CRITICAL, Status.UNKNOWN):
                self.faults.labels(r.status.value, r.fault_class or "").inc()

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()

    def serve(self, address: str, port: int) -> None:
        start_http_server(port, addr=address, registry=self.registry)

"""Evidence bundles through Slurm (issue 26, item 5): the fault matrix's row_remap_failure row
opens an RMA ticket, and the node's daemon names in it a bundle that exists, whose checksum
matches and whose parts are there."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from cli.lab.cluster import Lab
from medic_core.store import Store
from medic_core.store.models import RmaOutboxRow
from remediation import tickets
from remediation.evidence import verify
from tests import test_remediation
from tests.conftest import poll
from tests.test_remediation import MATRIX, fault_matrix_case, store  # noqa: F401


def test_an_rma_ticket_names_its_evidence_bundle(
    lab: Lab,
    store: Store,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = tmp_path / "bin" / "nvidia-bug-report.sh"  # NVIDIA's, as a site installs it
    report.parent.mkdir()
    report.write_text('#!/bin/sh\n[ "$1" = --output-file ] && echo "lab bug report" > "$2.gz"\n')
    report.chmod(0o755)
    extra = f'\n[remediation.evidence]\nbug_report = ["{report}"]\nbug_report_timeout = 30\n'
    plain = test_remediation.fast_config
    monkeypatch.setattr(
        test_remediation, "fast_config", lambda lab, tmp, extra_=extra: plain(lab, tmp, extra_)
    )
    [row] = [m for m in MATRIX if m[0] == "row_remap_failure"]
    fault_matrix_case(lab, store, tmp_path, *row[1:])
    [ticket] = tickets.list_tickets(store, node="n2")

    def named() -> bool:
        found = tickets.get(store, ticket.id)
        return found is not None and bool(found.bundle)

    poll("the ticket to name its bundle", named, timeout=60)
    found = tickets.get(store, ticket.id)
    assert found is not None
    bundle = found.bundle
    assert "error" not in bundle, bundle
    path = Path(bundle["path"])
    assert path.parent == lab.node("n2").state_dir / "evidence"
    assert verify(path, bundle["sha256"])
    sidecar = path.with_name(path.name + ".sha256").read_text()
    assert sidecar == f"{bundle['sha256']}  {path.name}\n"
    with tarfile.open(path, "r:gz") as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        nvml = json.load(tar.extractfile("nvml.json"))  # type: ignore[arg-type]
        findings = json.load(tar.extractfile("findings.json"))  # type: ignore[arg-type]
        report_text = tar.extractfile("nvidia-bug-report.log.gz").read()  # type: ignore[union-attr]
    assert names >= {"manifest.json", "findings.json", "kernel.log", "nvml.json", "hca.json",
                     "nvidia-bug-report.log.gz"}, (names, manifest["parts"])  # fmt: skip
    assert manifest["ticket"] == ticket.id and manifest["occasion"] == "rma"
    assert set(nvml) == {"driver_version", "1"} and "remapped_rows" in nvml["1"]  # GPU 1 only
    assert any(f["fault_class"] == ticket.fault_class for f in findings["findings"])
    assert report_text == b"lab bug report\n"
    # the webhook's payload for the ticket names it too
    with Session(store.engine) as session:
        rows = session.scalars(select(RmaOutboxRow).where(RmaOutboxRow.ticket_id == ticket.id))
        payloads = {r.event: r.payload for r in rows}
    assert payloads["ticket.evidence"]["ticket"]["bundle"]["sha256"] == bundle["sha256"]
    trail = tickets.audit(store, ticket.id)
    took = (trail[-1].at - trail[0].at).total_seconds()
    print(f"bundle named {took:.1f}s after the ticket opened; {bundle['bytes']} bytes")

"""The lab's production mode (deployment issue, "Proof"): what an operator installs, not the
source tree. The built wheel in a venv of its own, each node's medic-healthd in the shipped
unit's sandbox (derived from systemd/medic-healthd.service: `/` read-only but for the node's
own directory, the unit's capability bounding set, no new privileges, its umask) and the
default store per node. The README demo runs in this mode too (tests/test_lab_smoke.py).

The fault matrix here is one fault per rung and outcome (5 of tests/test_remediation.py's
15): a GPU reset that cures, a reboot, a reboot under a hung NVML, a straight RMA, and every
rung failing to an RMA (reset, driver reload, reboot: the repair stand-ins run inside the
daemon's sandbox and write only the node's own directory)."""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from cli.lab.production import REPO, UNIT, can_sandbox, install_wheel, unit_capabilities
from cli.lab.slurm_conf import LabSpec
from medic_core import proc
from medic_core.store import Store, open_store
from remediation.ladder import Rung
from tests.conftest import poll
from tests.test_remediation import MATRIX, fault_matrix_case

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(bool(can_sandbox()), reason=can_sandbox() or "ok"),
]

# The whole fault matrix runs here, as it ships: the wheel, the unit's sandbox, the store of
# each node. tests/test_remediation.py runs a few of its rows on the shared store.
CASES = [m[0] for m in MATRIX]


def wheel_venv() -> Path:
    """The wheel's venv, built once for every test worker and this state of the tree (the
    tracked files' hashes and the uncommitted changes name it)."""
    key = hashlib.sha256()
    for argv in (["git", "-C", str(REPO), "ls-files", "-s"], ["git", "-C", str(REPO), "diff"]):
        key.update(proc.run(argv, timeout=60).stdout.encode())
    base = Path(tempfile.gettempdir()) / f"medic-wheel-{key.hexdigest()[:16]}"
    with open(f"{base}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = base / "venv" / "bin"
        if not (ready / "medic-healthd").exists():
            base.mkdir(exist_ok=True)
            install_wheel(base)
        return ready


@contextmanager
def a_production_lab(
    prefix: str, spec: LabSpec | None = None, venv_bin: Path | None = None
) -> Iterator[Lab]:
    """A lab in production mode, up until the block ends, then down and removed (also used
    by tests/test_slurm_releases_production_lab.py, on the releases' roots)."""
    # A short directory: slurmstepd's socket paths must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        lab = Lab(root / "lab", venv_bin=venv_bin) if venv_bin else Lab(root / "lab")
        try:
            lab.up(spec, timeout=60, sandbox_unit=UNIT)
            yield lab
        finally:
            lab.down()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def production_lab() -> Iterator[Lab]:
    with a_production_lab("prod-", venv_bin=wheel_venv()) as lab:
        yield lab


@pytest.fixture
def lab(production_lab: Lab) -> Lab:
    production_lab.reset()
    return production_lab


@pytest.fixture
def n2_store(lab: Lab) -> Iterator[Store]:
    """n2's own store, where its daemon keeps everything (no [store] url in production)."""
    with open_store(f"sqlite:///{lab.node('n2').state_dir / 'medic.db'}") as store:
        yield store


def test_daemons_run_from_the_wheel_in_the_units_sandbox_with_a_store_of_their_own(
    lab: Lab, n2_store: Store
) -> None:
    pid = lab.start_healthd("n2")
    venv = Path(lab.state().venv_bin).parent
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1] == str(venv / "bin" / "medic-healthd").encode(), cmdline
    where = proc.run(
        [str(venv / "bin" / "python"), "-c", "import healthd; print(healthd.__file__)"],
        timeout=30,
        cwd="/",
    )
    assert where.stdout.startswith(str(venv)), where.stdout  # not the source tree
    status = Path(f"/proc/{pid}/status").read_text()
    bounding = int(re.search(r"CapBnd:\s*([0-9a-f]+)", status).group(1), 16)  # type: ignore[union-attr]
    assert bin(bounding).count("1") == len(unit_capabilities())
    assert re.search(r"NoNewPrivs:\s*1", status)
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"MALLOC_ARENA_MAX=2" in environ  # the unit's Environment=, as systemd gives it
    root_mount = next(
        line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        if line.split()[4] == "/"
    )  # fmt: skip
    assert root_mount[5].startswith("ro"), root_mount
    poll("n2's first round", lambda: bool(n2_store.conditions("n2")), timeout=20)
    stored = lab.node("n2").state_dir / "medic.db"
    assert stored.stat().st_mode & 0o077 == 0  # UMask=0077 and the store's own 0600
    assert not lab.layout.store_db.exists()  # no shared store in this mode
    assert "Traceback" not in lab.node("n2").healthd_log.read_text()


@pytest.mark.parametrize(
    ("gpu", "specs", "rung", "end"),
    [m[1:] for m in MATRIX if m[0] in CASES],
    ids=[m[0] for m in MATRIX if m[0] in CASES],
)
def test_fault_matrix_in_production_mode(
    lab: Lab, n2_store: Store, tmp_path: Path, gpu: int, specs: list[str], rung: Rung, end: str
) -> None:
    steps = fault_matrix_case(lab, n2_store, tmp_path, gpu, specs, rung, end, timeout=120)
    if "hardware_fault=1" in specs:  # every rung ran, each inside the sandbox
        assert [s.action for s in steps][:2] == ["gpu_reset", "gpu_reset"], steps
        assert "driver_reload" in [s.action for s in steps], steps
    assert "Read-only file system" not in lab.node("n2").healthd_log.read_text()

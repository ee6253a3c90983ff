"""What ships is what is tested: the wheel built from the tracked files carries every file the
packages need, and the C parts (medic-hook, the SPANK plugin) build from the installed wheel
alone, outside the source tree; the sdist carries the units and docs, and a wheel built from
it (as pip builds one from an sdist) is the same as the one built from the tree. The lab runs
from an installed wheel in its production mode (tests/test_production_lab.py)."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from medic_core import proc

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("medic_core", "healthd", "slurm_hooks", "remediation", "cli")


def tracked_files() -> list[str]:
    result = proc.run(["git", "-C", str(ROOT), "ls-files", "-z"], timeout=30)
    if not result.ok:
        pytest.skip(f"not a git checkout: {result.describe_failure()}")
    return [name for name in result.stdout.split("\0") if name]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel pip builds from a copy of the tracked files (no build/ left from elsewhere)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    for name in tracked_files():
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = work / "dist"
    built = proc.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        timeout=300,
    )
    assert built.ok, built.describe_failure()
    [path] = out.glob("slurm_medic-*.whl")
    yield path


def test_the_wheel_ships_every_file_of_the_packages(wheel: Path) -> None:
    shipped = set(zipfile.ZipFile(wheel).namelist())
    needed = {
        name for name in tracked_files() if name.split("/")[0] in PACKAGES and "/tests/" not in name
    }
    missing = sorted(needed - shipped)
    assert not missing, f"the wheel lacks {missing}: add them to [tool.setuptools.package-data]"
    assert "slurm_hooks/native/medic_hook.c" in shipped


def test_the_wheel_carries_its_license_and_where_the_project_lives(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
        licenses = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert licenses and b"Apache License" in archive.read(licenses[0])
    assert "License-Expression: Apache-2.0" in text and "License-File: LICENSE" in text
    assert "Project-URL: Documentation, " in text and "Classifier: " in text


def test_medic_hook_and_the_spank_plugin_build_from_the_installed_wheel(
    wheel: Path, tmp_path: Path
) -> None:
    target = tmp_path / "site"
    installed = proc.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(wheel)],
        timeout=300,
    )  # fmt: skip
    assert installed.ok, installed.describe_failure()
    # -S: no site processing, so the source tree this venv points at (a .pth line) is not on
    # the path; the dependencies come from the venv's site-packages by PYTHONPATH.
    env = {
        **os.environ,
        "PYTHONPATH": f"{target}{os.pathsep}{sysconfig.get_paths()['purelib']}",
    }

    def run(*argv: str) -> proc.CommandResult:
        return proc.run([sys.executable, "-S", *argv], cwd=tmp_path, env=env, timeout=120)

    where = run("-c", "import slurm_hooks; print(slurm_hooks.__file__)")
    assert where.ok, where.describe_failure()
    assert where.stdout.startswith(str(target)), where.stdout
    hook = run("-m", "slurm_hooks.native.build", str(tmp_path / "bin"), "--prolog", "/bin/true")
    assert hook.ok, hook.describe_failure()
    assert (tmp_path / "bin" / "medic-hook").stat().st_mode & 0o111
    plugin = run("-m", "slurm_hooks.spank.build", str(tmp_path / "lib"))
    assert plugin.ok, plugin.describe_failure()
    assert (tmp_path / "lib" / "medic_resilient.so").is_file()


def test_a_missing_source_is_one_line_naming_it(tmp_path: Path) -> None:
    from slurm_hooks.spank.build import BuildError, compile_c

    with pytest.raises(BuildError, match=r"gone\.c is missing from this install: reinstall"):
        compile_c(tmp_path / "gone.c", tmp_path / "out", [])
    broken = tmp_path / "broken.c"
    broken.write_text("int main(void) { return x; }\n")
    with pytest.raises(BuildError, match=r"broken\.c:1:\d+: error: .x. undeclared"):
        compile_c(broken, tmp_path / "out", [])


def test_the_sdist_carries_the_units_and_docs_and_builds_the_same_wheel(
    wheel: Path, tmp_path: Path
) -> None:
    """The sdist of the tracked files (`python -m build`, isolated as a release build is),
    then a wheel from the unpacked sdist: the same files as the wheel from the tree."""
    src = wheel.parent.parent / "src"
    sdist_dir = tmp_path / "sdist"
    built = proc.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(sdist_dir), str(src)],
        timeout=300,
    )
    assert built.ok, built.describe_failure()
    [sdist] = sdist_dir.glob("slurm_medic-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
        archive.extractall(tmp_path / "unpacked", filter="data")
    wanted = {
        "systemd/medic-healthd.service", "systemd/medic-repair@.service", "systemd/medic.slice",
        "systemd/medic-sweep.service", "systemd/medic-sweep.timer", "LICENSE", "README.md",
        "docs/operator-guide.md", "slurm_hooks/native/medic_hook.c", "pyproject.toml",
    }  # fmt: skip
    assert wanted <= names, wanted - names
    [unpacked] = (tmp_path / "unpacked").iterdir()
    again = proc.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "w"),
         str(unpacked)],
        timeout=300,
    )  # fmt: skip
    assert again.ok, again.describe_failure()
    [from_sdist] = (tmp_path / "w").glob("slurm_medic-*.whl")
    assert set(zipfile.ZipFile(from_sdist).namelist()) == set(zipfile.ZipFile(wheel).namelist())

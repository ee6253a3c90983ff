"""Build the `--resilient` SPANK plugin (medic_resilient.so) against libslurm-dev's spank.h.

Sites without the plugin use `medic sbatch --resilient` instead; see docs/resilient-jobs.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from medic_core import proc
from medic_core.resilient import DEFAULT_RESTARTS

SOURCE = Path(__file__).with_name("medic_resilient.c")
CLI_FILTER = Path(__file__).with_name("cli_filter.lua")
PLUGIN_NAME = "medic_resilient.so"
INCLUDE_DIR = Path("/usr/include")
SPANK_HEADER = INCLUDE_DIR / "slurm" / "spank.h"
HEADER_HINT = "install Slurm's headers: apt-get install libslurm-dev"
GCC_TIMEOUT = 60.0


class BuildError(RuntimeError):
    """A C build (plugin, hook front, lab library) failed; the message is one line saying why."""


def up_to_date(output: Path, inputs: list[Path]) -> bool:
    if not output.exists():
        return False
    built = output.stat().st_mtime_ns
    return all(built > p.stat().st_mtime_ns for p in inputs)


def build_plugin(out_dir: Path, include_dir: Path = INCLUDE_DIR) -> Path:
    """Compile medic_resilient.c into out_dir/medic_resilient.so unless it is newer than its
    inputs. Written under a temporary name and renamed: slurmd or sbatch loading the plugin
    while it is rebuilt never sees a half-written file."""
    header = include_dir / "slurm" / "spank.h"
    if not header.is_file():
        raise BuildError(f"{header} not found: {HEADER_HINT}")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / PLUGIN_NAME
    if up_to_date(output, [SOURCE, header, Path(__file__)]):
        return output
    flags = ["-fPIC", "-shared", f"-I{include_dir}",
             f"-DMEDIC_RESILIENT_DEFAULT={DEFAULT_RESTARTS}"]  # fmt: skip
    return compile_c(SOURCE, output, flags)


def compile_c(
    source: Path,
    output: Path,
    flags: list[str],
    libs: tuple[str, ...] = (),
    timeout: float = GCC_TIMEOUT,
) -> Path:
    """gcc -O2 -Wall -Werror `flags` `source` `libs` into `output`, through a temporary file
    renamed into place: whatever runs or loads `output` never sees a half-written file."""
    if not source.is_file():
        raise BuildError(
            f"{source} is missing from this install: reinstall slurm-medic from a wheel or"
            " sdist that ships it"
        )
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    argv = ["gcc", "-O2", "-Wall", "-Werror", *flags, "-o", str(tmp), str(source), *libs]
    result = proc.run(argv, timeout=timeout)
    if not result.ok:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"building {output.name} failed: {gcc_message(result)}")
    tmp.replace(output)
    return output


def gcc_message(result: proc.CommandResult) -> str:
    if result.start_error:
        return f"cannot run gcc ({result.start_error}); install gcc"
    if result.timed_out:
        return f"gcc timed out after {result.seconds:.0f}s"
    # "x.c:3:5: error: ...", and "gcc: fatal error: ..." for a file gcc cannot read
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    return (errors[0] if errors else result.describe_failure()).strip()


def main(argv: list[str] | None = None) -> int:
    """`python -m slurm_hooks.spank.build OUT_DIR`: build medic_resilient.so for this
    node's Slurm (libslurm-dev's spank.h) and print its path."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m slurm_hooks.spank.build")
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        print(build_plugin(args.out_dir))
    except BuildError as exc:
        print(f"medic: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

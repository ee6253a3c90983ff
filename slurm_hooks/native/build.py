"""Build `medic-hook`, the compiled front of Medic's Prolog and Epilog (medic_hook.c).

It answers the common case (the daemon says the job may start; the job ended) without
starting Python, and execs the Python `medic-prolog` for everything else, so the path of
that script and the daemon's socket are compiled in:

    python -m slurm_hooks.native.build /usr/local/lib/medic
    # slurm.conf: Prolog=/usr/local/lib/medic/medic-hook  Epilog=/usr/local/lib/medic/medic-hook
"""

from __future__ import annotations

import sys
from pathlib import Path

from medic_core.config import NodePaths
from slurm_hooks.spank.build import BuildError, compile_c, up_to_date

SOURCE = Path(__file__).with_name("medic_hook.c")
BINARY_NAME = "medic-hook"


def default_prolog() -> Path:
    """The Python prolog installed next to the interpreter running this build."""
    return Path(sys.executable).parent / "medic-prolog"


def build_hook(
    out_dir: Path,
    prolog: Path | None = None,
    socket: Path = NodePaths.socket,
    epilog: Path | None = None,
) -> Path:
    """Compile medic_hook.c into out_dir/medic-hook unless it is newer than its inputs (and
    was built for the same prolog, epilog and socket). Written under a temporary name and
    renamed, so slurmd never runs a half-written file. `epilog`: the Python medic-epilog (the
    node-local checkpoint tier's sweep), by default next to the prolog."""
    prolog = prolog or default_prolog()
    epilog = epilog or prolog.with_name("medic-epilog")
    for value, what in ((prolog, "prolog"), (socket, "socket"), (epilog, "epilog")):
        if '"' in str(value) or "\\" in str(value):
            raise BuildError(f"the {what} path {value} has a quote or backslash: use another")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / BINARY_NAME
    stamp = out_dir / f".{BINARY_NAME}.built-for"
    built_for = f"{prolog}\n{socket}\n{epilog}\n"
    fresh = stamp.exists() and stamp.read_text() == built_for
    if fresh and up_to_date(output, [SOURCE, Path(__file__)]):
        return output
    defines = [f'-DMEDIC_PROLOG="{prolog}"', f'-DMEDIC_SOCKET_DEFAULT="{socket}"']
    compile_c(SOURCE, output, [*defines, f'-DMEDIC_EPILOG="{epilog}"'])
    stamp.write_text(built_for)
    return output


def main(argv: list[str] | None = None) -> int:
    """`python -m slurm_hooks.native.build OUT_DIR [--prolog P] [--socket S]`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m slurm_hooks.native.build")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--prolog", type=Path, help="the Python medic-prolog to hand over to")
    parser.add_argument(
        "--socket", type=Path, default=NodePaths.socket, help="medic-healthd's socket"
    )
    args = parser.parse_args(argv)
    try:
        print(build_hook(args.out_dir, args.prolog, args.socket))
    except BuildError as exc:
        print(f"medic: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

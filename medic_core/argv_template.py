"""A repair command's argv template, checked as the ladder will fill it in
(`[remediation] gpu_reset`, `driver_reload`, `[remediation.isolation] apply`)."""

from __future__ import annotations

import string
from collections.abc import Iterator


def argv_problems(
    key: str, argv: tuple[str, ...], placeholders: tuple[str, ...]
) -> Iterator[tuple[str, str, str]]:
    """A repair command's argv, as the ladder will run it (`str.format` with `placeholders`
    only): not empty, a program first, and every `{...}` exactly one of `placeholders`: no
    attribute, index, conversion or format spec (`{gpu:>999999999}` would be a 1 GB argument);
    `{{` and `}}` are literal braces."""
    known = ", ".join("{" + p + "}" for p in placeholders)
    if not argv or not argv[0].strip():
        problem = "is empty" if not argv else "starts with an empty program name"
        yield key, problem, f"give the command as a list, program first (placeholders: {known})"
        return
    for arg in argv:
        try:
            fields = [
                (name, conversion, spec)
                for _, name, spec, conversion in string.Formatter().parse(arg)
                if name is not None
            ]
        except ValueError as exc:
            yield key, f"{arg!r} is not a valid template ({exc})", f"use {known}; write {{{{ for {{"
            return
        for name, conversion, spec in fields:
            if name not in placeholders or conversion or spec:
                shown = "{" + name + (f"!{conversion}" if conversion else "")
                shown += (f":{spec}" if spec else "") + "}"
                problem = f"{arg!r}: {shown} is not a placeholder Medic fills in"
                fix = f"use only {known} as they are; write a literal brace as {{{{ or }}}}"
                yield key, problem, fix
                return

"""The one sanitiser for untrusted text on its way to a terminal or a drain reason.

Text from Slurm (job names, comments, reasons), from jobs (their output, their progress
files), from devices and from users is shown by `medic` (tables, `medic events`, `medic
report`, `medic node show`...) and written into drain reasons. A terminal acts on what it is
sent: an escape sequence recolours, moves the cursor, clears the screen, sets the window
title (OSC: `ESC ] 0;title BEL`), or worse in some terminals; a carriage return overwrites
the line; an RTL override reorders what follows. So every character that a terminal, `sinfo`
or a log would not show as itself becomes a visible "?": every C0 control (NUL to US, and
DEL), every C1 control (U+0080 to U+009F, among them the 8-bit CSI, OSC, DCS, SOS, PM, APC and
ST), and the Unicode format characters, surrogates, private-use and unassigned code points.
Tabs and line breaks (LF, CR, VT, FF, NEL, U+2028, U+2029, the C0 separators) become spaces:
one field stays on one line.

No escape sequence survives: each starts with ESC or a C1 control, which is replaced, and
what followed it (`[31m`, `]0;PWNED`) is left as the plain text it then is, so the attempt
shows. Printable text (any letter, digit, punctuation or symbol, accented, CJK or emoji) is
kept as it is. JSON output needs none of this (json.dumps escapes every control); the HTML
report escapes with html.escape.
"""

from __future__ import annotations

import io
import sys
import unicodedata
from typing import Any, TextIO

REPLACEMENT = "?"
# Controls (Cc), format characters (Cf: RTL/LTR overrides and isolates, zero-width ones),
# surrogates (Cs), private use (Co) and unassigned code points (Cn).
UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
# Line and paragraph separators (Zl, Zp) are not controls, but break the line like LF.
_BREAKS = frozenset({"Zl", "Zp"})


def _shown(char: str) -> str:
    category = unicodedata.category(char)
    if category in _BREAKS or (char.isspace() and category == "Cc"):
        return " "
    return REPLACEMENT if category in UNPRINTABLE else char


def sanitised(text: str) -> str:
    """`text` as a terminal shows it as itself, on one line (see the module's docstring)."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(_shown(c) for c in text)


class TerminalGuard(io.TextIOBase):
    """A text stream that passes everything written to it through `sanitised` but its line
    breaks and tabs (fish's completion separates a value from its help with a tab): `medic`
    installs it on stdout and stderr (`guard_terminal`, from cli.main), so a line that prints
    a job's text without going through cli.common's `table` or `clip` cannot send an escape
    sequence either. Bytes written to its `buffer` are not filtered."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        shown = text
        if not (text.isascii() and text.isprintable()):
            lines = (line.split("\t") for line in text.split("\n"))
            shown = "\n".join("\t".join(sanitised(part) for part in line) for line in lines)
        self.stream.write(shown)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.stream.errors

    @property
    def buffer(self) -> Any:
        return getattr(self.stream, "buffer", None)


def guard_terminal() -> None:
    """Sanitise everything `medic` writes to stdout and stderr (see TerminalGuard)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, TerminalGuard):
            setattr(sys, name, TerminalGuard(stream))

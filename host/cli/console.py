"""The rich console of every report command (inspect, diff, verify, checkpoint, profiles, doctor).

Written to a terminal, a report takes the terminal's width.  Written to a file or a pipe, rich
would assume 80 columns and wrap every table and long line of a forensic report; there a line of
text is never wrapped (a grep finds it whole) and a table takes at least WIDTH_PIPED columns (the
widest report, diff's fleet table, is 148) unless COLUMNS says otherwise.

A report prints text it did not write: paths, device names, hints, errno strings, the JIT's log,
exception messages, decoded tokens.  Rich would read "[red]" or "[/]" in them as markup (eaten,
or a MarkupError) and ":x:" as an emoji code, so the console reads neither: every string, table
cell and title prints as written, and a report colours a word only through `styled`.
"""
from __future__ import annotations

import os

from rich.console import Console
from rich.text import Text

WIDTH_PIPED = 160
VERBATIM = {"markup": False, "emoji": False, "highlight": False}   # a Console's reading of strings


def report_console(**kwargs) -> Console:
    c = Console(**{**VERBATIM, **kwargs})
    if not c.is_terminal:
        c.soft_wrap = True
        if "COLUMNS" not in os.environ:
            c.width = max(c.width, WIDTH_PIPED)
    return c


def styled(*parts) -> Text:
    """One line from plain strings and (text, style) pairs, e.g. styled(("FAIL", "red"), "  x"):
    the styles apply, the text is never parsed."""
    return Text.assemble(*parts)

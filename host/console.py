"""The rich console of every report command (inspect, diff, verify, checkpoint, profiles, doctor).

Written to a terminal, a report takes the terminal's width.  Written to a file or a pipe, rich
would assume 80 columns and wrap every table and long line of a forensic report; there a line of
text is never wrapped (a grep finds it whole) and a table takes at least WIDTH_PIPED columns (the
widest report, diff's fleet table, is 148) unless COLUMNS says otherwise.
"""
from __future__ import annotations

import os

from rich.console import Console

WIDTH_PIPED = 160


def report_console(**kwargs) -> Console:
    c = Console(highlight=False, **kwargs)
    if not c.is_terminal:
        c.soft_wrap = True
        if "COLUMNS" not in os.environ:
            c.width = max(c.width, WIDTH_PIPED)
    return c

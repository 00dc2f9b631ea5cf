"""The result file (CONTRACT §8–§9): the progressive writer (host/result_writer.py) and the reader
(host/result_reader.py), every name importable from here.

The sections, their order, sizes and record types are one table, `staging.result_sections`:

    forward part (3·V·4) | step windows (4096 × steps) | stat (160) | loss block (16384) |
    final part (V·4) | semaphore region (32 × 3) | error notifier (64) | status block (160) |
    timestamp table (64 × issues)

The writer appends them in that order as the run goes; the reader recovers profile, steps and
issues from nothing but the file's size and its status block.
"""
from __future__ import annotations

from .result_reader import ATTRIBUTES, ResultFile, ResultFileError, plain, read, record_dict
from .result_reader import _locate  # noqa: F401  (the reader-mutation tests search with it)
from .result_writer import ResultRefused, ResultWriteError, ResultWriter

__all__ = ["ATTRIBUTES", "ResultFile", "ResultFileError", "plain", "read", "record_dict",
           "ResultRefused", "ResultWriteError", "ResultWriter"]

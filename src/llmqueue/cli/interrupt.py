"""Ctrl-C: one line naming what the interrupted command kept on disk, exit code 130.

:class:`~llmqueue.cli.common.Command` turns a ``KeyboardInterrupt`` (SIGINT) into
:class:`Interrupted`, carrying :func:`kept` of the command's output flags; ``main`` prints
``llmqueue: interrupted; kept ...``. Nothing already written is removed: records written
incrementally (a sweep's cached points, a benchmark's records) stay, and a rerun resumes from them
where the command supports it.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The parameters (click names) that hold where a command writes.
OUTPUT_PARAMS = ("out_dir", "output_path", "out", "output", "png_dir")


class Interrupted(Exception):
    """A command stopped by Ctrl-C; ``kept`` says what it had written."""

    def __init__(self, kept: str):
        super().__init__(kept)
        self.kept = kept


def _written_since(path: Path, started: float) -> int:
    """Files under ``path`` (or ``path`` itself) modified since ``started`` (a time.time())."""
    try:
        if path.is_file():
            return int(path.stat().st_mtime >= started)
        if not path.is_dir():
            return 0
        n = 0
        for root, _, files in os.walk(path):
            for f in files:
                try:
                    n += os.stat(os.path.join(root, f)).st_mtime >= started
                except OSError:
                    pass
        return n
    except OSError:
        return 0


def kept(params: dict, started: float) -> str:
    """What the command's output paths (``params``: its click parameters) hold that was written
    since ``started``: ``"runs/x/ (3 files written)"``, or ``"nothing (no output written yet)"``."""
    parts = []
    for name in OUTPUT_PARAMS:
        value = params.get(name)
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            continue
        p = Path(value)
        n = _written_since(p, started)
        if not n:
            continue
        if p.is_dir():
            parts.append(f"{p}/ ({n} file{'s' if n != 1 else ''} written)")
        else:
            parts.append(str(p))
    return ", ".join(parts) if parts else "nothing (no output written yet)"

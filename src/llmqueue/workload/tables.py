"""Read numeric columns of token counts from CSV, plain-number or JSONL files.

Formats, chosen by the file name (``.gz`` is read through gzip):

- ``.jsonl`` / ``.ndjson``: one JSON object per line; columns are its keys.
- ``.json``: a list of objects, or an object of equal-length lists.
- anything else: delimited text (``,``, tab or whitespace, from the first line). A first row
  that is all numbers means there is no header; the columns are then named ``0``, ``1``, ...
  A file with one column is a plain list of numbers, one per line.

Known column names (used when the spec does not name a column) cover the shared traces:
prompt ``num_prefill_tokens`` (Sarathi/Vidur/Etalon), ``ContextTokens`` (Azure, APEX),
``input_length`` (Mooncake), ``input_tokens``, ``prompt_tokens``, ``prompt_len``, ``input_len``, ``prompt``, ``input``, ``s``;
output ``num_decode_tokens``, ``GeneratedTokens``, ``output_length``, ``output_tokens``,
``completion_tokens``, ``output_len``, ``output``, ``o``.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np

from llmqueue.errors import InputError

KNOWN = {
    "prompt": ("num_prefill_tokens", "ContextTokens", "input_length", "input_tokens",
               "prompt_tokens", "prompt_len", "input_len", "prompt", "input", "s"),
    "output": ("num_decode_tokens", "GeneratedTokens", "output_length", "output_tokens",
               "completion_tokens", "output_len", "output", "o"),
}


class Table:
    """Columns of a file, by name, as lists of raw cells (converted on demand)."""

    def __init__(self, path: str, names: list[str], columns: dict[str, list]):
        self.path = path
        self.names = names
        self._columns = columns

    def resolve(self, requested: str | None, role: str | None) -> str:
        """The column to use: ``requested`` if given, the only column, or the known ``role`` name."""
        if requested is not None:
            if requested in self._columns:
                return requested
            raise InputError("column", f"{requested!r} is not a column of {self.path!r} "
                             f"(columns: {', '.join(self.names)})")
        if len(self.names) == 1:
            return self.names[0]
        if role in KNOWN:
            hits = [c for c in KNOWN[role] if c in self._columns]
            if len(hits) == 1:
                return hits[0]
        key = "column" if role not in KNOWN else role
        raise InputError(key, f"{self.path!r} has several columns ({', '.join(self.names)}); "
                         f"name the one to use with {key}=NAME")

    def tokens(self, name: str) -> np.ndarray:
        """Column ``name`` as int64 token counts; every value must be a whole number >= 1."""
        cells = self._columns[name]
        if not cells:
            raise InputError("column", f"{name!r} of {self.path!r} has no values")
        try:
            x = np.asarray(cells, dtype=np.float64)
        except (TypeError, ValueError):
            bad = next(i for i, c in enumerate(cells) if not _is_float(c))
            raise InputError("column", f"{name!r} of {self.path!r} has a non-number "
                             f"{cells[bad]!r} in data row {bad + 1}") from None
        ok = np.isfinite(x) & (x >= 1) & (x == np.floor(x))
        if not ok.all():
            bad = int(np.argmin(ok))
            raise InputError("column", f"{name!r} of {self.path!r} has {int((~ok).sum())} values "
                             f"that are not whole numbers >= 1 (first: {cells[bad]!r} in data "
                             f"row {bad + 1})", "token counts must be positive integers")
        return x.astype(np.int64)


def _is_float(c) -> bool:
    try:
        float(c)
    except (TypeError, ValueError):
        return False
    return True


def read_table(path: str | Path) -> Table:
    """Read ``path`` into a :class:`Table`; raises :class:`InputError` (field ``file``) on failure."""
    p = Path(path)
    if not p.is_file():
        raise InputError("file", f"{str(path)!r} does not exist or is not a file")
    name = p.name.lower()
    opener = gzip.open if name.endswith(".gz") else open
    base = name[:-3] if name.endswith(".gz") else name
    try:
        with opener(p, "rt", encoding="utf-8-sig", newline="") as fh:
            text = fh.read()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise InputError("file", f"cannot read {str(path)!r}: {' '.join(str(e).split())}") from None
    try:
        if base.endswith((".jsonl", ".ndjson")):
            return _records(str(path), [json.loads(line) for line in text.splitlines() if line.strip()])
        if base.endswith(".json"):
            data = json.loads(text)
            if isinstance(data, dict):
                return _columns(str(path), data)
            return _records(str(path), data)
    except json.JSONDecodeError as e:
        raise InputError("file", f"{str(path)!r} is not valid JSON: {e}") from None
    except RecursionError:
        raise InputError("file", f"{str(path)!r} is nested too deeply to read") from None
    return _delimited(str(path), text)


def _records(path: str, rows) -> Table:
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise InputError("file", f"{path!r} holds no JSON objects (expected one object per line)")
    names = list(rows[0])
    try:
        columns = {k: [r[k] for r in rows] for k in names}
    except KeyError as e:
        raise InputError("file", f"{path!r}: some records lack the key {e.args[0]!r}") from None
    return Table(path, names, columns)


def _columns(path: str, data: dict) -> Table:
    columns = {k: v for k, v in data.items() if isinstance(v, list)}
    if not columns or len({len(v) for v in columns.values()}) != 1:
        raise InputError("file", f"{path!r}: expected an object of equal-length lists")
    return Table(path, list(columns), columns)


def _delimited(path: str, text: str) -> Table:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InputError("file", f"{path!r} is empty")
    first = lines[0]
    if "," in first or "\t" in first:
        rows = list(csv.reader(io.StringIO("\n".join(lines)), delimiter="," if "," in first else "\t"))
    else:
        rows = [ln.split() for ln in lines]
    header = not all(_is_float(c) for c in rows[0])
    names = [c.strip() for c in rows[0]] if header else [str(i) for i in range(len(rows[0]))]
    body = rows[1:] if header else rows
    width = len(names)
    bad = next((i for i, r in enumerate(body) if len(r) != width), None)
    if bad is not None:
        raise InputError("file", f"{path!r}: data row {bad + 1} has {len(body[bad])} fields, "
                         f"expected {width}")
    columns = {n: [r[i] for r in body] for i, n in enumerate(names)}
    return Table(path, names, columns)

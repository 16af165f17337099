"""User files: inputs opened only when they are regular files, their read errors as one line,
and output paths checked before any work runs.

Every reader of a file the user names goes through :func:`input_file` (a FIFO, a device or a
directory is refused instead of blocking or failing deep inside a parser) and :func:`reading`
(undecodable bytes, a truncated gzip stream, nesting too deep for the parser and OS errors become
an :class:`~llmqueue.errors.InputError` naming the field). :func:`output_path` checks, before a
command simulates or measures anything, that its output can be written: not empty, not a file
where a directory is wanted, not under a file, writable, and not one of the command's inputs.
Missing parent directories are fine: the writers create them.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import stat
import tempfile
import zlib
from pathlib import Path

from llmqueue.errors import InputError


def _one_line(e: BaseException) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())[:300]


def input_file(field: str, path, *, what: str = "file") -> Path:
    """``path`` as a Path when it names a regular file; otherwise one-line InputError on ``field``
    (missing, a directory, a FIFO/device/socket that would block or never end, unreadable)."""
    s = os.fspath(path) if path is not None else ""
    if not str(s).strip():
        raise InputError(field, f"the {what} path is empty", f"give the path of a {what}")
    p = Path(s).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(field, f"{str(s)!r} does not exist", f"give the path of a {what}") from None
    except OSError as e:
        raise InputError(field, f"cannot read {str(s)!r}: {_one_line(e)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(field, f"{str(s)!r} is a directory, not a {what}", f"give the path of a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(field, f"{str(s)!r} is not a regular file (a FIFO, device or socket is not read)",
                         f"give the path of a {what}")
    if not os.access(p, os.R_OK):
        raise InputError(field, f"cannot read {str(s)!r}: permission denied")
    return p


@contextlib.contextmanager
def reading(field: str, path):
    """Turn the errors of reading and parsing the user file ``path`` into one-line InputErrors."""
    name = repr(str(path))
    try:
        yield
    except InputError:
        raise
    except UnicodeDecodeError as e:
        raise InputError(field, f"{name} is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})",
                         "give a UTF-8 text file") from None
    except RecursionError:
        raise InputError(field, f"{name} is nested too deeply to read", "flatten the file") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise InputError(field, f"{name} is truncated or not valid gzip ({_one_line(e)})",
                         "give the complete file") from None
    except OSError as e:
        raise InputError(field, f"cannot read {name}: {_one_line(e)}", "check that the file is complete and "
                         "readable") from None


def jsonl_objects(field: str, path, fix: str):
    """The JSON objects of the JSONL file ``path`` as (line number, dict), blank lines skipped; a
    line that is not a JSON object is one InputError naming it (``fix``: what to give instead).
    The caller reads inside :func:`reading`."""
    p = str(path)
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as e:
                raise InputError(field, f"{p!r} line {i} is not JSON ({e})", fix) from None
            if not isinstance(d, dict):
                raise InputError(field, f"{p!r} line {i} is not a JSON object", fix)
            yield i, d


def read_text(field: str, path, *, what: str = "file") -> str:
    """The text of the regular UTF-8 file ``path`` (gzip-compressed when it ends in ``.gz``)."""
    p = input_file(field, path, what=what)
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    with reading(field, path), opener(p, "rt", encoding="utf-8-sig") as fh:
        return fh.read()


def yaml_problem(e) -> str:
    """A YAML error as the tail of a one-line message: ``" at line L, column C: problem"``."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{where}: {_one_line(' '.join(str(x) for x in (e.context, e.problem) if x))}"
    return f": {_one_line(e)}"


def load_yaml(field: str, path, *, what: str = "file"):
    """The YAML document in ``path``, read with the safe loader (no Python tags)."""
    import yaml

    text = read_text(field, path, what=what)
    with reading(field, path):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InputError(field, f"{str(path)!r} is not valid YAML{yaml_problem(e)}") from None


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _loops(p: Path) -> bool:
    """Whether resolving ``p`` meets a symlink loop."""
    try:
        p.resolve()
    except (OSError, RuntimeError):
        return True
    return False


def output_path(field: str, path, *, kind: str = "file", inputs=(), also=()) -> Path:
    """Check before any work that ``path`` can be written; returns it as a Path.

    ``kind``: ``"file"`` or ``"dir"``. Refused in one line on ``field``: an empty path; an
    existing path of the other kind (or a FIFO/device); a path under a file; a place this process
    cannot write; a path that would overwrite an input. ``inputs``: ``(field, path)`` of the
    files the command reads; ``also``: the other paths it writes (files beside a spec, the records
    inside a run directory), checked against the inputs too. Nothing is created: missing
    directories are made by the writer.
    """
    s = os.fspath(path) if path is not None else ""
    if not str(s).strip():
        raise InputError(field, "the output path is empty", f"give a {'directory' if kind == 'dir' else 'file'} name")
    p = Path(s).expanduser()
    for in_field, in_path in inputs:
        if in_path is None or not str(in_path).strip() or str(in_path) == "-":
            continue
        q = Path(os.fspath(in_path)).expanduser()
        for out in (p, *also):
            try:
                same = _same(out, q) or out.resolve() == q.resolve()
            except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
                loop = in_field if _loops(q) else field
                raise InputError(loop, f"{str(q if loop == in_field else out)!r} is a symlink loop",
                                 "remove the link or point it at a file") from None
            if same:
                raise InputError(field, f"{str(s)!r} would overwrite the input {str(in_path)!r} ({in_field}); "
                                 "outputs never overwrite inputs", "write to another path")
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as e:
        raise InputError(field, f"cannot write {str(s)!r}: {_one_line(e)}") from None
    if st is not None:
        if kind == "dir" and not stat.S_ISDIR(st.st_mode):
            raise InputError(field, f"{str(s)!r} exists and is not a directory", "give a directory name")
        if kind == "file":
            if stat.S_ISDIR(st.st_mode):
                raise InputError(field, f"{str(s)!r} is a directory", "give a file name")
            if not stat.S_ISREG(st.st_mode):
                raise InputError(field, f"{str(s)!r} is not a regular file (a device, FIFO or socket)",
                                 "give a file name")
    # The nearest existing directory at or above the place written.
    probe = p if (st is not None and kind == "dir") else p.parent
    while True:
        try:
            pst = os.stat(probe)
        except (FileNotFoundError, NotADirectoryError):
            if probe.parent == probe:
                break
            probe = probe.parent
            continue
        except OSError as e:
            raise InputError(field, f"cannot write {str(s)!r}: {_one_line(e)}") from None
        if not stat.S_ISDIR(pst.st_mode):
            raise InputError(field, f"cannot write {str(s)!r}: {str(probe)!r} is a file, not a directory",
                             "give a path under a directory")
        break
    try:
        if st is not None and kind == "file":
            with open(p, "r+b"):
                pass  # writable, and left as it is
        fd, tmp = tempfile.mkstemp(prefix=".llmqueue-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise InputError(field, f"cannot write {str(s)!r}: {_one_line(e)}",
                         "give a path in a directory you can write") from None
    return p


def load_json(field: str, path, *, what: str = "file"):
    """The JSON document in ``path`` (errors, nesting too deep included, as one line)."""
    import json

    text = read_text(field, path, what=what)
    with reading(field, path):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(field, f"{str(path)!r} is not valid JSON: {e.msg} (line {e.lineno})") from None

"""User files: inputs opened only when they are regular files, their read errors as one line,
output paths checked before any work runs, and outputs written whole or not at all.

Every reader of a file the user names goes through :func:`input_file` (a FIFO, a device or a
directory is refused instead of blocking or failing deep inside a parser) and :func:`reading`
(undecodable bytes, a truncated gzip stream, nesting too deep for the parser and OS errors become
an :class:`~llmqueue.errors.InputError` naming the field). :func:`output_path` checks, before a
command simulates or measures anything, that its output can be written: not empty, not a file
where a directory is wanted, not under a file, writable, and not one of the command's inputs.
Missing parent directories are fine: the writers create them. A symbolic link already at the
place of an output (planted in the output folder) is refused there too: outputs are never
written through a link.

Every output file (Parquet, JSON, YAML, CSV, HTML, PNG) is written through :class:`staged` (or
:func:`write_atomic`): under a temporary name in its own folder, renamed over the output once
whole. A full disk, a quota or a kill leaves the previous file or none, never a truncated one; the
error names the output file in one line (:func:`write_error`).
"""

from __future__ import annotations

import contextlib
import errno
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
    with open_text(path) as f:
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


def open_text(path, *, encoding: str = "utf-8", newline: str | None = None):
    """``path`` opened for reading text: through gzip when its name ends in ``.gz`` or its first
    bytes are gzip's magic number (a compressed file under any name), else as it is. The caller
    reads inside :func:`reading`."""
    with open(path, "rb") as fb:
        magic = fb.read(2) == b"\x1f\x8b"
    if magic or Path(path).name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding=encoding, newline=newline)
    return open(path, encoding=encoding, newline=newline)


def read_text(field: str, path, *, what: str = "file") -> str:
    """The text of the regular UTF-8 file ``path`` (gzip-compressed: :func:`open_text`)."""
    p = input_file(field, path, what=what)
    with reading(field, path), open_text(p, encoding="utf-8-sig") as fh:
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
    for out in (p, *also):
        refuse_link(field, out)
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


def refuse_link(field: str, path) -> None:
    """One-line InputError on ``field`` if a symbolic link (dangling or not) lies where the output
    file ``path`` goes: a link planted in the output folder would send the output elsewhere
    (``requests.parquet -> /etc/passwd``). The output's directory may itself be a link."""
    p = Path(path)
    if p.is_symlink():
        try:
            target = os.readlink(p)
        except OSError:
            target = "?"
        raise InputError(field, f"{str(p)!r} is a symbolic link (to {target!r}); outputs are never written "
                         "through a link", "remove the link or write somewhere else")


class WriteError(InputError, OSError):
    """An output file could not be written (full disk, quota, I/O error): the environment's
    fault, reported in one line naming the file like any bad input (exit 2). It is also the
    OSError it stands for (``errno``, ``strerror``, ``filename``: the output file), so a caller that
    notes a failed write and goes on (the benchmark's extra files) catches it as before."""

    def __init__(self, field: str, problem: str, fix: str | None = None, *, cause: OSError | None = None,
                 filename=None):
        InputError.__init__(self, field, problem, fix)
        self.errno = getattr(cause, "errno", None)
        self.strerror = getattr(cause, "strerror", None) or (_one_line(cause) if cause is not None else problem)
        self.filename = None if filename is None else str(filename)

    def __str__(self) -> str:
        return str(self.args[0])


def write_failed(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a failure of the disk under an output (then no partial output is kept)."""
    return isinstance(exc, (OSError, WriteError))


def write_error(field: str, path, e: OSError) -> InputError:
    """The OSError ``e`` of writing output ``path`` (a full disk, a quota, an I/O error) as one line
    naming the output file, not its temporary name."""
    reason = _one_line(e)
    fix = "free space or write somewhere else" if getattr(e, "errno", None) in (
        errno.ENOSPC, errno.EDQUOT, errno.EFBIG, None) else "write somewhere else"
    return WriteError(field, f"cannot write {str(path)!r}: {reason} (the file is left as it was)", fix, cause=e,
                      filename=path)


def _umask() -> int:
    try:  # Linux: read without changing it (os.umask would, briefly, for every thread)
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    m = os.umask(0o022)
    os.umask(m)
    return m


class staged:
    """Write the output file ``path`` under a temporary name in its folder; rename it over
    ``path`` when whole.

        with staged(path) as tmp:       # tmp: a Path, an empty file already created
            pq.write_table(table, tmp)  # any writer that takes a path

    On leaving the block normally the temporary file is renamed over ``path`` (atomic on one
    file system: a reader sees the previous file or the new one); on any exception it is removed
    and ``path`` is untouched. An OSError (full disk, quota, I/O error) becomes one
    :class:`InputError` on ``field`` naming ``path``. Incremental writers use :meth:`commit` and
    :meth:`discard` themselves. A symbolic link at ``path`` is refused (:func:`refuse_link`); the
    temporary file is created exclusively, so no link is followed. ``fsync=True`` flushes the file
    to the device before the rename (a crash of the machine then leaves one or the other too).
    The new file gets the permissions of the file it replaces, else the usual ``0666 & ~umask``.
    """

    def __init__(self, path, *, field: str = "out", fsync: bool = False):
        self.path = Path(path)
        self.field = field
        self.fsync = fsync
        refuse_link(field, self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            os.close(fd)
        except OSError as e:
            raise write_error(field, self.path, e) from None
        self.tmp = Path(tmp)
        self.done = False

    def commit(self) -> Path:
        """Rename the temporary file over ``path`` (once)."""
        if self.done:
            return self.path
        self.done = True
        try:
            try:
                mode = stat.S_IMODE(os.stat(self.path).st_mode)
            except OSError:
                mode = 0o666 & ~_umask()
            os.chmod(self.tmp, mode)
            if self.fsync:
                fd = os.open(self.tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            refuse_link(self.field, self.path)
            os.replace(self.tmp, self.path)
        except BaseException as e:
            self.tmp.unlink(missing_ok=True)
            if isinstance(e, OSError):
                raise write_error(self.field, self.path, e) from None
            raise
        return self.path

    def discard(self) -> None:
        """Remove the temporary file; ``path`` keeps what it held."""
        self.done = True
        with contextlib.suppress(OSError):
            self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.commit()
            return False
        self.discard()
        if isinstance(exc, OSError):
            raise write_error(self.field, self.path, exc) from None
        return False


def write_atomic(path, data, *, field: str = "out", fsync: bool = False) -> Path:
    """Write ``data`` (str as UTF-8, or bytes) to the output file ``path`` whole or not at all
    (:class:`staged`); creates missing parent directories. Returns ``path`` as a Path."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    st = staged(path, field=field, fsync=fsync)
    with st as tmp, open(tmp, "wb") as f:
        f.write(raw)
    return st.path

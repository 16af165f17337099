"""Issue 37 item 1: a full disk never leaves a truncated output.

Every output file is written under a temporary name in its folder and renamed when whole
(:class:`llmqueue._files.staged`). Each case runs a command once with room (its previous
outputs), then again on a disk that fills while it writes: the second run must exit 2 with one
line naming the file it could not write, and every file in the output folder must be either the
previous one, byte for byte, or a whole new one (it parses); no temporary file stays. The same
is checked on an empty folder (the outputs are whole files or none).

The disk: a small tmpfs filled to ``free`` bytes when this process may mount one (root);
otherwise the command runs in a child process whose file-size limit (``RLIMIT_FSIZE``, SIGXFSZ
ignored) makes the kernel fail each write past ``limit`` bytes with EFBIG, as a full disk does.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from _cli import run_cli

REPO = Path(__file__).resolve().parents[1]
MODEL = "--capacity-tokens 131000 --step-time 0.0372 --chunk 512"
WL = "--prompt uniform:10:1600 --output uniform:10:1600 --arrival poisson:2 --duration {dur} --seed 1"

# (id, command line with {src} (the inputs), {out} (the output folder on the small disk), and
# {sfx} / {dur}: the first run (the previous outputs) is a smaller one, so that its files are
# smaller than the new ones: writing over them in place would not free room enough)
CASES = [
    ("simulate", f"simulate {MODEL} {WL} --no-progress --out {{out}}/run"),
    ("convert", "workload convert {src}/t{sfx}.csv -o {out}/t.parquet"),
    ("fit", "workload fit {src}/t{sfx}.csv -o {out}/fit.yaml"),
    ("import", "import csv {src}/client{sfx}.csv --out {out}/imp"),
    ("sweep", f"sweep {MODEL} {WL} --rates 1,2 --backend serial --no-progress --out {{out}}/sw"),
    ("report", "report {src}/run{sfx} -o {out}/r.html --png-dir {out}/png --no-progress"),
]
SMALL = {"sfx": "-small", "dur": 5}
LARGE = {"sfx": "", "dur": 60}
# where the disk gives out: bytes left free on the tmpfs / the file-size limit of the child
FREE = [0, 3000]


def _inputs(d: Path) -> None:
    for sfx, n in (("", 3000), ("-small", 40)):
        rows = "".join(f"{i * 0.37:.3f},{10 + (i * 7) % 900},{5 + (i * 13) % 300}\n" for i in range(1, n))
        (d / f"t{sfx}.csv").write_text("time,prompt,output\n" + rows)
        rows = "".join(f"{i * 0.2:.2f},{0.05 + (i % 7) * 0.01:.3f},{0.5 + (i % 11) * 0.1:.2f},{10 + i % 50},"
                       f"{5 + i % 40},ok\n" for i in range(n // 2))
        (d / f"client{sfx}.csv").write_text("send_s,ttft_s,e2el_s,prompt_tokens,output_tokens,status\n" + rows)
    for sfx, dur in (("", 60), ("-small", 5)):
        wl = WL.format(dur=dur)
        r = run_cli(*shlex.split(f"simulate {MODEL} {wl} --no-progress --out {d / ('run' + sfx)}"))
        assert r.code == 0, r.err


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    _inputs(d)
    return d


def _can_mount() -> bool:
    return sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("mount") is not None


class TmpfsDisk:
    """A 24 MiB tmpfs at ``root``, filled to leave ``free`` bytes."""

    kind = "tmpfs"

    def __init__(self, root: Path):
        self.root = root
        root.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(root)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            root.rmdir()
            raise OSError(r.stderr.strip() or "mount failed")

    def fill(self, free: int) -> None:
        st = os.statvfs(self.root)
        room = st.f_bavail * st.f_frsize - free
        with open(self.root / ".filler", "ab", buffering=0) as f:
            chunk = b"\0" * 65536
            while room > 0:
                try:
                    room -= f.write(chunk[: min(room, len(chunk))])
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break

    def run(self, argv: list[str], free: int):
        self.fill(free)
        try:
            return run_cli(*argv)
        finally:
            (self.root / ".filler").unlink()

    def close(self) -> None:
        subprocess.run(["umount", str(self.root)], check=False)


class FsizeDisk:
    """Writes past ``free`` bytes in any one file fail (EFBIG) in the child process."""

    kind = "fsize"

    def __init__(self, root: Path):
        self.root = root
        root.mkdir()

    def run(self, argv: list[str], free: int):
        limit = max(free, 1)

        def child():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        r = subprocess.run([sys.executable, "-m", "llmqueue.cli.main", *argv], capture_output=True, text=True,
                           env=env, preexec_fn=child, timeout=300, stdin=subprocess.DEVNULL)
        return r.returncode, r.stdout, r.stderr

    def close(self) -> None:
        pass


@pytest.fixture(params=["tmpfs", "fsize"])
def disk(request, tmp_path):
    if request.param == "tmpfs":
        if not _can_mount():
            pytest.skip("mounting a tmpfs needs root on Linux (the fsize case covers this host)")
        try:
            d = TmpfsDisk(tmp_path / "disk")
        except OSError as e:
            pytest.skip(f"cannot mount a tmpfs here: {e}")
    else:
        if not hasattr(resource, "RLIMIT_FSIZE") or not hasattr(signal, "SIGXFSZ"):
            pytest.skip("no file-size limit on this system")
        d = FsizeDisk(tmp_path / "disk")
    yield d
    d.close()


def _files(d: Path) -> dict:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != ".filler"}


def _whole(p: Path) -> None:
    """``p`` parses as what its name says (a truncated file does not)."""
    data = p.read_bytes()
    assert data, f"{p} is empty"
    name = p.name
    if name.endswith(".parquet"):
        pq.read_table(p)
    elif name.endswith(".json"):
        json.loads(data)
    elif name.endswith(".yaml"):
        assert yaml.safe_load(data) is not None
    elif name.endswith(".csv"):
        assert data.endswith(b"\n")
    elif name.endswith(".html"):
        assert data.rstrip().endswith(b"</html>"), f"{p} is cut short"
    elif name.endswith(".png"):
        assert data.endswith(b"IEND\xaeB`\x82"), f"{p} is cut short"
    else:
        raise AssertionError(f"unexpected output {p}")


def _check(out: Path, before: dict, code, err: str) -> None:
    after = _files(out)
    for k in after:
        if before.get(k) != after[k]:
            _whole(out / k)  # not the previous file: then a whole new one
    stray = [k for k in after if Path(k).name.startswith(".") and Path(k).name.endswith(".tmp")]
    assert not stray, f"temporary files left: {stray}"
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmqueue: error: "), err
    assert "Traceback" not in err
    assert "cannot write" in lines[0] and str(out) in lines[0], lines[0]  # names the file


@pytest.mark.parametrize("free", FREE)
@pytest.mark.parametrize("case,cmdline", [pytest.param(c, a, id=c) for c, a in CASES])
def test_full_disk_leaves_the_previous_file_or_none(disk, src, case, cmdline, free):
    out = disk.root / "o"
    first = run_cli(*shlex.split(cmdline.format(src=src, out=out, **SMALL)))  # with room: the previous outputs
    assert first.code == 0, first.err
    argv = shlex.split(cmdline.format(src=src, out=out, **LARGE))
    before = _files(out)
    assert before
    code, _, err = disk.run(argv, free)
    _check(out, before, code, err)
    # an empty folder: whole files or none
    shutil.rmtree(out)
    code, _, err = disk.run(argv, free)
    _check(out, {}, code, err)


def test_a_link_met_while_writing_is_refused_and_not_followed(src, tmp_path):
    """A link in a folder whose file names are known only while writing (the report's PNGs) is
    refused when reached: one line naming it, the link's target untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (tmp_path / "png").mkdir()
    os.symlink(victim, tmp_path / "png" / "queue.png")
    code, _, err = run_cli("report", src / "run-small", "-o", tmp_path / "r.html", "--png-dir", tmp_path / "png",
                           "--no-progress")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "queue.png" in err and "symbolic link" in err, err
    assert victim.read_text() == "keep\n"
    assert not [p for p in (tmp_path / "png").iterdir() if p.name.endswith(".tmp")]


def test_a_rewritten_file_keeps_its_permissions(tmp_path):
    from llmqueue._files import write_atomic

    p = tmp_path / "a.json"
    write_atomic(p, "{}\n")
    mask = os.umask(0o022)
    os.umask(mask)
    assert (p.stat().st_mode & 0o777) == 0o666 & ~mask  # as open() would have made it
    p.chmod(0o640)
    write_atomic(p, b"[]\n")
    assert (p.stat().st_mode & 0o777) == 0o640 and p.read_bytes() == b"[]\n"

"""The README's shell blocks, extracted and run as printed (``tests/test_readme.py`` uses this).

:func:`shell_blocks` finds every fenced ```` ```bash ```` block of a Markdown text and splits it into
commands (a command is its first line and the lines that continue it: a trailing backslash, a
here-document up to its delimiter, a ``for``/``while`` loop up to its ``done``). :func:`run_block`
runs a block as one bash script, exactly as printed, with an ``ERR`` trap in front that reports
each command that exits non-zero with its README line; a command the caller skips is replaced by
``:`` (its line numbers kept). Background jobs (``&``) the block leaves running are ended with
their process group when the script ends or times out.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

_FENCE = re.compile(r"^```\s*(\w*)\s*$")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
_TRAP = "trap 'echo \"README-FAIL $? $LINENO\" >&2' ERR\n"
_FAIL = re.compile(r"^README-FAIL (\d+) (\d+)$", re.M)


@dataclass
class Command:
    """One command as printed: its first README line and its text (continuation lines included)."""

    line: int
    text: str

    @property
    def last_line(self) -> int:
        return self.line + self.text.count("\n")


@dataclass
class Block:
    """A fenced shell block: the README line of its first content line, the section it sits in
    (the nearest heading above), its text as printed and its commands."""

    line: int
    section: str
    text: str
    commands: list[Command] = field(default_factory=list)

    @property
    def id(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-") or "top"


def shell_blocks(markdown: str) -> list[Block]:
    """Every ```` ```bash ```` (or ``sh``/``shell``) block of ``markdown``, in order; the ids of two
    blocks in one section get ``-2``, ``-3``, ..."""
    blocks: list[Block] = []
    section, lang, start, body = "top", None, 0, []
    for i, line in enumerate(markdown.splitlines(), 1):
        m = _FENCE.match(line)
        if lang is None:
            if m:
                lang, start, body = m.group(1), i + 1, []
            elif line.startswith("#"):
                section = line.lstrip("#").strip()
            continue
        if line.strip() != "```":
            body.append(line)
            continue
        if lang in ("bash", "sh", "shell"):
            blocks.append(Block(start, section, "\n".join(body) + "\n", _commands(body, start)))
        lang = None
    seen: dict[str, int] = {}
    for b in blocks:
        n = seen[b.section] = seen.get(b.section, 0) + 1
        if n > 1:
            b.section = f"{b.section} {n}"
    return blocks


def _commands(lines: list[str], first: int) -> list[Command]:
    """Split a block's lines into commands (comments and blank lines between them left out)."""
    out: list[Command] = []
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if not s or s.startswith("#"):
            i += 1
            continue
        j = i
        heredoc = _HEREDOC.search(lines[i])
        loop = re.match(r"(for|while|until)\b", s) and not re.search(r"\bdone\b", s)
        while True:
            cur = lines[j].rstrip()
            if heredoc:
                if j > i and cur == heredoc.group(2):
                    heredoc = None
                    if not cur.endswith("\\"):
                        break
            elif loop:
                if j > i and re.search(r"\bdone\b", cur):
                    loop = False
                    if not cur.endswith("\\"):
                        break
            elif not cur.endswith("\\"):
                break
            j += 1
            if j >= len(lines):
                j = len(lines) - 1
                break
        out.append(Command(first + i, "\n".join(lines[i:j + 1])))
        i = j + 1
    return out


@dataclass
class BlockRun:
    """What a block's run gave: the exit code of the script, each failed command (README line,
    exit code, text) and the output (stdout and stderr) for the failure message."""

    code: int
    failures: list[tuple[int, int, str]]
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures and not self.timed_out

    def report(self) -> str:
        lines = [f"README line {ln}: exit {rc}: {text.splitlines()[0]}" for ln, rc, text in self.failures]
        if self.timed_out:
            lines.append("the block timed out")
        return "\n".join(lines) + "\n--- output (last 4000 characters) ---\n" + self.output[-4000:]


def run_block(block: Block, cwd: Path, *, env: dict | None = None, skip: dict[int, str] | None = None,
              allowed: dict[int, int] | None = None, timeout_s: float = 600) -> BlockRun:
    """Run ``block`` as one bash script in ``cwd``. ``skip``: {command line: reason} replaced by
    ``:``; ``allowed``: {command line: exit code} a command may end with (the README says it does,
    e.g. a ``wait`` on a job ended by Ctrl-C). A command that exits otherwise non-zero is a failure."""
    skip, allowed = skip or {}, allowed or {}
    lines = block.text.splitlines()
    for c in block.commands:
        if c.line in skip:
            for k in range(c.line, c.last_line + 1):
                lines[k - block.line] = ": README-SKIP" if k == c.line else ""
    script = _TRAP + "\n".join(lines) + "\n"
    # the output goes to a file: a background job left running keeps a pipe open, never a file
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc.pid)  # background jobs the block left running
        proc.wait()
        log.seek(0)
        out = log.read()
    by_line = {c.line: c for c in block.commands}
    failures = []
    for rc, ln in _FAIL.findall(out):
        readme_line = int(ln) - 1 + block.line - 1
        cmd = _command_at(block, readme_line) or Command(readme_line, "?")
        if allowed.get(cmd.line) == int(rc):
            continue
        failures.append((cmd.line, int(rc), by_line.get(cmd.line, cmd).text))
    if proc.returncode not in (0, *allowed.values()) and not failures and not timed_out:
        failures.append((block.line, proc.returncode, "(the script as a whole)"))
    return BlockRun(proc.returncode, failures, out, timed_out)


def _command_at(block: Block, line: int) -> Command | None:
    for c in block.commands:
        if c.line <= line <= c.last_line:
            return c
    return None


def _kill_group(pid: int) -> None:
    """End the process group ``pid`` leads (the script and the jobs it started)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if sig == signal.SIGTERM:
            import time

            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    os.killpg(pid, 0)
                except (ProcessLookupError, PermissionError):
                    return
                time.sleep(0.1)

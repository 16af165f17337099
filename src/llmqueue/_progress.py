"""Progress bars on stderr (tqdm): one bar over a command's whole job, so its estimate is overall.

- :func:`wanted`: the ``--progress/--no-progress`` convention (default: on when stderr is a terminal).
- :func:`bar`: a tqdm bar, or a silent stand-in with the same methods when progress is off.
- :class:`SimSeconds`: one bar over several simulations, in simulated seconds: each simulation's
  engine callback (:attr:`llmqueue.engine.options.SimOptions.progress`) moves it within that
  simulation's share.
"""

from __future__ import annotations

import sys


def wanted(flag: bool | None) -> bool:
    """``--progress`` / ``--no-progress`` as given, else whether stderr is a terminal."""
    return sys.stderr.isatty() if flag is None else bool(flag)


class _Silent:
    """A bar that shows nothing (progress off)."""

    n = 0
    total = None

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, s="", refresh=True):
        pass

    def set_description_str(self, s="", refresh=True):
        pass

    def refresh(self):
        pass

    def close(self):
        pass


def bar(total, *, desc: str, unit: str, enabled: bool, **kw):
    """A tqdm bar on stderr when ``enabled`` (cleared when done, as sweep's), else a silent one."""
    if not enabled:
        s = _Silent()
        s.total = total
        return s
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, mininterval=0.5, leave=False,
                **kw)


class SimSeconds:
    """One bar over ``runs`` simulations of ``seconds`` simulated seconds each.

    ``callback()`` gives the engine's progress callback of the next simulation; :meth:`done`
    moves the bar to that simulation's end (a run may stop early); ``label`` shows which one runs.
    """

    def __init__(self, runs: int, seconds: float, *, desc: str, enabled: bool):
        self.seconds = float(seconds)
        self.offset = 0.0
        fmt = "{l_bar}{bar}| {n:.0f}/{total:.0f} sim-s [{elapsed}<{remaining}]{postfix}"
        self.bar = bar(round(runs * self.seconds, 3), desc=desc, unit="sim-s", enabled=enabled, bar_format=fmt)

    def callback(self, label: str | None = None):
        if label is not None:
            self.bar.set_postfix_str(label)
        base = self.offset

        def to(t: float) -> None:
            x = base + max(0.0, min(float(t), self.seconds))
            if x > self.bar.n:
                self.bar.update(x - self.bar.n)

        return to

    def done(self) -> None:
        self.offset += self.seconds
        if self.offset > self.bar.n:
            self.bar.update(self.offset - self.bar.n)

    def close(self) -> None:
        self.bar.close()

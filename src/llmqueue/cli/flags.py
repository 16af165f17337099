"""Click flags generated from the knob table (:mod:`llmqueue.knobs`), and which ones were given.

Every command that takes engine, workload or run knobs (``simulate``, ``sweep``, ``capacity``,
``validate``, ``bench``) adds them with :func:`knob_options`, so a flag has one name, type,
default and help everywhere; ``bench`` and ``profile`` add the options of a benchmark run the
same way (:class:`TableFlags` over :data:`llmqueue.bench.options.OPTIONS`). :func:`given_flags` tells the flags the user typed from those at
their defaults (click's parameter source): only the typed ones override a scenario.
"""

from __future__ import annotations

import click

from llmqueue.knobs import BY_NAME, Knob, flag_default, flag_knobs

_UNIT_METAVAR = {"tokens": "TOKENS", "s": "SECONDS", "ms": "MS"}
_TYPES = {int: click.INT, float: click.FLOAT, str: click.STRING, object: click.STRING}


def knob_option(k: Knob, default_from: str | None = None):
    """The click option of knob ``k`` (``--x/--no-x`` for a boolean). ``default_from``: where a
    flag not given takes its value instead of the knob's default (then it holds None)."""
    default = None if k.flag_unset else flag_default(k)
    kw: dict = {"help": k.help}
    if default_from is not None:
        default = None
        kw["help"] += f"  [not given: {default_from}]"
    if k.envvar:
        kw.update(envvar=k.envvar, show_envvar=True)
    if k.switch:
        return click.option(k.flag_name, k.name, is_flag=True, **kw)
    if k.type is bool:
        return click.option(f"{k.flag_name}/--no-{k.flag_name[2:]}", k.name, default=default,
                            show_default=default is not None, **kw)
    kw["type"] = click.Choice(k.choices) if k.choices else _TYPES[k.type]
    if k.multiple:
        kw["multiple"] = True
    if k.metavar or k.unit in _UNIT_METAVAR:
        kw["metavar"] = k.metavar or _UNIT_METAVAR[k.unit]
    if default is not None:
        kw["show_default"] = True
    elif k.default is not None and default_from is None and not k.flag_unset:  # held at None to tell an alias apart
        kw["help"] += f"  [default: {k.default}]"
    if k.old_flags:
        from llmqueue.cli.common import renamed_option

        return renamed_option(k.flag_name, k.name, old=k.old_flags, default=default, **kw)
    return click.option(k.flag_name, k.name, default=default, **kw)


def knob_options(*groups: str, names=None, default_from: str | None = None, knobs=None):
    """A decorator adding the flags of the knobs in ``groups`` (all when none), of ``names``, or
    the flags of ``knobs`` (another table's, e.g. :data:`llmqueue.bench.options.OPTIONS`)
    (``default_from``: see :func:`knob_option`)."""
    if knobs is None:
        knobs = [BY_NAME[n] for n in names] if names is not None else flag_knobs(*groups)

    def deco(f):
        for k in reversed(knobs):
            f = knob_option(k, default_from)(f)
        return f

    return deco


class TableFlags:
    """The flags of a knob table (``knobs``), placed in a command's ``--help`` order:
    :meth:`place` adds the named ones where it stands; :meth:`rest`, the last one used, every
    flag of the table not placed, so that a knob added to the table is a flag of the command
    without an edit there. :meth:`values` reads them back from the command's parameters."""

    def __init__(self, knobs):
        self.knobs = {k.name: k for k in knobs if k.flag}
        self.placed: set[str] = set()

    def place(self, *names: str):
        self.placed.update(names)
        return knob_options(knobs=[self.knobs[n] for n in names])

    def rest(self):
        return knob_options(knobs=[k for n, k in self.knobs.items() if n not in self.placed])

    def values(self, params: dict) -> dict:
        """``{name: value}`` of the table's flags in click's ``params``, each flag's text parsed
        (the knob's ``parse``); flags that hold None (not given) are left out."""
        out = {}
        for name, k in self.knobs.items():
            v = params.get(name)
            if v is None:
                continue
            out[name] = k.parse(v) if k.parse is not None else v
        return out


def given_flags(ctx: click.Context, names) -> list[str]:
    """The flags among ``names`` that the user gave (on the command line or from the environment)."""
    out = []
    for name in names:
        src = ctx.get_parameter_source(name)
        if src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP"):
            out.append(name)
    return out

"""Click flags generated from the knob table (:mod:`llmqueue.knobs`), and which ones were given.

Every command that takes engine, workload or run knobs (``simulate``, ``sweep``, ``capacity``,
``validate``, ``bench``) adds them with :func:`knob_options`, so a flag has one name, type,
default and help everywhere. :func:`given_flags` tells the flags the user typed from those at
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
    default = flag_default(k)
    kw: dict = {"help": k.help}
    if default_from is not None:
        default = None
        kw["help"] += f"  [not given: {default_from}]"
    if k.type is bool:
        return click.option(f"{k.flag_name}/--no-{k.flag_name[2:]}", k.name, default=default,
                            show_default=default is not None, **kw)
    kw["type"] = click.Choice(k.choices) if k.choices else _TYPES[k.type]
    if k.metavar or k.unit in _UNIT_METAVAR:
        kw["metavar"] = k.metavar or _UNIT_METAVAR[k.unit]
    if default is not None:
        kw["show_default"] = True
    elif k.default is not None and default_from is None:  # held at None to tell an alias apart
        kw["help"] += f"  [default: {k.default}]"
    if k.old_flags:
        from llmqueue.cli.common import renamed_option

        return renamed_option(k.flag_name, k.name, old=k.old_flags, default=default, **kw)
    return click.option(k.flag_name, k.name, default=default, **kw)


def knob_options(*groups: str, names=None, default_from: str | None = None):
    """A decorator adding the flags of the knobs in ``groups`` (all when none), or of ``names``
    (``default_from``: see :func:`knob_option`)."""
    knobs = [BY_NAME[n] for n in names] if names is not None else flag_knobs(*groups)

    def deco(f):
        for k in reversed(knobs):
            f = knob_option(k, default_from)(f)
        return f

    return deco


def given_flags(ctx: click.Context, names) -> list[str]:
    """The flags among ``names`` that the user gave (on the command line or from the environment)."""
    out = []
    for name in names:
        src = ctx.get_parameter_source(name)
        if src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP"):
            out.append(name)
    return out

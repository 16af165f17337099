"""The compact spec syntax shared by CLI flags and config files.

Grammar::

    spec   := NAME ( ":" item )*
    item   := VALUE | KEY "=" VALUE

``NAME`` picks the distribution or process (case-insensitive). Positional values come first and
fill the parameters in the order each form lists them; any parameter may instead be named with
``key=value`` (keys are case-insensitive). A parameter may be given once. Examples::

    uniform:10:1600          uniform:lo=10:hi=1600
    lognormal:mean=600:sd=400:max=8192
    gamma:5:cv=2             onoff:20:on=30:off=90
    empirical:data/sharegpt.csv:column=num_prefill_tokens

Numbers are plain decimals or scientific notation (``1600``, ``0.5``, ``1e6``). Unit suffixes
such as ``4k`` or ``1m`` are rejected on purpose: ``4k`` tokens means 4000 to some people and
4096 to others, and ``1m`` could be a million or a minute. NaN and infinities are rejected.

In forms that take a file (``empirical``, ``joint``) the path is the only positional value and
may itself contain ``:`` (``C:\\data\\x.csv``); the options are the trailing ``key=value`` items
whose value holds no ``/`` or ``\\`` (so a path ending in ``:name=value.csv`` is misread; rename it).

A bad spec raises :class:`~llmqueue.errors.InputError` whose field is the caller's (``prompt``,
``output``, ``arrival``, ``lengths``) and whose message quotes the spec and shows the expected
form, e.g. ``prompt: cannot parse 'uniform:10': uniform needs LO:HI, got 1 value; expected
uniform:LO:HI, e.g. uniform:10:1600``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from llmqueue.errors import InputError

_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\Z")
_SUFFIXED = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)[a-zA-Z]+\Z")
_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", re.S)


@dataclass(frozen=True)
class Form:
    """One named spec form: its parameters (name, type), which are positional, and its usage."""

    name: str
    params: tuple[tuple[str, str], ...]  # (name, "int" | "float" | "str"), positional order first
    positional: int  # how many leading params may be given without a key
    required: tuple[str, ...]
    usage: str  # e.g. "uniform:LO:HI"
    example: str  # e.g. "uniform:10:1600"
    path: bool = False  # the single positional is a file path that may contain ':'

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.params)


def spec_error(field: str, spec: str, detail: str, form: Form | None = None,
               forms: dict[str, Form] | None = None) -> InputError:
    """An :class:`InputError` quoting ``spec``, explaining ``detail`` and showing the expected form."""
    if form is not None:
        fix = f"expected {form.usage}, e.g. {form.example}"
    elif forms:
        fix = "expected one of " + ", ".join(f.usage for f in _unique(forms))
    else:
        fix = None
    return InputError(field, f"cannot parse {spec!r}: {detail}", fix)


def _unique(forms: dict[str, Form]) -> list[Form]:
    seen, out = set(), []
    for f in forms.values():
        if id(f) not in seen:
            seen.add(id(f))
            out.append(f)
    return out


def parse_number(text: str, what: str) -> float:
    """``text`` as a finite float; raises ``ValueError(detail)`` naming ``what`` otherwise."""
    t = text.strip()
    if _NUMBER.match(t):
        x = float(t)
        if math.isinf(x):
            raise ValueError(f"{what} must be finite (got {t!r})")
        return x
    if t.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        raise ValueError(f"{what} must be a finite number (got {t!r})")
    if _SUFFIXED.match(t):
        raise ValueError(f"{what} must be a plain number (got {t!r}); unit suffixes are ambiguous "
                         "(4k = 4000 or 4096?), write the number out, e.g. 4096 or 4e3")
    raise ValueError(f"{what} must be a number (got {t!r})")


def is_number(text: str) -> bool:
    return bool(_NUMBER.match(text.strip()))


def split_spec(text: str, field: str, forms: dict[str, Form], kind: str) -> tuple[Form, dict]:
    """Split ``text`` into its form and a dict of converted parameter values.

    ``forms`` maps each accepted name (aliases included) to its :class:`Form`; ``kind`` names
    the family for messages ("length distribution", "arrival process").
    """
    if not isinstance(text, str):
        raise InputError(field, f"expected a spec string, got {text!r}",
                         "expected one of " + ", ".join(f.usage for f in _unique(forms)))
    spec = text.strip()
    if not spec:
        raise spec_error(field, text, f"empty {kind} spec", forms=forms)
    name, _, rest = spec.partition(":")
    form = forms.get(name.strip().lower())
    if form is None:
        valid = ", ".join(sorted(forms))
        raise spec_error(field, spec, f"unknown {kind} {name.strip()!r} (valid: {valid})", forms=forms)
    items = _items(rest, form) if ":" in spec else []

    raw: dict[str, str] = {}
    npos = 0
    for i, item in enumerate(items):
        m = _KEY.match(item)
        if m and (m.group(1).lower() in form.names or not (form.path and i == 0)):
            key, value = m.group(1).lower(), m.group(2).strip()
            if key not in form.names:
                raise spec_error(field, spec, f"unknown key {key!r} for {form.name} "
                                 f"(valid: {', '.join(form.names)})", form)
            if key in raw:
                raise spec_error(field, spec, f"{key} given twice", form)
            if value == "":
                raise spec_error(field, spec, f"{key}= has no value", form)
            raw[key] = value
            continue
        if len(raw) > npos:
            raise spec_error(field, spec, f"positional value {item!r} after key=value items "
                             "(put positional values first)", form)
        if item == "":
            raise spec_error(field, spec, "empty value (two ':' in a row or a trailing ':')", form)
        if npos >= form.positional:
            many = f"{form.positional} positional value{'s' if form.positional != 1 else ''}"
            raise spec_error(field, spec, f"{form.name} takes at most {many}, "
                             f"got {item!r} as an extra one", form)
        raw[form.names[npos]] = item
        npos += 1

    missing = [p for p in form.required if p not in raw]
    if missing:
        got = len(items)
        need = ":".join(p.upper() for p in form.required)
        raise spec_error(field, spec, f"{form.name} needs {need}, got {got} "
                         f"value{'s' if got != 1 else ''} (missing {', '.join(missing)})", form)

    values: dict = {}
    types = dict(form.params)
    for key, value in raw.items():
        if types[key] == "str":
            values[key] = value
            continue
        try:
            x = parse_number(value, key)
        except ValueError as e:
            raise spec_error(field, spec, str(e), form) from None
        if types[key] == "int":
            if x != int(x):
                raise spec_error(field, spec, f"{key} must be a whole number (got {value!r})", form)
            x = int(x)
        values[key] = x
    return form, values


def _items(rest: str, form: Form) -> list[str]:
    parts = [p.strip() for p in rest.split(":")]
    if not form.path:
        return parts
    # The path may contain ':'; the options are the trailing NAME=VALUE items whose value has
    # no path separator (so a misspelled key is reported, not taken as part of the path).
    k = len(parts)
    while k > 1 and _option(parts[k - 1]):
        k -= 1
    return [":".join(parts[:k])] + parts[k:]


def _option(item: str) -> bool:
    m = _KEY.match(item)
    return bool(m) and "/" not in m.group(2) and "\\" not in m.group(2)


def fmt(x) -> str:
    """Canonical short text for a number in a spec: ``1600``, ``0.5``, ``1e-05``."""
    x = float(x)
    if x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return repr(x)


def wrap(field: str, spec: str, form: Form, err: InputError) -> InputError:
    """Re-raise a constructor's :class:`InputError` (naming a parameter) as a spec error."""
    detail = f"{err.field} {err.problem}" if err.field else err.problem
    if err.fix:
        detail += f"; {err.fix}"
    return spec_error(field, spec, detail, form)

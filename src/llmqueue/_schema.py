"""The base of every validated description (a scenario file's sections, a fleet): pydantic models
that refuse unknown keys, NaN and infinities, numbers that are booleans, and report a problem as
one :class:`~llmqueue.errors.InputError` naming the field's path (``lanes[1].pool``).

A validator raises :class:`_Problem` (a location relative to the model that raised it, the problem
and the fix); :func:`_from_validation_error` turns pydantic's error list into the one line.
"""

from __future__ import annotations

import difflib
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from llmqueue.errors import InputError, LlmqueueError


class _Problem(ValueError):
    """A validation problem at ``where`` (a location relative to the model that raised it)."""

    def __init__(self, where: tuple = (), problem: str = "", fix: str | None = None):
        self.where, self.problem, self.fix = tuple(where), problem, fix
        super().__init__(problem + (f"; {fix}" if fix else ""))

    @classmethod
    def of(cls, err: LlmqueueError, where: tuple = ()) -> "_Problem":
        if isinstance(err, InputError):
            return cls(where, err.problem, err.fix)
        return cls(where, str(err))


def _no_bool(what: str):
    def check(v):
        if isinstance(v, bool):
            raise _Problem((), f"must be {what} (got {str(v).lower()})")
        return v
    return check


Int = Annotated[int, BeforeValidator(_no_bool("a whole number"))]
Float = Annotated[float, BeforeValidator(_no_bool("a number"))]


class _Section(BaseModel):
    """Base of every section: unknown keys are errors, NaN and infinities are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict):
            known = list(cls.model_fields)
            for k in data:
                if not isinstance(k, str) or k not in cls.model_fields:
                    near = difflib.get_close_matches(str(k), known, n=1, cutoff=0.6)
                    fix = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(known)}"
                    raise _Problem((str(k),), "unknown key", fix)
        return data


def _clean_name(v: str) -> str:
    """A name field's check: non-empty, no leading or trailing spaces."""
    if not v.strip() or v != v.strip():
        raise _Problem((), f"must be a non-empty name without leading or trailing spaces (got {v!r})")
    return v


# --- pydantic's errors as one line ---------------------------------------------------------------

def _fmt_loc(loc) -> str:
    out = ""
    for x in loc:
        if isinstance(x, int) and not isinstance(x, bool):
            out += f"[{x}]"
        else:
            out += ("." if out else "") + str(x)
    return out


def _show(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (int, str)):
        return repr(v) if isinstance(v, str) else str(v)
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return type(v).__name__


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _translate(e: dict) -> tuple[str, str | None]:
    """Problem and fix of one pydantic error that our own validators did not raise."""
    t, ctx, inp = e["type"], e.get("ctx") or {}, e.get("input")
    if t == "missing":
        return "is required", None
    if t == "extra_forbidden":
        return "unknown key", None
    ops = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
    if t in ops:
        sym, key = ops[t]
        return f"must be {sym} {_num(ctx.get(key))} (got {_show(inp)})", None
    if t in ("int_parsing", "int_type", "int_from_float"):
        return f"must be a whole number (got {_show(inp)})", None
    if t in ("float_parsing", "float_type"):
        return f"must be a number (got {_show(inp)})", None
    if t == "finite_number":
        return f"must be a finite number (got {_show(inp)})", None
    if t in ("bool_parsing", "bool_type"):
        return f"must be true or false (got {_show(inp)})", None
    if t in ("string_type", "string_sub_type"):
        return f"must be text (got {_show(inp)})", None
    if t in ("model_type", "model_attributes_type", "dict_type"):
        if inp is None:
            return "is empty", "fill it in or remove the key"
        return f"must be a mapping of keys (got {_show(inp)})", None
    if t in ("list_type", "tuple_type"):
        return f"must be a list (got {_show(inp)})", "write one '- item' per line"
    return e.get("msg", t), None


def _from_validation_error(err, translate=_translate, top: str = "scenario") -> InputError:
    """The first of pydantic's errors as one :class:`InputError` at its full path (``top`` when it
    has none), counting the others; ``translate``: the problem and fix of an error none of our
    validators raised."""
    errors = err.errors(include_url=False)
    e = errors[0]
    loc = list(e.get("loc", ()))
    exc = (e.get("ctx") or {}).get("error")
    if isinstance(exc, _Problem):
        loc += list(exc.where)
        problem, fix = exc.problem, exc.fix
    elif isinstance(exc, InputError):
        problem, fix = exc.problem, exc.fix
    else:
        problem, fix = translate(e)
    more = len(errors) - 1
    if more:
        tail = f"({more} more error{'s' if more > 1 else ''})"
        if fix:
            fix = f"{fix} {tail}"
        else:
            problem = f"{problem} {tail}"
    return InputError(_fmt_loc(loc) or top, problem, fix)

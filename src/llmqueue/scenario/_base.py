"""The scenario schema's building blocks: the base of every section, the located problem, the
number types that refuse booleans (shared by :mod:`llmqueue.scenario.model` and
:mod:`llmqueue.scenario.fleet`)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo, model_validator

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


def _base(info: ValidationInfo) -> Path | None:
    ctx = info.context or {}
    b = ctx.get("base_dir")
    return Path(b) if b is not None else None


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

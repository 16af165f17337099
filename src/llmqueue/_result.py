"""Base for the small immutable result objects returned by theory and hardware functions."""

from __future__ import annotations

import dataclasses
import math


def _plain(v):
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return None
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        return _plain(v.item())
    return v


@dataclasses.dataclass(frozen=True)
class Result:
    """A frozen dataclass with ``to_dict()``; infinities and NaN become ``None`` (JSON null)."""

    def to_dict(self) -> dict:
        return _plain(self)

"""Argument checks that raise :class:`~llmqueue.errors.InputError` naming the field."""

from __future__ import annotations

import math
import sys
from numbers import Real

from llmqueue.errors import InputError


def _number(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, Real):
        try:
            x = float(x)
        except (TypeError, ValueError):
            raise InputError(name, f"expected a number, got {x!r}") from None
    x = float(x)
    if math.isnan(x):
        raise InputError(name, "is NaN", "give a finite number")
    return x


def finite(name: str, x) -> float:
    """Return ``x`` as float, rejecting NaN and +-inf."""
    x = _number(name, x)
    if math.isinf(x):
        raise InputError(name, f"must be finite (got {x})")
    return x


def positive(name: str, x, *, allow_inf: bool = False) -> float:
    """Return ``x`` as float, requiring ``x > 0`` (and finite unless ``allow_inf``).

    A subnormal ``x`` (below ``sys.float_info.min``, about 2.2e-308) is refused: its reciprocal
    overflows and its quotients lose their precision, so no result computed from it is right.
    """
    x = _number(name, x)
    if math.isinf(x) and not (allow_inf and x > 0):
        raise InputError(name, f"must be finite (got {x})")
    if x <= 0:
        raise InputError(name, f"must be > 0 (got {x:g})")
    if x < sys.float_info.min:
        raise InputError(name, f"{x:g} is too small for double-precision arithmetic (below {sys.float_info.min:.3g})",
                         "give it in a larger unit (e.g. per hour instead of per second)")
    return x


def nonnegative(name: str, x) -> float:
    """Return ``x`` as float, requiring finite ``x >= 0``."""
    x = finite(name, x)
    if x < 0:
        raise InputError(name, f"must be >= 0 (got {x:g})")
    return x


def probability(name: str, x, *, open_low: bool = True, open_high: bool = True) -> float:
    """Return ``x`` in (0, 1) (endpoints allowed when the matching ``open_*`` is False)."""
    x = finite(name, x)
    lo_ok = x > 0 if open_low else x >= 0
    hi_ok = x < 1 if open_high else x <= 1
    if not (lo_ok and hi_ok):
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        raise InputError(name, f"must be in {lo}0, 1{hi} (got {x:g})")
    return x


def positive_int(name: str, x, *, minimum: int = 1) -> int:
    """Return ``x`` as int, requiring an integer value ``>= minimum``."""
    xf = finite(name, x)
    if xf != int(xf):
        raise InputError(name, f"must be a whole number (got {x!r})")
    xi = int(xf)
    if xi < minimum:
        raise InputError(name, f"must be >= {minimum} (got {xi})")
    return xi

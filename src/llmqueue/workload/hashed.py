"""Uniform numbers that are pure functions of ``(seed, request_id, attempt)``: the same on every
backend and rerun, bit for bit (the retry jitter's, the clients' patience). SplitMix64's
finalizer (Steele, Lea & Flood 2014), a bijective 64-bit avalanche hash, chained over the keys."""

from __future__ import annotations

import operator

from llmqueue.errors import InputError

_MASK = (1 << 64) - 1


def mix64(z: int) -> int:
    """SplitMix64's finalizer: a bijective 64-bit avalanche hash of an integer (taken mod 2**64)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def as_int(name: str, x) -> int:
    """``x`` as a Python int (numpy integers included); bools and non-integers are refused."""
    if isinstance(x, bool):
        raise InputError(name, f"must be an integer (got {x!r})")
    try:
        return operator.index(x)
    except TypeError:
        raise InputError(name, f"must be an integer (got {x!r})") from None


def hashed_uniform(salt: int, seed: int, request_id: int, attempt: int) -> float:
    """A uniform number in [0, 1): ``h = mix(mix(mix(salt ^ seed) ^ request_id) ^ attempt)`` (all
    64-bit, two's complement for negative ids), the top 53 bits of ``h`` over ``2^53``. Each
    ``salt`` is an independent stream."""
    h = mix64(salt ^ (as_int("seed", seed) & _MASK))
    h = mix64(h ^ (as_int("request_id", request_id) & _MASK))
    h = mix64(h ^ (as_int("attempt", attempt) & _MASK))
    return (h >> 11) * 2.0 ** -53

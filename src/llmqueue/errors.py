"""Exceptions shared by every layer.

Every error a user can cause is an :class:`LlmqueueError` whose message is one
line naming the offending field and, where possible, the fix. The CLI turns
them into ``llmqueue: error: ...`` on stderr with exit code 2.
"""

from __future__ import annotations


class LlmqueueError(ValueError):
    """Base class: a problem with the user's input or request, never a bug."""

    field: str | None = None


class InputError(LlmqueueError):
    """A bad value: names the field (``lam``, ``prompt``, ``gpu``...), the problem and the fix."""

    def __init__(self, field: str, problem: str, fix: str | None = None):
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"{field}: {problem}"
        if fix:
            msg += f"; {fix}"
        super().__init__(msg)


class UnstableError(LlmqueueError):
    """A steady-state quantity was asked of a queue with utilization ``rho >= 1``.

    Such a queue has no steady state: the number in system grows without bound at
    about ``lam - c*mu`` requests per second, so mean waits are not finite.
    """

    def __init__(self, rho: float, growth_per_s: float | None = None, what: str = "the steady state",
                 field: str = "lam"):
        self.field = field
        self.rho = rho
        self.growth_per_s = growth_per_s
        msg = f"unstable: utilization rho = {rho:.4g} >= 1"
        if growth_per_s is not None and growth_per_s > 0:
            msg += f", queue grows {growth_per_s:.4g} req/s"
        msg += f"; {what} does not exist (lower {field} or add service capacity)"
        super().__init__(msg)

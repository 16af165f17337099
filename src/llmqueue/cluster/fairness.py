"""``FairQueue``: a gateway queue shared by tenants, served in weighted fair order by tokens.

Queueing terms. Tenants ``k`` with weights ``w_k`` share one server (the pool behind the
gateway). Generalized processor sharing (GPS) gives every backlogged tenant the service rate
``mu w_k / sum_{j backlogged} w_j``; weighted fair queueing approximates it one job at a time. An
LLM request's service is its tokens, not one unit, and a prompt of 12,000 tokens costs far more
than a chat turn, so the measure of service here is tokens (the virtual token counter of Sheng et
al., "Fairness in Serving Large Language Models", OSDI 2024):

- each tenant has a counter ``v_k`` of the tokens it was served divided by its weight: a
  request's prompt tokens are charged when it is dispatched, its output tokens when it ends
  (:meth:`FairQueue.charge`);
- the next request dispatched is the oldest of the backlogged tenant with the smallest counter
  (ties to the tenant that became backlogged first);
- a tenant that becomes backlogged has its counter lifted to the smallest counter among the
  tenants backlogged then (or to the last dispatched tenant's when none is), so that time spent
  idle is not saved up as credit to burst with later.

Then no backlogged tenant's counter falls behind another's by more than one request's cost over
its weight, so while tenants stay backlogged their shares of the tokens served converge to the
GPS shares ``w_k / sum_j w_j``, and one tenant's burst cannot starve another's contracted share.

The same object orders the simulator's gateway queue and the live gateway's: decisions read the
counters and the queue, nothing of the engines.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator


class FairQueue:
    """Per-tenant FIFO queues served by the virtual token counter (see the module docstring).

    ``weights``: tenant -> ``w_k`` (a tenant not named has ``default_weight``); ``tenant_of``:
    a request's tenant (its class by default, ``request.class_name``). Reads like the FIFO it
    replaces: ``append``, ``popleft``, ``[0]`` (the next to be dispatched), ``len``, iteration
    (every queued request, tenant by tenant)."""

    __slots__ = ("weights", "default_weight", "tenant_of", "queues", "counters", "order", "last", "_head", "_seq")

    def __init__(self, weights: dict | None = None, *, default_weight: float = 1.0,
                 tenant_of: Callable | None = None):
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self.tenant_of = tenant_of or _class_of
        self.queues: dict = {}      # tenant -> deque of its queued requests (only backlogged tenants)
        self.counters: dict = {}    # tenant -> v_k, tokens served / w_k
        self.order: dict = {}       # tenant -> when it became backlogged (a sequence number): ties
        self.last = 0.0             # the counter of the tenant served last
        self._head = None           # (tenant) chosen for the next dispatch, cached until the queues change
        self._seq = 0

    def weight(self, tenant) -> float:
        return float(self.weights.get(tenant, self.default_weight))

    def append(self, request) -> None:
        k = self.tenant_of(request)
        q = self.queues.get(k)
        if q is None:  # k becomes backlogged: its counter lifted to the backlogged ones' floor
            floor = min((self.counters[j] for j in self.queues), default=self.last)
            self.counters[k] = max(self.counters.get(k, 0.0), floor)
            self._seq += 1
            self.order[k] = self._seq
            q = self.queues[k] = deque()
        q.append(request)
        self._head = None

    def _next_tenant(self):
        if self._head is None:
            c, o = self.counters, self.order
            self._head = min(self.queues, key=lambda k: (c[k], o[k]))
        return self._head

    def __getitem__(self, i: int):
        if i != 0:
            raise IndexError("a fair queue shows only its next request ([0])")
        if not self.queues:
            raise IndexError("the fair queue is empty")
        return self.queues[self._next_tenant()][0]

    def popleft(self):
        """The next request to dispatch, taken out (its prompt is charged by :meth:`charge`)."""
        if not self.queues:
            raise IndexError("the fair queue is empty")
        k = self._next_tenant()
        q = self.queues[k]
        r = q.popleft()
        if not q:
            del self.queues[k]
            del self.order[k]
        self.last = self.counters[k]
        self._head = None
        return r

    def remove(self, request) -> None:
        """Take a queued request out (its client went away); ValueError if it is not queued."""
        k = self.tenant_of(request)
        q = self.queues.get(k)
        if q is None:
            raise ValueError("not queued")
        q.remove(request)
        if not q:
            del self.queues[k]
            del self.order[k]
        self._head = None

    def charge(self, tenant, tokens: float) -> None:
        """``tokens`` served to ``tenant`` (a dispatched prompt, or an ended request's output)."""
        self.counters[tenant] = self.counters.get(tenant, 0.0) + tokens / self.weight(tenant)
        self._head = None

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def __bool__(self) -> bool:
        return bool(self.queues)

    def __iter__(self) -> Iterator:
        for q in self.queues.values():
            yield from q


def _class_of(request):
    return request.class_name

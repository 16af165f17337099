"""One request as the workload produces it: when it arrives and how many tokens it carries."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """A request: id, arrival time (s from the start), prompt and output token counts, class.

    ``prompt_tokens`` is ``s`` and ``output_tokens`` is ``o`` in Nie et al.'s ``g(s, o)``. The
    per-request record schema calls ``class_name`` ``class``. Bulk work uses the columnar
    :class:`~llmqueue.workload.generate.RequestArrays`; this object is for iteration and tests.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    class_name: str = "default"

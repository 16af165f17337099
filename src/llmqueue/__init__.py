"""llmqueue: LLM inference serving modelled as a queueing system.

Layers (lower never imports higher; CONTRIBUTING.md lists them): ``hardware`` and ``theory``
(data and closed forms), ``workload``, ``engine`` (a replica), ``cluster`` (a fleet), ``records``
and ``metrics``, ``scenario``, ``simulate``, ``bench``, ``plan`` and ``report``, and ``cli``.
Subpackages are imported on demand so that ``import llmqueue`` stays cheap.
"""

__version__ = "0.1.0"

from llmqueue import compiled as _compiled

_compiled.activate()  # the compiled engine modules, or their source if they are stale (llmqueue/compiled.py)

from llmqueue.errors import InputError, LlmqueueError, UnstableError

__all__ = ["InputError", "LlmqueueError", "UnstableError", "__version__"]

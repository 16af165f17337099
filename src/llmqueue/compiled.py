"""The compiled build of the engine's hot modules, and the fall back to their source.

The fast replica (``engine/fast/``), its request and queue objects, the step's composition and
its pricing, and the fleet's event loop are plain Python.
``pip install`` compiles them with mypyc when it can (a C compiler and mypy at build time:
setup.py), which runs the same source 1.3-3.9 times faster (docs/benchmarks.md); without a compiler the package
installs and runs from source. Either way the records are the same (``tests/test_compiled.py``
compares them).

Compiled code is used only while it matches its source. The build writes each compiled source's
SHA-256 beside the package (``_compiled.json``); when the first compiled module is imported (or
:func:`status` is asked) the sources are hashed again, and if one changed since the build (an edit
in an editable checkout), or the environment sets ``LLMQUEUE_PURE_PYTHON=1``, every compiled module
is loaded from its ``.py`` file instead. All or none: compiled modules reach into each other's
native classes. The check waits for the engine so that ``llmqueue --help`` and the theory
commands, which import none of it, do not pay for it.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

#: the modules setup.py compiles, in the package (import names)
COMPILED_MODULES = (
    "llmqueue.engine.request",
    "llmqueue.engine.request_queue",
    "llmqueue.engine.stream",
    "llmqueue.engine.prefix_cache",
    "llmqueue.engine.kv_cache_manager",
    "llmqueue.engine.limits",
    "llmqueue.engine.output",
    "llmqueue.engine.pricing",
    "llmqueue.engine.fast.arrivals",
    "llmqueue.engine.fast.decoders",
    "llmqueue.engine.fast.ledger",
    "llmqueue.engine.fast.recorder",
    "llmqueue.engine.fast.scheduler",
    "llmqueue.engine.fast.stretch",
    "llmqueue.engine.fast.replica",
    "llmqueue.engine.run",
    "llmqueue.cluster.collect",
    "llmqueue.cluster.fleet",
)
HASH_FILE = "_compiled.json"
PURE_ENV = "LLMQUEUE_PURE_PYTHON"
_ROOT = Path(__file__).resolve().parent  # the llmqueue package directory

_status: str | None = None  # decided on first use (:func:`status`)


def source_path(module: str, root: Path | None = None) -> Path:
    """The ``.py`` file of a compiled module (``llmqueue.engine.fast.replica`` -> ``engine/fast/replica.py``)
    under the package directory ``root`` (this package's by default)."""
    return (root or _ROOT).joinpath(*module.split(".")[1:]).with_suffix(".py")


def source_hashes(root: Path | None = None) -> dict:
    """SHA-256 of every compiled module's source, by module name."""
    import hashlib

    return {m: hashlib.sha256(source_path(m, root).read_bytes()).hexdigest() for m in COMPILED_MODULES}


def _has_extension(module: str) -> bool:
    p = source_path(module)
    return any(p.with_suffix(s).exists() for s in importlib.machinery.EXTENSION_SUFFIXES)


class _SourceFinder:
    """A meta-path finder in front of the compiled modules: at the first import of one it decides
    (:func:`status`), and unless the build is usable it loads each from its ``.py`` file."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in COMPILED_MODULES and status() != "compiled":
            import importlib.util

            return importlib.util.spec_from_file_location(name, source_path(name))
        return None


def _decide() -> str:
    if not any(_has_extension(m) for m in COMPILED_MODULES):
        return "source: not compiled (no C compiler or mypy at install, or LLMQUEUE_PURE_PYTHON=1 at build)"
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"source: {PURE_ENV} is set"
    import json

    try:
        built = json.loads((_ROOT / HASH_FILE).read_text())
    except (OSError, ValueError):
        return f"source: the build's {HASH_FILE} is missing"
    stale = [m.rsplit(".", 1)[1] for m, h in source_hashes().items() if built.get(m) != h]
    if stale:
        return (f"source: {', '.join(stale)} changed since the build "
                "(rebuild with: pip install -e . --no-build-isolation, or any pip install)")
    return "compiled"


def activate() -> None:
    """Put :class:`_SourceFinder` in front of the import system: the compiled modules if they match
    their source, else every one from source. Called once by ``import llmqueue``, before any
    compiled module is imported."""
    if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())


def status() -> str:
    """``compiled``, or ``source: <why>`` (what ``llmqueue --version`` prints); decided once."""
    global _status
    if _status is None:
        _status = _decide()
    return _status


def is_compiled() -> bool:
    """Is the fast replica running as compiled code? Checked on the module the import system gives
    (the imported one, or the one it would import: through :class:`_SourceFinder` when on source);
    this module names the engine's modules but imports none of them."""
    import importlib.util

    spec = importlib.util.find_spec("llmqueue.engine.fast.replica")
    return spec is not None and not str(spec.origin or "").endswith(".py")

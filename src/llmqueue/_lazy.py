"""Lazy package exports: a package lists ``{name: submodule}`` and imports on first use."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str], extra: tuple = ()):
    """Return ``(__getattr__, __dir__)`` for ``package`` resolving ``exports`` lazily (PEP 562).

    ``extra`` lists names the package defines eagerly, for ``dir()``.
    """

    def __getattr__(name: str):
        mod = exports.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{mod}"), name)

    def __dir__():
        return sorted({*exports, *extra})

    return __getattr__, __dir__

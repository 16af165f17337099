"""Build hook: compile the engine's hot modules with mypyc when the build can.

The list of modules lives in ``src/llmqueue/compiled.py``. Without mypy or a C compiler, or with
``LLMQUEUE_PURE_PYTHON=1`` set at build time, the package installs as pure Python (a warning says
why); the same source runs either way. After a compiled build the hashes of the compiled sources
are written to ``llmqueue/_compiled.json``, which ``import llmqueue`` checks (a stale build falls
back to source).
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_llmqueue_compiled", HERE / "src/llmqueue/compiled.py")
compiled = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compiled)


def _warn(msg: str) -> None:
    print(f"llmqueue build: {msg}; installing pure Python (the same code, slower)", file=sys.stderr)


def ext_modules() -> list:
    if os.environ.get(compiled.PURE_ENV, "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not available")
        return []
    paths = [str(compiled.source_path(m, Path("src/llmqueue"))) for m in compiled.COMPILED_MODULES]
    try:
        return mypycify(["--ignore-missing-imports", "--follow-imports=silent",
                         "--disable-error-code=annotation-unchecked", *paths],
                        opt_level="3", debug_level="0", group_name="llmqueue")
    except BaseException as e:  # mypy's type errors end in SystemExit
        _warn(f"mypyc refused the sources ({type(e).__name__}: {e})")
        return []


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python when compiling fails, and records the sources' hashes."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler, a compile error
            _warn(f"compiling failed ({type(e).__name__}: {e})")
            for ext in self.extensions:
                p = Path(self.get_ext_fullpath(ext.name))
                if p.exists():
                    p.unlink()
            return
        if self.extensions:  # beside the built modules: src/ in place (editable), else the wheel's tree
            pkg = HERE / "src/llmqueue" if self.inplace else Path(self.build_lib) / "llmqueue"
            pkg.mkdir(parents=True, exist_ok=True)
            (pkg / compiled.HASH_FILE).write_text(json.dumps(compiled.source_hashes(HERE / "src/llmqueue"), indent=1))


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})

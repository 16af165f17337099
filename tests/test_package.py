"""The package's public surface: lazy exports, shell completion, help texts, the import graph."""

import pytest
from _cli import run_cli


def test_lazy_exports_are_the_names_not_their_modules():
    """``from llmqueue.theory import little`` is the function even after its module was imported
    (a submodule of the same name used to shadow it: the README's ``little(lam=..., W=...)`` failed)."""
    import importlib
    import pkgutil

    import llmqueue

    import llmqueue.theory.littles_law  # noqa: F401  (imported first on purpose)
    from llmqueue.theory import little

    assert callable(little) and little(lam=2.0, W=3.0).L == pytest.approx(6.0)
    for m in pkgutil.walk_packages(llmqueue.__path__, "llmqueue."):
        if not m.ispkg:
            continue
        pkg = importlib.import_module(m.name)
        subs = {x.name for x in pkgutil.iter_modules(pkg.__path__)}
        assert not set(getattr(pkg, "_EXPORTS", {})) & subs, m.name


def test_shell_completion_answers(tmp_path):
    """``_LLMQUEUE_COMPLETE=bash_source llmqueue`` prints the completion script (it printed the help);
    completing a command and a flag works."""
    import os
    import subprocess
    import sys

    def run(**env):
        code = "import sys; from llmqueue.cli.main import main; sys.exit(main())"
        return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=60)

    src = run(_LLMQUEUE_COMPLETE="bash_source")
    assert src.returncode == 0 and "_llmqueue_completion()" in src.stdout and "Usage:" not in src.stdout
    cmd = run(_LLMQUEUE_COMPLETE="bash_complete", COMP_WORDS="llmqueue sim", COMP_CWORD="1")
    assert cmd.stdout.split() == ["plain,simulate"]
    flag = run(_LLMQUEUE_COMPLETE="bash_complete", COMP_WORDS="llmqueue simulate --max-num-s", COMP_CWORD="2")
    assert flag.stdout.split() == ["plain,--max-num-seqs"]


def test_no_command_help_names_the_project_source_documents():
    """Users have no "seed 00x" documents: help texts cite the sources by name."""
    from llmqueue.cli.main import COMMANDS, cli

    texts = [run_cli("--help").out]
    for name in COMMANDS:
        code, out, _ = run_cli(name, "--help")
        assert code == 0, name
        texts.append(out)
        cmd = cli.get_command(None, name)
        for sub in getattr(cmd, "commands", {}):
            texts.append(run_cli(name, sub, "--help").out)
    for t in texts:
        assert "seed 00" not in t.lower() and "seed00" not in t.lower(), t[:200]



def test_run_cli_keeps_each_run_apart(monkeypatch):
    """The tests' ``run_cli``: stdout and stderr apart, nothing carried from one run into the next,
    the environment it was given undone afterwards."""
    import os

    ok = run_cli("queue", "mm1", "--lam", "8", "--mu", "10", "--json")
    bad = run_cli("queue", "mm1", "--lam", "12", "--mu", "10")
    assert ok.code == 0 and ok.err == "" and ok.json()["rho"] == pytest.approx(0.8)
    assert bad.code == 2 and bad.out == "" and bad.err.startswith("llmqueue: error: ") and bad.err.count("\n") == 1
    monkeypatch.delenv("LLMQUEUE_TEST_VAR", raising=False)
    assert run_cli("--help", env={"LLMQUEUE_TEST_VAR": "1"}).code == 0
    assert "LLMQUEUE_TEST_VAR" not in os.environ



def test_the_command_loads_blas_with_one_thread(tmp_path):
    """The `llmqueue` console script sets OPENBLAS_NUM_THREADS=1 before numpy loads (a value the user
    set is kept); the library itself leaves the environment alone."""
    import os
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    scripts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["llmqueue"] == "llmqueue.cli.main:run"
    code = ("import os, sys\nsys.argv = ['llmqueue', '--version']\nfrom llmqueue.cli.main import run\n"
            "try:\n    run()\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}

    def last_line(**extra):
        p = subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True,
                           timeout=60)
        return p.stdout.strip().splitlines()[-1]

    assert last_line() == "1 False"
    assert last_line(OPENBLAS_NUM_THREADS="3") == "3 False"


# -- the package's import graph ----------------------------------------------------------------
# Every ``import``/``from`` statement of the package, at module level or inside a function, is an
# edge: an import deferred into a function still ties the two modules together.

#: the layers, lowest first (CONTRIBUTING.md "Layout"); a module imports its own layer's package,
#: or a package of a lower layer; packages of one layer do not import each other
LAYERS = (
    ("errors", "_result", "_lazy", "_progress", "compiled"),
    ("_validate", "_files", "_schema", "knobs", "llmqueue"),  # "llmqueue": the package root (its __version__)
    # the record schema and its one column builder: what every producer writes (engine, bench, import)
    ("records.schema",),
    ("records.columns",),
    ("hardware", "theory"),
    ("workload",),
    ("engine",),
    ("cluster", "records"),
    ("metrics", "scenario"),
    ("theory.judged",),  # what the closed forms judge for a run: its arrival process, its pools, P/D
    ("margin", "theory.prediction"),  # theory.prediction: the closed forms fed a run's engine and workload
    ("simulate",),
    ("spec",),
    ("bench",),
    ("plan", "report", "serve"),  # serve: the live layer (emulator, gateway), above the fleet and the bench
    ("cli",),
)



def _import_graph(root=None) -> dict:
    """``{module: {imported module: line}}`` over every module of the package under ``root``."""
    import ast
    from pathlib import Path

    import llmqueue

    root = Path(root or llmqueue.__path__[0])
    files = {}
    for p in sorted(root.rglob("*.py")):
        parts = ("llmqueue",) + p.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (p, parts[-1] == "__init__")
    graph = {}
    for mod, (path, is_pkg) in files.items():
        here = mod if is_pkg else mod.rpartition(".")[0]
        edges = graph[mod] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:  # import a.b.c binds a.b.c; a name in a module is that module
                    name = name.rpartition(".")[0]
                if name.startswith("llmqueue") and name != mod:
                    edges.setdefault(name, node.lineno)
    return graph


def _cycles(graph: dict) -> list[set]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layer(mod: str) -> str:
    """The entry of :data:`LAYERS` that holds ``mod``: its module (``theory.prediction``), else its
    package or top-level module (``engine``, ``simulate``), else ``llmqueue`` (the root)."""
    parts = mod.split(".")[1:]
    named = {n for layer in LAYERS for n in layer}
    return next((".".join(parts[:k]) for k in (2, 1) if ".".join(parts[:k]) in named), "llmqueue")


def test_import_graph_reads_every_form_of_import(tmp_path):
    """The graph sees module-level and function-local imports, ``import a.b``, ``from a import b``
    (module or name) and relative imports; a cycle built on purpose is found."""
    pkg = tmp_path / "llmqueue"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("from . import a\n")
    (pkg / "engine" / "a.py").write_text("def f():\n    from llmqueue.engine.b import g\n")
    (pkg / "engine" / "b.py").write_text("import llmqueue.engine.a\nfrom llmqueue import errors\n"
                                          "from ..errors import InputError\n")
    g = _import_graph(pkg)
    assert g["llmqueue.engine"] == {"llmqueue.engine.a": 1}
    assert g["llmqueue.engine.a"] == {"llmqueue.engine.b": 2}
    assert g["llmqueue.engine.b"] == {"llmqueue.engine.a": 1, "llmqueue.errors": 2}
    assert _cycles(g) == [{"llmqueue.engine.a", "llmqueue.engine.b"}]


def test_no_import_cycles():
    """No two modules import each other, directly or round a circle (imports inside functions
    count): a circle means a piece both need lives in the wrong one of them."""
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_layers_import_only_downward():
    """A module imports its own package or a lower layer's (:data:`LAYERS`), never a higher one's
    nor a package beside it in its layer; every package has a layer."""
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    graph = _import_graph()
    assert {m.split(".")[1] for m in graph if "." in m} <= set(rank), "packages without a layer in LAYERS"
    bad = [f"{m}:{line} imports {t}" for m, edges in sorted(graph.items()) for t, line in sorted(edges.items())
           if _layer(t) != _layer(m) and rank[_layer(t)] >= rank[_layer(m)]]
    assert not bad, "imports that are not downward:\n" + "\n".join(bad)

"""The package's public surface: lazy exports, shell completion."""

import pytest


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
    from click.testing import CliRunner

    from llmqueue.cli.main import COMMANDS, cli

    runner = CliRunner()
    texts = [runner.invoke(cli, ["--help"]).output]
    for name in COMMANDS:
        res = runner.invoke(cli, [name, "--help"])
        assert res.exit_code == 0, name
        texts.append(res.output)
        cmd = cli.get_command(None, name)
        for sub in getattr(cmd, "commands", {}):
            texts.append(runner.invoke(cli, [name, sub, "--help"]).output)
    for t in texts:
        assert "seed 00" not in t.lower() and "seed00" not in t.lower(), t[:200]

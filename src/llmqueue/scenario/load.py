"""Read a scenario file (or a shipped example) into a validated :class:`~llmqueue.scenario.model.Scenario`.

``load_scenario("chat")`` loads the shipped example ``chat``; ``load_scenario("path/x.yaml")`` a
file. Every problem is one :class:`~llmqueue.errors.InputError` whose field is the path in the
file (``deployment.max_num_seqs``, ``workload.classes[1].prompt``) or, for problems with the file
itself (missing, not YAML), the file name.

YAML is read with PyYAML's safe loader, two YAML 1.1 surprises removed: only ``true``/``false``
are booleans (``on``, ``off``, ``yes``, ``no`` stay strings) and ``1e6`` is a number (YAML 1.1
wants ``1.0e+6``). A key given twice in one mapping is an error, not "last one wins".
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml

from llmqueue.errors import InputError

_BOOL = "tag:yaml.org,2002:bool"
_FLOAT = "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 booleans and floats, refusing duplicate keys."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    dup = key in seen
                except TypeError:  # unhashable key: the base constructor reports it
                    continue
                if dup:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag not in (_BOOL, _FLOAT)]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)[eE][-+]?[0-9]+
                   |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def read_yaml(text: str, name: str = "scenario"):
    """Parse YAML ``text``; errors become one-line :class:`InputError` (field ``name``)."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except yaml.YAMLError as e:
        from llmqueue._files import yaml_problem

        raise InputError(name, f"invalid YAML{yaml_problem(e)}") from None
    except RecursionError:
        raise InputError(name, "is nested too deeply to read", "flatten the file") from None


# --- shipped examples ----------------------------------------------------------------------------

def _examples_dir():
    return resources.files("llmqueue.scenario").joinpath("examples")


def example_names() -> list[str]:
    """Names of the shipped example scenarios (``llmqueue scenario list``)."""
    d = _examples_dir()
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml"))


def example_path(name: str) -> Path:
    """The file of the shipped example ``name``."""
    names = example_names()
    key = name[:-5] if name.endswith(".yaml") else name
    if key not in names:
        raise InputError("scenario", f"no shipped example named {name!r}", f"examples: {', '.join(names)}")
    return Path(str(_examples_dir().joinpath(key + ".yaml")))


def example_description(name: str) -> str:
    """The ``description`` line of a shipped example (without validating it)."""
    data = read_yaml(example_path(name).read_text(encoding="utf-8"), name)
    return str(data.get("description") or "") if isinstance(data, dict) else ""


# --- validation ----------------------------------------------------------------------------------

_SECTIONS = ("workload", "deployment", "run")


def _translate(e: dict) -> tuple[str, str | None]:
    """Problem and fix of a pydantic error: a missing or empty section says so, the rest as
    :func:`llmqueue._schema._translate` says."""
    from llmqueue import _schema

    loc, inp = e.get("loc", ()), e.get("input")
    if len(loc) == 1 and loc[0] in _SECTIONS:
        if e["type"] == "missing":
            return "missing required section", f"add a '{loc[0]}:' mapping (llmqueue scenario check chat shows one)"
        if e["type"] in ("model_type", "model_attributes_type", "dict_type") and inp is None:
            return "is empty", "this section is required; llmqueue scenario check chat shows one"
    return _schema._translate(e)


def validate_scenario(data, *, base_dir: str | Path | None = None, source: str | None = None, name: str = "scenario"):
    """Validate a scenario given as a dict (the parsed YAML); relative paths resolve against
    ``base_dir`` (default: the current directory)."""
    from pydantic import ValidationError

    from llmqueue import _schema
    from llmqueue.scenario.model import Scenario

    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(name, f"must hold a mapping with the sections {', '.join(_SECTIONS)} (got {got})",
                         "see llmqueue scenario check chat --json, or the shipped examples")
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    try:
        return Scenario.model_validate(data, context={"base_dir": base, "source": source})
    except ValidationError as err:
        raise _schema._from_validation_error(err, _translate) from None


def load_scenario(path_or_name) -> "Scenario":  # noqa: F821
    """Load and validate a scenario file, or a shipped example by name (``chat``)."""
    s = str(path_or_name)
    p = Path(s).expanduser()
    if not p.is_file():
        key = s[:-5] if s.endswith(".yaml") else s
        if "/" not in s and "\\" not in s and key in example_names():
            p = example_path(key)
        elif p.exists():
            raise InputError(s, "is not a file")
        else:
            raise InputError(s, "no such scenario file, and no shipped example of that name",
                             f"examples: {', '.join(example_names())}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(s, f"cannot read it: {e}") from None
    data = read_yaml(text, s)
    return validate_scenario(data, base_dir=p.resolve().parent, source=str(p), name=s)

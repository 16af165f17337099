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


def _fmt_loc(loc) -> str:
    out = ""
    for x in loc:
        if isinstance(x, int) and not isinstance(x, bool):
            out += f"[{x}]"
        else:
            out += ("." if out else "") + str(x)
    return out


def _show(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (int, str)):
        return repr(v) if isinstance(v, str) else str(v)
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return type(v).__name__


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _translate(e: dict) -> tuple[str, str | None]:
    """Problem and fix of one pydantic error that our own validators did not raise."""
    t, ctx, inp = e["type"], e.get("ctx") or {}, e.get("input")
    loc = e.get("loc", ())
    if t == "missing":
        if len(loc) == 1 and loc[0] in _SECTIONS:
            return "missing required section", f"add a '{loc[0]}:' mapping (llmqueue scenario check chat shows one)"
        return "is required", None
    if t == "extra_forbidden":
        return "unknown key", None
    ops = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
    if t in ops:
        sym, key = ops[t]
        return f"must be {sym} {_num(ctx.get(key))} (got {_show(inp)})", None
    if t in ("int_parsing", "int_type", "int_from_float"):
        return f"must be a whole number (got {_show(inp)})", None
    if t in ("float_parsing", "float_type"):
        return f"must be a number (got {_show(inp)})", None
    if t == "finite_number":
        return f"must be a finite number (got {_show(inp)})", None
    if t in ("bool_parsing", "bool_type"):
        return f"must be true or false (got {_show(inp)})", None
    if t in ("string_type", "string_sub_type"):
        return f"must be text (got {_show(inp)})", None
    if t in ("model_type", "model_attributes_type", "dict_type"):
        if inp is None:
            if len(loc) == 1 and loc[0] in _SECTIONS:
                return "is empty", "this section is required; llmqueue scenario check chat shows one"
            return "is empty", "fill it in or remove the key"
        return f"must be a mapping of keys (got {_show(inp)})", None
    if t == "list_type":
        return f"must be a list (got {_show(inp)})", "write one '- item' per line"
    return e.get("msg", t), None


def _from_validation_error(err) -> InputError:
    from llmqueue.scenario.model import _Problem

    errors = err.errors(include_url=False)
    e = errors[0]
    loc = list(e.get("loc", ()))
    exc = (e.get("ctx") or {}).get("error")
    if isinstance(exc, _Problem):
        loc += list(exc.where)
        problem, fix = exc.problem, exc.fix
    elif isinstance(exc, InputError):
        problem, fix = exc.problem, exc.fix
    else:
        problem, fix = _translate(e)
    more = len(errors) - 1
    if more:
        tail = f"({more} more error{'s' if more > 1 else ''})"
        if fix:
            fix = f"{fix} {tail}"
        else:
            problem = f"{problem} {tail}"
    return InputError(_fmt_loc(loc) or "scenario", problem, fix)


def validate_scenario(data, *, base_dir: str | Path | None = None, source: str | None = None, name: str = "scenario"):
    """Validate a scenario given as a dict (the parsed YAML); relative paths resolve against
    ``base_dir`` (default: the current directory)."""
    from pydantic import ValidationError

    from llmqueue.scenario.model import Scenario

    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(name, f"must hold a mapping with the sections {', '.join(_SECTIONS)} (got {got})",
                         "see llmqueue scenario check chat --json, or the shipped examples")
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    try:
        return Scenario.model_validate(data, context={"base_dir": base, "source": source})
    except ValidationError as err:
        raise _from_validation_error(err) from None


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

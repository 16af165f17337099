"""The knob table: one declaration behind the flags, the scenario file's fields and the builder."""

from __future__ import annotations

import click
import pytest

from llmqueue.errors import InputError
from llmqueue.knobs import BY_NAME, KNOBS, check, convert, flag_defaults, flag_knobs, scenario_fields


def _options(cmd) -> dict:
    return {p.name: p for p in cmd.params if isinstance(p, click.Option)}


@pytest.mark.parametrize("cmd_name", ["simulate", "sweep", "capacity"])
def test_every_flag_knob_is_a_flag_of_the_command_with_the_tables_default_and_help(cmd_name):
    from llmqueue.cli.main import cli

    cmd = cli.get_command(None, cmd_name)
    opts = _options(cmd)
    for k in flag_knobs():
        o = opts[k.name]
        assert k.flag_name in o.opts, (k.name, o.opts)
        assert o.help.startswith(k.help)
        if k.name == "max_num_batched_tokens":  # held at None so that --chunk can be told apart
            assert o.default is None and "[default: 8192]" in o.help
        else:
            assert o.default == k.default, k.name
        if k.choices:
            assert tuple(o.type.choices) == k.choices


def test_validate_and_bench_take_their_subsets_of_the_same_flags():
    from llmqueue.bench.validate import VALIDATE_KNOBS
    from llmqueue.cli.main import cli

    val = _options(cli.get_command(None, "validate"))
    assert set(VALIDATE_KNOBS) <= set(val) and "arrival" not in val
    # not given, a knob keeps the calibrated server's value (the flag holds None)
    assert val["max_num_seqs"].default is None and "calibrated server's" in val["max_num_seqs"].help
    assert tuple(val["policy"].type.choices) == BY_NAME["policy"].choices
    bench = _options(cli.get_command(None, "bench"))
    assert {"arrival", "prompt", "output", "trace", "duration", "seed", "prefix_block_tokens"} <= set(bench)
    assert bench["prefix_block_tokens"].default == 512


def test_scenario_fields_come_from_the_table():
    from llmqueue.scenario.model import DeploymentConfig, RunConfig

    for model, section in ((DeploymentConfig, "deployment"), (RunConfig, "run")):
        knobs = scenario_fields(section)
        from llmqueue.scenario.fleet import FLEET_KEYS

        fleet = list(FLEET_KEYS) if section == "deployment" else []  # the fleet's sections follow the knobs
        assert list(model.model_fields) == [k.scenario_field[1] for k in knobs] + fleet
        for k in knobs:
            f = model.model_fields[k.scenario_field[1]]
            assert f.default == k.default and f.description.startswith(k.help), k.name
    # one default everywhere: prefix caching off in files and on the command line alike
    assert DeploymentConfig.model_fields["enable_prefix_caching"].default is False
    assert flag_defaults()["enable_prefix_caching"] is False


def test_choices_match_the_engine():
    from llmqueue.engine.policies import ORDERINGS, VICTIMS

    assert BY_NAME["policy"].choices == tuple(ORDERINGS) and BY_NAME["preemption"].choices == tuple(VICTIMS)


def test_table_is_well_formed():
    names = [k.name for k in KNOBS]
    assert len(names) == len(set(names))
    for k in KNOBS:
        assert k.group in ("engine", "workload", "run") and k.help
        assert k.type in (int, float, bool, str, object)
        if k.alias_of:
            assert BY_NAME[k.alias_of].scenario == k.scenario
    # the vLLM defaults the help promises
    d = flag_defaults()
    assert (d["max_num_seqs"], d["block_size"], d["gpu_memory_utilization"], d["enable_chunked_prefill"],
            d["policy"]) == (256, 16, 0.9, True, "fcfs")
    assert BY_NAME["max_num_batched_tokens"].default == 8192


@pytest.mark.parametrize("name, value, message", [
    ("max_num_seqs", 0, "max_num_seqs: must be >= 1 (got 0)"),
    ("max_num_seqs", 2.5, "max_num_seqs: must be a whole number"),
    ("max_num_seqs", True, "max_num_seqs: must be a whole number"),
    ("gpu_memory_utilization", 1.2, "gpu_memory_utilization: must be <= 1 (got 1.2)"),
    ("capacity_tokens", 0, "capacity_tokens: must be > 0 (got 0)"),
    ("duration", float("nan"), "duration: must be a finite number"),
    ("enable_prefix_caching", "yes", "enable_prefix_caching: must be true or false"),
    ("policy", "lifo", "policy: unknown policy 'lifo'; choose one of: fcfs, priority, sjf, srpt"),
    ("max_num_seq", 8, "max_num_seq: is not a knob; did you mean 'max_num_seqs'?"),
])
def test_check_gives_one_line_naming_the_knob(name, value, message):
    with pytest.raises(InputError) as e:
        check(name, value)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_check_and_convert_types():
    assert check("max_num_seqs", 8.0) == 8 and isinstance(check("max_num_seqs", 8.0), int)
    assert check("preemption", None) is None
    assert convert("max_num_seqs", " 16 ") == 16 and convert("duration", "1e2") == pytest.approx(100.0)
    assert convert("enable_prefix_caching", "on") is True and convert("enable_chunked_prefill", "false") is False
    assert convert("rate", "2.5") == pytest.approx(2.5) and convert("policy", "sjf") == "sjf"
    with pytest.raises(InputError, match="max_num_seqs: 'four' is not a whole number"):
        convert("max_num_seqs", "four")


def test_flag_defaults_refuses_unknown_and_file_only_knobs():
    assert flag_defaults(max_num_seqs=4)["max_num_seqs"] == 4
    with pytest.raises(InputError, match="bogus: is not a flag"):
        flag_defaults(bogus=1)
    with pytest.raises(InputError, match="preemption_mode: is set in scenario files only"):
        flag_defaults(preemption_mode="recompute")  # replicas became a flag with the fleet



def test_a_knob_that_names_a_registry_entry_defaults_to_one():
    """The choices and help of --router, --policy and --preemption are their registries' (names
    declared once); a default names one of them."""
    for k in KNOBS:
        if k.choices:
            assert k.default is None or k.default in k.choices, k.name
            assert all(name in k.help for name in k.choices), k.name

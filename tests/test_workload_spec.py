"""The spec syntax: canonical round trips, equivalent spellings, and errors naming the field."""

import math

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.workload import (Fixed, JointLengths, Poisson, Uniform, parse_arrival, parse_joint,
                               parse_length)

LENGTHS = ["fixed:512", "uniform:10:1600", "normal:mean=800:sd=200",
           "normal:mean=500:sd=100:min=300:max=700", "lognormal:mean=600:sd=400:max=8192",
           "lognormal:mu=5:sigma=0.5:min=2", "normal:mean=12.5:sd=0.75"]
ARRIVALS = ["poisson:5", "poisson:0.25", "gamma:5:cv=2", "deterministic:5",
            "onoff:20:on=30:off=90", "onoff:20:on=30:off=90:rate_off=2.5"]


@pytest.mark.parametrize("spec", LENGTHS)
def test_length_spec_round_trip(spec):
    d = parse_length(spec)
    assert d.spec == spec
    assert parse_length(d.spec).mean() == d.mean()


@pytest.mark.parametrize("spec", ARRIVALS)
def test_arrival_spec_round_trip(spec):
    a = parse_arrival(spec)
    assert a.spec == spec and parse_arrival(a.spec) == a


@pytest.mark.parametrize("a,b", [
    ("uniform:lo=10:hi=1600", "uniform:10:1600"),
    ("uniform:10:hi=1600", "uniform:10:1600"),
    ("Uniform:10:1600", "uniform:10:1600"),
    (" uniform : 10 : 1600 ", "uniform:10:1600"),
    ("uniform:1e1:1.6e3", "uniform:10:1600"),
    ("normal:800:200", "normal:mean=800:sd=200"),
    ("normal:sd=200:mean=800", "normal:mean=800:sd=200"),
    ("normal:500:100:300:700", "normal:mean=500:sd=100:min=300:max=700"),
    ("normal:mean=800:sd=200:min=1", "normal:mean=800:sd=200"),
    ("lognormal:600:400:MAX=8192", "lognormal:mean=600:sd=400:max=8192"),
    ("fixed:n=64", "fixed:64"),
    ("64", "fixed:64"),
])
def test_equivalent_length_spellings(a, b):
    assert parse_length(a).spec == b


@pytest.mark.parametrize("a,b", [("gamma:5:2", "gamma:5:cv=2"), ("gamma:rate=5:cv=2", "gamma:5:cv=2"),
                                 ("fixed:5", "deterministic:5"), ("5", "poisson:5"),
                                 ("onoff:20:30:90", "onoff:20:on=30:off=90"), ("POISSON:5", "poisson:5")])
def test_equivalent_arrival_spellings(a, b):
    assert parse_arrival(a).spec == b


def test_objects_and_numbers_pass_through():
    u, p = Uniform(1, 2), Poisson(3.0)
    assert parse_length(u) is u and parse_arrival(p) is p
    assert parse_length(128).spec == "fixed:128"
    assert parse_arrival(2.5).spec == "poisson:2.5"
    assert parse_arrival(np.float64(4)).spec == "poisson:4"
    assert parse_length(np.int64(64), "output").spec == "fixed:64"
    j = JointLengths([1, 2], [3, 4])
    assert parse_joint(j) is j


def test_message_shows_the_spec_and_the_expected_form():
    with pytest.raises(InputError) as e:
        parse_length("uniform:10", "prompt")
    msg = str(e.value)
    assert msg.startswith("prompt: cannot parse 'uniform:10'")
    assert "uniform:LO:HI" in msg and "e.g. uniform:10:1600" in msg
    assert e.value.field == "prompt"


BAD_LENGTHS = [
    ("uniform:10", "needs LO:HI"),
    ("uniform:1600:10", "hi must be >= lo"),
    ("uniform:0:10", "lo must be >= 1"),
    ("uniform:10.5:20", "whole number"),
    ("uniform:nan:10", "finite"),
    ("uniform:10:inf", "finite"),
    ("uniform:-5:10", ">= 1"),
    ("uniform:10:1e400", "finite"),
    ("uniform:4k:8k", "suffixes are ambiguous"),
    ("uniform:10:1600:7", "at most 2 positional"),
    ("uniform:lo=10:20", "positional values first"),
    ("uniform:10:lo=20", "given twice"),
    ("uniform:10:1600:step=2", "unknown key 'step'"),
    ("uniform::1600", "empty value"),
    ("fixed:64:", "empty value"),
    ("fixed:0", ">= 1"),
    ("fixed:abc", "must be a number"),
    ("fixed:n=", "no value"),
    ("unifrom:10:1600", "valid: empirical, fixed, geometric, lognormal, normal, uniform"),
    ("uniform:10:1600:", "empty value"),
    ("", "empty"),
    ("normal:mean=800", "missing sd"),
    ("normal:mean=800:sd=0", "sd must be > 0"),
    ("normal:mean=-1:sd=5", "mean must be > 0"),
    ("normal:mean=800:sd=200:min=900:max=700", "max must be >= min"),
    ("normal:mean=800:sd=nan", "finite"),
    ("lognormal:mean=600", "one pair"),
    ("lognormal:mean=600:sd=400:mu=6", "one pair"),
    ("lognormal:mu=6:sigma=-1", "sigma must be > 0"),
    ("lognormal:mean=1000:sd=10000", "max is needed"),
    ("empirical:/no/such/file.csv", "does not exist"),
    ("empirical", "needs PATH"),
]


@pytest.mark.parametrize("spec,fragment", BAD_LENGTHS)
@pytest.mark.parametrize("field", ["prompt", "output"])
def test_bad_length_specs_name_the_field(spec, fragment, field):
    with pytest.raises(InputError) as e:
        parse_length(spec, field)
    assert e.value.field == field
    msg = str(e.value)
    assert msg.startswith(f"{field}: cannot parse {spec.strip()!r}")
    assert fragment in msg
    assert "expected" in msg


BAD_ARRIVALS = [
    ("poisson", "needs RATE"),
    ("poisson:0", "rate must be > 0"),
    ("poisson:-3", "rate must be > 0"),
    ("poisson:nan", "finite"),
    ("poisson:inf", "finite"),
    ("poisson:1m", "suffixes are ambiguous"),
    ("poisson:5:cv=2", "unknown key 'cv'"),
    ("gamma:5", "missing cv"),
    ("gamma:5:cv=0", "cv must be > 0"),
    ("gamma:5:shape=2", "unknown key 'shape'"),
    ("onoff:5:on=10", "missing off"),
    ("onoff:5:on=10:off=0", "off must be > 0"),
    ("onoff:5:on=10:off=5:rate_off=-1", "rate_off must be >= 0"),
    ("weibull:5", "valid: deterministic, fixed, gamma, onoff, poisson"),
]


@pytest.mark.parametrize("spec,fragment", BAD_ARRIVALS)
def test_bad_arrival_specs_name_the_field(spec, fragment):
    for field in ("arrival", "rate"):
        with pytest.raises(InputError) as e:
            parse_arrival(spec, field)
        assert e.value.field == field
        assert str(e.value).startswith(f"{field}: cannot parse {spec!r}")
        assert fragment in str(e.value)


def test_non_string_specs_rejected():
    for bad in (None, [1, 2], math.nan, True):
        with pytest.raises(InputError) as e:
            parse_length(bad, "output")
        assert e.value.field == "output"
    for bad in (math.nan, math.inf, -1, 0):
        with pytest.raises(InputError) as e:
            parse_arrival(bad)
        assert e.value.field == "arrival"


def test_path_may_contain_colons_and_equals(tmp_path):
    d = tmp_path / "run:2024=a"
    d.mkdir()
    f = d / "lens.csv"
    f.write_text("prompt_tokens,output_tokens\n10,3\n30,5\n")
    assert parse_length(f"empirical:{f}:column=prompt_tokens").mean() == pytest.approx(20.0)
    assert parse_length(f"empirical:{f}", "output").mean() == pytest.approx(4.0)
    j = parse_joint(f"joint:{f}")
    assert j.spec == f"joint:{f}:prompt=prompt_tokens:output=output_tokens"
    assert parse_joint(j.spec).mean_output() == 4.0


def test_bad_joint_specs(tmp_path):
    f = tmp_path / "one.csv"
    f.write_text("x\n1\n2\n")
    g = tmp_path / "many.csv"
    g.write_text("a,b,c\n1,2,3\n")
    cases = [("joint", "needs PATH"), ("joint:/no/file.csv", "does not exist"),
             (f"joint:{f}", "one column"), (f"joint:{g}", "prompt=NAME"),
             (f"joint:{g}:prompt=a", "output=NAME"), (f"joint:{g}:prompt=a:output=a", "same column"),
             (f"joint:{g}:prompt=a:output=zz", "'zz' is not a column"),
             (f"joint:{g}:prompt=a:outptu=b", "unknown key 'outptu'"),
             ("empirical:x.csv", "valid: joint")]
    for spec, fragment in cases:
        with pytest.raises(InputError) as e:
            parse_joint(spec, "lengths")
        assert e.value.field == "lengths" and fragment in str(e.value), str(e.value)
    assert parse_joint(f"joint:{g}:prompt=a:output=c").mean_output() == 3.0


def test_python_constructors_name_their_parameter():
    with pytest.raises(InputError) as e:
        Uniform(20, 10)
    assert e.value.field == "hi"
    with pytest.raises(InputError) as e:
        Fixed(np.nan)
    assert e.value.field == "n"

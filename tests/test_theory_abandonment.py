"""M/M/c+M (Erlang A) against independent truths: M/M/inf when theta = mu, Erlang C when theta = 0,
the fluid limit in overload, Little's law against the tagged-customer route, and the CLI."""

import json
import math

import pytest
from _cli import run_cli

from llmqueue.errors import UnstableError
from llmqueue.theory.abandonment import erlang_a, erlang_a_distribution
from llmqueue.theory.classic import mmc


def test_theta_equal_to_mu_is_an_infinite_server_queue():
    """Everyone leaves at rate 1 whether served or waiting: the number in system is Poisson(a)."""
    r = erlang_a(lam=10, mu=1, c=10, theta=1)
    pi = erlang_a_distribution(lam=10, mu=1, c=10, theta=1)
    for n in range(30):
        assert pi[n] == pytest.approx(math.exp(-10) * 10**n / math.factorial(n), rel=1e-9)
    assert r.L == pytest.approx(10.0, rel=1e-12)
    assert r.P_wait == pytest.approx(1 - sum(math.exp(-10) * 10**n / math.factorial(n) for n in range(10)), rel=1e-9)
    # served customers stay 1/mu in service: throughput = lam (1 - P_ab) = mu E[min(N, c)]
    busy = sum(min(n, 10) * p for n, p in enumerate(pi))
    assert r.throughput == pytest.approx(busy, rel=1e-9)


def test_no_abandonment_is_erlang_c():
    a, m = erlang_a(lam=2, mu=1, c=3, theta=0), mmc(lam=2, mu=1, c=3)
    assert a.P_wait == pytest.approx(m.P_wait, rel=1e-9) and a.Wq == pytest.approx(m.Wq, rel=1e-9)
    assert a.P_abandon == 0 and a.Wq_served == pytest.approx(m.Wq, rel=1e-9)
    # and a vanishing theta tends to it
    assert erlang_a(lam=2, mu=1, c=3, theta=1e-6).Wq == pytest.approx(m.Wq, rel=1e-4)
    with pytest.raises(UnstableError):
        erlang_a(lam=4, mu=1, c=3, theta=0)


def test_overload_is_stable_and_tends_to_the_fluid_limit():
    """At rho = 2 the excess leaves: P_abandon -> 1 - c mu / lam as the system grows."""
    r = erlang_a(lam=400, mu=1, c=200, theta=0.5)
    assert r.P_abandon == pytest.approx(0.5, abs=0.01) and r.utilization == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("lam,mu,c,theta", [(12, 1, 10, 0.5), (3, 1, 2, 2.0), (50, 2, 30, 0.1)])
def test_littles_law_and_the_tagged_customer_agree(lam, mu, c, theta):
    """Wq from Little's law on the waiting room against the mean wait of a tagged arrival
    followed through its queue positions (either ending), and P_abandon = theta Lq / lam against
    the tagged arrival's probability of leaving."""
    r = erlang_a(lam=lam, mu=mu, c=c, theta=theta)
    pi = erlang_a_distribution(lam=lam, mu=mu, c=c, theta=theta)
    wait = leave = 0.0
    for n in range(c, len(pi)):
        stay, w = 1.0, 0.0
        for j in range(n - c + 1, 0, -1):
            out = c * mu + j * theta
            w += stay / out
            stay *= (c * mu + (j - 1) * theta) / out
        wait += pi[n] * w
        leave += pi[n] * (1 - stay)
    assert wait == pytest.approx(r.Wq, rel=1e-9)
    assert leave == pytest.approx(r.P_abandon, rel=1e-9)
    assert r.Wq == pytest.approx((1 - r.P_abandon) * r.Wq_served + r.P_abandon * r.Wq_abandoned, rel=1e-9)
    assert r.L == pytest.approx(r.Lq + r.throughput / mu, rel=1e-9)   # Little on the servers


def test_the_cli_prints_and_refuses():
    out = run_cli("queue", "mmc-abandon", "--rate", "12", "--mu", "1", "--c", "10", "--patience", "2", "--json")
    assert out.code == 0, out.err
    d = json.loads(out.out)
    assert d["theta"] == pytest.approx(0.5) and d["P_abandon"] == pytest.approx(erlang_a(lam=12, mu=1, c=10, theta=0.5).P_abandon)
    base = ["queue", "mmc-abandon", "--rate", "12", "--mu", "1"]
    for args in (["--c", "10", "--theta", "1", "--patience", "1"], ["--c", "10"], ["--c", "10", "--patience", "0"],
                 ["--c", "10", "--theta", "-1"], ["--c", "0", "--theta", "1"],
                 ["--c", "10", "--theta", "0"]):   # no abandonment at rho 1.2: unstable, said
        r = run_cli(*base, *args)
        assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, (args, r.err)

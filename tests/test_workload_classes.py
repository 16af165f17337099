"""Request classes and their mix: validation, shares realised, per-class seeding, replay, retries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmqueue.errors import InputError
from llmqueue.workload import SLO, ClassMix, ClientBehavior, RequestArrays, RequestClass, RetryPolicy
from llmqueue.workload.classes import _head, class_seed

LEN = dict(prompt="uniform:10:1600", output="uniform:10:600")


def _sub(r: RequestArrays, name: str) -> tuple[np.ndarray, ...]:
    m = r.class_name == name
    return r.arrival_s[m], r.prompt_tokens[m], r.output_tokens[m]


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


# -- validation ----------------------------------------------------------------------------------

def test_slo():
    s = SLO("ttft", 99, 2.0)
    assert str(s) == "p99 ttft <= 2 s" and s.attainment == 0.99
    assert s.to_dict() == {"metric": "ttft", "percentile": 99.0, "max_s": 2.0}
    for args, field in [(("ttfb", 99, 2), "metric"), (("ttft", 0, 2), "percentile"), (("ttft", 101, 2), "percentile"),
                        (("ttft", 99, 0), "max_s"), (("tpot", 99, float("nan")), "max_s")]:
        with pytest.raises(InputError) as e:
            SLO(*args)
        assert e.value.field == field


@pytest.mark.parametrize("kwargs,field", [
    (dict(), "share"),                                            # neither share nor arrival
    (dict(share=0.5, arrival="poisson:1", **LEN), "arrival"),     # both
    (dict(share=1.5, **LEN), "share"),
    (dict(share=0, **LEN), "share"),
    (dict(arrival="poisson:-1", **LEN), "arrival"),
    (dict(arrival="poisson:1"), "prompt"),                        # own arrivals need lengths
    (dict(share=1, prompt="fixed:5"), "output"),
    (dict(share=1, prompt="uniform:10", output="fixed:5"), "prompt"),
    (dict(share=1, priority=1.5, **LEN), "priority"),
    (dict(share=1, priority=True, **LEN), "priority"),
    (dict(share=1, slos=[SLO("ttft", 99, 1), SLO("ttft", 99, 2)], **LEN), "slos"),
])
def test_request_class_errors_name_the_field(kwargs, field):
    with pytest.raises(InputError) as e:
        RequestClass("c", **kwargs)
    assert e.value.field == field


def test_request_class_parses_specs_and_keeps_settings():
    c = RequestClass("chat", arrival="gamma:2:cv=3", priority=-1, slos=[SLO("tpot", 90, 0.05)],
                     client=ClientBehavior(timeout_s=30), **LEN)
    assert c.arrival.rate == 2 and c.prompt.mean() == pytest.approx(805) and c.priority == -1
    assert c.specs()["arrival"] == "gamma:2:cv=3" and c.specs()["slos"][0]["metric"] == "tpot"
    assert c.client.timeout_s == 30 and RequestClass("x", share=1.0).has_lengths is False
    assert RequestClass("x", share=1, priority=np.int64(3), **LEN).priority == 3


def test_mix_errors():
    a = RequestClass("a", share=0.6, **LEN)
    b = RequestClass("b", share=0.3, **LEN)
    with pytest.raises(InputError, match="shares sum to 0.9"):
        ClassMix([a, b], arrival="poisson:1")
    with pytest.raises(InputError, match="named 'a'"):
        ClassMix([a, RequestClass("a", share=0.4, **LEN)], arrival="poisson:1")
    own = RequestClass("own", arrival="poisson:1", **LEN)
    with pytest.raises(InputError, match="no class takes a share"):
        ClassMix([own], arrival="poisson:1")
    with pytest.raises(InputError, match="at least one"):
        ClassMix([])
    mix = ClassMix([RequestClass("a", share=1, **LEN)])  # no total process: only replay() can feed it
    with pytest.raises(InputError, match="total arrival process"):
        mix.generate(0, n=10)
    with pytest.raises(InputError, match="exactly one"):
        ClassMix([own]).generate(0)
    with pytest.raises(InputError, match="no class named"):
        ClassMix([own])["nope"]


# -- generation ----------------------------------------------------------------------------------

def test_shares_are_realised_within_their_confidence_interval():
    shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    mix = ClassMix([RequestClass(n, share=s, **LEN) for n, s in shares.items()], arrival="poisson:50")
    r = mix.generate(3, duration=400.0)
    N = len(r)
    assert abs(N - 20_000) < 4.5 * math.sqrt(20_000)
    for name, s in shares.items():
        k = int((r.class_name == name).sum())
        assert abs(k - N * s) < 4.5 * math.sqrt(N * s * (1 - s)), (name, k)
    assert mix.rates() == pytest.approx({"a": 25.0, "b": 15.0, "c": 10.0}) and mix.rate == pytest.approx(50)


def test_own_arrival_classes_are_superposed_at_their_rates():
    mix = ClassMix([RequestClass("fast", arrival="poisson:20", **LEN),
                    RequestClass("slow", arrival="deterministic:2", prompt="fixed:3000", output="fixed:50")])
    r = mix.generate(1, duration=500.0)
    assert np.all(np.diff(r.arrival_s) >= 0) and np.array_equal(r.request_id, np.arange(len(r)))
    k_fast = int((r.class_name == "fast").sum())
    assert abs(k_fast - 10_000) < 4.5 * math.sqrt(10_000)
    assert int((r.class_name == "slow").sum()) == 999  # deterministic: k / 2 for k = 1..999 (< 500 s)
    assert np.all(r.prompt_tokens[r.class_name == "slow"] == 3000)
    # rate-weighted means
    assert mix.mean_prompt() == pytest.approx((20 * 805 + 2 * 3000) / 22)


def test_generation_is_reproducible_and_seed_sensitive():
    mix = ClassMix([RequestClass("a", share=0.7, **LEN), RequestClass("b", share=0.3, **LEN),
                    RequestClass("c", arrival="gamma:3:cv=2", **LEN)], arrival="onoff:20:on=5:off=10")
    assert mix.generate(5, duration=200.0) == mix.generate(5, duration=200.0)
    assert mix.generate(np.random.SeedSequence(5), duration=200.0) == mix.generate(5, duration=200.0)
    assert mix.generate(6, duration=200.0) != mix.generate(5, duration=200.0)


def test_adding_a_class_leaves_the_other_classes_draws_unchanged():
    chat = RequestClass("chat", share=0.8, **LEN)
    batch = RequestClass("batch", share=0.2, prompt="lognormal:mean=3000:sd=1000:max=8000", output="fixed:300")
    code = RequestClass("code", arrival="onoff:15:on=8:off=38.7", prompt="fixed:2000", output="fixed:27")
    base = ClassMix([chat, batch], arrival="poisson:5").generate(11, duration=300.0)
    more = ClassMix([chat, batch, code], arrival="poisson:5").generate(11, duration=300.0)
    assert int((more.class_name == "code").sum()) > 0
    for name in ("chat", "batch"):
        assert _same(_sub(base, name), _sub(more, name))
    # the same holds among classes with their own arrivals, and the order of classes does not matter
    bg = RequestClass("bg", arrival="poisson:1", **LEN)
    one = ClassMix([code]).generate(11, duration=300.0)
    two = ClassMix([bg, code]).generate(11, duration=300.0)
    assert _same(_sub(one, "code"), _sub(two, "code"))
    assert ClassMix([code, bg]).generate(11, duration=300.0) == two
    # a class's streams are keyed by its name: renaming it gives new draws
    renamed = ClassMix([RequestClass("code2", arrival=code.arrival, prompt="uniform:1:9", output="fixed:1")])
    assert not np.array_equal(renamed.generate(11, duration=300.0).arrival_s, _sub(one, "code")[0])
    assert class_seed(11, "code").spawn_key != class_seed(11, "code2").spawn_key


def test_changing_shares_keeps_the_total_stream():
    def mk(sa):
        return ClassMix([RequestClass("a", share=sa, **LEN), RequestClass("b", share=1 - sa, **LEN)],
                        arrival="gamma:10:cv=3")
    r1, r2 = mk(0.5).generate(2, duration=300.0), mk(0.9).generate(2, duration=300.0)
    assert np.array_equal(r1.arrival_s, r2.arrival_s)
    assert (r2.class_name == "a").mean() > (r1.class_name == "a").mean()


def test_n_mode_is_the_prefix_of_the_duration_mode():
    mix = ClassMix([RequestClass("a", share=0.6, **LEN), RequestClass("b", share=0.4, **LEN),
                    RequestClass("c", arrival="poisson:2", **LEN)], arrival="poisson:10")
    rn = mix.generate(4, n=500)
    assert len(rn) == 500
    rd = mix.generate(4, duration=200.0)  # about 2,400 requests
    assert rn == _head(rd, 500)
    assert len(mix.generate(4, n=0)) == 0


def test_replay_splits_given_arrivals_and_keeps_given_lengths():
    t = np.sort(np.random.default_rng(0).uniform(0, 100, 2000))
    s = np.arange(1, 2001)
    o = np.arange(1, 2001) * 2
    mix = ClassMix([RequestClass("a", share=0.5), RequestClass("b", share=0.5, prompt="fixed:7", output="fixed:3"),
                    RequestClass("own", arrival="poisson:1", prompt="fixed:1", output="fixed:1")])
    r = mix.replay(1, t, prompt_tokens=s, output_tokens=o)
    a, b = r.class_name == "a", r.class_name == "b"
    assert a.sum() + b.sum() == 2000
    # class a took the recorded lengths of its arrivals, class b drew its own
    idx = np.searchsorted(t, r.arrival_s[a])
    assert np.array_equal(r.prompt_tokens[a], s[idx]) and np.array_equal(r.output_tokens[a], o[idx])
    assert np.all(r.prompt_tokens[b] == 7)
    own = r.arrival_s[r.class_name == "own"]
    assert own.size > 0 and own.max() < t[-1]
    with pytest.raises(InputError, match="no prompt and output"):
        mix.replay(1, t)
    with pytest.raises(InputError, match="sorted"):
        mix.replay(1, t[::-1], prompt_tokens=s, output_tokens=o)


# -- client behaviour per class --------------------------------------------------------------------

def test_clients_timeouts_and_retry_function():
    retrying = ClientBehavior(timeout_s=30, retry=RetryPolicy(max_attempts=3, jitter=0))
    mix = ClassMix([RequestClass("chat", share=0.5, client=retrying, **LEN),
                    RequestClass("batch", share=0.5, **LEN)], arrival="poisson:10")
    assert mix.timeouts() == {"chat": 30.0}
    assert mix.priorities == {"chat": 0, "batch": 0}
    r = mix.generate(0, n=200)
    decide = mix.retry_function(0, r)
    for q in r:
        got = decide(q.request_id, 1, "error", 5.0)
        assert got == (5.5 if q.class_name == "chat" else None)
    clients = mix.clients(0)
    assert clients["chat"].decide(3, 1, "error", 0.0) == 0.5 and clients["batch"].decide(3, 1, "error", 0.0) is None
    with pytest.raises(InputError, match="not a request"):
        decide(10_000, 1, "error", 0.0)
    with pytest.raises(InputError, match="not a request"):
        decide(-1, 1, "error", 0.0)

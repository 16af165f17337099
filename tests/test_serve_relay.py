"""The relay's writes: what one read from the engine holds goes to the client in one write, with
every event checked and timed (llmqueue.serve.relay)."""

from llmqueue.serve.relay import Relay


class _Client:
    """The client exchange's side the relay writes to: each call kept."""

    def __init__(self):
        self.calls = []

    def start_stream(self, status, first=b""):
        self.calls.append(("start", first))

    def write(self, data):
        self.calls.append(("write", data))


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(b), b)


def _event(k: int) -> bytes:
    return b'data: {"id":"c","choices":[{"index":0,"text":" t%d"}]}\n\n' % k


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def test_one_read_of_many_events_is_one_write_and_every_event_is_timed():
    ex = _Client()
    ticks = iter(range(100))
    r = Relay(ex, True, clock=lambda: float(next(ticks)))
    r.feed(HEAD + b"".join(_chunk(_event(k)) for k in range(40)))       # one read: head and 40 events
    assert [c for c, _ in ex.calls] == ["start"] and ex.calls[0][1].count(b"data: ") == 40
    assert r.events == 40 and r.first == 0.0
    half = _event(63)
    r.feed(b"".join(_chunk(_event(k)) for k in range(40, 63)) + _chunk(half[:20]))  # 23 events, a part
    assert [c for c, _ in ex.calls] == ["start", "write"] and r.events == 63
    r.feed(_chunk(half[20:]) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")          # the rest, the end
    assert [c for c, _ in ex.calls] == ["start", "write", "write"] and r.events == 64 and r.complete
    sent = b"".join(d for _, d in ex.calls)
    assert sent == b"".join(_event(k) for k in range(64)) + b"data: [DONE]\n\n"  # every byte, in order, once
    assert r.bad is None and len(r.gaps) == 63


def test_garbage_in_a_read_fails_the_send_and_is_not_passed_on():
    class Kept(Relay):
        __slots__ = ("failed",)

        def fail(self, exc):
            self.failed = exc

    ex = _Client()
    r = Kept(ex, True, clock=lambda: 1.0)
    r.feed(HEAD + _chunk(_event(0)))
    r.feed(_chunk(_event(1)) + _chunk(b"@@@ garbage @@@\n\n"))
    assert "not a server-sent event" in str(r.failed) and "not a server-sent event" in r.bad
    assert b"garbage" not in b"".join(d for _, d in ex.calls)


class _OneByOne(Relay):
    """The relay with every event checked one by one (no plain-run shortcut): the reference."""

    __slots__ = ()

    def _scan(self, data):
        if self.crlf is None and b"\n" in data:
            self.crlf = b"\r\n" in data
        self.lead = self.carry
        buf = self.carry + data
        return self._events(buf.replace(b"\r\n", b"\n") if self.crlf else buf)


def _random_stream(rng) -> bytes:
    """An engine's stream: token events, sometimes a chat opening chunk, usage riding on tokens, a
    usage event, [DONE], comments, blank lines in a row, CR LF line ends, or garbage."""
    evs = []
    if rng.random() < 0.3:
        evs.append(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}')
    for k in range(rng.randrange(0, 30)):
        u = rng.random()
        if u < 0.05:
            evs.append(b": ping")
        elif u < 0.1:
            evs.append(b'data: {"choices":[{"text":"t"}],"usage":{"completion_tokens":%d}}' % k)
        elif u < 0.12:
            evs.append(b'data:{"choices":[{"text":"no space"}]}')
        elif u < 0.14:
            evs.append(b'event: x\ndata: {"choices":[{"text":"two lines"}]}')
        else:
            evs.append(b'data: {"choices":[{"index":0,"text":" t%d"}]}' % k)
    if rng.random() < 0.8:
        evs.append(b'data: {"choices":[],"usage":{"completion_tokens":%d}}' % len(evs))
        evs.append(b"data: [DONE]")
    if rng.random() < 0.1:
        evs.insert(rng.randrange(len(evs) + 1), b"@@@ garbage")
    sep = b"\n\n\n" if rng.random() < 0.1 else b"\n\n"
    s = b"".join(e + sep for e in evs)
    if rng.random() < 0.2:
        s = s.replace(b"\n", b"\r\n")
    if rng.random() < 0.05:
        s = s[:-1]  # ends inside an event
    return s


def test_plain_runs_of_events_are_read_as_one_by_one():
    """Counting a run of plain ``data: {...}`` events at once gives what checking each gives:
    the token count, the usage, the first token's time, the gaps, garbage found, what is carried
    to the next read, and the bytes the client gets; over random streams cut at random reads."""
    import random

    class Kept(_Client):
        def end(self, last=b""):
            self.calls.append(("end", last))

    def run(cls, stream, cuts):
        ex = Kept()
        ticks = iter(range(10_000))
        r = cls(ex, True, clock=lambda: float(next(ticks)))
        body = b"".join(_chunk(stream[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a) + b"0\r\n\r\n"
        data = HEAD + body
        cut = sorted(rng.sample(range(1, len(data)), min(4, len(data) - 1)))
        for a, b in zip([0, *cut], [*cut, len(data)]):
            r.feed(data[a:b])
        return (r.events, r.usage_tokens, repr(r.first), r.gaps, r.bad is None, r.carry, ex.calls)

    class Fast(Relay):
        __slots__ = ()

        def fail(self, exc):  # the gateway ends the client's stream; here the reads go on
            pass

    class Ref(_OneByOne):
        __slots__ = ()

        def fail(self, exc):
            pass

    rng = random.Random(7)
    kinds = set()
    for _ in range(600):
        stream = _random_stream(rng)
        cuts = [0, *sorted(rng.sample(range(1, max(len(stream), 2)), min(3, max(len(stream) - 1, 0)))), len(stream)]
        state = rng.getstate()
        fast = run(Fast, stream, cuts)
        rng.setstate(state)
        ref = run(Ref, stream, cuts)
        assert fast == ref, stream
        kinds.add((fast[0] > 1, fast[4]))
    assert kinds == {(True, True), (True, False), (False, True), (False, False)}  # both ways, with and without garbage


def test_the_events_before_garbage_reach_the_client_wherever_the_reads_are_cut():
    """Garbage mid-stream ends the relay, but every whole event before it reaches the client as the
    engine sent it (CR LF or LF), whichever read the garbage came in; the garbage event itself never
    does whole."""
    import random

    class Kept(Relay):
        __slots__ = ("failed",)

        def fail(self, exc):
            self.failed = exc

    rng = random.Random(13)
    started = 0
    for _ in range(400):
        sep = rng.choice((b"\n\n", b"\r\n\r\n"))
        good = [b'data: {"choices":[{"text":" t%d"}]}' % k for k in range(rng.randrange(1, 12))]
        bad_at = rng.randrange(1, len(good) + 1)
        evs = [*good[:bad_at], b"@@@ garbage", *good[bad_at:]]
        stream = b"".join(e + sep for e in evs)
        g0 = sum(len(e) + len(sep) for e in evs[:bad_at])   # where the garbage event begins
        g1 = g0 + len(evs[bad_at]) + len(sep)                 # and ends
        data = HEAD + _chunk(stream) + b"0\r\n\r\n"
        cuts = sorted(rng.sample(range(1, len(data)), min(rng.randrange(1, 8), len(data) - 1)))
        ex = _Client()
        r = Kept(ex, True, clock=lambda: 1.0)
        for a, b in zip([0, *cuts], [*cuts, len(data)]):
            r.feed(data[a:b])
        assert r.bad is not None and "not a server-sent event" in r.bad
        sent = b"".join(d for _, d in ex.calls)
        if not r.started:
            assert sent == b""  # garbage in the read that would begin the stream: nothing sent, another replica
            continue
        started += 1
        assert stream.startswith(sent) and g0 <= len(sent) < g1, (stream, sent, cuts)
    assert started > 200


def test_a_cr_lf_cut_between_two_reads_ends_the_event():
    """An engine that ends its lines with CR LF (sse-starlette): an event whose blank line is cut
    between two reads after its CR ends with the second read, and the stream ends whole."""
    ev = b'data: {"choices":[{"text":" t"}]}\r\n\r\n'
    ex = _Client()
    r = Relay(ex, True, clock=lambda: 1.0)
    r.feed(HEAD + _chunk(ev))
    r.feed(_chunk(ev[:-1]))                 # ... \r\n\r
    assert r.events == 1
    r.feed(_chunk(ev[-1:]) + _chunk(ev))    # \n, then a whole event
    assert r.events == 3 and r.carry == b""
    r.feed(_chunk(b"data: [DONE]\r\n\r\n") + b"0\r\n\r\n")
    assert r.bad is None and r.complete and r.events == 3

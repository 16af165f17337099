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

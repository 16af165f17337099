"""Server-sent events as the WHATWG HTML standard defines them (section 9.2.6, "Interpreting an
event stream"), parsed incrementally by :class:`llmqueue.bench.sse.SSEParser`, and the benchmark
client reading spec-valid streams that its earlier parser refused.

The expected events of the standard's own examples are quoted from the standard.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from llmqueue.bench.sse import MAX_LINE_BYTES, SSEError, SSEParser


def parse(stream: bytes, pieces: int | None = None, **kw) -> tuple[list, SSEParser]:
    """All events of ``stream`` fed whole (``pieces=None``) or in pieces of ``pieces`` bytes."""
    p = SSEParser(**kw)
    out = []
    step = pieces or max(len(stream), 1)
    for i in range(0, len(stream), step):
        out += p.feed(stream[i:i + step])
    return out, p


def every_split(stream: bytes) -> list:
    """The events of ``stream``, checked to be the same for every piece size from 1 byte up, and
    for a cut at every position into two pieces."""
    whole, _ = parse(stream)
    for k in range(1, len(stream) + 1):
        assert parse(stream, k)[0] == whole, k
    for cut in range(len(stream) + 1):
        p = SSEParser()
        assert p.feed(stream[:cut]) + p.feed(stream[cut:]) == whole, cut
    return whole


def msg(*data: bytes) -> list:
    return [(b"message", d) for d in data]


# -- the standard's examples -----------------------------------------------------------------

def test_spec_example_stocks_multiline_data():
    # "data: YHOO / data: +2 / data: 10" -> one event, data "YHOO\n+2\n10"
    assert every_split(b"data: YHOO\ndata: +2\ndata: 10\n\n") == msg(b"YHOO\n+2\n10")


def test_spec_example_comments_ids_and_an_unterminated_event():
    stream = b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n"
    events, p = parse(stream)
    # the comment block dispatches nothing; the last block is never followed by a blank line
    assert events == msg(b"first event", b"second event")
    assert p.last_event_id == b""  # "id" with no colon: the last event id is reset to empty
    events, p = parse(stream + b"\n")
    assert events[-1] == (b"message", b" third event")  # only one leading space is dropped
    a, p1 = parse(b"data: first event\nid: 1\n\n")
    assert p1.last_event_id == b"1"
    assert every_split(stream + b"\n") == events


def test_spec_example_empty_data_and_a_lone_newline():
    # "data / (blank) / data / data / (blank) / data:" -> "", then "\n"; the last block is discarded
    assert every_split(b"data\n\ndata\ndata\n\ndata:") == msg(b"", b"\n")


def test_spec_example_one_space_after_the_colon_is_optional():
    assert every_split(b"data:test\n\ndata: test\n\n") == msg(b"test", b"test")


def test_event_types():
    stream = b"event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\nevent: add\ndata: 113411\n\n"
    assert every_split(stream) == [(b"add", b"73857293"), (b"remove", b"2153"), (b"add", b"113411")]
    # the type applies to one event; an empty type is the default; an event without data is dropped
    assert every_split(b"event: x\n\ndata: a\n\nevent:\ndata: b\n\n") == msg(b"a", b"b")


# -- line ends --------------------------------------------------------------------------------

@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_lf_crlf_and_bare_cr_line_ends(eol):
    stream = b"data: a" + eol + b"data: b" + eol + eol + b": c" + eol + b"id: 3" + eol + b"data: d" + eol + eol
    events = every_split(stream)
    assert events == msg(b"a\nb", b"d")
    assert parse(stream)[1].last_event_id == b"3"


def test_mixed_line_ends_and_a_crlf_split_between_pieces():
    # CR then LF in the next piece is one line end, not two (two would dispatch "a" early)
    p = SSEParser()
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"\ndata: b\r") == []
    assert p.feed(b"") == []                       # an empty piece keeps the pending CR
    assert p.feed(b"\n\r\n") == msg(b"a\nb")
    assert every_split(b"data: x\r\ndata: y\rdata: z\n\r\r\n") == msg(b"x\ny\nz")
    # a bare CR at the very end of a piece, then a different byte: the CR ended the line
    p = SSEParser()
    assert p.feed(b"data: a\r") == [] and p.feed(b"\rdata: b\n\n") == msg(b"a", b"b")


# -- fields -----------------------------------------------------------------------------------

def test_fields_without_a_colon_unknown_fields_and_case():
    # "data" alone is a data field with an empty value; names are case-sensitive; unknown ignored
    assert every_split(b"data\ndata: x\n\n") == msg(b"\nx")
    assert every_split(b"Data: no\nDATA: no\nfoo: bar\nfoo\n\n") == []
    assert every_split(b"data: a:b: c\n\n") == msg(b"a:b: c")  # only the first colon separates


def test_id_and_retry():
    events, p = parse(b"id: 7\ndata: a\n\n")
    assert events == msg(b"a") and p.last_event_id == b"7"
    _, p = parse(b"id: 7\n\nid: 8\x009\n\n")
    assert p.last_event_id == b"7"  # an id with a NUL is ignored
    _, p = parse(b"retry: 1500\n\n")
    assert p.retry_ms == 1500
    for bad in (b"retry: 15s\n\n", b"retry: -1\n\n", b"retry:\n\n", b"retry: 1.5\n\n", b"retry: \xd9\xa1\n\n"):
        assert parse(bad)[1].retry_ms is None, bad  # ASCII digits only
    # id lines around data (vLLM does not send them; the old client read the id into the JSON)
    assert every_split(b'data: {"a": 1}\nid: 1\n\nid: 2\ndata: {"a": 2}\n\n') == msg(b'{"a": 1}', b'{"a": 2}')


def test_comments_and_a_byte_order_mark():
    assert every_split(b": ping\n\n:\n\n: x\ndata: a\n: y\n\n") == msg(b"a")
    bom = b"\xef\xbb\xbf"
    assert every_split(bom + b"data: a\n\n") == msg(b"a")
    # only one, and only at the start of the stream
    assert parse(bom + bom + b"data: a\n\n")[0] == []  # the second BOM is part of the field name
    assert parse(b"data: a\n\n" + bom + b"data: b\n\n")[0] == msg(b"a")


def test_utf8_data_is_kept_as_bytes():
    s = "data: {\"text\": \"h\u00e9llo \u4e16\u754c\"}\n\n".encode()
    assert every_split(s) == msg('{"text": "h\u00e9llo \u4e16\u754c"}'.encode())


# -- bounds and cost --------------------------------------------------------------------------

def test_a_line_over_the_bound_is_an_error_however_it_arrives():
    line = b"data: " + b"x" * 100
    for step in (1, 7, 64, 1000):
        with pytest.raises(SSEError, match="SSE line over 64 bytes"):
            parse(line + b"\n\n", step, max_line=64)
    assert parse(line + b"\n\n", 7, max_line=200)[0] == msg(b"x" * 100)
    # many short data lines cannot make an event without bound either
    with pytest.raises(SSEError, match="SSE event over 64 bytes"):
        parse(b"data: xxxxxxxxxx\n" * 10 + b"\n", 5, max_line=64)
    assert MAX_LINE_BYTES >= 1 << 20


def test_parsing_is_linear_in_the_line_length():
    """A long line fed in small pieces costs time proportional to its length (it was quadratic:
    40 MB took 17.6 s). A ratio, not a time: 16 times the bytes must take far less than the 256
    times a quadratic parser needs (best of five, on a shared machine). Linear measures 16-35 here
    (the buffer's reallocations and page faults grow with it; a 256-KB run is a fraction of a
    millisecond, noise beside three busy processes: it failed at 64), so 1 MB against 16 MB, half
    the quadratic ratio as the bound, and the process's CPU time, not the wall clock's."""
    def cost(n_bytes: int) -> float:
        piece = b"x" * 1024
        best = float("inf")
        for _ in range(5):
            p = SSEParser(max_line=64 << 20)
            t = time.process_time()  # CPU time: a busy machine's preemptions do not count
            p.feed(b"data: ")
            for _ in range(n_bytes // 1024):
                p.feed(piece)
            assert p.feed(b"\n\n")[0][1][:1] == b"x"
            best = min(best, time.process_time() - t)
        return best

    small, large = cost(1 << 20), cost(16 << 20)
    assert large / small < 128, (small, large)


# -- the client reads spec-valid streams --------------------------------------------------------

TOK = b'{"id":"c","choices":[{"index":0,"text":" a","finish_reason":null}],"usage":null}'
USAGE = b'{"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}'


def exchange(body: bytes, step: int | None = None):
    """An ``Attempt`` fed a 200 ``text/event-stream`` answer (Content-Length framing)."""
    from llmqueue.bench.attempt import Attempt

    loop = asyncio.new_event_loop()
    try:
        raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        ex = Attempt(0.0, 5)
        ex.fut = loop.create_future()
        step = step or len(raw)
        for i in range(0, len(raw), step):
            ex.feed(raw[i:i + step])
        assert ex.fut.done()
        return ex, ex.fut.exception()
    finally:
        loop.close()


@pytest.mark.parametrize("step", [1, 5, None])
def test_client_reads_an_id_line_after_data(step):
    """A ``data:`` line followed by an ``id:`` line gave "malformed JSON chunk"."""
    body = b"".join(b"data: " + e + b"\nid: %d\n\n" % i for i, e in enumerate([TOK, TOK, TOK, USAGE]))
    ex, err = exchange(body + b"data: [DONE]\n\n", step)
    assert err is None and ex.outcome() == ("ok", None) and len(ex.toks) == 3 and ex.ot == 3


@pytest.mark.parametrize("eol", [b"\r", b"\r\n"])
@pytest.mark.parametrize("step", [1, 5, None])
def test_client_reads_bare_cr_line_ends(eol, step):
    """Bare-CR line ends gave "no token in the stream"."""
    body = b"".join(b"data: " + e + eol + eol for e in (TOK, TOK, TOK, USAGE, b"[DONE]"))
    ex, err = exchange(body, step)
    assert err is None and ex.outcome() == ("ok", None) and len(ex.toks) == 3


def test_client_multiline_data_named_events_and_comments():
    # JSON split over two data lines (joined by a newline: still JSON), a named event that is not
    # a chunk (ignored), a comment, an empty-data keep-alive, [DONE] with a trailing space
    split = TOK.replace(b'"choices":', b'\ndata: "choices":')
    body = (b"data: " + split + b"\n\n: keep-alive\n\nevent: ping\ndata: {}\n\ndata:\n\n"
            b"data: " + TOK + b"\n\ndata: " + USAGE + b"\n\ndata: [DONE] \n\n")
    ex, err = exchange(body, 3)
    assert err is None and ex.outcome() == ("ok", None) and len(ex.toks) == 2 and ex.done


def test_client_error_event_type_fails_the_attempt():
    ex, err = exchange(b"data: " + TOK + b'\n\nevent: error\ndata: {"error": {"message": "overloaded"}}\n\n')
    assert "error event in stream: overloaded" in str(err)


def test_client_line_over_the_bound_is_a_per_request_error():
    """One long line is the attempt's error ("SSE line over N bytes"), found without quadratic
    work: the line arrives in 64 KiB pieces, as TCP delivers it."""
    n = MAX_LINE_BYTES + (1 << 20)
    body = b"data: " + TOK + b"\n\ndata: {\"pad\": \"" + b"x" * n + b"\"}\n\n"
    ex, err = exchange(body, 64 << 10)
    assert f"SSE line over {MAX_LINE_BYTES} bytes" in str(err)
    assert len(ex.toks) == 1

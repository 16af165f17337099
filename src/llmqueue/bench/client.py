"""Open-loop benchmark client for OpenAI-compatible servers (vLLM's ``/v1/completions`` and
``/v1/chat/completions``), writing the same per-request records as the simulator.

Open loop, on an absolute clock
-------------------------------
Request ``i`` is sent at ``t0 + arrival_s[i]``: ``t0`` is the run start on one monotonic clock
(``time.perf_counter``), ``arrival_s`` the workload's intended arrival time. The sender sleeps
until that instant and never waits for earlier responses, so a slow server cannot slow the
arrivals (no coordinated omission) and sleeping errors do not accumulate (no drift: every send
time is computed from ``t0``, never from the previous send). Each attempt's record keeps the
intended ``arrival_s`` and the actual ``dispatched_s``. The summary's vLLM-named latencies
(``mean_ttft_ms``, ``p99_e2el_ms``, ...) count from the actual send, as ``vllm bench serve``'s do;
``summary["from_intended"]`` gives TTFT and E2EL from the intended time, which charges any client
lateness (and any wait for a concurrency slot) to the latency rather than hiding it. With
``concurrency=N`` a semaphore caps the requests in flight: the run is then closed-loop (a request
waits in the client for a free slot; its ``dispatched_s`` is when it got one), and the summary
says so.

Exact lengths
-------------
``endpoint="completions"`` sends the prompt as token ids (``prompt: [ids...]``), so the server sees
exactly ``prompt_tokens`` tokens; the ids are drawn, seeded, from a range that is safe for every
tokenizer (:func:`token_id_range`). ``endpoint="chat"`` sends text (common English words, about
one token each); the chat template adds tokens, so the record keeps the server's own count from
``usage``. The output length is fixed with ``max_tokens`` (chat: ``max_completion_tokens``) plus
vLLM's ``ignore_eos: true`` and ``min_tokens`` (``exact_output=False`` leaves the two vLLM
extensions out, for servers that refuse them). Every request streams (``stream: true``,
``stream_options: {include_usage: true}``).

What each record holds (``llmqueue.records`` schema, one row per attempt)
--------------------------------------------------------------------------
``arrival_s`` intended send time; ``dispatched_s`` actual send time; ``first_token_s`` the
arrival of the first chunk carrying ``choices``; ``finish_s`` the arrival of the last such chunk
(vLLM's ``latency``), or the time the attempt failed, or its deadline for a timeout. All are
seconds from ``t0``. ``prompt_tokens``/``output_tokens``: the usage chunk's ``prompt_tokens``
and ``completion_tokens`` (without one: the prompt sent and the chunks counted);
``cached_prompt_tokens``: ``usage.prompt_tokens_details.cached_tokens`` or 0.
``first_scheduled_s`` is NaN and ``preemptions`` 0: a client cannot observe when the engine first
scheduled a request or whether it was preempted (the server's ``/metrics`` only give totals).
``replica`` is 0. ``attempt`` numbers the tries of one request.

Statuses (an attempt never raises; a failure is a status):

==============================================================  ===========
what happened                                                   status
==============================================================  ===========
HTTP 200, tokens streamed, ``[DONE]`` or a usage chunk seen     ``ok``
HTTP 429 or 503 (overload, admission control)                   ``rejected``
HTTP 400/413 saying the prompt is too long (vLLM: "maximum      ``rejected``
context length")
any other HTTP status (400 bad request, 404 model, 500, ...)    ``error``
malformed JSON chunk, an ``error`` event in the stream, no      ``error``
token, stream cut before ``[DONE]``, connection refused/reset
a broken answer: a usage count that is not an integer in        ``error``
``[0, 2**63)``, ``choices`` not a list, an SSE line over 8 MiB
client deadline passed (``timeout_s`` / ``ttft_timeout_s``)     ``timeout``
still in flight when the run was stopped or interrupted         ``unfinished``
==============================================================  ===========

Each failure's reason is counted in ``summary["errors"]``. An ok attempt with more output tokens
than its ``max_tokens`` stays ``ok`` with the server's count (it was served; its times are real)
and is counted in ``summary["warnings"]`` with a note naming the worst case: a server that ignores
``max_tokens`` skews throughput and TPOT, which the reader must know, but it does not make the
measured latencies false.

Per-token times go to ``tokens.parquet`` (``request_id, attempt, index, t_s``: one row per
streamed chunk with ``choices``; vLLM streams one token per chunk unless several are ready at
once, and ``vllm bench serve`` also takes chunk gaps as ITL). vLLM's chat stream opens with a
role-only chunk (``delta: {"role": "assistant", "content": ""}``), sent in the same engine
iteration as the first token: it is not a token and is skipped (``vllm bench serve`` counts it,
which only adds one ~0 ms gap per request to its ITL). Summary latencies follow
``vllm bench serve`` (``vllm/benchmarks/serve.py``, ``calculate_metrics``; the request functions in
``vllm/benchmarks/lib/endpoint_request_func.py``): TTFT = first chunk - send, E2EL (``latency``) =
last chunk - send, TPOT = (E2EL - TTFT) / (output_tokens - 1) for more than one output token,
ITL = gaps between consecutive chunks. The main keys measure from the actual send, exactly as
vLLM does; ``summary["from_intended"]`` gives TTFT and E2EL from the intended send time (the
records' ``arrival_s``; TPOT and ITL are the same either way).

Failures of the run itself
--------------------------
Records are appended to ``requests.parquet`` in batches (every ``flush_interval_s``) and the
file is closed on any exit, so a stopped or interrupted run keeps every finished attempt. If the
server stops accepting connections (``abort_after`` consecutive connection failures and a
refused probe connection), sending stops, attempts in flight get ``abort_grace_s`` to end
(then ``unfinished``), and the result carries ``error`` (the reason); requests never sent are
counted in ``summary["not_sent"]``. A server that cannot be reached at the start raises
:class:`BenchConnectError`. If the records cannot be written (a full disk), the run stops the same
way with ``error`` saying so: the batches written before stay readable (no batch follows a failed
one), ``BenchResult.written`` counts them; a journal that cannot become its Parquet file stays in
place, readable.

Retries follow :mod:`llmqueue.workload.client`: after an attempt ends with a retryable status,
``retry(request_id, attempt, status, finish_s)`` gives the next attempt's intended send time (or
None); the next attempt is sent at that time, with the same prompt, as ``attempt + 1``.

Client self-check (``summary["client"]``): scheduling lag (actual - intended send, before any
concurrency wait) percentiles and its trend over the run (drift), and a two-sample
Kolmogorov-Smirnov test of the realized against the intended inter-arrival gaps
(:func:`arrival_check`).

Transport
---------
One event loop (uvloop when installed) does everything: the sender, the HTTP/1.1 exchanges and
the stream parsing. HTTP is a small client on asyncio protocols (:class:`_Pool`, :class:`_Exchange`):
keep-alive connections opened on demand with no limit (a connection limit would queue requests
in the client, which is closed-loop behaviour), Content-Length, chunked and close-delimited
bodies, and server-sent events parsed in the protocol callback as bytes arrive, where each chunk
is time-stamped (:mod:`llmqueue.bench.sse`). Connections go to ``url``'s origin only, or through
a proxy when one is asked for (``proxy`` / ``trust_env``; an https server through a ``CONNECT``
tunnel); the API key and custom headers are checked first (:mod:`llmqueue.bench.credentials`).
It costs about a third of a general client's CPU per request
(aiohttp's ``ClientSession``, measured on the stub) and it is what lets one process send
thousands of requests per second on time. Each attempt has one deadline timer. Finished attempts
are written by a worker thread once a second, so writing never blocks sending.

Files (``out_dir``): ``requests.parquet`` (records, in completion order, appended once a
second to its journal, ``requests.parquet.journal``, which becomes the Parquet file at the end:
a client killed outright, even by SIGKILL, leaves every batch it wrote readable, see
:mod:`llmqueue.records.journal`), ``tokens.parquet`` (chunk times, journaled the same way),
``workload.parquet`` (the intended stream: ids, classes, arrival times, requested lengths, and
the prompts' prefix-block ``hash_ids`` when they were built from a trace's), ``summary.json``; with a metrics URL also
``timeseries.parquet`` (the server's queue gauges in the simulator's schema), ``metrics.parquet``
(every sampled column: gauges, counters such as preemptions, histogram sums and counts) and
``server.json`` (its KV cache shape); the summary's ``server_counters`` are the counters' growth
over the run: from a scrape taken before the first send to one taken after the last answer (and
after the server's finished-requests counter caught up with the answers, up to 2 s).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import math
import sys
import time
from array import array
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from llmqueue.bench.credentials import check_key_over_proxy, proxy_auth, proxy_for, request_headers
from llmqueue.bench.sse import SSEError, SSEParser
from llmqueue.errors import InputError, LlmqueueError

DEFAULT_TIMEOUT_S = 600.0
#: Token ids used for prompts when the vocabulary size is unknown: above the special and
#: control tokens of common tokenizers (Llama, GPT-2, OPT, Qwen, byte-level BPEs put them
#: first or last) and below every vocabulary size of at least 512.
DEFAULT_TOKEN_RANGE = (100, 500)
TOKENS_FILE = "tokens.parquet"
WORKLOAD_FILE = "workload.parquet"
SERVER_FILE = "server.json"
METRICS_FILE = "metrics.parquet"

_pc = time.perf_counter

# Common English words: about one token each (with their leading space) in BPE vocabularies.
_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water been "
    "call who oil its now find long down day did get come made may part over new sound take only "
    "little work know place year live me back give most very after thing our just name good sentence "
    "man think say great where help through much before line right too mean old any same tell boy "
    "follow came want show also around form three small set put end does another well large must "
    "big even such because turn here why ask went men read need land different home us move try "
    "kind hand picture again change off play spell air away animal house point page letter mother "
    "answer found study still learn should world high every near add food between own below country "
    "plant last school father keep tree never start city earth eye light thought head under story "
    "saw left few while along might close something seem next hard open example begin life always "
    "those both paper together got group often run important until children side feet car mile night"
).split()


class BenchConnectError(LlmqueueError):
    """The server could not be reached before the run started (nothing was sent)."""

    def __init__(self, url: str, problem: str):
        self.field = "url"
        super().__init__(f"url: cannot connect to {url} ({problem}); start the server or fix --url")


def token_id_range(vocab_size: int | None = None) -> tuple[int, int]:
    """``[lo, hi)`` of the random prompt token ids.

    Without a vocabulary size: :data:`DEFAULT_TOKEN_RANGE`. With one (``V``): the middle 90%,
    ``[V // 20, V - V // 20)``, clear of the special tokens tokenizers put at either end.
    """
    if vocab_size is None:
        return DEFAULT_TOKEN_RANGE
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 40:
        raise InputError("vocab_size", f"must be an integer >= 40 (got {vocab_size!r})")
    v = int(vocab_size)
    return (max(1, v // 20), v - v // 20)


def classify_http(status: int, body: bytes | str = b"") -> str:
    """The record status of a non-200 HTTP answer (see the module docstring's table)."""
    if status in (429, 503):
        return "rejected"
    if status in (400, 413):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        t = text.lower()
        if ("maximum context length" in t or "max_model_len" in t or "context length" in t
                or "too long" in t or "exceeds" in t and "token" in t):
            return "rejected"
    return "error"


def endpoint_url(url: str, endpoint: str) -> str:
    """The request URL: ``url`` as given if it names an endpoint, else ``url/v1/<endpoint path>``."""
    if endpoint not in ("completions", "chat"):
        raise InputError("endpoint", f"unknown endpoint {endpoint!r}", "use completions or chat")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("url", f"{url!r} is not an http(s) URL", "e.g. http://127.0.0.1:8000")
    try:
        parts.port
    except ValueError:
        raise InputError("url", f"{url!r} has a bad port", "e.g. http://127.0.0.1:8000") from None
    u = url.rstrip("/")
    if u.endswith("/completions"):
        return u
    path = "completions" if endpoint == "completions" else "chat/completions"
    return f"{u}/{path}" if u.endswith("/v1") else f"{u}/v1/{path}"


def _base_url(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}"


@dataclass
class BenchResult:
    """What :func:`run_bench` returns.

    ``records``: :class:`~llmqueue.records.RequestRecords` (one row per attempt); ``summary``:
    :func:`llmqueue.metrics.summarize` plus ``client`` (self-checks), ``from_intended`` and ``bench``;
    ``tokens``: per-chunk arrival times (``request_id, attempt, index, t_s`` arrays);
    ``error``: why the run stopped early (None if it ran to the end); ``out_dir``: where the
    files are (None if not written); ``written``: the attempt records on disk (all of them,
    unless writing failed: a full disk).
    """

    records: object
    summary: dict
    tokens: dict
    error: str | None = None
    interrupted: bool = False
    out_dir: Path | None = None
    notes: list = field(default_factory=list)
    written: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


# ---------------------------------------------------------------------------------------------
# Prompt construction
# ---------------------------------------------------------------------------------------------

class _Prompts:
    """Request bodies, built just before sending: seeded, the same for every attempt.

    Token ids come from one random pool; request ``i`` takes ``prompt_tokens[i]`` consecutive
    ids from a random offset, so prompts differ (no shared prefix blocks across requests) and the
    JSON text is a join of pre-formatted ids.

    With ``hash_ids`` (one list per request, or None: a Mooncake trace's prefix-block hashes),
    request ``i``'s prompt is instead the blocks of its hashes, ``hash_block_tokens`` ids each,
    cut to its length: a hash stands for the same ids in every request (drawn from a generator
    seeded by ``(seed, hash)``), so requests that share leading hashes share that prompt prefix
    and a server's prefix cache can hit on it, as it would on the traced prompts. Tokens past the
    last hash come from the request's own pool slice.
    """

    def __init__(self, requests, *, model: str, endpoint: str, seed: int, token_range, exact_output: bool,
                 extra_body: Mapping | None, hash_ids=None, hash_block_tokens: int = 512, texts=None):
        s = np.asarray(requests.prompt_tokens, dtype=np.int64)
        lo, hi = token_range
        if not (isinstance(lo, (int, np.integer)) and isinstance(hi, (int, np.integer)) and 0 <= lo < hi):
            raise InputError("token_range", f"need integers 0 <= lo < hi (got {token_range!r})")
        smax = int(s.max()) if len(s) else 1
        pool_n = smax + (1 << 16)
        rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(0x7B,)))
        self.chat = endpoint == "chat"
        if self.chat:
            idx = rng.integers(0, len(_WORDS), pool_n)
            self.pool = [_WORDS[k] for k in idx.tolist()]
        else:
            self.pool = [str(x) for x in rng.integers(int(lo), int(hi), pool_n).tolist()]
        self.offsets = rng.integers(0, pool_n - np.maximum(s, 0) + 1).tolist()
        self.s = s.tolist()
        self.hash_ids = None
        if hash_ids is not None:
            if len(hash_ids) != len(s):
                raise InputError("hash_ids", f"{len(hash_ids)} hash lists for {len(s)} requests")
            H = hash_block_tokens
            if isinstance(H, bool) or not isinstance(H, (int, np.integer)) or H < 1:
                raise InputError("hash_block_tokens", f"must be a positive integer (got {H!r})")
            self.hash_ids = [None if h is None else [int(x) for x in h] for h in hash_ids]
            self.H = int(H)
            self._seed = int(seed) & 0xFFFFFFFFFFFFFFFF
            self._lo, self._hi = int(lo), int(hi)
            self.block = functools.lru_cache(maxsize=4096)(self._block)  # a long trace has many hashes
        self.o = np.asarray(requests.output_tokens, dtype=np.int64).tolist()
        self.texts = None
        if texts is not None:  # a dataset's prompts, sent as text (the server counts their tokens)
            if len(texts) != len(s):
                raise InputError("prompt_texts", f"{len(texts)} prompts for {len(s)} requests")
            if hash_ids is not None:
                raise InputError("prompt_texts", "text prompts cannot also be built from prefix hashes")
            self.texts = [json.dumps(str(t)) for t in texts]
        m = json.dumps(model).replace("%", "%%")  # the templates below are %-formatted
        tail = ',"stream":true,"stream_options":{"include_usage":true}'
        if extra_body:  # appended last: a key given here overrides ours
            tail += "," + json.dumps(dict(extra_body))[1:-1].replace("%", "%%")
        tail += "}"
        if self.chat:
            head = '{"model":' + m + ',"messages":[{"role":"user","content":'
            self._fmt = head + '%s}],"max_completion_tokens":%d' + (
                ',"min_tokens":%d,"ignore_eos":true' if exact_output else "") + tail
        else:
            self._fmt = '{"model":' + m + (',"prompt":%s' if self.texts is not None else ',"prompt":[%s]') + \
                ',"max_tokens":%d' + (
                ',"min_tokens":%d,"ignore_eos":true' if exact_output else "") + tail
        self.exact = exact_output

    def _block(self, h: int) -> list[str]:
        """The ``hash_block_tokens`` ids (chat: words) that prefix hash ``h`` stands for
        (``self.block``: the same, cached)."""
        g = np.random.default_rng(np.random.SeedSequence([self._seed, h & 0xFFFFFFFFFFFFFFFF], spawn_key=(0x7C,)))
        if self.chat:
            return [_WORDS[k] for k in g.integers(0, len(_WORDS), self.H).tolist()]
        return [str(x) for x in g.integers(self._lo, self._hi, self.H).tolist()]

    def tokens(self, i: int) -> list[str]:
        """Request ``i``'s prompt, as pre-formatted ids (chat: words)."""
        a = self.offsets[i]
        s = self.s[i]
        hs = self.hash_ids[i] if self.hash_ids is not None else None
        if not hs:
            return self.pool[a:a + s]
        out: list[str] = []
        for h in hs[:-(-s // self.H)]:
            out += self.block(h)[:s - len(out)]
        return out + self.pool[a:a + s - len(out)]

    def body(self, i: int) -> bytes:
        o = self.o[i]
        if self.texts is not None:
            prompt = self.texts[i]
        elif self.chat:
            prompt = json.dumps(" ".join(self.tokens(i)))
        else:
            prompt = ",".join(self.tokens(i))
        return (self._fmt % ((prompt, o, o) if self.exact else (prompt, o))).encode()


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

class _StreamError(Exception):
    pass


class _Expired(Exception):
    """The attempt's client deadline passed."""


class _Lost(ConnectionResetError):
    """The connection closed before any byte of the response (a stale keep-alive connection or
    a server that died): retried once on a fresh connection when the connection was reused."""


_HEAD, _BODY_LEN, _BODY_CLOSE, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _DONE = range(8)
_MAX_HEAD = 64 * 1024        # response head, and a chunked body's trailer
_MAX_CHUNK_LINE = 4096       # a chunk-size line (hex size and extensions)
_MAX_ERRBODY = 1 << 20       # kept of a non-200 body (for classify_http)
_MAX_COUNT = (1 << 63) - 1   # a token count must fit the records' int64
_OVER_ASKED = "more output tokens than max_tokens"


class _Exchange:
    """One HTTP request/response on a connection, parsed as bytes arrive (no task per chunk).

    HTTP/1.1 framing (Content-Length, chunked, or until close) and, for a 200 answer,
    server-sent events (:class:`~llmqueue.bench.sse.SSEParser`): each event's data is decoded as
    JSON when it arrives and a chunk with ``choices`` is time-stamped then
    (``time.perf_counter() - t0``), as ``vllm bench serve`` time-stamps its chunks. Events of the
    default type (``message``) carry the chunks; an ``error`` event fails the attempt (as the
    OpenAI SDK reads it); other named events are ignored. Every buffer is bounded (head,
    chunk-size line, trailer, SSE line and event, kept error body) and every byte is copied a
    bounded number of times: what a server sends cannot exhaust the client nor slow it down
    more than linearly.
    """

    __slots__ = ("t0", "pt", "ot", "cached", "first", "fin", "toks", "http_status", "usage", "done",
                 "timer", "task", "expired", "later", "fut", "conn", "state", "buf", "sse", "remaining", "keep_alive",
                 "errbody", "nbytes", "done_t", "complete")

    def __init__(self, t0: float, prompt_tokens: int):
        self.t0 = t0
        self.pt = prompt_tokens
        self.ot = None
        self.cached = 0
        self.first = math.nan
        self.fin = math.nan
        self.toks = array("d")
        self.http_status = None
        self.usage = None
        self.done = False
        self.timer = None
        self.task = None
        self.expired = False
        self.later = None
        self.fut = None
        self.conn = None
        self.reset()

    def reset(self) -> None:
        """Forget a response (before resending on a fresh connection)."""
        self.state = _HEAD
        self.buf = b""
        self.sse = None
        self.remaining = 0
        self.keep_alive = False
        self.errbody = bytearray()
        self.nbytes = 0
        self.done_t = math.nan
        self.complete = False

    # -- called by the connection ------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.nbytes += len(data)
        if self.state != _HEAD:
            self.body(data)
            return
        old = self.buf
        buf = old + data if old else data
        j = buf.find(b"\r\n\r\n", max(len(old) - 3, 0))  # bytes already searched are not searched again
        if j < 0:
            if len(buf) > _MAX_HEAD:
                self.fail(_StreamError("response head too large"))
            self.buf = buf
            return
        self.buf = b""
        lines = buf[:j].split(b"\r\n")
        parts = lines[0].split(None, 2)
        try:
            code = int(parts[1])
        except (IndexError, ValueError):
            self.fail(_StreamError("not an HTTP response"))
            return
        clen = None
        chunked = False
        conn_hdr = b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    clen = int(value)
                except ValueError:
                    self.fail(_StreamError("bad Content-Length"))
                    return
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                conn_hdr = value.strip().lower()
        if 100 <= code < 200:  # interim answer: the real one follows
            rest = buf[j + 4:]
            if rest:
                self.feed(rest)
            return
        self.http_status = code
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = conn_hdr == b"keep-alive"
        else:
            self.keep_alive = conn_hdr != b"close"
        if chunked:
            self.state = _CHUNK_SIZE
        elif clen is not None:
            self.state = _BODY_LEN
            self.remaining = clen
        else:
            self.state = _BODY_CLOSE
            self.keep_alive = False
        rest = buf[j + 4:]
        if self.state == _BODY_LEN and clen == 0:
            self.finish()
        elif rest:
            self.body(rest)

    def body(self, data: bytes) -> None:
        """Framing: hand the payload bytes to :meth:`payload`; finish at the end of the body."""
        st = self.state
        if st == _BODY_LEN:
            n = self.remaining
            if len(data) >= n:
                self.payload(data[:n])
                self.remaining = 0
                self.finish()
            else:
                self.remaining = n - len(data)
                self.payload(data)
            return
        if st == _BODY_CLOSE:
            self.payload(data)
            return
        if st == _DONE:
            return
        buf = self.buf + data if self.buf else data
        pos = 0
        n = len(buf)
        while pos < n and self.state != _DONE:
            st = self.state
            if st == _CHUNK_DATA:
                k = self.remaining
                take = buf[pos:pos + k]
                pos += len(take)
                self.remaining = k - len(take)
                if self.remaining == 0:
                    self.state = _CHUNK_CRLF
                self.payload(take)
            elif st == _CHUNK_CRLF:
                if n - pos < 2:
                    break
                pos += 2
                self.state = _CHUNK_SIZE
            elif st == _CHUNK_SIZE:
                e = buf.find(b"\r\n", pos)
                if e < 0:
                    if n - pos > _MAX_CHUNK_LINE:
                        self.fail(_StreamError("bad chunked encoding (chunk-size line too long)"))
                        return
                    break
                try:
                    size = int(buf[pos:e].split(b";", 1)[0], 16)
                except ValueError:
                    self.fail(_StreamError("bad chunked encoding"))
                    return
                pos = e + 2
                if size == 0:
                    self.state = _TRAILER
                else:
                    self.remaining = size
                    self.state = _CHUNK_DATA
            elif st == _TRAILER:
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                    self.finish()
                    break
                e = buf.find(b"\r\n\r\n", pos)
                if e < 0:
                    if n - pos > _MAX_HEAD:
                        self.fail(_StreamError("chunked trailer too large"))
                        return
                    break
                pos = e + 4
                self.finish()
                break
            else:  # _DONE or _HEAD cannot happen here
                break
        self.buf = buf[pos:] if pos < n else b""

    def payload(self, data: bytes) -> None:
        """Response body bytes: server-sent events for a 200, else kept (1 MiB at most) for the status."""
        if self.fut is None or self.fut.done():
            return
        if self.http_status != 200:
            if len(self.errbody) < _MAX_ERRBODY:
                self.errbody += data[:_MAX_ERRBODY - len(self.errbody)]
            return
        sse = self.sse
        if sse is None:
            sse = self.sse = SSEParser()
        try:
            events = sse.feed(data)
        except SSEError as e:
            self.fail(_StreamError(str(e)))
            return
        t0 = self.t0
        for kind, ev in events:
            if kind != b"message":
                if kind == b"error":  # the OpenAI SDK raises on an ``event: error``
                    self.fail(_StreamError("error event in stream" + _error_text(ev)))
                    return
                continue  # other named events (pings, progress) carry no chunk
            if ev == b"[DONE]":
                self.done = True
                continue
            try:
                d = json.loads(ev)
            except ValueError:
                d = _odd_data(ev)
                if d is None:
                    self.fail(_StreamError("malformed JSON chunk"))
                    return
                if d is _DONE_DATA:
                    self.done = True
                    continue
                if d is _NO_DATA:
                    continue
            if type(d) is not dict:
                self.fail(_StreamError("malformed JSON chunk"))
                return
            ch = d.get("choices")
            if ch:
                if type(ch) is not list:
                    self.fail(_StreamError("malformed chunk: choices is not a list"))
                    return
                if not self.toks and _role_only(ch):
                    continue  # vLLM's chat stream opens with {"role": "assistant", "content": ""}
                now = _pc() - t0
                if self.first != self.first:
                    self.first = now
                    if self.later is not None:  # the TTFT deadline is met: the total one applies
                        deadline, loop = self.later
                        if self.timer is not None:
                            self.timer.cancel()
                        self.timer = loop.call_at(loop.time() + (t0 + deadline - _pc()), self.expire)
                self.toks.append(now)
            elif "error" in d or d.get("object") == "error":
                e = d.get("error") if isinstance(d.get("error"), dict) else d
                msg = str(e.get("message", "") if isinstance(e, dict) else e)[:80]
                self.fail(_StreamError("error event in stream" + (f": {msg}" if msg else "")))
                return
            u = d.get("usage")
            if u:
                self.usage = u

    def finish(self) -> None:
        self.state = _DONE
        self.complete = True
        self.done_t = _pc() - self.t0
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(None)

    def fail(self, exc: BaseException) -> None:
        self.keep_alive = False
        if self.fin != self.fin:
            self.fin = _pc() - self.t0
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(exc)

    def expire(self) -> None:
        """The attempt's deadline passed (a timer callback)."""
        self.timer = None
        f = self.fut
        if f is not None:
            if f.done():  # the answer came first
                return
            self.expired = True
            self.keep_alive = False
            f.set_exception(_Expired())
            self.abandon()
        else:  # waiting for a concurrency slot or a connection
            self.expired = True
            self.task.cancel()

    def lost(self, exc) -> None:
        """The connection closed under this exchange."""
        if self.complete:
            return
        if self.state == _BODY_CLOSE and exc is None:
            self.finish()
        elif self.nbytes == 0:
            self.fail(_Lost("server disconnected"))
        else:
            self.fail(_StreamError("response cut short"))

    def abandon(self) -> None:
        """The client gives up (timeout, cancel): close the connection under it."""
        c = self.conn
        if c is not None and not self.complete:
            c.ex = None
            c.close()

    # -- called by the attempt -----------------------------------------------------------------
    def outcome(self) -> tuple[str, str | None]:
        code = self.http_status
        if code != 200:
            self.fin = self.done_t
            return classify_http(code, bytes(self.errbody)), f"HTTP {code}"
        if not self.toks:
            self.fin = self.done_t
            return "error", "no token in the stream"
        if not (self.done or self.usage):
            self.fin = self.done_t
            return "error", "stream ended before [DONE]"
        self.fin = self.toks[-1]
        u = self.usage
        if u:
            bad = self.read_usage(u)
            if bad is not None:
                return "error", bad
        return "ok", None

    def read_usage(self, u) -> str | None:
        """Take the server's token counts from its usage chunk; returns why they cannot be taken
        (the attempt is then an error, recorded with the prompt sent and the chunks counted), or
        None. A count must be an integer (not a string, float or bool) in ``[0, 2**63)``, the
        records' int64; cached prompt tokens cannot exceed the prompt."""
        if type(u) is not dict:
            return "invalid usage (not an object)"
        c = u.get("completion_tokens")
        p = u.get("prompt_tokens")
        det = u.get("prompt_tokens_details")
        k = det.get("cached_tokens") if type(det) is dict else None
        for name, v in (("completion_tokens", c), ("prompt_tokens", p), ("prompt_tokens_details.cached_tokens", k)):
            if v is not None and not (type(v) is int and 0 <= v <= _MAX_COUNT):
                return f"invalid usage.{name} (not an integer in [0, 2^63))"
        if k and p is not None and k > p:
            return "invalid usage.prompt_tokens_details.cached_tokens (more than prompt_tokens)"
        self.ot = len(self.toks) if c is None else c
        if p is not None:
            self.pt = p
        if k:
            self.cached = k
        return None


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; feeds the bytes to its current exchange."""

    __slots__ = ("transport", "ex", "closed", "hs", "hs_fut")

    def __init__(self):
        self.transport = None
        self.ex = None
        self.closed = False
        self.hs = None      # a proxy's answer to CONNECT, while it arrives
        self.hs_fut = None  # resolved when the tunnel is open (or refused)

    async def open_tunnel(self, request: bytes) -> None:
        """Ask the proxy for a tunnel to the server (``CONNECT``) and wait for its 2xx answer."""
        self.hs = bytearray()
        self.hs_fut = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            await self.hs_fut
        finally:
            self.hs = self.hs_fut = None

    def tunnel_answer(self, data: bytes) -> None:
        f = self.hs_fut
        self.hs += data
        j = self.hs.find(b"\r\n\r\n")
        if j < 0:
            if len(self.hs) > _MAX_HEAD:
                f.set_exception(ConnectionError("the proxy's answer to CONNECT is too large"))
            return
        line = bytes(self.hs[:self.hs.find(b"\r\n")])
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[1].startswith(b"2") or len(parts[1]) != 3:
            f.set_exception(ConnectionError("the proxy refused the tunnel: " + line.decode("latin-1")[:80]))
        elif j + 4 != len(self.hs):
            f.set_exception(ConnectionError("the proxy sent bytes before the tunnel's TLS"))
        else:
            f.set_result(None)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None:
            f = self.hs_fut
            if f is not None and not f.done():
                self.tunnel_answer(data)
                return
            self.close()  # bytes nobody asked for: the connection is not reusable
            return
        try:
            ex.feed(data)
        except Exception as e:  # noqa: BLE001 - an answer nobody foresaw fails its attempt, never the loop
            self.ex = None
            ex.fail(_StreamError(f"unreadable response ({type(e).__name__})"))
            self.close()

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self.closed = True
        f = self.hs_fut
        if f is not None and not f.done():
            f.set_exception(ConnectionResetError("the proxy closed the connection"))
        ex = self.ex
        if ex is not None:
            self.ex = None
            ex.lost(exc)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class _Pool:
    """Keep-alive connections to one server, created on demand (no limit: open loop).

    With ``proxy`` (an ``http://`` proxy URL, see :mod:`llmqueue.bench.credentials`) every
    connection goes to the proxy: a plain-http server's requests are forwarded by it (the
    request line names the whole URL), an https server is reached through a ``CONNECT`` tunnel,
    inside which TLS runs end to end with the server.
    """

    def __init__(self, loop, url: str, headers: Mapping[str, str], proxy: str | None = None):
        import ssl

        p = urlsplit(url)
        self.loop = loop
        self.host = p.hostname
        self.port = p.port or (443 if p.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if p.scheme == "https" else None
        path = p.path or "/"
        if p.query:
            path += "?" + p.query
        host_hdr = p.netloc.rsplit("@", 1)[-1]
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() != "content-type")
        self.tunnel = None  # the CONNECT request (an https server through a proxy)
        self.connect_to = (self.host, self.port)
        if proxy is not None:
            pp = urlsplit(proxy)
            self.connect_to = (pp.hostname, pp.port or 80)
            auth = proxy_auth(proxy)
            auth = f"Proxy-Authorization: {auth}\r\n" if auth else ""
            if self.ssl is None:
                path = f"http://{host_hdr}{path}"
                extra += auth
            else:
                authority = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
                self.tunnel = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n".encode()
        self.head = (f"POST {path} HTTP/1.1\r\nHost: {host_hdr}\r\nUser-Agent: llmqueue-bench\r\n"
                     f"Accept: text/event-stream\r\nContent-Type: application/json\r\n{extra}"
                     "Content-Length: ").encode()
        self.idle: list[_Conn] = []
        self.addr = None
        self.opened = 0

    async def resolve(self) -> None:
        import socket

        infos = await self.loop.getaddrinfo(*self.connect_to, type=socket.SOCK_STREAM)
        self.addr = infos[0][4][:2]

    async def acquire(self) -> tuple[_Conn, bool]:
        idle = self.idle
        while idle:
            c = idle.pop()
            if not c.closed and not c.transport.is_closing():
                return c, True
        host, port = self.addr
        if self.tunnel is None:
            _, c = await self.loop.create_connection(_Conn, host, port, ssl=self.ssl,
                                                     server_hostname=self.host if self.ssl else None)
        else:
            tr, c = await self.loop.create_connection(_Conn, host, port)
            try:
                await c.open_tunnel(self.tunnel)
                c.transport = await self.loop.start_tls(tr, c, self.ssl, server_hostname=self.host)
            except BaseException:
                c.close()
                raise
        self.opened += 1
        return c, False

    async def exchange(self, ex: _Exchange, body: bytes) -> None:
        """Send ``body`` and wait for the whole response (fed to ``ex`` as it arrives)."""
        msg = self.head + str(len(body)).encode() + b"\r\n\r\n" + body
        for tries in (0, 1):
            c, reused = await self.acquire()
            ex.conn = c
            ex.fut = self.loop.create_future()
            c.ex = ex
            c.transport.write(msg)
            try:
                await ex.fut
            except _Lost:
                if reused and tries == 0:
                    ex.reset()
                    ex.fut = None
                    continue
                raise
            finally:
                if c.ex is ex:
                    c.ex = None
            if ex.keep_alive and ex.complete and not c.closed:
                self.idle.append(c)
            else:
                c.close()
            return

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()




def _per_class(value, name: str, classes: tuple[str, ...]) -> list[float]:
    """A float, None or a {class: value} mapping -> one value (inf: none) per class index."""
    if value is None:
        return [math.inf] * len(classes)
    if isinstance(value, Mapping):
        out = []
        for c in classes:
            v = value.get(c)
            out.append(math.inf if v is None else _positive(name, v))
        return out
    v = _positive(name, value)
    return [v] * len(classes)


def _positive(name, v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(name, f"must be a number (got {v!r})") from None
    if not x > 0:
        raise InputError(name, f"must be > 0 (got {v!r})")
    return x


def _retry_function(retry, seed: int, requests):
    """Normalise ``retry``: None, a callable, a ClientBehavior / BoundClient, or a ClassMix."""
    if retry is None:
        return None
    if hasattr(retry, "retry_function"):  # ClassMix
        return retry.retry_function(seed, requests)
    if hasattr(retry, "bind") and hasattr(retry, "retry"):  # ClientBehavior
        return retry.bind(seed).decide
    if hasattr(retry, "decide"):  # BoundClient
        return retry.decide
    if callable(retry):
        return retry
    raise InputError("retry", f"expected a ClassMix, ClientBehavior or decide function (got {type(retry).__name__})")


class _Run:
    """One benchmark run's state (the event loop's side)."""

    def __init__(self, *, url, model, requests, endpoint, out_dir, concurrency, timeout_s, ttft_timeout_s,
                 seed, token_range, retry, warmup_s, warmup_requests, progress, metrics_url,
                 flush_interval_s, abort_after, abort_grace_s, spin_s, exact_output, extra_body, headers,
                 slos, metrics_interval_s, hash_ids=None, hash_block_tokens=512, proxy=None, percentiles=None,
                 prompt_texts=None, drain_timeout_s=None):
        self.url = url
        self.drain_timeout_s = drain_timeout_s
        self.cancel_status = "unfinished"   # "cancelled" when the drain cap ends the run (the client's choice)
        self.drain_cancelled = 0
        self.model = model
        self.requests = requests
        self.endpoint = endpoint
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.concurrency = concurrency
        self.seed = seed
        self.warmup_s = warmup_s
        self.warmup_requests = warmup_requests
        self.progress = progress
        self.metrics_url = metrics_url
        self.metrics_interval_s = metrics_interval_s
        self.flush_interval_s = flush_interval_s
        self.abort_after = abort_after
        self.abort_grace_s = abort_grace_s
        self.spin_s = spin_s
        self.slos = slos
        self.summary_options = {} if percentiles is None else {"percentiles": tuple(percentiles)}
        classes = tuple(requests.classes)
        self.classes = classes
        self.cls_idx = requests.class_index.tolist()
        self.ids = requests.request_id.tolist()
        self.arrivals = np.asarray(requests.arrival_s, dtype=np.float64).tolist()
        self.timeouts = _per_class(timeout_s, "timeout_s", classes)
        self.ttft_timeouts = _per_class(ttft_timeout_s, "ttft_timeout_s", classes)
        self.retry = _retry_function(retry, seed, requests)
        self.prompts = _Prompts(requests, model=model, endpoint=endpoint, seed=seed, token_range=token_range,
                                exact_output=exact_output, extra_body=extra_body, hash_ids=hash_ids,
                                hash_block_tokens=hash_block_tokens, texts=prompt_texts)
        self.headers = dict(headers)  # checked by request_headers: the key and the custom headers
        self.proxy = proxy
        # columns of the records, one entry per finished attempt (arrays: 8 bytes a value)
        self.c_rid = array("q")
        self.c_cls = array("q")
        self.c_arr = array("d")
        self.c_disp = array("d")
        self.c_first = array("d")
        self.c_fin = array("d")
        self.c_pt = array("q")
        self.c_ot = array("q")
        self.c_cached = array("q")
        self.c_status: list[str] = []
        self.c_att = array("q")
        self.c_sched = array("d")          # when the send path started (before any concurrency wait)
        self.c_ntok = array("q")           # chunks with choices, per attempt
        self.tok_t = array("d")            # their arrival times, attempt after attempt
        self.tok_flushed = 0
        self.errors: Counter = Counter()
        self.warnings: Counter = Counter()  # reasons an ok attempt is suspect (more tokens than asked)
        self.over_asked = (0.0, None)       # the largest output / max_tokens ratio, and (request, got, asked)
        self.flushed = 0
        self.written = 0                    # attempt records whose write succeeded (the writer thread counts)
        self.write_error: str | None = None  # why writing stopped (set by the writer thread)
        self.sent_first = 0                # first attempts sent
        self.retries_dropped = 0           # retries decided but not sent (run stopped)
        self.inflight: set = set()
        self.max_inflight = 0
        self.n_inflight = 0
        self.stopping = False
        self.cancel_inflight = False
        self.error: str | None = None
        self.interrupted = False
        self.conn_fail_streak = 0
        self.probing = False
        self.t0 = 0.0
        self.t0_epoch: float | None = None  # wall-clock time (epoch s) of the run's t = 0
        self.sched_task = None
        self.sem = asyncio.Semaphore(concurrency) if concurrency else None
        self.writer = None
        self.tok_writer = None
        self.flush_lock = None
        self._wexec = None  # the one writer thread (created on the first flush)
        self._last_write = None
        self._finished = 0                 # requests whose last attempt ended
        self.loop = None
        self.pool = None
        self._tick_pad = 0.0
        self.post_url = endpoint_url(url, endpoint)
        parts = urlsplit(self.post_url)
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.notes: list[str] = []

    # -- records ---------------------------------------------------------------------------------
    def record(self, i, attempt, arrival, sched, disp, first, fin, pt, ot, cached, status, toks):
        self.c_rid.append(self.ids[i])
        self.c_cls.append(self.cls_idx[i])
        self.c_arr.append(arrival)
        self.c_sched.append(sched)
        self.c_disp.append(disp)
        self.c_first.append(first)
        self.c_fin.append(fin)
        self.c_pt.append(pt)
        self.c_ot.append(ot)
        self.c_cached.append(cached)
        self.c_status.append(status)
        self.c_att.append(attempt)
        self.c_ntok.append(len(toks))
        self.tok_t.extend(toks)

    def columns(self, a: int = 0, b: int | None = None) -> dict:
        """The records of attempts [a, b) as schema columns (slices are copies: safe in a thread)."""
        b = len(self.c_status) if b is None else b
        names = np.asarray(self.classes)
        n = b - a

        def f(col):
            return np.frombuffer(col[a:b], dtype=np.float64) if n else np.zeros(0)

        def i(col):
            return np.frombuffer(col[a:b], dtype=np.int64) if n else np.zeros(0, dtype=np.int64)

        return {
            "request_id": i(self.c_rid),
            "class": names[i(self.c_cls)] if n else np.zeros(0, dtype="<U1"),
            "arrival_s": f(self.c_arr),
            "dispatched_s": f(self.c_disp),
            "first_scheduled_s": np.full(n, np.nan),
            "first_token_s": f(self.c_first),
            "finish_s": f(self.c_fin),
            "prompt_tokens": i(self.c_pt),
            "output_tokens": i(self.c_ot),
            "cached_prompt_tokens": i(self.c_cached),
            "status": np.asarray(self.c_status[a:b], dtype=str) if n else np.zeros(0, dtype="<U1"),
            "preemptions": np.zeros(n, dtype=np.int64),
            "replica": np.zeros(n, dtype=np.int64),
            "attempt": i(self.c_att),
        }

    def token_columns(self, a: int = 0, b: int | None = None, t=None) -> dict:
        """``tokens.parquet`` rows of attempts [a, b); ``t``: their chunk times (default: all)."""
        b = len(self.c_status) if b is None else b
        counts = np.frombuffer(self.c_ntok[a:b], dtype=np.int64) if b > a else np.zeros(0, dtype=np.int64)
        total = int(counts.sum())
        t = np.frombuffer(self.tok_t, dtype=np.float64).copy() if t is None else np.frombuffer(t, dtype=np.float64)
        if len(t) != total:
            raise AssertionError("token times out of step with the records")
        rid = np.repeat(np.frombuffer(self.c_rid[a:b], dtype=np.int64) if b > a else counts, counts)
        att = np.repeat(np.frombuffer(self.c_att[a:b], dtype=np.int64) if b > a else counts, counts)
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        index = np.arange(total, dtype=np.int64) - starts
        return {"request_id": rid, "attempt": att, "index": index, "t_s": t}

    def _write_guarded(self, a: int, b: int, t) -> None:
        """:meth:`_write_batch` in the writer thread; the first failure (a full disk, ``ENOSPC``)
        stops every later write (a failed write may leave a cut batch at the journal's end,
        which its reader skips, so nothing may follow it) and is kept in ``write_error`` for the
        loop, which stops the run."""
        if self.write_error is not None:
            return
        try:
            self._write_batch(a, b, t)
        except Exception as e:  # noqa: BLE001 - reported by the loop as the run's error
            what = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
            self.write_error = f"cannot write records to {self.out_dir} ({what})"
            return
        self.written += b - a

    def _write_batch(self, a: int, b: int, t) -> None:
        """Append attempts [a, b) to the Parquet files (runs in a worker thread): their token times
        first, so that a client killed between the two writes never leaves a record without them."""
        tc = self.token_columns(a, b, t)
        if len(tc["t_s"]):
            import pyarrow as pa

            self.tok_writer.write_table(pa.table(tc, schema=_TOKEN_SCHEMA()))
        self.writer.write("requests", self.columns(a, b))

    async def flush(self) -> None:
        """Write the attempts finished since the last flush (in a thread: the loop keeps sending).

        Writes go to one dedicated writer thread, in order, and the slice is marked flushed as
        soon as it is handed over: a flush cancelled while its write runs (the run ending, an
        interrupt) neither writes its rows twice nor lets a second write touch the Parquet
        writer at the same time (pyarrow's writers are not thread-safe: that crashed the process).
        """
        if self.writer is None:
            return
        async with self.flush_lock:
            a, b = self.flushed, len(self.c_status)
            if b > a:
                ta, tb = self.tok_flushed, len(self.tok_t)
                t = self.tok_t[ta:tb]  # a copy taken on the loop's thread (the array keeps growing)
                self.flushed, self.tok_flushed = b, tb
                fut = self._write_pool().submit(self._write_guarded, a, b, t)
                self._last_write = fut
                # shielded: cancelling this wait must not cancel a write still queued
                await asyncio.shield(asyncio.wrap_future(fut, loop=self.loop))
            if self.write_error is not None and not self.stopping:
                t_s = _pc() - self.t0
                self.abort(f"{self.write_error} at t = {t_s:.3f} s; the run stopped")

    def _write_pool(self):
        if self._wexec is None:
            from concurrent.futures import ThreadPoolExecutor

            self._wexec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmqueue-writer")
        return self._wexec

    def _drain_writes(self) -> None:
        """Wait for every handed-over write to finish (before the files are closed)."""
        if self._wexec is not None:
            self._wexec.shutdown(wait=True)
            self._wexec = None
        self._last_write = None

    async def flusher(self, bar) -> None:
        done_shown = 0
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()
            if bar is not None:
                done = self.finished_requests()
                bar.update(done - done_shown)
                done_shown = done
                bar.set_postfix(in_flight=self.n_inflight, refresh=False)

    def finished_requests(self) -> int:
        return self._finished

    # -- sending ---------------------------------------------------------------------------------
    async def sleep_until(self, t_rel: float) -> None:
        """Return at (never before) ``t0 + t_rel``.

        The loop's timers tick in milliseconds (uvloop rounds a delay to the nearest tick), which
        sets how the wait ends (``spin_s``):

        - ``None`` (default): sleep to the nearest tick; if that is before the intended time,
          poll the clock for the rest (under half a millisecond), one loop pass at a time, so
          answers are still read and time-stamped meanwhile. Late by a few tenths of a ms.
        - ``0``: sleep to the first tick at or after the intended time: late by up to ~1 ms, no
          CPU spent waiting (the better choice when the client shares few cores with a server
          under heavy load).
        - ``> 0``: sleep to ``spin_s`` before the intended time, then poll.
        """
        target = self.t0 + t_rel
        spin = self.spin_s
        if spin is None:
            while True:
                d = target - _pc()
                if d <= 0:
                    return
                await asyncio.sleep(d)
        elif spin <= 0:
            pad = self._tick_pad
            while True:
                d = target - _pc()
                if d <= 0:
                    return
                await asyncio.sleep(d + pad)
        else:
            while True:
                d = target - _pc()
                if d <= 0:
                    return
                await asyncio.sleep(d - spin if d > spin else 0)

    async def schedule(self) -> None:
        arr = self.arrivals
        t0 = self.t0
        body = self.prompts.body
        create = asyncio.get_running_loop().create_task
        inflight = self.inflight
        discard = inflight.discard
        for i in range(len(arr)):
            if self.stopping:
                return
            b = body(i)
            if t0 + arr[i] > _pc():
                await self.sleep_until(arr[i])
                if self.stopping:
                    return
            task = create(self.request(i, b))
            inflight.add(task)
            task.add_done_callback(discard)
            self.sent_first += 1

    async def request(self, i: int, body: bytes) -> None:
        attempt = 1
        t_int = self.arrivals[i]
        rid = self.ids[i]
        self.n_inflight += 1
        if self.n_inflight > self.max_inflight:
            self.max_inflight = self.n_inflight
        try:
            while True:
                status, fin = await self.attempt(i, attempt, t_int, body)
                if status in ("ok", "unfinished", "cancelled") or self.retry is None:
                    return
                try:
                    t_next = self.retry(rid, attempt, status, fin)
                except Exception as e:  # noqa: BLE001 - a bad retry function must not end the run
                    note = f"retry function failed ({type(e).__name__}: {e}); no retries after it"
                    if note not in self.notes:
                        self.notes.append(note)
                    return
                if t_next is None:
                    return
                if self.stopping:
                    self.retries_dropped += 1
                    return
                attempt += 1
                t_int = float(t_next)
                try:
                    await self.sleep_until(t_int)
                except asyncio.CancelledError:
                    if not self.cancel_inflight:
                        raise
                    self.retries_dropped += 1
                    return
                if self.stopping:
                    self.retries_dropped += 1
                    return
        finally:
            self.n_inflight -= 1
            self._finished += 1

    async def attempt(self, i: int, attempt: int, t_int: float, body: bytes):
        """Send one attempt and record it; returns ``(status, finish_s)``."""
        t0 = self.t0
        sched = _pc() - t0
        k = self.cls_idx[i]
        deadline = t_int + self.timeouts[k]
        ttft_deadline = t_int + self.ttft_timeouts[k]
        first_deadline = deadline if deadline <= ttft_deadline else ttft_deadline
        ex = _Exchange(t0, self.prompts.s[i])
        disp = math.nan
        status = "error"
        err = None
        loop = self.loop
        task = None
        if first_deadline != math.inf:
            # one timer per attempt (cheaper than asyncio.timeout); it fails the exchange, or
            # cancels the task while it waits for a slot or a connection
            task = ex.task = asyncio.current_task()
            ex.timer = loop.call_at(loop.time() + (t0 + first_deadline - _pc()), ex.expire)
            if ttft_deadline < deadline and deadline != math.inf:
                ex.later = (deadline, loop)
        acquired = False
        try:
            if self.sem is not None:
                await self.sem.acquire()
                acquired = True
            disp = _pc() - t0
            await self.pool.exchange(ex, body)
            status, err = ex.outcome()
        except _Expired:
            status = "timeout"
        except asyncio.CancelledError:
            ex.abandon()
            if ex.expired:
                task.uncancel()
                status = "timeout"
            elif self.cancel_inflight:
                status = self.cancel_status
                if status == "cancelled":  # the drain cap: the client gave up on it, now
                    ex.fin = _pc() - t0
                    err = "cancelled at the drain cap"
                else:
                    ex.fin = math.nan
                    err = "in flight when the run stopped"
            else:
                raise
        except _StreamError as e:
            status = "error"
            if ex.fin != ex.fin:
                ex.fin = _pc() - t0
            err = str(e)
            if err == "response cut short":
                self.connection_failed()
        except OSError as e:  # connect failures, resets
            status = "error"
            if ex.fin != ex.fin:
                ex.fin = _pc() - t0
            err = _conn_message(e)
            self.connection_failed()
        except Exception as e:  # noqa: BLE001 - anything else is this attempt's error, not the run's
            ex.abandon()
            status = "error"
            if ex.fin != ex.fin:
                ex.fin = _pc() - t0
            err = f"{type(e).__name__}: {str(e)[:80]}"
        finally:
            if ex.timer is not None:
                ex.timer.cancel()
            if acquired:
                self.sem.release()
        if status == "timeout":
            first = ex.first
            ex.fin = deadline if (first == first or deadline <= ttft_deadline) else ttft_deadline
            err = "client timeout" if ex.fin == deadline else "client TTFT timeout"
        if ex.http_status is not None and err != "response cut short":
            self.conn_fail_streak = 0
        fin = ex.fin
        if fin == fin and fin < t_int:  # only a clock oddity could do this; keep the schema's order
            fin = t_int
        if err is not None:
            self.errors[err] += 1
        ot = ex.ot if ex.ot is not None else len(ex.toks)
        if status == "ok" and ot > self.prompts.o[i]:
            self.more_than_asked(i, ot)
        self.record(i, attempt, t_int, sched, disp, ex.first, fin, ex.pt, ot, ex.cached, status, ex.toks)
        return status, fin

    def more_than_asked(self, i: int, ot: int) -> None:
        """An ok attempt with more output tokens than its ``max_tokens``: kept as ok (the server
        did serve it and its times are real), counted in ``summary["warnings"]`` with a note."""
        self.warnings[_OVER_ASKED] += 1
        asked = self.prompts.o[i]
        r = ot / asked if asked > 0 else math.inf
        if r > self.over_asked[0]:
            self.over_asked = (r, (self.ids[i], ot, asked))

    def connection_failed(self) -> None:
        self.conn_fail_streak += 1
        if self.conn_fail_streak >= self.abort_after and not self.probing and not self.stopping:
            self.probing = True
            self.loop.create_task(self.probe())

    async def probe(self) -> None:
        """After repeated connection failures: is anything listening? If nothing is (connection
        refused, host unreachable), stop the run. A connect that only times out is an overloaded
        server, and a client out of file descriptors is the client's problem: neither stops it."""
        import errno

        host, port = self.pool.addr if self.pool.addr else (self.host, self.port)
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
            w.close()
            self.conn_fail_streak = 0
        except (ConnectionRefusedError, ConnectionResetError) as e:
            self._abort_unreachable(e)
        except OSError as e:
            if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED):
                self._abort_unreachable(e)
            elif e.errno in (errno.EMFILE, errno.ENFILE):
                note = ("the client ran out of file descriptors (open connections); raise `ulimit -n` "
                        "or lower the rate")
                if note not in self.notes:
                    self.notes.append(note)
            self.conn_fail_streak = 0
        except asyncio.TimeoutError:
            self.conn_fail_streak = 0
        finally:
            self.probing = False

    def _abort_unreachable(self, e: BaseException) -> None:
        t = _pc() - self.t0
        self.abort(f"server {_base_url(self.post_url)} stopped accepting connections at t = {t:.3f} s "
                   f"({_conn_message(e)})")

    def abort(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.error = reason
        if self.sched_task is not None and not self.sched_task.done():
            self.sched_task.cancel()

    # -- the whole run ----------------------------------------------------------------------------
    async def main(self) -> BenchResult:
        self.loop = asyncio.get_running_loop()
        # uvloop rounds timer delays to the nearest millisecond: half a tick more makes a sleep
        # end at or after its target (asyncio's own loop already rounds up)
        self._tick_pad = 0.0005 if type(self.loop).__module__.startswith("uvloop") else 0.0
        self.pool = _Pool(self.loop, self.post_url, self.headers, proxy=self.proxy)
        await self.preflight()
        self.flush_lock = asyncio.Lock()
        bar = sampler = flusher = None
        frozen = False
        try:
            if self.warmup_requests:
                await self.warm_up()
            self.open_files()
            bar = self.progress_bar()
            if self.metrics_url:  # import the sampler's modules now, not in its thread during the run
                try:
                    import httpx  # noqa: F401

                    import llmqueue.bench.prom  # noqa: F401
                except ImportError:
                    pass
            # Objects alive now (modules, the request stream) never become garbage during the
            # run: freezing them keeps the collector's full passes short (tens of ms otherwise,
            # each a pause of every send).
            gc.collect()
            gc.freeze()
            frozen = True
            # The writer thread holds the GIL in short stretches; hand it back to the sender
            # within 0.5 ms instead of Python's default 5 ms.
            switch = sys.getswitchinterval()
            sys.setswitchinterval(min(switch, 0.0005))
            sampler = self.start_sampler()  # its first scrape (the counters' baseline) comes before any send
            self.t0 = _pc()
            self.t0_epoch = time.time()
            if sampler is not None:
                sampler.start(t0=self.t0)
            flusher = asyncio.get_running_loop().create_task(self.flusher(bar))
            self.sched_task = asyncio.get_running_loop().create_task(self.schedule())
            try:
                await asyncio.shield(self.sched_task)
            except asyncio.CancelledError:
                if not self.sched_task.cancelled() and not self.sched_task.done():
                    raise  # we were cancelled (interrupt), not the scheduler
            await self.wait_inflight()
        except asyncio.CancelledError:
            # SIGINT/SIGTERM: stop sending, end what is in flight as unfinished, keep the records.
            self.interrupted = True
            self.stopping = True
            if self.error is None:
                self.error = "interrupted"
            if self.sched_task is not None:
                self.sched_task.cancel()
            await self.cancel_all()
        finally:
            t_end = _pc() - self.t0 if self.t0 else 0.0
            if flusher is not None:
                flusher.cancel()
                try:
                    await flusher
                except asyncio.CancelledError:
                    pass
            await self.flush()
            if bar is not None:
                bar.update(self.finished_requests() - bar.n)
                bar.close()
            self.pool.close()
            ts = server = metrics = None
            if sampler is not None:
                ts, server, metrics = self.stop_sampler(sampler)
            self.close_files(complete=not self.interrupted and self.error is None)
            if frozen:
                gc.unfreeze()
                sys.setswitchinterval(switch)
        return self.result(t_end, ts, server, metrics)

    async def wait_inflight(self) -> None:
        drain_end = None if self.drain_timeout_s is None else _pc() + self.drain_timeout_s
        while self.inflight:
            if self.stopping:
                done, pending = await asyncio.wait(set(self.inflight), timeout=self.abort_grace_s)
                if pending:
                    await self.cancel_all()
                return
            wait = 0.5
            if drain_end is not None:
                left = drain_end - _pc()
                if left <= 0:  # the drain cap: what is still in flight is cancelled by the client
                    self.cancel_status = "cancelled"
                    self.drain_cancelled = len(self.inflight)
                    self.notes.append(f"{self.drain_cancelled} request(s) still in flight {self.drain_timeout_s:g} s "
                                      "after the last send (the drain cap) were cancelled: status cancelled")
                    await self.cancel_all()
                    return
                wait = min(wait, left)
            await asyncio.wait(set(self.inflight), timeout=wait)  # wake up to notice an abort

    async def cancel_all(self) -> None:
        self.cancel_inflight = True
        tasks = set(self.inflight)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def preflight(self) -> None:
        try:
            await asyncio.wait_for(self.pool.resolve(), 10.0)
            c, _ = await asyncio.wait_for(self.pool.acquire(), 10.0)
            self.pool.idle.append(c)
        except (OSError, asyncio.TimeoutError) as e:
            raise BenchConnectError(_base_url(self.post_url), _conn_message(e)) from None

    async def warm_up(self) -> None:
        """Send ``warmup_requests`` requests one after another before the run (not recorded)."""
        n = len(self.arrivals)
        t0 = _pc()
        for j in range(self.warmup_requests):
            ex = _Exchange(t0, 0)
            try:
                await asyncio.wait_for(self.pool.exchange(ex, self.prompts.body(j % n)), 600)
                status, err = ex.outcome()
            except Exception as e:  # noqa: BLE001 - the run itself will say what is wrong
                ex.abandon()
                status, err = "error", _conn_message(e)
            if status != "ok":
                self.notes.append(f"warm-up request {j}: {status} ({err})")

    def progress_bar(self):
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=len(self.arrivals), unit="req", mininterval=0.5, leave=False, dynamic_ncols=True,
                    desc="bench")

    # -- files ---------------------------------------------------------------------------------
    def open_files(self) -> None:
        if self.out_dir is None:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        from llmqueue.records import RunWriter

        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / ".llmqueue-write-test").touch()
            (self.out_dir / ".llmqueue-write-test").unlink()
        except OSError as e:
            raise InputError("out_dir", f"cannot write to {self.out_dir} ({e.strerror or e})") from None
        r = self.requests
        wl = pa.table({"request_id": pa.array(r.request_id, pa.int64()),
                       "class": pa.array(r.class_name.astype(str), pa.string()),
                       "arrival_s": pa.array(r.arrival_s, pa.float64()),
                       "prompt_tokens": pa.array(r.prompt_tokens, pa.int64()),
                       "output_tokens": pa.array(r.output_tokens, pa.int64())})
        if self.prompts.hash_ids is not None:   # the prompts' prefix-block hashes, for validate's simulation
            wl = wl.append_column("hash_ids", pa.array(self.prompts.hash_ids, pa.list_(pa.int64())))
            wl = wl.replace_schema_metadata({b"llmqueue.hash_block_tokens": str(self.prompts.H).encode()})
        from llmqueue.records.journal import ParquetJournal

        try:
            pq.write_table(wl, self.out_dir / WORKLOAD_FILE)
            self.writer = RunWriter(self.out_dir, journal=True)  # a client killed outright loses no written batch
            self.writer.writer("requests")
            self.tok_writer = ParquetJournal(self.out_dir / TOKENS_FILE, _TOKEN_SCHEMA())
        except OSError as e:
            raise InputError("out_dir", f"cannot write to {self.out_dir} ({e.strerror or e})",
                             "free some space or choose another --out") from None
        self._prewarm_writers()

    def _prewarm_writers(self) -> None:
        """Run the write path (the journals' Arrow IPC writes) once on a throwaway buffer, so that
        the first flush of the run does not pay for lazy imports and set-up (tens of ms holding
        the GIL). The Parquet files are written at the end, off the sending path."""
        import pyarrow as pa

        from llmqueue.records import RequestRecords, arrow_schema

        row = {"request_id": [0], "class": ["x"], "arrival_s": [0.0], "dispatched_s": [0.0],
               "first_scheduled_s": [math.nan], "first_token_s": [0.0], "finish_s": [0.0], "prompt_tokens": [1],
               "output_tokens": [1], "cached_prompt_tokens": [0], "status": ["ok"], "preemptions": [0],
               "replica": [0], "attempt": [1]}
        tok = pa.table({"request_id": [0], "attempt": [1], "index": [0], "t_s": [0.0]}, schema=_TOKEN_SCHEMA())
        for schema, table in ((arrow_schema("requests"), RequestRecords.from_columns(row).to_arrow()),
                              (_TOKEN_SCHEMA(), tok)):
            w = pa.ipc.new_stream(pa.BufferOutputStream(), schema)
            w.write_table(table)
            w.close()

    def close_files(self, complete: bool) -> None:
        """Close the journals (each becomes its Parquet file). A close that fails (a full disk)
        leaves that journal in place, readable: it is the run's error, never an exception."""
        self._drain_writes()
        if self.write_error is not None:
            complete = False
            if self.error is None:  # found only now (the last flush's wait was cut short)
                self.error = f"{self.write_error}; the run stopped"
        for w in (self.writer, self.tok_writer):
            if w is None:
                continue
            try:
                if w is self.writer:
                    w.close(complete=complete)
                else:
                    w.close()
            except OSError as e:
                self.disk_failed(e, "the journals stay in place, readable")

    def disk_failed(self, e: OSError, kept: str) -> None:
        """A file of the run could not be written after the run (a full disk): the run's error
        (the first one is kept), one line."""
        reason = f"cannot write to {self.out_dir} ({e.strerror or e}); {kept}"
        if self.error is None:
            self.error = reason
        elif reason not in self.notes:
            self.notes.append(reason)

    def start_sampler(self):
        """The /metrics hook: :class:`llmqueue.bench.prom.MetricsSampler` (a thread scraping the
        server's Prometheus metrics every ``metrics_interval_s``), on the run's clock (``t0``).

        It scrapes once here, before the first request is sent: the server counters' growth
        (``server_counters``) is measured from that baseline, so it covers every request of the
        run even when the polling thread's first scrape comes late. The caller starts the
        thread (``start(t0=...)``)."""
        if not self.metrics_url:
            return None
        try:
            from llmqueue.bench.prom import MetricsSampler
        except ImportError:
            self.notes.append("--metrics-url given but llmqueue.bench.prom.MetricsSampler is not available: "
                              "no server time series")
            return None
        try:
            s = MetricsSampler(self.metrics_url, interval_s=self.metrics_interval_s, clock=_pc)
            s.sample_once()
            return s
        except Exception as e:  # noqa: BLE001 - the sampler is optional
            self.notes.append(f"metrics sampler did not start: {e}")
            return None

    def stop_sampler(self, s):
        """Stop the sampler: its time series, what the server said about itself (server.json), and
        every sampled column (metrics.parquet)."""
        ts = server = cols = None
        try:
            s.stop(finished_at_least=int(sum(st == "ok" for st in self.c_status)))
            if len(getattr(s, "rows", ())):
                ts = s.to_timeseries()
                cols = s.to_columns()
            cc = getattr(s, "cache_config", None)
            if cc is not None:
                from llmqueue.bench.server_info import from_cache_config

                # every cache_config_info label, typed, each with its source (server_info)
                labels = from_cache_config(cc.labels)
                server = {"metrics_url": self.metrics_url, **labels, "num_gpu_blocks": cc.num_gpu_blocks,
                          "block_size": cc.block_size, "M": cc.M, "M_usable": cc.M_usable,
                          "cache_config_info": dict(cc.labels),
                          "sources": {k: "metrics" for k in (*labels, "num_gpu_blocks", "block_size")}}
            if getattr(s, "errors", 0):
                self.notes.append(f"metrics sampler: {s.errors} failed scrape(s) ({s.last_error})")
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"metrics sampler failed: {e}")
        return ts, server, cols

    # -- the result ----------------------------------------------------------------------------
    def result(self, t_end: float, ts=None, server=None, metrics=None) -> BenchResult:
        from llmqueue.records import RequestRecords, TimeSeries

        cols = self.columns()
        order = np.lexsort((cols["attempt"], cols["request_id"]))  # the file keeps completion order
        recs = RequestRecords.from_columns({k: v[order] for k, v in cols.items()})
        self.s_sched = np.frombuffer(self.c_sched, dtype=np.float64)[order] if len(order) else np.zeros(0)
        n_tok = np.frombuffer(self.c_ntok, dtype=np.int64) if len(order) else np.zeros(0, dtype=np.int64)
        self.s_ntok = n_tok[order]
        self.s_tokoff = (np.cumsum(n_tok) - n_tok)[order]
        tokens = self.token_columns()
        if ts is not None and not isinstance(ts, TimeSeries):
            try:
                ts = TimeSeries.from_columns(ts)
            except LlmqueueError as e:
                self.notes.append(f"metrics time series unusable: {e}")
                ts = None
        if ts is not None and len(ts) == 0:
            ts = None
        summary = self.summarize(recs, t_end, ts, kv_capacity=(server or {}).get("M"))
        if metrics:
            from llmqueue.bench.prom import counter_deltas, write_metrics

            summary["server_counters"] = counter_deltas(metrics)
        if self.out_dir is not None:
            from llmqueue.records import dump_summary, write_records

            try:
                if ts is not None:
                    write_records(self.out_dir / "timeseries.parquet", ts)
                if metrics:
                    write_metrics(self.out_dir / METRICS_FILE, metrics)
                if server:
                    (self.out_dir / SERVER_FILE).write_text(json.dumps(server, indent=2, default=str) + "\n")
                dump_summary(self.out_dir / "summary.json", summary)
            except OSError as e:
                self.disk_failed(e, "no summary.json (the records written stay readable)")
        return BenchResult(records=recs, summary=summary, tokens=tokens, error=self.error,
                           interrupted=self.interrupted, out_dir=self.out_dir, notes=list(self.notes),
                           written=self.written)

    def summarize(self, recs, t_end: float, ts, kv_capacity: float | None = None) -> dict:
        from llmqueue.metrics import summarize

        n = len(recs)
        arr = recs["arrival_s"]
        status = recs["status"]
        horizon = max(t_end, float(np.nanmax(recs["finish_s"])) if n and np.isfinite(recs["finish_s"]).any()
                      else t_end, float(arr.max()) if n else 0.0)
        warm = self.warmup_s
        if not horizon > warm:
            self.notes.append(f"warm-up {warm:g} s is not shorter than the run ({horizon:.3g} s): ignored")
            warm = 0.0
        if not horizon > 0:
            horizon = 1e-9
        # ITL: vLLM's inter-chunk gaps of the ok attempts arriving in the window, in time order
        ok = (status == "ok") & (arr >= warm) & (arr < horizon)
        counts = self.s_ntok
        offs = self.s_tokoff
        tt = np.frombuffer(self.tok_t, dtype=np.float64)
        gaps_t, gaps = [], []
        for r in np.flatnonzero(ok & (counts > 1)).tolist():
            t = tt[offs[r]:offs[r] + counts[r]]
            gaps_t.append(t[1:])
            gaps.append(np.diff(t))
        if gaps:
            gt = np.concatenate(gaps_t)
            itl = np.concatenate(gaps)[np.argsort(gt, kind="stable")]
        else:
            itl = np.zeros(0)
        # kv_capacity: the server's cache_config_info M, for kv_utilization
        # the vLLM-named latencies count from the actual send (dispatched_s), as vLLM's do; the
        # same from the intended time go to s["from_intended"]
        s = summarize(recs, timeseries=ts, warmup_s=warm, horizon_s=horizon, slos=self.slos, itl_s=itl,
                      kv_capacity=kv_capacity, send_s=recs["dispatched_s"], **self.summary_options)
        s["itl_source"] = "client: gaps between streamed chunks (vllm bench serve's ITL)"
        s["client"] = self.client_checks(recs)
        load = ("open-loop" if not self.concurrency else
                f"closed-loop: at most {self.concurrency} requests in flight (a request waits in the client "
                "for a slot; latencies count from its actual send, as vLLM's do; from_intended includes that wait)")
        a1 = np.asarray(self.requests.arrival_s)
        s["max_concurrency"] = self.concurrency
        s["request_rate"] = (len(a1) / float(a1[-1]) if len(a1) > 1 and a1[-1] > 0 else None)
        # vLLM's: the peak number of successful requests between their send and their last token
        s["max_concurrent_requests"] = peak_concurrency(recs["dispatched_s"][status == "ok"],
                                                        recs["finish_s"][status == "ok"])
        s["max_in_flight_client"] = self.max_inflight  # the client's own peak (waiting for a slot included)
        s["not_sent"] = len(self.arrivals) - self.sent_first
        s["retries_not_sent"] = self.retries_dropped
        s["attempts"] = n
        s["errors"] = dict(self.errors.most_common(20))
        s["warnings"] = dict(self.warnings)
        if self.warnings[_OVER_ASKED]:
            r, (rid, got, asked) = self.over_asked
            note = (f"{self.warnings[_OVER_ASKED]} ok attempt(s) got more output tokens than max_tokens asked for "
                    f"(at most {r:.3g}x: request {rid} got {got} for {asked}); kept as ok, with the server's count")
            if note not in self.notes:
                self.notes.append(note)
        s["bench"] = {
            "url": self.post_url, "model": self.model, "endpoint": self.endpoint, "load": load,
            "closed_loop": bool(self.concurrency), "concurrency": self.concurrency, "requests": len(self.arrivals),
            "seed": self.seed,
            "prompt": ("dataset text (usage counts)" if self.prompts.texts is not None else
                       "token ids" if self.endpoint == "completions" else "text (usage counts)"),
            "exact_output": self.prompts.exact, "stopped_early": self.error, "interrupted": self.interrupted,
            "metrics_url": self.metrics_url, "t0_epoch_s": self.t0_epoch, "t_end_s": t_end,
            "drain_timeout_s": self.drain_timeout_s, "drain_cancelled": self.drain_cancelled,
            # the client's deadlines per class (a replay applies them: validate)
            "timeout_s": {c: v for c, v in zip(self.classes, self.timeouts) if math.isfinite(v)},
            "ttft_timeout_s": {c: v for c, v in zip(self.classes, self.ttft_timeouts) if math.isfinite(v)},
            "retries": self.retry is not None,
            "prefix_hashes": (None if self.prompts.hash_ids is None else
                              {"block_tokens": self.prompts.H,
                               "requests": sum(1 for h in self.prompts.hash_ids if h)}),
        }
        if self.notes:
            s["notes"] = list(self.notes)
        return s

    def client_checks(self, recs) -> dict:
        """Scheduling lag and whether the realized arrivals follow the intended ones."""
        arr = recs["arrival_s"]
        sched = self.s_sched
        first = recs["attempt"] == 1
        out = arrival_check(arr[first], sched[first])
        out["attempts"] = int(len(arr))
        if (~first).any():
            lag = sched[~first] - arr[~first]
            out["retry_lag_ms"] = {"p50": 1e3 * float(np.percentile(lag, 50)),
                                   "p99": 1e3 * float(np.percentile(lag, 99)), "max": 1e3 * float(lag.max())}
        wait = recs["dispatched_s"] - sched
        if self.concurrency and np.isfinite(wait).any():
            w = wait[np.isfinite(wait)]
            out["client_queue_ms"] = {"mean": 1e3 * float(w.mean()), "p50": 1e3 * float(np.percentile(w, 50)),
                                      "p99": 1e3 * float(np.percentile(w, 99)), "max": 1e3 * float(w.max())}
        return out


def arrival_check(intended, realized, *, lag_tolerance_ms: float | None = None, alpha: float = 0.01) -> dict:
    """Did the client send on schedule? ``intended`` and ``realized`` send times (s) of the same requests.

    - ``lag_ms``: percentiles of the scheduling lag ``realized - intended`` (mean, p50, p90, p99,
      p99.9, max); ``late_over_1ms`` / ``late_over_10ms``: fractions; ``lag_trend_ms_per_s``: the
      least-squares slope of the lag against the intended time (a client falling behind drifts);
    - ``ks_gaps``: two-sample Kolmogorov-Smirnov test of the realized inter-arrival gaps against
      the intended ones (``statistic`` D, ``pvalue``), and the p99 of the per-gap error
      ``|realized gap - intended gap|``.

    ``arrivals_ok`` is true when the p99 lag is at most ``lag_tolerance_ms`` (default 2 ms) and
    the gaps pass the KS test at level ``alpha``, or fail it only by sub-tolerance jitter (p99 gap
    error <= the tolerance: a KS test on many gaps detects any jitter at all, e.g. on
    deterministic arrivals, whose intended gaps are all equal).
    """
    tol = LAG_TOLERANCE_MS if lag_tolerance_ms is None else float(lag_tolerance_ms)
    a = np.asarray(intended, dtype=np.float64)
    r = np.asarray(realized, dtype=np.float64)
    if a.shape != r.shape:
        raise InputError("realized", f"needs one time per intended time ({r.shape} vs {a.shape})")
    out: dict = {"requests": int(len(a))}
    order = np.argsort(a, kind="stable")
    a, r = a[order], r[order]
    lag = r - a
    if len(lag):
        out["lag_ms"] = {"mean": 1e3 * float(lag.mean()),
                         **{f"p{_pw(q)}": 1e3 * float(np.percentile(lag, q)) for q in (50, 90, 99, 99.9)},
                         "max": 1e3 * float(lag.max())}
        out["late_over_1ms"] = float(np.mean(lag > 1e-3))
        out["late_over_10ms"] = float(np.mean(lag > 1e-2))
        out["lag_trend_ms_per_s"] = (1e3 * float(np.polyfit(a, lag, 1)[0])
                                     if len(a) > 2 and np.ptp(a) > 0 else None)
    else:
        out["lag_ms"] = None
    ks = None
    if len(a) >= 3:
        ga = np.diff(a)
        gr = np.diff(np.sort(r))
        stat, pvalue = ks_2samp(ga, gr)
        err = np.abs(np.diff(r) - ga)
        ks = {"statistic": stat, "pvalue": pvalue, "n": int(len(ga)),
              "mean_gap_intended_ms": 1e3 * float(ga.mean()), "mean_gap_realized_ms": 1e3 * float(gr.mean()),
              "p99_gap_error_ms": 1e3 * float(np.percentile(err, 99))}
    out["ks_gaps"] = ks
    problems = []
    p99 = out["lag_ms"]["p99"] if out["lag_ms"] else None
    if p99 is not None and p99 > tol:
        problems.append(f"p99 scheduling lag {p99:.2f} ms > {tol:g} ms")
    if ks is not None and ks["pvalue"] < alpha and ks["p99_gap_error_ms"] > tol:
        problems.append(f"realized inter-arrival gaps differ from the intended ones (KS D = "
                        f"{ks['statistic']:.3f}, p = {ks['pvalue']:.2g})")
    out["arrivals_ok"] = not problems
    out["verdict"] = "ok: sent on schedule" if not problems else "client fell behind: " + "; ".join(problems)
    out["rule"] = (f"ok when p99 lag <= {tol:g} ms and the realized gaps pass a KS two-sample test against the "
                   f"intended ones at {alpha:g} (or differ from them by <= {tol:g} ms at p99: a KS test on many "
                   "gaps flags any jitter, e.g. on deterministic arrivals)")
    return out


LAG_TOLERANCE_MS = 2.0


def ks_2samp(x, y) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov test of realized against intended gaps: ``(D, p)``,
    two-sided, asymptotic p-value (``scipy.stats.ks_2samp``, imported when a run ends)."""
    from scipy.stats import ks_2samp as _ks

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size == 0 or y.size == 0:
        return math.nan, math.nan
    r = _ks(x, y, method="asymp")
    return float(r.statistic), float(r.pvalue)


def peak_concurrency(start, end) -> int:
    """The most intervals ``[start, end)`` open at once (an end before a start at the same time)."""
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    m = np.isfinite(start) & np.isfinite(end)
    t = np.concatenate([start[m], end[m]])
    d = np.concatenate([np.ones(int(m.sum()), dtype=np.int64), -np.ones(int(m.sum()), dtype=np.int64)])
    if not len(t):
        return 0
    order = np.lexsort((d, t))
    return int(max(0, np.cumsum(d[order]).max()))


def _pw(q) -> str:
    return str(int(q)) if int(q) == q else str(q)


def _role_only(choices) -> bool:
    """A chat chunk that only announces the role (no content, reasoning or tool call): not a token."""
    c = choices[0]
    delta = c.get("delta") if type(c) is dict else None
    if type(delta) is not dict or "role" not in delta or c.get("finish_reason"):
        return False
    return not any(delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls"))


_DONE_DATA = object()
_NO_DATA = object()


def _odd_data(ev: bytes):
    """An event's data that ``json.loads`` refused: ``[DONE]`` with spaces around it, nothing but
    spaces (a keep-alive), or JSON that is not valid UTF-8 (read as the WHATWG decoder reads
    it: bad bytes become U+FFFD). None: not JSON."""
    s = ev.strip()
    if s == b"[DONE]":
        return _DONE_DATA
    if not s:
        return _NO_DATA
    try:
        return json.loads(ev.decode("utf-8", "replace"))
    except ValueError:
        return None


def _error_text(ev: bytes) -> str:
    """``": message"`` of an ``error`` event's data (JSON with a message, or text), or ``""``."""
    try:
        d = json.loads(ev)
    except ValueError:
        msg = ev.decode("utf-8", "replace").strip()
    else:
        e = d.get("error", d) if isinstance(d, dict) else d
        msg = str(e.get("message", "") if isinstance(e, dict) else e)
    msg = msg[:80]
    return f": {msg}" if msg else ""


def _conn_message(e: BaseException) -> str:
    name = type(e).__name__
    s = str(e)
    if isinstance(e, _Lost):
        return "server disconnected"
    if isinstance(e, ConnectionRefusedError) or "Connect call failed" in s or "Connection refused" in s:
        return "connection refused"
    if name == "ServerDisconnectedError":
        return "server disconnected"
    if isinstance(e, ConnectionResetError) or "reset by peer" in s:
        return "connection reset"
    if isinstance(e, asyncio.TimeoutError):
        return "connect timeout"
    if name == "ClientPayloadError":
        return "response cut short"
    return f"{name}: {s[:80]}" if s else name


def _TOKEN_SCHEMA():
    import pyarrow as pa

    return pa.schema([pa.field("request_id", pa.int64()), pa.field("attempt", pa.int64()),
                      pa.field("index", pa.int64()), pa.field("t_s", pa.float64())],
                     metadata={b"llmqueue.kind": b"tokens"})


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------

async def run_bench_async(url: str, model: str, requests, **kwargs) -> BenchResult:
    """:func:`run_bench` inside a running event loop."""
    run = _Run(url=url, model=model, requests=requests, **_options(url, **kwargs))
    return await run.main()


def _options(url: str, *, endpoint: str = "completions", out_dir=None, concurrency: int | None = None,
             timeout_s=DEFAULT_TIMEOUT_S, ttft_timeout_s=None, seed: int = 0, vocab_size: int | None = None,
             token_range: tuple[int, int] | None = None, retry=None, warmup_s: float = 0.0,
             warmup_requests: int = 0, progress: bool = False, metrics_url: str | None = None,
             metrics_interval_s: float = 1.0, flush_interval_s: float = 1.0, abort_after: int = 3,
             abort_grace_s: float = 5.0, spin_s: float | None = None, exact_output: bool = True,
             extra_body: Mapping | None = None, api_key: str | None = None, slos: dict | None = None,
             hash_ids=None, hash_block_tokens: int = 512, headers=None, proxy: str | None = None,
             trust_env: bool = False, allow_key_over_http_proxy: bool = False, percentiles=None,
             prompt_texts=None, drain_timeout_s: float | None = None) -> dict:
    if drain_timeout_s is not None and not (isinstance(drain_timeout_s, (int, float)) and drain_timeout_s >= 0
                                            and math.isfinite(drain_timeout_s)):
        raise InputError("drain_timeout", f"must be a finite number of seconds >= 0 (got {drain_timeout_s!r})")
    if endpoint not in ("completions", "chat"):
        raise InputError("endpoint", f"unknown endpoint {endpoint!r}", "use completions or chat")
    endpoint_url(url, endpoint)
    # what is sent, and through what: checked before anything is (see llmqueue.bench.credentials)
    headers = request_headers(api_key, headers)
    proxy = proxy_for(url, proxy=proxy, trust_env=trust_env)
    check_key_over_proxy(url, proxy, any(k.lower() == "authorization" for k in headers),
                         allow_key_over_http_proxy)
    if concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, (int, np.integer)) or concurrency < 1:
            raise InputError("concurrency", f"must be a positive integer (got {concurrency!r})")
        concurrency = int(concurrency)
    if token_range is None:
        token_range = token_id_range(vocab_size)
    elif vocab_size is not None:
        raise InputError("token_range", "give vocab_size or token_range, not both")
    for name, v in (("warmup_s", warmup_s), ("flush_interval_s", flush_interval_s), ("spin_s", spin_s or 0.0),
                    ("abort_grace_s", abort_grace_s), ("metrics_interval_s", metrics_interval_s)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise InputError(name, f"must be a finite number >= 0 (got {v!r})")
    if flush_interval_s <= 0:
        raise InputError("flush_interval_s", "must be > 0")
    if not isinstance(warmup_requests, (int, np.integer)) or warmup_requests < 0:
        raise InputError("warmup_requests", f"must be an integer >= 0 (got {warmup_requests!r})")
    if not isinstance(abort_after, int) or abort_after < 1:
        raise InputError("abort_after", f"must be a positive integer (got {abort_after!r})")
    return dict(endpoint=endpoint, out_dir=out_dir, concurrency=concurrency, timeout_s=timeout_s,
                ttft_timeout_s=ttft_timeout_s, seed=seed, token_range=token_range, retry=retry,
                warmup_s=float(warmup_s), warmup_requests=int(warmup_requests), progress=progress,
                metrics_url=metrics_url, metrics_interval_s=metrics_interval_s, flush_interval_s=flush_interval_s,
                abort_after=abort_after, abort_grace_s=abort_grace_s, spin_s=spin_s, exact_output=exact_output,
                extra_body=extra_body, headers=headers, slos=slos, hash_ids=hash_ids,
                hash_block_tokens=hash_block_tokens, proxy=proxy, percentiles=percentiles, prompt_texts=prompt_texts,
                drain_timeout_s=drain_timeout_s)


def run_bench(url: str, model: str, requests, *, endpoint: str = "completions", out_dir=None,
              concurrency: int | None = None, timeout_s=DEFAULT_TIMEOUT_S, ttft_timeout_s=None, seed: int = 0,
              vocab_size: int | None = None, token_range: tuple[int, int] | None = None, retry=None,
              warmup_s: float = 0.0, warmup_requests: int = 0, progress: bool = False,
              metrics_url: str | None = None, metrics_interval_s: float = 1.0, flush_interval_s: float = 1.0,
              abort_after: int = 3, abort_grace_s: float = 5.0, spin_s: float | None = None, exact_output: bool = True,
              extra_body: Mapping | None = None, api_key: str | None = None, slos: dict | None = None,
              hash_ids=None, hash_block_tokens: int = 512, headers=None, proxy: str | None = None,
              trust_env: bool = False, allow_key_over_http_proxy: bool = False, percentiles=None,
              prompt_texts=None, use_uvloop: bool = True, drain_timeout_s: float | None = None) -> BenchResult:
    """Send ``requests`` (a :class:`~llmqueue.workload.generate.RequestArrays`) to an
    OpenAI-compatible server on their open-loop schedule; return records and summary.

    ``url``: the server (``http://127.0.0.1:8000``; ``.../v1`` or a full endpoint URL also work).
    ``endpoint``: ``"completions"`` (token-id prompts, exact lengths) or ``"chat"`` (text).
    ``out_dir``: write ``requests.parquet`` (incrementally), ``tokens.parquet``,
    ``workload.parquet`` (the intended stream), ``summary.json`` (and ``timeseries.parquet`` /
    ``server.json`` from the metrics sampler). ``concurrency``: cap on requests in flight (makes
    the run closed-loop). ``timeout_s`` / ``ttft_timeout_s``: client deadlines from each attempt's
    intended send time (a number, None, or ``{class: seconds}``); status ``timeout``. ``seed``:
    prompt token draws and retry jitter. ``vocab_size`` or ``token_range``: where prompt ids come
    from (:func:`token_id_range`). ``retry``: a ``ClassMix``, ``ClientBehavior`` or
    ``decide(request_id, attempt, status, t_end)`` function (:mod:`llmqueue.workload.client`).
    ``warmup_s``: seconds left out of the statistics; ``warmup_requests``: requests sent one by
    one before the run, not recorded. ``slos``: targets for goodput (``summarize``'s ``slos``).
    ``hash_ids``: per request, its prompt's prefix-block hashes or None (a Mooncake trace's
    ``hash_ids``, ``hash_block_tokens`` tokens each): requests sharing leading hashes share that
    prompt prefix, so the server's prefix cache sees the trace's reuse.
    ``spin_s``: how a wait for a send time ends (the loop's timers tick in milliseconds):
    ``None`` (default) sleeps to the nearest tick and polls the clock for any rest (a few tenths
    of a ms late); ``0`` never polls (up to ~1 ms late, no CPU spent waiting: better when the
    client shares few cores with a busy server); ``> 0`` polls for the last ``spin_s`` seconds.
    ``api_key`` (sent as ``Authorization: Bearer``) and ``headers`` (a mapping, ``(name, value)``
    pairs or ``"Name: value"`` strings) go with every request, to ``url``'s origin only; values
    with CR, LF or NUL are refused. ``proxy`` (an ``http://`` URL) or ``trust_env`` (the
    ``*_proxy`` variables) route the requests through a proxy, which is never used otherwise; an
    API key through a proxy to a plain-http server is refused unless
    ``allow_key_over_http_proxy`` (:mod:`llmqueue.bench.credentials`). ``percentiles``: the
    summary's percentiles (default ``summarize``'s). ``prompt_texts``: one text prompt per request
    (a dataset's, :mod:`llmqueue.bench.datasets`), sent as text instead of token ids; the
    records keep the server's token counts. ``drain_timeout_s``: after the last intended send,
    wait at most this long for the answers; the client then cancels the attempts still in flight
    (or waiting for a concurrency slot), status ``cancelled`` with ``finish_s`` the cancel time
    (default: wait for every answer, up to each attempt's own timeout).
    See the module docstring for the rest.
    """
    opts = _options(url, endpoint=endpoint, out_dir=out_dir, concurrency=concurrency, timeout_s=timeout_s,
                    ttft_timeout_s=ttft_timeout_s, seed=seed, vocab_size=vocab_size, token_range=token_range,
                    retry=retry, warmup_s=warmup_s, warmup_requests=warmup_requests, progress=progress,
                    metrics_url=metrics_url, metrics_interval_s=metrics_interval_s,
                    flush_interval_s=flush_interval_s, abort_after=abort_after, abort_grace_s=abort_grace_s,
                    spin_s=spin_s, exact_output=exact_output, extra_body=extra_body, api_key=api_key, slos=slos,
                    hash_ids=hash_ids, hash_block_tokens=hash_block_tokens, headers=headers, proxy=proxy,
                    trust_env=trust_env, allow_key_over_http_proxy=allow_key_over_http_proxy,
                    percentiles=percentiles, prompt_texts=prompt_texts, drain_timeout_s=drain_timeout_s)
    if not isinstance(model, str) or not model:
        raise InputError("model", f"must be a non-empty model name (got {model!r})")
    if len(requests) == 0:
        raise InputError("requests", "the workload has no requests", "give --num-requests or a longer --duration")

    async def main():
        import signal

        run = _Run(url=url, model=model, requests=requests, **opts)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        try:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        try:
            return await run.main()
        finally:
            try:
                loop.remove_signal_handler(signal.SIGTERM)
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    _raise_fd_limit()
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            uvloop = None
        if uvloop is not None:
            return uvloop.run(main())
    return asyncio.run(main())


def _raise_fd_limit() -> None:
    """Open loop means one connection per request in flight: lift the soft limit on open files
    to the hard one, as load generators do (best effort)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def load_requests_parquet(path):
    """Read a ``workload.parquet`` written by :func:`run_bench` back into a RequestArrays."""
    import pyarrow.parquet as pq

    from llmqueue.workload.generate import RequestArrays

    t = pq.read_table(path).to_pydict()
    return RequestArrays(np.asarray(t["request_id"]), np.asarray(t["arrival_s"]), np.asarray(t["prompt_tokens"]),
                         np.asarray(t["output_tokens"]), np.asarray(t["class"], dtype=str))


__all__ = ["BenchConnectError", "BenchResult", "DEFAULT_TIMEOUT_S", "DEFAULT_TOKEN_RANGE", "arrival_check", "classify_http",
           "ks_2samp",
           "endpoint_url", "load_requests_parquet", "run_bench", "run_bench_async", "token_id_range"]

"""OpenAI's completions API as vLLM's server speaks it: the request fields a served engine reads,
the error bodies and status codes, and the answer's bytes (whole, or as server-sent events).

Requests (:func:`parse_request`): ``model`` (absent: the served model; unknown: 404),
``prompt`` as token ids (its length is exact) or text, or chat ``messages``; ``max_tokens``
(chat: ``max_completion_tokens`` first), ``stream``, ``stream_options`` (``include_usage``,
``continuous_usage_stats``), ``n`` (1 only), ``ignore_eos`` and ``min_tokens`` (accepted: every
answer has exactly its ``max_tokens`` tokens, as with ``ignore_eos``). vLLM 0.32's checks, with its
messages: a prompt that fills ``max_model_len`` alone is 400, ``max_tokens`` above
``max_model_len`` or below 1 is 400, and a ``max_tokens`` that does not fit beside the prompt is
cut to what fits (answered 200, as vLLM does). Absent ``max_tokens``: 16 for completions, what
fits for chat (vLLM's defaults).

Text has no tokenizer here (nothing is downloaded), so its length follows a stated rule,
:func:`text_tokens`: one token per four UTF-8 bytes, rounded up (OpenAI's rule of thumb for
English); a chat prompt is its messages' contents by that rule plus :data:`CHAT_TOKENS_PER_MESSAGE`
per message (the role and the template's delimiters). Send token ids when lengths must be exact.

Errors (:class:`ApiError`) are vLLM's JSON: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

CHAT_TOKENS_PER_MESSAGE = 4
DEFAULT_COMPLETION_TOKENS = 16
TOKEN_TEXT = " tok"
FINGERPRINT = "llmqueue-emulate"


class ApiError(Exception):
    """An error answer: HTTP ``status`` and vLLM's body."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                     "code": self.status}}, separators=(",", ":")).encode()


def overloaded(status: int) -> ApiError:
    """A refusal under load: 429 (a rate limit) or 503 (the server is overloaded), vLLM-style."""
    if status == 429:
        return ApiError(429, "Too many requests: the server is rate limiting; retry later", "RateLimitError")
    return ApiError(503, "The server is overloaded; retry later", "ServiceUnavailableError")


def text_tokens(text: str) -> int:
    """Tokens of ``text`` by the stated rule: ceil(UTF-8 bytes / 4) (0 for empty text)."""
    return math.ceil(len(text.encode("utf-8", "replace")) / 4)


@dataclass
class CompletionRequest:
    """What a served engine needs of one request."""

    model: str
    chat: bool
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    max_tokens_asked: int | None


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def _int_field(body: dict, name: str):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise ApiError(400, f"{name}: Input should be a valid integer (got {json.dumps(v)[:40]})", "Bad Request",
                       f"body.{name}")
    return v


def _prompt_length(body: dict, chat: bool) -> int:
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _bad("messages: a non-empty list of messages is required", "messages")
        n = 0
        for m in msgs:
            if not isinstance(m, dict):
                raise _bad("messages: each message must be an object", "messages")
            c = m.get("content")
            if isinstance(c, str):
                n += text_tokens(c)
            elif isinstance(c, list):
                n += sum(text_tokens(p.get("text") or "") for p in c if isinstance(p, dict))
            n += CHAT_TOKENS_PER_MESSAGE
        return n
    p = body.get("prompt")
    if p is None or p == "":
        raise _bad("Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)", "prompt")
    if isinstance(p, str):
        return max(text_tokens(p), 1)
    if isinstance(p, list):
        if not p:
            raise _bad("You must pass at least one prompt")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return len(p)
        if len(p) == 1 and isinstance(p[0], str):
            return max(text_tokens(p[0]), 1)
        if len(p) == 1 and isinstance(p[0], list) and p[0] and all(isinstance(x, int) for x in p[0]):
            return len(p[0])
        raise _bad("prompt: one prompt per request (text or a list of token ids)", "prompt")
    raise _bad("prompt: must be text or a list of token ids", "prompt")


def parse_request(raw: bytes, *, chat: bool, served: tuple, max_model_len: int) -> CompletionRequest:
    """The request in ``raw`` (a POST body), checked as vLLM checks it; raises :class:`ApiError`.
    ``served``: the model names answered (the first is the default)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"JSON decode error: {e}", "Bad Request", "body") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Input should be a valid dictionary or object to extract fields from", "Bad Request",
                       "body")
    model = body.get("model")
    if model is None:
        model = served[0]
    elif model not in served:
        raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {', '.join(served)}.",
                       "NotFoundError", "model")
    n = _int_field(body, "n")
    if n is not None and n != 1:
        raise _bad(f"n={n}: llmqueue emulate answers one choice per request (n=1)", "n")
    asked = _int_field(body, "max_completion_tokens") if chat else None
    if asked is None:
        asked = _int_field(body, "max_tokens")
    s = _prompt_length(body, chat)
    if s >= max_model_len:
        raise _bad(f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains at "
                   f"least {s} input tokens, which exceeds this limit even without any output tokens. Please reduce "
                   f"the length of the input prompt. (parameter=input_tokens, value={s})", "input_tokens")
    if asked is not None:
        if asked < 1:
            raise _bad(f"max_tokens must be at least 1, got {asked}. (parameter=max_tokens, value={asked})",
                       "max_tokens")
        if asked > max_model_len:
            raise _bad(f"max_tokens={asked} cannot be greater than max_model_len={max_model_len}. Please request "
                       f"fewer output tokens. (parameter=max_tokens, value={asked})", "max_tokens")
    room = max_model_len - s
    o = min(asked, room) if asked is not None else (room if chat else min(DEFAULT_COMPLETION_TOKENS, room))
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise ApiError(400, "stream_options: Input should be an object", "Bad Request", "body.stream_options")
    return CompletionRequest(model=model, chat=chat, prompt_tokens=s, max_tokens=o, stream=bool(body.get("stream")),
                             include_usage=bool(so.get("include_usage")),
                             continuous_usage=bool(so.get("continuous_usage_stats")), max_tokens_asked=asked)


# -- answers ------------------------------------------------------------------------------------

def _usage(prompt: int, out: int, chat_details: bool = False) -> str:
    d = ',"completion_tokens_details":null' if chat_details else ""
    return '"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%s}' % (prompt, prompt + out, out, d)


class Answer:
    """The bytes of one answer (vLLM 0.32's field order), built once per request: a streamed
    token's event is a join of fixed parts."""

    __slots__ = ("req", "rid", "created", "model", "_head", "_mid", "_fin")

    def __init__(self, req: CompletionRequest, rid: str, created: int):
        self.req = req
        self.rid = ("chatcmpl-" if req.chat else "cmpl-") + rid
        self.created = created
        self.model = json.dumps(req.model)
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        self._head = ('data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":[{"index":0,'
                      % (self.rid, obj, created, self.model))
        if req.chat:
            self._mid = '"delta":{"content":"%s"},"logprobs":null,"finish_reason":' % TOKEN_TEXT
            self._fin = ('null,"token_ids":null}]', '"length","stop_reason":null,"token_ids":null}]')
        else:
            self._mid = '"text":"%s","logprobs":null,"finish_reason":' % TOKEN_TEXT
            self._fin = ('null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]',
                         '"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]')

    def role_event(self) -> str:
        """Chat streams open with the assistant's role and empty content (sent with the first token)."""
        r = self.req
        usage = "," + _usage(r.prompt_tokens, 0, True) if r.continuous_usage else ""
        return (self._head + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
                + usage + ',"prompt_token_ids":null,"prompt_text":null}\n\n')

    def token_event(self, i: int) -> str:
        """The event of output token ``i`` (0-based); the last carries ``finish_reason``."""
        r = self.req
        last = i == r.max_tokens - 1
        s = self._head + self._mid + self._fin[last]
        if r.continuous_usage:
            s += "," + _usage(r.prompt_tokens, i + 1, r.chat)
        if last and not r.chat:
            s += ',"system_fingerprint":"%s"' % FINGERPRINT
        return s + "}\n\n"

    def tail(self, out: int) -> str:
        """After the last token: the usage event (when asked for) and ``[DONE]``."""
        r = self.req
        s = ""
        if r.include_usage:
            s = (self._head[:self._head.index('"choices"')] + '"choices":[],' + _usage(r.prompt_tokens, out)
                 + ',"system_fingerprint":"%s"}\n\n' % FINGERPRINT)
        return s + "data: [DONE]\n\n"

    def whole(self, out: int) -> bytes:
        """The non-streamed answer with ``out`` tokens."""
        r = self.req
        text = TOKEN_TEXT * out
        if r.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                              "annotations": None, "audio": None, "function_call": None,
                                              "reasoning": None},
                      "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None,
                      "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None}
        doc = {"id": self.rid, "object": "chat.completion" if r.chat else "text_completion", "created": self.created,
               "model": r.model, "choices": [choice], "service_tier": None, "system_fingerprint": FINGERPRINT,
               "usage": {"prompt_tokens": r.prompt_tokens, "total_tokens": r.prompt_tokens + out,
                         "completion_tokens": out, "prompt_tokens_details": None, "completion_tokens_details": None}}
        return json.dumps(doc, separators=(",", ":")).encode()


def models_body(names: tuple, max_model_len: int, created: int) -> dict:
    """``GET /v1/models``: the served names, vLLM's fields."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "llmqueue-emulate",
                                        "root": names[0], "parent": None, "max_model_len": max_model_len}
                                       for n in names]}

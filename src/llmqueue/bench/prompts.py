"""The prompts of a benchmark run: each request's body, built just before it is sent.

``endpoint="completions"`` sends the prompt as token ids (``prompt: [ids...]``), so the server sees
exactly ``prompt_tokens`` tokens; the ids are drawn, seeded, from a range that is safe for every
tokenizer (:func:`token_id_range`). ``endpoint="chat"`` sends text (common English words, about
one token each); the chat template adds tokens, so the record keeps the server's own count from
``usage``. A dataset's prompts (:mod:`llmqueue.bench.datasets`) are sent as text. The output
length is fixed with ``max_tokens`` (chat: ``max_completion_tokens``) plus vLLM's
``ignore_eos: true`` and ``min_tokens`` (``exact_output=False`` leaves the two vLLM extensions
out, for servers that refuse them). Every request streams (``stream: true``,
``stream_options: {include_usage: true}``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

import numpy as np

from llmqueue.bench.options import option
from llmqueue.errors import InputError
from llmqueue.knobs import check_value

#: Token ids used for prompts when the vocabulary size is unknown: above the special and
#: control tokens of common tokenizers (Llama, GPT-2, OPT, Qwen, byte-level BPEs put them
#: first or last) and below every vocabulary size of at least 512.
DEFAULT_TOKEN_RANGE = (100, 500)

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


def token_id_range(vocab_size: int | None = None) -> tuple[int, int]:
    """``[lo, hi)`` of the random prompt token ids.

    Without a vocabulary size: :data:`DEFAULT_TOKEN_RANGE`. With one (``V``): the middle 90%,
    ``[V // 20, V - V // 20)``, clear of the special tokens tokenizers put at either end.
    """
    if vocab_size is None:
        return DEFAULT_TOKEN_RANGE
    v = check_value(option("vocab_size"), vocab_size)
    return (max(1, v // 20), v - v // 20)


class Prompts:
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
        lo, hi = check_value(option("token_range"), token_range)
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
            H = check_value(option("prefix_block_tokens"), hash_block_tokens, field="hash_block_tokens")
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

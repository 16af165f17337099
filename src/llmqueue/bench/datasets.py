"""Real-prompt datasets for ``llmqueue bench``, read the way ``vllm bench serve`` reads them
(``vllm/benchmarks/datasets``): prompts sent as text, output lengths where vLLM takes them.

- ``sharegpt``: a JSON list of conversations (``[{"conversations": [{"from": "human", "value":
  PROMPT}, {"from": "gpt", "value": COMPLETION}, ...]}, ...]``, the ShareGPT_V3 file vLLM's docs
  download). Entries with fewer than two turns are dropped; the prompt is the first turn, the
  output length the second turn's token count (or the output-length flag). As vLLM does, a pair
  is skipped when the prompt or the completion has fewer than 4 tokens (the completion check
  only when its length is used), the prompt more than 1,024, or both together more than 2,048.
- ``custom``: a JSONL file, one object per line with a ``"prompt"`` string (vLLM's ``custom``);
  an optional ``"output_len"`` (or ``"output_tokens"``) per line gives that request's output
  length; otherwise the output-length flag; otherwise 256 (vLLM's ``--custom-output-len``).

The entries are shuffled with the run's seed and the first ``n`` valid ones taken; when the file
has fewer, random ones are repeated to make up ``n`` (vLLM's oversampling), and the result says so.

Token counts: with ``tokenizer`` (a Hugging Face name or path; needs the optional ``transformers``
package) they are the tokenizer's, as vLLM counts them; without one they are estimated as
``ceil(characters / 4)`` (about 4 characters a token for English BPE vocabularies). The estimate
only sizes the workload (``workload.parquet``) and the ShareGPT output lengths and filter: the
records (``requests.parquet``) hold the token counts the server reports in each answer's usage.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from llmqueue.errors import InputError

DATASETS = ("random", "sharegpt", "custom")
CUSTOM_OUTPUT_LEN = 256  # vLLM's --custom-output-len default
_MIN_LEN, _MAX_PROMPT, _MAX_TOTAL = 4, 1024, 2048  # vLLM's is_valid_sequence bounds


@dataclass
class DatasetSample:
    """``n`` requests' prompts: texts, token counts (tokenizer or estimate), output lengths."""

    texts: list
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    name: str
    path: str
    counted_by: str
    available: int  # distinct valid entries taken (all of the file's when it has fewer than n)
    oversampled: int  # requests that repeat an entry (the file had too few)

    def describe(self) -> dict:
        return {"name": self.name, "path": self.path, "requests": len(self.texts), "valid_entries": self.available,
                "oversampled": self.oversampled, "prompt_tokens_counted_by": self.counted_by,
                "records_hold": "the server's usage counts"}


def load_tokenizer(name: str | None):
    """A callable ``text -> token count`` from ``transformers`` (None without a name)."""
    if name is None:
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise InputError("tokenizer", "needs the transformers package, which is not installed",
                         "pip install transformers, or drop --tokenizer (records then hold the server's "
                         "usage counts, the workload an estimate)") from None
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # noqa: BLE001 - any loading failure is this flag's bad input
        raise InputError("tokenizer", f"cannot load tokenizer {name!r} ({type(e).__name__}: {str(e)[:120]})",
                         "give a Hugging Face model name or a local tokenizer directory") from None
    return lambda text: len(tok(text).input_ids)


def estimate_tokens(text: str) -> int:
    """About 4 characters a token (English BPE); at least 1."""
    return max(1, math.ceil(len(text) / 4))


def _sharegpt(path, field: str) -> list[tuple[str, str]]:
    from llmqueue._files import load_json

    data = load_json(field, path, what="ShareGPT JSON file")
    if not isinstance(data, list):
        raise InputError(field, f"{str(path)!r} is not a ShareGPT file (a JSON list of conversations)",
                         "give a JSON list like [{\"conversations\": [{\"value\": ...}, {\"value\": ...}]}]")
    out = []
    for entry in data:
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        turns = [t.get("value") if isinstance(t, dict) else None for t in conv[:2]]
        if all(isinstance(t, str) for t in turns):
            out.append((turns[0], turns[1]))
    return out


def _custom(path, field: str) -> list[tuple[str, int | None]]:
    from llmqueue._files import read_text

    out = []
    for i, line in enumerate(read_text(field, path, what="JSONL file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise InputError(field, f"{str(path)!r} line {i} is not JSON ({e})",
                             "one JSON object per line, e.g. {\"prompt\": \"...\"}") from None
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str):
            raise InputError(field, f"{str(path)!r} line {i} has no \"prompt\" string",
                             "one JSON object per line, e.g. {\"prompt\": \"...\"}")
        o = next((row[k] for k in ("output_len", "output_tokens") if k in row), None)
        if o is not None and (isinstance(o, bool) or not isinstance(o, int) or o < 1):
            raise InputError(field, f"{str(path)!r} line {i}: output length {o!r} is not a positive integer")
        out.append((prompt, o))
    return out


def load_dataset(name: str, path, n: int, *, seed: int = 0, output_len=None, tokenizer: str | None = None,
                 field: str = "dataset_path") -> DatasetSample:
    """``n`` requests from dataset ``name`` (``sharegpt`` or ``custom``) at ``path``.

    ``output_len``: None (the dataset's lengths), or an array of ``n`` output lengths that
    replaces them (vLLM's ``--output-len``). ``tokenizer``: see the module docstring.
    """
    if name not in ("sharegpt", "custom"):
        raise InputError("dataset_name", f"{name!r} is not a file dataset", "use sharegpt or custom")
    count = load_tokenizer(tokenizer) or estimate_tokens
    counted_by = f"tokenizer {tokenizer}" if tokenizer else "estimate: ceil(characters / 4)"
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(0xDA,)))
    if name == "sharegpt":
        entries = _sharegpt(path, field)
    else:
        entries = _custom(path, field)
    order = rng.permutation(len(entries))
    texts, s_len, o_len = [], [], []
    for k in order.tolist():
        if len(texts) >= n:
            break
        prompt, extra = entries[k]
        s = count(prompt)
        if name == "sharegpt":
            o = count(extra) if output_len is None else None
            # vLLM's is_valid_sequence (the completion's minimum only when its length is used)
            o_chk = o if o is not None else _MIN_LEN
            if s < _MIN_LEN or o_chk < _MIN_LEN or s > _MAX_PROMPT or s + o_chk > _MAX_TOTAL:
                continue
        else:
            o = extra if extra is not None else CUSTOM_OUTPUT_LEN
        texts.append(prompt)
        s_len.append(s)
        o_len.append(o if o is not None else 0)
    available = len(texts)
    if available == 0:
        what = "no conversation with two turns within vLLM's length bounds" if name == "sharegpt" else "no prompt"
        raise InputError(field, f"{str(path)!r} has {what}", "give a file with usable entries")
    extra_n = n - available
    if extra_n > 0:  # vLLM's oversampling: repeat random entries
        pick = rng.integers(0, available, extra_n).tolist()
        texts += [texts[j] for j in pick]
        s_len += [s_len[j] for j in pick]
        o_len += [o_len[j] for j in pick]
    o_arr = np.asarray(o_len, dtype=np.int64)
    if output_len is not None:
        o_arr = np.asarray(output_len, dtype=np.int64)
        if o_arr.shape != (n,):
            raise InputError("output", f"{o_arr.shape} output lengths for {n} requests")
    return DatasetSample(texts=texts, prompt_tokens=np.asarray(s_len, dtype=np.int64), output_tokens=o_arr,
                         name=name, path=str(path), counted_by=counted_by, available=available,
                         oversampled=max(0, extra_n))

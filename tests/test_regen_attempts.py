"""`attempts` counts the requests dqa sent for a row, and giving up uses the same count (issue 24:
rows were recorded "gave up after 12 attempts" with --max-attempts 6, because requests cancelled
when their endpoint was taken out counted as attempts but not towards giving up).

Two SGLang stand-ins: one answers half its requests with 503 after a delay, so it is taken out
while other requests to it are in flight (those are cancelled and go to the other endpoint).
"""

from __future__ import annotations

import re

from dqa.regen.config import RegenConfig
from dqa.regen.run import regenerate
from regen_helpers import degenerate_dataset, read_shards, write_findings
from servers.sglang_contract import StubServer

FAST = dict(health_interval=0.3, health_timeout=2.0, backoff_base=0.02, backoff_max=0.05, live=False, install_signal_handlers=False)


def test_no_row_is_sent_more_often_than_max_attempts_and_giving_up_says_the_recorded_count(tmp_path):
    flaky = StubServer(tmp_path / "a", "--latency-s", "0.15", "--error-share", "0.5", "--error-statuses", "503", name="a").start()
    good = StubServer(tmp_path / "b", "--latency-s", "0.15", name="b").start()
    try:
        path = degenerate_dataset(tmp_path / "d.parquet", 80)
        findings = write_findings(tmp_path / "scan", list(range(80)))
        cfg = RegenConfig(dataset=str(path), out=str(tmp_path / "out"), endpoints=[flaky.url, good.url], findings=str(findings),
                          max_attempts=2, max_in_flight=8, **FAST)
        regenerate(cfg)
        rows = read_shards(tmp_path / "out").to_pylist()
        assert sorted(r["row"] for r in rows) == list(range(80))
        sent: dict[str, int] = {}
        for s in (flaky, good):
            for q in s.requests():
                if q["rid"]:
                    key = q["rid"].rsplit(":", 1)[0]
                    sent[key] = max(sent.get(key, 0), int(q["rid"].rsplit(":", 1)[1]))
        assert max(r["attempts"] for r in rows) <= 2
        for r in rows:
            assert sent.get(f"sample-{r['row']}", 0) <= r["attempts"]  # no rid numbered past the recorded count
            if r["status"] == "failed":
                m = re.match(r"gave up after (\d+) attempts", r["error"])
                assert m and int(m.group(1)) == r["attempts"] == 2, r["error"]
    finally:
        flaky.stop()
        good.stop()

"""``dqa scan --list-checks``: every check with its priority (the root-cause order) and whether it judges
each trained turn or the sample as a whole, in priority order."""

from __future__ import annotations

import re

from dqa.audit.checks import CHECKS, priority_order


def test_list_checks_shows_priority_and_whether_a_check_judges_turns(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")
    r = cli("scan", "--list-checks")
    assert r.exit_code == 0
    rows = {}
    for line in r.stdout.splitlines():
        m = re.match(r"[│|]\s*(\w+)\s*[│|]\s*(\d+)\s*[│|]\s*(turns|sample)\s*[│|]", line)
        if m:
            rows[m.group(1)] = (int(m.group(2)), m.group(3))
    assert rows == {c.name: (c.priority, "turns" if c.turn_rule is not None else "sample") for c in CHECKS}
    order = [line.split()[1] for line in r.stdout.splitlines() if re.match(r"[│|]\s*\w+\s*[│|]\s*\d+\s*[│|]", line)]
    assert order == list(priority_order())
    assert "primary reason" in r.stdout

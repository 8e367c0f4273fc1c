"""The Markdown dqa writes (summary.md of scan and validate, gate.md; GitHub's job summary) shows
untrusted text as it is once rendered: ``<think>`` reads ``<think>``, not ``&lt;think&gt;``, and no
text breaks a table.

Rendered with markdown-it-py (CommonMark + GFM tables; installed with rich) and read back as the
visible text of each table cell, the way a reader of GitHub's page sees it.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from dqa.reports.markdown_validation import md_code, md_escape, render_gate_markdown, render_validation_markdown
from dqa.audit.scan_markdown import render_scan_markdown

HOSTILE = '<think>\n\n</think>\n\nOK. a|b `tick` *star* _under_ [link](x) ~~s~~ &amp; back\\slash\\| "q" <|im_end|>'


class _Cells(HTMLParser):
    """Visible text of a rendered page: every table row as a list of cell texts, and all text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.text: list[str] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def rendered(markdown: str) -> _Cells:
    from markdown_it import MarkdownIt

    page = MarkdownIt("commonmark").enable("table").render(markdown)
    cells = _Cells()
    cells.feed(page)
    return cells


def test_md_code_shows_any_text_literally_inside_a_table_cell():
    plain = "x|y *z* _w_ \\| <b>"
    md = "| a | b |\n| --- | --- |\n" + f"| {md_code(HOSTILE, None)} | {md_escape(plain)} |\n"
    page = rendered(md)
    assert page.rows[1] == [HOSTILE.replace("\n", " "), plain]
    assert not {"em", "strong", "a", "s", "del", "b", "think"} & set(page.tags)  # nothing became markup


def test_scan_summary_md_shows_the_decoded_template_literally(defect_scan):
    """The real summary.md of a scan with the canned 'OK.' template: GitHub must show <think>, not &lt;think&gt;."""
    md = (defect_scan / "summary.md").read_text()
    page = rendered(md)
    tpl_rows = [r for r in page.rows if len(r) == 4 and r[3].startswith('"')]
    assert tpl_rows, md
    shown = tpl_rows[0][3]
    assert "<think>" in shown and "</think>" in shown and "<|im_end|>" in shown, shown
    assert "&lt;" not in shown and "&#" not in shown
    text = json.loads((defect_scan / "summary.json").read_text())["degenerate_templates"][0]["text"]
    assert shown == '"' + text.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    # Every row of every table keeps its columns.
    header_widths = {len(r) for r in page.rows}
    assert header_widths <= {4, 3}


def test_scan_summary_md_survives_hostile_template_text():
    summary = {
        "dataset": "d", "rows": 10, "failing_rows": 5, "failing_share": 0.5, "tokens": 100, "supervised_tokens": 50,
        "thinking_expected": True, "thinking_inferred": True, "thinking_share": 0.5,
        "checks": {"degenerate_template": {"count": 5, "share": 0.5, "primary": 5, "flags_when": "a | b <x> *y*"}},
        "degenerate_templates": [{"count": 5, "share": 0.5, "tokens": 9, "text": HOSTILE}],
        "supervised_tokens_distribution": {},
    }
    page = rendered(render_scan_markdown(summary))
    assert all(len(r) == 4 for r in page.rows)
    check_row = [r for r in page.rows if r[0] == "degenerate_template ◀ root cause"][0]
    assert check_row[3] == "a | b <x> *y*"
    tpl = [r for r in page.rows if r[3].startswith('"')][0][3]
    assert "<think>" in tpl and "a|b `tick` *star* _under_ [link](x) ~~s~~ &amp; back\\\\slash\\\\|" in tpl
    assert not {"em", "strong", "a", "del", "s"} & set(page.tags)


def _validation(title: str, source: str, suite: str = "release") -> dict:
    return {
        "suite": suite, "success": False, "rows": 3, "source": source, "fail_on": "error",
        "statistics": {"evaluated": 1, "passed": 0, "failed": 1, "warnings": 0, "errors": 0},
        "expectations": [{"status": "fail", "severity": "error", "title": title, "kwargs": {"min_value": 1},
                          "failing_ids": ["sample-00012", "<b>|x"], "unexpected_count": 2, "unexpected_percent": 66.7,
                          "observed_value": None, "element_count": 3}],
    }


@pytest.mark.parametrize("title", ["expect_column_values_to_be_between(supervised_tokens)", "odd <think>|`x`_y_ \\| *z*"])
def test_validation_and_gate_markdown_show_code_literally(title):
    source = "data/<think>|release_v2.parquet"
    page = rendered(render_validation_markdown(_validation(title, source)))
    text = "".join(page.text)
    assert "release" in text and source in text
    row = [r for r in page.rows if len(r) == 7 and r[0] != ""][0]
    assert row[2] == title  # the expectation's title, as it is
    assert row[6] == "sample-00012, <b>|x"
    gate = {"verdict": "fail", "release": source, "baseline": "base_<v1>", "reasons": ["x"], "validation": _validation(title, source),
            "drift": {"checks": [{"passed": False, "name": "failing_share", "baseline": 0.1, "release": 0.5, "value": 0.4,
                                  "threshold_text": "<= 0.05"}]}}
    page = rendered(render_gate_markdown(gate))
    text = "".join(page.text)
    assert f"for {source}" in text and "Drift against base_<v1>" in text
    assert ["", "failing_share", "0.1", "0.5", "0.4", "<= 0.05"] == [c.replace("❌", "") for c in page.rows[1]]

"""The bad-input contract of `dqa scan`, checked the same way everywhere: exit 2, exactly one
`dqa: error:` line naming the problem, no traceback, no output folder, no temp folder left."""

from __future__ import annotations


def assert_scan_refused(cli, tmp_path, path, *needles, extra=()) -> str:
    """Run ``dqa scan PATH --out tmp_path/bad-out`` and check the contract; return the error line."""
    out = tmp_path / "bad-out"
    result = cli("scan", path, "--out", out, *extra)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dqa: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    return lines[0]

"""`kvpot bench locate` (kvpot.bench.locate): one tiny input read once on the smallest model, every locator
asked every question; the JSON's ranks agree with the spans it records, hit@focus with its windows, and the
summary with its rows."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvpot.bench.locate import KINDS, LOCATORS, TOP, rank_of, summary
from kvpot.cli.main import app


def overlaps(a: list[int], b: list[int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_rank_is_the_first_overlapping_span():
    spans = [[100, 164, 3.0], [0, 64, 2.0], [30, 40, 1.0]]
    assert rank_of(spans, [50, 60]) == 2
    assert rank_of(spans, [150, 170]) == 1
    assert rank_of(spans, [164, 200]) is None  # ends are exclusive


def test_bench_locate_on_a_tiny_input(tmp_path, smollm2_path):
    out = tmp_path / "locate.json"
    res = CliRunner().invoke(app, ["bench", "locate", "-m", str(smollm2_path), "--length", "1024", "--budget", "256",
                                   "--inputs", "1", "--bm25-lines", "12", "-t", "2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    for key in ("command", "commit", "cpu", "n", "rows", "reads", "summary", "plan"):
        assert key in data, key
    names = [*LOCATORS, "bm25@12", "mix@12"]
    assert data["locators"] == names
    rows = data["rows"]
    assert data["n"] == len(rows) >= 1 and len(data["reads"]) == 1
    read = data["reads"][0]
    assert read["compactions"] > 0 and read["keys_bytes"] > 0  # read past the pot, keys kept
    for row in rows:
        assert row["kind"] in KINDS and not row["heldout"]
        assert len(row["gold_positions"]) == len(row["gold_chars"]) >= 1
        for name in names:
            c = row["locators"][name]
            assert "error" not in c, (name, c)
            spans = c["spans"]
            assert spans and len(spans) <= c["ranked"]
            scores = [s for *_, s in spans]
            assert scores == sorted(scores, reverse=True)
            for gold, r in zip(row["gold_positions"], c["ranks"]):
                hit = [i + 1 for i, sp in enumerate(spans) if overlaps(sp, gold)]
                if hit:       # the first recorded span that overlaps the gold passage is its rank
                    assert r == hit[0], (name, gold, r, hit)
                else:         # none recorded: ranked past them, or not at all
                    assert r is None or r > len(spans), (name, r)
            assert c["rank"] == c["ranks"][0]
            assert c["all_top8"] == all(r is not None and r <= TOP for r in c["ranks"])
            held = all(any(a <= g0 and g1 <= b for a, b in c["windows"]) for g0, g1 in row["gold_chars"])
            assert c["hit_focus"] == held
    # the summary is the rows' figures
    assert data["summary"] == summary(rows, names)
    for name in names:
        allk = data["summary"][name]["all"]
        sel = [r["locators"][name] for r in rows]
        assert allk["n"] == len(rows) and allk["hit_focus"] == sum(c["hit_focus"] for c in sel)
        assert abs(allk["mrr"] - sum(1 / c["rank"] for c in sel if c["rank"]) / len(sel)) < 1e-3
        lo, hi = allk["interval_95"]
        assert lo <= allk["hit_focus_share"] <= hi
    # --resume keeps the input read and reads nothing again
    res = CliRunner().invoke(app, ["bench", "locate", "-m", str(smollm2_path), "--length", "1024", "--budget", "256",
                                   "--inputs", "1", "--bm25-lines", "12", "-t", "2", "--json", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    again = json.loads(out.read_text())
    assert again["rows"] == rows and again["reads"] == data["reads"]
    res = CliRunner().invoke(app, ["bench", "locate", "-m", str(smollm2_path), "--length", "2048", "--budget", "256",
                                   "--inputs", "1", "-t", "2", "--json", str(out), "--resume"])
    assert res.exit_code != 0 and "another plan" in res.output

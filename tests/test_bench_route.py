"""`kvpot bench route`: every question of the built inputs is routed by the product's own rule (locating.route's
peak under FLAT), and the JSON's counts are what its rows give."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvpot.bench.route import WHOLE_INPUT
from kvpot.cli.main import app
from kvpot.locator.lexical import FLAT


def test_bench_route_counts_are_its_rows(smollm2_path, tmp_path):
    out = tmp_path / "route.json"
    r = CliRunner().invoke(app, ["bench", "route", "-m", str(smollm2_path), "--length", "4096", "--json", str(out)])
    assert r.exit_code == 0, r.output
    got = json.loads(out.read_text())
    rows = got["rows"]
    inputs = {row["input"] for row in rows}
    assert sum(row["kind"] == "whole-input" for row in rows) == len(WHOLE_INPUT) * len(inputs)
    assert {"lexical", "paraphrase", "two-passage", "absent", "multikey"} <= {row["kind"] for row in rows}
    by_kind = got["summary"]["4096"]["by_kind"]
    for kind, tally in by_kind.items():
        mine = [row for row in rows if row["kind"] == kind]
        assert tally == {"n": len(mine), "to_pot": sum(row["peak"] < FLAT for row in mine)}
    assert got["flat"] == FLAT and got["commit"] and got["cpu"]
    assert "whole-input" in r.output

"""The studies' own computations (studies/): the accuracy-versus-budget table and plot, where a needle's
digits sit in its tokens, NuC's head cost and shortlist, InfLLM's store cost; each on a tiny input, checked
against a reference computed here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvpot.runtime.blocks import KV_TYPES
from studies import curve, needle_trace, nuc_head, nuc_shortlist, store_cost


def test_curve_table_and_plot_from_tiny_runs(tmp_path):
    def case(depth, seed, correct, tokens, read):
        return {"depth": depth, "seed": seed, "correct": correct, "tokens": tokens, "read_seconds": read,
                "distill_seconds": read / 10, "compactions": 3, "answer": "77114." if correct else "7."}
    (tmp_path / "m-prose-7900-full.json").write_text(json.dumps([case(0.1, 0, True, 8000, 10.0),
                                                                 case(0.5, 0, True, 8000, 10.0)]))
    (tmp_path / "m-prose-7900-1024.json").write_text(json.dumps([case(0.1, 0, False, 8000, 20.0),
                                                                 case(0.5, 0, True, 8000, 20.0)]))
    (tmp_path / "notes.json").write_text("[]")  # not a grid file: left out
    runs = curve.load(tmp_path)
    assert set(runs) == {("m", "prose", 7900)} and set(runs[("m", "prose", 7900)]) == {"full", 1024}
    rows = curve.table(runs).splitlines()[2:]
    assert rows[0].startswith("| m | prose | 7,900 | full attention | 2/2 | 0 | 1.00 | 10 | 3 |")
    assert rows[1].startswith("| m | prose | 7,900 | InfiniPot 1024 | 1/2 | 0 | 0.50 | 10 | 3 |")
    png = tmp_path / "c.png"
    curve.main(["--dir", str(tmp_path), "--png", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_needle_trace_places_the_keys_digits_in_the_tokens():
    class Chars:  # a tokenizer with one token per character: the digits' indices are their places in the text
        def tokenize(self, text):
            return [ord(c) for c in text]

        def piece(self, t):
            return chr(t).encode()

    text = "Filler 0x00 words. Whoever needs the north gate should know its access code: 77114. More 42."
    needle = "Whoever needs the north gate should know its access code: 77114."
    start = text.index("77114")
    assert needle_trace.needle_digits(Chars(), text, needle, "77114") == list(range(start, start + 5))
    with pytest.raises(SystemExit):
        needle_trace.needle_digits(Chars(), text, needle, "77115")


def test_nuc_head_times_each_mode_on_a_small_chunk(tmp_path, smollm2_path):
    """studies.nuc_head on SmolLM2, one round of a 64-token chunk: every mode timed, the share and the
    ratio derived from the medians it reports (no timing is asserted)."""
    out = tmp_path / "head.json"
    nuc_head.main(["-m", "smollm2-135m", "--chunk", "64", "--rounds", "1", "--json", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["model"] == "smollm2-135m" and row["chunk"] == 64
    assert set(row["median"]) == set(nuc_head.MODES) and all(row["median"][m] > 0 for m in nuc_head.MODES)
    med = row["median"]
    assert row["nuc_share"] == (med[nuc_head.MODES[1]] - med[nuc_head.MODES[0]]) / med[nuc_head.MODES[1]]
    assert row["blocks_vs_model_head"] == med[nuc_head.MODES[1]] / med[nuc_head.MODES[2]]


def test_store_cost_times_every_shape_and_format_on_a_small_store(tmp_path):
    """studies.store_cost over 16 blocks a store: a row per registry shape and row format, with the
    record size the store reports (computed here from the shape) and every cost measured (no timing is
    asserted)."""
    out = tmp_path / "cost.json"
    store_cost.main(["--blocks", "16", "--rounds", "1", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert {(r["model"], r["kv_type"]) for r in rows} == {(m, t) for m, *_ in store_cost.SHAPES for t in KV_TYPES}
    row_bytes = {"f16": lambda d: 2 * d, "q8_0": lambda d: d // 32 * 34, "q4_0": lambda d: d // 32 * 18}
    for r in rows:  # positions, the representatives in f32, then K and V rows; padded to 64 bytes
        h, d, bs = r["n_head_kv"], r["head_dim"], r["block_size"]
        assert r["record_bytes"] == -(-(4 * bs + 4 * h * d + 2 * h * bs * row_bytes[r["kv_type"]](d)) // 64) * 64
        assert r["miss_us"] > 0 and r["hit_us"] > 0 and r["score_ns"] > 0


def test_nuc_shortlist_logprob_against_the_set_it_sums():
    """The shortlist's log p is the target's logit less the log-sum-exp over ids [0, N) and the target,
    checked against that set written out; with N = the vocabulary it is log_softmax."""
    rng = np.random.default_rng(0)
    z = rng.normal(0, 4, (6, 50)).astype(np.float32)
    tgt = np.array([0, 3, 9, 10, 33, 49])
    for n in (1, 10, 25, 50):
        got = nuc_shortlist.shortlist_logprob(z, tgt, n)
        for r, t in enumerate(tgt):
            ids = sorted(set(range(n)) | {int(t)})
            want = float(z[r, t]) - np.logaddexp.reduce(z[r, ids].astype(np.float64))
            assert got[r] == pytest.approx(want, abs=1e-9)
    full = z.astype(np.float64) - np.logaddexp.reduce(z.astype(np.float64), axis=1, keepdims=True)
    np.testing.assert_allclose(nuc_shortlist.shortlist_logprob(z, tgt, 50), full[np.arange(6), tgt], atol=1e-9)


def test_nuc_shortlist_on_a_small_read(tmp_path, smollm2_path):
    """studies.nuc_shortlist on SmolLM2 over 384 tokens of the manual: the whole vocabulary keeps every
    cell NuC takes and moves no log p; a 4,096-id shortlist moves some and keeps a share within [0, 1]."""
    out = tmp_path / "shortlist.json"
    nuc_shortlist.main(["-m", "smollm2-135m", "--text", "manual", "--tokens", "384", "--budget", "128",
                        "--chunk", "128", "--shortlist", "4096", "--shortlist", "1000000", "--json", str(out)])
    (r,) = json.loads(out.read_text())
    assert r["t"] == 32 and r["windows"] == 5
    short, whole = r["rows"]
    assert whole["shortlist"] == r["n_vocab"] and whole["head_share"] == 1.0
    assert whole["nuc_kept_min"] == 1.0 and whole["dlogp_p95"] == 0.0 and whole["targets_outside"] == 0.0
    assert short["shortlist"] == 4096 and 0 < short["targets_outside"] < 1 and short["dlogp_median"] > 0
    assert 0 <= short["nuc_kept_min"] <= short["nuc_kept_mean"] <= 1


def test_nuc_shortlist_refuses_bad_input_in_one_line(capsys):
    """An unknown model or a window larger than the text read ends in one line, before any model loads."""
    with pytest.raises(SystemExit, match="unknown model 'no-such-model'"):
        nuc_shortlist.main(["-m", "no-such-model"])
    with pytest.raises(SystemExit, match="--budget must be within"):
        nuc_shortlist.main(["--tokens", "512", "--budget", "2048"])

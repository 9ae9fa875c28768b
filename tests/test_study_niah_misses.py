"""Which code a multi-key miss is nearest to (kvpot.bench.niah.nearest_code), the grid reader that
recomputes it from saved JSON (studies.niah_misses) and the niah table's column. No model: the
needles come from the seed's draw, as the grid's haystacks do."""

import json

from kvpot.bench.haystack import draw_needles
from kvpot.bench.niah import TASKS, edit_distance, nearest_code
from kvpot.bench.report import niah_table
from studies.niah_misses import main, misses


def _codes(seed=7, depth=0.5):
    needles = draw_needles(seed, depth, TASKS["multikey"])
    return needles[0].key, [n.key for n in needles[1:]]


def _changed(code: str) -> str:
    """The code with its last digit changed: one edit from it."""
    return code[:-1] + str((int(code[-1]) + 1) % 10)


def _levenshtein_by_recursion(a: str, b: str) -> int:
    """The textbook definition, for the reference: slow, and exact on short strings."""
    if not a or not b:
        return len(a) + len(b)
    return min(_levenshtein_by_recursion(a[1:], b) + 1, _levenshtein_by_recursion(a, b[1:]) + 1,
               _levenshtein_by_recursion(a[1:], b[1:]) + (a[0] != b[0]))


def test_edit_distance_is_levenshtein():
    key, others = _codes()
    for a, b in [(key, o) for o in others] + [("8521", "32518"), ("", "123"), ("85321", "85322"), (key, key)]:
        assert edit_distance(a, b) == _levenshtein_by_recursion(a, b)


def test_a_code_of_another_place_with_a_digit_changed_is_nearer_that_place():
    key, others = _codes()
    near = _changed(others[0])
    if edit_distance(near, key) <= 1:  # the draw's codes differ in more than one digit (checked, not assumed)
        raise AssertionError(f"seed 7's codes {key} and {others[0]} are too close for this case")
    assert nearest_code(f"{near}.\n\nQuestion", key, others) == "distractor"
    assert nearest_code(f" {_changed(key)}.", key, others) == "key"
    assert nearest_code(key, key, others) == "key"
    assert nearest_code("I do not know.", key, others) is None
    # equally far from the key and the nearest other code: no side taken
    tie = next(t for t in ("12345", "00000", "99999", "55555")
               if edit_distance(t, key) == min(edit_distance(t, o) for o in others))
    assert nearest_code(tie, key, others) is None


def _row(answer: str, seed=7, depth=0.5, policy="infllm", key=None) -> dict:
    asked, _ = _codes(seed, depth)
    key = key or asked
    return {"policy": policy, "length": 16000, "tokens": 16001, "depth": depth, "seed": seed, "key": key,
            "answer": answer, "correct": key in answer, "tok_s": 50.0, "read_seconds": 320.0,
            "distill_seconds": 3.0, "compactions": 14, "task": "multikey"}


def test_the_grid_reader_recomputes_which_code_each_miss_is_nearest(tmp_path, capsys):
    key, others = _codes()
    rows = [_row(f"{key}."), _row(f"{_changed(others[1])}."), _row(f"{_changed(key)}."), _row("no idea"),
            {**_row("x"), "task": "passkey"}]
    found = misses(rows)
    assert [m["nearer"] for m in found] == ["distractor", "key", None]
    assert found[0]["other"] == others[1] and found[0]["to_other"] == 1
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(rows))
    assert main([str(path)]) == 0
    assert "3 misses: 1 nearer another needle's code, 1 nearer the asked key, 1 ties or no number" in capsys.readouterr().out


def test_a_grid_of_another_haystack_or_not_a_grid_is_one_line_and_rc_1(tmp_path, capsys):
    key, _ = _codes()
    other = tmp_path / "other.json"
    other.write_text(json.dumps([_row("12", key=_changed(key))]))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    for path, says in ((other, "is not this seed's draw"), (broken, "JSONDecodeError")):
        assert main([str(path)]) == 1
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1


def test_the_niah_table_counts_misses_nearer_another_code():
    rows = []
    for depth, nearer in ((0.1, "distractor"), (0.5, "distractor"), (0.9, "key")):
        key, others = _codes(7, depth)
        rows.append({**_row(f"{others[0] if nearer == 'distractor' else _changed(key)}.", depth=depth), "nearer": nearer})
    table = niah_table(rows, "qwen2.5-coder-1.5b", "multikey", ["infllm"], [16000], [0.1, 0.5, 0.9])
    assert table.columns[-1].header == "misses nearer another code"
    assert list(table.columns[-1].cells) == ["2/3"]
    older = [{k: v for k, v in r.items() if k != "nearer"} for r in rows]  # a grid written before the field
    assert list(niah_table(older, "m", "multikey", ["infllm"], [16000], [0.1, 0.5, 0.9]).columns[-1].cells) == ["-"]
    passkey = niah_table(rows, "m", "passkey", ["infllm"], [16000], [0.1, 0.5, 0.9])
    assert "misses nearer another code" not in [c.header for c in passkey.columns]


def test_a_read_multikey_case_records_the_code_the_grid_reader_recomputes(smollm2_cut_path):
    """One real read (the cut SmolLM2, whose answer is nonsense: what is checked is where the codes come
    from): the case's `nearer` is computed from the haystack it read, and the reader, which draws the
    codes again from the seed and depth alone, gets the same codes and the same verdict."""
    from dataclasses import asdict

    from kvpot.bench.niah import read_and_ask
    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import make_policy

    eng = Engine(str(smollm2_cut_path), make_policy("streaming"), EngineConfig(budget=256, chunk=128, n_threads=2))
    try:
        r = asdict(read_and_ask(eng, "streaming", "smollm2-cut", 600, 0.5, seed=3, task="multikey"))
    finally:
        eng.close()
    key, others = _codes(3, 0.5)
    assert r["key"] == key
    assert r["nearer"] == nearest_code(r["answer"], key, others)
    # read as a miss whatever the cut model said: the reader's codes and verdict are the run's
    assert [m["nearer"] for m in misses([{**r, "correct": False}])] == [r["nearer"]]

"""`kvpot bench ruler`: the RULER tasks are drawn from their seed, hold their references where the generator
put them (and distractors that answer nothing), are as long as asked by the model's tokenizer; RULER's metric
on cases worked out here; a tiny real run through the CLI whose summary is its rows'."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from kvpot.bench import ruler
from kvpot.bench.qa_inputs import doc_tokens
from kvpot.bench.ruler import NIAH, TASKS, samples, score
from kvpot.bench.ruler_run import summarize
from tests.conftest import assert_one_line_error, run_cli

SYNTHETIC = [t for t in TASKS if t != "qa"]
NEEDLE = re.compile(r"One of the special magic (?:numbers|uuids) for (\S+) is: (\S+)\.")


@pytest.fixture(scope="module")
def count(smol):
    return lambda text: len(smol.tokenize(text))


@pytest.fixture(scope="module")
def made(count):
    """Two samples of every synthetic task at 2K tokens, seed 3."""
    return {t: samples(t, 3, count, 2048, 2) for t in SYNTHETIC}


@pytest.mark.parametrize("task", SYNTHETIC)
def test_a_sample_is_drawn_from_its_seed(task, count, made):
    again = samples(task, 3, count, 2048, 2)
    assert again == made[task]
    assert made[task][0].text != made[task][1].text  # another index, another sample
    assert samples(task, 4, count, 2048, 1)[0].text != made[task][0].text  # another seed, another sample
    # sample i does not depend on how many are drawn
    assert samples(task, 3, count, 2048, 1)[0] == made[task][0]


@pytest.mark.parametrize("task", SYNTHETIC)
def test_length_is_the_target_by_the_models_tokenizer(task, count, made):
    for s in made[task]:
        n = count(s.text)
        assert n == s.tokens
        # within one unit of the target (a line, a sentence, a word): at 2K a line of two UUIDs is 4 %
        assert 0.95 * doc_tokens(2048) <= n <= doc_tokens(2048), (task, n)


@pytest.mark.parametrize("task", SYNTHETIC)
def test_references_are_where_the_generator_put_them(task, made):
    for s in made[task]:
        (a,) = s.asks
        assert len(a.at) == len(a.refs) and a.refs
        for ref, at in zip(a.refs, a.at):
            assert s.text[at:at + len(ref)] == ref
        assert not set(a.refs) & set(a.distractors)


@pytest.mark.parametrize("task", list(NIAH))
def test_a_needle_answers_only_its_own_key(task, made):
    cfg = NIAH[task]
    for s in made[task]:
        (a,) = s.asks
        needles = NEEDLE.findall(s.text)
        asked = {k for k, _ in needles if k in a.question}
        assert len(asked) == cfg.n_q
        # every value under an asked key is a reference, every other value a distractor and no reference
        assert sorted(v for k, v in needles if k in asked) == sorted(a.refs)
        others = [v for k, v in needles if k not in asked]
        assert not set(others) & set(a.refs)
        assert len(needles) >= cfg.n_k * cfg.n_v
        if cfg.haystack == "needle":
            # the haystack is made of needles: every line after the instruction is one
            assert all(NEEDLE.fullmatch(line) for line in s.text.splitlines()[1:])
            assert len(others) >= 10
        for ref in a.refs:  # each value occurs once: nothing else in the document could be it
            assert s.text.count(ref) == 1


def test_variable_tracking_chain_resolves_to_the_references(made):
    for s in made["vt"]:
        (a,) = s.asks
        task_part = s.text[s.text.rindex(ruler.VT_INSTRUCTION):]
        value = re.search(r"assigned the value (\d+)", a.question).group(1)
        assign = dict(re.findall(r"VAR (\w+) = ((?:VAR )?\w+)", task_part))
        found = {v for v, x in assign.items() if x == value}
        while True:  # follow the chain: every variable assigned a found one
            more = {v for v, x in assign.items() if x.startswith("VAR ") and x[4:] in found} - found
            if not more:
                break
            found |= more
        assert found == set(a.refs) and len(a.refs) == 5
        # the worked example's variables are other names with another value
        assert not set(a.distractors) & found


def test_common_words_are_the_ten_most_common(made):
    for s in made["cwe"]:
        (a,) = s.asks
        task_part = s.text[s.text.rindex(ruler.CWE_INSTRUCTION):]
        counts = Counter(re.findall(r"\d+\. (\S+)", task_part))
        _, (common, rare) = ruler.cwe_frequencies(s.length)
        assert {w for w, c in counts.items() if c == common} == set(a.refs) and len(a.refs) == 10
        assert all(c == rare for w, c in counts.items() if w not in a.refs)
        assert len(counts) > 20
        assert set(a.distractors) <= set(counts)


def test_frequent_words_are_the_three_after_the_dots(made):
    for s in made["fwe"]:
        (a,) = s.asks
        counts = Counter(s.text[len(ruler.FWE_INSTRUCTION):].split())
        ranked = [w for w, _ in counts.most_common()]
        assert ranked[0] == "..."
        assert tuple(ranked[1:4]) == a.refs
        c = [counts[w] for w in ranked[:5]]
        assert c[0] > c[1] > c[2] > c[3] > c[4]  # the three are told apart by their counts


def test_qa_samples_hold_their_answers(count):
    got = samples("qa", 0, count, 8192, 2)
    assert len(got) == 2
    for s in got:
        assert len(s.asks) == 3  # per_input(8192)
        assert 0.95 * doc_tokens(8192) <= count(s.text) <= 1.05 * doc_tokens(8192)
        for a in s.asks:
            assert any(at >= 0 and s.text[at:at + len(r)] == r for r, at in zip(a.refs, a.at)), a.id
            assert a.metric == "part"
            assert not set(a.refs) & set(a.distractors)
    assert samples("qa", 0, count, 8192, 2) == got


def test_ruler_metric_on_hand_worked_cases():
    refs = ("1234567", "7654321", "1111111", "2222222")
    # string_match_all: the share of references the answer holds
    assert score("They are 1234567 and 7654321.", refs, "all") == 0.5
    assert score("1111111, 2222222, 7654321, 1234567", refs, "all") == 1.0
    assert score("none of them", refs, "all") == 0.0
    # string_match_part: one reference is enough
    assert score("It is 2222222", refs, "part") == 1.0
    assert score("It is 2222223", refs, "part") == 0.0
    # case ignored, a substring counts (as RULER's `r.lower() in pred.lower()`)
    assert score("The variables: abcde, FGHIJ", ("ABCDE", "FGHIJ", "KLMNO"), "all") == pytest.approx(2 / 3)
    assert score("Lempel-Ziv coding", ("lempel-ziv", "LZ77"), "part") == 1.0
    # control characters are line breaks, so a reference split by one is not found
    assert score("12\x0034567", ("1234567",), "all") == 0.0
    assert score("anything", (), "all") == 0.0


def test_summary_of_hand_built_cases():
    def case(task, sample, s, policy="full", **kw):
        return {"model": "m", "policy": policy, "length": 8192, "task": task, "sample": sample, "score": s, **kw}
    cases = [case("niah_multivalue", 0, 0.5), case("niah_multivalue", 1, 1.0), case("niah_multivalue", 2, 0.0),
             case("qa", 0, 1.0, closed_book_score=0.0), case("qa", 0, 0.0, closed_book_score=1.0),
             {"model": "m", "policy": "full", "length": 8192, "task": "qa", "sample": 1, "skipped": "too long"}]
    rows = {r["task"]: r for r in summarize(cases)}
    mv = rows["niah_multivalue"]
    assert (mv["n"], mv["score"], mv["samples"]) == (3, 50.0, 3)
    assert mv["low"] < 50.0 < mv["high"]
    q = rows["qa"]
    assert (q["n"], q["score"], q["closed_book"], q["closed_book_n"]) == (2, 50.0, 50.0, 2)
    assert rows["average"]["score"] == 50.0 and rows["average"]["tasks"] == 2


def test_bad_task_is_one_line():
    res = run_cli("bench", "ruler", "-m", "smollm2-135m", "--task", "niah_single_9")
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "niah_single_9")


def test_tiny_run_through_the_cli(smollm2_path, tmp_path):
    out = tmp_path / "ruler.json"
    res = run_cli("bench", "ruler", "-m", str(smollm2_path), "-P", "full", "-P", "default", "--length", "1024",
                  "--samples", "1", "--task", "niah_single_1", "--task", "qa", "--json", str(out), "-t", "2")
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    meta = data["runs"][0]
    assert meta["commit"] and meta["cpu"] and "bench ruler" in meta["command"]
    assert meta["plan"]["tasks"] == ["niah_single_1", "qa"] and meta["plan"]["samples"] == 1
    cases = data["cases"]
    # full, default (the same reading at 1K: copies) and the QA question closed book
    assert {c["policy"] for c in cases} == {"full", "default", "none"}
    by = {(c["policy"], c["id"]): c for c in cases}
    for c in cases:
        assert c["score"] == round(score(c["answer"], tuple(c["references"]), c["metric"]), 4)
        if c["policy"] == "default":
            assert c["same_reading_as"] == "full" and c["answer"] == by[("full", c["id"])]["answer"]
        if c["policy"] != "none" and c["task"] == "qa":
            assert c["closed_book_score"] == by[("none", c["id"])]["score"]
    # the summary is its rows': recomputed here from the cases
    for row in data["summary"]:
        rows = [c for c in cases if (c["policy"], c["length"], c["model"]) == (row["policy"], row["length"],
                                                                              row["model"])]
        if row["task"] == "average":
            tasks = {c["task"] for c in rows}
            means = [100 * sum(c["score"] for c in rows if c["task"] == t) / sum(c["task"] == t for c in rows)
                     for t in tasks]
            assert row["score"] == pytest.approx(sum(means) / len(means), abs=0.06)
            continue
        mine = [c["score"] for c in rows if c["task"] == row["task"]]
        assert row["n"] == len(mine)
        assert row["score"] == pytest.approx(100 * sum(mine) / len(mine), abs=0.06)
    assert {(r["policy"], r["task"]) for r in data["summary"]} >= {("full", "niah_single_1"), ("full", "qa"),
                                                                  ("default", "qa"), ("none", "qa")}


def test_common_words_draw_from_a_larger_list_only_where_needed():
    # 8K and 32K draw from words(); a 128K list (about 5,300 distinct words) from more_words(), which keeps
    # words() first, so the shorter lengths' samples do not change with it
    base, more = ruler.words(), ruler.more_words()
    assert len(base) > 2000 and more[:len(base)] == base and len(more) > 6000
    assert len(set(more)) == len(more)

"""`kvpot bench niah --sources`: whether the passage `kvpot ask --sources` would show first is the
needle's (issue 33), per case (source_hit, source_rank) and per policy in the table."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvpot.bench.niah import make_case, make_haystack, needle, needle_tokens, overlaps
from kvpot.cli.main import app
from kvpot.locator.sources import PASSAGE_TOKENS, SINK_TOKENS, SourceMap, rank, rank_between

# -- the needle's tokens and the overlap, without a model ---------------------------------------------


def test_needle_tokens_are_the_tokens_that_spell_its_characters():
    pieces = {1: b"ab", 2: b"c ", 3: b"KEY", 4: b" 12", 5: b"3.", 6: b" z"}
    text = "abc KEY 123. z"
    toks = [1, 2, 3, 4, 5, 6]
    assert needle_tokens(pieces.get, toks, text, (4, 7)) == (2, 3)       # "KEY": one whole token
    assert needle_tokens(pieces.get, toks, text, (4, 11)) == (2, 5)      # "KEY 123": ends inside token 4
    assert needle_tokens(pieces.get, toks, text, (2, 5)) == (1, 3)       # "c K": starts inside token 1
    # a SentencePiece vocabulary's leading space, which the text does not have, belongs to the first token
    spm = pieces | {1: b" ab"}
    assert needle_tokens(spm.get, toks, text, (4, 7)) == (2, 3)
    assert needle_tokens(spm.get, toks, text, (0, 1)) == (0, 1)
    # characters past one byte: offsets count characters, pieces bytes
    assert needle_tokens({1: "é".encode(), 2: b"x"}.get, [1, 2], "éx", (1, 2)) == (1, 2)
    with pytest.raises(ValueError):
        needle_tokens(pieces.get, toks, text, (14, 14))


def test_overlap_is_of_half_open_ranges():
    assert overlaps((10, 34), (33, 40)) and overlaps((33, 40), (10, 34)) and overlaps((12, 13), (0, 100))
    assert not overlaps((10, 34), (34, 40)) and not overlaps((34, 40), (10, 34))


def test_rank_between_is_rank_over_a_source_maps_document():
    """The refactor under `kvpot ask --sources`: rank(map) == rank_between(the map's first and end)."""
    smap = SourceMap()
    smap.add(1, 0, 900, list(range(900)), lambda t: b"x")
    mass = {p: 0.01 * (p % 7) for p in range(1000)}
    mass[1] = mass[2] = 40.0
    for p in range(300, 320):
        mass[p] = 2.0
    for sinks in (SINK_TOKENS, 64):
        assert rank(mass, smap, 5, sinks) == rank_between(mass, 1, 901, 5, sinks)
    assert rank(mass, SourceMap()) == []
    (p0, p1, _), *_ = rank_between(mass, 1, 901)
    assert p0 <= 300 and 320 <= p1 and p1 - p0 == PASSAGE_TOKENS


# -- against a real tokenizer ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["gemma", "smol"])
def test_needle_span_matches_the_tokenizer(model, request):
    """The needle's tokens by the pieces are the ones counted by tokenizing the text up to the needle and
    up to its end (each a prefix of the document's tokens). Before the passkey needle the text ends in a
    space that the needle's first token (" The") spells, so it is counted without that space; before a
    prose needle, the paragraph break's tokens."""
    m = request.getfixturevalue(model)

    def counted(tokens: list[int], prefix: str) -> int:
        mine = m.tokenize(prefix)
        assert tokens[:len(mine)] == mine, prefix[-40:]
        return len(mine)

    for seed, depth in ((0, 0.5), (3, 0.1), (5, 0.9)):
        hay = make_haystack(m, 1024, depth, seed)
        a, b = needle_tokens(m.piece, hay.tokens, hay.text, hay.needle_chars)
        head = hay.text[:hay.needle_chars[0]]
        assert head.endswith(". ") and hay.text[hay.needle_chars[0]:hay.needle_chars[1]] == needle(hay.key).rstrip()
        assert a == hay.needle_at == counted(hay.tokens, head.rstrip(" "))
        assert b == counted(hay.tokens, head + needle(hay.key).rstrip())
        for task in ("prose", "multikey"):
            case = make_case(m, task, 1024, depth, seed)
            a, b = needle_tokens(m.piece, case.tokens, case.text, case.needle_chars)
            start, end = case.needle_chars
            assert case.text[start - 2:start] == "\n\n" and case.key in case.text[start:end]
            # the paragraph break before it is "\n\n" or "\n", "\n" as the text goes on (SmolLM2's BPE)
            a0 = counted(case.tokens, case.text[:start].rstrip())
            assert a0 < a <= a0 + 2 and all(not m.piece(t).strip() for t in case.tokens[a0:a])
            assert case.text[start:end].startswith(m.piece(case.tokens[a]).decode().strip())
            assert b == counted(case.tokens, case.text[:end])


# -- through the CLI ---------------------------------------------------------------------------------


def test_bench_niah_sources_finds_the_needle_and_resumes(gemma_path, tmp_path):
    """Full attention answers the passkey at 1K and its top source is the needle; StreamingLLM keeps the
    ends only, so no ranked passage can be the needle's (a test that can fail both ways); InfiniPot's
    case carries the same keys. Old files without the keys still resume, and --sources runs again the
    grid's cases recorded without them."""
    out = tmp_path / "niah.json"
    args = ["bench", "niah", "-m", str(gemma_path), "--task", "passkey", "--length", "1024", "-d", "0.3",
            "--budget", "512", "--chunk", "256", "--json", str(out)]
    res = CliRunner().invoke(app, [*args, "-P", "full", "-P", "infinipot", "-P", "streaming", "--sources"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    cases = json.loads(out.read_text())
    full, pot, stream = cases
    assert [c["policy"] for c in cases] == ["full", "infinipot", "streaming"]
    for c in cases:
        assert isinstance(c["source_hit"], bool) and (c["source_rank"] is None or c["source_rank"] >= 1)
        assert c["source_hit"] == (c["source_rank"] == 1)
        a, b = c["needle_span"]
        assert 1 <= a < b <= c["tokens"] and b - a < 40
    assert full["correct"] and full["source_hit"], full
    assert not stream["correct"] and not stream["source_hit"] and stream["source_rank"] is None, stream
    assert "source@1" in res.output and "100% (1/1)" in res.output

    # an old file: no source keys. Without --sources it resumes as before (nothing runs again)
    old = [{k: v for k, v in c.items() if k not in ("source_hit", "source_rank", "needle_span")} for c in cases]
    out.write_text(json.dumps(old))
    res = CliRunner().invoke(app, [*args, "-P", "full", "-P", "infinipot", "-P", "streaming", "--resume"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text()) == old and "source@1" not in res.output
    # with --sources, the grid's case without them runs again; the others stay as they were
    res = CliRunner().invoke(app, [*args, "-P", "streaming", "--resume", "--sources"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    again = json.loads(out.read_text())
    assert again[:2] == old[:2]
    assert {k: again[2][k] for k in ("answer", "source_hit", "source_rank", "needle_span")} == \
        {k: stream[k] for k in ("answer", "source_hit", "source_rank", "needle_span")}

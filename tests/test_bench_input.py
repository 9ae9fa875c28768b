"""The throughput bench's input, generated a part at a time (kvpot.bench.logbook.generated_pieces): the same
tokens as the whole list, never more than one logbook part held, so a long read's peak RSS is the reading's."""

from __future__ import annotations

from kvpot.bench.logbook import generated_pieces, generated_tokens, logbook


def test_pieces_are_the_list_a_part_at_a_time(smol):
    n = 40_000
    pieces = list(generated_pieces(smol, n, seed=3))
    part = len(smol.tokenize(logbook(n_entries=400, seed=3000, fact_at=2.0)[0]))
    assert len(pieces) >= 2 and all(len(p) <= part for p in pieces)
    # the reference: every part tokenized alone, joined, cut to n
    ref, k = [], 0
    while len(ref) < n:
        ref += smol.tokenize(logbook(n_entries=400, seed=3000 + k, fact_at=2.0)[0])
        k += 1
    assert [t for p in pieces for t in p] == ref[:n] == generated_tokens(smol, n, seed=3)


def test_pieces_from_a_token_on_are_the_rest_of_the_list(smol):
    """A stopped read goes on with the tokens after its last one, also from inside a part."""
    n = 40_000
    whole = generated_tokens(smol, n, seed=1)
    for skip in (0, 1, 17_000, n - 5, n):
        assert [t for p in generated_pieces(smol, n, seed=1, skip=skip) for t in p] == whole[skip:]

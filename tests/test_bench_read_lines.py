"""A benchmark's reading says how far it got after every chunk (kvpot.bench.read_lines): a case past the
window reads for up to an hour, and a grid silent meanwhile cannot be told from a hung one."""

from __future__ import annotations

from kvpot.bench.read_lines import reading_line


def test_the_line_says_tokens_rate_and_compactions():
    assert reading_line("full 512, input 1", 1024, 2048, 2.0, 1) == \
        "full 512, input 1: read 1,024 of ~2,048 tokens, 512 tok/s, 1 compaction"
    assert reading_line("x", 10, None, 0.0, 3).startswith("x: read 10 tokens, ")  # an unknown total, no time yet
    # a reading gone on from its save at token 1,000: the rate is of the 1,048 tokens this part read
    assert reading_line("x", 2048, 4096, 2.0, 2, before=1000) == "x: read 2,048 of ~4,096 tokens, 524 tok/s, 2 compactions"


def test_a_niah_case_says_each_chunk_up_to_the_last_token_and_its_compactions(smollm2_cut_path):
    from kvpot.bench.niah import read_and_ask
    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import make_policy

    eng = Engine(str(smollm2_cut_path), make_policy("streaming"), EngineConfig(budget=256, chunk=128, n_threads=2))
    lines: list[str] = []
    try:
        r = read_and_ask(eng, "streaming", "smollm2-cut", 600, 0.5, seed=3, task="multikey", on_read=lines.append)
    finally:
        eng.close()
    assert r.compactions > 0  # the read passed the budget: the lines must count what the engine did
    assert len(lines) >= 600 // 128 and all(line.startswith("streaming 600 @ 0.5, seed 3: read ") for line in lines)
    n_case = int(lines[-1].split(" of ~")[1].split(" ")[0].replace(",", ""))
    assert f"read {n_case:,} of ~{n_case:,} tokens" in lines[-1]
    assert lines[-1].endswith(f"{r.compactions} compaction{'s' if r.compactions != 1 else ''}"), (lines[-1], r)

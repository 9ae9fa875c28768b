"""Sessions: saved contexts reopen to the same logits, chat turns stay bounded, reading can stop."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvpot.bench.logbook import logbook
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.session.answer import _partial_stop
from kvpot.session.context_file import read_context, write_context
from kvpot.session.session import ReadingStopped, Session
from kvpot.session.settings import RunSettings

SMALL = RunSettings(budget=512, chunk=128, threads=2, prompt="completion", max_tokens=12)


@pytest.fixture(scope="module")
def doc_file(tmp_path_factory):
    text, question, answer = logbook()
    path = tmp_path_factory.mktemp("doc") / "logbook.txt"
    path.write_text(text)
    return path, question, answer


def _session(model_path, resettable: bool = True, **changes) -> Session:
    return Session(read_model_facts(model_path), "smollm2-135m", dataclasses.replace(SMALL, **changes).check(),
                   resettable=resettable)


def _question_logits(s: Session, question: str) -> np.ndarray:
    return s.engine.prompt(s._tokens(s.format.first_question(question)))


@pytest.mark.parametrize("policy", ["infinipot", "snapkv", "streaming", "h2o", "infinipot:cr_rope=false", "infllm"])
def test_reopened_context_gives_the_same_logits(smollm2_cut_path, doc_file, tmp_path, policy):
    path, question, _ = doc_file
    s = _session(smollm2_cut_path, policy=policy)
    s.set_question(question)
    s.read(collect_sources([str(path)]))
    assert s.engine.n_compactions > 0
    s.save(tmp_path / "c.kvctx")
    want = _question_logits(s, question)
    s.engine.close()
    r = Session.reopen(tmp_path / "c.kvctx", read_model_facts(smollm2_cut_path), "smollm2-135m")
    assert (r.doc_tokens, r.sources) == (s.doc_tokens, s.sources)
    got = _question_logits(r, question)
    np.testing.assert_array_equal(got, want)
    store = getattr(r.engine.policy, "_store_path", None)  # InfLLM: the saved context references its block store
    r.engine.close()
    if store:
        import os

        os.unlink(store)


def test_reopen_refuses_another_model_and_runtime(smollm2_cut_path, gemma_path, doc_file, tmp_path):
    path, question, _ = doc_file
    s = _session(smollm2_cut_path, policy="streaming")
    s.read(collect_sources([str(path)]))
    ctx = tmp_path / "c.kvctx"
    s.save(ctx)
    s.engine.close()
    with pytest.raises(KvpotError, match="saved with model smollm2-135m"):
        Session.reopen(ctx, read_model_facts(gemma_path), "gemma3-270m")
    saved = read_context(ctx)
    saved.header["runtime"]["abi"] = 999
    write_context(ctx, saved)
    with pytest.raises(KvpotError, match="saved by kvpot ABI 999"):
        Session.reopen(ctx, read_model_facts(smollm2_cut_path), "smollm2-135m")


def test_chat_turns_stay_in_the_bounded_memory(smollm2_cut_path, doc_file):
    path, question, _ = doc_file
    s = _session(smollm2_cut_path, policy="snapkv", budget=256, chunk=64)
    s.read(collect_sources([str(path)]))
    n_ctx = s.engine.ctx.n_ctx
    compactions = s.engine.n_compactions
    long_question = "Tell me about the voyage. " * 60 + question  # longer than the free cells
    for q in [question, long_question, "Who mended the foresail?", question, long_question]:
        answer = "".join(s.ask(q))
        assert answer.strip()
        assert s.engine.n_cells <= n_ctx
        assert s.engine.stats().n_cells_used == s.engine.n_cells
    assert s.engine.n_compactions > compactions  # the long turns went through the pot
    assert s.turns == 5
    s.engine.close()


def test_a_long_question_reports_progress_like_a_document(smollm2_cut_path, doc_file):
    """A question longer than the free cells is read through the pot chunk by chunk, with progress:
    from 0 to every token of the turn, over several chunks; a short one reports nothing."""
    path, question, _ = doc_file
    s = _session(smollm2_cut_path, policy="snapkv", budget=256, chunk=64)
    s.read(collect_sources([str(path)]))
    short, long_events = [], []
    "".join(s.ask(question, on_progress=short.append))
    assert short == []
    long_question = "Tell me about the voyage. " * 150 + question  # more than the context's cells
    n_turn = len(s._tokens(s.format.follow_up(long_question)))
    assert s.engine.prompt_is_read(n_turn)
    answer = "".join(s.ask(long_question, on_progress=long_events.append))
    assert answer.strip()
    read = [p.tokens for p in long_events]
    assert read[0] == 0 and read[-1] == n_turn and read == sorted(read)
    assert len(read) >= 2 + n_turn // 64 - 1  # the start, one event per chunk, the end
    assert {p.est_total for p in long_events} == {n_turn}
    assert all(p.cells <= p.capacity == s.engine.ctx.n_ctx for p in long_events)
    s.engine.close()


def test_reset_conversation_returns_to_the_document(smollm2_cut_path, doc_file):
    path, question, _ = doc_file
    s = _session(smollm2_cut_path, policy="streaming")
    s.read(collect_sources([str(path)]))
    first = "".join(s.ask(question))
    "".join(s.ask("And who kept the logbook?"))
    s.reset_conversation()
    assert s.turns == 0
    assert "".join(s.ask(question)) == first
    s.engine.close()


def test_a_session_that_answers_once_keeps_no_copy_and_answers_the_same(smollm2_cut_path, doc_file):
    """`kvpot ask`'s session (resettable=False) holds no copy of the state after reading, the pot's
    size again in memory; its answer is the resettable session's, and /reset says why it cannot."""
    path, question, _ = doc_file
    kept = _session(smollm2_cut_path, policy="streaming")
    kept.read(collect_sources([str(path)]))
    want = "".join(kept.ask(question))
    assert kept._after_reading is not None and len(kept._after_reading.seq) > 0
    kept.engine.close()
    once = _session(smollm2_cut_path, policy="streaming", resettable=False)
    once.read(collect_sources([str(path)]))
    assert once._after_reading is None
    assert "".join(once.ask(question)) == want
    with pytest.raises(KvpotError, match="keeps no copy of the read document"):
        once.reset_conversation()
    once.engine.close()


def test_stopped_reading_keeps_what_was_read(smollm2_cut_path, doc_file):
    path, question, _ = doc_file
    s = _session(smollm2_cut_path, policy="streaming")
    seen = []

    def stop_after_three(p):
        seen.append(p.tokens)
        if len(seen) == 3:
            raise ReadingStopped

    with pytest.raises(ReadingStopped):
        s.read(collect_sources([str(path)]), stop_after_three)
    assert s.doc_tokens == seen[-1] == s.engine.tokens_seen
    s.finish_reading()
    assert "".join(s.ask(question)).strip()
    s.engine.close()


def test_partial_stop_holds_back_only_prefixes():
    stops = ("\nQuestion:", "\nAnswer:")
    assert _partial_stop("52445.\nAns", stops) == 4
    assert _partial_stop("52445.\n", stops) == 1
    assert _partial_stop("52445.", stops) == 0

"""A stopped read goes on later: saved where it stopped, reopened, and read to its end, it leaves the pot
the uninterrupted read leaves (the same cells, positions and next logits), for every method; inputs that
changed since are refused before anything more is read."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from kvpot.bench.logbook import logbook
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.session.context_file import read_context
from kvpot.session.session import ReadingStopped, Session
from kvpot.session.settings import RunSettings
from kvpot.state.read_point import reopen_sources

SMALL = RunSettings(budget=512, chunk=128, threads=2, prompt="completion", max_tokens=12)
POLICIES = ["infinipot", "imdc:pruner=snapkv", "infllm", "streaming", "snapkv", "h2o", "edgeinfinite:gate=init"]


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """Two files (read together: a header between them is part of the text) and the question."""
    text, question, _ = logbook()
    text = text[:text.index("\n", 5200) + 1]  # about 1,500 tokens: three times the budget, two tokenized pieces
    d = tmp_path_factory.mktemp("docs")
    half = text.index("\n", 4300) + 1  # the tokenizer cuts its first piece at the end of a.txt (4,096 characters or more)
    (d / "a.txt").write_text(text[:half])
    (d / "b.txt").write_text(text[half:] + "\nThe café's ledger ends here. ü\n")  # characters of two bytes
    return [str(d / "a.txt"), str(d / "b.txt")], question


def _session(model_path, policy: str) -> Session:
    return Session(read_model_facts(model_path), "smollm2-135m",
                   dataclasses.replace(SMALL, policy=policy).check(), resettable=False)


def _stop_after(n_chunks: int):
    seen = []

    def on_progress(p) -> None:
        seen.append(p.tokens)
        if len(seen) == n_chunks:
            raise ReadingStopped
    return on_progress


def _next_logits(s: Session, question: str) -> np.ndarray:
    return s.engine.prompt(s._tokens(s.format.first_question(question)))


def _cleanup(s: Session) -> None:
    store = getattr(s.engine.policy, "_store_path", None)  # InfLLM's block store, kept for a saved context
    s.close()
    if store and os.path.exists(store):
        os.unlink(store)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_read_stopped_saved_and_continued_ends_as_the_whole_read(smollm2_cut_path, docs, tmp_path, policy):
    paths, question = docs
    whole = _session(smollm2_cut_path, policy)
    whole.set_question(question)
    whole.read(collect_sources(paths))
    want_positions = whole.engine.positions.copy()
    want_map = whole.source_map.to_header()
    want = _next_logits(whole, question)
    assert whole.engine.n_compactions > 0  # the stop falls in a read that compacts on both sides of it
    _cleanup(whole)

    s = _session(smollm2_cut_path, policy)
    s.set_question(question)
    with pytest.raises(ReadingStopped):
        s.read(collect_sources(paths), _stop_after(6))
    point = s.read_point
    assert point is not None and point.next_position == s.engine.tokens_seen
    assert 0 < s.doc_tokens < whole.doc_tokens
    ctx = tmp_path / "stopped.kvctx"
    s.save(ctx)
    s.engine.close()  # not _cleanup: the saved context keeps InfLLM's store

    r = Session.reopen(ctx, read_model_facts(smollm2_cut_path), "smollm2-135m", resettable=False)
    assert r.read_point == point and r.doc_tokens == s.doc_tokens
    r.set_question(question)
    r.read(reopen_sources(r.read_point), resume=r.read_point)
    assert r.read_point is None and r.doc_tokens == whole.doc_tokens
    np.testing.assert_array_equal(r.engine.positions, want_positions)
    assert r.source_map.to_header() == want_map
    np.testing.assert_array_equal(_next_logits(r, question), want)
    _cleanup(r)


def test_a_continued_read_can_stop_and_go_on_again(smollm2_cut_path, docs, tmp_path):
    """Stopped twice (the second time inside the continued read), it still ends as the whole read."""
    paths, question = docs
    whole = _session(smollm2_cut_path, "infinipot")
    whole.read(collect_sources(paths))
    want = _next_logits(whole, question)
    _cleanup(whole)

    s = _session(smollm2_cut_path, "infinipot")
    with pytest.raises(ReadingStopped):
        s.read(collect_sources(paths), _stop_after(3))
    s.save(tmp_path / "one.kvctx")
    s.close()
    r = Session.reopen(tmp_path / "one.kvctx", read_model_facts(smollm2_cut_path), "smollm2-135m")
    first = r.read_point
    with pytest.raises(ReadingStopped):
        r.read(reopen_sources(first), _stop_after(5), resume=first)
    assert r.read_point.next_position > first.next_position
    r.save(tmp_path / "two.kvctx")
    r.close()
    t = Session.reopen(tmp_path / "two.kvctx", read_model_facts(smollm2_cut_path), "smollm2-135m")
    t.read(reopen_sources(t.read_point), resume=t.read_point)
    np.testing.assert_array_equal(_next_logits(t, question), want)
    _cleanup(t)


@pytest.mark.parametrize("chunks", [3, 11], ids=["in-the-first-piece", "past-it"])
def test_a_changed_input_is_refused_before_reading_more(smollm2_cut_path, docs, tmp_path, chunks):
    """Stopped in the first piece the tokenizer cut (the point's text digest covers nothing: the tokens
    read of that piece are checked) or past it; one character changed before the point is found."""
    paths, _ = docs
    d = tmp_path / "in"
    d.mkdir()
    mine = []
    for p in paths:
        q = d / os.path.basename(p)
        q.write_bytes(open(p, "rb").read())
        mine.append(str(q))
    s = _session(smollm2_cut_path, "streaming")
    with pytest.raises(ReadingStopped):
        s.read(collect_sources(mine), _stop_after(chunks))
    ctx = tmp_path / "stopped.kvctx"
    s.save(ctx)
    s.close()
    point = read_context(ctx).header["read_point"]
    assert point["skip"] > 100 and (point["char"] > 100) == (chunks > 3)

    text = open(mine[0]).read()
    open(mine[0], "w").write(text[:100] + text[100].swapcase() + text[101:])  # one character before the point
    r = Session.reopen(ctx, read_model_facts(smollm2_cut_path), "smollm2-135m")
    seen = r.engine.tokens_seen
    with pytest.raises(KvpotError, match="changed since the context was saved"):
        r.read(reopen_sources(r.read_point), resume=r.read_point)
    assert r.engine.tokens_seen == seen  # nothing more was read
    os.unlink(mine[1])
    with pytest.raises(KvpotError, match="no longer at"):
        reopen_sources(r.read_point)
    r.close()


def test_a_context_read_to_its_end_or_answered_has_no_read_point(smollm2_cut_path, docs, tmp_path):
    paths, question = docs
    s = _session(smollm2_cut_path, "streaming")
    with pytest.raises(ReadingStopped):
        s.read(collect_sources(paths), _stop_after(4))
    s.finish_reading()
    "".join(s.ask(question))  # the conversation follows the document: its rest cannot be put before it
    s.save(tmp_path / "asked.kvctx")
    s.close()
    assert "read_point" not in read_context(tmp_path / "asked.kvctx").header
    w = _session(smollm2_cut_path, "streaming")
    w.read(collect_sources(paths))
    assert w.read_point is None
    w.save(tmp_path / "whole.kvctx")
    w.close()
    assert "read_point" not in read_context(tmp_path / "whole.kvctx").header


def test_a_continued_read_estimates_its_length_from_its_point(smollm2_cut_path, tmp_path):
    """The progress line's "of ~N tokens" of a continued read: the tokens before the point are known, the
    rest is estimated at the rate measured after it. Prose, then numbers (~1 byte a token here against
    ~4): scaled from the numbers alone, the whole input would look twice its length."""
    text, question, _ = logbook()
    prose = text[:text.index("\n", 4300) + 1]  # the first tokenized piece ends with it
    rng = np.random.default_rng(7)
    numbers = "\n".join(" ".join(f"{v:04d}" for v in rng.integers(0, 10_000, 12)) for _ in range(30)) + "\n"
    (tmp_path / "a.txt").write_text(prose)
    (tmp_path / "b.txt").write_text(numbers)
    paths = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]

    whole = _session(smollm2_cut_path, "infinipot")
    whole.read(collect_sources(paths))
    true_total = whole.doc_tokens
    _cleanup(whole)

    s = _session(smollm2_cut_path, "infinipot")
    with pytest.raises(ReadingStopped):
        s.read(collect_sources(paths), _stop_after(12))  # 1,536 tokens: inside the numbers
    point = s.read_point
    assert point.char >= len(prose), (point.char, len(prose))
    s.save(tmp_path / "stopped.kvctx")
    s.close()

    r = Session.reopen(tmp_path / "stopped.kvctx", read_model_facts(smollm2_cut_path), "smollm2-135m")
    seen = []
    r.read(reopen_sources(r.read_point), lambda p: seen.append(p.est_total), resume=r.read_point)
    assert r.doc_tokens == true_total
    assert abs(seen[0] - true_total) <= 0.1 * true_total, (seen[0], true_total)
    _cleanup(r)

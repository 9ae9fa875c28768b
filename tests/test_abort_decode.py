"""A signal that arrives during a document chunk's decode stops it mid-graph (kvpot.runtime.abort,
ggml_ext/kvpot-abort.cpp), and the chunk leaves nothing behind: reading on from where it stopped ends
in the same pot, and the same answer logits, as a reading never stopped (computed in the same test).

The signal is staged deterministically: a cb_eval oracle writes a byte to the watched pipe, as Python's
C signal handler does, when layer 3's attention input is computed, so the abort lands in the middle of
the graph, after layers 0-2 wrote their keys and values into the chunk's cells and before the output head
(the methods without a trained part run on SmolLM2 cut to 4 blocks and Gemma-3 cut to 6, conftest.py's
smollm2_cut_path and gemma_cut_path)."""

from __future__ import annotations

import functools
import os
import signal

import numpy as np
import pytest
from potlib import TensorCatcher

from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.policies import make_policy
from kvpot.runtime import abort
from kvpot.runtime.llama import LlamaContext

BUDGET, CHUNK = 256, 64
STOP_AT_STEP = 9  # past several compactions of a 256-cell pot
MARK = "attn_norm-3"


class SignalInGraph:
    """cb_eval: while `armed`, write SIGINT's number to the watched pipe when MARK is computed."""

    def __init__(self):
        import llama_cpp

        self.armed = False
        self.fired = 0
        self.names = TensorCatcher(set())  # for its ggml_get_name binding
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, t, ask, user_data):
        name = self.names.ggml.ggml_get_name(t).decode()
        if ask:
            return name == MARK
        if name == MARK and self.armed:
            self.armed = False
            self.fired += 1
            os.write(abort._pipe[1], bytes([signal.SIGINT]))
        return True


@pytest.fixture
def watching():
    assert abort.watch_signals()
    yield
    abort.stop_watching()


def _engine(path: str, spec: str, oracle: SignalInGraph, monkeypatch, budget: int = BUDGET,
            chunk: int = CHUNK) -> Engine:
    import kvpot.engine

    monkeypatch.setattr(kvpot.engine, "LlamaContext", functools.partial(LlamaContext, cb_eval=oracle.callback))
    return Engine(path, make_policy(spec), EngineConfig(budget=budget, chunk=chunk, n_threads=2))


def _state(eng: Engine) -> tuple[np.ndarray, np.ndarray]:
    return eng.positions.copy(), eng.pot.cell_positions(eng.n_cells)


@pytest.mark.parametrize("model,spec,budget,chunk", [
    ("smollm2_cut_path", "infinipot", BUDGET, CHUNK),      # NuC's log-probs and CaP's taps in the graph
    ("smollm2_cut_path", "snapkv", BUDGET, CHUNK),         # taps on the chunk's last rows
    ("smollm2_path", "locret", BUDGET, CHUNK),         # the shipped retaining heads (the whole model's) score in the graph
    ("smollm2_path", "edgeinfinite", BUDGET, CHUNK),   # the shipped gate (the whole model's) reads the folded memory
    ("smollm2_cut_path", "infllm", 512, 128),              # block lookups and the query capture
    ("gemma_cut_path", "streaming", BUDGET, CHUNK),    # the sliding-window layers' cache rolls back too
])
def test_a_signal_mid_chunk_takes_the_chunk_back(request, model, spec, budget, chunk, watching, monkeypatch):
    path = str(request.getfixturevalue(model))
    text, question, _ = logbook(n_entries=40 if chunk == CHUNK else 80, seed=5)

    oracle = SignalInGraph()
    ref = _engine(path, spec, oracle, monkeypatch, budget, chunk)
    tokens = ref.model.tokenize(text)
    n_bos = len(ref.model.bos())
    ref.feed_stream([tokens], abortable=True)  # nothing written to the pipe: never stopped
    assert oracle.fired == 0 and ref.step > STOP_AT_STEP + 3 and ref.pot.stats().n_compactions >= 3
    ref_state = _state(ref)
    ref_logits = ref.prompt(ref.model.tokenize(question))
    ref.close()

    oracle = SignalInGraph()
    eng = _engine(path, spec, oracle, monkeypatch, budget, chunk)
    before = {}

    def on_chunk(ev):
        if eng.step == STOP_AT_STEP:
            before.update(tokens=eng.tokens_seen, cells=eng.n_cells, state=_state(eng),
                          compactions=eng.pot.stats().n_compactions)
            oracle.armed = True  # the next chunk's decode gets the signal in its graph

    with pytest.raises(abort.Interrupted):
        eng.feed_stream([tokens], abortable=True, on_chunk=on_chunk)
    assert oracle.fired == 1
    assert abort.drain() == []  # the decode's own signal was taken out of the pipe
    # the stopped chunk left nothing: the pot, its cells and the counters are those of the chunk before
    assert eng.tokens_seen == before["tokens"] and eng.n_cells == before["cells"]
    assert eng.pot.stats().n_compactions == before["compactions"]
    assert eng.pot.stats().n_cells_used == eng.n_cells
    for got, want in zip(_state(eng), before["state"]):
        np.testing.assert_array_equal(got, want)

    # reading on from the first token the stopped chunk held ends where the unstopped reading ended
    eng.feed_stream([tokens[eng.tokens_seen - n_bos:]], abortable=True)
    assert oracle.fired == 1
    for got, want in zip(_state(eng), ref_state):
        np.testing.assert_array_equal(got, want)
    logits = eng.prompt(eng.model.tokenize(question))
    assert int(np.argmax(logits)) == int(np.argmax(ref_logits))
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-4)
    eng.close()


def test_a_signal_before_the_first_chunk_puts_the_bos_back(smollm2_path, watching, monkeypatch):
    oracle = SignalInGraph()
    eng = _engine(str(smollm2_path), "streaming", oracle, monkeypatch)
    tokens = eng.model.tokenize("one two three four five six seven eight nine ten " * 20)
    oracle.armed = True
    with pytest.raises(abort.Interrupted):
        eng.feed_stream([tokens], abortable=True)
    assert eng.tokens_seen == 0 and eng.n_cells == 0 and eng.pot.stats().n_cells_used == 0
    eng.feed_stream([tokens], abortable=True)
    assert eng.tokens_seen == len(tokens) + len(eng.model.bos())
    eng.close()


def test_without_watching_or_arming_a_decode_runs_whole(smollm2_path, monkeypatch):
    """A library user's process (no watch_signals) and a decode not marked abortable (the answer, the
    question) ignore the pipe: the byte stays for the next phase's drain."""
    oracle = SignalInGraph()
    eng = _engine(str(smollm2_path), "streaming", oracle, monkeypatch)
    tokens = eng.model.tokenize("alpha beta gamma delta " * 40)
    abort.stop_watching()  # as in a process that never called watch_signals (an in-process CLI test may have)
    eng.feed_stream([tokens], abortable=True)  # not watching: the oracle has no pipe to write to
    assert abort.watch_signals()
    try:
        oracle.armed = True
        eng.feed_stream([tokens])  # watching, but not abortable
        assert oracle.fired == 1
        assert eng.tokens_seen == 2 * len(tokens) + len(eng.model.bos())
        assert abort.drain() == [signal.SIGINT]
    finally:
        abort.stop_watching()
    eng.close()


def test_a_signal_while_loading_stops_the_load(smollm2_path, watching, monkeypatch):
    """A signal that arrives while llama.cpp loads the model stops the load (the loader's progress callback asks
    the same pipe): no model, and KeyboardInterrupt where the signal's own handler did not end the process. A
    signal handled before the load does not stop it, and a process that does not watch signals loads whole."""
    from kvpot.runtime.llama import LlamaModel

    told = abort.tell

    def tell_then_signal(lib):  # the signal arrives as the load starts, after the stale ones were drained
        ok = told(lib)
        os.write(abort._pipe[1], bytes([signal.SIGINT]))
        return ok

    monkeypatch.setattr(abort, "tell", tell_then_signal)
    with pytest.raises(KeyboardInterrupt):
        LlamaModel(str(smollm2_path))
    assert not abort.pending()  # the byte was taken: the next phase starts clean
    monkeypatch.setattr(abort, "tell", told)
    os.write(abort._pipe[1], bytes([signal.SIGINT]))  # handled before loading: drained, the load runs
    model = LlamaModel(str(smollm2_path))
    assert model.n_vocab > 0
    model.close()
    abort.stop_watching()
    try:  # not watching (a library user's process): nothing stops a load
        model = LlamaModel(str(smollm2_path))
        model.close()
    finally:
        assert abort.watch_signals()

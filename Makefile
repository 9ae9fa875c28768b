# kvpot: `make demo` sets everything up and runs the sample; `make test` runs the tests.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
MODEL   ?= qwen2.5-coder-0.5b
# e.g. --system-site-packages to reuse a distribution's numpy (Termux: pkg install python-numpy)
VENV_FLAGS ?=
export PYTHONPATH :=

.PHONY: all venv runtime install pull pull-test-models train-deps demo bench-qa test test-long fuzz test-aarch64 test-vulkan clean-venv

all: install

# build tools the patched llama-cpp-python wheel needs (built without isolation so cmake's build dir is reused)
$(BIN)/.kvpot-venv:
	$(PY) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "scikit-build-core[pyproject]>=0.9.2" "pytest>=7"
	touch $@
venv: $(BIN)/.kvpot-venv

# patched llama.cpp: served from the wheel cache when patches/, ggml_ext/ and CMAKE_ARGS are unchanged
runtime: venv
	cd $(CURDIR) && PYTHONPATH=$(CURDIR) $(BIN)/python -m kvpot.build

install: runtime
	$(BIN)/python -m pip install -q -e ".[test]"

pull: install
	$(BIN)/kvpot pull $(MODEL)

pull-test-models: install
	$(BIN)/kvpot pull smollm2-135m
	$(BIN)/kvpot pull gemma3-270m
	$(BIN)/kvpot pull qwen2.5-coder-0.5b

demo: pull
	$(BIN)/kvpot demo --model $(MODEL)

# answer quality on real documents (docs/benchmarks.md), the 8K and 32K parts: hours on 2 cores.
# Every case is written to $(QA_JSON) as it ends; running it again continues where it stopped (--resume)
QA_JSON ?= bench-qa.json
bench-qa: install
	$(BIN)/kvpot pull qwen2.5-coder-1.5b
	$(BIN)/kvpot bench qa -m qwen2.5-coder-1.5b -P full -P default --length 8192 --length 32768 \
		--json $(QA_JSON) --resume

# the trained parts' tests (kvpot train locret|edgeinfinite) need torch, kvpot's optional `train` extra;
# this pin is the CPU build (other versions may pull a multi-GB CUDA build)
TORCH ?= torch==2.13.0
$(BIN)/.kvpot-torch: $(BIN)/.kvpot-venv
	$(BIN)/python -m pip install -q "$(TORCH)"
	touch $@
train-deps: $(BIN)/.kvpot-torch

test: pull-test-models train-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=30

# the suite's long-input checks at full length (tests/test_engine.py: 64K tokens through a 1,024-cell
# pot on both test models, ~12 min on 2 cores; `make test` reads 16K)
test-long: pull-test-models
	KVPOT_LONG_TOKENS=65536 $(BIN)/python -m pytest -q tests/test_engine.py -k long_input

# the long fuzz run (docs/fuzzing.md): 100,000 inputs per strategy; `make test` runs 300 each.
# One process per target (a tests/test_fuzz*.py file, or a -k selection in tests/test_fuzz.py), side by
# side, each writing its counts to fuzz-report-TARGET.json.
FUZZ_EXAMPLES ?= 100000
FUZZ_TARGETS  ?= $(patsubst tests/test_fuzz_%.py,%,$(wildcard tests/test_fuzz_*.py))
fuzz: pull-test-models
	@pids=; for t in context gguf $(FUZZ_TARGETS); do \
		if [ -f tests/test_fuzz_$$t.py ]; then sel="tests/test_fuzz_$$t.py"; else sel="tests/test_fuzz.py -k $$t"; fi; \
		KVPOT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) KVPOT_FUZZ_REPORT=$(CURDIR)/fuzz-report-$$t.json \
			$(BIN)/python -m pytest -q -p no:cacheprovider $$sel & pids="$$pids $$!"; \
	done; fail=0; for p in $$pids; do wait $$p || fail=1; done; exit $$fail

# not part of `make test` (a cross build of llama.cpp, ~15 min on 2 cores): libllama + kvpot for aarch64,
# tests/pot_check under qemu-aarch64-static vs natively, SmolLM2 Q4_1 and a Q4_0 copy (docs/termux.md)
test-aarch64: pull-test-models
	tests/run_aarch64.sh $(BIN)/python

# not part of `make test` (the Vulkan build compiles ~170 shaders; times in docs/pot.md, "Vulkan"): the runtime
# built with CMAKE_ARGS=-DGGML_VULKAN=ON into its own venv, so .venv keeps its CPU runtime; the pot's
# exactness tests on the first Vulkan device (Mesa's lavapipe here), each test checking it ran there
VK_VENV  ?= .venv-vulkan
VK_TESTS ?= tests/vulkan_checks.py \
	tests/test_pot.py::test_keeping_every_cell_matches_stock \
	tests/test_pot.py::test_same_set_for_every_head_matches_seq_rm -k "not keep_pos" \
	tests/test_pot.py::test_per_head_sets_are_read_back_exactly \
	tests/test_pot.py::test_score_taps_equal_kq_soft_max_rows tests/test_pot.py::test_score_taps_with_quantized_k_cache \
	tests/test_pot.py::test_logprobs_equal_log_softmax_of_logits \
	tests/test_pot_layers.py::test_dead_cells_leave_each_layers_softmax \
	tests/test_pot_layers.py::test_dead_cells_with_flash_attention_f16_mask \
	tests/test_pot_gemma.py::test_cr_rope_keys_equal_numpy_rope_per_layer \
	tests/test_pot_gemma.py::test_score_taps_equal_kq_soft_max_on_global_layers \
	tests/test_retaining_heads.py::test_in_graph_scores_equal_numpy_on_captured_qkv \
	tests/test_memory_gate.py::test_in_graph_memory_equals_numpy_through_folds \
	tests/test_infllm.py::test_read_at_and_insert_rotate_like_numpy
test-vulkan:
	tests/run_vulkan.sh $(VK_VENV) -v -p no:cacheprovider $(VK_TESTS)

clean-venv:
	rm -rf $(VENV)

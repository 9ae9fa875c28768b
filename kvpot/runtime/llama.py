"""Thin owning wrappers over llama.cpp's model and context (through llama_cpp's raw bindings).

They free what they allocate, and expose only what the engine needs: tokenize, decode a
batch at given positions, read logits, clear memory.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from kvpot.errors import KvpotError
from kvpot.runtime import abort, logs
from kvpot.runtime.library import load as load_runtime
from kvpot.runtime.owned import Owned

# more than any model has: llama.cpp offloads min(this, n_layer + 1) layers
N_GPU_LAYERS_ALL = 999

# rows a decode of n tokens marks as outputs, by its `logits` argument
OUTPUT_ROWS = {"last": lambda n: 1, "all": lambda n: n, "none": lambda n: 0}

# llama.h: enum ggml_type values accepted for the KV cache
CACHE_TYPES = {"f16": 1, "f32": 0, "q8_0": 8}


@dataclass(frozen=True)
class ContextParams:
    n_ctx: int
    n_batch: int
    n_threads: int
    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    seed: int = 0
    # rows of logits one decode may mark as outputs, and the rows the compute buffer reserves for the
    # output head (llama_context_params.n_outputs_max); 0: every row of a step, llama.cpp's default.
    # kvpot.runtime.outputs says what a kvpot context needs
    n_outputs_max: int = 0


class LlamaModel(Owned):
    """A loaded GGUF model; the file must have been checked by kvpot.models.gguf_file first."""

    def __init__(self, path: str, vocab_only: bool = False, release_copied: bool = True,
                 release_while_loading: bool = True):
        """vocab_only: the tokenizer and metadata without the weights (counting tokens before the
        context is sized). release_copied: give back the file pages of weights llama.cpp copied
        elsewhere (`release_copied()`); release_while_loading: give back the file's pages as the loader
        copies weights out of them, so loading does not peak at the file plus its copies
        (kvpot_load_progress_release). Both off only for the tests that measure them."""
        runtime = load_runtime()
        import llama_cpp as L

        self._L = L
        # llama.cpp's info logs would drown the progress bar; errors still reach stderr
        logs.install()
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.vocab_only = vocab_only

        # every layer (and its part of the pot) on the devices llama.cpp has: a GPU backend's, the RPC
        # servers' (kvpot ask --rpc); nothing changes without one. llama.cpp's default (-1) means "fit
        # automatically", which only its common library resolves; here it would leave every layer on the CPU
        params.n_gpu_layers = N_GPU_LAYERS_ALL
        stoppable = release_while_loading and not vocab_only
        if stoppable:
            # the path outlives the call: llama.cpp hands it back to the callback while it loads
            self._load_path = ctypes.create_string_buffer(str(path).encode())
            params.progress_callback = ctypes.cast(runtime.kvpot_load_progress_release, L.llama_progress_callback)
            params.progress_callback_user_data = ctypes.cast(self._load_path, ctypes.c_void_p)
            # where the CLI watches signals, one that arrives while loading stops it (the same callback); one
            # handled before (its Python handler has run) must not
            abort.drain()
            abort.tell(runtime)
        self.ptr = L.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            if stoppable and abort.pending():
                # a signal cancelled the load; its handler, which ran as the call returned, did not end the
                # process (SIGTERM's does), so it was a Ctrl-C that only marks: loading stops all the same
                abort.drain()
                raise KeyboardInterrupt
            raise KvpotError(f"llama.cpp could not load the model {path}")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(self.ptr)
        self.path = str(path)
        self.released_bytes = 0
        if release_copied and not vocab_only:
            self.release_copied()

    def release_copied(self) -> int:
        """Weights llama.cpp copied out of its file mapping (repacked for this CPU, or on a GPU) also stay
        resident in the mapping, so RSS would count them twice: give those pages back (kvpot-mapped.cpp).
        Returns the bytes given back, also kept in `released_bytes`."""
        n = load_runtime().kvpot_model_release_copied(self.ptr, self.path.encode())
        if n < 0:
            raise KvpotError(f"cannot read {self.path} as GGUF to find its copied weights")
        self.released_bytes = n
        return n

    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """special=True parses control tokens written as text (chat template markup); user text never."""
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (self._L.llama_token * n_max)()
        n = self._L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_bos, special)
        if n < 0:
            buf = (self._L.llama_token * -n)()
            n = self._L.llama_tokenize(self.vocab, data, len(data), buf, -n, add_bos, special)
        return list(buf[:n])

    def chat_template(self) -> str | None:
        """The GGUF's default chat template (tokenizer.chat_template), if it has one."""
        raw = self._L.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def apply_template(self, template: str, messages: list[tuple[str, str]], add_assistant: bool) -> str:
        """Render (role, content) messages with llama.cpp's built-in template handling."""
        L = self._L
        arr = (L.llama_chat_message * len(messages))()
        keep = []
        for i, (role, content) in enumerate(messages):
            r, c = role.encode(), content.encode("utf-8")
            keep += [r, c]
            arr[i].role, arr[i].content = r, c
        tmpl = template.encode("utf-8")
        size = 4096 + sum(len(c) for _, c in messages) * 2
        buf = ctypes.create_string_buffer(size)
        n = L.llama_chat_apply_template(tmpl, arr, len(messages), add_assistant, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n)
            n = L.llama_chat_apply_template(tmpl, arr, len(messages), add_assistant, buf, n)
        if n < 0:
            raise KvpotError("llama.cpp does not know this model's chat template; use --prompt-format completion")
        return buf.raw[:n].decode("utf-8", errors="replace")

    def bos(self) -> list[int]:
        return self.tokenize("", add_bos=True)

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(self._L.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self._L.llama_model_free(self.ptr)
            self.ptr = None


class LlamaContext(Owned):
    """A llama_context with one sequence (0); owns its batch buffer."""

    def __init__(self, model: LlamaModel, p: ContextParams, cb_eval=None):
        """cb_eval: a llama_cpp.ggml_backend_sched_eval_callback, for test oracles only."""
        import llama_cpp as L

        self._L = L
        self.model = model
        self.params = p
        for t in (p.type_k, p.type_v):
            if t not in CACHE_TYPES:
                raise KvpotError(f"KV cache type {t!r} is not one of {', '.join(CACHE_TYPES)}")
        if p.type_v != "f16" and p.type_v != "f32" and not p.flash_attn:
            raise KvpotError("a quantized V cache needs flash attention (--flash-attn)")
        cp = L.llama_context_default_params()
        cp.n_ctx = p.n_ctx
        cp.n_batch = p.n_batch
        cp.n_ubatch = p.n_batch
        cp.n_seq_max = 1
        if p.n_outputs_max < 0:
            raise KvpotError(f"internal: n_outputs_max {p.n_outputs_max} is negative")
        cp.n_outputs_max = p.n_outputs_max
        cp.n_threads = p.n_threads
        cp.n_threads_batch = p.n_threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if p.flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = CACHE_TYPES[p.type_k]
        cp.type_v = CACHE_TYPES[p.type_v]
        cp.swa_full = False  # the sliding-window layers keep only their window
        cp.no_perf = True
        if cb_eval is not None:
            self._cb_eval = cb_eval  # keep the ctypes callback alive as long as the context
            cp.cb_eval = cb_eval
        self.ptr = L.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise KvpotError(f"llama.cpp could not create a context of {p.n_ctx} cells")
        self.n_ctx = L.llama_n_ctx(self.ptr)
        # llama.cpp caps n_batch at the n_ctx asked for (before padding it to 256) and aborts on a
        # larger batch (GGML_ASSERT in llama_decode): the cap is what llama.cpp took, not what we asked
        self.n_batch = min(p.n_batch, L.llama_n_batch(self.ptr))
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        self._batch_cap = self.n_batch
        # llama.cpp asserts (aborts) on a decode that marks more rows than this: checked in decode first
        self.n_outputs_max = min(p.n_outputs_max, self.n_batch) if p.n_outputs_max else self.n_batch

    def decode(self, tokens: list[int] | np.ndarray, pos0: int, logits: str = "last", abortable: bool = False) -> None:
        """Decode tokens at positions pos0.. in sequence 0; logits: 'last', 'all' or 'none'.

        abortable: a signal may stop it (kvpot.runtime.abort): it then raises abort.Interrupted with
        the batch's cells removed (llama.cpp's own rollback of an aborted ubatch), the context as before."""
        n = len(tokens)
        if n == 0:
            return
        if n > self._batch_cap:  # never reaches llama.cpp's assertion
            raise KvpotError(f"internal: a batch of {n} tokens exceeds llama.cpp's n_batch {self._batch_cap}")
        if logits not in OUTPUT_ROWS:
            raise KvpotError(f"internal: logits {logits!r} is not one of {', '.join(OUTPUT_ROWS)}")
        marked = OUTPUT_ROWS[logits](n)
        if marked > self.n_outputs_max:  # never reaches llama.cpp's assertion (output_reserve)
            raise KvpotError(f"internal: a decode of {n} tokens asks for the logits of {marked} rows; this context "
                             f"holds at most {self.n_outputs_max} (its n_outputs_max)")
        b = self._batch
        b.n_tokens = n
        for i in range(n):
            b.token[i] = int(tokens[i])
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = logits == "all" or (logits == "last" and i == n - 1)
        with abort.armed(load_runtime(), self.ptr, on=abortable):
            rc = self._L.llama_decode(self.ptr, b)
        if rc == 2 and abortable:
            got = abort.drain()
            raise abort.Interrupted(f"stopped by signal {', '.join(map(str, got)) or '?'} while decoding "
                                    f"{n} tokens at position {pos0}")
        if rc == 1:  # llama.cpp found no free cells for the batch (a cache, e.g. the sliding window's, is full)
            raise KvpotError(f"the context of {self.n_ctx} cells has no room for {n} more tokens at position {pos0}; "
                             "raise --budget or ask a shorter question")
        if rc != 0:
            raise KvpotError(f"llama_decode failed ({rc}) at position {pos0} with {n} tokens")

    def logits_last(self) -> np.ndarray:
        return self.logits_row(-1)

    def logits_row(self, i: int) -> np.ndarray:
        """Logits of row i of the last decode (one asked for with logits 'all'); -1: the last row."""
        ptr = self._L.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise KvpotError(f"internal: the last decode has no logits for row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    def remove_from(self, pos: int) -> None:
        """Drop sequence 0's tokens at positions >= pos from every cache of the context (stock seq_rm)."""
        if not self._L.llama_memory_seq_rm(self._L.llama_get_memory(self.ptr), 0, pos, -1):
            raise KvpotError(f"llama.cpp could not remove positions from {pos}")

    def seq_state(self) -> bytearray:
        """llama.cpp's state of sequence 0 (cells, positions, K and V of every layer), written straight
        into the returned buffer: as large as the pot's cells, so it is never copied once more."""
        size = self._L.llama_state_seq_get_size(self.ptr, 0)
        out = bytearray(size)
        buf = (ctypes.c_uint8 * size).from_buffer(out)
        n = self._L.llama_state_seq_get_data(self.ptr, buf, size, 0)
        del buf  # a live ctypes view would pin the bytearray's size
        if n != size:
            raise KvpotError(f"llama.cpp wrote {n} of {size} bytes of sequence state")
        return out

    def set_seq_state(self, data: bytes | bytearray) -> None:
        """Restore sequence 0 from seq_state's bytes, read in place (no copy of the state is made)."""
        n = len(data)
        if isinstance(data, bytearray):
            buf = (ctypes.c_uint8 * n).from_buffer(data)
        else:  # bytes are immutable: c_char_p points into them without copying
            buf = ctypes.cast(ctypes.c_char_p(bytes(data)), ctypes.POINTER(ctypes.c_uint8))
        if self._L.llama_state_seq_set_data(self.ptr, buf, n, 0) != n:
            raise KvpotError("llama.cpp refused the saved sequence state (another model or context size?)")

    def set_seq_state_from_file(self, fd: int, offset: int, size: int) -> None:
        """Restore sequence 0 from `size` bytes of seq_state's output at `offset` of the open file `fd`, read
        in pieces straight into the cache (kvpot_state_seq_read_fd): never held whole in memory."""
        lib = load_runtime()
        if lib.kvpot_state_seq_read_fd(self.ptr, fd, offset, size, 0) != size:
            raise KvpotError(f"llama.cpp refused the saved sequence state: {lib.kvpot_last_error().decode(errors='replace')}")

    def clear(self) -> None:
        self._L.llama_memory_clear(self._L.llama_get_memory(self.ptr), True)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self._L.llama_batch_free(self._batch)
            self._L.llama_free(self.ptr)
            self.ptr = None

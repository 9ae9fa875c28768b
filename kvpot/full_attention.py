"""Stock llama.cpp behaviour: the whole prompt in one context, answered with full attention.

This is what `kvpot run` does until a pot policy is chosen, and the reference that
the pot's tests compare against.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from kvpot.errors import KvpotError
from kvpot.gguf_file import ModelFacts
from kvpot.runtime.library import load as load_runtime

STOP = ["\nQuestion:"]


@dataclass(frozen=True)
class GenSettings:
    n_ctx: int
    n_threads: int
    max_tokens: int = 128
    seed: int = 0
    n_batch: int = 512


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


def open_llama(facts: ModelFacts, settings: GenSettings):
    load_runtime()  # refuses a stock libllama before a model is opened
    from llama_cpp import Llama

    from kvpot.runtime import rpc

    # llama_cpp.Llama keeps every layer on the CPU unless asked; with RPC servers (kvpot run --rpc)
    # the layers go to their devices, as in the pot's engine (llama.cpp's default: all layers)
    n_gpu_layers = -1 if rpc.registered() else 0
    try:
        return Llama(model_path=str(facts.path), n_ctx=settings.n_ctx, n_batch=settings.n_batch,
                     n_threads=settings.n_threads, n_threads_batch=settings.n_threads,
                     n_gpu_layers=n_gpu_layers, seed=settings.seed, verbose=False)
    except ValueError as e:  # llama_cpp raises ValueError("Failed to load model from file: ...")
        raise KvpotError(f"llama.cpp could not load {facts.path}: {e}") from None


def prompt_tokens(llm, prompt: str) -> list[int]:
    return llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)


def check_fits(n_prompt: int, settings: GenSettings, facts: ModelFacts) -> None:
    need = n_prompt + settings.max_tokens
    if need > settings.n_ctx:
        raise KvpotError(
            f"the document and question are {n_prompt} tokens; with {settings.max_tokens} answer tokens "
            f"that is {need}, more than the context size of {settings.n_ctx} tokens "
            f"(--ctx; {facts.name} was trained for {facts.n_ctx_train})"
        )


def stream_answer(llm, tokens: list[int], settings: GenSettings) -> Iterator[str]:
    """Greedy completion, yielded piece by piece."""
    for chunk in llm.create_completion(tokens, max_tokens=settings.max_tokens, temperature=0.0,
                                       stop=STOP, stream=True, seed=settings.seed):
        text = chunk["choices"][0]["text"]
        if text:
            yield text

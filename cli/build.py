"""`kvpot build`: build or refresh the patched llama.cpp runtime."""

from __future__ import annotations

import typer

from kvpot.build.runtime import build_runtime

from ._common import err, user_errors


@user_errors
def build(
    force: bool = typer.Option(False, "--force", help="rebuild even when the wheel cache has this build"),
    jobs: int = typer.Option(None, "--jobs", "-j", min=1, show_default="every core",
                            help="parallel compile jobs"),
) -> None:
    """Build the patched llama-cpp-python (patches/ + ggml_ext/) and install it.

    Backend flags pass through CMAKE_ARGS as for llama-cpp-python, e.g. CMAKE_ARGS=-DGGML_CUDA=ON.
    The wheel is cached under a key of the sdist hash, patches, ggml_ext/ and CMake arguments.
    """
    res = build_runtime(jobs=jobs, force=force, say=lambda msg: err.print(msg))
    err.print(f"{res.version} {'from cache' if res.cached else 'built'} in {res.seconds:.1f}s")

"""Build of the patched llama.cpp runtime (llama-cpp-python wheel with kvpot's patches and ggml_ext/).

Uses only the standard library so it runs before llama_cpp exists:
``python -m kvpot.build`` or ``kvpot build``.
"""

from kvpot.build.pins import LLAMA_CPP_COMMIT, SDIST_SHA256, SDIST_VERSION
from kvpot.build.runtime import BuildResult, build_runtime

__all__ = ["BuildResult", "build_runtime", "LLAMA_CPP_COMMIT", "SDIST_SHA256", "SDIST_VERSION"]

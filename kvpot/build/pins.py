"""The pinned upstream source: llama-cpp-python's sdist and the llama.cpp commit it vendors."""

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# from the sdist's CHANGELOG ("update llama.cpp to ggml-org/llama.cpp@0c1e57098"); the sdist has no .git
LLAMA_CPP_COMMIT = "0c1e57098"
# where llama.cpp sits inside the extracted sdist
VENDOR_DIR = "vendor/llama.cpp"

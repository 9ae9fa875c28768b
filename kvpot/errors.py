"""Errors a user can cause and fix: the CLI prints them as one line and exits non-zero."""


class KvpotError(Exception):
    """A problem with the user's input or environment, described in one line."""

    exit_code = 1


class BuildError(KvpotError):
    """The patched llama.cpp runtime could not be built."""

    exit_code = 3


class RuntimeMissing(KvpotError):
    """libllama is missing, stock, or from another kvpot ABI."""

    exit_code = 4

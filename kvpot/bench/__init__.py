"""Benchmarks: every figure is measured beside stock llama.cpp in the same run, each case in its own process."""

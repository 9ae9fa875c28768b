"""KVPOT_DEVICE_MEMORY takes a size with a unit (a phone's 3GiB), as well as a byte count."""

from __future__ import annotations

import pytest

from kvpot.errors import KvpotError
from kvpot.session.auto_budget import MEMORY_ENV, device_memory, parse_size


@pytest.mark.parametrize("text, expected", [
    ("1610612736", 1610612736),
    ("3GiB", 3 * 2**30), ("3gib", 3 * 2**30), ("1.5G", 3 * 2**29), ("512 MiB", 2**29), ("64k", 2**16),
    ("2GB", 2 * 10**9), ("250MB", 250 * 10**6), ("4096B", 4096), (" 1T ", 2**40),
])
def test_sizes_with_units(text, expected):
    assert parse_size(text, MEMORY_ENV) == expected


@pytest.mark.parametrize("text", ["", "G", "x", "3XB", "3 G B", "1.5.2G", "3GiBs"])
def test_what_is_not_a_size_is_one_line_naming_the_variable(text):
    with pytest.raises(KvpotError, match=f"^{MEMORY_ENV} must be a size in bytes or with a unit"):
        parse_size(text, MEMORY_ENV)


@pytest.mark.parametrize("text", ["0", "-1G", "nan", "inf", "1e400G", "0.5"])
def test_sizes_that_hold_nothing_are_refused(text):
    with pytest.raises(KvpotError, match=f"^{MEMORY_ENV} must be a positive size"):
        parse_size(text, MEMORY_ENV)


def test_the_variable_plans_with_the_parsed_size(monkeypatch):
    monkeypatch.setenv(MEMORY_ENV, "1.5GiB")
    mem = device_memory(devs=[])
    assert mem.free_bytes == 3 * 2**29 and mem.holds_weights

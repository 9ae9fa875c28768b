"""A native crash is never silent: Python's faulthandler prints the Python stack (which step died),
and kvpot's banner in libllama first says what to report (kvpot version, runtime build)."""

from __future__ import annotations

import faulthandler
import sys


def enable_crash_reports() -> None:
    """Called once by the CLI before any command runs; the banner follows when libllama loads
    (kvpot.runtime.library installs it whenever faulthandler is on)."""
    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)

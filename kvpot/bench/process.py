"""Each benchmark case runs in a fresh Python process (kvpot.bench.worker), so the peak RSS it reports
is its own and not the largest of every case run before it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

from kvpot.errors import KvpotError

PROGRESS = "progress: "  # a worker's stderr line that says where its case is (passed on as it comes)


def run_worker(args: list[str], on_progress=None) -> dict:
    """`python -m kvpot.bench.worker ARGS` in a child process; its last stdout line is the case's JSON.
    `on_progress(msg)` hears each progress line the case writes to stderr as it comes (a read of hours
    says where it is); the rest of stderr is kept for the error message."""
    import threading

    cmd = [sys.executable, "-m", "kvpot.bench.worker", *args]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)  # never a full pipe
        reader.start()
        errs: list[str] = []
        try:
            for line in proc.stderr:
                if not line.startswith(PROGRESS):
                    errs.append(line)
                elif on_progress is not None:
                    on_progress(line[len(PROGRESS):].rstrip("\n"))
            proc.wait()
        except BaseException:  # Ctrl-C, or on_progress failing: the case does not run on without its parent
            _stop(proc)
            raise
        reader.join()
    if proc.returncode != 0:
        last = ("".join(errs).strip().splitlines() or ["no output"])[-1]
        raise KvpotError(f"benchmark case {' '.join(args)} failed: {last}")
    return json.loads("".join(out).strip().splitlines()[-1])


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End a case: SIGTERM first, so that a save it is writing removes its temporary file (kvpot.safe_write),
    then SIGKILL if it is still there after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / (1024 * 1024)


def rss_mb() -> float | None:
    """This process's resident memory now, in MiB, where /proc tells it (Linux, Android); else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def reset_peak_rss(pid: int | str = "self") -> bool:
    """Set this process's (or `pid`'s, one of this user's) peak resident memory (VmHWM) back to what it holds
    now, so that a later peak_rss_since_reset_mb() is the peak of what ran in between: one process can then
    measure each of several readings in turn. Linux 4.0 and later (also Android): writing 5 to
    /proc/PID/clear_refs resets only that figure. False where it cannot (macOS, an older kernel, no /proc)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_since_reset_mb() -> float | None:
    """The peak resident memory since the last reset_peak_rss() (VmHWM, /proc/self/status), in MiB;
    None where /proc does not tell it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class ReadingPeak:
    """This process's peak resident memory while reading, in MiB: the peak of each stretch between a restore
    or a save and the next, so that what they hold for a moment beside the cache (the exported state) is
    not counted as the reading's. Each stretch after one is measured from a reset of the peak
    (reset_peak_rss: Linux and Android); where the peak cannot be reset, the process's peak is all there
    is, and it counts the restores and saves too."""

    def __init__(self):
        self.closed = 0.0                  # the largest peak of the stretches before this one
        self.start: float | None = None    # RSS as this stretch began after a reset; None: it began with the process

    def now(self) -> float:
        if self.start is None:
            return max(self.closed, peak_rss_mb())
        return max(self.closed, self.start, peak_rss_since_reset_mb() or 0.0)

    def restart(self, closed: float) -> None:
        """A new stretch from here; `closed`: the reading peak up to just before what is left out."""
        _give_back_freed()
        if reset_peak_rss():
            self.closed, self.start = closed, rss_mb() or 0.0


def _give_back_freed() -> None:
    """Return the memory a restore or a save freed to the system (glibc keeps freed heap pages of ~10 MiB
    copies resident, which would then count as the reading's); nothing where there is no malloc_trim."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass

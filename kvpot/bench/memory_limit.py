"""Run a command under an enforced memory limit and record what it took (`make bench-memory-limit`).

    python -m kvpot.bench.memory_limit --limit 1.5GiB --json OUT.json -- COMMAND ARGS...

The limit is a memory cgroup made for the run, a child of the cgroup this process is in, with the
command started inside it: the kernel charges it the command's anonymous memory, the page cache it
brings in (the weights it maps included, when no other process had them cached) and its kernel memory,
reclaims clean file pages when the charge reaches the limit, and kills the command (the OOM killer,
SIGKILL) when nothing is left to reclaim. That is what a phone or a container does to an app. cgroup v2
sets memory.max (and memory.swap.max 0) where the parent delegates the memory controller; cgroup v1
sets memory.limit_in_bytes and memory.memsw.limit_in_bytes to the same figure, so swap cannot stretch
it. An address-space limit (RLIMIT_AS) is no memory limit here: it counts every mapping, the whole
GGUF file mapped and the threads' reserved stacks, not what is resident, so it refuses a run that fits
and says nothing about one that does not; systemd-run --scope -p MemoryMax= is the same cgroup limit
made by systemd, where systemd runs.

Recorded: whether the kernel killed the command for the limit (SIGKILL with the cgroup's oom_kill count
up), the command's peak resident memory (ru_maxrss of the process and the children it waited for), the
cgroup's peak charge, the exit status and time, and the command's own --json output where it printed
one. --seconds N bounds a long run: SIGTERM past N seconds, recorded with how far it got (its stderr's
last lines: kvpot's progress). Exit status: 0 when the command held and succeeded (or held until the bound), 3 when the limit killed it, the command's own
status when it failed otherwise, 2 where this machine offers no limit to enforce (one line says why).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from kvpot.errors import KvpotError
from kvpot.session.memory_cgroup import own_group

KILLED = 3
NO_LIMIT = 2
TAIL_LINES = 20


@dataclass(frozen=True)
class Home:
    """The memory cgroup this process is in, where the run's own cgroup is made."""

    folder: Path
    version: int  # 1 or 2


@dataclass
class LimitedRun:
    measured_command: list[str]
    limit_bytes: int
    enforced_by: str
    returncode: int
    killed: bool              # the kernel's OOM killer ended it for the limit
    oom_kills: int
    peak_rss_bytes: int       # ru_maxrss of the command (and the children it waited for)
    peak_charged_bytes: int | None  # the cgroup's peak charge (anon + page cache + kernel), where the kernel says
    seconds: float
    stdout_tail: list[str]
    stderr_tail: list[str]    # its last lines on stderr (kvpot's progress: how far a read got)
    result: dict | None       # the command's own JSON (its last stdout line), where it printed one
    stopped_after: float | None = None  # the time bound that stopped it (SIGTERM), where one did

    def line(self) -> str:
        mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
        peak = f"peak RSS {mib(self.peak_rss_bytes)}"
        if self.peak_charged_bytes is not None:
            peak += f", peak charged {mib(self.peak_charged_bytes)}"
        if self.killed:
            return (f"killed by the memory limit of {mib(self.limit_bytes)} after {self.seconds:,.0f} s "
                    f"({peak}; {self.enforced_by})")
        if self.stopped_after is not None:
            return (f"held within the memory limit of {mib(self.limit_bytes)} until stopped at the "
                    f"{self.stopped_after:,.0f}-second bound ({peak})")
        status = "held" if self.returncode == 0 else f"failed with exit status {self.returncode}"
        return f"{status} within the memory limit of {mib(self.limit_bytes)} in {self.seconds:,.0f} s ({peak})"


def find_home() -> Home | str:
    """This process's memory cgroup where a child with a memory limit can be made in it, else why not."""
    if not sys.platform.startswith("linux"):
        return f"memory cgroups are Linux's; this is {sys.platform}"
    try:
        found = own_group()
    except (OSError, ValueError) as e:
        return f"cannot read this process's cgroups: {getattr(e, 'strerror', None) or e}"
    if found is None:
        return "this process is in no memory cgroup (neither a cgroup v1 memory hierarchy nor cgroup v2 is mounted)"
    folder, _, version = found
    if version == 1:
        return Home(folder, 1) if os.access(folder, os.W_OK) else f"the memory cgroup {folder} is not writable"
    try:
        delegated = "memory" in (folder / "cgroup.subtree_control").read_text().split()
    except OSError as e:
        return f"cannot read {folder / 'cgroup.subtree_control'}: {e.strerror}"
    if not delegated:
        return (f"cgroup v2 {folder} does not delegate the memory controller to its children "
                "(systemd-run --user --scope -p MemoryMax=N can, where systemd runs)")
    return Home(folder, 2) if os.access(folder, os.W_OK) else f"the cgroup {folder} is not writable"


def _control(path: Path, value: str) -> None:
    """Write a cgroup control file: the limit of the cgroup the run made, or the pid joining it."""
    with open(path, "w") as f:
        f.write(value)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _counter(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return 0


def _join(procs: Path) -> None:
    """In the child, before exec: move into the run's cgroup, so everything it maps is charged there."""
    _control(procs, str(os.getpid()))


def _make_group(home: Home, limit: int) -> tuple[Path, str]:
    group = home.folder / f"kvpot-limit-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
    except OSError as e:
        raise KvpotError(f"cannot make a memory cgroup in {home.folder}: {e.strerror}") from None
    try:
        if home.version == 1:
            _control(group / "memory.limit_in_bytes", str(limit))
            how = "cgroup v1 memory.limit_in_bytes"
            if (group / "memory.memsw.limit_in_bytes").exists():
                _control(group / "memory.memsw.limit_in_bytes", str(limit))
                how += " and memory.memsw.limit_in_bytes (swap counted)"
        else:
            _control(group / "memory.max", str(limit))
            how = "cgroup v2 memory.max"
            if (group / "memory.swap.max").exists():
                _control(group / "memory.swap.max", "0")
                how += " with memory.swap.max 0"
    except OSError as e:
        _remove(group)
        raise KvpotError(f"cannot set a memory limit on {group}: {e.strerror}") from None
    return group, f"{how} on a cgroup made for the run in {home.folder}"


def _remove(group: Path) -> None:
    for _ in range(50):  # the kernel lets go of a cgroup a moment after its last process is reaped
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def _pass_through(stream, tail: deque) -> None:
    """The command's stderr to ours as it comes, its last lines kept."""
    for raw in stream:
        sys.stderr.buffer.write(raw)
        sys.stderr.buffer.flush()
        tail.append(raw.decode("utf-8", "replace").rstrip("\r\n").rsplit("\r", 1)[-1])


def run_limited(command: list[str], limit: int, env: dict | None = None, home: Home | None = None,
                seconds: float | None = None) -> LimitedRun:
    """Run `command` in a memory cgroup of `limit` bytes made for it, wait for it, and say what it took.
    Its stderr passes through (the tail kept); its stdout is kept (the tail, and its JSON when the last line
    is one). `seconds`: a time bound, past which the command gets SIGTERM (a long read measured in part)."""
    found = home or find_home()
    if isinstance(found, str):
        raise KvpotError(f"no enforceable memory limit on this machine: {found}")
    group, how = _make_group(found, limit)
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, env=env,
                                    preexec_fn=partial(_join, group / "cgroup.procs"))
            errs: deque = deque(maxlen=TAIL_LINES)
            reader = threading.Thread(target=_pass_through, args=(proc.stderr, errs), daemon=True)
            reader.start()
            fired = threading.Event()
            bound = threading.Timer(seconds, lambda: (fired.set(), proc.terminate())) if seconds else None
            if bound:
                bound.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            except BaseException:  # Ctrl-C: the command does not run on without its runner
                proc.kill()
                os.wait4(proc.pid, 0)
                raise
            finally:
                if bound:
                    bound.cancel()
            reader.join(timeout=10)
            proc.returncode = os.waitstatus_to_exitcode(status)
            elapsed = time.monotonic() - t0
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
        if found.version == 1:
            oom = _counter(_read(group / "memory.oom_control"), "oom_kill")
            peak = _read(group / "memory.max_usage_in_bytes")
        else:
            oom = _counter(_read(group / "memory.events"), "oom_kill")
            peak = _read(group / "memory.peak")
    finally:
        _remove(group)
    lines = text.splitlines()
    result = None
    if lines:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
    rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return LimitedRun(measured_command=command, limit_bytes=limit, enforced_by=how, returncode=proc.returncode,
                      killed=proc.returncode == -signal.SIGKILL and oom > 0, oom_kills=oom, peak_rss_bytes=rss,
                      peak_charged_bytes=int(peak) if peak and peak.strip().isdigit() else None, seconds=elapsed,
                      stdout_tail=lines[-TAIL_LINES:], stderr_tail=list(errs),
                      result=result if isinstance(result, dict) else None,
                      stopped_after=seconds if fired.is_set() and not oom else None)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvpot.bench.memory_limit",
                                description="Run COMMAND in a memory cgroup limited to SIZE and record what it took.")
    p.add_argument("--limit", required=True, help="the memory limit: 1.5GiB, 800MiB, bytes")
    p.add_argument("--json", help="where to write the record (docs/bench/rss/...)")
    p.add_argument("--note", default="", help="what the run reads, for the record")
    p.add_argument("--seconds", type=float, help="a time bound: SIGTERM to the command past it (recorded)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    return p


def main(argv: list[str] | None = None) -> int:
    from kvpot.session.auto_budget import parse_size

    args = sys.argv[1:] if argv is None else argv
    ns = parser().parse_args(args)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    try:
        if not command:
            raise KvpotError("no command to run: give it after --")
        limit = parse_size(ns.limit, "--limit")
        from kvpot.bench.throughput import run_meta

        meta = run_meta()  # the commit and load average as the run starts
        run = run_limited(command, limit, seconds=ns.seconds)
        if ns.json:
            _record(ns, run, args, meta)
    except KvpotError as e:
        print(f"error: {e}", file=sys.stderr)
        return NO_LIMIT
    print(run.line(), file=sys.stderr)
    if run.killed:
        return KILLED
    if run.stopped_after is not None:
        return 0
    return run.returncode if run.returncode > 0 else (0 if run.returncode == 0 else 1)


def _record(ns, run: LimitedRun, args: list[str], meta: dict) -> None:
    from kvpot.safe_write import write_text_file

    meta = meta | {"command": " ".join(["python -m kvpot.bench.memory_limit", *args])}
    env = {k: os.environ[k] for k in ("KVPOT_DEVICE_MEMORY", "OMP_WAIT_POLICY") if k in os.environ}
    record = meta | {"note": ns.note, "env": env} | asdict(run) | {"limit": ns.limit, "loadavg_end": os.getloadavg()}
    write_text_file(Path(ns.json), json.dumps(record, indent=1) + "\n", "the memory-limit record")


if __name__ == "__main__":
    sys.exit(main())

"""`python -m kvpot.build`: build the patched runtime before the kvpot CLI can import llama_cpp."""

import argparse
import sys

from kvpot.build.runtime import build_runtime
from kvpot.errors import KvpotError


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m kvpot.build", description=__doc__)
    ap.add_argument("--force", action="store_true", help="rebuild even if the wheel is cached")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    ap.add_argument("--no-install", action="store_true", help="build/cache the wheel but do not install it")
    ns = ap.parse_args()
    try:
        res = build_runtime(jobs=ns.jobs, force=ns.force, install=not ns.no_install)
    except KvpotError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"{res.version} {'cached' if res.cached else 'built'} in {res.seconds:.1f}s: {res.wheel}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

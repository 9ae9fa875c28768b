"""Which files of a folder input are read: .gitignore honoured (pathspec's implementation of git's
rules), vendored and generated folders left out, --glob patterns kept and --exclude patterns left
out, and for everything left out, the reason (the CLI counts them in one summary line)."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pathspec import GitIgnoreSpec

from kvpot.errors import KvpotError

# folders of other people's code, caches and build output: read only when named as the input itself
VENDORED = frozenset({
    "node_modules", "bower_components", "__pycache__", "venv", "build", "dist", "target", "vendor",
    "site-packages", "_build", "htmlcov", "coverage",
})
# (hidden folders, .git, .venv, .tox, .mypy_cache..., are left out as hidden)

IGNORED, EXCLUDED, VENDOR, HIDDEN, NO_GLOB = (
    "ignored by .gitignore", "excluded by --exclude", "in vendored or generated folders", "hidden",
    "not matching --glob")


@dataclass
class Tree:
    files: list[Path] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (path, reason); a folder ends with /


class _GitIgnores:
    """The .gitignore files that apply under a folder: its own and its subfolders' (read as the walk
    reaches them), and those of the folders above it up to the repository's root."""

    def __init__(self, root: Path):
        self.specs: dict[Path, GitIgnoreSpec] = {}
        top = _repo_root(root)
        if top is not None:
            self._load(top / ".git" / "info" / "exclude", top)
            for folder in reversed([p for p in root.parents if p == top or top in p.parents]):
                self.add(folder)

    def add(self, folder: Path) -> None:
        self._load(folder / ".gitignore", folder)

    def _load(self, file: Path, base: Path) -> None:
        try:
            with open(file, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return  # none, or unreadable: nothing to honour
        spec = gitignore_spec(lines)
        old = self.specs.get(base)
        self.specs[base] = spec if old is None else old + spec

    def ignored(self, path: Path, is_dir: bool) -> bool:
        # the deepest .gitignore with a rule for the path decides (git's precedence)
        for base in path.parents:
            spec = self.specs.get(base)
            if spec is None:
                continue
            rel = path.relative_to(base).as_posix() + ("/" if is_dir else "")
            hit = spec.check_file(rel).include
            if hit is not None:
                return hit
        return False


def _valid(line: str) -> bool:
    try:
        GitIgnoreSpec.from_lines([line])
    except (ValueError, re.error):
        return False
    return True


def gitignore_spec(lines: list[str]) -> GitIgnoreSpec:
    """A .gitignore's rules. A line git cannot use (`!` alone, a trailing backslash, a range like
    `[z-a]`) is skipped, as git skips it, and the file's other rules still apply."""
    try:
        return GitIgnoreSpec.from_lines(lines)
    except (ValueError, re.error):
        return GitIgnoreSpec.from_lines([line for line in lines if _valid(line)])


def exclude_spec(patterns: list[str]) -> GitIgnoreSpec:
    """--exclude's patterns (gitignore syntax). Unlike a .gitignore's line, which git skips when it is
    bad, a bad pattern here is refused with one line: the user typed it for this command, and skipping
    it would read the files it was meant to leave out."""
    for pattern in patterns:
        try:
            GitIgnoreSpec.from_lines([pattern])
        except re.error as e:
            why = re.sub(r" at position \d+", "", e.msg)
            raise KvpotError(f"--exclude {pattern!r} is not a valid pattern ({why})") from None
        except ValueError:
            raise KvpotError(f"--exclude {pattern!r} is not a valid pattern (gitignore's rules do not allow it)") from None
    return GitIgnoreSpec.from_lines(patterns)


def _repo_root(folder: Path) -> Path | None:
    for p in [folder, *folder.parents]:
        if os.path.exists(p / ".git"):  # False, not an error, where a folder cannot be searched
            return p
    return None


def walk(root: Path, globs: Iterable[str] = ("*",), excludes: Iterable[str] = (),
         notice: Callable[[str], None] = lambda msg: None) -> Tree:
    """Files under root to read, sorted, symlinked folders not followed, with what was left out and
    why. A folder that cannot be listed or searched is refused with its reason when it is root, and
    skipped with a notice inside it."""
    absroot = Path(os.path.abspath(root))  # .gitignore rules are looked up by absolute folder
    globs = list(globs) or ["*"]
    excludes = list(excludes)
    exclude = exclude_spec(excludes) if excludes else None
    gitignores = _GitIgnores(absroot)
    tree = Tree()
    failed: dict[str, str] = {}  # folder -> why it could not be read

    def listing_failed(e: OSError) -> None:
        failed.setdefault(e.filename, e.strerror)

    def left_out(p: Path, why: str, is_dir: bool) -> bool:
        tree.left_out.append((str(p) + ("/" if is_dir else ""), why))
        return True

    def leave_out(p: Path, is_dir: bool) -> bool:
        rel = p.relative_to(root).as_posix() + ("/" if is_dir else "")
        if p.name.startswith("."):
            return left_out(p, HIDDEN, is_dir)
        if is_dir and p.name in VENDORED:
            return left_out(p, VENDOR, is_dir)
        if gitignores.ignored(absroot / p.relative_to(root), is_dir):
            return left_out(p, IGNORED, is_dir)
        if exclude is not None and exclude.match_file(rel):
            return left_out(p, EXCLUDED, is_dir)
        if not is_dir and not any(Path(rel).match(g) for g in globs):
            return left_out(p, NO_GLOB, is_dir)
        return False

    for folder, dirs, files in os.walk(root, onerror=listing_failed):
        here = Path(folder)
        gitignores.add(absroot / here.relative_to(root))
        dirs[:] = sorted(d for d in dirs if not leave_out(here / d, True))
        for name in sorted(files):
            p = here / name
            if leave_out(p, False):
                continue
            try:
                regular = stat.S_ISREG(os.stat(p).st_mode)
            except OSError as e:
                if e.errno == errno.EACCES:  # listed but not searchable: nothing in the folder can be read
                    failed.setdefault(folder, e.strerror)
                continue  # a broken symlink or a loop: not a file to read
            if regular:
                tree.files.append(p)
    for folder, why in failed.items():
        if os.path.realpath(folder) == os.path.realpath(root):
            raise KvpotError(f"cannot read directory {root}: {why}")
        notice(f"skipping folder {folder}: {why}")
    tree.files = sorted(p for p in tree.files if not any(str(p).startswith(os.path.join(f, "")) for f in failed))
    return tree

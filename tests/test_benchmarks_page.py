"""docs/benchmarks.md as a results page, and the JSON behind every figure: every docs/bench path a page names
exists; every file under docs/bench is named by a page, a test, the Makefile or the code that reads it (an orphan
fails), by its path or a glob: a folder a page names (`docs/bench/x/`, or `--dir docs/bench/x` in a command) is
no citation, since it would keep every file under it whatever the page's figures use; every JSON a page cites
holds its command, commit, CPU and sample size; no heading of the page names an issue; the page stays a
ten-minute read. No model: reads text and JSON only."""

from __future__ import annotations

import fnmatch
import itertools
import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "benchmarks.md"
# the pages whose figures need a JSON: README, the docs, the list of studies
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "studies" / "README.md"]
# what else may name a file under docs/bench: the tests, the Makefile's literal paths, the code that reads one
OTHER_NAMERS = [REPO / "Makefile", *sorted(p for p in (REPO / "tests").glob("*.py") if p.name != Path(__file__).name),
                *sorted(p for d in ("kvpot", "studies", "cli", "models") for p in (REPO / d).rglob("*.py"))]
# a results page a field engineer reads in ten minutes: a few hundred lines of tables and the lines between them
MAX_LINES = 600

PATH = re.compile(r"(?:\$\(BENCH_DIR\)|docs/bench)(?:/[\w.*${}(),\-]+)*/?")
ISSUE = re.compile(r"\bissues?\s+\d+|#\d+\b", re.I)


def _braces(path: str) -> list[str]:
    """Shell brace expansion of one path: a{x,y}b and a{1..3}b."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    body = m.group(1)
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    parts = [str(i) for i in range(int(rng[1]), int(rng[2]) + 1)] if rng else body.split(",")
    return list(itertools.chain.from_iterable(_braces(path[:m.start()] + p + path[m.end():]) for p in parts))


def named(text: str, literal_only: bool = False) -> list[str]:
    """The docs/bench paths a text names, as patterns relative to the repository: braces expanded, a shell or
    make variable ($m, ${m}, $(x)) a wildcard, a folder ending in '/'. literal_only keeps the paths with no
    variable (the Makefile's: a target's computed names are not a page's citation)."""
    out = []
    for raw in PATH.findall(text):
        raw = raw.replace("$(BENCH_DIR)", "docs/bench").rstrip(".,)")
        if literal_only and "$" in raw:
            continue
        for p in _braces(raw):
            p = re.sub(r"\$\{?\w+\}?|\$\([^)]*\)", "*", p)
            if p not in ("docs/bench", "docs/bench/"):
                out.append(p)
    return out


def makefile_reads(text: str) -> str:
    """The Makefile with what its targets write taken out (--json and --png outputs, cp's destination): what is
    left names the files a target reads."""
    text = re.sub(r"--(?:json|png)\s+\S+", "", text)
    return re.sub(r"\bcp\s+(\S+)\s+\S+", r"cp \1", text)


def covers(pattern: str, rel: str) -> bool:
    """Whether a named pattern (a path, a glob, a folder) names the file rel."""
    if "*" in pattern:
        return fnmatch.fnmatchcase(rel, pattern)
    return rel == pattern or rel.startswith(pattern.rstrip("/") + "/")


def bench_files() -> list[str]:
    """The files under docs/bench that git tracks (a benchmark writing its JSON now is not yet a figure)."""
    try:
        out = subprocess.run(["git", "ls-files", "docs/bench"], cwd=REPO, capture_output=True, text=True, check=True)
        return sorted(line for line in out.stdout.splitlines() if line)
    except (OSError, subprocess.CalledProcessError):
        return sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "bench").rglob("*") if p.is_file())


def page_patterns() -> dict[str, list[str]]:
    return {p.relative_to(REPO).as_posix(): named(p.read_text()) for p in PAGES if p.exists()}


def missing_paths(patterns: list[str], files: list[str]) -> list[str]:
    """The named paths no file answers: a path that does not exist, a glob or folder that matches nothing."""
    return [p for p in patterns if not any(covers(p, f) for f in files)]


def names_files(pattern: str) -> bool:
    """Whether a named pattern names files (a path or a glob whose last part has a dot), not a folder."""
    return not pattern.endswith("/") and "." in pattern.rsplit("/", 1)[-1]


def orphans(files: list[str], patterns: list[str]) -> list[str]:
    return [f for f in files if not any(covers(p, f) for p in patterns)]


def _walk(o, depth=0):
    """Every (key, value) pair in a JSON document, nested ones included."""
    if depth > 8:
        return
    if isinstance(o, dict):
        for k, v in o.items():
            yield k, v
            yield from _walk(v, depth + 1)
    elif isinstance(o, list):
        for v in o:
            yield from _walk(v, depth + 1)


def sample_size(data) -> int | None:
    """How many cases, runs or rounds a JSON holds: a list of cases, or the key its format counts them in."""
    if isinstance(data, list):
        return len(data) or None
    if not isinstance(data, dict):
        return None
    for key in ("n", "n_rounds", "repeats", "samples", "n_absent", "n_answerable"):
        if isinstance(data.get(key), int) and data[key] > 0:
            return data[key]
    for key in ("cases", "runs", "rows", "results", "pot", "grid"):
        if isinstance(data.get(key), list | dict) and len(data[key]) > 0:
            return len(data[key])
    return None


def provenance_gaps(data) -> list[str]:
    """What a figure's JSON lacks of its command, commit, CPU and sample size (key names as kvpot's writers
    use them: command, commit, cpu or read_cpus, and a list of cases or a count)."""
    pairs = list(_walk(data))

    def has(*keys):
        return any(k in keys and v not in (None, "", []) for k, v in pairs)

    gaps = [what for what, keys in (("command", ("command",)), ("commit", ("commit",)), ("CPU", ("cpu", "read_cpus")))
            if not has(*keys)]
    return gaps + ([] if sample_size(data) else ["sample size"])


def issue_headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#") and ISSUE.search(line)]


# the page and the files as they are

def test_every_named_bench_path_exists():
    files = bench_files()
    missing = {page: m for page, pats in page_patterns().items() if (m := missing_paths(pats, files))}
    assert not missing, f"pages name docs/bench paths that are not there: {missing}"


def test_no_orphan_file_under_docs_bench():
    """A file no page, test, Makefile line or reading code names backs no figure: it goes (git keeps it)."""
    patterns = [p for pats in page_patterns().values() for p in pats if names_files(p)]
    for f in OTHER_NAMERS:
        text = f.read_text(errors="replace")
        found = named(makefile_reads(text), literal_only=True) if f.name == "Makefile" else named(text)
        patterns += [p for p in found if names_files(p)]
    # code that globs docs/bench itself, e.g. Path(...) / "docs" / "bench" then .glob("speed/x-*.json")
    for f in OTHER_NAMERS[1:]:
        text = f.read_text(errors="replace")
        if '"bench"' in text and '"docs"' in text:
            patterns += [f"docs/bench/{g}" for g in re.findall(r'glob\("([^"]+)"\)', text)]
            patterns += [f"docs/bench/{s}" for s in re.findall(r'/ "([\w.-]+\.json)"', text)]
    left = orphans(bench_files(), patterns)
    assert not left, f"files under docs/bench that nothing names (git rm them, or cite them): {left}"


def cited_json(pages: list[str]) -> list[str]:
    """The JSON files the pages cite: by path or glob (a folder is no citation)."""
    files = [f for f in bench_files() if f.endswith(".json")]
    pats = [p for page, ps in page_patterns().items() if page in pages for p in ps if names_files(p)]
    return sorted({f for p in pats for f in files if covers(p, f)})


def provenance_report(files: list[str]) -> dict[str, list[str]]:
    return {f: g for f in files if (g := provenance_gaps(json.loads((REPO / f).read_text())))}


def test_every_cited_json_says_how_it_was_made():
    """README and docs/*.md: each figure's JSON holds its command, commit, CPU and sample size."""
    cited = cited_json(["README.md", *(p.relative_to(REPO).as_posix() for p in PAGES if p.parent.name == "docs")])
    assert "docs/bench/qa-1.5b-8k.json" in cited
    gaps = provenance_report(cited)
    assert not gaps, f"cited JSON without its command, commit, CPU or sample size: {gaps}"


def test_the_studies_json_say_how_they_were_made():
    """studies/README.md: each study's JSON holds its command, commit, CPU and sample size."""
    gaps = provenance_report(cited_json(["studies/README.md"]))
    assert not gaps, f"{len(gaps)} study JSON without their command, commit, CPU or sample size: {sorted(gaps)}"


def test_no_heading_names_an_issue():
    assert not issue_headings(PAGE.read_text())


def test_the_page_is_a_ten_minute_read():
    n = len(PAGE.read_text().splitlines())
    assert n <= MAX_LINES, f"docs/benchmarks.md is {n} lines"


# each check can fail

def test_a_missing_path_is_found():
    text = "see `docs/bench/speed/no-such.json` and docs/bench/decode/decode-{a,b}-128k.json"
    pats = named(text)
    assert pats == ["docs/bench/speed/no-such.json", "docs/bench/decode/decode-a-128k.json",
                    "docs/bench/decode/decode-b-128k.json"]
    files = ["docs/bench/decode/decode-a-128k.json", "docs/bench/decode/decode-b-128k.json"]
    assert missing_paths(pats, files) == ["docs/bench/speed/no-such.json"]
    assert missing_paths(["docs/bench/nowhere/"], files) == ["docs/bench/nowhere/"]


def test_variables_globs_and_folders_name_files():
    pats = named("for m in a b; do kvpot bench x --json docs/bench/rss/rss-$m-8k.json; done; docs/bench/curve/ "
                 "docs/bench/seed{1..2}.json")
    assert pats == ["docs/bench/rss/rss-*-8k.json", "docs/bench/curve/", "docs/bench/seed1.json", "docs/bench/seed2.json"]
    assert covers(pats[0], "docs/bench/rss/rss-infllm-8k.json")
    assert not covers(pats[0], "docs/bench/rss/rss-infllm-8k-mapped.json")
    assert covers(pats[1], "docs/bench/curve/x.json")
    make = "--json $(BENCH_DIR)/speed/$(1)-$(2).json\n\tcp docs/bench/a.json $(BENCH_DIR)/b.json --json $(BENCH_DIR)/c.json"
    assert named(make, literal_only=True) == ["docs/bench/a.json", "docs/bench/b.json", "docs/bench/c.json"]
    assert named(makefile_reads(make), literal_only=True) == ["docs/bench/a.json"]


def test_an_orphan_is_found():
    files = ["docs/bench/a.json", "docs/bench/old/b.json", "docs/bench/c.png"]
    assert orphans(files, named("`docs/bench/a.json`, docs/bench/*.png")) == ["docs/bench/old/b.json"]


def test_a_cited_folder_is_no_citation():
    """A page that names a folder keeps none of its files: each file is named by its path or a glob."""
    pats = named("JSON in `docs/bench/old/`; `python -m studies.x --dir docs/bench/old`; docs/bench/old/*.json")
    assert [names_files(p) for p in pats] == [False, False, True]
    files = ["docs/bench/old/b.json", "docs/bench/old/c.png"]
    assert orphans(files, [p for p in pats if names_files(p)]) == ["docs/bench/old/c.png"]


@pytest.mark.parametrize("data, gaps", [
    ([{"answer": "x"}], ["command", "commit", "CPU"]),
    ({"plan": {}, "pot": [{"tok_s": 1.0}], "stock": {}}, ["command", "commit", "CPU"]),
    ({"command": "kvpot bench x", "commit": "abc", "cpu": "AMD EPYC"}, ["sample size"]),
    ({"command": "kvpot bench x", "commit": "", "cpu": "AMD EPYC", "n": 3}, ["commit"]),
    ([{"command": "kvpot bench x", "commit": "abc", "read_cpus": ["Xeon"]}], []),
    ({"meta": {"command": "c", "commit": "abc", "cpu": "Xeon"}, "pot": [{}]}, []),
])
def test_a_json_without_its_provenance_is_found(data, gaps):
    assert provenance_gaps(data) == gaps


def test_an_issue_in_a_heading_is_found():
    text = "# Benchmarks\n## Speed (issue 34)\n### Decode #12\ntext about issue 5\n## Plain\n"
    assert issue_headings(text) == ["## Speed (issue 34)", "### Decode #12"]

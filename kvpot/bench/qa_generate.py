"""The generated questions of `kvpot bench qa`'s set (kvpot/bench/qa_set.json), computed from the Debian
changelogs on this machine with a fixed seed; `make qa-set` (python -m kvpot.bench.qa_generate) rebuilds
them in the set beside the hand-written ones, which it keeps as they are apart from their computed
candidates.

Each generated question records its source's sha256: where the file is unchanged, generating again gives
the same question (tests/test_qa_set.py checks it), so the reference is computed, never typed. What each
kind asks, per changelog (kvpot.bench.qa_changelog):
- lexical: the bug a quoted change closes; who signed the upload of a given date.
- two-passage: the version whose upload closes a bug (the header and the change), who signed the upload
  that closes a bug (the trailer and the change), the date of a version's upload (the trailer and the
  header); the entry holds other changes between the two.
- absent: the same questions about a bug number or a version the changelog never names (checked on the
  text); the reference is empty.
- whole (small changelogs, asked with the whole file as the input): the newest and oldest version, the
  date of the first upload, how many uploads it lists, who signed most of them, how many bugs it closes.
Candidates are the competing answers of the same type in that changelog (other versions, bug numbers,
signers, dates; nearby counts for a count), at most CANDIDATES_MAX, drawn with the seed, never one that
holds a reference or that a reference holds."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from pathlib import Path

from kvpot.bench.qa_changelog import Entry, Item, occurrences, parse, signers
from kvpot.bench.qa_questions import SET_PATH, holds, source_sha256
from kvpot.bench.qa_score import normalize
from kvpot.bench.qa_sources import passage_pattern, read_source
from kvpot.bench.qa_words import lexical_or_paraphrase
from kvpot.safe_write import write_text_file

SEED = 90
CANDIDATES_MAX = 50
KINDS = ("lexical", "paraphrase", "two-passage", "whole", "absent")
CHANGELOG = "/usr/share/doc/{}/changelog.Debian.gz"
# packages of a Debian system with Python whose changelogs hold enough closed bugs and signers; each
# asks at most 8 questions inside a haystack, so that at 32K tokens (12 questions an input) the set's
# inputs outnumber any one source's questions and no input holds two excerpts of one file
EXCERPT_PACKAGES = ("coreutils", "debianutils", "gzip", "bzip2", "util-linux", "libc6", "login", "procps",
                    "sysvinit-utils", "tzdata", "ncurses-base", "openssl", "perl-base", "patch", "make",
                    "libxml2", "man-db", "e2fsprogs", "mawk", "libsqlite3-0")
# small changelogs (a few thousand tokens), asked about as a whole with the file alone as the input
WHOLE_PACKAGES = ("dash", "less", "file", "libcrypt1", "zstd", "lz4", "fakeroot")
MONTHS = {m[:3]: m for m in ("January", "February", "March", "April", "May", "June", "July", "August",
                             "September", "October", "November", "December")}


def date_aliases(date: str) -> list[str]:
    """Other ways to write a changelog's "05 Jan 2023"."""
    d, mon, y = date.split()
    month, day = MONTHS.get(mon, mon), int(d)
    return list(dict.fromkeys(a for a in (f"{day} {mon} {y}", f"{day} {month} {y}", f"{month} {day}, {y}",
                                          f"{y}-{list(MONTHS).index(mon) + 1:02d}-{day:02d}" if mon in MONTHS else "")
                              if a and a != date))


def _holds(a: str, b: str) -> bool:
    """`b` appears in `a` as whole words, after normalizing (as the scorer compares)."""
    na, nb = normalize(a), normalize(b)
    return bool(nb) and f" {nb} " in f" {na} "


def pick_candidates(pool, refs: list[str], rng: random.Random) -> list[str]:
    """Distinct competitors from `pool` that neither hold a reference nor are held by one, at most
    CANDIDATES_MAX of them drawn with `rng`, in the pool's order."""
    refs = [r for r in refs if r]
    pool = [c for c in dict.fromkeys(pool)
            if c and not any(_holds(c, r) or _holds(r, c) for r in refs)]
    if len(pool) > CANDIDATES_MAX:
        keep = set(rng.sample(range(len(pool)), CANDIDATES_MAX))
        pool = [c for i, c in enumerate(pool) if i in keep]
    return pool


_MONTH_RE = "(?:" + "|".join(list(MONTHS.values()) + list(MONTHS)) + r")\.?"


def shape_pattern(answer: str) -> re.Pattern | None:
    """A pattern for strings of the answer's shape, or None for an answer with no digit (a name): each
    digit run any digits of that length (any length between dots, as in a version), a month any month,
    the rest as it is."""
    if not re.search(r"\d", answer):
        return None
    out, at = [], 0
    for m in re.finditer(r"\d+|" + _MONTH_RE, answer):
        out.append(re.escape(answer[at:m.start()]))
        tok = m.group(0)
        dotted = "." in answer[max(0, m.start() - 1):m.end() + 1]
        out.append((r"\d+" if dotted else rf"\d{{{len(tok)}}}") if tok[0].isdigit() else _MONTH_RE)
        at = m.end()
    out.append(re.escape(answer[at:]))
    return re.compile(r"(?<![\w.])" + "".join(out) + r"(?![\w]|\.\d)")


def shape_candidates(answer: str, refs: list[str], text: str, rng: random.Random) -> list[str]:
    """Strings of the answer's shape in the source text, as candidates (none for a name)."""
    pat = shape_pattern(answer)
    if pat is None:
        return []
    return pick_candidates(sorted({" ".join(m.group(0).split()) for m in pat.finditer(text)}), refs, rng)


def _q(qid: str, kind: str, source: str, sha: str, question: str, answer: str, aliases: list[str],
       passages: list[str], candidates: list[str], absent: str = "") -> dict:
    q = {"id": qid, "kind": kind, "source": source, "sha256": sha, "question": question, "answer": answer,
         "aliases": aliases}
    if passages:
        q["passage"] = passages[0]
    if len(passages) > 1:
        q["passages"] = passages
    if absent:
        q["absent"] = absent
    q["candidates"] = candidates
    return q


def _item_passage(item: Item, bug: str) -> str | None:
    """The change from its first word to the Closes: that names `bug`, one line; None when long."""
    body = item.text.lstrip()[2:]
    for c in re.finditer(r"closes:\s*(?:bug)?\#?\s?\d+(?:,\s*(?:bug)?\#?\s?\d+)*", body, re.I):
        if re.search(rf"(?<!\d){bug}(?!\d)", c.group(0)):
            p = " ".join(body[:c.end()].split())
            return p if len(p) <= 400 else None
    return None


def _snippet(item: Item, text: str) -> str | None:
    """The change's opening words (before its Closes:), found once in the changelog; None if too short."""
    body = re.split(r"\(?\s*closes:", item.text.lstrip()[2:], flags=re.I)[0]
    words = [w for w in body.split() if '"' not in w][:10]
    while words and not words[-1][-1].isalnum():
        words[-1] = words[-1][:-1]
        if not words[-1]:
            words.pop()
    if len(words) < 4 or any(re.search(r"\d{4,}", w) for w in words):
        return None
    snip = " ".join(words)
    return snip if len(list(passage_pattern(snip).finditer(text))) == 1 else None


def _absent_version(versions: list[str], text: str, rng: random.Random) -> str | None:
    """A version of the changelog's own shape that it never names: a listed one with its last number raised."""
    for v in rng.sample(versions, len(versions)):
        m = list(re.finditer(r"\d+", v))
        if not m:
            continue
        last = m[-1]
        for step in (1, 2, 3):
            w = v[:last.start()] + str(int(last.group(0)) + step) + v[last.end():]
            if not holds(text, w):
                return w
    return None


def excerpt_questions(pkg: str) -> list[dict]:
    """Lexical, two-passage and absent questions on one package's changelog (at most 8)."""
    source = CHANGELOG.format(pkg)
    text, sha = read_source(source), source_sha256(source)
    if text is None or sha is None:
        return []
    rng = random.Random(f"qa-set-{SEED}-{source}")
    entries = parse(text)
    versions = [e.version for e in entries]
    names = list(signers(entries))
    dates = [e.date for e in entries]
    of = f"In the Debian changelog of {pkg},"
    # bugs named once in the file, by a change with a passage short enough to quote
    found: list[tuple[Entry, int, str, str]] = []
    for e in entries:
        for k, it in enumerate(e.items):
            for b in it.bugs:
                p = _item_passage(it, b)
                if p and occurrences(text, b) == 1 and len(it.bugs) == 1:
                    found.append((e, k, b, p))
    rng.shuffle(found)
    all_bugs = sorted({b for e in entries for b in e.bugs}, key=int)
    out: list[dict] = []
    used: set[str] = set()

    def take(ok) -> tuple[Entry, int, str, str] | None:
        for f in found:
            if f[2] not in used and ok(*f):
                used.add(f[2])
                return f
        return None

    # lexical: the bug a quoted change closes (two of them)
    n = 0
    for e, k, b, p in found:
        if n == 2:
            break
        snip = _snippet(e.items[k], text)
        if b in used or snip is None:
            continue
        used.add(b)
        n += 1
        out.append(_q(f"deb-{pkg}-bug-of-change-{n}", "lexical", source, sha,
                      f'{of} which bug number does the change "{snip}" close?', b, [f"#{b}"], [p],
                      pick_candidates(all_bugs, [b], rng)))
    # lexical: who signed the upload of a date that one upload has
    once = [e for e in entries if dates.count(e.date) == 1]
    if len(names) > 1 and once:
        e = rng.choice(once)
        out.append(_q(f"deb-{pkg}-signer-of-date", "lexical", source, sha, f"{of} who signed the upload dated {e.date}?",
                      e.name, [], [e.trailer], pick_candidates(names, [e.name], rng)))
    # two-passage: the version that closes a bug (a change after the entry's first)
    f = take(lambda e, k, b, p: k >= 1 and versions.count(e.version) == 1)
    if f:
        e, _, b, p = f
        out.append(_q(f"deb-{pkg}-version-of-bug", "two-passage", source, sha,
                      f"{of} which version's upload closes bug #{b}?", e.version, [], [e.header, p],
                      pick_candidates(versions, [e.version], rng)))
    # two-passage: who signed the upload that closes a bug (a change before the entry's last)
    f = take(lambda e, k, b, p: k < len(e.items) - 1) if len(names) > 1 else None
    if f:
        e, _, b, p = f
        out.append(_q(f"deb-{pkg}-signer-of-bug", "two-passage", source, sha,
                      f"{of} who signed the upload that closes bug #{b}?", e.name, [], [e.trailer, p],
                      pick_candidates(names, [e.name], rng)))
    # two-passage: the date of a version's upload (an entry of two changes or more)
    long = [e for e in entries if len(e.items) >= 2 and versions.count(e.version) == 1]
    if long:
        e = rng.choice(long)
        out.append(_q(f"deb-{pkg}-date-of-version", "two-passage", source, sha,
                      f"{of} on what date was version {e.version} uploaded?", e.date, date_aliases(e.date),
                      [e.trailer, e.header], pick_candidates(dates, [e.date, *date_aliases(e.date)], rng)))
    # absent: a bug number the changelog never names, between its lowest and highest
    if len(all_bugs) >= 2 and found:
        lo, hi = int(all_bugs[0]), int(all_bugs[-1])
        for _ in range(1000):
            b = str(rng.randint(lo, hi))
            if not holds(text, b):
                out.append(_q(f"deb-{pkg}-absent-bug", "absent", source, sha,
                              f"{of} which version's upload closes bug #{b}?", "", [], [rng.choice(found)[3]],
                              pick_candidates(versions, [], rng), absent=b))
                break
    # absent: a version the changelog never names (who signed it, or its date)
    v = _absent_version(versions, text, rng)
    if v is not None:
        e = rng.choice(entries)
        if rng.random() < 0.5 and len(names) > 1:
            out.append(_q(f"deb-{pkg}-absent-version-signer", "absent", source, sha,
                          f"{of} who signed the upload of version {v}?", "", [], [e.header],
                          pick_candidates(names, [], rng), absent=v))
        else:
            out.append(_q(f"deb-{pkg}-absent-version-date", "absent", source, sha,
                          f"{of} on what date was version {v} uploaded?", "", [], [e.header],
                          pick_candidates(dates, [], rng), absent=v))
    return out


def _count_candidates(n: int, rng: random.Random) -> list[str]:
    return pick_candidates([str(k) for k in range(max(0, n - 10), n + 11) if k != n], [str(n)], rng)


def whole_questions(pkg: str) -> list[dict]:
    """Questions about one small changelog as a whole; its whole text is the input they are asked with."""
    source = CHANGELOG.format(pkg)
    text, sha = read_source(source), source_sha256(source)
    if text is None or sha is None:
        return []
    rng = random.Random(f"qa-set-{SEED}-{source}-whole")
    entries = parse(text)
    if len(entries) < 5:
        return []
    versions = [e.version for e in entries]
    dates = [e.date for e in entries]
    of = f"the Debian changelog of {pkg}"
    out = [
        _q(f"deb-{pkg}-newest-version", "whole", source, sha, f"Which version is the newest upload that {of} lists?",
           entries[0].version, [], [], pick_candidates(versions[1:], [entries[0].version], rng)),
        _q(f"deb-{pkg}-oldest-version", "whole", source, sha, f"Which version is the oldest upload that {of} lists?",
           entries[-1].version, [], [], pick_candidates(versions[:-1], [entries[-1].version], rng)),
        _q(f"deb-{pkg}-first-date", "whole", source, sha, f"On what date was the oldest upload that {of} lists made?",
           entries[-1].date, date_aliases(entries[-1].date), [],
           pick_candidates(dates[:-1], [entries[-1].date, *date_aliases(entries[-1].date)], rng)),
        _q(f"deb-{pkg}-uploads", "whole", source, sha,
           f"How many uploads (entries with a version header) does {of} list?", str(len(entries)), [], [],
           _count_candidates(len(entries), rng)),
    ]
    top = signers(entries).most_common()
    if len(top) > 1 and top[0][1] > top[1][1]:
        out.append(_q(f"deb-{pkg}-top-signer", "whole", source, sha, f"Who signed the most uploads in {of}?",
                      top[0][0], [], [], pick_candidates([n for n, _ in top[1:]], [top[0][0]], rng)))
    bugs = {b for e in entries for b in e.bugs}
    if len(bugs) >= 3:
        out.append(_q(f"deb-{pkg}-bugs-closed", "whole", source, sha,
                      f"How many different bug numbers do the Closes: entries of {of} name?", str(len(bugs)), [], [],
                      _count_candidates(len(bugs), rng)))
    return out


def generate() -> list[dict]:
    """Every generated question this machine's files give, in a fixed order."""
    out = []
    for pkg in EXCERPT_PACKAGES:
        out += excerpt_questions(pkg)
    for pkg in WHOLE_PACKAGES:
        out += whole_questions(pkg)
    return out


def regenerate(source: str) -> list[dict]:
    """The generated questions of one source, as generating them on this machine gives them."""
    pkg = source.split("/")[4]
    return (excerpt_questions(pkg) if pkg in EXCERPT_PACKAGES else []) + \
        (whole_questions(pkg) if pkg in WHOLE_PACKAGES else [])


def _rank(qid: str) -> str:
    return hashlib.sha256(f"qa-heldout-{qid}".encode()).hexdigest()


def heldout_ids(questions: list[dict]) -> set[str]:
    """The held-out rule: in each kind, the hand-written questions marked held out stay so, and the
    generated ones (those with a sha256) ranked first by sha256("qa-heldout-" + id) join them until the
    kind's held-out count is round(n / 3)."""
    held: set[str] = set()
    for kind in KINDS:
        qs = [q for q in questions if q["kind"] == kind]
        fixed = {q["id"] for q in qs if "sha256" not in q and q.get("heldout")}
        gen = sorted((q["id"] for q in qs if "sha256" in q), key=_rank)
        held |= fixed | set(gen[:max(0, round(len(qs) / 3) - len(fixed))])
    return held


def hand_candidates(q: dict) -> list[str]:
    """A hand-written question's candidates: strings of its answer's shape in its source (shape_pattern);
    none where the answer is a name."""
    text = read_source(q["source"]) or ""
    rng = random.Random(f"qa-set-{SEED}-{q['id']}")
    return shape_candidates(q["answer"], [q["answer"], *q.get("aliases", ())], text, rng)


_HAND_ORDER = ("id", "kind", "source", "question", "answer", "aliases", "passage", "passages", "candidates")


def _hand(q: dict) -> dict:
    """A hand-written question with its kind computed (lexical or paraphrase by the shared-word rule;
    a two-passage one stays so) and its candidates."""
    q = dict(q)
    passages = q.get("passages") or [q["passage"]]
    if q.get("kind") != "two-passage":
        q["kind"] = lexical_or_paraphrase(q["question"], passages, q["source"])
    q["candidates"] = hand_candidates(q)
    return {k: q[k] for k in (*_HAND_ORDER, *q) if k in q}


def about(questions: list[dict]) -> str:
    kinds = Counter(q["kind"] for q in questions)
    held = Counter(q["kind"] for q in questions if q["heldout"])
    counts = ", ".join(f"{kinds[k]} {k} ({held[k]} held out)" for k in KINDS)
    return (f"Questions for `kvpot bench qa` over texts that ship with Debian and Python (docs/benchmarks.md): "
            f"{len(questions)} in all, {counts}. Kinds (kvpot/bench/qa_questions.py): lexical repeats a content "
            "word of its passage beyond the subject's name, paraphrase repeats none (kvpot/bench/qa_words.py "
            "computes it); two-passage needs both its passages; whole is about the whole document, asked with "
            "the whole file as the input; absent asks for something the source never holds (empty answer). "
            "Hand-written questions (no sha256) quote their passages; generated ones (with their source's "
            f"sha256) are computed from Debian changelogs by kvpot/bench/qa_generate.py with seed {SEED} "
            "(`make qa-set`), and generating again from an unchanged file gives them back. Each answer or "
            "alias appears in its first passage; each passage is quoted from its source (whitespace aside). "
            "Candidates are competing answers of the reference's type computed from the source. Held out: "
            "in each kind round(n/3), the hand-written ones marked so plus the generated ones ranked first "
            "by sha256('qa-heldout-' + id); held-out questions are never used to tune anything.")


def build_set(current: dict) -> dict:
    """The set from the current one's hand-written questions and this machine's generated ones."""
    questions = [_hand(q) for q in current["questions"] if "sha256" not in q] + generate()
    held = heldout_ids(questions)
    for q in questions:
        q["heldout"] = q["id"] in held
    return {"about": about(questions), "questions": questions}


def main(path: Path = SET_PATH) -> None:
    data = build_set(json.loads(path.read_text(encoding="utf-8")))
    write_text_file(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n", "question set")
    kinds = Counter(q["kind"] for q in data["questions"])
    print(f"{path}: {len(data['questions'])} questions, " + ", ".join(f"{kinds[k]} {k}" for k in KINDS))


if __name__ == "__main__":
    main()

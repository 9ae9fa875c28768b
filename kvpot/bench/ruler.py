"""The tasks of `kvpot bench ruler`: RULER (Hsieh et al. 2024, arXiv 2404.06654) generated offline.

Each task follows the paper's definition and its public configuration (the thirteen tasks of its Table 2 /
scripts/synthetic.yaml): the same needle sentence, task instructions, questions, key and value types, counts,
haystack kinds and generation lengths. A sample is a pure function of (task, seed, length, index) and the
tokenizer count that sizes it, on one machine (the haystacks are texts that ship with Debian and Python):

- niah_single_1/2/3: one needle "One of the special magic {numbers|uuids} for {key} is: {value}." in the
  noise haystack (the paper's repeated "The grass is green. ..." lines) or in prose, value a 7-digit number or
  a UUID; niah_multikey_1: three more needles with other keys in prose; niah_multikey_2/3: a haystack made of
  needles (every line another key and value; keys words or UUIDs); niah_multivalue: four values under one
  key; niah_multiquery: four keys, all asked in one question.
- vt: one chain of 4 hops ("VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE ", ...) in the noise haystack, after
  one worked example; every variable of the chain is a reference.
- cwe: a numbered list of words, 10 of them 30 times each and the rest 3 times, after one worked example; the
  10 are the references.
- fwe: coded 6-letter words drawn from a Zipf distribution (alpha 2, vocabulary length/50), the most frequent
  one replaced by "..."; the next three are the references.
- qa: kvpot's own question set (kvpot/bench/qa_set.json, real documents that ship with Debian and Python) in
  place of SQuAD and HotpotQA, which need a network: qa_inputs' excerpts around each question's passage among
  other documents, several questions per input; a question's answer and aliases are its references.

Where kvpot differs from the paper: the essay haystack is prose from the Python standard library's docstrings
(kvpot.bench.haystack), not Paul Graham's essays; word keys are two words of this machine's texts joined by a
hyphen (the paper's adjective-noun pairs come from a word list not shipped offline); the QA documents are
headed by their file name (qa_inputs) rather than "Document N:"; and each sample's task instruction is the
first line of its document, its question asked after the document is read (so one read answers every
question of a sample), through the model's chat template without the paper's forced answer prefix, with
RULER's generation length plus ANSWER_ROOM tokens for the model to say that prefix itself.
"""

from __future__ import annotations

import math
import random
import re
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from kvpot.bench.qa_inputs import doc_tokens

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
DEPTHS = tuple(round(100 * i / 39) for i in range(40))  # the paper's 40 insertion depths, in percent
ANSWER_ROOM = 32  # tokens beside RULER's generation length: the answer prefix the model says itself

# RULER's generation lengths (tokens_to_generate)
GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}

NIAH_INSTRUCTION = ("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
                    "I will quiz you about the {type_v} afterwards.")
NIAH_QUESTION = "What are all the special magic {type_v} for {query} mentioned in the provided text?"
VT_INSTRUCTION = "Memorize and track the chain(s) of variable assignment hidden in the following text."
VT_QUESTION = "Find all variables that are assigned the value {value} in the text above."
VT_ANSWER = ("Answer: According to the chain(s) of variable assignment in the text above, {n} variables are "
             "assigned the value {value}, they are: ")
CWE_INSTRUCTION = ("Below is a numbered list of words. In these words, some appear more often than others. "
                   "Memorize the ones that appear most often.")
CWE_QUESTION = "What are the 10 most common words in the above list?"
CWE_ANSWER = "Answer: The top 10 words that appear most often in the list are:"
FWE_INSTRUCTION = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                   "frequently appeared coded words.")
FWE_QUESTION = ("Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently "
                "appeared words in the above coded text?")
QA_INSTRUCTION = ("Answer the question based on the given documents. Only give me the answer and do not output any "
                  "other words.")


@dataclass(frozen=True)
class Niah:
    haystack: str   # noise, essay or needle
    key: str        # words or uuids
    value: str      # numbers or uuids
    n_k: int = 1    # needles with distinct keys (the asked ones among them)
    n_v: int = 1    # values under each key
    n_q: int = 1    # keys asked in the one question


NIAH = {
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", n_k=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", n_v=4),
    "niah_multiquery": Niah("essay", "words", "numbers", n_k=4, n_q=4),
}
TASKS = (*NIAH, "vt", "cwe", "fwe", "qa")
CATEGORY = {**{t: "retrieval" for t in NIAH}, "vt": "multi-hop tracing", "cwe": "aggregation",
            "fwe": "aggregation", "qa": "question answering"}


@dataclass(frozen=True)
class Ask:
    """One question of a sample and what scores it."""

    id: str
    question: str
    refs: tuple[str, ...]
    metric: str                       # "all": share of refs the answer holds; "part": 1 if it holds any
    max_tokens: int
    at: tuple[int, ...] = ()          # where each ref starts in the document (-1: not verbatim, a QA alias)
    distractors: tuple[str, ...] = ()  # values the document holds that do not answer this question
    heldout: bool = False             # qa: a held-out question of the set


@dataclass(frozen=True)
class Sample:
    task: str
    index: int
    length: int         # the nominal length; the document holds about doc_tokens(length) tokens
    text: str
    tokens: int         # the document's tokens by the count that sized it
    asks: tuple[Ask, ...]


Count = Callable[[str], int]


def score(answer: str, refs: tuple[str, ...] | list[str], metric: str) -> float:
    """RULER's metric for one answer: string_match_all (the share of references the answer holds, case
    ignored) or string_match_part (1 if it holds any); the answer's control characters count as line breaks."""
    a = re.sub(r"[\x00-\x1f]", "\n", answer.strip()).strip().lower()
    hits = [r.lower() in a for r in refs]
    if not hits:
        return 0.0
    return sum(hits) / len(hits) if metric == "all" else float(any(hits))


def samples(task: str, seed: int, count: Count, length: int, n: int) -> list[Sample]:
    """The first `n` samples of `task` at `length` for `seed` (sample i is the same whatever n is)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    if task == "qa":
        return qa_samples(seed, count, length, n)
    make = {"vt": vt_sample, "cwe": cwe_sample, "fwe": fwe_sample}.get(task)
    return [make(seed, count, length, i) if make else niah_sample(task, seed, count, length, i) for i in range(n)]


def _rng(*parts) -> random.Random:
    return random.Random("ruler-" + "-".join(map(str, parts)))


def _fit(build: Callable[[int], str], count: Count, target: int, probe: int, least: int = 1) -> tuple[int, str, int]:
    """The largest unit count n (at least `least`) whose document build(n) holds at most `target` tokens: a
    guess from a probe of `probe` units, then bisection. Returns (n, document, its tokens)."""
    if count(build(least)) > target:
        raise ValueError(f"{target:,} tokens cannot hold this task's smallest document")
    per = max(count(build(probe)) / probe, 1e-3)
    lo, hi = least, max(least + 1, int(target / per * 1.05) + 2)
    while count(build(hi)) <= target:  # the guess was short: widen
        lo, hi = hi, hi * 2
    guess = max(lo, min(hi - 1, int(target / per * 0.97)))
    if count(build(guess)) <= target:
        lo = guess
    else:
        hi = guess
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(build(mid)) <= target:
            lo = mid
        else:
            hi = mid
    text = build(lo)
    return lo, text, count(text)


# ---------------------------------------------------------------- words, keys and values

@lru_cache(maxsize=1)
def words() -> tuple[str, ...]:
    """Distinct lowercase words (4 to 12 letters) of the prose this machine ships: the docstrings of the
    essay haystack, the diffutils manual and the licenses under /usr/share/common-licenses, sorted."""
    import glob

    from kvpot.bench.haystack import prose_paragraphs
    from kvpot.bench.texts import manual_text

    texts = list(prose_paragraphs())
    try:
        texts.append(manual_text())
    except OSError:
        pass
    for f in sorted(glob.glob("/usr/share/common-licenses/*")):
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                texts.append(fh.read())
        except OSError:
            continue
    found = {w for t in texts for w in re.findall(r"(?<![\w-])[a-z]{4,12}(?![\w-])", t)}
    return tuple(sorted(found))


def _draw(kind: str, rng: random.Random, taken: set[str]) -> str:
    """A key or value of `kind` (numbers: 7 digits; uuids: a version-4 UUID; words: two words joined by a
    hyphen) not in `taken` (nor a substring of one there), then added to it."""
    vocab = words()
    while True:
        if kind == "numbers":
            v = str(rng.randint(1_000_000, 9_999_999))
        elif kind == "uuids":
            v = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        else:
            v = f"{rng.choice(vocab)}-{rng.choice(vocab)}"
        # a word key must not sit inside another ("able-case" in "table-case"); numbers and UUIDs have one length
        if v not in taken and (kind != "words" or not any(v in t or t in v for t in taken)):
            taken.add(v)
            return v


def _sentences(seed: int, count: int) -> list[str]:
    """`count` sentences of the essay haystack (docstring prose, paragraphs in a seeded order, cycled)."""
    from kvpot.bench.haystack import filler_stream

    out: list[str] = []
    for para in filler_stream(seed):
        out += re.split(r"(?<=[.!?])\s+", para)
        if len(out) >= count:
            return out[:count]
    return out


def _join_spans(pieces: list[str], sep: str) -> tuple[str, list[int]]:
    """The pieces joined by `sep`, and where each starts."""
    starts, at = [], 0
    for p in pieces:
        starts.append(at)
        at += len(p) + len(sep)
    return sep.join(pieces), starts


# ---------------------------------------------------------------- needle in a haystack

def niah_sample(task: str, seed: int, count: Count, length: int, index: int) -> Sample:
    cfg = NIAH[task]
    rng = _rng(task, seed, length, index)
    taken: set[str] = set()
    keys = [_draw(cfg.key, rng, taken) for _ in range(max(cfg.n_k, cfg.n_q))]
    values = [[_draw(cfg.value, rng, taken) for _ in range(cfg.n_v)] for _ in keys]
    needles = [(k, v, NEEDLE.format(type_v=cfg.value, key=k, value=v)) for k, vs in zip(keys, values) for v in vs]
    rng.shuffle(needles)
    asked = sorted(rng.sample(range(len(keys)), cfg.n_q))
    one = cfg.n_q * cfg.n_v == 1
    type_v = cfg.value[:-1] if one else cfg.value
    instruction = NIAH_INSTRUCTION.format(type_v=type_v)
    question = NIAH_QUESTION.format(type_v=type_v, query=_listed([keys[i] for i in asked]))
    if one:  # the paper's singular wording for one answer
        instruction = instruction.replace("Some", "A").replace("are", "is")
        question = question.replace("are all", "is")
    state = rng.getstate()

    def build(n: int) -> tuple[str, list[int]]:
        r = random.Random()
        r.setstate(state)
        if cfg.haystack == "essay":
            sents = _sentences(seed * 1000 + index, n)
            cuts = sorted(int(n * d / 100) for d in r.sample(DEPTHS, len(needles)))
            pieces, at = [], 0
            for cut, (_, _, text) in zip(cuts, needles):
                pieces += sents[at:cut] + [text]
                at = cut
            pieces += sents[at:]
            sep = " "
        else:
            if cfg.haystack == "noise":
                pieces = [NOISE] * n
            else:  # a haystack of needles: every line another key and value
                more = set(taken)
                pieces = [NEEDLE.format(type_v=cfg.value, key=_draw(cfg.key, r, more), value=_draw(cfg.value, r, more))
                          for _ in range(n)]
            # final places of the needles among the lines, inserted shallowest first
            for i, (_, _, text) in zip(sorted(r.sample(range(n + len(needles)), len(needles))), needles):
                pieces.insert(i, text)
            sep = "\n"
        body, starts = _join_spans(pieces, sep)
        head = instruction + "\n"
        return head + body + "\n", [len(head) + s for s in starts]

    probe = 40 if cfg.haystack == "essay" else 25
    n, text, tokens = _fit(lambda k: build(k)[0], count, doc_tokens(length), probe)
    refs = tuple(v for i in asked for v in values[i])
    at = tuple(text.index(NEEDLE.format(type_v=cfg.value, key=keys[i], value=v)) + len(
        NEEDLE.format(type_v=cfg.value, key=keys[i], value="")) - 1 for i in asked for v in values[i])
    distractors = [v for i, vs in enumerate(values) if i not in asked for v in vs]
    if cfg.haystack == "needle":  # every line of the haystack is a value that answers nothing
        distractors += re.findall(r" is: (\S+)\.\n", text)
        distractors = [d for d in distractors if d not in refs]
    ask = Ask(f"{task}-{index}", question, refs, "all", GENERATE["niah"] + ANSWER_ROOM, at, tuple(distractors))
    return Sample(task, index, length, text, tokens, (ask,))


def _listed(items: list[str]) -> str:
    """"a", "a and b"? RULER writes "a, b, and c" for several and the key alone for one."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


# ---------------------------------------------------------------- variable tracking

def _chain(rng: random.Random, hops: int, letters: int, value: str, taken: set[str]) -> list[str]:
    names = []
    while len(names) < hops + 1:
        v = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if v not in taken and not any(v in t or t in v for t in taken):
            taken.add(v)
            names.append(v)
    return names


def _vt_lines(names: list[str], value: str) -> list[str]:
    return [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a} " for a, b in zip(names, names[1:])]


def _vt_context(rng: random.Random, n: int, lines: list[str]) -> str:
    sents = [NOISE] * n
    # final places of the chain's lines among the noise, in the chain's order
    for i, line in zip(sorted(rng.sample(range(n + len(lines)), len(lines))), lines):
        sents.insert(i, line)
    return "\n".join(sents)


def vt_sample(seed: int, count: Count, length: int, index: int, hops: int = 4) -> Sample:
    rng = _rng("vt", seed, length, index)
    taken: set[str] = set()
    ex_names = _chain(rng, hops, 3, "", taken)
    names = _chain(rng, hops, 5, "", taken)
    ex_value = str(rng.randint(10000, 99999))
    value = str(rng.randint(10000, 99999))
    while value == ex_value:
        value = str(rng.randint(10000, 99999))
    # one worked example before the task, as the paper's prompt has (a short haystack, 3-letter names)
    example = (f"{VT_INSTRUCTION}\n\n{_vt_context(rng, 10, _vt_lines(ex_names, ex_value))}\n"
               f"Question: {VT_QUESTION.format(value=ex_value)} {VT_ANSWER.format(n=hops + 1, value=ex_value)}"
               f"{' '.join(ex_names)}\n")
    state = rng.getstate()

    def build(n: int) -> str:
        r = random.Random()
        r.setstate(state)
        return f"{example}{VT_INSTRUCTION}\n\n{_vt_context(r, n, _vt_lines(names, value))}\n"

    n, text, tokens = _fit(build, count, doc_tokens(length), 25)
    at = tuple(text.index(f"VAR {v} =", len(example)) + 4 for v in names)
    ask = Ask(f"vt-{index}", VT_QUESTION.format(value=value), tuple(names), "all", GENERATE["vt"] + ANSWER_ROOM, at,
              tuple(ex_names))
    return Sample("vt", index, length, text, tokens, (ask,))


# ---------------------------------------------------------------- common words extraction

def _numbered(items: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))


def _cwe_list(rng: random.Random, pool: list[str], n_words: int, common: int, rare: int, n_common: int = 10):
    chosen = pool[:n_words]
    top, rest = chosen[:n_common], chosen[n_common:]
    listed = top * common + rest * rare
    rng.shuffle(listed)
    return _numbered(listed), top


def cwe_frequencies(length: int) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """The paper's counts: (example words, times each common one, times each other one) of the worked example,
    then (times each common word, times each other word) of the task; smaller below 4,096 tokens."""
    return ((20, 3, 1), (6, 1)) if length < 4096 else ((40, 10, 3), (30, 3))


@lru_cache(maxsize=1)
def more_words() -> tuple[str, ...]:
    """words(), then the other words (4 to 12 letters, sorted) of the comment lines of the standard library's
    sources: the larger list the common-words task draws from where words() is too short (a long input), as the
    paper's generator turns to a larger word list."""
    import sysconfig
    from pathlib import Path

    base = set(words())
    found: set[str] = set()
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                found.update(re.findall(r"(?<![\w-])[a-z]{4,12}(?![\w-])", line))
    return words() + tuple(sorted(found - base))


class _ShortOfWords(ValueError):
    pass


def cwe_sample(seed: int, count: Count, length: int, index: int) -> Sample:
    try:
        return _cwe_sample(seed, count, length, index, words())
    except _ShortOfWords:
        return _cwe_sample(seed, count, length, index, more_words())


def _cwe_sample(seed: int, count: Count, length: int, index: int, pool: tuple[str, ...]) -> Sample:
    rng = _rng("cwe", seed, length, index)
    vocab = list(pool)
    rng.shuffle(vocab)
    (ex_words, ex_common, ex_rare), (common, rare) = cwe_frequencies(length)
    example_words, vocab = vocab[:ex_words], vocab[ex_words:]
    # one worked example before the task, as the paper's prompt has
    ex_text, ex_top = _cwe_list(rng, example_words, ex_words, ex_common, ex_rare)
    example = f"{CWE_INSTRUCTION}\n{ex_text}\nQuestion: {CWE_QUESTION} {CWE_ANSWER} {_numbered(ex_top)}\n"
    state = rng.getstate()

    def build(n: int) -> str:
        if n > len(vocab):
            raise _ShortOfWords(f"cwe at {length:,} tokens needs more than the {len(vocab):,} distinct words of "
                                f"this machine's texts (kvpot.bench.ruler.more_words)")
        r = random.Random()
        r.setstate(state)
        body, _ = _cwe_list(r, vocab, n, common, rare)
        return f"{example}{CWE_INSTRUCTION}\n{body}\n"

    n, text, tokens = _fit(build, count, doc_tokens(length), 60, least=10)
    top = vocab[:10]
    head = len(example) + len(CWE_INSTRUCTION) + 1
    at = tuple(head + re.search(rf"(?<=\d\. ){re.escape(w)}(?= |\n)", text[head:]).start() for w in top)
    ask = Ask(f"cwe-{index}", CWE_QUESTION, tuple(top), "all", GENERATE["cwe"] + ANSWER_ROOM, at,
              tuple(vocab[10:n]))
    return Sample("cwe", index, length, text, tokens, (ask,))


# ---------------------------------------------------------------- frequent words extraction

ZETA2 = math.pi ** 2 / 6  # zeta(2): the Zipf distribution's normaliser at alpha 2


def fwe_sample(seed: int, count: Count, length: int, index: int, alpha: float = 2.0) -> Sample:
    if alpha != 2.0:
        raise ValueError("fwe is generated at the paper's alpha 2.0")
    rng = _rng("fwe", seed, length, index)
    size = max(10, length // 50)
    vocab: list[str] = []
    seen: set[str] = set()
    while len(vocab) < size:
        w = "".join(rng.choices(string.ascii_lowercase, k=6))
        if w not in seen:
            seen.add(w)
            vocab.append(w)
    vocab[0] = "..."  # the most frequent word is noise, as the paper's
    state = rng.getstate()

    def counts(n: int) -> list[int]:
        return [int(n * k ** -alpha / ZETA2) for k in range(1, len(vocab) + 1)]

    def build(n: int) -> str:
        r = random.Random()
        r.setstate(state)
        listed = [w for w, c in zip(vocab, counts(n)) for _ in range(c)]
        r.shuffle(listed)
        return f"{FWE_INSTRUCTION} {' '.join(listed)}\n"

    n, text, tokens = _fit(lambda k: build(k * 10), count, doc_tokens(length), 60)
    top = tuple(vocab[1:4])
    at = tuple(re.search(rf"(?<= ){w}(?= |\n)", text).start() for w in top)
    ask = Ask(f"fwe-{index}", FWE_QUESTION, top, "all", GENERATE["fwe"] + ANSWER_ROOM, at, tuple(vocab[4:]))
    return Sample("fwe", index, length, text, tokens, (ask,))


# ---------------------------------------------------------------- question answering on real documents

def qa_questions():
    """The questions of kvpot's set a RULER QA sample asks: those with an answer in their passage, asked
    inside a haystack (not the whole-document or absent ones)."""
    from kvpot.bench.qa_questions import load_set

    return [q for q in load_set().questions if q.answer and not q.whole_input and q.kind != "absent"]


def qa_samples(seed: int, count: Count, length: int, n: int, questions=None) -> list[Sample]:
    """`n` inputs of qa_inputs (excerpts around the asked passages among other documents), per_input(length)
    questions each, drawn from the set by the seed; the paper's instruction heads the document and goes
    with each question."""
    from kvpot.bench.qa_inputs import build_inputs, per_input

    qs = sorted(questions if questions is not None else qa_questions(), key=lambda q: q.id)
    group = per_input(length)
    picked = _rng("qa", seed, length).sample(qs, min(len(qs), n * group))
    joined = build_inputs(picked, count, length, seed, group=group, multikey=False)[:n]
    by_id = {q.id: q for q in qs}
    head = f"{QA_INSTRUCTION}\n\nThe following are given documents.\n\n"
    out = []
    for j in joined:
        text = head + j.text
        asks = []
        for a in j.asks:
            refs = tuple(r for r in a.refs if r)
            asks.append(Ask(a.id, f"{QA_INSTRUCTION}\n\nQuestion: {a.question}", refs, "part",
                            GENERATE["qa"] + ANSWER_ROOM, tuple(text.find(r) for r in refs),
                            tuple(by_id[a.id].candidates), a.heldout))
        out.append(Sample("qa", j.index, length, text, count(text), tuple(asks)))
    return out

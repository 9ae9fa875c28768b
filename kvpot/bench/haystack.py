"""A harder haystack for `kvpot bench niah`: varied prose filler, needles phrased several ways, and
RULER's multi-key variant (several facts of the same kind, the question names one).

The filler is the prose of Python's own standard-library docstrings, so it ships with every Python
and needs no download. Unlike the passkey task's one repeated sentence, it is text a model cannot
predict, so the needle does not stand out as the only surprising line and an evicted token is
not recovered from the repetition around it. Docstrings differ between Python versions, so a
haystack is reproducible for one seed on one Python, not across versions.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
import warnings
from dataclasses import dataclass
from functools import lru_cache

# standard-library modules whose docstrings give the filler (pure-Python ones, importable anywhere)
_MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "codecs", "collections", "configparser", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "doctest", "email.message", "enum",
    "filecmp", "fnmatch", "fractions", "functools", "gettext", "glob", "heapq", "http.client", "inspect",
    "ipaddress", "json", "locale", "logging", "mailbox", "numbers", "optparse", "pathlib", "pickle", "pprint",
    "queue", "random", "sched", "selectors", "shlex", "shutil", "statistics", "string", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "tokenize", "typing", "unittest", "urllib.parse",
    "uuid", "wave", "weakref", "zipfile",
)

# a paragraph is kept when it reads as prose: long enough, mostly letters, no code or tables
_MIN_CHARS = 80
_CODEISH = re.compile(r">>>|\.\.\. |::|==|->|\{|\}|\[|\]|^\s*[-=*]{3,}|\w\(.*\)\s*$|`", re.MULTILINE)

PLACES = ("salt warehouse", "north gate", "river lock", "bell tower", "grain silo", "signal station",
          "copper mine", "east harbor", "old library", "weather mast", "glass workshop", "stone bridge")

# the same fact in several wordings: a retriever that keys on one phrasing does not get them all
NEEDLE_TEMPLATES = (
    "The access code for the {place} is {key}.",
    "To open the {place}, enter the access code {key}.",
    "Remember that the {place} opens with access code {key}.",
    "{key} is the access code of the {place}.",
    "Whoever needs the {place} should know its access code: {key}.",
)


def question(place: str) -> str:
    return f"What is the access code for the {place}?"


def answer_prefix(place: str) -> str:
    """Plain completion prompt after the document: the question, then the start of the answer."""
    return f"\n\nQuestion: {question(place)}\nAnswer: The access code for the {place} is"


def _paragraphs(doc: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", doc):
        text = " ".join(para.split())
        if len(text) < _MIN_CHARS or _CODEISH.search(para):
            continue
        letters = sum(c.isalpha() or c.isspace() for c in text)
        if letters / len(text) < 0.85 or not text[0].isupper() or text[-1] not in ".!?":
            continue
        out.append(text)
    return out


@lru_cache(maxsize=1)
def prose_paragraphs() -> tuple[str, ...]:
    """Every distinct prose paragraph of the docstrings, in a fixed order (modules, then names)."""
    seen: set[str] = set()
    out: list[str] = []
    for name in _MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # a trimmed Python may lack one; the rest is plenty
            continue
        objs: list = [mod]
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == name:
                objs.append(obj)
                if inspect.isclass(obj):  # and its methods, which hold most of the prose
                    objs += [m for _, m in sorted(vars(obj).items()) if inspect.isfunction(m)]
        for obj in objs:
            with warnings.catch_warnings():  # typing's deprecated aliases warn when their docs are read
                warnings.simplefilter("ignore", DeprecationWarning)
                doc = inspect.getdoc(obj) or ""
            for p in _paragraphs(doc):
                if p not in seen:
                    seen.add(p)
                    out.append(p)
    return tuple(out)


def filler_stream(seed: int):
    """Prose paragraphs in a seeded order, reshuffled each time the supply runs out."""
    paras = list(prose_paragraphs())
    rng = random.Random(f"filler-{seed}")
    while True:
        rng.shuffle(paras)
        yield from paras


@dataclass(frozen=True)
class Needle:
    place: str
    key: str
    text: str
    depth: float           # where it sits, as a share of the filler


@dataclass(frozen=True)
class ProseHaystack:
    text: str              # the document
    place: str             # the place the question asks about
    key: str               # its code
    depth: float
    needles: tuple[Needle, ...]  # the asked needle first, then the distractors (multi-key)

    @property
    def question(self) -> str:
        return question(self.place)

    @property
    def answer_prefix(self) -> str:
        return answer_prefix(self.place)


def draw_needles(seed: int, depth: float, n_keys: int) -> tuple[Needle, ...]:
    """The asked needle at `depth`, and n_keys - 1 distractors: other places, other keys, other
    wordings, at depths spread over the document (away from the asked one)."""
    if not 1 <= n_keys <= len(PLACES):
        raise ValueError(f"n_keys must be within 1..{len(PLACES)}")
    rng = random.Random(f"needles-{seed}")
    places = rng.sample(PLACES, n_keys)
    keys: list[str] = []
    while len(keys) < n_keys:
        k = str(rng.randint(10000, 99999))
        # distinct, and not sharing a 3-digit prefix: a near miss must not read as the right key
        if all(k != o and k[:3] != o[:3] for o in keys):
            keys.append(k)
    templates = rng.sample(NEEDLE_TEMPLATES, min(n_keys, len(NEEDLE_TEMPLATES)))
    templates += [rng.choice(NEEDLE_TEMPLATES) for _ in range(n_keys - len(templates))]
    depths = [depth]
    for i in range(1, n_keys):
        # evenly spaced slots, jittered, then kept at least 0.05 away from the asked needle
        d = (i - 0.5 + rng.uniform(-0.3, 0.3)) / (n_keys - 1) if n_keys > 1 else 0.5
        if abs(d - depth) < 0.05:
            d = d + 0.1 if d + 0.1 <= 1.0 else d - 0.1
        depths.append(min(1.0, max(0.0, d)))
    return tuple(Needle(p, k, t.format(place=p, key=k), d)
                 for p, k, t, d in zip(places, keys, templates, depths))


def make_prose_haystack(count_tokens, n_tokens: int, depth: float, seed: int, n_keys: int = 1) -> ProseHaystack:
    """About n_tokens of prose filler (counted with `count_tokens(text) -> int`) with the needles
    placed between paragraphs at their depths. The asked needle is needles[0]."""
    needles = draw_needles(seed, depth, n_keys)
    paras: list[str] = []
    size = sum(count_tokens(n.text + "\n\n") for n in needles)
    stream = filler_stream(seed)
    while size < n_tokens:
        p = next(stream)
        paras.append(p)
        size += count_tokens(p + "\n\n")
    if len(paras) > 1:
        paras.pop()  # the last one crossed the length: stay at or under it
    # insert from the deepest slot so the shallower slots' indices stay valid
    for slot, n in sorted(((round(n.depth * len(paras)), n) for n in needles), key=lambda s: s[0], reverse=True):
        paras.insert(slot, n.text)
    return ProseHaystack(text="\n\n".join(paras) + "\n", place=needles[0].place, key=needles[0].key, depth=depth,
                         needles=needles)

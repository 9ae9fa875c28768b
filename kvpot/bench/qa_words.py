"""The words a question shares with the passage that answers it, which decide its kind in the question set
(kvpot/bench/qa_set.json): "lexical" when it shares a content word with the passage beyond its subject's
name (a keyword ranking such as BM25 can find the passage from the question), "paraphrase" when it shares
none (only a reader of the meaning can).

A content word is a run of letters or digits that is not a function word; words compare by a crude stem
(case folded, a plural or verb ending dropped: "closes" and "closed" are one word), so an inflection does
not make a paraphrase. The subject's name is the source's own name, taken from its path: the package of
/usr/share/doc/PKG/..., the licence of common-licenses/NAME, a man page's command, a module's dotted path."""

from __future__ import annotations

import re

from kvpot.bench.qa_sources import STDLIB

_WORD = re.compile(r"[A-Za-z]+|\d+")

# function words, question words and the like: they carry no content a ranking could match on
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing down during each either else even ever every few for from
further had has have having he her here hers him his how i if in into is it its itself just may me might
more most much must my no nor not now of off on once one only or other our out over own per same shall she
should so some such than that the their them then there these they this those through to too under until up
upon us very via was we were what when where whether which while who whom whose why will with within would
yet you your give given gives say says said tell told name named called text file document according
""".split())

_ENDINGS = ("ing", "ed", "es", "s")


def stem(word: str) -> str:
    """Case folded, one plural or verb ending dropped where a stem of three letters or more stays."""
    w = word.lower()
    for end in _ENDINGS:
        if w.endswith(end) and len(w) - len(end) >= 3 and not w.endswith("ss"):
            return w[: -len(end)]
    return w


def content_words(text: str) -> set[str]:
    """The text's content words, stemmed."""
    return {stem(w) for w in _WORD.findall(text) if w.lower() not in STOPWORDS}


def subject_words(source: str) -> set[str]:
    """The words of the source's own name (see the module's docstring)."""
    path = source.replace(STDLIB, "")
    parts = [p for p in path.split("/") if p]
    if path.startswith("/usr/share/doc/") and len(parts) > 3:
        name = parts[3]
    elif "/man/" in path:
        name = parts[-1].split(".")[0]
    elif path.startswith("/usr/share/common-licenses/"):
        name = parts[-1]
    else:  # a module of the standard library: its dotted path
        name = " ".join(p.removesuffix(".py") for p in parts if p != "__init__.py")
    return {stem(w) for w in _WORD.findall(name)}


def shared_words(question: str, passages: list[str] | tuple[str, ...], source: str) -> set[str]:
    """Content words the question shares with its passages, beyond the subject's name."""
    held = set().union(*(content_words(p) for p in passages)) if passages else set()
    return (content_words(question) & held) - subject_words(source)


def lexical_or_paraphrase(question: str, passages: list[str] | tuple[str, ...], source: str) -> str:
    return "lexical" if shared_words(question, passages, source) else "paraphrase"

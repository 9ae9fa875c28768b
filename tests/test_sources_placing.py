"""Where `--sources` and the focused read say a passage is: inside the input that holds it (a passage across two
files of a folder is credited to each file for its own lines), and numbered the same way by both (the focused
read names the passages the pot's answer drew on as `--sources` names that answer's)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.ingest import collect_sources
from kvpot.ingest.sources import header
from kvpot.locator.sources import top_passages

runner = CliRunner()


def _read(folder, model_path):
    """A session that read `folder` with full attention (its real token map and marks)."""
    from kvpot.models.resolve import resolve_model
    from kvpot.session.session import Session
    from kvpot.session.settings import resolve_settings

    facts, _ = resolve_model(str(model_path))
    settings = resolve_settings(None, {}, {"policy": "full", "budget": 4096, "threads": 2,
                                           "prompt": "completion", "max_tokens": 4})
    s = Session(facts, "smollm2", settings, resettable=False)
    s.read(collect_sources([str(folder)]))
    return s


def test_a_passage_across_two_files_is_credited_to_each_file_for_its_own_lines(tmp_path, smollm2_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    a_text = "".join(f"alpha line {i} of the first file\n" for i in range(1, 41))
    b_text = "".join(f"bravo line {i} of the second file\n" for i in range(1, 41))
    (folder / "a.txt").write_text(a_text)
    (folder / "b.txt").write_text(b_text)
    with _read(folder, smollm2_path) as s:
        smap = s.source_map
        joined = "".join(collect_sources([str(folder)]).pieces())
        a_name, b_name = (m.source for m in (smap.marks[0], smap.marks[-1]))
        # the joined text as the reader joins it: each file's own characters, computed from the files
        a0 = joined.index(a_text)
        b0 = joined.index(b_text, a0 + len(a_text))
        assert joined[a0 + len(a_text):b0] == header(b_name)
        files = {a_name: (a0, a0 + len(a_text), a_text), b_name: (b0, b0 + len(b_text), b_text)}
        # attention on the last ~10 tokens of a.txt, b.txt's heading and the first ~10 of b.txt: one run of
        # tokens that crosses the boundary, heavier than anything else
        cross = [p for p in range(smap.pos[0], smap.end_pos)
                 if a0 + len(a_text) - 40 <= smap.offset(p) < b0 + 40]
        mass = {p: 1.0 for p in cross} | {p: 0.001 for p in range(smap.pos[0], smap.end_pos) if p not in cross}
        session = SimpleNamespace(source_map=smap, source_set=s.source_set, sources=s.sources,
                                  engine=SimpleNamespace(answer_mass=mass, policy=s.engine.policy))
        found = top_passages(session, top=2)
    assert {p.source for p in found} == {a_name, b_name}, found
    for p in found:
        lo, hi, text = files[p.source]
        assert lo <= p.start < p.end <= hi, (p, lo, hi)  # every character credited lies in the file named
        assert p.quote and p.quote.split()[0] in text
        # its line, counted in its own file
        assert p.where == f"line {text.count(chr(10), 0, p.start - lo) + 1}", p
    assert not any("=====" in p.quote for p in found)  # the heading between them is no file's text


def _ask(*args: str) -> tuple[dict, str]:
    res = runner.invoke(app, ["ask", *args, "--json", "--sources"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def test_the_focused_read_names_the_passages_as_sources_names_them(tmp_path, smollm2_cut_path):
    """The focus line on stderr names the passages the pot's answer drew on by the line each starts in, and
    `--sources` of that same answer (`--no-focus`, the locating answer's length) lists the same passages, at the
    same lines; every line is the one the input's own text puts the passage's first character in."""
    text, question, _ = logbook(n_entries=40)
    path = tmp_path / "logbook.txt"
    path.write_text(text)
    fast = ["--model", str(smollm2_cut_path), "--chunk", "128", "--prompt-format", "completion", "--threads", "2",
            "-P", "infinipot", "--budget", "512"]
    out, err = _ask(str(path), question, "-n", "12", *fast)
    located = out["focus"]["located"]
    assert located, out["focus"]
    for p in located:
        assert p["where"] == f"line {text.count(chr(10), 0, p['start']) + 1:,}", p
    line = next(x for x in err.splitlines() if "read again with full attention" in x)
    # "… read again with full attention (overlapping ones joined: N stretches of text): PLACES" where joined
    named = re.split(r"read again with full attention(?: \(overlapping ones joined: [^)]*\))?: ", line, maxsplit=1)[1].strip()
    assert named == f"{path} " + ", ".join(p["where"] for p in located), (named, located)
    for p in out["sources"]:  # the focused answer's own sources, numbered the same way
        assert p["where"] == f"line {text.count(chr(10), 0, p['start']) + 1:,}", p
    plain, _ = _ask(str(path), question, "-n", "48", "--no-focus", *fast)
    assert plain["answer"] == out["focus"]["pot_answer"]
    keys = ("source", "where", "start", "end")
    assert [{k: p[k] for k in keys} for p in plain["sources"]] == [{k: p[k] for k in keys}
                                                                    for p in located[:len(plain["sources"])]]

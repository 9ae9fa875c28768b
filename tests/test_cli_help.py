"""--help as a user reads it: a default for every option, readable type labels, ask's usage line, help that
fits an 80-column terminal (two lines an option, nothing cut, ask and chat on one screen), the policy table
taken from the registry, and messages with true numbers."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from conftest import assert_one_line_error, run_cli
from typer.core import TyperArgument, TyperOption
from typer.testing import CliRunner

from kvpot.cli.main import app
from kvpot.policies import POLICIES
from kvpot.session.auto_budget import DevicePlan, choose_reading
from kvpot.wording import plural

ROOT = typer.main.get_command(app)
METHODS = Path(__file__).resolve().parent.parent / "docs" / "methods.md"


def commands(cmd=ROOT, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from commands(sub, (*path, name))


ALL = list(commands())
IDS = [" ".join(p) or "kvpot" for p, _ in ALL]


def help_text(path, columns: int = 400) -> str:
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    return res.output


def plain_flag(p) -> bool:
    """A flag without a --no- form that is off unless given: its help says nothing of a default."""
    return isinstance(p, TyperOption) and p.is_flag and not p.secondary_opts and not p.default


@pytest.mark.parametrize("path,cmd", ALL, ids=IDS)
def test_every_option_shows_a_default_or_is_required(path, cmd):
    rows = {name: text for name, _, _, text in option_rows(help_text(path))}
    for p in cmd.params:
        if not isinstance(p, TyperOption) or p.hidden or p.is_flag and p.is_eager:  # --help, --version
            continue
        row = next(rows[o] for o in p.opts if o in rows)
        if plain_flag(p):
            assert "[default:" not in row, (path, p.opts[0], row)
            continue
        says = isinstance(p.show_default, str) or (p.default is not None and p.show_default is not False)
        assert says or p.required, f"{' '.join(path)} {p.opts[0]} shows no default"
        assert "[default:" in row or "[required]" in row, row


@pytest.mark.parametrize("path,cmd", ALL, ids=IDS)
def test_type_labels_are_readable(path, cmd):
    shown = help_text(path)
    assert not re.search(r"<(bool|int|str|float|path|list)", shown), shown
    assert "list[" not in shown


@pytest.mark.parametrize("path,cmd", ALL, ids=IDS)
def test_arguments_carry_no_type_label_for_any_typer(path, cmd):
    """typer 0.26-0.28 print an argument's `<type name>` beside its metavar wherever the type's
    get_metavar gives None (typer.rich_utils._print_options_panel); 0.29 asks display_type_rich."""
    for p in cmd.params:
        if isinstance(p, TyperArgument) and hasattr(typer.core.TyperArgument, "display_type_rich"):
            assert p.display_type_rich(None) is None, (path, p.name)  # 0.29 on: its only source
        elif isinstance(p, TyperArgument):
            assert p.type.get_metavar(param=p, ctx=None) == "", (path, p.name)
            # the click type instances typer shares between parameters stay as they were
            shared = getattr(sys.modules[type(p.type).__module__], "STRING", None)
            assert shared is None or shared.get_metavar(param=p, ctx=None) is None


@pytest.mark.parametrize("path,cmd", ALL, ids=IDS)
def test_usage_names_arguments_as_the_user_types_them(path, cmd):
    # an argument without a metavar reads "{model}" in typer's usage line
    usage = next(line for line in help_text(path).splitlines() if "Usage:" in line)
    assert "{" not in usage, usage
    for p in cmd.params:
        if isinstance(p, TyperArgument):
            assert p.metavar and p.metavar.upper() == p.metavar, (path, p.name, p.metavar)


@pytest.mark.parametrize("path,cmd", ALL, ids=IDS)
def test_summary_wraps_as_one_paragraph(path, cmd):
    """rich keeps a docstring's line breaks: a summary broken over two source lines shows in the command
    list as a line cut mid-sentence ("what to expect of it, and" / "whether it is downloaded")."""
    summary = (cmd.help or "").strip().split("\n\n")[0]
    assert "\n" not in summary, f"{' '.join(path) or 'kvpot'}: {summary!r}"
    for p in cmd.params:
        assert "\n" not in (getattr(p, "help", None) or ""), (path, p.name)


def test_type_labels_without_typer_type_descriptors():
    """Typers before 0.29 (pyproject allows 0.16 on) have no type descriptor on an option: the label comes
    from the click parameter type they parse with, the same label for the same kind of value."""
    import click

    from kvpot.cli._options import _type_label

    def label(kind):
        return _type_label(SimpleNamespace(type=kind))

    assert label(click.INT) == label(click.IntRange(min=1)) == "N"
    assert label(click.FLOAT) == label(click.FloatRange(min=0.0)) == "X"
    assert label(click.STRING) == "TEXT"
    assert label(click.Path()) == label(click.File()) == "PATH"
    assert label(click.Choice(["on", "off"])) == label(click.BOOL) == "VALUE"


def test_ask_usage_line():
    assert "Usage: kvpot ask [OPTIONS] [FILE]... QUESTION" in help_text(("ask",))
    assert "Usage: kvpot chat [OPTIONS] [FILE]..." in help_text(("chat",))


@pytest.mark.parametrize("path", ["ask", "chat", "run", "serve"])
def test_policy_help_points_to_the_table(path):
    policy = next(p for p in ROOT.commands[path].params if p.name == "policy")
    assert "docs/methods.md" in policy.help


def test_methods_policy_table_is_the_registry():
    rows = re.findall(r"^\| `([a-z0-9]+)[:`]", METHODS.read_text(), flags=re.M)
    assert sorted(rows) == sorted(POLICIES)


def test_ask_help_says_the_real_default():
    shown = help_text(("ask",))
    assert "infinipot (default)" not in shown and "Memory stays at --budget cells" not in shown
    assert "full attention" in shown and "auto" in shown


def test_plural():
    assert plural(1, "compaction") == "1 compaction"
    assert plural(0, "compaction") == "0 compactions"
    assert plural(41485, "token") == "41,485 tokens"


def test_reading_summary_agrees_and_shows_no_none(capsys):
    from kvpot.cli import reading

    stats = {"document tokens": 1, "tokens in pot": 1, "compactions": 1}  # no read tok/s: a reopened context's
    pot = SimpleNamespace(policy="infinipot")
    session = SimpleNamespace(stats=lambda: stats, read_seconds=0.0, read_here=1, settings=pot)
    reading._summary(session, SimpleNamespace(replaced=1))
    said = capsys.readouterr().err
    assert "1 compaction" in said and "1 compactions" not in said
    assert "None" not in said and "1 token " in said and "1 invalid UTF-8 sequence replaced" in said
    # a continued read (--continue) says what it read and what the pot holds in all
    stats.update({"document tokens": 5277, "read tok/s": 200.0})
    reading._summary(SimpleNamespace(stats=lambda: stats, read_seconds=20.0, read_here=4085, settings=pot),
                     SimpleNamespace(replaced=0))
    said = capsys.readouterr().err
    assert "read 4,085 more tokens (5,277 in all) in 20.0s (200.0 tok/s)" in said, said


def test_full_attention_says_no_pot(capsys):
    """Full attention bounds nothing: the summary says what was read and how fast, no pot, no compactions."""
    from kvpot.cli import reading

    stats = {"document tokens": 900, "tokens in pot": 900, "compactions": 0, "read tok/s": 150.0}
    full = SimpleNamespace(stats=lambda: stats, read_seconds=6.0, read_here=900, settings=SimpleNamespace(policy="full"))
    reading._summary(full, SimpleNamespace(replaced=0))
    said = capsys.readouterr().err
    assert said.startswith("read 900 tokens in 6.0s (150.0 tok/s)") and "pot" not in said and "compaction" not in said


def _plan_session(policy: str, budget: int, counted, window: int = 32768, n_ctx: int = 32768):
    from kvpot.session.reading_plan import TokenCount

    return SimpleNamespace(model_name="qwen2.5-coder-1.5b", counted=None if counted is None else TokenCount(*counted),
                           facts=SimpleNamespace(n_ctx_train=window), engine=SimpleNamespace(ctx=SimpleNamespace(n_ctx=n_ctx)),
                           settings=SimpleNamespace(policy=policy, budget=budget), policy_spec=policy)


def _one_file(name: str, size: int):
    return SimpleNamespace(sources=[SimpleNamespace(name=name, path=name, size=size)], text_bytes=size)


def test_the_line_before_reading_is_in_a_users_words():
    from kvpot.cli.reading import plan_line

    fits = plan_line(_plan_session("full", 8000, (7906, True)), _one_file("bash.txt", 30000))
    assert fits == "qwen2.5-coder-1.5b · bash.txt · 7,906 tokens · fits the 32K window: reading it whole"
    past = plan_line(_plan_session("infinipot:pot=2048,keep=1024", 2048, (40000, False)), _one_file("big.txt", 900000))
    assert past == ("qwen2.5-coder-1.5b · big.txt · more than 40,000 tokens · past the 32K window: "
                    "a 2,048-cell memory (infinipot)")
    # not counted (a model that names no trained window): the length guessed from the size, and a window not of
    # whole K said as a count
    guessed = plan_line(_plan_session("snapkv", 512, None, window=5000), _one_file("notes.txt", 4000))
    assert guessed == "qwen2.5-coder-1.5b · notes.txt · about 1,000 tokens · through a 512-cell memory (snapkv)"
    within = plan_line(_plan_session("snapkv", 512, (900, True), window=5000), _one_file("notes.txt", 4000))
    assert within.endswith("900 tokens · within the 5,000-token window, through a 512-cell memory (snapkv)")
    stream = SimpleNamespace(sources=[SimpleNamespace(name="-", path=None, size=None)], text_bytes=None)
    assert plan_line(_plan_session("full", 8000, None), stream).endswith(" · stdin · length unknown (a stream) · "
                                                                            "reading it whole")


def test_a_partial_count_is_said_as_more_than():
    plan = DevicePlan(cells=32768, reason="test")
    said = choose_reading(plan, 32768, 41485, 512, 512, complete=False).reason
    assert "more than 32,768 tokens" in said and "41,485" not in said
    assert "41,485 tokens do not fit" in choose_reading(plan, 32768, 41485, 512, 512).reason


# -- help at 80 columns ------------------------------------------------------------------------------------------

TAG = re.compile(r"\[(default|required)[:\]]")


def option_rows(shown: str) -> list[tuple[str, int, int, str]]:
    """(name, help lines, default lines, text) of every option and argument row in a help's panels: a row starts
    where its name column is filled, and its default ("[default: ...]", "[required]") begins a line of its own
    or follows the help on its last line."""
    rows: list[list] = []
    panel = None
    for line in shown.splitlines():
        title = re.match(r"╭─ (.*?) ─", line)
        if title:
            panel, row = title.group(1), None
            continue
        if not line.startswith("│ ") or panel == "Commands":  # the subcommand list is not an option
            row = None
            continue
        body = line[2:].rstrip(" │")
        if body[:6].strip():  # the name column
            row = [body.split()[1] if body.startswith("*") else body.split()[0], 0, 0, ""]
            rows.append(row)
        if row is None:
            continue
        row[3] += body + "\n"
        help_part = re.split(r"\s{2,}", body.strip())[-1]
        if row[2] or TAG.match(help_part) and (body.startswith(" ") or help_part != body.strip()):
            row[2] += 1  # the default, or its wrapped rest
        else:
            row[1] += 1
    return [tuple(r) for r in rows]


def test_option_rows_are_read_as_a_user_reads_them():
    """The row reader on a help with one option of each kind: wrapped help, a default on its own line, a
    default beside a short help, a plain flag."""
    shown = ("╭─ Options ─────────────────╮\n"
             "│ --model  -m  MODEL  a name or a path,     │\n"
             "│                     else $KVPOT_MODEL     │\n"
             "│                     [default: the best]   │\n"
             "│ --chunk      N      tokens [default: 512] │\n"
             "│ --quiet  -q         nothing but errors    │\n"
             "╰───────────────────────────╯\n")
    assert [r[:3] for r in option_rows(shown)] == [("--model", 2, 1), ("--chunk", 1, 0), ("--quiet", 1, 0)]


@pytest.mark.parametrize("path,cmd", ALL, ids=IDS)
def test_every_option_help_fits_two_lines_at_80_columns(path, cmd):
    shown = help_text(path, columns=80)
    rows = option_rows(shown)
    assert rows or not [p for p in cmd.params if not getattr(p, "hidden", False)], shown
    too_long = [(name, lines, tag) for name, lines, tag, _ in rows if lines > 2 or tag > 1]
    assert not too_long, shown


@pytest.mark.parametrize("path,cmd", ALL, ids=IDS)
def test_nothing_is_cut_at_80_columns(path, cmd):
    """rich ends a word too long for its column with "…": a metavar or a help word lost mid-word."""
    assert "…" not in help_text(path, columns=80)


@pytest.mark.parametrize("command", ["ask", "chat"])
def test_ask_and_chat_help_fit_one_screen(command):
    res = run_cli(command, "-h", env={"COLUMNS": "80", "LINES": "24"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.rstrip("\n").splitlines()
    assert len(lines) <= 80, res.stdout
    assert max(len(line) for line in lines) <= 80, res.stdout  # drawn for the width asked
    # everyday options first: the Advanced panel follows the one that holds --model
    assert res.stdout.index("--model") < res.stdout.index("Advanced") < res.stdout.index("--chunk")


# -- kvpot models ------------------------------------------------------------------------------------------------

def test_models_lists_one_line_per_model(tmp_path):
    """`kvpot models` at 80 columns: a header, then one line per registry model, most capable first, each
    within the width; nothing downloaded in a fresh home, so each says no."""
    from kvpot.session.default_model import by_capability

    res = run_cli("models", env={"COLUMNS": "80", "KVPOT_HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    header, *lines = res.stdout.rstrip("\n").splitlines()
    assert header.split() == ["name", "size", "cached", "what", "to", "expect"]
    ranked = by_capability()
    assert [line.split()[0] for line in lines] == [m.name for m in ranked], res.stdout
    assert all(len(line) <= 80 and line.split()[3] == "no" for line in lines), res.stdout
    assert "kvpot models NAME" in res.stderr


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "smollm2-135m"])
def test_models_name_says_it_in_full(name, tmp_path):
    from kvpot.models.registry import KNOWN

    res = run_cli("models", name, env={"COLUMNS": "80", "KVPOT_HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    said = " ".join(res.stdout.split())
    m = KNOWN[name]
    for text in (m.description, m.expect, f"kvpot pull {name}"):
        assert " ".join(text.split()) in said, (text, said)


def test_models_unknown_name_is_one_line(tmp_path):
    res = run_cli("models", "no-such-model", env={"KVPOT_HOME": str(tmp_path)})
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "unknown model 'no-such-model'")

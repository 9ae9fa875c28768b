"""A hostile or mistaken config.toml: the whole file is checked (its tables, the model names, every
value's type and range) and anything wrong is one line naming the file, the key and what is allowed."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error, run_cli

from kvpot.errors import KvpotError
from kvpot.models.registry import KNOWN
from kvpot.session.checks import MAX_CELLS
from kvpot.session.settings import KEYS, MAX_THREADS, resolve_settings

SMOL = "smollm2-135m"
assert SMOL in KNOWN

CASES = [
    # (config text, words the one line holds)
    ("defaults = 3\n", "[defaults] must be a table of settings, got 3"),
    ("models = 3\n", "models must hold [models.\"NAME\"] tables, got 3"),
    ('[models]\n"x" = 5\n', "[models.'x'] is not a known model"),
    (f'[models]\n"{SMOL}" = 5\n', f'[models."{SMOL}"] must be a table of settings, got 5'),
    ('[models."smollm2-135M"]\nbudget = 100\n', f"did you mean '{SMOL}'?"),
    ('[models."gemma-270m"]\nchunk = 64\n', "did you mean 'gemma3-270m'?"),
    ("[default]\nchunk = 64\n", "unknown table or key 'default' (did you mean 'defaults'?"),
    ("threads = 2\n", "unknown table or key 'threads'"),
    ("[defaults]\nbudjet = 5\n", "unknown setting 'budjet' (did you mean 'budget'?"),
    ("[defaults]\nbudget = 1e9\n", "budget must be a number of cells or 'auto', got 1000000000.0"),
    ("[defaults]\nbudget = true\n", "budget must be a number of cells or 'auto', got the boolean true"),
    ("[defaults]\nbudget = 'big'\n", "budget must be a number of cells or 'auto', got 'big'"),
    ("[defaults]\nbudget = 8\n", "budget 8 is too small"),
    (f"[defaults]\nbudget = {MAX_CELLS + 1}\n", "larger than llama.cpp can address"),
    (f"[defaults]\nchunk = {2**62}\n", "larger than llama.cpp can address"),
    ("[defaults]\nchunk = [512]\n", "chunk must be an integer, got an array"),
    ("[defaults]\nthreads = -1\n", f"threads must be 1 to {MAX_THREADS} (0: every core), got -1"),
    (f"[defaults]\nthreads = {10**12}\n", f"threads must be 1 to {MAX_THREADS}"),
    ("[defaults]\nmax_tokens = 0\n", "max_tokens must be at least 1, got 0"),
    ("[defaults]\nprompt = 'jinja'\n", "prompt must be one of auto, chat, completion, got 'jinja'"),
    ("[defaults]\nprompt = 3\n", "prompt must be a string, got 3"),
    ("[defaults]\npolicy = 'nosuch'\n", "policy 'nosuch' is not a policy spec kvpot can run: unknown policy"),
    ("[defaults]\npolicy = 'streaming:n_sink=x'\n", "policy 'streaming:n_sink=x' is not a policy spec"),
    ("[defaults]\n[defaults.sub]\nchunk = 64\n", "unknown setting 'sub'"),
    # a table for a model the command does not use is checked all the same
    ("[models.\"gemma3-270m\"]\nprompt = 'jinja'\n", "[models.\"gemma3-270m\"]: prompt must be one of"),
    ("[defaults\n", "is not valid TOML: "),
    ("a = = 1\n", "is not valid TOML: "),
]


@pytest.mark.parametrize("text, needle", CASES)
def test_config_is_refused_with_one_line(tmp_path, text, needle):
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    with pytest.raises(KvpotError) as e:
        resolve_settings(SMOL, {}, {}, cfg)
    msg = str(e.value)
    assert "\n" not in msg and str(cfg) in msg, msg
    assert needle in msg, msg


def test_raw_bytes_and_folders_are_one_line(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_bytes(b"[defaults]\nchunk = 64 # \xff\xfe\n")
    with pytest.raises(KvpotError, match="is not valid TOML: it is not UTF-8 text"):
        resolve_settings(None, {}, {}, cfg)
    cfg.unlink()
    cfg.mkdir()
    with pytest.raises(KvpotError, match="is a directory"):
        resolve_settings(None, {}, {}, cfg)


def test_every_setting_and_known_model_is_accepted(tmp_path):
    """The checks refuse only what is wrong: a file naming every key, every known model, takes effect."""
    cfg = tmp_path / "config.toml"
    models = "".join(f'[models."{name}"]\nchunk = {64 + i}\n' for i, name in enumerate(KNOWN))
    cfg.write_text("[defaults]\npolicy = 'streaming'\nbudget = 'auto'\nchunk = 32\nthreads = 1\n"
                   f"prompt = 'completion'\nmax_tokens = 9\nflash_attn = 'off'\nquestion_before = 'on'\nlocator = 'bm25'\n{models}")
    assert set(KEYS) == {"policy", "budget", "chunk", "threads", "prompt", "max_tokens", "flash_attn", "question_before",
                         "locator"}
    for i, name in enumerate(KNOWN):
        s = resolve_settings(name, {}, {}, cfg)
        assert (s.policy, s.budget, s.chunk, s.threads, s.prompt, s.max_tokens, s.flash_attn, s.question_before,
                s.locator) == ("streaming", "auto", 64 + i, 1, "completion", 9, "off", "on", "bm25")


@pytest.mark.parametrize("text, needle", [("defaults = 3\n", "[defaults] must be a table of settings, got 3"),
                                          ('[models."smollm2-135M"]\nchunk = 64\n', "did you mean 'smollm2-135m'?"),
                                          ('[defaults]\nbudget = "[bold]x[/bold]"\n', "got '[bold]x[/bold]'")])
def test_cli_says_one_line(tmp_path, smollm2_path, text, needle):
    """Through the CLI: one `error:` line naming the file, exit status 1, no traceback; text in brackets
    (a TOML table's name, a value) is shown as it is, not read as terminal markup."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(text)
    doc = tmp_path / "doc.txt"
    doc.write_text("a short document\n")
    res = run_cli("ask", str(doc), "what?", "-m", str(smollm2_path), env={"KVPOT_HOME": str(home)})
    assert res.returncode == 1
    assert_one_line_error(res.stderr, needle)
    assert str(home / "config.toml") in res.stderr

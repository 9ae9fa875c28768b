"""Settings layers: built-in < registry < config [defaults] < config [models.NAME] < command line."""

from __future__ import annotations

import pytest

from kvpot.errors import KvpotError
from kvpot.session.settings import RunSettings, resolve_settings


def test_layers_override_in_order(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[defaults]\nchunk = 256\nbudget = 3000\n\n[models."gemma3-270m"]\nbudget = 1500\n')
    reg = {"policy": "snapkv", "budget": 2048, "n_ctx": 8192}
    s = resolve_settings("gemma3-270m", reg, {"threads": 3, "chunk": None}, cfg)
    assert (s.policy, s.budget, s.chunk, s.threads) == ("snapkv", 1500, 256, 3)
    s = resolve_settings("other", reg, {"budget": 999}, cfg)
    assert (s.budget, s.chunk) == (999, 256)
    assert resolve_settings(None, {}, {}, tmp_path / "none.toml").policy == RunSettings().policy


@pytest.mark.parametrize("text, needle", [
    ("[defaults]\nbudjet = 5\n", "unknown setting 'budjet'"),
    ("[defaults]\nbudget = 'big'\n", "budget must be a number of cells or 'auto'"),
    ("[defaults\n", "not valid TOML"),
])
def test_bad_config_is_one_clear_error(tmp_path, text, needle):
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    with pytest.raises(KvpotError, match=needle):
        resolve_settings(None, {}, {}, cfg)


@pytest.mark.parametrize("cli, needle", [({"budget": 4}, "too small"), ({"chunk": 2}, "too small"),
                                         ({"prompt": "jinja"}, "--prompt-format must be one of")])
def test_impossible_settings_are_refused(tmp_path, cli, needle):
    with pytest.raises(KvpotError, match=needle):
        resolve_settings(None, {}, cli, tmp_path / "none.toml")

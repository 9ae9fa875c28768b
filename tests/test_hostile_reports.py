"""Options and settings that were taken silently, or blamed on another option: `run -c` too large names -c,
an empty --rpc is refused, and a config file's policy is the one that reads (not replaced by full attention
where the input fits). The sampling and --stop values are in test_cli_sampling; doctor's and models' reports
on stdout in test_cli."""

from __future__ import annotations

import json

from conftest import assert_one_line_error, run_cli
from typer.testing import CliRunner

from kvpot.cli.main import app
from kvpot.models.pull import cached_path
from kvpot.models.registry import SMOLLM2_135M

runner = CliRunner()
FAST = ["-m", "smollm2-135m", "-t", "1", "-n", "4", "--chunk", "128", "--prompt-format", "completion"]


def test_run_ctx_size_too_large_names_ctx_size(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.\n")
    res = runner.invoke(app, ["run", "-f", str(doc), "-p", "Q?", "-c", "99999999999"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "--ctx-size 99,999,999,999 is larger than llama.cpp can address")
    assert "--budget" not in res.stderr


def test_an_empty_rpc_is_refused(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.\n")
    for args in (["ask", str(doc), "Q?", *FAST, "--rpc", ""], ["run", "-f", str(doc), "-p", "Q?", "--rpc", " "]):
        res = runner.invoke(app, args)
        assert res.exit_code == 1, (args, res.output)
        assert_one_line_error(res.stderr, "--rpc wants HOST:PORT[,HOST:PORT...], got an empty value")


def test_a_config_file_policy_is_honoured_where_the_input_fits(tmp_path, smollm2_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(cached_path(SMOLLM2_135M).parent, target_is_directory=True)
    (home / "config.toml").write_text('[defaults]\npolicy = "streaming"\n')
    doc = tmp_path / "doc.txt"
    doc.write_text("The strongbox code is 4417.\n" * 8)
    res = run_cli("ask", str(doc), "What is the code?", *FAST, "--json", env={"KVPOT_HOME": str(home)})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["policy"].startswith("streaming"), res.stdout
    # the model's own table in the config file is the user's choice too
    (home / "config.toml").write_text('[models."smollm2-135m"]\npolicy = "snapkv"\n')
    res = run_cli("ask", str(doc), "What is the code?", *FAST, "--json", env={"KVPOT_HOME": str(home)})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["policy"].startswith("snapkv"), res.stdout

"""The walk of `--budget` from `kvpot ask` to the engine goes down: the CLI parses it into the API's plan
(kvpot.api.plan.plan_read), the plan checks and fits it, and the engine is built with it, with no call back
into the CLI on the way. The one kind of CLI function called from under the API is a callback the CLI
handed in (progress, notices, the streamed answer), never a function that settles a setting.

Checked by profiling a real `kvpot ask` in this process: every Python call is recorded with the stack of
kvpot modules above it, so a plan that asked the CLI for a setting (as the reading once did through
run_settings, checks and settings in cli/) shows up as a kvpot.cli call under kvpot.api.plan."""

from __future__ import annotations

import sys

from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.engine import Engine

BUDGET = 384  # an unusual count, so the engine's budget can only have come from --budget


def _walk(argv: list[str]) -> tuple[object, list[tuple[str, str, tuple[str, ...]]], dict]:
    """Run the CLI with argv under a profiler: (result, calls, engine_budgets). calls holds (callee module,
    callee function, the modules of the kvpot frames above it, outermost first) for every call whose callee is
    in kvpot.cli or whose stack holds kvpot.api; engine_budgets the config each Engine was built with."""
    calls: list[tuple[str, str, tuple[str, ...]]] = []
    built: dict = {}

    def profile(frame, event, arg):
        if event != "call":
            return
        if frame.f_code is Engine.__init__.__code__:
            built.setdefault("budgets", []).append(frame.f_locals["config"].budget)
        mod = frame.f_globals.get("__name__", "")
        up, stack = frame.f_back, []
        while up is not None:
            name = up.f_globals.get("__name__", "")
            if name.startswith("kvpot."):
                stack.append(f"{name}:{up.f_code.co_name}")
            up = up.f_back
        if mod.startswith("kvpot.cli") or any(s.startswith("kvpot.api") for s in stack):
            calls.append((mod, frame.f_code.co_name, tuple(reversed(stack))))

    sys.setprofile(profile)
    try:
        res = CliRunner().invoke(app, argv)
    finally:
        sys.setprofile(None)
    return res, calls, built


def test_budget_goes_down_from_kvpot_ask_to_the_engine(tmp_path, smollm2_cut_path):
    text, question, _ = logbook(n_entries=6, seed=3)
    path = tmp_path / "logbook.txt"
    path.write_text(text)
    res, calls, built = _walk(["ask", str(path), question, "-m", str(smollm2_cut_path), "--budget", str(BUDGET),
                               "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "2",
                               "--locator", "pot", "--no-focus"])
    assert res.exit_code == 0, res.output
    # the budget reached the engine, and only through the plan
    assert built.get("budgets") and set(built["budgets"]) == {BUDGET}, built
    under_plan = [c for c in calls if any(s.startswith("kvpot.api.plan:plan_read") for s in c[2])]
    assert under_plan, "kvpot ask did not plan through kvpot.api.plan.plan_read"
    back_in_cli = [f"{m}.{f} under {' > '.join(s[-3:])}" for m, f, s in under_plan if m.startswith("kvpot.cli")]
    assert not back_in_cli, "planning called back into the CLI:\n" + "\n".join(back_in_cli)
    # under any API frame, a CLI function is only ever a callback the CLI handed in (a closure or a
    # method of a display object), never a module-level function of cli/ that settles something
    handed = [(m, f, s) for m, f, s in calls
              if m.startswith("kvpot.cli") and any(x.startswith("kvpot.api") for x in s)]
    settling = [f"{m}.{f}" for m, f, _ in handed
                if f in {"run_settings", "new_session", "settings", "check_budget", "parse_budget", "reading_plan"}]
    assert not settling, settling


def test_the_walk_sees_a_call_back_into_the_cli(tmp_path, smollm2_cut_path, monkeypatch):
    """The check can fail: a plan that asks a cli/ function for its settings is caught (a function compiled
    as kvpot.cli._common's, put where the plan calls run_settings)."""
    import kvpot.api.plan as plan
    import kvpot.cli._common as common

    real = plan.run_settings
    code = compile("def settle(*a, **k):\n    return real(*a, **k)\n", common.__file__, "exec")
    ns = {"__name__": "kvpot.cli._common", "real": real}
    exec(code, ns)
    monkeypatch.setattr(plan, "run_settings", ns["settle"])
    text, question, _ = logbook(n_entries=2, seed=3)
    path = tmp_path / "logbook.txt"
    path.write_text(text)
    res, calls, _ = _walk(["ask", str(path), question, "-m", str(smollm2_cut_path), "--budget", str(BUDGET),
                           "--chunk", "128", "-n", "2", "--prompt-format", "completion", "--threads", "2"])
    assert res.exit_code == 0, res.output
    assert any(m == "kvpot.cli._common" and f == "settle" and any(s.startswith("kvpot.api.plan:plan_read") for s in st)
               for m, f, st in calls)

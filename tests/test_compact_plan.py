"""The compaction planner (ggml_ext/kvpot-compact-plan.cpp) without a model: where each kept cell
goes and which RoPE position it takes, with and without CR-RoPE, with and without a sliding window,
with per-layer padding. The planner is compiled on its own with the test driver and its plans are
checked against an independent reference written from docs/pot.md and against the rules CR-RoPE
must keep (the window arithmetic is where Gemma once lost late passkeys)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import REPO

PAD = -1


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    assert cxx, "a C++ compiler builds the runtime; none found"
    exe = tmp_path_factory.mktemp("plan") / "compact_plan_driver"
    subprocess.run([*shlex.split(cxx), "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{REPO / 'ggml_ext'}",
                    str(REPO / "tests/cpp/compact_plan_driver.cpp"), str(REPO / "ggml_ext/kvpot-compact-plan.cpp"),
                    "-o", str(exe)], check=True)
    return str(exe)


@dataclass
class Case:
    n_live: np.ndarray  # [n_layer]
    keep: np.ndarray  # [n_layer, n_head_kv, n_keep], PAD at row ends
    rope: np.ndarray  # [n_layer, n_head_kv, n_cells]
    p_next: int
    swa_pos_min: int  # -1: no window cells
    n_swa: int
    cr_rope: bool

    def encode(self) -> str:
        n_layer, n_head_kv, n_keep = self.keep.shape
        head = [n_layer, n_head_kv, n_keep, self.rope.shape[2], self.p_next, self.swa_pos_min, self.n_swa,
                int(self.cr_rope)]
        return " ".join(map(str, [*head, *self.n_live, *self.keep.ravel(), *self.rope.ravel()])) + "\n"


@dataclass
class Plan:
    win0: int
    next: int
    idx: np.ndarray
    new_rope: np.ndarray
    delta: np.ndarray


def run(driver: str, cases: list[Case]) -> list[Plan]:
    res = subprocess.run([driver], input="".join(c.encode() for c in cases), capture_output=True, text=True,
                         check=True)
    lines = res.stdout.splitlines()
    plans = []
    for i, c in enumerate(cases):
        win0, nxt = map(int, lines[4 * i].split())
        arrs = [np.array(lines[4 * i + k].split(), dtype=np.int64).reshape(c.keep.shape) for k in (1, 2, 3)]
        plans.append(Plan(win0, nxt, *arrs))
    return plans


def reference(c: Case) -> Plan:
    """docs/pot.md, 'CR-RoPE': older kept cells packed per head before W, window cells keep their
    distance to the window's end; pads repeat the row's first cell and do not move."""
    n_layer, n_head_kv, n_keep = c.keep.shape
    win0 = c.p_next
    if c.cr_rope and c.swa_pos_min >= 0:
        win0 = max(c.swa_pos_min, c.p_next - c.n_swa)
    idx = c.keep.copy()
    old = np.zeros_like(idx)
    for l in range(n_layer):
        for h in range(n_head_kv):
            idx[l, h, c.n_live[l]:] = idx[l, h, 0]
            old[l, h] = c.rope[l, h, idx[l, h]]
    live = np.arange(n_keep)[None, None, :] < c.n_live[:, None, None]
    n_old = ((old < win0) & live).sum(axis=2)
    W = int(n_old.max())
    if not c.cr_rope:
        return Plan(win0, c.p_next, idx, old, np.zeros_like(old))
    new = old.copy()
    for l in range(n_layer):
        for h in range(n_head_kv):
            k = 0
            for j in range(c.n_live[l]):
                if old[l, h, j] < win0:
                    new[l, h, j] = W - n_old[l, h] + k
                    k += 1
                else:
                    new[l, h, j] = W + (old[l, h, j] - win0)
    return Plan(win0, W + (c.p_next - win0), idx, new, np.where(live, new - old, 0))


def random_case(rng: np.random.Generator, *, swa: bool, cr_rope: bool, pads: bool) -> Case:
    n_layer, n_head_kv = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    n_cells = int(rng.integers(4, 40))
    n_keep = int(rng.integers(1, n_cells + 1))
    p_next = int(rng.integers(n_cells, 5 * n_cells))
    # each head has its own RoPE positions for the same cells (an earlier CR-RoPE compaction), distinct, < p_next
    rope = np.stack([np.stack([np.sort(rng.choice(p_next, n_cells, replace=False)) for _ in range(n_head_kv)])
                     for _ in range(n_layer)])
    n_live = np.array([int(rng.integers(1, n_keep + 1)) if pads else n_keep for _ in range(n_layer)])
    keep = np.full((n_layer, n_head_kv, n_keep), PAD)
    for l in range(n_layer):
        for h in range(n_head_kv):
            keep[l, h, :n_live[l]] = rng.choice(n_cells, n_live[l], replace=False)
    n_swa = int(rng.integers(1, n_cells + 1))
    swa_pos_min = int(rng.integers(max(0, p_next - 2 * n_swa), p_next)) if swa else -1
    return Case(n_live, keep, rope, p_next, swa_pos_min, n_swa, cr_rope)


CONFIGS = [dict(swa=s, cr_rope=r, pads=p) for s in (False, True) for r in (False, True) for p in (False, True)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(k for k, v in c.items() if v) or "plain")
def test_plan_equals_reference_and_keeps_cr_rope_rules(driver, cfg):
    rng = np.random.default_rng(sum(v << i for i, v in enumerate(cfg.values())))
    cases = [random_case(rng, **cfg) for _ in range(200)]
    for c, got in zip(cases, run(driver, cases)):
        want = reference(c)
        assert (got.win0, got.next) == (want.win0, want.next)
        np.testing.assert_array_equal(got.idx, want.idx)
        np.testing.assert_array_equal(got.new_rope, want.new_rope)
        np.testing.assert_array_equal(got.delta, want.delta)
        check_rules(c, got)


def check_rules(c: Case, p: Plan) -> None:
    """What must hold whatever the implementation."""
    n_layer, n_head_kv, n_keep = c.keep.shape
    for l in range(n_layer):
        for h in range(n_head_kv):
            live = slice(0, c.n_live[l])
            old = c.rope[l, h, p.idx[l, h]]
            assert (p.idx[l, h, live] == c.keep[l, h, live]).all()
            assert (p.idx[l, h, c.n_live[l]:] == c.keep[l, h, 0]).all()  # pads repeat the first cell
            assert (p.new_rope[l, h, c.n_live[l]:] == old[c.n_live[l]:]).all()  # and never move
            assert (p.delta[l, h] == np.where(np.arange(n_keep) < c.n_live[l], p.new_rope[l, h] - old, 0)).all()
            new = p.new_rope[l, h, live]
            if not c.cr_rope:
                assert (new == old[live]).all() and p.next == c.p_next
                continue
            assert len(set(new.tolist())) == len(new), "two kept cells of one head share a position"
            assert (new >= 0).all() and (new < p.next).all()
            in_window = old[live] >= p.win0
            # a cell the window layers still see keeps its distance to the end (Gemma's late passkeys)
            assert ((p.next - new)[in_window] == (c.p_next - old[live])[in_window]).all()
            # older cells are packed right before the window, in the order they were kept
            older = new[~in_window]
            window_start = p.next - (c.p_next - p.win0)
            assert (older == np.arange(window_start - len(older), window_start)).all()
    if c.cr_rope:
        assert p.next <= n_keep + (c.p_next - p.win0)  # positions stay bounded by |C| + the window
        if c.swa_pos_min < 0:
            assert p.win0 == c.p_next and p.next == int(c.n_live.max())  # no window: 0..n_keep-1


def test_window_start(driver):
    """The live window begins at the newer of the window part's oldest cell and p_next - n_swa."""
    base = dict(n_live=np.array([1]), keep=np.array([[[0]]]), rope=np.array([[[0]]]), n_swa=512, cr_rope=True)
    cases = [Case(p_next=2000, swa_pos_min=1000, **base), Case(p_next=2000, swa_pos_min=1700, **base),
             Case(p_next=300, swa_pos_min=0, **base), Case(p_next=2000, swa_pos_min=-1, **base)]
    got = [p.win0 for p in run(driver, cases)]
    assert got == [max(c.swa_pos_min, c.p_next - c.n_swa) if c.swa_pos_min >= 0 else c.p_next for c in cases]

"""The room a memory cgroup leaves (kvpot.session.memory_cgroup) and `--budget auto` planning with it: read from
made-up cgroup trees of both versions (so it is checked on any machine), then, where this machine lets a child
group be made, under a real enforced limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpot.bench.memory_limit import find_home
from kvpot.session import auto_budget
from kvpot.session.memory_cgroup import UNLIMITED, GroupRoom, cgroup_room

GiB, MiB = 1 << 30, 1 << 20


def _tree(tmp_path, version: int, groups: dict[str, dict[str, str]], own: str):
    """A mountinfo, a /proc/self/cgroup and the group folders: `groups` maps a group's path to its files."""
    top = tmp_path / "cg"
    for path, files in groups.items():
        folder = top / path.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    mountinfo = tmp_path / "mountinfo"
    if version == 2:
        mountinfo.write_text(f"30 1 0:26 / {top} rw,nosuid - cgroup2 cgroup2 rw\n")
        (tmp_path / "cgroup").write_text(f"0::{own}\n")
    else:  # a hybrid machine: v1's memory controller, an empty v2 hierarchy beside it
        mountinfo.write_text(f"35 31 0:32 / {top} rw,relatime - cgroup cgroup rw,memory\n"
                             f"41 31 0:38 / {tmp_path / 'unified'} rw,relatime - cgroup2 cgroup2 rw\n")
        (tmp_path / "cgroup").write_text(f"4:memory:{own}\n1:cpu:/\n0::/\n")
    return str(mountinfo), str(tmp_path / "cgroup")


def _v2(limit: str, current: int, file: int = 0, shmem: int = 0) -> dict[str, str]:
    return {"memory.max": f"{limit}\n", "memory.current": f"{current}\n",
            "memory.stat": f"anon {current - file}\nfile {file}\nshmem {shmem}\n"}


def _v1(limit: int, usage: int, cache: int = 0, shmem: int = 0) -> dict[str, str]:
    return {"memory.limit_in_bytes": f"{limit}\n", "memory.usage_in_bytes": f"{usage}\n",
            "memory.stat": f"cache {cache}\nshmem {shmem}\nrss {usage - cache}\n"
                           f"total_cache {cache}\ntotal_shmem {shmem}\ntotal_rss {usage - cache}\n"}


def test_v2_room_is_the_limit_less_the_charge_plus_the_reclaimable_cache(tmp_path):
    limit, current, file, shmem = 3 * GiB, 1 * GiB, 512 * MiB, 64 * MiB
    paths = _tree(tmp_path, 2, {"/": {}, "/app.slice": _v2("max", 5 * GiB),
                                "/app.slice/kvpot": _v2(str(limit), current, file, shmem)}, "/app.slice/kvpot")
    got = cgroup_room(*paths)
    assert got == GroupRoom(limit - current + file - shmem, limit, tmp_path / "cg" / "app.slice" / "kvpot")


def test_an_ancestors_tighter_limit_counts(tmp_path):
    paths = _tree(tmp_path, 2, {"/pod": _v2(str(2 * GiB), 1900 * MiB),
                                "/pod/box": _v2(str(8 * GiB), 1 * GiB)}, "/pod/box")
    got = cgroup_room(*paths)
    assert got is not None and got.folder == tmp_path / "cg" / "pod"
    assert got.room_bytes == 2 * GiB - 1900 * MiB and got.limit_bytes == 2 * GiB


def test_a_container_sees_its_own_group_as_the_root(tmp_path):
    # a cgroup namespace: /proc/self/cgroup says "0::/", and the mount point holds the container's own limit
    paths = _tree(tmp_path, 2, {"/": _v2(str(4 * GiB), 1 * GiB)}, "/")
    assert cgroup_room(*paths).room_bytes == 3 * GiB


def test_v1_with_hierarchy_totals_and_its_unlimited_value(tmp_path):
    paths = _tree(tmp_path, 1, {"/": _v1(9223372036854771712, 20 * GiB),
                                "/process_api": _v1(6 * GiB, 2 * GiB, cache=1 * GiB, shmem=8192)}, "/process_api")
    assert cgroup_room(*paths).room_bytes == 6 * GiB - 2 * GiB + 1 * GiB - 8192
    free = _tree(tmp_path / "free", 1, {"/": _v1(9223372036854771712, 1 * GiB),
                                        "/x": _v1(9223372036854771712, 1 * GiB)}, "/x")
    assert 9223372036854771712 >= UNLIMITED and cgroup_room(*free) is None


@pytest.mark.parametrize("damage", ["no mountinfo", "max", "garbage", "no files", "no memory hierarchy"])
def test_what_cannot_be_read_is_no_limit(tmp_path, damage):
    files = {"no files": {}, "max": _v2("max", GiB), "garbage": {"memory.max": "lots\n", "memory.current": "x"}}
    paths = _tree(tmp_path, 2, {"/g": files.get(damage, _v2(str(GiB), GiB // 2))}, "/g")
    if damage == "no mountinfo":
        paths = (str(tmp_path / "absent"), paths[1])
    if damage == "no memory hierarchy":
        (tmp_path / "mountinfo").write_text("22 1 0:20 / /proc rw - proc proc rw\n")
    assert cgroup_room(*paths) is None


@pytest.mark.parametrize("room", [1 * GiB, 64 * GiB])
def test_auto_budget_plans_with_the_smaller_of_the_machine_and_the_group(monkeypatch, room):
    monkeypatch.delenv(auto_budget.MEMORY_ENV, raising=False)
    monkeypatch.setattr(auto_budget, "_available_ram", lambda: 16 * GiB)
    monkeypatch.setattr(auto_budget, "cgroup_room", lambda: GroupRoom(room, room + GiB, Path("/sys/fs/cgroup/g")))
    mem = auto_budget.device_memory(devs=[])
    assert mem.free_bytes == min(room, 16 * GiB)
    said = f"RAM under its memory cgroup's {(room + GiB) / GiB:.1f} GiB limit"
    assert mem.where == (said if room < 16 * GiB else "RAM")


HOME = find_home()


@pytest.mark.skipif(isinstance(HOME, str), reason=f"no enforceable memory limit here: {HOME}")
def test_under_a_real_limit_device_memory_stays_inside_it(tmp_path):
    out = tmp_path / "limit.json"
    probe = ("import json; from kvpot.session.auto_budget import device_memory; m = device_memory(devs=[]); "
             "print(json.dumps({'free': m.free_bytes, 'where': m.where}))")
    res = subprocess.run([sys.executable, "-m", "kvpot.bench.memory_limit", "--limit", "300MiB", "--json", str(out),
                          "--", sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != auto_budget.MEMORY_ENV})
    assert res.returncode == 0, res.stderr
    said = json.loads(out.read_text())["result"]
    assert 0 < said["free"] <= 300 * MiB and "memory cgroup's 0.3 GiB limit" in said["where"], said

"""InfLLM's block store file over its life: where it is made (a new file under KVPOT_HOME/blocks, or
`store=PATH`, which must not exist), opened again for a saved context (borrowed, never written: a
reopened context that evicts again copies it first), kept when a saved context references it
(made read-only), deleted when nothing does (at reset, at exit, or by the next run for a killed
process's), and what it costs on disk before and after reading (docs/formats.md, "InfLLM block store").

`BlockStoreFile` is the part of the InfLLM policy that owns the file, as a dataclass its class
derives from: its fields are the policy's own, so the three a saved context holds (`_store_path`,
`_store_blocks`, `_store_hash`) keep their names and declared types (kvpot.state.engine_state
checks a file against them). It asks of the policy it is part of: the parameters `store`,
`store_type`, `cache` and `cache_decay`, and `_p(name)` for the fitted sizes (block_size, n_init,
n_local, max_cached_block). InfLLM's method (eviction into blocks, representative keys, lookup,
recall) stays in kvpot/policies/infllm.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from kvpot.errors import KvpotError
from kvpot.paths import blocks_dir
from kvpot.runtime.blocks import BYTES_PER_VALUE, BlockStore, format_name, split_format
from kvpot.safe_write import _pid_alive
from kvpot.wording import size_text

# the row formats a block store may hold (kvpot.runtime.blocks.KV_TYPES), and the default: keys in q8_0,
# values in q4_0, 0.81 bytes a value (f16: 2). Not q4_0 keys, though they passed the 8K passkey grids:
# Qwen2's K biases put a few channels of keys hundreds of times above the rest (Qwen2.5-Coder-1.5B's
# layer 0: max/median 281), and q4_0's one scale per 32 values, set by the largest, rounds the rest of
# those 32 to zero, so its error exceeds what tells one token's key from another's and the 1.5B's answers
# over recalled blocks fall apart. Values have no such channels: in q4_0 they gave the 1.5B the answers
# q8_0 gives and no worse a perplexity (docs/benchmarks.md, "The block store's row format")
STORE_TYPES = ("f16", "q8_0", "q4_0")
STORE_TYPE = "q8_0/q4_0"

# a store kvpot makes under KVPOT_HOME/blocks is named <random id>.<pid of the process that made it>.kvblk
# (docs/formats.md, "InfLLM block store"): a later run can tell one a killed process left
OWN_STORE = re.compile(r"^[0-9a-f]{32}\.(?P<pid>[0-9]+)\.kvblk$")
STORE_MAGIC = b"KVPOTBLK"


def new_store_path() -> Path:
    return blocks_dir(create=True) / f"{uuid.uuid4().hex}.{os.getpid()}.kvblk"


def reclaim_stores() -> list[Path]:
    """Delete the stores killed processes left under KVPOT_HOME/blocks: kvpot's name, an owner that no
    longer runs, and still writable (a store a saved context references was made read-only when the
    context was saved, so it is never reclaimed; neither is any file of another name)."""
    folder = blocks_dir()
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    removed = []
    for name in names:
        m = OWN_STORE.match(name)
        if not m or int(m["pid"]) == os.getpid() or _pid_alive(int(m["pid"])):
            continue
        path = folder / name
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o222:
                path.unlink()
                removed.append(path)
        except OSError:
            continue  # gone meanwhile, or not ours to remove
    return removed


def _file_kind(path: Path, st: os.stat_result) -> str:
    """What a path is, for an error line: "a symbolic link to /x", "a named pipe (FIFO)", ..."""
    if os.path.islink(path):
        return f"a symbolic link to {os.readlink(path)}"
    for test, kind in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(st.st_mode):
            return kind
    return "a file that is not a block store"


def _remove_own_store(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _store_prefix(path: str, length: int, what: str):
    """The first `length` bytes of a block store, 1 MiB at a time (the store outgrows memory on long
    reads); a store shorter than that is refused, naming what it should hold (`what`)."""
    with open(path, "rb") as f:
        left = length
        while left > 0:
            piece = f.read(min(left, 1 << 20))
            if not piece:
                raise KvpotError(f"block store {path} is shorter than {what}")
            yield piece
            left -= len(piece)



@dataclass
class BlockStoreFile:
    """The block store's file, as part of the InfLLM policy (the module's docstring)."""

    _store_path: str | None = field(default=None, init=False, repr=False, compare=False)
    _store_blocks: int = field(default=0, init=False, repr=False, compare=False)
    _store_hash: str | None = field(default=None, init=False, repr=False, compare=False)
    # a store of kvpot's own made here that no saved context references is deleted when the document is
    # forgotten, and also when the policy is collected or the interpreter exits (also after SIGTERM or
    # SIGHUP in the CLI) without a reset (a script or bench that never closed its engine left a file per
    # run, ~3 KB per token read). One an exported state references (a session's snapshot after reading,
    # which chat's /reset imports again) stays until then. A killed process's store is reclaimed by the
    # next run (reclaim_stores). Path -> its deletion, while pending.
    _cleanups: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _exported: set = field(default_factory=set, init=False, repr=False, compare=False)
    # whether this reading may append to the open store: a store a saved context brought is borrowed,
    # and never written (its blocks after the context's may belong to another saved context)
    _store_own: bool = field(default=False, init=False, repr=False, compare=False)
    # the `store=PATH` file this policy made (st_dev, st_ino), and whether a saved context references it:
    # a later document may replace only a file made here that nothing references
    _made: tuple[int, int] | None = field(default=None, init=False, repr=False, compare=False)
    _made_kept: bool = field(default=False, init=False, repr=False, compare=False)
    _blocks = None  # the open BlockStore (kvpot.runtime.blocks), never saved

    def _prepare_store(self) -> None:
        """At fit: KVPOT_HOME/blocks must be a folder (or not exist yet), and what killed processes left
        there goes; a `store=PATH` this reading could not make is refused now."""
        if self.store is None:
            blocks_dir()
            reclaim_stores()
        self._check_store_target(reopening=True)


    def _check_store_target(self, reopening: bool = False) -> None:
        """Refuse, before reading, a store this reading could not make without harming a file: a
        `store=PATH` that exists (a text file, a model, another context's store), a folder, or a path
        in a folder that does not exist (kvpot creates no folder of the user's). `reopening`: the
        engine is being made and a saved context may follow whose store is PATH, so an existing block
        store there is refused later, at the first chunk, if no context brought it."""
        if self.store is None:
            return
        path = Path(self.store).expanduser()
        what = f"infllm: store={self.store}"
        if self.store == "" or path.name in ("", ".", ".."):
            raise KvpotError(f"{what}: name a new file")
        if not path.parent.is_dir():
            raise KvpotError(f"{what}: folder {path.parent} does not exist (kvpot does not create it)")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if os.path.islink(path):
                raise KvpotError(f"{what} is a symbolic link to a missing file; name a new file") from None
            if not os.access(path.parent, os.W_OK | os.X_OK):
                raise KvpotError(f"{what}: folder {path.parent} is not writable") from None
            return
        except OSError as e:
            raise KvpotError(f"{what}: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            raise KvpotError(f"{what} is a folder; name a new file (e.g. {path / 'blocks.kvblk'})")
        if self._made == (st.st_dev, st.st_ino) and not self._made_kept:
            return  # made by this policy for an earlier document and referenced by no saved context
        link = os.path.islink(path)
        if reopening and stat.S_ISREG(st.st_mode) and not link and self._is_block_store(path):
            return
        if reopening and (link or not stat.S_ISREG(st.st_mode)):
            # kvpot writes a store as a regular file: whatever is there now is not the one a context was saved
            # with, nor a name a new store can take (a reading that makes one would write through a link)
            raise KvpotError(f"{what} is {_file_kind(path, st)} now, not a block store: a saved context's store "
                             "is the regular file kvpot wrote there, and a new store needs a name that does not exist")
        raise KvpotError(f"{what} exists; a block store must be a new file (kvpot never replaces a file), "
                         "name one that does not exist")

    @staticmethod
    def _is_block_store(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                return f.read(len(STORE_MAGIC)) == STORE_MAGIC
        except OSError:
            return False

    def _store_for_append(self, n_layer: int, n_head_kv: int, d_k: int, d_v: int):
        """The store new blocks go to: this reading's own (made now if there is none), never a borrowed one."""
        if self._blocks is not None and self._store_own:
            return self._blocks
        if self._blocks is not None:
            return self._copy_borrowed_store()
        self._check_store_target()
        if self.store is None:
            path = str(new_store_path())
        else:
            path = str(Path(self.store).expanduser())
            if self._made is not None and os.path.exists(path):
                os.unlink(path)  # this policy's own file for an earlier document (_check_store_target)
        # create=True makes the file with O_EXCL: an existing file is refused, never replaced
        self._blocks = self._with_cache(BlockStore(
            path, n_layer=n_layer, n_head_kv=n_head_kv, d_k=d_k, d_v=d_v, block_size=self._p("block_size"),
            kv_type=self.kv_type_for(d_k, d_v), max_cached=self._p("max_cached_block"), create=True))
        self._store_path, self._store_own = path, True
        if self.store is None:
            self._cleanups[path] = weakref.finalize(self, _remove_own_store, path)
        else:
            st = os.stat(path)
            self._made, self._made_kept = (st.st_dev, st.st_ino), False
        return self._blocks

    def disk_need(self, facts, n_tokens: int):
        """(bytes, folder, how to write less) of the block store after reading n_tokens of a model with
        these ModelFacts: every token past the initial ones and the local window becomes part of a
        block. Every layer is counted (a model's pot layers are at most its layers), so the figure errs high."""
        past = n_tokens - self._p("n_init") - self._p("n_local")
        if past <= 0:
            return None
        d_k, d_v = facts.head_dim_k or facts.n_embd // facts.n_head, facts.head_dim_v or facts.n_embd // facts.n_head
        per_token = self.store_bytes_per_token(facts.n_layer, facts.n_head_kv, d_k, d_v)
        folder = Path(self.store).expanduser().parent if self.store is not None else blocks_dir()
        ways = "put the block store on a larger disk (infllm:store=PATH)"
        if self.kv_type_for(d_k, d_v) != "q4_0" and d_k % 32 == 0 and d_v % 32 == 0:  # keys in q4_0 too
            q4 = past * self.store_bytes_per_token(facts.n_layer, facts.n_head_kv, d_k, d_v, "q4_0")
            ways += (f", store it in q4_0 (infllm:store_type=q4_0, about {size_text(int(q4))}; coarser keys, "
                     "which some models' answers do not survive)")
        return int(past * per_token), folder, ways

    def kv_type_for(self, d_k: int, d_v: int) -> str:
        """The store format this policy stores a model's K and V in (store_type, or its default, with f16
        for a dim the default's 32-value blocks do not divide)."""
        if self.store_type is not None:
            return self.store_type
        k_type, v_type = split_format(STORE_TYPE)
        return format_name(k_type if d_k % 32 == 0 else "f16", v_type if d_v % 32 == 0 else "f16")

    def store_bytes_per_token(self, n_layer: int, n_head_kv: int, d_k: int, d_v: int, kv_type: str | None = None) -> float:
        """Bytes the block store grows by per token read past the pot (every layer, K, V and the
        block's share of its positions and representatives), as kvpot-blocks.cpp lays a record out, in
        this policy's row format or `kv_type`."""
        bs = self._p("block_size")
        k_type, v_type = split_format(kv_type or self.kv_type_for(d_k, d_v))
        record = 4 * bs + 4 * n_head_kv * d_k + n_head_kv * bs * (d_k * BYTES_PER_VALUE[k_type] + d_v * BYTES_PER_VALUE[v_type])
        return n_layer * (record + 63) / bs  # a record is padded to 64 bytes (at most 63 more)

    def _copy_borrowed_store(self):
        """A reopened context goes on reading: its blocks are copied into a new store of its own first.
        Appending to the borrowed file instead would write where a later saved context sharing it keeps
        its blocks (or, cut back, lose them); the copy costs one pass over this context's blocks, once,
        and only when the reopened context evicts again."""
        src = self._blocks
        info = src.info()
        length = 64 + self._store_blocks * info.n_layer * info.record_bytes
        dst = new_store_path()
        try:
            with open(dst, "xb") as fout:
                for piece in _store_prefix(self._store_path, length, "the saved context's blocks"):
                    fout.write(piece)
            store = self._with_cache(BlockStore(dst, max_cached=self._p("max_cached_block")))
        except OSError as e:
            _remove_own_store(str(dst))
            raise KvpotError(f"cannot copy block store {self._store_path} to {dst}: {e.strerror}") from None
        except KvpotError:
            _remove_own_store(str(dst))
            raise
        src.close()
        self._blocks, self._store_path, self._store_own = store, str(dst), True
        self._cleanups[str(dst)] = weakref.finalize(self, _remove_own_store, str(dst))
        return store

    def disk_bytes(self) -> int:
        return os.path.getsize(self._store_path) if self._blocks is not None else 0

    def _with_cache(self, store):
        """The store with its per-layer caches set to this policy's rule (a runtime without them keeps
        its one LRU cache)."""
        if store.layer_caches:
            store.set_cache(self.cache, self.cache_decay)
        return store

    def cache_stats(self) -> dict | None:
        """The block caches' rule, size and hits and misses per pot layer since the store was opened
        (per_layer False: a runtime built before the per-layer caches, one LRU cache for all layers, its
        counts as one entry); None before a store."""
        if self._blocks is None:
            return None
        if not self._blocks.layer_caches:
            info = self._blocks.info()
            return {"rule": "lru", "per_layer": False, "size": info.max_cached, "hits": [info.hits],
                    "misses": [info.misses]}
        layers = [self._blocks.cache(layer) for layer in range(self._blocks.shape[0])]
        return {"rule": self.cache, "per_layer": True, "decay": self.cache_decay, "size": self._p("max_cached_block"),
                "hits": [c.hits for c in layers], "misses": [c.misses for c in layers]}

    def store_digest(self) -> str:
        """sha256 of the store's bytes up to the blocks this policy has written (a saved context
        references the store by path and this digest instead of copying it)."""
        if self._store_hash is None and self._blocks is not None:
            self._blocks.sync()
            info = self._blocks.info()
            h = hashlib.sha256()
            length = 64 + self._store_blocks * info.n_layer * info.record_bytes
            for piece in _store_prefix(self._store_path, length, "the blocks written to it"):
                h.update(piece)
            self._store_hash = h.hexdigest()
        return self._store_hash or ""

    def keep_on_disk(self) -> None:
        # a state held in memory (a session's snapshot after reading) does not keep the store; a file does.
        # A store of kvpot's own becomes read-only: the mark that a saved context references it (so no
        # later run reclaims it), kept in the file's mode, which no crash can leave half-changed. This
        # reading may still append to it through its open descriptor, after the blocks the context uses.
        cleanup = self._cleanups.pop(self._store_path, None)
        if cleanup is not None:
            cleanup.detach()
            try:
                os.chmod(self._store_path, stat.S_IMODE(os.stat(self._store_path).st_mode) & ~0o222)
            except OSError as e:
                raise KvpotError(f"cannot mark block store {self._store_path} as kept: {e.strerror}") from None
        if self.store is not None and self._store_own and self._store_path == str(Path(self.store).expanduser()):
            self._made_kept = True

    def _open_saved_store(self) -> None:
        """Open the store a saved context's state names (borrowed: never written), checked against the
        blocks and the digest the context recorded."""
        if not self._store_path:
            return
        try:
            st = os.lstat(self._store_path)
        except OSError:
            st = None
        if st is None or (stat.S_ISLNK(st.st_mode) and not os.path.exists(self._store_path)):
            raise KvpotError(f"the saved context's block store {self._store_path} is missing")
        if not stat.S_ISREG(st.st_mode):  # opening a FIFO would wait for a writer; a link is not what was saved
            raise KvpotError(f"the saved context's block store {self._store_path} is "
                             f"{_file_kind(Path(self._store_path), os.stat(self._store_path))} now, "
                             "not the block store file it was saved with")
        self._blocks = self._with_cache(BlockStore(self._store_path, block_size=self._p("block_size"),
                                                   max_cached=self._p("max_cached_block")))
        self._store_own = False  # borrowed: never written (_copy_borrowed_store)
        if self._blocks.n_blocks < self._store_blocks:
            raise KvpotError(f"block store {self._store_path} holds {self._blocks.n_blocks} blocks; "
                             f"the saved context needs {self._store_blocks}")
        want, self._store_hash = self._store_hash, None
        if self.store_digest() != want:
            raise KvpotError(f"block store {self._store_path} does not match the saved context (hash differs)")
        # blocks after the context's may belong to a later context sharing the store: the open store
        # shows only this context's (the file is not changed)
        self._blocks.limit(self._store_blocks)

    def _close_store(self) -> None:
        """Close the open store and forget it; one this policy made under KVPOT_HOME that no saved context
        references is deleted with it (one an exported state references, when the process exits)."""
        if self._blocks is not None:
            self._blocks.close()
        if self._store_path not in self._exported and self._store_path in self._cleanups:
            self._cleanups.pop(self._store_path)()  # unlinks, once
        self._blocks = None
        self._store_own = False
        self._store_path = None
        self._store_blocks = 0
        self._store_hash = None

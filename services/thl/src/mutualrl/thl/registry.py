"""Tokenizer registry: ids -> local paths, persisted, with an LRU cache of loaded tokenizers.

Registrations are persisted (Redis hash `<prefix>:thl:tokenizers`, a JSON file in a state dir,
or memory only) so a restarted THL — or another replica sharing the Redis — knows every
tokenizer again; tokenizers themselves are loaded lazily from their paths and kept in an LRU
cache. Only fast (Rust-backed) tokenizers are accepted: alignment needs character offsets.

A registration may be made for a run (`run_id`): its record lists the runs that hold it, and
`delete_run` releases the run's hold, dropping the registration once no run holds it and it was
never made without a run ("pinned": start-up config, `mutualrl thl register`).

Paths a client sends are confined to the registry's `roots` (THL's `thl.tokenizer_roots`): a path
outside them — before or after following symlinks — is refused with one message whatever is
there, so the service never tells a caller whether a file exists elsewhere on its host. What a
load opens is checked too, before every load (a registration, and each reload after the cache
dropped the tokenizer): the file, or each entry of the directory, resolved (`realpath`), must
lie under a root and be a regular file (or a directory, which is never read), so a
`tokenizer.json` that links to `/etc/passwd`, or a FIFO that would block the reading thread, is
refused before anything opens it (`check_contents`). Tokenizers of THL's own start-up config may
lie anywhere, but their files must still be regular files. What is left: whoever may write
inside a root can swap a checked file for a link between the check and the load (the check
narrows that race to the load itself; it cannot close it without opening every file itself).

A loaded tokenizer encodes with truncation and padding off, whatever its tokenizer.json says
(BERT-family checkpoints ship `truncation: 128` and fixed padding): THL's ids and offsets must be
the text's full encoding, the one a sender's token trace was made of.
"""

from __future__ import annotations

import builtins  # the classes below define a `list` method
import json
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from mutualrl.common import ids
from mutualrl.common.alignment_types import TokenizerInfo
from mutualrl.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    quote,
)
from mutualrl.common.keys import DEFAULT_PREFIX, KeySpace
from mutualrl.common.redis_errors import sync_redis_op

Record = dict[str, Any]
Update = Callable[[Record | None], Record | None]
"""Turns the current record (None: absent) into the new one (None: delete it)."""


class RegistryStore(Protocol):
    """Where registrations live: id -> record (a JSON-able dict)."""

    def load_all(self) -> dict[str, Record]: ...

    def get(self, tokenizer_id: str) -> Record | None: ...

    def count(self) -> int:
        """How many registrations the store holds."""
        ...

    def put(self, tokenizer_id: str, record: Record) -> None: ...

    def update(self, tokenizer_id: str, change: Update) -> Record | None:
        """Apply `change` to one record atomically (against other writers of the store);
        returns the new record."""
        ...


class MemoryStore:
    """Process-local registrations (trainers running THL in-process, tests)."""

    def __init__(self) -> None:
        self._data: dict[str, Record] = {}
        self._lock = threading.Lock()

    def load_all(self) -> dict[str, dict[str, Any]]:
        return dict(self._data)

    def get(self, tokenizer_id: str) -> dict[str, Any] | None:
        return self._data.get(tokenizer_id)

    def count(self) -> int:
        return len(self._data)

    def put(self, tokenizer_id: str, record: Record) -> None:
        with self._lock:
            self._data[tokenizer_id] = record

    def update(self, tokenizer_id: str, change: Update) -> Record | None:
        with self._lock:
            new = change(self._data.get(tokenizer_id))
            if new is None:
                self._data.pop(tokenizer_id, None)
            else:
                self._data[tokenizer_id] = new
            return new


class JsonFileStore:
    """Registrations in `<state_dir>/tokenizers.json` (single host; replaced atomically)."""

    def __init__(self, state_dir: str | Path) -> None:
        self._path = Path(state_dir) / "tokenizers.json"
        self._lock = threading.Lock()

    def load_all(self) -> dict[str, dict[str, Any]]:
        if not self._path.exists():
            return {}
        data = json.loads(self._path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}

    def get(self, tokenizer_id: str) -> dict[str, Any] | None:
        return self.load_all().get(tokenizer_id)

    def count(self) -> int:
        return len(self.load_all())

    def put(self, tokenizer_id: str, record: Record) -> None:
        self.update(tokenizer_id, lambda _: record)

    def update(self, tokenizer_id: str, change: Update) -> Record | None:
        with self._lock:
            data = self.load_all()
            new = change(data.get(tokenizer_id))
            if new is None:
                data.pop(tokenizer_id, None)
            else:
                data[tokenizer_id] = new
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
            tmp.replace(self._path)
            return new


class RedisStore:
    """Registrations in the Redis hash `<prefix>:thl:tokenizers`, shared by every THL replica.

    Redis failures become UNAVAILABLE / RESOURCE_EXHAUSTED (`mutualrl.common.redis_errors`)."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX) -> None:
        from mutualrl.common import redis_connect

        # `redis+cluster://...` gives a Redis Cluster client (one hash, so one slot).
        self._client = redis_connect.sync_client(url, decode_responses=True, socket_timeout=5.0,
                                                 socket_connect_timeout=5.0)
        self.key = KeySpace(prefix, "thl").index("tokenizers")

    def load_all(self) -> dict[str, Record]:
        with sync_redis_op("the tokenizer registry's load"):
            raw = self._client.hgetall(self.key)
        # decode_responses=True: keys are str (redis-py's types also allow bytes)
        return {str(k): json.loads(v) for k, v in raw.items()}

    def get(self, tokenizer_id: str) -> Record | None:
        with sync_redis_op("the tokenizer registry's get"):
            raw = self._client.hget(self.key, tokenizer_id)
        return json.loads(raw) if raw else None

    def count(self) -> int:
        with sync_redis_op("the tokenizer registry's count"):
            return int(self._client.hlen(self.key))

    def put(self, tokenizer_id: str, record: Record) -> None:
        with sync_redis_op("the tokenizer registry's put"):
            self._client.hset(self.key, tokenizer_id, json.dumps(record, sort_keys=True))

    def update(self, tokenizer_id: str, change: Update) -> Record | None:
        """WATCH / MULTI on the hash: a concurrent write by another replica retries `change`."""
        import redis

        with sync_redis_op("the tokenizer registry's update"), \
                self._client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self.key)
                    raw = pipe.hget(self.key, tokenizer_id)
                    new = change(json.loads(raw) if raw else None)
                    pipe.multi()
                    if new is None:
                        pipe.hdel(self.key, tokenizer_id)
                    else:
                        pipe.hset(self.key, tokenizer_id, json.dumps(new, sort_keys=True))
                    pipe.execute()
                    return new
                except redis.WatchError:
                    continue

    def close(self) -> None:
        self._client.close()


def _pinned(record: Record) -> bool:
    """Registered at least once without a run (records written before runs existed count)."""
    return bool(record.get("pinned", "runs" not in record))


@dataclass
class LoadedTokenizer:
    """A loaded fast tokenizer and what the engine needs about it."""

    info: TokenizerInfo
    hf: Any  # transformers.PreTrainedTokenizerFast (typed Any: transformers is imported lazily)
    nbytes: int = 0
    """Size of its serialized form (tokenizer.json): what the cache's byte budget counts."""

    @property
    def backend(self) -> Any:
        return self.hf.backend_tokenizer


MAX_PATH_CHARS = 4096
"""Longest path RegisterTokenizer accepts (Linux PATH_MAX)."""
MAX_NAME_BYTES = 255
"""Longest path component in UTF-8 bytes (Linux NAME_MAX)."""


def check_path_text(path: str, field: str = "path") -> None:
    """Refuse what no file system call should see: NUL bytes, over-long paths or names, text
    that is not valid Unicode (each would otherwise surface as an OS error)."""
    if not isinstance(path, str) or not path:
        raise InvalidArgument(field, "must be a local tokenizer directory or tokenizer.json")
    if "\x00" in path:
        raise InvalidArgument(field, "contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise InvalidArgument(field, f"is {len(path)} characters long, over the "
                              f"{MAX_PATH_CHARS}-character limit")
    try:
        names = [len(part.encode("utf-8")) for part in path.split("/")]
    except UnicodeEncodeError as err:
        raise InvalidArgument(field, f"is not valid Unicode text ({err.reason})") from err
    if max(names) > MAX_NAME_BYTES:
        raise InvalidArgument(field, f"has a component of {max(names)} bytes, over the "
                              f"{MAX_NAME_BYTES}-byte limit of a file name")


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def confine(path: str, roots: Sequence[Path] | None, field: str = "path") -> str:
    """The absolute, symlink-free form of `path`, which must lie under one of `roots` (None:
    anywhere). The lexical form is checked before the file system is touched and the resolved
    form after, both with the same message, so the answer for a path outside the roots says
    nothing about what exists there."""
    check_path_text(path, field)
    outside = InvalidArgument(field, f"{quote(path)} is not under a directory THL may read "
                              "tokenizers from (its thl.tokenizer_roots, logged at start-up)")
    lexical = _absolute(path)
    # A root may itself be a symlink (/data/run -> a volume): paths name it either way.
    resolved_roots = None if roots is None else [Path(r).resolve() for r in roots]
    if roots is not None and resolved_roots is not None and not _inside(
            lexical, [*(_absolute(str(r)) for r in roots), *resolved_roots]):
        raise outside
    try:
        resolved = lexical.resolve()
    except (OSError, RuntimeError, ValueError) as err:  # RuntimeError: a symlink loop
        raise InvalidArgument(field, f"{quote(path)} cannot be resolved: "
                              f"{type(err).__name__}") from err
    if resolved_roots is not None and not _inside(resolved, resolved_roots):
        raise outside  # a symlink inside a root that points out of it
    return str(resolved)


MAX_DIR_ENTRIES = 4096
"""Most entries a tokenizer directory may hold (each one is checked before a load)."""


def check_contents(path: str, roots: Sequence[Path] | None, field: str = "path") -> None:
    """What a load of `path` (absolute and resolved) may open stays inside `roots` (None:
    anywhere) and is a regular file: the file itself, or every entry of the directory
    (transformers picks its files by name: tokenizer.json, tokenizer_config.json, vocabularies,
    chat templates, config.json). An entry that resolves outside the roots, or to a FIFO,
    socket or device, is refused; a directory entry (never read) or a dangling link (never
    opened: the load fails on what it lacks) is left alone."""
    resolved_roots = None if roots is None else [Path(r).resolve() for r in roots]

    def check(target: str, shown: str) -> None:
        real = os.path.realpath(target)
        if resolved_roots is not None and not _inside(Path(real), resolved_roots):
            raise InvalidArgument(field, f"{shown} resolves outside the directories THL may "
                                  "read tokenizers from (thl.tokenizer_roots)")
        try:
            mode = os.stat(real).st_mode
        except OSError:
            return
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise InvalidArgument(field, f"{shown} is not a regular file (a FIFO, socket or "
                                  "device is never read)")

    check(path, quote(path))
    if not os.path.isdir(path):
        return
    try:
        with os.scandir(path) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_DIR_ENTRIES:
                    raise InvalidArgument(field, f"{quote(path)} holds more than "
                                          f"{MAX_DIR_ENTRIES} entries; a tokenizer directory "
                                          "holds a few files")
                check(entry.path, f"{quote(path)} holds {quote(entry.name)}, which")
    except OSError as err:
        raise InvalidArgument(field, f"{quote(path)} cannot be listed: "
                              f"{type(err).__name__}") from err


def _absolute(path: str) -> Path:
    """Absolute and normalised (`..` folded) without touching the file system."""
    return Path(os.path.normpath(os.path.abspath(path)))


def _plain_encoding(tok: Any) -> Any:
    """Switch off the truncation and padding a tokenizer.json may carry: THL encodes texts
    whole, exactly as the tokenizer does with both off."""
    backend = tok.backend_tokenizer
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    return tok


# transformers resolves its names lazily and that is not thread-safe: two first registrations
# in parallel threads can see a half-initialised module ("cannot import name 'AutoTokenizer'").
_TRANSFORMERS_IMPORT = threading.Lock()


def _too_big(path: str, size: int, max_bytes: int | None) -> InvalidArgument | None:
    if max_bytes is None or size <= max_bytes:
        return None
    return InvalidArgument("path", f"the tokenizer at {quote(path)} is {size} bytes serialized, "
                           f"over THL's limit of {max_bytes} (thl.max_tokenizer_bytes)")


def load_fast_tokenizer(path: str, max_bytes: int | None = None,
                        roots: Sequence[Path] | None = None) -> Any:
    """Load a fast tokenizer from a directory or a tokenizer.json; refuse slow ones, ones
    larger than `max_bytes` serialized (its tokenizer.json is measured before loading), and
    paths whose files `check_contents` refuses (against `roots`; None: anywhere)."""
    with _TRANSFORMERS_IMPORT:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

    p = Path(path)
    # transformers' loaders return one of several backend classes; `is_fast` decides below.
    tok: Any
    try:
        if not p.exists():
            raise InvalidArgument("path", f"{quote(path)} does not exist on the THL host")
        check_contents(path, roots)
        spec_file = p / "tokenizer.json" if p.is_dir() else p
        if spec_file.is_file() and (err := _too_big(path, spec_file.stat().st_size, max_bytes)):
            raise err
        if p.is_file():
            if p.suffix != ".json":
                raise InvalidArgument("path", f"{quote(path)} is a file but not a tokenizer.json")
            tok = PreTrainedTokenizerFast(tokenizer_file=str(p), clean_up_tokenization_spaces=False)
        else:
            tok = AutoTokenizer.from_pretrained(str(p), use_fast=True, local_files_only=True)
    except InvalidArgument:
        raise
    except Exception as err:  # transformers raises many types for unreadable inputs
        raise InvalidArgument("path", f"cannot load a tokenizer from {quote(path)}: "
                              f"{quote(err, 256)}") from err
    if not getattr(tok, "is_fast", False):
        raise InvalidArgument(
            "path", f"{quote(path)} loads as {type(tok).__name__}, a slow (Python) tokenizer; THL "
            "needs a fast tokenizer (tokenizer.json) because alignment uses its character offsets")
    return _plain_encoding(tok)


def loaded(tokenizer_id: str, path: str, tok: Any, max_bytes: int | None = None
           ) -> LoadedTokenizer:
    """`tok` with its description and size (refused when over `max_bytes` serialized: a
    directory without tokenizer.json is converted on load, so only now is its size known)."""
    text = tok.backend_tokenizer.to_str()
    if err := _too_big(path, len(text), max_bytes):
        raise err
    return LoadedTokenizer(describe(tokenizer_id, path, tok), tok, len(text))


def _state(component: Any) -> Any:
    return json.loads(component.__getstate__()) if component is not None else None


def describe(tokenizer_id: str, path: str, tok: Any) -> TokenizerInfo:
    # The components' own JSON, not the whole tokenizer's: its vocabulary and merges would be
    # parsed into Python objects ~10x their size only to read three fields.
    backend = tok.backend_tokenizer
    spec = {"model": {"type": type(backend.model).__name__,
                      "byte_fallback": bool(getattr(backend.model, "byte_fallback", False))},
            "normalizer": _state(backend.normalizer),
            "pre_tokenizer": _state(backend.pre_tokenizer)}
    model_type = str((spec.get("model") or {}).get("type", ""))
    normalizer = spec.get("normalizer") or {}
    norm_type = str(normalizer.get("type", ""))
    if norm_type == "Sequence":
        norm_type = "+".join(str(n.get("type", "")) for n in normalizer.get("normalizers", []))

    def has_byte_level(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has_byte_level(v) for v in node.values())
        if isinstance(node, list):
            return any(has_byte_level(v) for v in node)
        return False

    byte_level = has_byte_level(spec.get("pre_tokenizer")) or bool(
        (spec.get("model") or {}).get("byte_fallback", False))
    return TokenizerInfo(tokenizer_id=tokenizer_id, path=path, model_type=model_type,
                         vocab_size=len(tok), byte_level=byte_level, normalizer=norm_type)


@dataclass(frozen=True)
class RegistryLimits:
    """What the registry holds at most (THL's config passes its own; None: no limit)."""

    cache_max_bytes: int | None = None
    """Serialized bytes of the loaded tokenizers kept (the most recent one is always kept)."""
    max_tokenizer_bytes: int | None = None
    """Largest tokenizer accepted, serialized."""
    max_tokenizers: int | None = None
    """Most registrations held."""
    max_runs_per_tokenizer: int | None = None
    """Most runs holding one registration."""


class TokenizerRegistry:
    """Thread-safe registry: persisted registrations + an LRU of loaded tokenizers."""

    def __init__(self, store: RegistryStore | None = None, cache_size: int = 16,
                 roots: Sequence[str | Path] | None = None, *,
                 limits: RegistryLimits | None = None) -> None:
        self._store: RegistryStore = store if store is not None else MemoryStore()
        self.roots: list[Path] | None = (None if roots is None
                                         else [_absolute(str(r)) for r in roots])
        """Directories `register` may read from, absolute (None: anywhere, for in-process
        use)."""
        self.limits = limits or RegistryLimits()
        self._cache: OrderedDict[str, LoadedTokenizer] = OrderedDict()
        self._cache_size = max(1, cache_size)
        self._cache_bytes = 0
        # One load at a time: a load holds a tokenizer's JSON and its parse at once, so loads in
        # parallel (registrations, cache misses) would add those peaks up.
        self._load_lock = threading.Lock()
        self.on_drop: builtins.list[Callable[[str], None]] = []
        """Called with each tokenizer id `delete_run` drops (its metrics go with it)."""
        self._lock = threading.RLock()
        self.loads = 0
        """How many times a tokenizer was loaded from disk (cache misses)."""

    @staticmethod
    def check_id(tokenizer_id: str, field: str = "tokenizer_id") -> None:
        ids.check_tokenizer_id(tokenizer_id, field)

    def register(self, tokenizer_id: str, path: str, overwrite: bool = False,
                 run_id: str = "", *, confined: bool = True) -> TokenizerInfo:
        """Register (or confirm) `tokenizer_id` at `path`; for `run_id` when given (released by
        `delete_run`), else pinned. An id registered with another path is ALREADY_EXISTS
        unless `overwrite` (which keeps the runs that hold it). The path must lie under the
        registry's roots unless `confined` is False (THL's own start-up config)."""
        self.check_id(tokenizer_id)
        if run_id:
            ids.check_run_id(run_id)
        roots = self.roots if confined else None
        path = confine(path, roots)
        existing = self._store.get(tokenizer_id)
        if existing is not None and not overwrite and existing.get("path") != path:
            raise AlreadyExists("tokenizer_id", f"{quote(tokenizer_id)} is registered with path "
                                f"{quote(existing.get('path'))}; set overwrite to replace it")
        most = self.limits.max_tokenizers
        # Checked before the update, not inside it: replicas registering new ids at the same
        # moment may overshoot by one each.
        if existing is None and most is not None and self._store.count() >= most:
            raise ResourceExhausted("tokenizer_id", f"THL holds {most} registrations, its limit "
                                    "(thl.max_tokenizers); delete a run's tokenizers first")
        max_bytes = self.limits.max_tokenizer_bytes
        new: LoadedTokenizer | None = None
        if overwrite or existing is None or existing.get("path") != path:
            # slow: outside the store's critical section
            with self._load_lock:
                new = loaded(tokenizer_id, path,
                             load_fast_tokenizer(path, max_bytes, roots), max_bytes)

        def hold(current: Record | None) -> Record:
            if new is not None:
                record: Record = {"path": path, "info": asdict(new.info),
                                  "registered_at": time.time(), "runs": [], "pinned": False,
                                  "confined": confined}
                if current is not None:  # overwrite: the runs that held the id still do
                    record["runs"] = list(current.get("runs", []))
                    record["pinned"] = _pinned(current)
            elif current is None or current.get("path") != path:
                raise AlreadyExists("tokenizer_id", f"{quote(tokenizer_id)} was changed "
                                    "concurrently by another registration; retry")
            else:
                record = dict(current, runs=list(current.get("runs", [])),
                              pinned=_pinned(current))
            if run_id:
                runs = self.limits.max_runs_per_tokenizer
                if run_id not in record["runs"] and runs is not None and len(
                        record["runs"]) >= runs:
                    raise ResourceExhausted("run_id", f"{runs} runs hold {quote(tokenizer_id)}, "
                                            "the limit (thl.max_runs_per_tokenizer)")
                record["runs"] = sorted({*record["runs"], run_id})
            else:
                record["pinned"] = True
            return record

        record = self._store.update(tokenizer_id, hold)
        assert record is not None
        info = TokenizerInfo(**record["info"])
        if new is not None:
            with self._lock:
                self._remember(tokenizer_id, new)
        return info

    def delete_run(self, run_id: str) -> int:
        """Release every registration `run_id` holds; those no other run holds (and that are
        not pinned) are dropped. Returns how many the run held (NOT_FOUND when none)."""
        ids.check_run_id(run_id)
        held = [tid for tid, rec in self._store.load_all().items()
                if run_id in rec.get("runs", [])]

        def release(current: Record | None) -> Record | None:
            if current is None:
                return None
            record = dict(current, runs=[r for r in current.get("runs", []) if r != run_id])
            return record if record["runs"] or _pinned(current) else None

        for tid in held:
            if self._store.update(tid, release) is None:
                with self._lock:
                    self._forget(tid)
                for hook in self.on_drop:
                    hook(tid)
        if not held:
            raise NotFound("run_id", f"no tokenizer is registered for run {quote(run_id)}")
        return len(held)

    def list(self) -> list[TokenizerInfo]:
        records = self._store.load_all()
        return [TokenizerInfo(**records[k]["info"]) for k in sorted(records)]

    def get(self, tokenizer_id: str, field: str = "tokenizer_id") -> LoadedTokenizer:
        """The loaded tokenizer (NOT_FOUND when the id was never registered)."""
        self.check_id(tokenizer_id, field)
        with self._lock:
            hit = self._cache.get(tokenizer_id)
            if hit is not None:
                self._cache.move_to_end(tokenizer_id)
                return hit
        # Not cached here: another replica (or an earlier life of this one) may have registered it.
        record = self._store.get(tokenizer_id)
        if record is None:
            raise NotFound(field, f"no tokenizer registered as {quote(tokenizer_id)}")
        max_bytes = self.limits.max_tokenizer_bytes
        with self._load_lock:
            # Checked again at each load: a link planted after the registration is refused.
            roots = self.roots if record.get("confined", True) else None
            try:
                found = loaded(tokenizer_id, record["path"],
                               load_fast_tokenizer(record["path"], max_bytes, roots), max_bytes)
            except InvalidArgument as err:  # what the registration found there changed
                raise FailedPrecondition(field, f"the tokenizer registered as "
                                         f"{quote(tokenizer_id)} can no longer be loaded: "
                                         f"{err.message}") from err
        with self._lock:
            self.loads += 1
            self._remember(tokenizer_id, found)
        return found

    def close(self) -> None:
        """Release the store's connection (Redis), if it has one."""
        close = getattr(self._store, "close", None)
        if close is not None:
            close()

    def cached_ids(self) -> builtins.list[str]:
        with self._lock:
            return list(self._cache)

    @property
    def cached_bytes(self) -> int:
        """Serialized bytes of the tokenizers in the cache."""
        return self._cache_bytes

    def _remember(self, tokenizer_id: str, found: LoadedTokenizer) -> None:
        self._forget(tokenizer_id)
        self._cache[tokenizer_id] = found
        self._cache_bytes += found.nbytes
        budget = self.limits.cache_max_bytes
        while len(self._cache) > 1 and (len(self._cache) > self._cache_size or (
                budget is not None and self._cache_bytes > budget)):
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= old.nbytes

    def _forget(self, tokenizer_id: str) -> None:
        old = self._cache.pop(tokenizer_id, None)
        if old is not None:
            self._cache_bytes -= old.nbytes

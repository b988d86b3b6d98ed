"""The HF engine's fast path: decoding over a static KV cache with the loop's state on the
device, the decode step captured as CUDA graphs on a GPU (`HFEngine` uses it; plain torch and
transformers' cache interface, in the manner gpt-fast showed).

- **The pool.** Every decoder layer's keys and values live in one tensor of
  [rows, kv heads, length, head dim] (`PooledLayer`, a transformers cache layer), allocated
  for a call's rows x (longest prompt + max_new_tokens) and kept for the next calls while
  they fit. A batch of B rows uses the pool's first B rows; attention reads its first W
  positions (the window), so a graph serves any call whose shape maps to the same (B, W).
- **The state on the device.** Each batch slot's next input, position, padding mask, sampling
  key, whether it still generates, its tokens, behaviour log-probs and length; the step. One
  decode step (`_step`: a forward of one token per slot, the draw of `sampling.draw`, EOS, the
  writes) reads and writes only these, elementwise (no scatter, so the deterministic mode's
  kernels need no other path), so it replays as a graph.
- **The host, every `check_every` steps** (`_check`): one read of the tokens and log-probs
  sampled since the last check, which the host keeps per sample row; stop strings are searched
  there at each position a stop could complete, and a row is cut at the exact first stop, as
  if checked at every step (rows do not interact: a row's draws depend on its key and the step
  only). Rows that finished leave the batch when the live rows fit a smaller bucket
  (`_compact`), and the loop ends when none is left.
- **Buckets.** With graphs, batch sizes are powers of two and windows multiples of
  `window_tokens`, so a few graphs serve every round; without (a CPU, or `cuda_graphs: false`),
  the batch is exactly the live rows and the window exactly the filled length. Asked for
  graphs off CUDA, the steps run eagerly in the graphs' shapes (how tests on a CPU check the
  computation a graph replays).

CUDA graphs are captured with `torch.cuda.CUDAGraph` directly rather than through
`torch.compile(mode="reduce-overhead")`: capture takes seconds instead of a compile per
process and shape, every graph allocates from one private pool the memory plan counts
(`runtime.memory`), and nothing recompiles when a round's shape changes. The graphs replay
kernels launched by eager torch; fusing them (torch.compile of the step before capture) is
the next lever and is not taken here.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from mutualrl.trainer.engines.sampling import draw, uniforms

log = logging.getLogger(__name__)

LENGTH_QUANTUM = 64
"""A pool's length is rounded up to a multiple of this, so rounds whose prompts differ by a
few tokens reuse it."""


class RolloutTooLarge(ValueError):
    """A call's static cache would exceed what the memory plan leaves the engine."""


class PooledLayer(CacheLayerMixin):
    """One decoder layer's keys and values in the pool: a batch of B rows writes into the
    first B rows at the slot `filled` points to, and attention reads the first `window`
    positions. Compileable (transformers then builds the decode mask on the device, without
    reading the cache length back)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values = keys, values  # transformers' names, for its generic code
        self.pool_keys, self.pool_values = keys, values
        self.device = keys.device
        self.filled = torch.zeros((), dtype=torch.long, device=keys.device)
        """0-d: the slot the next token's keys go to (the cache's length)."""
        self.window = int(keys.shape[2])
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the pool is allocated before the first update."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        rows, _, new, _ = key_states.shape
        at = torch.arange(new, device=self.device) + self.filled
        keys, values = self.pool_keys[:rows], self.pool_values[:rows]
        keys.index_copy_(2, at, key_states.to(keys.dtype))
        values.index_copy_(2, at, value_states.to(values.dtype))
        self.filled.add_(new)
        return keys[:, :, : self.window], values[:, :, : self.window]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.window, 0

    def get_seq_length(self) -> Any:
        return self.filled

    def get_max_length(self) -> int:
        return int(self.pool_keys.shape[2])


@dataclass
class Pool:
    """The static cache and the decode state of up to `rows` rows of `length` tokens."""

    rows: int
    length: int
    layers: list[PooledLayer]
    cache: Any
    inp: torch.Tensor
    """[rows, 1] the token each slot feeds next."""
    pos: torch.Tensor
    """[rows, 1] its position id."""
    mask: torch.Tensor
    """[rows, length] bool: the slot's prompt tokens (no padding) and every later position."""
    key: torch.Tensor
    """[rows] int64 sampling key of the row the slot generates."""
    alive: torch.Tensor
    """[rows] bool: the slot's row is still generating."""
    tokens: torch.Tensor
    """[rows, length] the slot's sampled token at each step."""
    logps: torch.Tensor
    """[rows, length] float32 their behaviour log-probs."""
    lengths: torch.Tensor
    """[rows] the length of the slot's row once EOS ended it; `length + 1` while it runs."""
    columns: torch.Tensor
    """[length] 0, 1, ...: the step each column of `tokens` holds."""
    step: torch.Tensor
    """0-d int64: the step the next decode writes."""
    nbytes: int
    graphs: dict[Any, Any] = field(default_factory=dict)
    graph_pool: Any = None

    @property
    def running(self) -> int:
        """The length value of a row that has not finished."""
        return self.length + 1


def pool_bytes(layer_shapes: Sequence[tuple[int, int, torch.dtype]], rows: int,
               length: int) -> int:
    """Bytes of a pool's caches and state: per layer (kv heads, head dim, dtype) keys and
    values for rows x length, and the per-slot and per-row state."""
    kv = sum(2 * rows * heads * length * dim * torch.empty((), dtype=dtype).element_size()
             for heads, dim, dtype in layer_shapes)
    state = rows * (8 + 8 + length + 8 + 1 + length * 12 + 8) + length * 8
    return kv + state


def pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def _forward_params(model: torch.nn.Module) -> Mapping[str, inspect.Parameter]:
    """The parameters of the model's forward; a peft model's forward passes **kwargs through,
    so the wrapped model's count."""
    base = getattr(model, "get_base_model", None)
    inner = base() if callable(base) else model
    return inspect.signature(inner.forward).parameters


def cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; accept either version."""
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def _last_logits_kwarg(model: torch.nn.Module) -> dict[str, int]:
    """`logits_to_keep=1` where the model's forward takes it (transformers causal LMs)."""
    return {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}


def cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def prefill(model: Any, input_ids: torch.Tensor, attn: torch.Tensor,
            positions: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """(the dynamic cache, [P, V] last-position logits) of one forward over the left-padded
    prompts."""
    out = model(input_ids=input_ids, attention_mask=attn, position_ids=positions,
                use_cache=True, **_last_logits_kwarg(model))
    return cache_of(out), out.logits[:, -1, :]


@dataclass
class Sampling:
    """What a decode step bakes in (a graph is captured per value)."""

    temperature: float
    truncation: tuple[int, float, float]
    eos: int | None


@dataclass
class Rows:
    """A call's result per sample row, for `engines.hf` to turn into Samples."""

    tokens: list[list[int]]
    logps: list[list[float]]
    finished: list[bool]
    """True: EOS or a stop string ended the row ("stop"); False: the budget ("length")."""


class StaticDecoder:
    """Decoding over a pool reused across calls (see the module docstring)."""

    def __init__(self, device: torch.device, graphs: bool, check_every: int,
                 window_tokens: int, kv_budget_bytes: int | None = None,
                 policy: str = "policy") -> None:
        self.device = device
        self.policy = policy
        # The graphs' shapes (batch buckets, attention windows) hold wherever they are asked
        # for; elsewhere than on CUDA the steps then run eagerly in those shapes.
        self.shaped = graphs
        self.graphs = graphs and device.type == "cuda"
        self.check_every = max(1, check_every)
        self.window_tokens = max(1, window_tokens)
        self.kv_budget_bytes = kv_budget_bytes
        self.pool: Pool | None = None
        self._stream: Any = None
        self._graph_model: int | None = None
        self.stats: dict[str, float] = {
            "calls": 0.0, "pool_allocations": 0.0, "pool_bytes": 0.0, "graph_captures": 0.0,
            "graph_replays": 0.0, "capture_s": 0.0, "eager_steps": 0.0, "host_checks": 0.0,
            "compactions": 0.0}

    # ----- the pool -------------------------------------------------------------------------

    def _ensure_pool(self, dyn: Any, rows: int, length: int) -> Pool:
        """The pool, reallocated when this call's rows or length exceed it (its graphs go
        with it)."""
        shapes = [(int(k.shape[1]), int(k.shape[3]), k.dtype)
                  for k in (layer.keys for layer in dyn.layers)]
        p = self.pool
        if p is not None and p.rows >= rows and p.length >= length and len(p.layers) == len(
                shapes) and all(layer.pool_keys.shape[1] == h and layer.pool_keys.shape[3] == d
                                and layer.pool_keys.dtype == t
                                for layer, (h, d, t) in zip(p.layers, shapes, strict=True)):
            return p
        rows = max(rows, p.rows if p is not None else 0)
        length = -(-max(length, p.length if p is not None else 0) // LENGTH_QUANTUM) \
            * LENGTH_QUANTUM
        need = pool_bytes(shapes, rows, length)
        if self.kv_budget_bytes is not None and need > self.kv_budget_bytes:
            raise RolloutTooLarge(
                f"the HF engine's static cache for {rows} rollouts of {length} tokens needs "
                f"{need / 2**30:.2f} GiB, more than the {self.kv_budget_bytes / 2**30:.2f} GiB "
                "the memory plan leaves it: lower grpo.prompts_per_round, grpo.group_size or "
                "grpo.max_new_tokens (or the longest prompt)")
        self.pool = None  # the old pool's memory is free before the new one is taken
        layers = [PooledLayer(torch.zeros((rows, h, length, d), dtype=t, device=self.device),
                              torch.zeros((rows, h, length, d), dtype=t, device=self.device))
                  for h, d, t in shapes]
        dev = self.device
        self.pool = Pool(
            rows=rows, length=length, layers=layers, cache=Cache(layers=list(layers)),
            inp=torch.zeros((rows, 1), dtype=torch.long, device=dev),
            pos=torch.zeros((rows, 1), dtype=torch.long, device=dev),
            mask=torch.ones((rows, length), dtype=torch.bool, device=dev),
            key=torch.zeros(rows, dtype=torch.long, device=dev),
            alive=torch.zeros(rows, dtype=torch.bool, device=dev),
            tokens=torch.zeros((rows, length), dtype=torch.long, device=dev),
            logps=torch.zeros((rows, length), dtype=torch.float32, device=dev),
            lengths=torch.zeros(rows, dtype=torch.long, device=dev),
            columns=torch.arange(length, device=dev),
            step=torch.zeros((), dtype=torch.long, device=dev), nbytes=need)
        self.stats["pool_allocations"] += 1
        self.stats["pool_bytes"] = float(need)
        return self.pool

    def bucket(self, rows: int) -> int:
        """The batch `rows` live rows run in: a power of two with graphs, else exactly."""
        return pow2(rows) if self.shaped else rows

    def window(self, filled: int) -> int:
        """Positions attention reads when `filled` slots hold keys (the new token's among
        them)."""
        assert self.pool is not None
        if not self.shaped:
            return filled
        q = self.window_tokens
        return min(-(-filled // q) * q, self.pool.length)

    # ----- the decode step (graph-safe: nothing is read back to the host) -------------------

    def _record(self, logits: torch.Tensor, batch: int, s: Sampling) -> None:
        """Draw each slot's token at the current step and write it in the step's column."""
        p = self.pool
        assert p is not None
        tok, lp = draw(logits.float(), s.temperature, s.truncation,
                       uniforms(p.key[:batch], p.step))
        here = p.columns == p.step
        p.tokens[:batch] = torch.where(here, tok[:, None], p.tokens[:batch])
        p.logps[:batch] = torch.where(here, lp[:, None].float(), p.logps[:batch])
        if s.eos is not None:
            live = p.alive[:batch]
            done = live & (tok == s.eos)
            p.lengths[:batch] = torch.where(done, p.step + 1, p.lengths[:batch])
            live.logical_and_(~done)
        p.inp[:batch, 0].copy_(tok)
        p.step.add_(1)

    def _step(self, model: Any, batch: int, window: int, s: Sampling, kw: str) -> None:
        """One token for each of the first `batch` slots: forward, draw, record."""
        p = self.pool
        assert p is not None
        for layer in p.layers:
            layer.window = window
        out = model(input_ids=p.inp[:batch], attention_mask=p.mask[:batch, :window],
                    position_ids=p.pos[:batch], use_cache=True, **{kw: p.cache})
        self._record(out.logits[:, -1, :], batch, s)
        p.pos[:batch].add_(1)

    # ----- graphs ---------------------------------------------------------------------------

    def _snapshot(self) -> list[torch.Tensor]:
        p = self.pool
        assert p is not None
        return [t.clone() for t in self._mutable()]

    def _mutable(self) -> list[torch.Tensor]:
        """What one decode step changes besides the step's own column and cache slot."""
        p = self.pool
        assert p is not None
        return [p.inp, p.pos, p.alive, p.lengths, p.step, *(layer.filled for layer in p.layers)]

    def _restore(self, snap: list[torch.Tensor]) -> None:
        p = self.pool
        assert p is not None
        for t, v in zip(self._mutable(), snap, strict=True):
            t.copy_(v)

    def _graph(self, model: Any, batch: int, window: int, s: Sampling, kw: str,
               ctx: Callable[[], AbstractContextManager[Any]]) -> Any:
        """The graph of one step at (batch, window, sampling), captured on first use: the
        step runs once eagerly on the capture stream (lazy initialisations, cuBLAS handles),
        the state it changed is put back, then the capture records it. None (and no graphs
        from then on, said once) when the step cannot be captured."""
        p = self.pool
        assert p is not None
        if self._graph_model != id(model):  # a different module: its weights' addresses
            p.graphs.clear()
            self._graph_model = id(model)
        key = (batch, window, s.temperature, s.truncation, s.eos)
        g = p.graphs.get(key)
        if g is not None:
            return g
        t0 = time.perf_counter()
        if p.graph_pool is None:
            p.graph_pool = torch.cuda.graph_pool_handle()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        snap = self._snapshot()
        try:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                with ctx():
                    self._step(model, batch, window, s, kw)
                self._restore(snap)
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
            g = torch.cuda.CUDAGraph()
            # thread_local: the trainer's background threads (publishing, the probe's
            # prefetch) may use CUDA while this thread captures.
            with torch.cuda.graph(g, pool=p.graph_pool, stream=self._stream,
                                  capture_error_mode="thread_local"), ctx():
                self._step(model, batch, window, s, kw)
        except RuntimeError as err:  # a step that cannot be captured: run it eagerly
            torch.cuda.synchronize(self.device)
            self._restore(snap)
            self.graphs = False
            log.warning("policy %s: the HF engine's decode step could not be captured as a "
                        "CUDA graph (%s); its steps run eagerly from now on", self.policy,
                        str(err).splitlines()[0][:200] if str(err) else type(err).__name__)
            return None
        p.graphs[key] = g
        self.stats["graph_captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - t0
        return g

    def _decode(self, model: Any, batch: int, window: int, s: Sampling, kw: str,
                ctx: Callable[[], AbstractContextManager[Any]]) -> None:
        graph = self._graph(model, batch, window, s, kw, ctx) if self.graphs else None
        if graph is not None:
            graph.replay()
            self.stats["graph_replays"] += 1
            return
        with ctx():
            self._step(model, batch, window, s, kw)
        self.stats["eager_steps"] += 1

    # ----- a call ---------------------------------------------------------------------------

    def run(self, model: Any, input_ids: torch.Tensor, attn: torch.Tensor,
            positions: torch.Tensor, n: int, max_new_tokens: int, s: Sampling,
            keys: Sequence[int], stop_check: Callable[[list[int], int], bool] | None,
            stop_mask: torch.Tensor | None,
            ctx: Callable[[], AbstractContextManager[Any]] = nullcontext) -> Rows:
        """Sample `n` rows per prompt (prompt-major) from the left-padded prompts. `keys`: one
        sampling key per row; `stop_check(ids, s)`: whether row ids[: s + 1] ends in a stop
        string (asked only where `stop_mask` marks token s as able to complete one)."""
        self.stats["calls"] += 1
        prompts, width = input_ids.shape
        b = prompts * n
        kw = cache_kwarg(model)
        with ctx():
            dyn, logits = prefill(model, input_ids, attn, positions)
        batch = self.bucket(b)
        self._ensure_pool(dyn, batch, width + max_new_tokens)
        self._load(dyn, attn, positions, n, b, batch, width, keys)
        self._record(logits.repeat_interleave(n, dim=0), b, s)  # step 0, from the prefill
        del dyn, logits

        rows = _RowsOnHost(b, max_new_tokens)
        checked, col, filled = 0, 1, width
        while True:
            if col - checked >= self.check_every or col == max_new_tokens:
                self._check(checked, col, rows, stop_check, stop_mask)
                checked = col
                if not rows.live or col == max_new_tokens:
                    break
                batch = self._compact(batch, rows, filled)
            self._decode(model, batch, self.window(filled + 1), s, kw, ctx)
            col += 1
            filled += 1
        return Rows(tokens=[t[:n_] for t, n_ in zip(rows.tokens, rows.length, strict=True)],
                    logps=[lp[:n_] for lp, n_ in zip(rows.logps, rows.length, strict=True)],
                    finished=rows.finished)

    def _load(self, dyn: Any, attn: torch.Tensor, positions: torch.Tensor, n: int, b: int,
              batch: int, width: int, keys: Sequence[int]) -> None:
        """The prefill's keys and values into every sample row's slot (row i in slot i, n per
        prompt), and the decode state of the call; slots past the b rows copy slot 0 and
        generate nothing."""
        p = self.pool
        assert p is not None
        fill = torch.cat([torch.arange(b, device=self.device).div(n, rounding_mode="floor"),
                          torch.zeros(batch - b, dtype=torch.long, device=self.device)])
        for layer, src in zip(p.layers, dyn.layers, strict=True):
            if type(src) is not DynamicLayer or src.keys is None or src.values is None:
                raise TypeError(f"cache layer {type(src).__name__} is not a full-attention "
                                "layer the pool can hold")
            layer.pool_keys[:batch, :, :width] = src.keys.index_select(0, fill)
            layer.pool_values[:batch, :, :width] = src.values.index_select(0, fill)
            layer.filled.fill_(width)
        p.mask[:batch, :width] = attn.bool().index_select(0, fill)
        p.mask[:batch, width:] = True
        p.pos[:batch, 0] = positions[:, -1].index_select(0, fill) + 1
        p.inp[:batch] = 0
        p.key[:b] = torch.tensor(list(keys), dtype=torch.long, device=self.device)
        p.key[b:batch] = p.key[0]
        p.alive[:b] = True
        p.alive[b:] = False
        p.lengths.fill_(p.running)
        p.step.zero_()

    def _check(self, lo: int, hi: int, rows: _RowsOnHost,
               stop_check: Callable[[list[int], int], bool] | None,
               stop_mask: torch.Tensor | None) -> None:
        """The host's look at steps [lo, hi): one read of the live rows' new tokens,
        log-probs and lengths; stop strings found there end their rows at the exact first
        stop."""
        p = self.pool
        assert p is not None
        self.stats["host_checks"] += 1
        live = sorted(rows.live)
        idx = torch.tensor([rows.slot_of(r) for r in live], dtype=torch.long, device=self.device)
        # Token ids and lengths are exact in float64: one transfer for all three.
        got = torch.cat([p.tokens[idx, lo:hi].double(), p.logps[idx, lo:hi].double(),
                         p.lengths[idx, None].double()], dim=1).cpu().tolist()
        k = hi - lo
        stopped: list[int] = []
        for r, values in zip(live, got, strict=True):
            ended_at = int(values[-1])
            ended = ended_at != p.running  # EOS sampled at step ended_at - 1
            end = ended_at if ended else hi
            rows.tokens[r].extend(int(v) for v in values[: end - lo])
            rows.logps[r].extend(values[k: k + end - lo])
            cut = None
            if stop_check is not None and stop_mask is not None:
                for step in range(lo, end - 1 if ended else end):  # EOS is checked as EOS
                    if bool(stop_mask[rows.tokens[r][step]]) and stop_check(rows.tokens[r], step):
                        cut = step + 1
                        break
            if cut is not None or ended:
                rows.finish(r, cut if cut is not None else ended_at)
            if cut is not None:
                stopped.append(rows.slot_of(r))
        if stopped:  # the device learns of the stops: those slots stop generating
            p.alive[torch.tensor(stopped, dtype=torch.long, device=self.device)] = False

    def _compact(self, batch: int, rows: _RowsOnHost, filled: int) -> int:
        """Move the live rows to the first slots when they fit a smaller batch."""
        smaller = self.bucket(len(rows.live))
        if smaller >= batch:
            return batch
        p = self.pool
        assert p is not None
        slots = sorted(rows.slot_of(r) for r in rows.live)
        order = slots + [slots[0]] * (smaller - len(slots))
        idx = torch.tensor(order, dtype=torch.long, device=self.device)
        for layer in p.layers:
            layer.pool_keys[:smaller, :, :filled] = layer.pool_keys[idx, :, :filled]
            layer.pool_values[:smaller, :, :filled] = layer.pool_values[idx, :, :filled]
        for t in (p.inp, p.pos, p.mask, p.key):
            t[:smaller] = t[idx]
        p.alive[:len(slots)] = True
        p.alive[len(slots):] = False
        p.lengths.fill_(p.running)  # every row left runs; those that ended are on the host
        rows.move([rows.slot_rows[s] for s in slots] + [-1] * (smaller - len(slots)))
        self.stats["compactions"] += 1
        return smaller


class _RowsOnHost:
    """What the host knows of a call's sample rows: the tokens and log-probs read so far, the
    rows still generating, and which batch slot each one occupies."""

    def __init__(self, b: int, max_new_tokens: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(b)]
        self.logps: list[list[float]] = [[] for _ in range(b)]
        self.length = [max_new_tokens] * b
        self.finished = [False] * b
        self.live = set(range(b))
        self.slot_rows = list(range(b))
        """The sample row in each slot (-1: none)."""
        self._slot = {r: r for r in range(b)}

    def slot_of(self, row: int) -> int:
        return self._slot[row]

    def finish(self, row: int, length: int) -> None:
        self.length[row] = length
        self.finished[row] = True
        self.live.discard(row)

    def move(self, slot_rows: list[int]) -> None:
        self.slot_rows = slot_rows
        self._slot = {r: s for s, r in enumerate(slot_rows) if r >= 0}


def static_cache_problem(model: Any, autocast_dtype: Any = None) -> str | None:
    """Why the fast path cannot sample `model`, or None: a decode step over the pool must give
    the logits a full forward gives. Tried on a three-token prompt (a prefill of two, one step
    of one) on the model's device, in its dtype or under autocast to `autocast_dtype`."""
    if getattr(model, "config", None) is None:
        return "the model has no transformers config"
    device = next(model.parameters()).device
    autocast = (torch.autocast(device.type, dtype=autocast_dtype, cache_enabled=False)
                if autocast_dtype is not None else nullcontext())
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), autocast:
            vocab = model.get_output_embeddings().weight.shape[0]
            ids = torch.tensor([[1, 2, 3]], device=device).clamp(max=vocab - 1)
            full = model(input_ids=ids).logits[0, -1].float()
            attn = torch.ones((1, 2), dtype=torch.long, device=device)
            positions = torch.arange(2, device=device)[None]
            dyn, _ = prefill(model, ids[:, :2], attn, positions)
            kinds = {type(layer).__name__ for layer in dyn.layers}
            if kinds != {"DynamicLayer"}:
                return (f"its cache has {', '.join(sorted(kinds))} layers; the static cache "
                        "holds full-attention layers only")
            probe = StaticDecoder(device, graphs=False, check_every=1, window_tokens=1)
            p = probe._ensure_pool(dyn, 1, 3)
            probe._load(dyn, attn, positions, 1, 1, 1, 2, [0])
            p.inp[0, 0] = ids[0, 2]
            for layer in p.layers:
                layer.window = 3
            out = model(input_ids=p.inp[:1], attention_mask=p.mask[:1, :3],
                        position_ids=p.pos[:1], use_cache=True, **{cache_kwarg(model): p.cache})
            step = out.logits[0, -1].float()
    except Exception as err:  # any failure is a reason to use the other loop, said once
        detail = str(err).splitlines()[0][:200] if str(err) else ""
        return f"a decode step over the static cache failed ({type(err).__name__}: {detail})"
    finally:
        model.train(was_training)
    exact = autocast_dtype is None and next(model.parameters()).dtype == torch.float32
    diff = float((step - full).abs().max())
    if not diff <= (1e-3 if exact else 5e-2) * float(full.abs().max().clamp(min=1.0)):
        return (f"a decode step over the static cache gives other logits than a full forward "
                f"(max |diff| {diff:.3g})")
    return None

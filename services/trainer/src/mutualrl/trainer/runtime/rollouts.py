"""Where a round's rollouts come from: the trainer's own engine (in-process, the default), or a
rollout worker, a process of the policy's own with its own copy of the model and its own engine
(any of `engines.factory`), fed the learner's weights after each optimizer step
(docs/training.md, "Rollouts beside learning").

Weights cross through torch.multiprocessing: the learner keeps a ring of max(1, d) copies of
its trainable parameters (d = `grpo.max_off_policy_steps`) in shared memory (on a GPU, CUDA
tensors whose IPC handles the worker opens), each slot stamped with the version it holds
(version = optimizer rounds taken). The worker copies the version a request names into its
model and calls its engine's `sync_weights`.

The schedule, with s0 the first round of this start:

- round k's request names version max(s0, k - d): in the deterministic exchange mode exactly
  that one (the worker waits for it), in the asynchronous mode the newest one published;
- with d >= 1, round k + 1 is requested when round k's rollouts are taken, so the worker
  samples it while round k's update runs; with d = 0 round k is requested after version k is
  published, and the learner waits (no overlap);
- publishing version v into the slot of v - max(1, d) first waits until the worker has
  loaded the weights of every request up to round v (the last that needed the slot's old
  version);
- a result older than k - d is refused and round k regenerated from the newest weights
  (`refused` counts them); a worker that dies is restarted and its pending rounds requested
  again (`restarts`), wherever the learner was waiting for it (a result, or the load that
  frees a slot); one that dies `MAX_DEATHS_IN_A_ROW` times with no result between fails the
  run. A worker that is alive but shows no sign of life for `stall_s` (stopped, or wedged
  holding the interpreter) is killed and restarted the same way: its heartbeat is a thread
  of its own, so a long load or generate keeps beating.

Threads: the round's budget is split between the learner and the worker (`threads`). On a CPU
in the asynchronous mode, once the worker has sampled the next round and waits, the update
takes its threads too, between two layers of a forward or a backward, and gives them back when
the worker samples again (`lend_idle_threads`): the round is then bounded by the work of both,
not by the update on its share alone.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.multiprocessing as mp
from torch import Tensor
from torch.utils.hooks import RemovableHandle
from transformers import PreTrainedModel

from mutualrl.trainer.config.run import GRPOSettings, LoraSettings
from mutualrl.trainer.data.tasks import Prompt, Task
from mutualrl.trainer.engines.base import RolloutEngine, Sample, prompt_seed
from mutualrl.trainer.engines.factory import make_engine
from mutualrl.trainer.model import lora
from mutualrl.trainer.runtime.allocator import RoundAllocation
from mutualrl.trainer.runtime.distributed import SINGLE, Dist, gathered
from mutualrl.trainer.runtime.presets import load_policy

log = logging.getLogger(__name__)

POLL_S = 0.2
"""How often a wait for the worker's result checks that it is alive."""

SPIN_S = 0.002
"""How often either side looks at the ring's stamps while it waits on the other."""

BEAT_S = 0.5
"""How often a worker's heartbeat thread says it is alive."""

START_GRACE_S = 120.0
"""Added to `stall_s` before a new worker's first beat: a spawned process imports torch and
its engine before its heartbeat starts."""

MAX_DEATHS_IN_A_ROW = 3
"""A worker that dies this many times with no result in between fails the run (it cannot
start, or is killed as soon as it does), instead of being restarted forever."""


@dataclass(frozen=True)
class RolloutRequest:
    """One round's rollouts, as the engine's `generate` takes them."""

    round: int
    prompts: list[Prompt]
    rendered: list[list[int]]
    n: int
    max_new_tokens: int
    sampling: dict[str, Any]
    """temperature, top_p, top_k, min_p, stop."""
    seeds: list[int]


@dataclass
class RolloutBatch:
    """A round's rollouts and the weights that sampled them."""

    prompts: list[Prompt]
    samples: list[list[Sample]]
    version: int
    """The weight version (optimizer rounds taken) the samples come from."""
    generate_s: float
    """Seconds the engine spent sampling them (in the worker: beside the learner's update)."""
    wait_s: float
    """Seconds the learner waited for them."""
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerSpec:
    """How the worker builds its model and engine (picklable: it crosses to a new process)."""

    policy: str
    start: str
    """The model directory the learner started from (weights, config, tokenizer)."""
    dtype: str
    device: str
    lora: LoraSettings | None
    engine: str
    engine_kwargs: dict[str, Any]
    threads: int
    stall_s: float
    """Seconds without a heartbeat after which the learner restarts the worker."""


@dataclass
class _Job:
    """A request as the worker gets it."""

    round: int
    rendered: list[list[int]]
    n: int
    max_new_tokens: int
    sampling: dict[str, Any]
    seeds: list[int]
    version: int
    exact: bool
    threads: int


@dataclass
class _Result:
    round: int
    version: int
    samples: list[list[Sample]]
    seconds: float
    stats: dict[str, float]
    error: str | None = None


class _Shared:
    """The weights' ring in shared memory, the version each slot holds (-1 while it is
    written) and the last round whose weights the worker loaded.

    No lock or condition is shared with the worker: a process killed inside a multiprocessing
    Condition's wait leaves it counting a sleeper that never wakes, and the learner's next
    notify blocks for good; one killed holding the lock blocks the learner's next acquire.
    Each side polls the stamps instead, and the reader copies a slot, then checks that its
    stamp did not change meanwhile (a sequence lock), and copies again if it did."""

    def __init__(self, params: dict[str, Tensor], slots: int) -> None:
        self.slots = [{n: p.detach().clone().share_memory_() for n, p in params.items()}
                      for _ in range(slots)]
        self.version = torch.full((slots,), -1, dtype=torch.int64).share_memory_()
        self.loaded = torch.full((1,), -1, dtype=torch.int64).share_memory_()
        self.sampling = torch.zeros(1, dtype=torch.int64).share_memory_()
        """1 while the worker loads weights for a job and samples it, 0 while it waits."""
        self.beat = torch.zeros(1, dtype=torch.int64).share_memory_()
        """The worker's heartbeat, counted up every BEAT_S."""

    def write(self, params: dict[str, Tensor], version: int, until_loaded: int,
              check: Callable[[], None]) -> float:
        """Publish `params` as `version` once the worker has loaded round `until_loaded`'s
        weights, calling `check` while it waits (it restarts a dead worker); returns the
        seconds waited."""
        slot = version % len(self.slots)
        t0 = time.perf_counter()
        while int(self.loaded[0]) < until_loaded:
            check()
            time.sleep(SPIN_S)
        waited = time.perf_counter() - t0
        self.version[slot] = -1
        with torch.no_grad():
            for n, t in self.slots[slot].items():
                t.copy_(params[n].detach())
        _settle(self.slots[slot].values())
        self.version[slot] = version
        return waited

    def read(self, params: Mapping[str, Tensor], job: _Job) -> int:
        """Copy the weights `job` names into `params` (waiting for them to be published) and
        mark its round loaded; returns the version copied."""
        parent = mp.parent_process()
        while True:
            have = self.version.tolist()
            slot = _slot_for(have, job)
            if slot is None:
                if parent is not None and not parent.is_alive():
                    raise SystemExit(0)  # the learner is gone: no version will come
                time.sleep(SPIN_S)
                continue
            with torch.no_grad():
                for n, t in self.slots[slot].items():
                    params[n].copy_(t)
            _settle(params.values())
            if int(self.version[slot]) == have[slot]:  # not rewritten while it was copied
                break
        self.loaded[0] = max(int(self.loaded[0]), job.round)
        return have[slot]


def _slot_for(have: list[int], job: _Job) -> int | None:
    """The ring slot whose weights `job` may load, or None while none may."""
    if job.exact and job.version in have:
        return have.index(job.version)
    newest = max(have)
    if newest >= job.version:  # asynchronous; or a restart after the exact one left
        return have.index(newest)
    return None


def _settle(tensors: Iterable[Tensor]) -> None:
    """Wait for the copies into CUDA tensors to finish before a stamp says they are done."""
    devices = {t.device for t in tensors if t.is_cuda}
    for device in devices:
        torch.cuda.synchronize(device)


def _heartbeat(beat: Tensor) -> None:
    while True:
        beat[0] += 1
        time.sleep(BEAT_S)


def _serve(spec: WorkerSpec, shared: _Shared, jobs: Any, results: Any) -> None:
    """The worker process: build the model and engine, then answer jobs until None.
    `results` is the writing end of a pipe the learner reads."""
    threading.Thread(target=_heartbeat, args=(shared.beat,), name="heartbeat",
                     daemon=True).start()
    torch.set_num_threads(spec.threads)
    try:
        model, tok = load_policy(spec.start, spec.dtype, spec.device)
        if spec.lora is not None:
            model = lora.wrap(model, spec.lora)
        model.eval()
        params = {n: p for n, p in model.named_parameters() if n in shared.slots[0]}
        engine = make_engine(spec.engine, model, tok, model_path=spec.start,
                             **spec.engine_kwargs)
    except Exception:  # the learner raises it: a worker that cannot start fails the run
        _answer(results, _Result(-1, -1, [], 0.0, {}, traceback.format_exc()))
        return
    parent = mp.parent_process()
    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return  # the learner is gone (killed): nobody will read a result
            continue
        if job is None:
            return
        shared.sampling[0] = 1
        try:
            torch.set_num_threads(max(1, job.threads))
            version = shared.read(params, job)
            engine.sync_weights(model)
            t0 = time.perf_counter()
            with torch.no_grad():
                samples = engine.generate(job.rendered, n=job.n,
                                          max_new_tokens=job.max_new_tokens, seeds=job.seeds,
                                          **job.sampling)
            result = _Result(job.round, version, samples, time.perf_counter() - t0,
                             engine.stats())
        except Exception:
            result = _Result(job.round, -1, [], 0.0, {}, traceback.format_exc())
        shared.sampling[0] = 0
        if not _answer(results, result):
            return


def _answer(results: Any, result: _Result) -> bool:
    """Send `result` to the learner; False when it is gone."""
    try:
        results.send(result)
    except OSError:  # a broken pipe: nobody will read it
        return False
    return True


class RolloutWorker:
    """The learner's handle on its rollout worker: starts it, publishes weights, sends jobs,
    takes results; restarts it when it dies.

    Results come through a pipe whose writing end only the worker holds, so its death reads
    as the end of the pipe, even in the middle of a result (a queue's pipe would have the
    learner's own copy of that end open, and the read would wait for the rest for good)."""

    def __init__(self, spec: WorkerSpec, params: dict[str, Tensor], slots: int) -> None:
        self.spec = spec
        self.ctx = mp.get_context("spawn")
        self.shared = _Shared(params, slots)
        self.sent: dict[int, _Job] = {}
        """Jobs sent whose result has not been taken."""
        self.early: dict[int, _Result] = {}
        """Results of later rounds that came while an earlier one was awaited."""
        self.restarts = 0
        self.deaths_in_a_row = 0
        self.publish_wait_s = 0.0
        self.stalls = 0
        self.beat_seen: tuple[int, float, bool]
        """(the last heartbeat count seen, when it was first seen, whether one came since the
        worker started); set by `_start`."""
        self.proc: Any = None
        self.jobs: Any = None
        self.results: Any = None
        self._start()

    def _start(self) -> None:
        self.jobs = self.ctx.Queue()
        self.results, child_end = self.ctx.Pipe(duplex=False)
        self.proc = self.ctx.Process(target=_serve, name=f"rollouts-{self.spec.policy}",
                                     args=(self.spec, self.shared, self.jobs, child_end),
                                     daemon=True)
        self.proc.start()
        child_end.close()
        self.beat_seen = (int(self.shared.beat[0]), time.monotonic(), False)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def publish(self, params: dict[str, Tensor], version: int) -> None:
        """Make `version` the worker's to load (see the module's schedule)."""
        until = min(version, max(self.sent, default=-1))
        self.publish_wait_s += self.shared.write(params, version, until, self.check)

    def send(self, job: _Job) -> None:
        self.sent[job.round] = job
        self.jobs.put(job)

    def check(self) -> None:
        """Restart the worker if it died, or if it stalled: no heartbeat for `stall_s`."""
        if not self.proc.is_alive():
            self._restart()
            return
        beat, since, started = self.beat_seen
        now, count = time.monotonic(), int(self.shared.beat[0])
        if count != beat:
            self.beat_seen = (count, now, True)
            return
        limit = self.spec.stall_s + (0.0 if started else START_GRACE_S)
        if now - since > limit:
            self.stalls += 1
            log.warning("policy %s: the rollout worker (pid %s) gave no sign of life for "
                        "%.0f s; killing it", self.spec.policy, self.proc.pid, now - since)
            self._restart()

    def result(self, round_k: int) -> _Result:
        """Round `round_k`'s result (sent before); a dead worker is restarted and its jobs sent
        again, a worker's error raised."""
        while True:
            try:
                r: _Result | None = (self.results.recv() if self.results.poll(POLL_S)
                                     else None)
            except (EOFError, OSError):  # the worker is gone, maybe half-way through a result
                self._restart()
                continue
            if r is None:
                self.check()
                continue
            self.deaths_in_a_row = 0
            if r.error is not None:
                raise RuntimeError(f"policy {self.spec.policy}: the rollout worker failed "
                                   f"(round {r.round}):\n{r.error}")
            if r.round == round_k:
                self.sent.pop(round_k, None)
                return r
            # a later round's (pipelined) or a repeat of one already taken: keep the later
            if r.round > round_k and r.round in self.sent:
                self.early[r.round] = r

    def take_early(self, round_k: int) -> _Result | None:
        r = self.early.pop(round_k, None)
        if r is not None:
            self.sent.pop(round_k, None)
        return r

    def _restart(self) -> None:
        if self.proc.is_alive():  # its pipe ended first: it is on its way out
            self.proc.kill()
        self.proc.join()
        self.deaths_in_a_row += 1
        if self.deaths_in_a_row >= MAX_DEATHS_IN_A_ROW:
            raise RuntimeError(f"policy {self.spec.policy}: the rollout worker died "
                               f"{self.deaths_in_a_row} times in a row with no result (last "
                               f"exit code {self.proc.exitcode}); see the log above for why")
        self.restarts += 1
        log.warning("policy %s: the rollout worker (pid %s) died (exit code %s); restarting "
                    "it and requesting rounds %s again", self.spec.policy, self.proc.pid,
                    self.proc.exitcode, sorted(self.sent))
        self._drop_channels()
        self.early.clear()
        self._start()
        for job in sorted(self.sent.values(), key=lambda j: j.round):
            self.jobs.put(job)

    def _drop_channels(self) -> None:
        """Close the dead worker's queue and pipe (its queue may hold a half-read job, and its
        feeder thread must not hold up the learner's exit)."""
        self.jobs.cancel_join_thread()
        self.jobs.close()
        self.results.close()

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.is_alive():
            self.jobs.put(None)
            self.proc.join(timeout=10)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(timeout=5)
        self._drop_channels()
        self.proc = None


class RolloutSource(Protocol):
    """What rollouts are taken for (a `runtime.session.Session` is one): the learner's model,
    its in-process engine, and round k's request under the allocation in force."""

    model: PreTrainedModel
    engine: RolloutEngine

    def rollout_request(self, k: int, alloc: RoundAllocation) -> RolloutRequest:
        ...


class Rollouts:
    """A policy's source of rollouts: its engine in-process, or its rollout worker (module
    docstring). `take` gives round k's; `publish` follows each optimizer step."""

    def __init__(self, model: torch.nn.Module, max_off_policy_steps: int, rounds: int,
                 worker: bool | str = False, spec: WorkerSpec | None = None,
                 exact: bool = True, dist: Dist = SINGLE) -> None:
        self.model = model
        self.d = max_off_policy_steps
        self.rounds = rounds
        self.start = 0
        """The first round of this start (a resume's): the first rounds sample its weights."""
        self.mode = worker
        self.spec = spec
        self.exact = exact
        self.dist = dist
        self.worker: RolloutWorker | None = None
        self.pending: dict[int, RolloutRequest] = {}
        self.version = 0
        """The learner's weight version now."""
        self.engine_stale = False
        """The in-process engine has not seen the last versions (the worker sampled them)."""
        self.refused = 0
        self.planted: dict[int, RolloutBatch] = {}
        """Results handed in from outside the worker (a test's stale rollout) that `take`
        checks like any other."""
        self.own_threads = self.all_threads = 1
        """The learner's threads while the worker samples, and the round's whole budget (the
        learner's too while the worker waits): `set_threads`."""
        self.hooks: list[RemovableHandle] = []

    # -- the learner's side ----------------------------------------------------------------

    def begin(self, start_round: int) -> None:
        """Training starts at `start_round` (its weights are version `start_round`); a worker
        configured always on starts now, loading the model beside the learner's first work."""
        self.start = self.version = start_round
        if self.mode is True:
            self._ensure_worker()

    def uses_worker(self, alloc: RoundAllocation) -> bool:
        """Whether round rollouts come from the worker under `alloc`."""
        return self.mode is True or (self.mode == "auto" and alloc.rollout_workers >= 1)

    def set_threads(self, alloc: RoundAllocation) -> tuple[int, int]:
        """Set the learner's threads for round `alloc` (its ranks share them) and return the
        round's (learner, worker) split, `threads`."""
        learner, worker = self.threads(alloc)
        world = self.dist.world
        self.own_threads = max(1, learner // world)
        self.all_threads = max(1, max(1, alloc.threads) // world)
        torch.set_num_threads(self.own_threads)
        return learner, worker

    def lend_idle_threads(self) -> None:
        """Between two layers of the learner's forward or backward: take the worker's threads
        while it has nothing to sample, give them back once it samples again."""
        w = self.worker
        if w is None:
            return
        want = self.own_threads if int(w.shared.sampling[0]) else self.all_threads
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def threads(self, alloc: RoundAllocation) -> tuple[int, int]:
        """(learner, worker) threads of the round's `alloc.threads`: with overlap the worker
        takes `alloc.rollout_threads` (default half) and the learner the rest; without, both
        may use all (one waits while the other works)."""
        total = max(1, alloc.threads)
        if not self.uses_worker(alloc) or self.d == 0 or total == 1:
            return total, total
        worker = alloc.rollout_threads or total // 2
        worker = min(max(1, worker), total - 1)
        return total - worker, worker

    def take(self, k: int, alloc: RoundAllocation, s: RolloutSource) -> RolloutBatch:
        """Round k's rollouts, from weights no older than version k - d (in-process: from
        `s.engine`)."""
        if not self.uses_worker(alloc):
            self._drop_pending()
            return self._in_process(s.rollout_request(k, alloc), s.engine)
        worker = self._ensure_worker()
        t0 = time.perf_counter()
        worker_threads = self.threads(alloc)[1]
        if k not in self.pending:
            self._send(s, k, alloc, worker_threads)
        if self.d >= 1 and k + 1 < self.rounds and k + 1 not in self.pending:
            self._send(s, k + 1, alloc, worker_threads)
        while True:
            batch = self.planted.pop(k, None) or self._from_worker(worker, k)
            if batch.version >= k - self.d:
                break
            # never trained on: regenerated from the newest weights
            self.refused += 1
            log.warning("policy %s: round %d's rollouts come from version %d, older than "
                        "the bound k - d = %d; regenerating them", worker.spec.policy, k,
                        batch.version, k - self.d)
            self._send(s, k, alloc, worker_threads, version=self.version)
        self.pending.pop(k, None)
        batch.wait_s = time.perf_counter() - t0
        batch.stats.update({"refused": float(self.refused), "restarts": float(worker.restarts),
                            "stalls": float(worker.stalls),
                            "publish_wait_s": worker.publish_wait_s,
                            "worker_threads": float(worker_threads)})
        return batch

    def publish(self, s: RolloutSource, version: int) -> None:
        """After an optimizer step: `s.model`'s weights are `version` from now on (the
        worker's to load, or synced into the in-process engine)."""
        self.version = version
        if self.worker is not None:
            self.worker.publish(_trainable(s.model), version)
            self.engine_stale = True
            return
        with gathered(s.model):
            s.engine.sync_weights(s.model)

    def settle(self) -> None:
        """Wait until the worker has answered every round requested so far (a benchmark's
        timed round then leaves no sampling running after it)."""
        if self.worker is None:
            return
        for k in sorted(self.pending):
            if k not in self.worker.early and k in self.worker.sent:
                self.worker.early[k] = self.worker.result(k)

    def local_engine(self, engine: RolloutEngine) -> RolloutEngine:
        """The in-process `engine`, synced to the learner's weights (evaluation)."""
        if self.engine_stale:
            with gathered(self.model):
                engine.sync_weights(self.model)  # type: ignore[arg-type]
            self.engine_stale = False
        return engine

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    # -- helpers ---------------------------------------------------------------------------

    def _ensure_worker(self) -> RolloutWorker:
        if self.worker is None:
            if self.spec is None:
                raise ValueError("a rollout worker needs the policy's WorkerSpec")
            self.worker = RolloutWorker(self.spec, _trainable(self.model), max(1, self.d))
            self.worker.publish(_trainable(self.model), self.version)
            if self.lends_threads() and not self.hooks:
                self.hooks = between_layers(self.model, self.lend_idle_threads)
        return self.worker

    def lends_threads(self) -> bool:
        """Whether an idle worker's threads go to the update: on a CPU, one process, in the
        asynchronous mode (a float sum may depend on the thread count, so the deterministic
        mode keeps the split fixed: a seed replays bit for bit)."""
        return (not self.exact and self.dist.world == 1 and self.spec is not None
                and self.spec.device.startswith("cpu"))

    def _send(self, s: RolloutSource, k: int, alloc: RoundAllocation, threads: int,
              version: int | None = None) -> None:
        assert self.worker is not None
        req = s.rollout_request(k, alloc)
        self.pending[k] = req
        want = max(self.start, k - self.d) if version is None else version
        self.worker.send(_Job(k, req.rendered, req.n, req.max_new_tokens, req.sampling,
                              req.seeds, want, self.exact, threads))

    def _from_worker(self, worker: RolloutWorker, k: int) -> RolloutBatch:
        r = worker.take_early(k) or worker.result(k)
        return RolloutBatch(self.pending[k].prompts, r.samples, r.version, r.seconds, 0.0,
                            dict(r.stats))

    def _drop_pending(self) -> None:
        """Rounds requested from a worker the allocation no longer grants are sampled
        in-process instead: their results, when they come, are not waited for."""
        if self.worker is not None and self.pending:
            self.worker.close()
            self.worker = None
        self.pending.clear()

    def _in_process(self, req: RolloutRequest, engine: RolloutEngine) -> RolloutBatch:
        d = self.dist
        t0 = time.perf_counter()
        mine = d.block(len(req.rendered))
        engine = self.local_engine(engine)
        with torch.no_grad(), gathered(self.model):
            part = engine.generate([req.rendered[i] for i in mine], n=req.n,
                                   max_new_tokens=req.max_new_tokens,
                                   seeds=[req.seeds[i] for i in mine], **req.sampling)
        samples = [row for rank_rows in d.all_gather(part) for row in rank_rows]
        # An engine sharing the GPU gives its memory to the step; the weight sync takes it back.
        engine.release_memory()
        seconds = time.perf_counter() - t0
        return RolloutBatch(req.prompts, samples, self.version, seconds, seconds,
                            dict(engine.stats()))


def between_layers(model: torch.nn.Module, fn: Callable[[], None]) -> list[RemovableHandle]:
    """Call `fn` before each layer of `model`'s layer stacks (its `ModuleList`s) runs forward,
    and in a backward when the gradient reaches that layer's input: the points where a long
    forward or backward can change its thread count. Returns the hooks' handles."""

    def before(_m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        fn()
        for x in (*args, *kwargs.values()):
            if isinstance(x, Tensor) and x.requires_grad:
                x.register_hook(lambda _grad: fn())  # returns None: the gradient is unchanged
                break

    return [layer.register_forward_pre_hook(before, with_kwargs=True)
            for stack in model.modules() if isinstance(stack, torch.nn.ModuleList)
            for layer in stack]


def _trainable(model: torch.nn.Module) -> dict[str, Tensor]:
    """The parameters an optimizer step changes (a LoRA policy's adapters; every weight
    otherwise): what the worker needs each version of."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def worker_spec(policy: str, start: Path, dtype: str, device: str, lora: LoraSettings | None,
                engine: str, engine_kwargs: dict[str, Any], threads: int,
                stall_s: float) -> WorkerSpec:
    """The worker's recipe from the learner's (engine keywords as the learner's engine got
    them)."""
    return WorkerSpec(policy, str(start), dtype, device, lora, engine, dict(engine_kwargs),
                      threads, stall_s)


def round_request(task: Task, render: Callable[[Sequence[Prompt]], list[list[int]]],
                  g: GRPOSettings, seed: int, max_new_tokens: int, k: int,
                  alloc: RoundAllocation) -> RolloutRequest:
    """Round k's request: the shared order's prompts the allocation's rollout budget holds,
    in this policy's rendering, sampled with the run's knobs and per-prompt seeds."""
    n_prompts = max(1, min(g.prompts_per_round, alloc.rollout_budget // g.group_size))
    prompts = task.round_prompts(k, g.prompts_per_round, seed)[:n_prompts]
    sampling = {"temperature": g.temperature, "top_p": g.top_p, "top_k": g.top_k,
                "min_p": g.min_p, "stop": task.stop}
    return RolloutRequest(k, prompts, render(prompts), g.group_size, max_new_tokens, sampling,
                          [prompt_seed(seed, k, i) for i in range(len(prompts))])

"""The training loop of one policy: one round = rollouts, then `mini_batches` x `epochs`
optimizer steps.

    allocation (MWRA) -> prompts of round k (shared order) -> rollouts -> rewards
    -> publish (SEE) -> what the probe needs (SEE, THL; deadline -> GRPO) -> loss over
    micro-batches -> AdamW steps (grad clip) -> lr schedule -> cost without waits (MWRA)
    -> metrics -> checkpoint

Rollouts come from `runtime/rollouts.py`: the trainer's engine in-process, or a rollout
worker that sampled round k beside round k - 1's update from weights no older than version
k - d (`grpo.max_off_policy_steps`); each optimizer step publishes the next version to it.

In the deterministic mode with staleness s >= 1, the probe's read of the peers' round k - s
starts before round k's rollouts and runs beside them, and publishing runs in the background
(docs/determinism.md).

Data parallel (`distributed.py`): each rank samples its block of the prompts, the samples are
gathered on every rank, rank 0 alone talks to MWRA/SEE/THL and broadcasts what it learns
(allocation, the probe's plan), and each rank scores its share of every mini-batch's rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mutualrl.trainer.data.dataset_task import score_round
from mutualrl.trainer.data.evaluation import run_benchmark
from mutualrl.trainer.runtime import diagnostics
from mutualrl.trainer.runtime.distributed import gathered
from mutualrl.trainer.runtime.metrics import peak_rss_mib
from mutualrl.trainer.runtime.session import Session
from mutualrl.trainer.runtime.step import optimise
from mutualrl.trainer.sharing.exchange import round_records
from mutualrl.trainer.sharing.probes import RoundData


def run_round(s: Session, k: int) -> dict[str, float]:
    """Train one round; returns its metrics."""
    t0 = time.perf_counter()
    waited0 = waited_s(s)
    g = s.cfg.grpo
    d = s.dist

    if s.exchange is not None:
        s.exchange.flush()  # the last round's records are out (a failed publish raises)
        s.probe.prefetch(k)  # deterministic, s >= 1: read peers' round k - s meanwhile
    alloc = d.from_main(lambda: s.allocator.allocation(k))
    # MWRA's threads are the policy's: its ranks share them (and its rollout worker).
    on_worker = s.rollouts.uses_worker(alloc)
    _, worker_threads = s.rollouts.set_threads(alloc)
    # each policy samples from its own rendering of the problem; with a rollout worker and
    # d >= 1 they were sampled beside the last update, from weights no older than k - d
    batch = s.rollouts.take(k, alloc, s)
    prompts, samples, version = batch.prompts, batch.samples, batch.version
    t_rollout = time.perf_counter() - t0
    scored = score_round(s.task, prompts, samples, s.cfg.probe.tau)
    rewards, correct = torch.tensor(scored.rewards), scored.correct

    published = True
    if s.exchange is not None:  # policy version = optimizer rounds taken when sampled
        # What crosses is the problem and the completion text; peers render it their own way.
        records = round_records(
            s.cfg.run_id, s.policy.name, version, k, s.tokenizer_id, prompts, samples,
            scored.rewards, correct, s.cfg.probe.tau, s.tokenizer.eos_token_id,
            success=scored.success, renderings=s.shown(prompts))
        if s.probe.deterministic:
            s.exchange.publish_soon(records)
        else:
            published = s.exchange.publish(records)

    data = RoundData(round=k, prompts=prompts, samples=samples, rewards=rewards,
                     correct=correct, peers_now=alloc.round_peers, policy_version=version,
                     success=None if scored.success is None else torch.tensor(scored.success))
    t1 = time.perf_counter()
    plan = d.from_main(lambda: s.probe.plan(data))
    t_probe = time.perf_counter() - t1

    # as the engine conditioned; then an earlier round's whose peer rows join this one
    prompt_ids = [row[0].prompt_token_ids for row in samples] + plan.extra_prompts
    t2 = time.perf_counter()
    with gathered(s.model):  # rank 0 measures alone: its forwards must not wait for others
        # before the step; no gradient
        diag = diagnostics.measure(s, k, data, plan, prompt_ids) if d.main else {}
    if diag:
        diag["diag_s"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    update = optimise(s.model, s.ref_model, s.optimizer, prompt_ids, data, plan, s.step_settings())
    s.scheduler.step()
    t_update = time.perf_counter() - t3
    s.rollouts.publish(s, k + 1)  # the engine's or the worker's from now on

    step_s = time.perf_counter() - t0
    wait_s = waited_s(s) - waited0  # for a time-share turn, for peers, up to a deadline
    n_tokens = sum(len(y.token_ids) for row in samples for y in row)
    if d.main:
        s.allocator.report(k, step_s - wait_s, n_tokens, len(prompts) * g.group_size,
                           rollout_s=batch.generate_s, update_s=t_update)
    return {
        "reward_mean": float(rewards.mean()),
        "pass_rate": float(sum(map(sum, correct)) / rewards.numel()),
        "lr": float(s.scheduler.get_last_lr()[0]),
        "step_s": step_s,
        "wait_s": wait_s,
        "cost_s": step_s - wait_s,
        "rollout_s": t_rollout,
        "generate_s": batch.generate_s,
        "update_s": t_update,
        "policy_version": float(version),
        "off_policy_lag": float(k - version),
        "probe_s": t_probe,
        "tokens_per_s": n_tokens / step_s,
        "threads": float(alloc.threads),
        "rollout_workers": float(on_worker),
        "rollout_threads": float(worker_threads if on_worker else 0),
        # what sampling and the update ran side by side: their sum past the round's work
        "overlap_s": max(0.0, batch.generate_s + t_update - (step_s - wait_s)),
        "peak_rss_mib": peak_rss_mib(),
        "publish_failed": float(not published),
        "data/dropped_overlong": float(getattr(s.task, "dropped_overlong", 0)),
        **{f"rollout/{k}": v for k, v in batch.stats.items()},
        **scored.stats,
        **plan.stats,
        **update.stats,
        **diag,
    }


def waited_s(s: Session) -> float:
    """Seconds this trainer has spent waiting on others so far: time-share turns (MWRA) and
    bounded waits for peers' rounds (SEE). MWRA's cost is the round's time without them."""
    return s.allocator.waited_s + (s.exchange.waited_s if s.exchange is not None else 0.0)


@torch.no_grad()
def evaluate(s: Session) -> dict[str, float]:
    """Greedy held-out reward@1 per skill (the same fixed problems for every run), then every
    benchmark's avg@n and pass@k; data parallel: each rank answers its block of the problems."""
    res: dict[str, float] = {}
    prompts = s.task.prompts("heldout", s.cfg.eval.per_skill * len(s.task.skills))
    if prompts:
        mine = s.dist.block(len(prompts))
        with gathered(s.model):
            part = s.rollouts.local_engine(s.engine).generate(
                s.render([prompts[i] for i in mine]), n=1, max_new_tokens=s.max_new_tokens,
                temperature=0.0, stop=s.task.stop)
        out = [row for rows in s.dist.all_gather(part) for row in rows]
        per: dict[str, list[float]] = {}
        for p, (y,) in zip(prompts, out, strict=True):
            per.setdefault(p.skill, []).append(s.task.reward(p, y.text, y.finish_reason))
        res = {f"heldout/{k}": sum(v) / len(v) for k, v in per.items()}
        res["heldout/mean"] = sum(res.values()) / len(res)
    for bench, task in s.benchmarks:
        with gathered(s.model):
            res.update(run_benchmark(bench, task, s.renderer, s.rollouts.local_engine(s.engine),
                                     s.dist, s.max_new_tokens, s.cfg.probe.tau, s.cfg.seed))
    return res


def train(s: Session, rounds: int | None = None,
          stop_requested: Callable[[], bool] = lambda: False) -> dict[str, float]:
    """Run rounds start_round .. `rounds` (default: the config's); returns the last metrics.

    `stop_requested` is polled between rounds (never mid-round): when it turns true the round
    just finished is checkpointed and training ends, so `--resume` continues exactly there.
    """
    total = rounds if rounds is not None else s.cfg.grpo.rounds
    s.rollouts.rounds = total  # a rollout worker samples no round past the last
    ev, ck = s.cfg.eval.every, s.cfg.checkpoint.every
    metrics: dict[str, float] = {}
    if s.exchange is not None:  # a wait for peers it can do without ends when asked to stop
        s.exchange.stop_requested = stop_requested
    before = evaluate_before(s)  # the start of start -> final, logged with round 0
    for k in range(s.start_round, total):
        metrics = {**before, **run_round(s, k)}
        before = {}
        done = k + 1
        if ev and (done % ev == 0 or done == total):
            metrics.update(evaluate(s))
        s.metrics.log(k, metrics)
        stopping = s.dist.any(stop_requested())  # every rank stops after the same round
        if (ck and done % ck == 0) or done == total or stopping:
            s.save(done)
        if stopping:
            break
    if s.exchange is not None:
        s.exchange.flush()
    s.allocator.leave()  # MWRA hands this policy's threads to the peers still training
    return metrics


def evaluate_before(s: Session) -> dict[str, float]:
    """The evaluation before the first update, as `start/<metric>` (empty when evaluation is
    off, and on a resumed run: round 0's row holds it already)."""
    if s.start_round > 0 or not s.cfg.eval.every:
        return {}
    return {f"start/{k}": v for k, v in evaluate(s).items()}

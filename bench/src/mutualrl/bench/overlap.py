"""`mutualrl bench rounds --overlap`: one policy's round time with its rollouts in-process
against a rollout worker sampling round k + 1 beside round k's update (d = 1), at the same
total thread budget (in-process: `threads` for both phases; with the worker: half of them
each, the learner and the worker).

Cases: the demo's policies (GPT-2 + byte BPE, Llama + characters: 16 prompts x 8 samples of
the short regime's 6 tokens), and a ~10 M Llama (`llama-10m`) whose rollouts and update take
about as long at one thread each, the split a worker runs with on two (`balanced`: 4 prompts
x 8 samples of 96 tokens). Each policy trains alone, no
services, probe `none`, the asynchronous exchange mode. Runs alternate in-process / worker per
repeat so load drift hits both; a run's round time is the median over its rounds after the
first `skip` (the worker's start, warm-up). ratio = in-process round time / worker round time
(rounds per second against the in-process anchor); the split says where an in-process round
went (rollouts, update) and how long the worker sampled one round.

The attainable ratio comes from measured phases too: a third side runs in-process on the
worker's and the learner's share of the threads, which gives sampling S on the worker's
threads and the update U_l on the learner's; with the anchor's update U_all on all threads,
the worker's schedule (sample beside the update, then lend its threads) cannot beat
`attainable_round_s`. The measured ratio's distance to it is what the two processes cost
each other; a target above it is out of reach of this schedule on these cores. And no
schedule at all beats `work_bound_round_s`: each phase at least its fastest measured time,
both together at least their least measured core-seconds spread over every core.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CASES: dict[str, dict[str, Any]] = {
    "demo-gpt2-bpe": {"preset": "gpt2-bpe", "prompts": 16, "group": 8, "new_tokens": None},
    "demo-llama-char": {"preset": "llama-char", "prompts": 16, "group": 8, "new_tokens": None},
    "balanced-llama-10m": {"preset": "llama-10m", "prompts": 4, "group": 8, "new_tokens": 96},
}


def attainable_round_s(sampling_s: float, update_learner_s: float, update_all_s: float,
                       lend: bool = True) -> float:
    """The shortest overlapped round the measured phases allow: the worker samples for
    `sampling_s` on its threads while the update runs on the learner's (`update_learner_s`
    for a whole update); once sampling ends, the rest of the update runs on all threads
    (`update_all_s` for a whole one) if the idle worker lends its threads (`lend`) and that
    is faster, else on the learner's. Ignores what the two processes cost each other (caches,
    memory bandwidth), so a measured round can only be longer."""
    if sampling_s >= update_learner_s:
        return sampling_s
    rest = min(update_all_s, update_learner_s) if lend else update_learner_s
    return sampling_s + (1.0 - sampling_s / update_learner_s) * rest


def work_bound_round_s(sampling_s: Mapping[int, float], update_s: Mapping[int, float],
                       cores: int) -> float:
    """A lower bound on any schedule of one round's sampling and update on `cores` cores,
    from each phase's time at the measured thread counts (threads -> seconds): neither phase
    ends sooner than its fastest time, and their work, each at its most efficient measured
    count (least time x threads), fills at least that many core-seconds."""
    fastest = max(min(sampling_s.values()), min(update_s.values()))
    work = (min(t * n for n, t in sampling_s.items())
            + min(t * n for n, t in update_s.items()))
    return max(fastest, work / cores)


def _config(out: Path, case: dict[str, Any], worker: bool, rounds: int, threads: int,
            seed: int) -> Any:
    from mutualrl.trainer.config.run import TrainerConfig

    grpo: dict[str, Any] = {"group_size": case["group"], "prompts_per_round": case["prompts"],
                            "rounds": rounds, "lr": 3e-4,
                            "max_off_policy_steps": 1 if worker else 0}
    if case["new_tokens"]:
        grpo["max_new_tokens"] = case["new_tokens"]
    return TrainerConfig.model_validate({
        "run_id": "overlap", "seed": seed, "output_dir": str(out),
        "services": {"local": True}, "exchange": {"mode": "asynchronous"},
        "task": {"regime": "short", "skills": ["add", "sub", "rev", "sort"]},
        "grpo": grpo, "probe": {"kind": "none"},
        "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "p", "preset": case["preset"], "threads": threads,
                      "rollout_worker": worker}]})


def one_run(case: dict[str, Any], worker: bool, rounds: int, skip: int, threads: int,
            cache: Path, seed: int = 0) -> dict[str, float]:
    """Median round time of one run and the means of its phases (after `skip` rounds)."""
    import torch

    from mutualrl.trainer.runtime.loop import run_round
    from mutualrl.trainer.runtime.session import build_session

    out = Path(tempfile.mkdtemp(prefix="mutualrl-overlap-"))
    s = build_session(_config(out, case, worker, rounds, threads, seed), "p", cache_dir=cache)
    s.rollouts.rounds = rounds
    times: list[float] = []
    rows: list[dict[str, float]] = []
    try:
        for k in range(rounds):
            t0 = time.perf_counter()
            rows.append(run_round(s, k))
            times.append(time.perf_counter() - t0)
    finally:
        s.close()
        torch.set_num_threads(threads)
    kept = rows[skip:]

    def mean(key: str) -> float:
        return statistics.fmean(r.get(key, 0.0) for r in kept)

    return {"round_s": statistics.median(times[skip:]), "rollout_s": mean("rollout_s"),
            "generate_s": mean("generate_s"), "update_s": mean("update_s"),
            "lag": mean("off_policy_lag")}


def bench_overlap(cases: list[str], rounds: int = 8, skip: int = 2, repeats: int = 3,
                  threads: int = 2, cache_dir: Path | None = None) -> dict[str, Any]:
    """Every case's in-process and worker round times, `repeats` alternating pairs."""
    from mutualrl.trainer.runtime.presets import ensure_preset, n_params
    from mutualrl.trainer.runtime.presets import load_policy as _load

    cache = cache_dir or Path(tempfile.mkdtemp(prefix="mutualrl-presets-"))
    result: dict[str, Any] = {
        "benchmark": "rounds-overlap", "threads": threads, "rounds": rounds, "skip": skip,
        "repeats": repeats, "max_off_policy_steps": 1,
        "anchor": "the same policy with its rollouts in-process, same threads, alternating "
                  "run by run", "load_before": os.getloadavg()[0], "cases": {}}
    for name in cases:
        case = CASES[name]
        model, _ = _load(ensure_preset(case["preset"], cache, 0))
        # the worker's and the learner's share of `threads`, as `Rollouts.threads` splits them
        worker_t = max(1, threads // 2)
        learner_t = max(1, threads - worker_t)
        shares = sorted({worker_t, learner_t})
        runs: dict[str, list[dict[str, float]]] = {"in_process": [], "worker": [],
                                                   **{f"in_process_{t}t": [] for t in shares}}
        for _ in range(repeats):
            runs["in_process"].append(one_run(case, False, rounds, skip, threads, cache))
            runs["worker"].append(one_run(case, True, rounds, skip, threads, cache))
            for t in shares:
                runs[f"in_process_{t}t"].append(one_run(case, False, rounds, skip, t, cache))

        def med(side: str, key: str, runs: dict[str, list[dict[str, float]]] = runs
                ) -> float:
            return statistics.median(r[key] for r in runs[side])

        inp, wk = med("in_process", "round_s"), med("worker", "round_s")
        # each phase's in-process time by thread count
        sides = {**{t: f"in_process_{t}t" for t in shares}, threads: "in_process"}
        rollout = {t: med(side, "rollout_s") for t, side in sides.items()}
        update = {t: med(side, "update_s") for t, side in sides.items()}
        sampling, u_learner, u_all = rollout[worker_t], update[learner_t], update[threads]
        phases = {"sampling_s": sampling, "update_learner_s": u_learner, "update_all_s": u_all}
        best = attainable_round_s(sampling, u_learner, u_all)
        fixed = attainable_round_s(sampling, u_learner, u_all, lend=False)
        any_schedule = work_bound_round_s(rollout, update, threads)
        result["cases"][name] = {
            "preset": case["preset"], "params": n_params(model),
            "prompts": case["prompts"], "group": case["group"],
            "in_process_round_s": inp, "worker_round_s": wk, "ratio": inp / wk,
            "attainable": {"threads": {"worker": worker_t, "learner": learner_t},
                           **phases, "round_s": best, "ratio": inp / best,
                           "ratio_fixed_split": inp / fixed,
                           "any_schedule_round_s": any_schedule,
                           "ratio_any_schedule": inp / any_schedule,
                           "update_speedup": u_learner / u_all},
            "in_process_split": {"rollout_s": med("in_process", "rollout_s"),
                                 "update_s": med("in_process", "update_s")},
            "worker_split": {"generate_s": med("worker", "generate_s"),
                             "wait_for_rollouts_s": med("worker", "rollout_s"),
                             "update_s": med("worker", "update_s"),
                             "lag": med("worker", "lag")},
            "runs": runs}
    result["load_after"] = os.getloadavg()[0]
    return result

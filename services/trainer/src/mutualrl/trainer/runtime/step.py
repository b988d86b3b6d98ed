"""The round's optimisation, memory-bounded: the loss of `algos/loss.py` (docs/design.md
(8)) taken over micro-batches with gradient accumulation, in mini-batches and epochs.

Every loss the trainer optimises is a sum over rows of per-token values times a per-row
coefficient that depends on the whole mini-batch (`loss.row_coefficients`: the aggregation's
denominator, SGT's per-prompt averaging; the entropy bonus's token count). The coefficients are
fixed before any forward pass, so summing the micro-batches' losses gives the mini-batch's loss
exactly, whatever the split: token-mean denominators are global, never per micro-batch. A row
is never split, so GSPO's sequence ratio sees all of its tokens.

Rows are own samples and peer rows (PRP, HACPO, SAPO, F-TIS: the policy-gradient rows) and
SGT's demonstrations. `logp_old`, the ratio's denominator, is the pre-update log-prob of each
row (or the sampler's with `ratio_to_behaviour`), taken once before the first update, so the
clip acts from the second mini-batch on. The peer method's row weights (`algos.methods`: PRP's
importance weights, HACPO's capability ratios, F-TIS's truncated weights and KL gate) use the
same pre-update log-probs; a method with a token loss of its own (HACPO) computes its peer rows'
per-token values with it, own rows always with GRPO's.

Data parallel (`dist`): the coefficients are the whole mini-batch's, so the ranks may split its
rows any way: each scores a contiguous block of them, pre-update log-probs are summed over the
ranks (each fills its rows), and each backpropagates `world x` its part, which FSDP's mean over
ranks turns into the sum. A sharded model needs every rank to run the same number of forward
and backward passes, so ranks with fewer micro-batches run masked-out ones (`_lockstep`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mutualrl.trainer.algos.loss import (
    EPS,
    nonzero_variance_groups,
    row_coefficients,
    token_loss,
)
from mutualrl.trainer.algos.methods import METHODS, PeerSettings, splice
from mutualrl.trainer.algos.offpolicy import behaviour_weights
from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
from mutualrl.trainer.model.batch import completion_logprobs, completion_logprobs_and_entropy, pack
from mutualrl.trainer.runtime.distributed import SINGLE, Dist, block
from mutualrl.trainer.sharing.probes.base import LossInputs, RoundData


@dataclass(frozen=True)
class StepSettings:
    """What the round's updates need besides the round itself, fixed for a run: the loss's
    knobs and how rows are batched (`grpo`), the peer methods' knobs, SGT's lambda, the padding
    token, the completion budget (`constant_length`'s constant), the data-parallel ranks and
    the compute dtype."""

    grpo: GRPOSettings
    weights: PeerSettings
    """The peer methods' knobs (PRP's importance weights, HACPO, SAPO, F-TIS:
    `ProbeSettings` has them)."""
    sgt_lambda: float
    """Weight of SGT's demonstration term (docs/design.md (7))."""
    pad_id: int
    max_len: int
    """The completion token budget."""
    dist: Dist = SINGLE
    compute: torch.dtype | None = None
    """The dtype forward passes autocast to (mixed precision; None: the parameters' own)."""

    @classmethod
    def of(cls, grpo: GRPOSettings, probe: ProbeSettings, pad_id: int, max_len: int,
           dist: Dist = SINGLE, compute: torch.dtype | None = None) -> StepSettings:
        """The step's settings from the run's `grpo` and `probe` sections."""
        return cls(grpo, probe, probe.sgt_lambda, pad_id, max_len, dist, compute)


@dataclass
class Rows:
    """A round's rows, completions right-padded to a common T (masks say what is real)."""

    prompts: list[Sequence[int]]
    completions: list[Sequence[int]]
    advantages: Tensor
    """[N] advantage (policy-gradient rows; 0 for demonstrations)."""
    mask: Tensor
    """[N, T] 1 on the tokens that enter the loss (filtered groups, dropped peers: 0)."""
    weights: Tensor
    """[N, T] PRP importance weights (1 for own rows)."""
    demo: Tensor
    """[N] bool: an SGT demonstration (NLL term) rather than a policy-gradient row."""
    group: Tensor
    """[N] SGT's prompt label of a demonstration (-1 otherwise)."""
    own: Tensor
    """[N] bool: one of this policy's samples."""
    logp_old: Tensor | None = None
    """[N, T] pre-update log-probs (None: the detached current ones, one update per round)."""
    ref_logp: Tensor | None = None
    """[N, T] reference log-probs (beta > 0)."""
    peer_method: str = "prp"
    """The function set of `algos.methods.METHODS` the peer rows are trained with."""
    behaviour: Tensor | None = None
    """[N, T] the sender's log-probs as the peer method's token loss takes them (HACPO);
    None when it has no token loss of its own."""
    rescue: Tensor | None = None
    """[N] bool: a peer row that is a verified success on a prompt this policy failed (the
    row class the gradient diagnostic splits by); None without peer rows."""
    lag_behaviour: Tensor | None = None
    """[N, T] the sampler's log-probs of own rows sampled by older weights (0 elsewhere), when
    their correction is taken from the update's own forward (see `prepare`)."""

    def __len__(self) -> int:
        return len(self.completions)

    def width(self, i: int) -> int:
        """Tokens row i takes in a batch: prompt + completion."""
        return len(self.prompts[i]) + len(self.completions[i])


@dataclass
class StepResult:
    """What a round's updates did."""

    stats: dict[str, float]
    updates: list[dict[str, float]] = field(default_factory=list)
    """Per optimizer step (mini-batch x epoch, in order): loss, clip_frac, approx_kl, ..."""


def round_rows(prompt_ids: Sequence[Sequence[int]], data: RoundData, plan: LossInputs,
               grpo: GRPOSettings) -> tuple[Rows, dict[str, float]]:
    """Own samples, peer rows and demonstrations of a round as one table (before weights)."""
    p_n, g_n = data.rewards.shape
    own = [s for row in data.samples for s in row]
    prompts: list[Sequence[int]] = [prompt_ids[p] for p in range(p_n) for _ in range(g_n)]
    completions: list[Sequence[int]] = [s.token_ids for s in own]
    adv = [float(a) for a in plan.advantages.reshape(-1)]
    keep = [1.0] * len(own)
    stats: dict[str, float] = {}
    if grpo.filter_zero_variance:
        # Equal own rewards carry no signal under the group's own baseline, but a shared one
        # (HACPO's, XGRPO's) can give them one: a group goes only when its advantages are 0 too.
        nz = nonzero_variance_groups(data.rewards) | (
            plan.advantages.abs() > EPS).any(-1, keepdim=True)
        keep = [float(v) for v in nz.reshape(-1)]
        stats["filtered_groups"] = float(p_n - int(nz[:, 0].sum()))
    groups = [-1] * len(own)
    peers = plan.peers
    if peers is not None and len(peers.token_ids):
        prompts += [prompt_ids[i] for i in peers.prompt_index]
        completions += peers.token_ids
        adv += [float(a) for a in peers.advantages]
        keep += [1.0] * len(peers.token_ids)
        groups += [-1] * len(peers.token_ids)
    n_pg = len(completions)
    rescue = None
    if peers is not None and peers.rescue is not None and len(peers.token_ids):
        rescue = torch.zeros(n_pg, dtype=torch.bool)
        rescue[len(own):] = peers.rescue.to(torch.bool)
    demos = plan.demos
    if demos is not None and demos.token_ids:
        prompts += (demos.prompt_token_ids or [prompt_ids[i] for i in demos.prompt_index])
        completions += demos.token_ids
        adv += [0.0] * len(demos.token_ids)
        keep += [1.0] * len(demos.token_ids)
        groups += list(demos.prompt_index)
    n = len(completions)
    t = max(max((len(c) for c in completions), default=1), 1)
    mask = torch.zeros(n, t, dtype=torch.float64)
    for i, c in enumerate(completions):
        mask[i, : len(c)] = keep[i]
    return Rows(
        prompts=prompts, completions=completions,
        advantages=torch.tensor(adv, dtype=torch.float64), mask=mask,
        weights=torch.ones(n, t, dtype=torch.float64),
        demo=torch.arange(n) >= n_pg, group=torch.tensor(groups, dtype=torch.long),
        own=torch.arange(n) < len(own),
        peer_method=peers.method if peers is not None else "prp",
        rescue=None if rescue is None else torch.cat(
            [rescue, torch.zeros(n - n_pg, dtype=torch.bool)])), stats


def micro_batches(rows: Rows, index: Sequence[int], budget: int) -> list[list[int]]:
    """Rows `index` in micro-batches whose padded size (rows x (longest prompt + longest
    completion)) stays within `budget` tokens; rows are taken shortest first, which keeps
    padding low and does not change the sums."""
    out: list[list[int]] = []
    cur: list[int] = []
    lp = lc = 0
    for i in sorted(index, key=lambda j: (len(rows.completions[j]), len(rows.prompts[j]), j)):
        if rows.width(i) > budget:
            raise ValueError(
                f"grpo.micro_batch_tokens={budget} cannot hold one row of {rows.width(i)} "
                f"tokens (prompt {len(rows.prompts[i])} + completion "
                f"{len(rows.completions[i])}); raise grpo.micro_batch_tokens")
        nlp, nlc = max(lp, len(rows.prompts[i])), max(lc, len(rows.completions[i]))
        if cur and (len(cur) + 1) * (nlp + nlc) > budget:
            out.append(cur)
            cur, nlp, nlc = [], len(rows.prompts[i]), len(rows.completions[i])
        cur.append(i)
        lp, lc = nlp, nlc
    if cur:
        out.append(cur)
    return out


def mini_batches(rows: Rows, n: int) -> list[list[int]]:
    """`n` near-equal parts of the rows, each taking a contiguous share of own rows (prompt
    groups stay together), of peer rows and of demonstrations; empty parts are left out."""
    parts: list[list[int]] = [[] for _ in range(n)]
    kinds = (rows.own, ~rows.own & ~rows.demo, rows.demo)
    for kind in kinds:
        idx = torch.nonzero(kind).reshape(-1)
        for j, chunk in enumerate(torch.tensor_split(idx, n)):
            parts[j] += [int(i) for i in chunk]
    return [p for p in parts if p]


def score(model: torch.nn.Module, rows: Rows, index: Sequence[int], st: StepSettings,
          device: torch.device) -> Tensor:
    """[N, T] log-probs of rows `index` under `model` at the sampling temperature, no
    gradient, micro-batched, the batches on `device` (data parallel: each rank scores its
    block, every rank gets all)."""
    out = torch.zeros_like(rows.mask)
    if not index:  # e.g. the sampler's ratio alone, no peer rows: nothing to score
        return out
    grpo = st.grpo
    with torch.no_grad(), _autocast(grpo, device, st.compute):
        for mb, real in _lockstep(rows, index, grpo.micro_batch_tokens, st.dist):
            batch = pack([rows.prompts[i] for i in mb], [rows.completions[i] for i in mb],
                         st.pad_id, device)
            lp = completion_logprobs(model, batch, grpo.temperature, grpo.logit_chunk_tokens)
            if real:
                out[mb, : lp.shape[1]] = lp.to(out)
    return st.dist.sum(out)


def _lockstep(rows: Rows, index: Sequence[int], budget: int, dist: Dist
              ) -> list[tuple[list[int], bool]]:
    """This rank's micro-batches of its block of `index`, padded with masked-out ones
    (`real` False: one row, no effect) to the count of the rank with the most."""
    index = list(index)
    parts = [[index[i] for i in block(len(index), r, dist.world)] for r in range(dist.world)]
    mbs = [micro_batches(rows, part, budget) for part in parts]
    most = max(len(m) for m in mbs)
    mine = [(mb, True) for mb in mbs[dist.rank]]
    return mine + [([index[0]], False)] * (most - len(mine))


def prepare(model: torch.nn.Module, ref_model: torch.nn.Module | None, rows: Rows,
            data: RoundData, plan: LossInputs, st: StepSettings) -> dict[str, float]:
    """Everything fixed before the first update: logp_old (when more than one update or a
    sampler ratio needs it), reference log-probs, the peer method's row weights; returns the
    weights' stats."""
    grpo = st.grpo
    device = next(model.parameters()).device  # the reference's too (a LoRA base owns none)
    pg = [i for i in range(len(rows)) if not rows.demo[i]]
    peer = [i for i in pg if not rows.own[i]]
    several = grpo.mini_batches * grpo.epochs > 1
    # Own rows sampled by older weights: corrected against the current ones (exactly 1 when
    # the round's own weights sampled them, so nothing is computed then).
    lagging = (data.policy_version is not None and data.policy_version < data.round
               and grpo.off_policy_correction != "none")
    # With one update a round the weights it starts from are the ones its forward runs, so
    # truncated IS takes the current log-probs from that forward instead of a pass of its
    # own (a quarter of a rollout worker's update); masking changes which tokens count,
    # which the loss's coefficients need before the first micro-batch, so it keeps the pass.
    fused = (lagging and not several and not grpo.ratio_to_behaviour
             and grpo.off_policy_correction == "tis")
    scored_lag = lagging and not fused
    if fused:
        own = torch.nonzero(rows.own).reshape(-1)
        rows.lag_behaviour = torch.zeros_like(rows.mask)
        rows.lag_behaviour[own] = behaviour_logprobs(data, rows.mask)
    stats: dict[str, float] = {}
    if several or peer or grpo.ratio_to_behaviour or scored_lag:
        # Demonstrations need none: their term is a plain log-likelihood, no ratio.
        old = score(model, rows, pg if several or scored_lag else peer, st, device)
        if peer:
            assert plan.peers is not None
            prep = METHODS[rows.peer_method].weights(old[peer], rows.mask[peer], plan.peers,
                                                     st.weights)
            rows.weights[peer] = prep.weights.to(rows.weights)
            rows.mask[peer] = prep.keep.to(rows.mask)
            if prep.behaviour is not None:
                rows.behaviour = torch.zeros_like(rows.mask)
                rows.behaviour[peer] = prep.behaviour.to(rows.behaviour)
            stats.update({k: float(v) for k, v in prep.stats.items()})
        if scored_lag:
            stats.update(correct_lag(rows, old, data, grpo))
        if grpo.ratio_to_behaviour:
            for i, s in enumerate(c for row in data.samples for c in row):
                old[i] = 0.0
                old[i, : len(s.logprobs)] = torch.tensor(s.logprobs, dtype=old.dtype)
        rows.logp_old = old if several or grpo.ratio_to_behaviour else None
    if ref_model is not None and grpo.beta > 0:
        rows.ref_logp = score(ref_model, rows, pg, st, device)
    return stats


def behaviour_logprobs(data: RoundData, like: Tensor) -> Tensor:
    """[n_own, T] the sampler's log-probs of the round's own rows (`Sample.logprobs`), zero
    padded to `like`'s width."""
    own = [c for row in data.samples for c in row]
    out = torch.zeros(len(own), like.shape[1], dtype=like.dtype)
    for i, c in enumerate(own):
        out[i, : len(c.logprobs)] = torch.tensor(c.logprobs, dtype=like.dtype)
    return out


def correct_lag(rows: Rows, current: Tensor, data: RoundData, grpo: GRPOSettings
                ) -> dict[str, float]:
    """Weight (and, `mis`, mask) the own rows sampled by older weights: the correction of
    `algos.offpolicy` between `current` log-probs and the sampler's; returns its stats."""
    own = torch.nonzero(rows.own).reshape(-1)
    corr = behaviour_weights(current[own], behaviour_logprobs(data, current), rows.mask[own],
                             grpo)
    rows.weights[own] = rows.weights[own] * corr.weights.to(rows.weights)
    rows.mask[own] = rows.mask[own] * corr.keep.to(rows.mask)
    return corr.stats


def accumulate(model: torch.nn.Module, rows: Rows, index: Sequence[int], st: StepSettings,
               update: int = 0) -> dict[str, float]:
    """Backpropagate the loss of mini-batch `index` micro-batch by micro-batch (gradients add
    up in .grad); returns its loss parts and the ratio statistics. `update`: the round's
    optimizer step this is (0-based; HACPO's stepwise clip reads it)."""
    grpo, dist = st.grpo, st.dist
    device = next(model.parameters()).device
    idx = torch.tensor(list(index), dtype=torch.long)
    coef = dict(zip(index, row_coefficients(
        rows.mask[idx], rows.demo[idx], rows.group[idx], grpo.aggregation, st.max_len,
        st.sgt_lambda).tolist(), strict=True))
    acc = dict.fromkeys(("loss", "loss_pg", "loss_sgt", "kl_sum", "tokens", "clip_low",
                         "clip_high", "approx_kl_sum", "entropy_sum", *PEER_GRADIENT,
                         *LAG_SUMS), 0.0)
    # A row the mask leaves out entirely (a group filtered for zero variance, a peer row the
    # weight mode dropped) adds exactly 0 to the loss and its gradient: it takes no forward or
    # backward. One is kept if all are, so the step still sees a (zero) gradient.
    pg_all = [i for i in index if not rows.demo[i]]
    pg = [i for i in pg_all if bool(rows.mask[i].any())] or pg_all[:1]
    demo = [i for i in index if rows.demo[i]]
    with_entropy = grpo.entropy_coef != 0.0
    # The bonus is a token mean over the mini-batch's policy-gradient tokens (TRL's).
    entropy_c = grpo.entropy_coef / max(float(rows.mask[pg].sum()), 1.0) if pg else 0.0
    peer_loss = METHODS[rows.peer_method].token_loss if rows.behaviour is not None else None
    for kind, temperature in ((pg, grpo.temperature), (demo, 1.0)):
        if not kind:  # the same on every rank: all know the mini-batch
            continue
        for mb, real in _lockstep(rows, kind, grpo.micro_batch_tokens, dist):
            batch = pack([rows.prompts[i] for i in mb], [rows.completions[i] for i in mb],
                         st.pad_id, device)
            entropy = None
            with _autocast(grpo, device, st.compute):
                if with_entropy and kind is pg:
                    logp, entropy = completion_logprobs_and_entropy(
                        model, batch, temperature, grpo.logit_chunk_tokens)
                else:
                    logp = completion_logprobs(model, batch, temperature,
                                               grpo.logit_chunk_tokens)
            t = logp.shape[1]
            m = rows.mask[mb, :t].to(logp)
            c = torch.tensor([coef[i] * real for i in mb],
                             dtype=torch.float64).to(logp).unsqueeze(-1)
            m = m * real
            if kind is demo:
                loss = (logp * m * c).sum()
                acc["loss_sgt"] += float(loss.detach())
            else:
                old = (rows.logp_old[mb, :t].to(logp) if rows.logp_old is not None
                       else logp.detach())
                ref = rows.ref_logp[mb, :t].to(logp) if rows.ref_logp is not None else None
                adv = rows.advantages[mb].to(logp)
                weights = rows.weights[mb, :t].to(logp)
                if rows.lag_behaviour is not None:
                    weights = weights * _lag_weights(acc, logp, rows, mb, m, grpo)
                parts = token_loss(logp, old, adv, grpo, ref, weights, m)
                peer_rows = ~rows.own[mb]
                if peer_loss is not None and rows.behaviour is not None and bool(peer_rows.any()):
                    theirs = peer_loss(logp, rows.behaviour[mb, :t].to(logp), adv, weights, m,
                                       st.weights, update)
                    parts = splice(parts, theirs, peer_rows.to(logp.device))
                loss = (parts.total * m * c).sum()
                if real and rows.rescue is not None and bool(peer_rows.any()):
                    _count_peer_gradient(acc, (parts.pg * m * c).sum(), logp,
                                         peer_rows.to(logp.device), rows.rescue[mb])
                if entropy is not None:
                    loss = loss - entropy_c * (entropy * m).sum()
                    acc["entropy_sum"] += float((entropy.detach() * m).sum())
                with torch.no_grad():
                    log_rho = logp.detach() - old
                    acc["loss_pg"] += float((parts.pg * m * c).sum())
                    acc["kl_sum"] += float((parts.kl * m).sum())
                    acc["tokens"] += float(m.sum())
                    acc["clip_low"] += float((parts.clipped_low.to(m) * m).sum())
                    acc["clip_high"] += float((parts.clipped_high.to(m) * m).sum())
                    acc["approx_kl_sum"] += float(((log_rho.exp() - 1 - log_rho) * m).sum())
            (loss * dist.world if dist.active else loss).backward()
            acc["loss"] += float(loss.detach())
    if dist.active:  # every entry is a sum over rows: add the ranks' parts
        acc = dict(zip(acc, dist.sum(torch.tensor(list(acc.values()),
                                                  dtype=torch.float64)).tolist(), strict=True))
    n = max(acc["tokens"], 1.0)
    return {"loss": acc["loss"], "loss_pg": acc["loss_pg"], "loss_sgt": acc["loss_sgt"],
            "kl": acc["kl_sum"] / n, "tokens": acc["tokens"],
            "clip_frac": (acc["clip_low"] + acc["clip_high"]) / n,
            "clip_frac_low": acc["clip_low"] / n, "clip_frac_high": acc["clip_high"] / n,
            "approx_kl": acc["approx_kl_sum"] / n,
            **({"entropy": acc["entropy_sum"] / n} if with_entropy else {}),
            **({k: acc[k] for k in PEER_GRADIENT} if rows.rescue is not None else {}),
            **({k: acc[k] for k in LAG_SUMS} if rows.lag_behaviour is not None else {})}


LAG_SUMS = ("lag_tokens", "lag_ratio_sum", "lag_truncated_sum")
"""Per update, when the off-policy correction is taken in the update's forward: own tokens
sampled by older weights, and the sums over them of r and of truncated tokens."""


def _lag_weights(acc: dict[str, float], logp: Tensor, rows: Rows, mb: Sequence[int],
                 m: Tensor, grpo: GRPOSettings) -> Tensor:
    """`correct_lag`'s weights of the micro-batch `mb` (1 on rows it does not correct), from
    its forward's log-probs; adds their stats' sums to `acc`."""
    assert rows.lag_behaviour is not None
    own = rows.own[mb].to(logp.device)
    w = torch.ones_like(logp)
    if bool(own.any()):
        t = logp.shape[1]
        corr = behaviour_weights(logp.detach()[own], rows.lag_behaviour[mb, :t].to(logp)[own],
                                 m[own], grpo)
        w[own] = corr.weights.to(w)
        n = float(m[own].sum())
        acc["lag_tokens"] += n
        acc["lag_ratio_sum"] += corr.stats["offpolicy/ratio_mean"] * n
        acc["lag_truncated_sum"] += corr.stats["offpolicy/truncated"] * n
    return w


PEER_GRADIENT = ("peer_rows_rescue", "peer_grad_rescue", "peer_rows_other", "peer_grad_other")
"""Per update: peer rows of each class (a verified success on a prompt the learner failed, or
any other) and how many of them carried a policy gradient."""


def _count_peer_gradient(acc: dict[str, float], pg: Tensor, logp: Tensor, peer: Tensor,
                         rescue: Tensor) -> None:
    """Adds to `acc` the micro-batch's peer rows by class and those whose policy-gradient term
    has a non-zero gradient in the row's log-probs: a row with a zero advantage or weight, a
    dropped or filtered row, or one whose ratio sits outside its method's clip carries none."""
    (grad,) = torch.autograd.grad(pg, logp, retain_graph=True)
    carries = (grad != 0).any(-1).cpu()
    peer, rescue = peer.cpu(), rescue.cpu() & peer.cpu()
    other = peer & ~rescue
    acc["peer_rows_rescue"] += float(rescue.sum())
    acc["peer_grad_rescue"] += float((carries & rescue).sum())
    acc["peer_rows_other"] += float(other.sum())
    acc["peer_grad_other"] += float((carries & other).sum())


def optimise(model: torch.nn.Module, ref_model: torch.nn.Module | None,
             optimizer: torch.optim.Optimizer, prompt_ids: Sequence[Sequence[int]],
             data: RoundData, plan: LossInputs, st: StepSettings) -> StepResult:
    """The round's updates: `epochs` passes over `mini_batches` mini-batches, one clipped
    AdamW step each (the caller steps the lr schedule once per round). With `st.dist` active,
    this rank's part of them (every rank calls it with the same round). `st.compute`: the
    dtype forward passes autocast to (mixed precision: the parameters, their gradients and
    AdamW's moments stay in the parameters' dtype); None runs in the parameters' dtype."""
    grpo = st.grpo
    rows, stats = round_rows(prompt_ids, data, plan, grpo)
    stats.update(prepare(model, ref_model, rows, data, plan, st))
    updates: list[dict[str, float]] = []
    for _ in range(grpo.epochs):
        for index in mini_batches(rows, grpo.mini_batches):
            optimizer.zero_grad(set_to_none=True)
            u = accumulate(model, rows, index, st, update=len(updates))
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grpo.grad_clip)
            # A sharded model's norm is a DTensor (replicated after clipping's reduction).
            u["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor")
                                   else norm)
            optimizer.step()
            updates.append(u)
    stats.update(summarise(updates))
    return StepResult(stats=stats, updates=updates)


def summarise(updates: list[dict[str, float]]) -> dict[str, float]:
    """Round metrics over its updates: losses and grad norm averaged per update, ratio
    statistics per token over all of them, the peer rows of each class per update and the
    share of them that carried gradient, `updates` counted."""
    if not updates:
        return {"updates": 0.0}
    n = len(updates)
    tokens = sum(u["tokens"] for u in updates)
    per_token: dict[str, float] = {
        k: sum(u[k] * u["tokens"] for u in updates) / max(tokens, 1.0)
        for k in ("kl", "clip_frac", "clip_frac_low", "clip_frac_high", "approx_kl", "entropy")
        if k in updates[0]}
    means = {k: sum(u[k] for u in updates) / n
             for k in ("loss", "loss_pg", "loss_sgt", "grad_norm")}
    shares: dict[str, float] = {}
    for cls in ("rescue", "other"):
        rows = sum(u.get(f"peer_rows_{cls}", 0.0) for u in updates)
        if rows:  # over the round's row-updates: a row may carry gradient in one, not the next
            shares[f"peer_rows_{cls}"] = rows / n
            shares[f"peer_grad_share_{cls}"] = sum(u[f"peer_grad_{cls}"] for u in updates) / rows
    lag = sum(u.get("lag_tokens", 0.0) for u in updates)
    offpolicy = {"offpolicy/ratio_mean": sum(u["lag_ratio_sum"] for u in updates) / lag,
                 "offpolicy/truncated": sum(u["lag_truncated_sum"] for u in updates) / lag,
                 "offpolicy/masked": 0.0} if lag else {}
    return {**means, **per_token, **shares, **offpolicy,
            "tokens": updates[0]["tokens"] if n == 1 else tokens / n, "updates": float(n)}


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """transformers' activation checkpointing of the body's layers (non-reentrant), under the
    name the installed version has (`gradient_checkpointing_enable` before transformers 5.2x)."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if callable(enable):
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]


def _autocast(grpo: GRPOSettings, device: torch.device, compute: torch.dtype | None = None
              ) -> contextlib.AbstractContextManager[object]:
    if compute is not None and compute != torch.float32:
        return torch.autocast(device.type, dtype=compute)
    if grpo.autocast_bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


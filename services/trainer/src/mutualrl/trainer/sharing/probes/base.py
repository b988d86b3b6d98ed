"""What every probe shares: the round's data in, the loss inputs out, and the fall-back to GRPO.

A probe turns the round's own rewards (and whatever it reads from peers) into `LossInputs`: the
advantages of own samples, optionally peer rows to add to the policy-gradient batch (PRP) and
demonstrations for an extra NLL term (SGT). With no exchange (local runs), no peer data, a
missed deadline or a service error, the inputs are exactly plain GRPO's.

In the deterministic mode (`exchange.mode`) a probe never falls back: round r waits for the
peers' round q = r - s and reads exactly it. With s >= 1, the probe's own read of round q
(`gather` on its own round-q data, exactly what s = 0 ran in round q) is started in the
background when round r begins (`prefetch`) and its peer-derived parts, PRP's peer rows and
SGT's demonstrations on round q's prompts, join round r's loss (`delayed`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import torch
from torch import Tensor

from mutualrl.trainer.algos.loss import group_advantages
from mutualrl.trainer.algos.modes import ScaleRewards
from mutualrl.trainer.algos.sgt import rescue_set
from mutualrl.trainer.config.run import ExchangeSettings, ProbeSettings
from mutualrl.trainer.data.tasks import Prompt, Task
from mutualrl.trainer.sharing.exchange import PeerExchange, PeerTimeout

log = logging.getLogger(__name__)
_READ_S = 30.0  # the time the reads of a complete round get, as a gRPC deadline


@dataclass
class RoundData:
    """One round of one policy after rewards."""

    round: int
    prompts: list[Prompt]
    samples: list[list[Any]]
    """[P][G] rollout samples (token_ids, text, logprobs, finish_reason)."""
    rewards: Tensor
    """[P, G] rewards."""
    correct: list[list[bool]] | None = None
    """[P][G] verified successes (reward >= tau and not truncated); None: from the rewards."""
    success: Tensor | None = None
    """[P, G] each sample's success reward (the task's `success_reward`; truncated samples 0),
    which SGT's gate compares with tau; None: the rewards."""
    peers_now: list[str] | None = None
    """Policies training this round alongside this one (MWRA time-share turns); reads of the
    round wait for these only. None: every policy of the run."""
    policy_version: int | None = None
    """The weight version (optimizer rounds taken) that sampled the round's own rows; below
    `round` they are off-policy (`algos.offpolicy`). None: the round's own weights."""


@dataclass
class PeerRows:
    """Peer completions in the receiver's tokens joining the policy-gradient batch (PRP, HACPO,
    SAPO, F-TIS: `method` names whose function set of `algos.methods` trains them)."""

    prompt_index: list[int]
    token_ids: list[list[int]]
    advantages: Tensor
    """[M] advantage of each peer row (how: the method's)."""
    sender_logp_sum: Tensor
    """[M] sender's sequence log-prob (sequence-level weights)."""
    token_chunk: list[list[int]] | None = None
    """Chunk level: chunk index per receiver token."""
    chunk_sender_logp: list[list[float]] | None = None
    """Chunk level: sender log-prob per chunk."""
    method: str = "prp"
    """The function set of `algos.methods.METHODS` the rows are trained with."""
    sender_tokens: Tensor | None = None
    """[M] how many sender tokens `sender_logp_sum` covers (HACPO's sender mean)."""
    capability: Tensor | None = None
    """[M] HACPO: the row weight clip(P_sender / P_receiver)."""
    rescue: Tensor | None = None
    """[M] bool: the row is a verified success (reward >= tau, not truncated) on a prompt this
    policy failed (best own success < tau): the row class the gradient diagnostic splits by."""


@dataclass
class PeerGroup:
    """The peer rows of one own prompt, as `algos.methods` forms advantages from them."""

    rewards: Tensor
    """[M] each row's reward."""
    source: list[str]
    """[M] each row's sending policy."""
    baseline_weight: Tensor | None = None
    """[M] HACPO: each reward's weight in the learner's baseline, clip(P_receiver / P_sender)."""


@dataclass
class Demos:
    """SGT: verified peer successes (receiver tokens) of rescued prompts."""

    prompt_index: list[int]
    """Prompt of each demonstration: an index into the round's prompts, or (with
    `prompt_token_ids`) any label that groups demonstrations of the same prompt."""
    token_ids: list[list[int]]
    prompt_token_ids: list[list[int]] | None = None
    """Prompt tokens of each demonstration when they are not the round's prompts (sgt-self
    draws demonstrations from earlier rounds)."""

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class LossInputs:
    """What `step.py` needs besides the samples to build a round's loss."""

    advantages: Tensor
    """[P, G] advantages of own samples."""
    peers: PeerRows | None = None
    demos: Demos | None = None
    support: Demos | None = None
    """Peers' verified successes on prompts this policy failed, in its tokens, when the probe
    read them anyway (the SGT family): the support diagnostic reuses them."""
    stats: dict[str, float] = field(default_factory=dict)
    extra_prompts: list[list[int]] = field(default_factory=list)
    """Prompt tokens of an earlier round whose peer rows join this one (deterministic mode,
    staleness >= 1): `peers.prompt_index` P + j is extra_prompts[j], P the round's prompts."""


def grpo_inputs(data: RoundData, scale: ScaleRewards = "group", **stats: float) -> LossInputs:
    """Plain GRPO's inputs: group advantages of own rewards, divided as `scale` says."""
    return LossInputs(advantages=group_advantages(data.rewards, scale=scale),
                      stats=dict(stats))


class Probe:
    """Plain GRPO (probe `none`); subclasses override `gather`."""

    kind = "none"
    same_round = False
    """Its loss needs the peers' data of the round itself (XGRPO's pooled baseline of the
    round's own samples): the deterministic mode waits for round r whatever the staleness."""

    def __init__(
        self, settings: ProbeSettings, policy: str, exchange: PeerExchange | None,
        task: Task | None = None, scale: ScaleRewards = "group",
        sharing: ExchangeSettings | None = None,
    ) -> None:
        self.settings = settings
        self.scale: ScaleRewards = scale
        """What advantages are divided by (`grpo.scale_rewards`), pooled or not."""
        self.sharing = sharing or ExchangeSettings()
        self.deterministic = self.sharing.mode == "deterministic"
        self.lag = 0 if self.same_round else self.sharing.staleness
        """Deterministic mode: round r reads the peers' round r - lag."""
        self.history: dict[int, RoundData] = {}
        """Own rounds whose peer read is still to come (the last `lag`)."""
        self.reads: dict[int, Future[LossInputs]] = {}
        """Round -> its peer read of round - lag, started by `prefetch`."""
        self.policy = policy
        self.exchange = exchange
        self.task = task
        """The task (reference answers: the `oracle` control)."""
        self.fallbacks = 0
        """Rounds that fell back to GRPO: a service error, or the deadline passed with no peer
        data at all."""
        self.peer_rounds: dict[str, int] | None = None
        """Policy -> the rounds it trains (its own `grpo.rounds`): `keep_pace` does not wait
        for a peer's round q past its last. None: every policy trains round q."""
        self.absent: set[str] = set()
        """Peers `keep_pace` waited for in vain once: it does not wait for them again."""
        self.own_first: dict[int, str] = {}
        """Asynchronous mode: round -> the id of its first prompt, for the last
        `max_lead_rounds` rounds (`keep_pace` waits for the peers' records of it)."""

    def plan(self, data: RoundData) -> LossInputs:
        """The round's loss inputs; peers are read within `deadline_seconds`, else plain GRPO
        (asynchronous mode), or exactly the peers' round r - s (deterministic mode)."""
        if self.exchange is None or self.kind == "none":
            return grpo_inputs(data, self.scale, fallback=0.0)
        if self.deterministic:
            return self.plan_in_step(data, self.exchange)
        pace = self.keep_pace(data, self.exchange)
        deadline = time.monotonic() + self.settings.deadline_seconds
        try:
            plan = self.gather(data, self.exchange, deadline)
        except Exception as err:  # grpc.RpcError (deadline, unavailable) and THL refusals
            if not is_transient(err):
                raise
            log.warning("round %d: %s probe fell back to GRPO: %s", data.round, self.kind, err)
            plan = grpo_inputs(data, self.scale, fallback=1.0)
        plan.stats.setdefault("fallback", 0.0)
        self.fallbacks += int(plan.stats["fallback"] > 0)
        plan.stats["fallbacks_total"] = float(self.fallbacks)
        plan.stats["shared"] = 1.0 - plan.stats["fallback"]
        plan.stats.update(pace)
        return plan

    def keep_pace(self, data: RoundData, ex: PeerExchange) -> dict[str, float]:
        """Asynchronous mode: wait until every peer has published round r - L, L =
        `exchange.max_lead_rounds` (up to `liveness_timeout_s`), so that a policy much faster
        than its peers does not run through its rounds before they publish any and share
        nothing. A round is recognised by the first prompt of this policy's own round q
        (the shared order gives every policy the same one), so the first L rounds after a
        resume, whose prompts this process did not see, do not wait."""
        lead = self.sharing.max_lead_rounds
        self.own_first[data.round] = data.prompts[0].id
        if lead is None:
            return {}
        q = data.round - lead
        for old in [r for r in self.own_first if r < q]:
            del self.own_first[old]
        first = self.own_first.get(q)
        expect = data.peers_now
        if self.peer_rounds is not None:
            expect = [p for p in expect or self.peer_rounds
                      if p != self.policy and p not in self.absent
                      and self.peer_rounds.get(p, q + 1) > q]
        if first is None or expect == [] or (expect is None and self.absent):
            return {}
        t0 = time.monotonic()
        try:
            ex.await_round(q, [first], self.sharing.liveness_timeout_s, expect, may_stop=True)
            out = {"lead_timeout": 0.0}
        except PeerTimeout as err:
            # A peer that missed the bound once (dead, or never started) is not waited for
            # again: a round costs the bound once, not every round.
            self.absent.update(err.missing or ["?"])
            log.warning("round %d: going on without the peers' round %d, and without "
                        "waiting for %s again (exchange.max_lead_rounds=%d): %s", data.round,
                        q, ", ".join(err.missing) or "them", lead, err)
            out = {"lead_timeout": 1.0}
        out["lead_wait_s"] = time.monotonic() - t0
        ex.waited_s += out["lead_wait_s"]  # a wait for peers: no part of MWRA's cost
        return out

    def gather(self, data: RoundData, ex: PeerExchange, deadline: float) -> LossInputs:
        return grpo_inputs(data, self.scale)

    # ---- the deterministic mode -----------------------------------------------------------
    def prefetch(self, round_k: int) -> None:
        """Start round `round_k`'s read of the peers' round `round_k - lag` in the background
        (lag >= 1: this policy's own round of it is done); `plan` collects it."""
        own = self.history.get(round_k - self.lag)
        if (self.deterministic and self.lag and own is not None and self.exchange is not None
                and self.kind != "none"):
            self.reads[round_k] = self.exchange.submit(lambda: self.read_round(own))

    def read_round(self, own: RoundData) -> LossInputs:
        """Wait for every peer's round `own.round`, then read it as a plan of that round."""
        assert self.exchange is not None
        lag0 = self.lag == 0
        waited = self.exchange.await_round(own.round, [p.id for p in own.prompts],
                                           self.sharing.liveness_timeout_s,
                                           own.peers_now if lag0 else None)
        if lag0:  # the round blocked on it (with a lag, only the wait for the result counts)
            self.exchange.waited_s += waited
        # Every peer's round is in SEE now: the reads wait for nothing (SEE caps a wait).
        return self.gather(own, self.exchange, time.monotonic() + _READ_S)

    def plan_in_step(self, data: RoundData, ex: PeerExchange) -> LossInputs:
        """Deterministic mode: the plan from exactly the peers' round r - lag (plain GRPO for
        r < lag, the rounds before any peer round exists)."""
        if not self.lag:
            plan = self.read_round(data)
        else:
            self.history[data.round] = data
            q = data.round - self.lag
            read = self.reads.pop(data.round, None)
            t0 = time.monotonic()
            if read is not None:
                earlier = read.result()
            elif q in self.history:  # a caller that did not prefetch
                earlier = self.read_round(self.history[q])
            else:
                earlier = None
            ex.waited_s += time.monotonic() - t0  # what the round blocked on, not the read
            own_q = self.history.pop(q, None)
            plan = (grpo_inputs(data, self.scale) if earlier is None or own_q is None
                    else delayed(data, earlier, own_q, self.scale))
            plan.stats["shared"] = float(earlier is not None and own_q is not None)
        plan.stats.setdefault("shared", 1.0)
        plan.stats.setdefault("fallback", 0.0)
        plan.stats["fallbacks_total"] = float(self.fallbacks)
        return plan

    def state_dict(self) -> dict[str, Any]:
        return {"fallbacks": self.fallbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fallbacks = int(state.get("fallbacks", 0))


def delayed(data: RoundData, earlier: LossInputs, own_q: RoundData,
            scale: ScaleRewards = "group") -> LossInputs:
    """Round r's loss inputs when the peers' data is of round q < r: own samples take plain
    GRPO advantages (peers' round-r rewards do not exist yet); `earlier`, the plan s = 0 gave
    round q, brings its peer rows (with the advantages it pooled over round q's own and peer
    rewards) and its demonstrations (and the support diagnostic's peer successes), all
    conditioned on this policy's round-q prompts."""
    n = len(data.prompts)
    q_prompts = [list(row[0].prompt_token_ids) for row in own_q.samples]
    plan = grpo_inputs(data, scale)
    plan.stats = {**earlier.stats, "peer_round": float(own_q.round)}
    if earlier.peers is not None:
        plan.peers = replace(earlier.peers,
                             prompt_index=[n + i for i in earlier.peers.prompt_index])
        plan.extra_prompts = q_prompts
    plan.demos, plan.support = (on_prompts(d, q_prompts) for d in (earlier.demos,
                                                                    earlier.support))
    return plan


def on_prompts(demos: Demos | None, prompts: list[list[int]]) -> Demos | None:
    """Demonstrations indexed into `prompts` conditioned on them explicitly."""
    if demos is None or demos.prompt_token_ids is not None:
        return demos
    return replace(demos, prompt_token_ids=[prompts[i] for i in demos.prompt_index])


def is_transient(err: BaseException) -> bool:
    """Errors a peer or a service can cause: everything gRPC reports, and timeouts (the
    fall-back test; diagnostics read peers too)."""
    return isinstance(err, grpc.RpcError | TimeoutError | ConnectionError)


@dataclass
class Rescue:
    """What SGT reads for a round: peer success texts per prompt this policy failed."""

    texts: dict[str, list[str]]
    """Prompt id -> distinct verified peer success texts (at most `sgt_max_per_prompt`)."""
    candidates: int = 0
    complete: bool = True
    """Every peer had published the round's stats when the wait ended."""
    any_peer: bool = True
    """Some peer had published stats for a failed prompt."""
    donors: dict[tuple[str, str], str] = field(default_factory=dict)
    """(prompt id, text) -> the peer whose success it is (the first one offering the text)."""
    ends: set[tuple[str, str]] = field(default_factory=set)
    """(prompt id, text) that some donor ended with its EOS: the demonstration ends with EOS
    (a verified success that stopped there)."""

    def by_skill_and_donor(self, prompts: Sequence[Prompt]) -> dict[str, float]:
        """Demonstrations per skill and donor: {'rescue_demos/<skill>/<donor>': n}, the
        trainer's side of the transfer matrix (who taught which skill)."""
        skill = {p.id: p.skill for p in prompts}
        return count_taught((skill.get(pid, "?"), self.donors.get((pid, t), "?"))
                            for pid, texts in self.texts.items() for t in texts)


def count_taught(demos: Iterable[tuple[str, str]]) -> dict[str, float]:
    """{'rescue_demos/<skill>/<source>': n} for demonstrations given as (skill, source): the
    trainer's side of the transfer matrix (the source is a peer, the policy itself or
    `reference`)."""
    return {f"rescue_demos/{skill}/{source}": float(n)
            for (skill, source), n in Counter(demos).items()}


def read_rescue(data: RoundData, ex: PeerExchange, s: ProbeSettings, policy: str,
                deadline: float, exact: bool = False) -> Rescue:
    """SGT's read: the prompts this policy failed (best own reward < tau) that some peer solved,
    with the peers' verified success texts. One bounded wait for the peers' round stats, then
    successes are fetched only for prompts some peer solved; `exact`: none of rounds after
    this one (the deterministic mode reads exactly the rounds it waited for)."""
    mine = own_max(data)
    failed = [pid for pid, r in mine.items() if r < s.tau]
    if not failed:
        return Rescue(texts={})
    _, peer_best, complete = ex.peer_stats(data.round, failed, deadline, data.peers_now)
    solved = [pid for pid in failed if peer_best.get(pid, float("-inf")) >= s.tau]
    candidates = ex.peer_successes(
        solved, data.round - s.max_staleness_rounds, s.sgt_max_per_prompt, deadline,
        max_round=data.round if exact else None)
    texts = rescue_set(mine, candidates, policy, s.tau, s.sgt_max_per_prompt)
    donors: dict[tuple[str, str], str] = {}
    ends: set[tuple[str, str]] = set()
    for c in candidates:
        if c.stopped_by_eos:
            ends.add((c.prompt_id, c.text))
        donors.setdefault((c.prompt_id, c.text), c.policy)
    return Rescue(texts=texts, candidates=len(candidates), complete=complete,
                  any_peer=bool(peer_best), donors=donors, ends=ends)


def rescue_demos(data: RoundData, ex: PeerExchange, texts: dict[str, list[str]],
                 ends: set[tuple[str, str]] | None = None) -> Demos:
    """Peer success texts (prompt id -> texts) as demonstrations in this policy's tokens;
    those in `ends` (the sender stopped by EOS) end with this policy's EOS."""
    where = index_of(data.prompts)
    pids = [pid for pid, ts in texts.items() for _ in ts]
    flat = [t for ts in texts.values() for t in ts]
    stop = [(p, t) in (ends or set()) for p, t in zip(pids, flat, strict=True)]
    return Demos(prompt_index=[where[p] for p in pids], token_ids=ex.retokenize(flat, stop))


def own_max(data: RoundData) -> dict[str, float]:
    """Best own success reward per prompt id (SGT's gate)."""
    gate = data.rewards if data.success is None else data.success
    return {p.id: float(r.max()) for p, r in zip(data.prompts, gate, strict=True)}


def index_of(prompts: Sequence[Prompt]) -> dict[str, int]:
    return {p.id: i for i, p in enumerate(prompts)}


def as_tensor(values: Sequence[float], like: Tensor) -> Tensor:
    return torch.tensor(list(values), dtype=like.dtype)

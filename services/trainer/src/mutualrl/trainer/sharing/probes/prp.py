"""Probe `prp`: peer rollouts join own groups with importance weights (computed in the loss,
where the receiver's current log-probs of the peer tokens are at hand), and `RolloutProbe`, what
every probe that trains on peers' rollouts (PRP, HACPO, SAPO, F-TIS) reads and how."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from mutualrl.trainer.algos.methods import METHODS
from mutualrl.trainer.algos.sapo import source_groups
from mutualrl.trainer.sharing.exchange import PeerExchange, PeerRollout
from mutualrl.trainer.sharing.probes.base import (
    LossInputs,
    PeerGroup,
    PeerRows,
    Probe,
    RoundData,
    index_of,
    own_max,
)
from mutualrl.trainer.sharing.record_ids import parse_record_id

_BATCH = 4096  # peer rollouts one fetch takes


class RolloutProbe(Probe):
    """Reads the peers' rollouts of the round (SEE's ROLLOUT records: text, tokens, behaviour
    log-probs, reward) and groups them by the own prompt they answer; `build` makes the loss
    inputs of a method from them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending: list[PeerRollout] = []
        """Rollouts of rounds this policy has not reached yet (a faster peer is ahead): SEE
        hands a record out once, so they wait here for their round."""

    def cap(self) -> int:
        """At most this many rollouts of each peer join one prompt."""
        return self.settings.prp_max_peer_per_prompt

    def wait(self, data: RoundData, ex: PeerExchange, deadline: float) -> bool:
        """Bounded wait until the peers have published this round; True when all had."""
        return bool(ex.peer_stats(data.round, [p.id for p in data.prompts], deadline,
                                  data.peers_now)[-1])

    def gather(self, data: RoundData, ex: PeerExchange, deadline: float) -> LossInputs:
        s = self.settings
        where = index_of(data.prompts)
        complete = self.wait(data, ex, deadline)
        fetched = ex.peer_rollouts(
            data.round, s.max_staleness_rounds,
            max_records=_BATCH, deadline=deadline)
        pool = self.pending + fetched
        if self.deterministic:  # the whole round, in a fixed order (the stream's is arrival)
            more = fetched
            while len(more) == _BATCH:
                more = ex.peer_rollouts(data.round, s.max_staleness_rounds, _BATCH, deadline)
                pool += more
            pool.sort(key=record_order)
        per_prompt, self.pending = group_peer_rollouts(pool, where, data.round, self.cap())
        n = sum(map(len, per_prompt.values()))
        stats = {"peer_samples": float(n), "peers_complete": float(complete),
                 # what arrived by now (asynchronous) or the rollouts of the rounds read
                 **({"peer_read": float(len(pool) - len(self.pending))} if self.deterministic
                    else {"peer_fetched": float(len(fetched))}),
                 "fallback": float(not complete and not n)}
        return self.build(data, ex, per_prompt, stats)

    def build(self, data: RoundData, ex: PeerExchange,
              per_prompt: dict[int, list[PeerRollout]], stats: dict[str, float]) -> LossInputs:
        raise NotImplementedError

    def advantages(self, data: RoundData, per_prompt: dict[int, list[PeerRollout]],
                   rewards: dict[int, list[float]] | None = None,
                   baseline: dict[int, list[float]] | None = None
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Own advantages and each prompt's peer advantages by this probe's method, from the
        senders' rewards (or `rewards`, prompt -> one per rollout) and HACPO's `baseline`
        weights."""
        dtype = data.rewards.dtype
        groups = [PeerGroup(
            rewards=torch.tensor(
                (rewards or {}).get(i, [r.reward for r in per_prompt.get(i, [])]), dtype=dtype),
            source=[r.policy for r in per_prompt.get(i, [])],
            baseline_weight=(None if baseline is None or i not in baseline
                             else torch.tensor(baseline[i], dtype=dtype)))
            for i in range(len(data.prompts))]
        return METHODS[self.kind].advantages(data.rewards, groups, self.scale, self.settings)

    def diagnose(self, data: RoundData, per_prompt: dict[int, list[PeerRollout]],
                 peer_adv: list[torch.Tensor], stats: dict[str, float],
                 rewards: dict[int, list[float]] | None = None) -> torch.Tensor:
        """Records in `stats` the share of (prompt, peer) groups whose advantages are not all
        0 (`peer_groups_live`; a group of 0 advantages carries no signal whatever the weights)
        and returns each row's class (`PeerRows.rescue`, in `flatten`'s order) from the
        rewards the advantages were formed from (`rewards`: rescored ones)."""
        best = own_max(data)
        rescue: list[bool] = []
        groups = live = 0
        for i in sorted(per_prompt):
            rs = per_prompt[i]
            got = (rewards or {}).get(i, [r.reward for r in rs])
            failed = best[data.prompts[i].id] < self.settings.tau
            rescue += [failed and g >= self.settings.tau and not r.truncated
                       for r, g in zip(rs, got, strict=True)]
            for idx in source_groups([r.policy for r in rs]).values():
                groups += 1
                live += int(bool((peer_adv[i][idx] != 0).any()))
        if groups:
            stats["peer_groups_live"] = live / groups
        return torch.tensor(rescue, dtype=torch.bool)

    def peer_rows(self, ex: PeerExchange, per_prompt: dict[int, list[PeerRollout]],
                  peer_adv: list[torch.Tensor], stats: dict[str, float], chunk: bool,
                  data: RoundData, **extra: Any) -> PeerRows:
        """The rollouts of `per_prompt` in this policy's tokens (THL), with their advantages
        and the sender's log-probs per sequence (and per chunk with `chunk`), for this probe's
        method; records THL's residual and the live peer groups in `stats`. `extra`: further
        PeerRows fields."""
        rescue = self.diagnose(data, per_prompt, peer_adv, stats)
        chosen, prompt_index = flatten(per_prompt)
        aligned = ex.align(chosen, chunk_level=chunk)
        stats["thl_multi_token_chunk_share"] = sum(
            a.multi_token_chunk_share for a in aligned) / len(aligned)
        return PeerRows(
            prompt_index=prompt_index,
            token_ids=[a.token_ids for a in aligned],
            advantages=torch.cat([peer_adv[i] for i in sorted(per_prompt)]),
            sender_logp_sum=torch.tensor([a.sender_logp_sum for a in aligned],
                                         dtype=torch.float64),
            token_chunk=[a.token_chunk for a in aligned] if chunk else None,
            chunk_sender_logp=[a.chunk_sender_logp for a in aligned] if chunk else None,
            method=self.kind,
            sender_tokens=torch.tensor([a.sender_tokens for a in aligned], dtype=torch.float64),
            rescue=rescue, **extra)

    def state_dict(self) -> dict[str, Any]:
        # Plain dicts: resume state loads with torch.load(weights_only=True).
        return {**super().state_dict(), "pending": [asdict(r) for r in self.pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pending = [
            PeerRollout(**{**r, "offsets": [tuple(o) for o in r["offsets"]]})
            for r in state.get("pending", [])]


class PRPProbe(RolloutProbe):
    kind = "prp"

    def build(self, data: RoundData, ex: PeerExchange,
              per_prompt: dict[int, list[PeerRollout]], stats: dict[str, float]) -> LossInputs:
        own_adv, peer_adv = self.advantages(data, per_prompt)
        if not per_prompt:
            return LossInputs(advantages=own_adv, stats=stats)
        peers = self.peer_rows(ex, per_prompt, peer_adv, stats,
                               chunk=self.settings.prp_level == "chunk", data=data)
        return LossInputs(advantages=own_adv, peers=peers, stats=stats)


def flatten(per_prompt: dict[int, list[PeerRollout]]) -> tuple[list[PeerRollout], list[int]]:
    """The rollouts prompt by prompt (in prompt order) and the own prompt of each."""
    chosen = [r for i in sorted(per_prompt) for r in per_prompt[i]]
    return chosen, [i for i in sorted(per_prompt) for _ in per_prompt[i]]


def record_order(r: PeerRollout) -> tuple[int, str, int, int, str]:
    """A peer rollout's place in a fixed order: round, policy, then prompt and sample index
    from its record id (`sharing.record_ids`; another form is a ValueError naming it)."""
    rid = parse_record_id(r.record_id)
    return r.round, r.policy, rid.prompt, rid.sample or 0, r.record_id


def group_peer_rollouts(
    pool: list[PeerRollout], where: dict[str, int], round_k: int, cap: int
) -> tuple[dict[int, list[PeerRollout]], list[PeerRollout]]:
    """Peer rollouts by the index of the own prompt they answer, at most `cap` of each peer per
    prompt (so every peer gets a say, however many peers there are), and the rollouts of later
    rounds, kept for their round. Rollouts of prompts not in `where` are dropped."""
    per_prompt: dict[int, list[PeerRollout]] = {}
    later: list[PeerRollout] = []
    taken: dict[tuple[int, str], int] = {}
    for r in pool:
        if r.round > round_k:
            later.append(r)
            continue
        i = where.get(r.prompt_id)  # rollouts of other rounds' prompts have no group here
        if i is None or taken.get((i, r.policy), 0) >= cap:
            continue
        taken[(i, r.policy)] = taken.get((i, r.policy), 0) + 1
        per_prompt.setdefault(i, []).append(r)
    return per_prompt, later

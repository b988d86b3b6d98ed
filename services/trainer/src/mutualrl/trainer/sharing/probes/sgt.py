"""Probe `sgt`: success-gated transfer of verified peer successes on prompts this policy fails,
and its two controls, which read exactly what SGT reads and change only the demonstrations:

- `sgt-self`: as many demonstrations, grouped the same way, from this policy's *own* verified
  successes of earlier rounds (SGT's supervision and compute, no peer information);
- `oracle`: the task's reference answer for each prompt SGT rescues (a perfect peer).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from mutualrl.trainer.sharing.exchange import PeerExchange
from mutualrl.trainer.sharing.probes.base import (
    Demos,
    LossInputs,
    Probe,
    Rescue,
    RoundData,
    count_taught,
    grpo_inputs,
    index_of,
    read_rescue,
    rescue_demos,
)


class SGTProbe(Probe):
    kind = "sgt"

    def gather(self, data: RoundData, ex: PeerExchange, deadline: float) -> LossInputs:
        plan = grpo_inputs(data, self.scale)
        plan.stats = {"rescued_prompts": 0.0, "rescue_demos": 0.0, "candidates": 0.0}
        rescue = read_rescue(data, ex, self.settings, self.policy, deadline,
                             exact=self.deterministic)
        plan.stats["candidates"] = float(rescue.candidates)
        plan.stats["fallback"] = float(not rescue.complete and not rescue.any_peer)
        plan.stats["peers_complete"] = float(rescue.complete)
        if not rescue.texts:
            return plan
        peer = rescue_demos(data, ex, rescue.texts, rescue.ends)
        plan.support = peer
        plan.demos = self.demonstrations(data, ex, rescue.texts, peer, plan.stats)
        plan.stats.update(self.taught(data, rescue, plan.demos))
        where = index_of(data.prompts)
        for pid in rescue.texts:  # per skill: which skills peers unlock (the dashboard's bars)
            key = f"rescued/{data.prompts[where[pid]].skill}"
            plan.stats[key] = plan.stats.get(key, 0.0) + 1.0
        plan.stats["rescued_prompts"] = float(len(rescue.texts))
        plan.stats["rescue_demos"] = float(len(plan.demos) if plan.demos else 0)
        return plan

    def demonstrations(self, data: RoundData, ex: PeerExchange, texts: dict[str, list[str]],
                       peer: Demos, stats: dict[str, float]) -> Demos | None:
        """What the NLL term trains on, given SGT's rescue set (SGT: the peers' texts)."""
        return peer

    def taught(self, data: RoundData, rescue: Rescue, demos: Demos | None) -> dict[str, float]:
        """What the NLL term trained on per skill and source, {'rescue_demos/<skill>/<source>':
        n}: the trainer's side of the transfer matrix (SGT: each peer text by its donor)."""
        return rescue.by_skill_and_donor(data.prompts)


class OracleProbe(SGTProbe):
    """The reference answer of every prompt SGT would rescue, one per prompt (SGT's loss
    averages within a prompt first, so each prompt weighs the same as under SGT)."""

    kind = "oracle"

    def demonstrations(self, data: RoundData, ex: PeerExchange, texts: dict[str, list[str]],
                       peer: Demos, stats: dict[str, float]) -> Demos | None:
        if self.task is None:
            raise ValueError("the oracle probe needs the task (its reference answers)")
        where = index_of(data.prompts)
        pids = list(texts)
        refs = [self.task.sft_target(data.prompts[where[pid]], random.Random(f"oracle:{pid}"))
                for pid in pids]
        # A task that stops at EOS only (no stop strings): a perfect answer ends with EOS.
        ends = [not getattr(self.task, "stop", None)] * len(refs)
        return Demos(prompt_index=[where[p] for p in pids], token_ids=ex.retokenize(refs, ends))

    def taught(self, data: RoundData, rescue: Rescue, demos: Demos | None) -> dict[str, float]:
        """The reference answers, counted under the source `reference` (no peer taught them)."""
        return count_taught((data.prompts[i].skill, "reference")
                            for i in (demos.prompt_index if demos else []))


class SGTSelfProbe(SGTProbe):
    """SGT's count of prompts and demonstrations per prompt, filled with own successes of the
    last `sgt_self_rounds` rounds (prompts drawn uniformly without replacement, seeded by policy
    and round; a prompt with fewer own texts than SGT had gives what it has)."""

    kind = "sgt-self"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.own: OrderedDict[int, list[tuple[str, list[int], str, bool, str]]] = OrderedDict()
        """round -> own verified successes (prompt id, prompt tokens, completion text, whether
        it ended with this policy's EOS, the prompt's skill)."""
        self.drawn_skills: list[str] = []
        """The skill of each demonstration of the current round."""

    def plan(self, data: RoundData) -> LossInputs:
        plan = super().plan(data)  # reads earlier rounds only: this round is recorded after
        self.record(data)
        return plan

    def record(self, data: RoundData) -> None:
        tau = self.settings.tau
        eos = self.exchange.eos_token_id if self.exchange is not None else None
        found: list[tuple[str, list[int], str, bool, str]] = []
        gate = data.rewards if data.success is None else data.success  # the success reward
        for p_i, (prompt, row) in enumerate(zip(data.prompts, data.samples, strict=True)):
            for g_i, y in enumerate(row):
                ok = (data.correct[p_i][g_i] if data.correct is not None
                      else y.finish_reason != "length")
                ids = getattr(y, "prompt_token_ids", None)
                if ok and float(gate[p_i, g_i]) >= tau and ids is not None:
                    ended = eos is not None and list(y.token_ids[-1:]) == [eos]
                    found.append((prompt.id, list(ids), y.text, ended, prompt.skill))
        self.own[data.round] = found
        while len(self.own) > self.settings.sgt_self_rounds:
            self.own.popitem(last=False)

    def pool(self, before: int) -> dict[str, tuple[list[int], list[str]]]:
        """Own successes of earlier rounds: prompt id -> (prompt tokens, distinct texts)."""
        out: dict[str, tuple[list[int], list[str]]] = {}
        for k, found in self.own.items():
            if k >= before:
                continue
            for pid, ids, text, _, _ in found:
                slot = out.setdefault(pid, (ids, []))
                if text not in slot[1]:
                    slot[1].append(text)
        return out

    def demonstrations(self, data: RoundData, ex: PeerExchange, texts: dict[str, list[str]],
                       peer: Demos, stats: dict[str, float]) -> Demos | None:
        want = [len(ts) for ts in texts.values()]  # SGT's demonstrations per rescued prompt
        rng = random.Random(f"sgt-self:{self.policy}:{data.round}")
        drawn = draw_own(self.pool(data.round), want, rng)
        stats["sgt_self_missing"] = float(sum(want) - len(drawn))
        skill = {e[0]: e[4] for found in self.own.values() for e in found}
        self.drawn_skills = [skill[pid] for _, pid, _, _ in drawn]
        if not drawn:
            return None
        # As SGT's demonstrations: a text that ended with EOS is followed by it.
        ended = {t for found in self.own.values() for _, _, t, e, _ in found if e}
        return Demos(prompt_index=[j for j, _, _, _ in drawn],
                     token_ids=ex.retokenize([t for _, _, _, t in drawn],
                                             [t in ended for _, _, _, t in drawn]),
                     prompt_token_ids=[ids for _, _, ids, _ in drawn])

    def taught(self, data: RoundData, rescue: Rescue, demos: Demos | None) -> dict[str, float]:
        """Its own successes, counted under this policy's own name (no peer taught them)."""
        return count_taught((sk, self.policy) for sk in self.drawn_skills)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "own": list(self.own.items())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # Entries of checkpoints written before the EOS flag have three fields, before the
        # skill four.
        self.own = OrderedDict(
            (int(k), [(e[0], list(e[1]), e[2], bool(e[3]) if len(e) > 3 else False,
                       str(e[4]) if len(e) > 4 else "?") for e in v])
            for k, v in state.get("own", []))


def draw_own(pool: dict[str, tuple[list[int], list[str]]], want: list[int],
             rng: random.Random) -> list[tuple[int, str, list[int], str]]:
    """sgt-self's demonstrations: len(want) distinct prompts of `pool` (uniformly, without
    replacement), the j-th with up to want[j] of its own texts. Returns (group label j, prompt
    id, prompt tokens, text) per demonstration; fewer when the pool is smaller than what SGT
    used."""
    chosen = rng.sample(sorted(pool), min(len(want), len(pool)))
    out: list[tuple[int, str, list[int], str]] = []
    for j, (pid, n) in enumerate(zip(chosen, want, strict=False)):
        ids, texts = pool[pid]
        out += [(j, pid, ids, t) for t in texts[:n]]
    return out

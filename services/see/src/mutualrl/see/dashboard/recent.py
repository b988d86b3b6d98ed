"""Reads of a run's newest records, for what the dashboard shows beside a record: each policy's
tokenizer id and a recent sample of each policy's ROLLOUT records (newest first, bounded scan)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mutualrl.see.store import SeeStore
from mutualrl.see.store.entries import redis_op
from mutualrl.see.store.layout import Header
from mutualrl.v1 import experience_pb2 as pb

_PAGE = 512


async def newest_record_ids(store: SeeStore, run_id: str, kind: int, policies: Sequence[str],
                            per_policy: int, *, round_min: int | None = None,
                            round_max: int | None = None, budget: int = 20_000
                            ) -> dict[str, list[str]]:
    """Up to `per_policy` record ids of each policy, newest first, of rounds in the window;
    at most `budget` stream entries are examined."""
    stream = store.keys(run_id).stream(kind)
    want = set(policies)
    out: dict[str, list[str]] = {p: [] for p in policies}
    pos = "+"
    scanned = 0
    while want and scanned < budget:
        async with redis_op("dashboard_recent"):
            entries: Any = await store.r.xrevrange(stream, max=pos, min="-", count=_PAGE)
        if not entries:
            break
        for _, fields in entries:
            scanned += 1
            h = Header.of(fields)
            if h.policy_id not in want:
                continue
            if (round_min is not None and h.round < round_min) or \
                    (round_max is not None and h.round > round_max):
                continue
            out[h.policy_id].append(h.record_id)
            if len(out[h.policy_id]) >= per_policy:
                want.discard(h.policy_id)
        last = entries[-1][0]
        pos = "(" + (last.decode() if isinstance(last, bytes) else last)  # exclusive
    return out


async def load_records(store: SeeStore, run_id: str, record_ids: Sequence[str],
                       budget: int | None = None) -> list[pb.ExperienceRecord]:
    """Payloads of `record_ids` in order (those removed by retention are left out), as many as
    fit `budget` bytes (None: all; sized from the index before they are read)."""
    if not record_ids:
        return []
    async with redis_op("dashboard_recent"):
        payloads = await store.payloads(run_id, record_ids, budget)
    return [pb.ExperienceRecord.FromString(p) for p in payloads if p is not None]


class TokenizerIds:
    """Each policy's tokenizer id, learnt from its newest records (SEE does not own tokenizers:
    the records say which THL tokenizer their tokens come from). Cached once found."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], str] = {}

    async def of(self, store: SeeStore, run_id: str, policies: Sequence[str]) -> dict[str, str]:
        missing = [p for p in policies if (run_id, p) not in self._known]
        for kind in (pb.ROLLOUT, pb.VERIFIED_SUCCESS):
            if not missing:
                break
            ids = await newest_record_ids(store, run_id, kind, missing, 1, budget=4096)
            for rec in await load_records(store, run_id, [r for v in ids.values() for r in v]):
                if rec.tokenizer_id:
                    self._known[(run_id, rec.policy_id)] = rec.tokenizer_id
            missing = [p for p in missing if (run_id, p) not in self._known]
        return {p: self._known[(run_id, p)] for p in policies if (run_id, p) in self._known}


async def nearest_on_prompt(store: SeeStore, run_id: str, sid: str, prompt_id: str,
                            round_: int, policies: Sequence[str], budget: int = 4096
                            ) -> dict[str, str]:
    """For each policy, the id of its ROLLOUT record on `prompt_id` whose round is nearest
    `round_`. Records of one round lie close together in the stream, so the scan walks out
    from the stream id `sid` (ids are unique across a run's streams), back then forward, at
    most `budget` entries each way, and stops once every policy has a record of that round."""
    stream = store.keys(run_id).stream(pb.ROLLOUT)
    best: dict[str, tuple[int, str]] = {}

    def done() -> bool:
        return all(p in best and best[p][0] == 0 for p in policies)

    for forward in (False, True):
        pos = "(" + sid if forward else sid
        scanned = 0
        while not done() and scanned < budget:
            async with redis_op("dashboard_prompt"):
                entries: Any = await (store.r.xrange(stream, min=pos, max="+", count=_PAGE)
                                      if forward else
                                      store.r.xrevrange(stream, max=pos, min="-", count=_PAGE))
            if not entries:
                break
            for _, fields in entries:
                scanned += 1
                h = Header.of(fields)
                if h.prompt_id != prompt_id or h.policy_id not in policies:
                    continue
                gap = abs(h.round - round_)
                if h.policy_id not in best or gap < best[h.policy_id][0]:
                    best[h.policy_id] = (gap, h.record_id)
            last = entries[-1][0]
            pos = "(" + (last.decode() if isinstance(last, bytes) else last)
    return {p: rid for p, (_, rid) in best.items()}

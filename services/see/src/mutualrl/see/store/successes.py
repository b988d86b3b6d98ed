"""GetVerifiedSuccesses: peer successes per prompt, deduplicated by normalised text."""

from __future__ import annotations

from mutualrl.see import metrics as m
from mutualrl.see.store.entries import redis_op
from mutualrl.see.store.layout import as_str
from mutualrl.see.store.part import StorePart
from mutualrl.see.validate import normalise_text
from mutualrl.v1 import experience_pb2 as pb


class Successes(StorePart):
    async def successes(self, req: pb.SuccessesRequest) -> pb.SuccessesResponse:
        """Peer VERIFIED_SUCCESS records per prompt, deduplicated by normalised text (the
        earliest round wins among equal texts, then the policy and record id), own successes
        excluded."""
        cap = req.max_per_prompt or 16
        prompts = list(dict.fromkeys(req.prompt_ids))
        rk = self.runs.keys(req.run_id)
        me = req.policy_id
        async with redis_op("successes"), self.r.pipeline(transaction=False) as pipe:
            for p in prompts:
                pipe.hgetall(rk.successes(p))
            hashes = await pipe.execute()
        # Peer record ids per prompt, then their payloads.
        wanted = [[as_str(rid) for fld, rid in h.items() if as_str(fld).split("|", 1)[0] != me]
                  for h in hashes]
        flat = [rid for rids in wanted for rid in rids]
        async with redis_op("successes"):
            payloads = await self.payloads(rk, flat)
        by_id = {rid: pl for rid, pl in zip(flat, payloads, strict=True) if pl is not None}
        resp = pb.SuccessesResponse()
        taken: dict[tuple[str, int], int] = {}
        for p, rids in zip(prompts, wanted, strict=True):
            cands: list[pb.ExperienceRecord] = []
            for rid in rids:
                if rid not in by_id:
                    continue  # expired with its payload
                rec = pb.ExperienceRecord.FromString(by_id[rid])
                if rec.round < req.min_round:
                    continue
                cands.append(rec)
            # A fixed order, not arrival: a trainer replaying a seed reads the same texts.
            cands.sort(key=lambda r: (r.round, r.policy_id, r.record_id))
            seen: set[str] = set()
            ps = resp.prompts.add(prompt_id=p)
            for rec in cands:
                norm = normalise_text(rec.text)
                if norm in seen:
                    continue
                seen.add(norm)
                ps.successes.append(rec)
                key = (rec.policy_id, rec.round)
                taken[key] = taken.get(key, 0) + 1
                m.BYTES_OUT.labels("VERIFIED_SUCCESS").inc(rec.ByteSize())
                if len(ps.successes) >= cap:
                    break
        if taken:
            async with redis_op("successes"):
                await self._count_transfers(req.run_id, me, pb.VERIFIED_SUCCESS, taken)
        m.RECORDS_OUT.labels("VERIFIED_SUCCESS", "successes").inc(sum(taken.values()))
        return resp

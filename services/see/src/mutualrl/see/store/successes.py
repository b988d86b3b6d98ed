"""GetVerifiedSuccesses: peer successes per prompt, deduplicated by normalised text, in pages.

Everything that decides the answer is read before any record is: a prompt's success index
(`succ:<prompt>`, "<policy>|<text digest>" -> the record of each round that gave the text: the
digest is what deduplication compares), each candidate's index entry (`idx`: its stream id and
its length) and its stream header (its round). The candidates are ordered by (round, policy,
record id), deduplicated by text digest (the earliest round from `min_round` on wins) and cut to
`max_per_prompt`, and only then are payloads read, as many as fit the answer's byte budget. So a
prompt with 100 successes of 1 MiB costs one record's bytes at `max_per_prompt=1`, and an answer
that would pass the budget ends early with a token naming the last success given; the next page
goes on after it. A page examines at most `MAX_PAGE_CANDIDATES` candidates (whole prompts; at
least one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from mutualrl.common.errors import InvalidArgument
from mutualrl.see import metrics as m
from mutualrl.see.store.entries import Entry, redis_op
from mutualrl.see.store.layout import Header, as_str, parse_index_entry, success_record_ids
from mutualrl.see.store.paging import Budget, make_token, read_token, request_digest
from mutualrl.see.store.part import StorePart
from mutualrl.v1 import experience_pb2 as pb

MAX_PAGE_CANDIDATES = 65_536
"""Successes one page examines at most (whole prompts; at least one prompt)."""
_PROMPTS_PER_READ = 64
_SUCCESS_BYTES = 8
"""What an answer adds to a record (its tag and length)."""
_PROMPT_BYTES = 8


@dataclass(frozen=True, order=True)
class _Candidate:
    """One peer success of a prompt, in answer order."""

    round: int
    policy: str
    record_id: str
    digest: str
    loc: bytes


def _position(token: str, digest: str, n: int) -> tuple[int, tuple[int, str, str] | None]:
    """(prompt index, last success given of that prompt or None) a page starts from."""
    position = read_token(token, digest)
    if position is None:
        return 0, None
    wrong = InvalidArgument("page_token", "not a page token of this request")
    parts = position.split("|")
    if not parts[0].isdigit() or int(parts[0]) >= n:
        raise wrong
    if len(parts) == 1:
        return int(parts[0]), None
    if len(parts) != 4 or not parts[1].isdigit():
        raise wrong
    return int(parts[0]), (int(parts[1]), parts[2], parts[3])


class Successes(StorePart):
    async def successes(self, req: pb.SuccessesRequest) -> pb.SuccessesResponse:
        """One page of peer VERIFIED_SUCCESS records per prompt, deduplicated by normalised
        text (the earliest round wins among equal texts, then the policy and record id), own
        successes excluded."""
        cap = req.max_per_prompt or 16
        prompts = list(dict.fromkeys(req.prompt_ids))
        digest = request_digest(req.run_id, req.policy_id, prompts, req.max_per_prompt,
                                req.min_round)
        start, after = _position(req.page_token, digest, len(prompts))
        rk = self.runs.keys(req.run_id)
        room = Budget(self.cfg.limits.max_response_bytes)
        resp = pb.SuccessesResponse()
        chosen: list[tuple[str, _Candidate]] = []
        examined = 0
        i = start
        stop: str | None = None
        while i < len(prompts) and stop is None:
            group = prompts[i:i + _PROMPTS_PER_READ]
            per_prompt = await self._candidates(rk, group, req.policy_id, req.min_round)
            for p, cands in zip(group, per_prompt, strict=True):
                if examined and examined + len(cands) > MAX_PAGE_CANDIDATES:
                    stop = str(i)
                    break
                examined += len(cands)
                picked = _pick(cands, cap)
                if i == start and after is not None:
                    picked = [c for c in picked if (c.round, c.policy, c.record_id) > after]
                if not room.take(_PROMPT_BYTES + len(p.encode())):
                    stop = str(i)
                    break
                resp.prompts.add(prompt_id=p)
                given = 0
                for c in picked:
                    size = self.size_of(c.loc) + _SUCCESS_BYTES
                    if not room.take(size):
                        if i > start or chosen:
                            last = chosen[-1][1] if given else None
                            stop = (str(i) if last is None
                                    else f"{i}|{last.round}|{last.policy}|{last.record_id}")
                            break
                        room.force(size)  # the page's first record: a page always moves on
                    chosen.append((p, c))
                    given += 1
                if stop is not None:
                    if not given:
                        del resp.prompts[-1]
                    break
                i += 1
        if stop is not None:
            m.PAGES_CUT.labels("successes").inc()
            resp.next_page_token = make_token(digest, stop)
        await self._fill(rk, req, resp, chosen)
        return resp

    async def _candidates(self, rk: Any, prompts: Sequence[str], me: str, min_round: int
                          ) -> list[list[_Candidate]]:
        """Each prompt's peer successes of rounds >= min_round that are still stored."""
        async with redis_op("successes"), self.r.pipeline(transaction=False) as pipe:
            for p in prompts:
                pipe.hgetall(rk.successes(p))
            hashes = await pipe.execute()
        found: list[tuple[int, str, str, str]] = []  # (prompt, policy, digest, record id)
        for k, h in enumerate(hashes):
            for fld, value in h.items():
                policy, _, text_digest = as_str(fld).partition("|")
                if policy != me:
                    found += [(k, policy, text_digest, rid) for rid in success_record_ids(value)]
        out: list[list[_Candidate]] = [[] for _ in prompts]
        if not found:
            return out
        async with redis_op("successes"):
            locs = await self.locate(rk, [f[3] for f in found])
            live = [(f, loc) for f, loc in zip(found, locs, strict=True) if loc is not None]
            async with self.r.pipeline(transaction=False) as pipe:
                stream = rk.stream(pb.VERIFIED_SUCCESS)
                for _, loc in live:
                    sid = parse_index_entry(loc).stream_id
                    pipe.xrange(stream, min=sid, max=sid, count=1)
                headers = await pipe.execute()
        for (f, loc), entries in zip(live, headers, strict=True):
            if not entries:
                continue  # trimmed by retention with its payload
            h = Header.of(cast("list[Entry]", entries)[0][1])
            if h.round >= min_round:
                out[f[0]].append(_Candidate(h.round, f[1], f[3], f[2], loc))
        return out

    async def _fill(self, rk: Any, req: pb.SuccessesRequest, resp: pb.SuccessesResponse,
                    chosen: list[tuple[str, _Candidate]]) -> None:
        """Read the chosen records into their prompts and count what was taken."""
        if not chosen:
            return
        async with redis_op("successes"):
            payloads = await self.payloads_at(rk, [c.record_id for _, c in chosen],
                                              [c.loc for _, c in chosen])
        by_prompt = {ps.prompt_id: ps for ps in resp.prompts}
        taken: dict[tuple[str, int], int] = {}
        for (p, c), payload in zip(chosen, payloads, strict=True):
            if payload is None:
                continue  # went between the index read and this one
            rec = by_prompt[p].successes.add()
            rec.ParseFromString(payload)
            taken[(c.policy, c.round)] = taken.get((c.policy, c.round), 0) + 1
            m.BYTES_OUT.labels("VERIFIED_SUCCESS").inc(len(payload))
        if taken:
            async with redis_op("successes"):
                await self._count_transfers(req.run_id, req.policy_id, pb.VERIFIED_SUCCESS,
                                            taken)
        m.RECORDS_OUT.labels("VERIFIED_SUCCESS", "successes").inc(sum(taken.values()))


def _pick(cands: list[_Candidate], cap: int) -> list[_Candidate]:
    """The first `cap` distinct texts in answer order: a fixed order, not arrival, so a trainer
    replaying a seed reads the same texts."""
    seen: set[str] = set()
    out: list[_Candidate] = []
    for c in sorted(cands):
        if c.digest in seen:
            continue
        seen.add(c.digest)
        out.append(c)
        if len(out) >= cap:
            break
    return out

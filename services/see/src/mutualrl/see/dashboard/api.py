"""REST routes the dashboard is built from (read-only; each documented in SEE's OpenAPI).

| route | what |
|---|---|
| `GET /v1/session` | is a token needed, does the request carry the right one (open route) |
| `GET /v1/runs/{run}/metrics` | trainers' per-round metric rows after a cursor (live curves) |
| `GET /v1/runs/{run}/transfers` | the transfer matrix, run totals or over a round window |
| `GET /v1/runs/{run}/alignment` | one record's text under the sender's and each receiver's
  tokenizer, with THL's chunks, and each policy's rendering of its prompt |
| `GET /v1/runs/{run}/residual` | THL residual of each sender -> receiver pair over recent records |

Runs, policies, records and run stats come from the routes in `rest.py`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.security import HTTPBearer

from mutualrl.common.auth import rest_access
from mutualrl.common.bounds import MAX_ROUND
from mutualrl.common.ids import NAME, RECORD_KEY
from mutualrl.see.dashboard import convert, recent
from mutualrl.see.dashboard.models import (
    AlignmentOut,
    MetricRowOut,
    MetricsOut,
    PairResidualOut,
    ReceiverOut,
    RenderingOut,
    ResidualMatrixOut,
    SenderOut,
    SessionOut,
    TransferOut,
    TransferWindowOut,
)
from mutualrl.see.dashboard.thl_link import NOT_CONFIGURED, ThlError, ThlLink, ThlSession
from mutualrl.see.keys import kind_name
from mutualrl.see.route_params import STREAM_ID_PATTERN, RunId, TransferCursor, transfer_page
from mutualrl.see.store import SeeStore, transfers
from mutualrl.see.store.paging import Budget
from mutualrl.see.store.runmetrics import RunMetricsStore
from mutualrl.v1 import alignment_pb2 as apb
from mutualrl.v1 import experience_pb2 as pb

RoundMin = Annotated[int | None, Query(ge=0, le=MAX_ROUND, description="First round of the "
                                                                       "window (inclusive).")]
RoundMax = Annotated[int | None, Query(ge=0, le=MAX_ROUND,
                                       description="Last round of the window (inclusive; below "
                                                   "round_min: an empty window).")]
MAX_SAMPLE = 64
TOO_BIG = ("not shown: this answer reached SEE's byte budget (see.limits.max_response_bytes); "
           "the receivers before it are shown")


def _empty_window(round_min: int | None, round_max: int | None) -> bool:
    """round_max below round_min selects no round (an answer, not an error: each bound on its
    own is valid, and the OpenAPI document cannot state a rule between two parameters)."""
    return round_min is not None and round_max is not None and round_min > round_max


def make_router(store: SeeStore, token: str | None, thl: ThlLink) -> APIRouter:
    router = APIRouter()
    auth = [Depends(HTTPBearer(auto_error=False, description="Authorization: Bearer <token>"))]
    metrics = RunMetricsStore(store)
    tokenizer_ids = recent.TokenizerIds()

    @router.get("/v1/session", response_model=SessionOut, tags=["dashboard"],
                summary="Whether a token is needed and whether this request carries it "
                        "(no auth: the dashboard asks for the token only when needed).")
    async def session(request: Request) -> SessionOut:
        ok = rest_access(request.headers.get("authorization"), token) is None
        return SessionOut(auth_required=token is not None, authenticated=ok,
                          thl=thl.configured)

    @router.get("/v1/runs/{run_id}/metrics", response_model=MetricsOut, tags=["dashboard"],
                dependencies=auth,
                summary="Trainers' per-round metric rows after a cursor, in report order.")
    async def run_metrics(
        run_id: RunId,
        policy: Annotated[str | None, Query(pattern=NAME.pattern,
                                            description="Only this policy's rows.")] = None,
        after: Annotated[str | None, Query(pattern=STREAM_ID_PATTERN,
                                           description="`cursor` of the previous answer "
                                                       "(exclusive); omit to start at the "
                                                       "first row.")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000, description="Most rows returned.")] = 5000,
    ) -> MetricsOut:
        rows, cursor, more = await metrics.read(run_id, policy=policy, after=after, limit=limit)
        return MetricsOut(run_id=run_id, cursor=cursor, more=more,
                          rows=[MetricRowOut(cursor=r.cursor, policy_id=r.policy_id,
                                             round=r.round, unix_ms=r.unix_ms, values=r.values)
                                for r in rows])

    @router.get("/v1/runs/{run_id}/transfers", response_model=TransferWindowOut,
                tags=["dashboard"], dependencies=auth,
                summary="Records each policy took from each other, per kind: run totals "
                        "(= GetRunStats) or over a window of the records' rounds.")
    async def run_transfers(run_id: RunId, round_min: RoundMin = None,
                            round_max: RoundMax = None, cursor: TransferCursor = None
                            ) -> TransferWindowOut:
        rk = store.keys(run_id)
        counts: dict[tuple[str, str, int], int]
        if _empty_window(round_min, round_max):
            await store.get_run(run_id)  # 404s an unknown run
            counts = {}
        elif round_min is None and round_max is None:
            stats = await store.run_stats_all(run_id)  # also 404s an unknown run
            counts = {(t.taker_policy, t.source_policy, t.kind): t.count
                      for t in stats.transfers}
        else:
            await store.get_run(run_id)
            counts = await transfers.window(store.r, rk, round_min or 0,
                                            round_max if round_max is not None else MAX_ROUND)
        span = await transfers.round_range(store.r, rk)
        page, next_cursor = transfer_page([(*k, n) for k, n in counts.items()], cursor,
                                          store.cfg.limits.max_response_bytes)
        out = TransferWindowOut(run_id=run_id, round_min=round_min, round_max=round_max,
                                first_round=span[0] if span else None,
                                last_round=span[1] if span else None, transfers=[], matrix={},
                                next_cursor=next_cursor)
        for taker, source, kind, n in page:
            name = kind_name(kind)
            out.transfers.append(TransferOut(taker_policy=taker, source_policy=source,
                                             kind=name, count=n))
            out.matrix.setdefault(name, {}).setdefault(taker, {})[source] = n
        return out

    @router.get("/v1/runs/{run_id}/alignment", response_model=AlignmentOut, tags=["dashboard"],
                dependencies=auth,
                summary="A record's text under the sender's tokenizer and, through THL, under "
                        "each receiver's, with THL's chunks and each chunk's log-prob sum.")
    async def alignment(
        run_id: RunId,
        record_id: Annotated[str, Query(pattern=RECORD_KEY.pattern,
                                        description="The record to show.")],
    ) -> AlignmentOut:
        sid, rec = await store.get_record(run_id, record_id)
        run = await store.get_run(run_id)
        kind = kind_name(rec.kind)
        others = [p for p in run.config.policies if p != rec.policy_id]
        sender = SenderOut(policy_id=rec.policy_id, tokenizer_id=rec.tokenizer_id, tokens=[],
                           source="record", error=None)
        receivers = [ReceiverOut(policy_id=p, tokenizer_id=None, tokens=[], chunks=[],
                                 residual=None, error=None) for p in others]
        out = AlignmentOut(run_id=run_id, record_id=rec.record_id, kind=kind, round=rec.round,
                           prompt_id=rec.prompt_id, prompt_text=rec.prompt_text,
                           rendered_prompt=rec.meta.get("rendered_prompt"), text=rec.text,
                           reward=rec.reward, sender=sender, receivers=receivers,
                           peer_renderings=await _renderings(store, run_id, sid, rec, others))

        def fail_all(msg: str) -> AlignmentOut:
            for r in receivers:
                r.error = r.error or msg
            return out

        if rec.kind == pb.REWARD_STATS or not rec.text:
            sender.error = "this record carries no completion text (REWARD_STATS holds " \
                           "reward statistics only)"
            return fail_all(sender.error)
        if convert.has_tokens(rec):
            sender.tokens = convert.record_tokens(rec)
        elif not thl.configured:
            sender.error = "the record carries no tokens; " + NOT_CONFIGURED
            return fail_all(NOT_CONFIGURED)
        if not thl.configured:
            return fail_all(NOT_CONFIGURED)
        tids = await tokenizer_ids.of(store, run_id, others)
        try:
            async with thl.session() as link:
                if not sender.tokens:
                    tt = (await link.retokenize(rec.tokenizer_id, [rec.text])).results[0]
                    sender.tokens, sender.source = convert.tokenized_tokens(tt), "thl"
                item = convert.trace_item(rec, sender.tokens)
                with_lp = any(t.logprob is not None for t in sender.tokens)
                room = Budget(store.cfg.limits.max_response_bytes)
                room.take(convert.json_size(out))
                for i, r in enumerate(receivers):
                    tid = tids.get(r.policy_id)
                    if tid is None:
                        r.error = f"{r.policy_id} has published no record yet, so its " \
                                  "tokenizer is not known"
                        continue
                    try:
                        res = await link.align(rec.tokenizer_id, tid, [item])
                    except ThlError as err:
                        r.tokenizer_id, r.error = tid, str(err)
                        continue
                    shown = convert.receiver_out(r.policy_id, tid, res.results[0], with_lp)
                    if not room.take(convert.json_size(shown)):
                        r.tokenizer_id, r.error = tid, TOO_BIG
                        continue
                    receivers[i] = shown
        except ThlError as err:
            if not sender.tokens:
                sender.error = str(err)
            return fail_all(str(err))
        out.receivers = receivers
        return out

    @router.get("/v1/runs/{run_id}/residual", response_model=ResidualMatrixOut,
                tags=["dashboard"], dependencies=auth,
                summary="THL residual of every sender -> receiver pair over each sender's "
                        "newest ROLLOUT records (in the round window).")
    async def residual(
        run_id: RunId, round_min: RoundMin = None, round_max: RoundMax = None,
        sample: Annotated[int, Query(ge=1, le=MAX_SAMPLE, description="Records per sender "
                                                                      "(newest first).")] = 16,
    ) -> ResidualMatrixOut:
        run = await store.get_run(run_id)
        policies = list(run.config.policies)
        out = ResidualMatrixOut(run_id=run_id, sample=sample, round_min=round_min,
                                round_max=round_max, pairs=[])
        if _empty_window(round_min, round_max):
            return out
        ids = await recent.newest_record_ids(store, run_id, pb.ROLLOUT, policies, sample,
                                             round_min=round_min, round_max=round_max)
        items: dict[str, tuple[str, list[apb.TraceItem]]] = {}
        # What the records loaded take at most: each policy's share of the answer's budget.
        share = store.cfg.limits.max_response_bytes // max(1, len(policies))
        for p in policies:
            recs = [r for r in await recent.load_records(store, run_id, ids[p], budget=share)
                    if convert.has_tokens(r) and r.text]
            if recs:
                items[p] = (recs[0].tokenizer_id,
                            [convert.trace_item(r, convert.record_tokens(r)) for r in recs
                             if r.tokenizer_id == recs[0].tokenizer_id])
        pairs = [(s, t) for s in policies for t in policies if s != t]
        if not thl.configured:
            out.pairs = [convert.pair_error(s, t, NOT_CONFIGURED) for s, t in pairs]
            return out
        tids = await tokenizer_ids.of(store, run_id, policies)
        try:
            async with thl.session() as link:
                for s, t in pairs:
                    out.pairs.append(await _pair(link, s, t, items, tids))
        except ThlError as err:
            out.pairs = [convert.pair_error(s, t, str(err)) for s, t in pairs]
        return out

    return router


async def _renderings(store: SeeStore, run_id: str, sid: str, rec: pb.ExperienceRecord,
                      others: list[str]) -> list[RenderingOut]:
    """Each other policy's rendering of the record's prompt, from its nearest-round ROLLOUT."""
    ids = await recent.nearest_on_prompt(store, run_id, sid, rec.prompt_id, rec.round, others)
    found = {r.policy_id: r for r in
             await recent.load_records(store, run_id, [ids[p] for p in others if p in ids])}
    return [RenderingOut(policy_id=p, record_id=found[p].record_id, round=found[p].round,
                         rendered_prompt=found[p].meta.get("rendered_prompt"))
            if p in found else
            RenderingOut(policy_id=p, record_id=None, round=None, rendered_prompt=None)
            for p in others]


async def _pair(link: ThlSession, source: str, target: str,
                items: dict[str, tuple[str, list[apb.TraceItem]]],
                tids: dict[str, str]) -> PairResidualOut:
    if source not in items:
        return convert.pair_error(source, target, f"{source} has no ROLLOUT record with "
                                                  "tokens in the window")
    if target not in tids:
        return convert.pair_error(source, target, f"{target} has published no record yet, so "
                                                  "its tokenizer is not known")
    src_tid, batch = items[source]
    try:
        resp = await link.align(src_tid, tids[target], batch)
    except ThlError as err:
        return convert.pair_error(source, target, str(err))
    return convert.pair_residual(source, target, batch, resp)

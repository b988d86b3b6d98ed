"""REST inspection API of SEE (FastAPI), served next to the gRPC server in the same process.

Routes: /v1/runs, /v1/runs/{run}, /v1/runs/{run}/policies, /v1/runs/{run}/records (filters,
cursor pagination), /v1/runs/{run}/records/{record_id}, /v1/runs/{run}/stats (with the transfer
matrix), /healthz, /metrics, /docs, and the dashboard at /ui with the routes it reads
(`dashboard/api.py`: session, metrics, windowed transfers, alignment, residual). When a token is
configured every route but /healthz (and, if `public_docs`, /docs + /openapi.json; if
`public_metrics`, /metrics) needs `Authorization: Bearer <token>`, else 401; /v1/session and the
dashboard's pages (no data) are open too.

Every answer is bounded by bytes, not only by rows: a listing ends its page early when the next
entry would take it past `see.limits.max_response_bytes` (sized before it is loaded) and names
where the next page starts (`next_cursor`; the metric rows' `more`).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from pydantic import BaseModel, Field

from mutualrl.common import token_arrays as ta
from mutualrl.common.auth import rest_access
from mutualrl.common.bounds import MAX_ROUND
from mutualrl.common.errors import InvalidArgument, ServiceError
from mutualrl.common.ids import RUN_ID
from mutualrl.see import dashboard
from mutualrl.see.keys import KINDS, kind_name
from mutualrl.see.route_params import (
    JSON_GROWTH,
    Cursor,
    PolicyFilter,
    RecordKey,
    RunId,
    TransferCursor,
    transfer_page,
)
from mutualrl.see.store import SeeStore
from mutualrl.v1 import experience_pb2 as pb

FINISH_NAMES = {v: k.removeprefix("FINISH_REASON_") for k, v in pb.FinishReason.items()}


class RetentionOut(BaseModel):
    max_stream_len: int = Field(description="Approximate entries kept per stream.")
    ttl_seconds: int = Field(description="Seconds the run's keys live after its last write.")
    max_rounds: int = Field(description="Rounds of REWARD_STATS kept queryable.")


class RunOut(BaseModel):
    run_id: str
    policies: list[str] = Field(description="Policies taking part in the run.")
    tau: float = Field(description="Success threshold of VERIFIED_SUCCESS records.")
    retention: RetentionOut = Field(description="Effective retention (server defaults filled in).")
    created_unix_ms: int


class RunsOut(BaseModel):
    runs: list[RunOut] = Field(description="In run id order.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null when "
                                                "the listing is exhausted.")


class PolicyOut(BaseModel):
    policy_id: str
    published: dict[str, int] = Field(description="Stored records per kind.")
    total: int = Field(description="Stored records of every kind.")
    taken: int = Field(description="Records of peers this policy took (all kinds).")
    given: int = Field(description="Records of this policy that peers took (all kinds).")


class PoliciesOut(BaseModel):
    run_id: str
    policies: list[PolicyOut]


class StatsModel(BaseModel):
    count: int
    sum: float
    sum_sq: float
    max: float


class RecordSummary(BaseModel):
    cursor: str = Field(description="Stream id of the record (pass as `cursor` to page on).")
    record_id: str
    kind: str
    policy_id: str
    policy_version: int
    round: int
    prompt_id: str
    reward: float
    verified: bool
    finish_reason: str
    num_tokens: int
    text_preview: str = Field(description="First 120 characters of the completion.")
    created_unix_ms: int


class RecordsOut(BaseModel):
    records: list[RecordSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; "
                                                "null when the listing is exhausted.")
    scanned: int = Field(description="Stream entries examined for this page.")


class RecordOut(RecordSummary):
    run_id: str
    prompt_text: str
    text: str
    tokenizer_id: str
    token_ids: list[int]
    offset_starts: list[int]
    offset_ends: list[int]
    logprobs: list[float]
    stats: StatsModel | None
    meta: dict[str, str]


class TransferOut(BaseModel):
    taker_policy: str
    source_policy: str
    kind: str
    count: int


class StatsOut(BaseModel):
    run_id: str
    policies: list[PolicyOut]
    transfers: list[TransferOut]
    matrix: dict[str, dict[str, dict[str, int]]] = Field(
        description="kind -> taker -> source -> records taken (counted at delivery).")
    trimmed: dict[str, int] = Field(description="Entries removed by retention per stream.")
    stream_lengths: dict[str, int] = Field(description="Entries held per stream now.")
    duplicates: int = Field(description="Publishes of an already stored record id.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page of "
                                                "`transfers` (and `matrix`); null: the last.")


class ErrorOut(BaseModel):
    detail: str
    field: str | None = None


def _summary(cursor: str, rec: pb.ExperienceRecord) -> dict[str, object]:
    return dict(cursor=cursor, record_id=rec.record_id, kind=kind_name(rec.kind),
                policy_id=rec.policy_id, policy_version=rec.policy_version, round=rec.round,
                prompt_id=rec.prompt_id, reward=rec.reward, verified=rec.verified,
                finish_reason=FINISH_NAMES.get(rec.finish_reason, str(rec.finish_reason)),
                num_tokens=ta.n_tokens(rec), text_preview=rec.text[:120],
                created_unix_ms=rec.created_unix_ms)


def _policies(stats: pb.RunStats) -> list[PolicyOut]:
    taken: dict[str, int] = {}
    given: dict[str, int] = {}
    for t in stats.transfers:
        taken[t.taker_policy] = taken.get(t.taker_policy, 0) + t.count
        given[t.source_policy] = given.get(t.source_policy, 0) + t.count
    return [PolicyOut(policy_id=p.policy_id, published=dict(p.published),
                      total=sum(p.published.values()), taken=taken.get(p.policy_id, 0),
                      given=given.get(p.policy_id, 0)) for p in stats.policies]


def create_app(store: SeeStore, token: str | None = None) -> FastAPI:
    """The REST app over `store`; `token` None disables auth."""
    cfg = store.cfg
    app = FastAPI(
        title="MutualRL Shared Experience Exchange",
        version="1",
        description="Inspect the experience policies exchange: runs, per-policy counts, "
                    "records (filters, cursor pagination), one record in full, run statistics "
                    "with the transfer matrix.",
        responses={401: {"model": ErrorOut}, 403: {"model": ErrorOut}, 404: {"model": ErrorOut},
                   400: {"model": ErrorOut}},
    )
    bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <token>")
    open_paths = {"/healthz", "/v1/session"}
    if cfg.public_docs:
        open_paths |= {"/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"}
    if cfg.public_metrics:
        open_paths.add("/metrics")

    @app.middleware("http")
    async def auth(request: Request,
                   call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        if token and path not in open_paths and not dashboard.is_public(path):
            refused = rest_access(request.headers.get("authorization"), token)
            if refused == 401:
                return JSONResponse({"detail": "missing or invalid bearer token", "field": None},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            if refused is not None:
                return JSONResponse({"detail": "a policy's token is for its trainer's gRPC "
                                     "calls; read with the read token", "field": None},
                                    status_code=refused)
        return await call_next(request)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, err: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": str(err), "field": err.field or None},
                            status_code=err.http_status)

    @app.get("/healthz", tags=["ops"], summary="Liveness and Redis reachability (no auth).")
    async def healthz() -> JSONResponse:
        ok = await store.ping()
        return JSONResponse({"status": "ok" if ok else "redis unreachable", "redis": ok},
                            status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics (text format).",
             response_class=PlainTextResponse)
    async def metrics() -> Response:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # several workers: sum their files
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    def run_out(run: pb.Run) -> RunOut:
        ret = store.retention(run)
        return RunOut(run_id=run.config.run_id, policies=list(run.config.policies),
                      tau=run.config.tau,
                      retention=RetentionOut(max_stream_len=ret.max_stream_len,
                                             ttl_seconds=ret.ttl_seconds,
                                             max_rounds=ret.max_rounds),
                      created_unix_ms=run.created_unix_ms)

    # Documents the scheme in OpenAPI (the /docs "Authorize" button); the middleware enforces it.
    auth_dep = [Depends(bearer)]

    @app.get("/v1/runs", response_model=RunsOut, tags=["runs"], dependencies=auth_dep,
             summary="Every run with its config, in pages.")
    async def list_runs(
        cursor: Annotated[str | None, Query(pattern=RUN_ID.pattern, description="next_cursor "
                                            "of the previous page (a run id).")] = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="Page size.")] = 100,
    ) -> RunsOut:
        runs, last = await store.runs.list_page(limit, cursor, cfg.limits.max_response_bytes
                                                // JSON_GROWTH)
        return RunsOut(runs=[run_out(r) for r in runs], next_cursor=last)

    @app.get("/v1/runs/{run_id}", response_model=RunOut, tags=["runs"], dependencies=auth_dep,
             summary="One run's config.")
    async def get_run(run_id: RunId) -> RunOut:
        return run_out(await store.get_run(run_id, use_cache=False))

    @app.get("/v1/runs/{run_id}/policies", response_model=PoliciesOut, tags=["runs"],
             dependencies=auth_dep, summary="The run's policies with their record counts.")
    async def policies(run_id: RunId) -> PoliciesOut:
        stats = await store.run_stats_all(run_id)
        return PoliciesOut(run_id=run_id, policies=_policies(stats))

    @app.get("/v1/runs/{run_id}/records", response_model=RecordsOut, tags=["records"],
             dependencies=auth_dep, summary="Records in publish order, filtered and paged.")
    async def records(
        run_id: RunId,
        kind: Annotated[Literal["ROLLOUT", "REWARD_STATS", "VERIFIED_SUCCESS"] | None,
                        Query(description="Record kind.")] = None,
        policy: PolicyFilter = None,
        prompt: Annotated[str | None, Query(description="Prompt id.")] = None,
        round_min: Annotated[int | None, Query(ge=0, le=MAX_ROUND,
                                               description="Smallest round.")] = None,
        round_max: Annotated[int | None, Query(ge=0, le=MAX_ROUND,
                                               description="Largest round.")] = None,
        verified: Annotated[bool | None, Query(description="Verifier outcome.")] = None,
        cursor: Cursor = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="Page size.")] = 100,
    ) -> RecordsOut:
        kinds: tuple[int, ...] = KINDS
        if kind is not None:
            names = {kind_name(k): k for k in KINDS}
            if kind.upper() not in names:
                raise InvalidArgument("kind", f"must be one of {', '.join(names)}")
            kinds = (names[kind.upper()],)
        page = await store.list_records(run_id, kinds=kinds, policy=policy, prompt=prompt,
                                        round_min=round_min, round_max=round_max,
                                        verified=verified, cursor=cursor, limit=limit)
        return RecordsOut(records=[RecordSummary(**_summary(c, r)) for c, r in page.records],
                          next_cursor=page.next_cursor, scanned=page.scanned)

    @app.get("/v1/runs/{run_id}/records/{record_id:path}", response_model=RecordOut,
             tags=["records"], dependencies=auth_dep,
             summary="One record in full: text, tokens, offsets, log-probs, rewards.")
    async def record(run_id: RunId, record_id: RecordKey) -> RecordOut:
        cursor, rec = await store.get_record(run_id, record_id)
        stats = None
        if rec.HasField("stats"):
            st = rec.stats
            stats = StatsModel(count=st.count, sum=st.sum, sum_sq=st.sum_sq, max=st.max)
        return RecordOut(**_summary(cursor, rec), run_id=rec.run_id, prompt_text=rec.prompt_text,
                         text=rec.text, tokenizer_id=rec.tokenizer_id,
                         token_ids=ta.token_ids(rec).tolist(),
                         offset_starts=ta.offset_starts(rec).tolist(),
                         offset_ends=ta.offset_ends(rec).tolist(),
                         logprobs=ta.logprobs(rec).tolist(),
                         stats=stats, meta=dict(rec.meta))

    @app.get("/v1/runs/{run_id}/stats", response_model=StatsOut, tags=["runs"],
             dependencies=auth_dep,
             summary="Per-run statistics with the transfer matrix (taker x source per kind).")
    async def stats(run_id: RunId, cursor: TransferCursor = None) -> StatsOut:
        st = await store.run_stats_all(run_id)
        page, next_cursor = transfer_page(
            [(t.taker_policy, t.source_policy, t.kind, t.count) for t in st.transfers], cursor,
            cfg.limits.max_response_bytes)
        matrix: dict[str, dict[str, dict[str, int]]] = {}
        transfers = []
        for taker, source, kind, count in page:
            kname = kind_name(kind)
            transfers.append(TransferOut(taker_policy=taker, source_policy=source, kind=kname,
                                         count=count))
            matrix.setdefault(kname, {}).setdefault(taker, {})[source] = count
        return StatsOut(run_id=run_id, policies=_policies(st), transfers=transfers,
                        matrix=matrix, trimmed=dict(st.trimmed),
                        stream_lengths=dict(st.stream_lengths), duplicates=st.duplicates,
                        next_cursor=next_cursor)

    dashboard.mount(app, store, token)
    return app


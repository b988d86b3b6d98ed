"""gRPC `mutualrl.v1.Alignment`: a thin shell over `AlignmentEngine` plus Prometheus metrics.

A body that is not valid protobuf becomes INVALID_ARGUMENT in the shared server
(`mutualrl.common.request_parsing`). Engine work (tokenization, alignment) runs in worker
threads so the event loop keeps answering health checks and other calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import grpc

from mutualrl.common import alignment_wire as wire
from mutualrl.common.errors import InvalidArgument, ResourceExhausted, grpc_errors
from mutualrl.thl import metrics
from mutualrl.thl.engine import AlignmentEngine
from mutualrl.v1 import alignment_pb2 as pb
from mutualrl.v1 import runs_pb2 as runs_pb

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Alignment"].full_name



class RequestBudget:
    """Request bytes worked on at once, at most `limit` (one call alone always runs): what
    bounds THL's working memory across concurrent calls."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.in_use = 0

    @contextlib.contextmanager
    def hold(self, size: int, field: str) -> Iterator[None]:
        if self.limit is not None and self.in_use and self.in_use + size > self.limit:
            raise ResourceExhausted(field, f"this THL process is working on {self.in_use} B of "
                                    f"requests (at most {self.limit} B at once, "
                                    "thl.max_inflight_request_bytes); retry later")
        self.in_use += size
        metrics.INFLIGHT_BYTES.set(self.in_use)
        try:
            yield
        finally:
            self.in_use -= size
            metrics.INFLIGHT_BYTES.set(self.in_use)


class AlignmentServicer:
    """Implements the Alignment RPCs on an engine."""

    def __init__(self, engine: AlignmentEngine, max_inflight_request_bytes: int | None = None
                 ) -> None:
        self.engine = engine
        self.budget = RequestBudget(max_inflight_request_bytes)
        registry = engine.registry
        metrics.CACHE_ENTRIES.set_function(lambda: len(registry.cached_ids()))
        metrics.CACHE_BYTES.set_function(lambda: registry.cached_bytes)

    @grpc_errors
    async def RegisterTokenizer(self, request: pb.RegisterTokenizerRequest,
                                context: grpc.aio.ServicerContext) -> pb.TokenizerInfo:
        info = await asyncio.to_thread(self.engine.register, request.tokenizer_id, request.path,
                                       request.overwrite, request.run_id)
        return wire.info_to_pb(info)

    @grpc_errors
    async def DeleteRun(self, request: runs_pb.DeleteRunRequest,
                        context: grpc.aio.ServicerContext) -> runs_pb.DeleteRunResponse:
        deleted = await asyncio.to_thread(self.engine.delete_run, request.run_id)
        return runs_pb.DeleteRunResponse(run_id=request.run_id, deleted=deleted)

    @grpc_errors
    async def ListTokenizers(self, request: pb.ListTokenizersRequest,
                             context: grpc.aio.ServicerContext) -> pb.ListTokenizersResponse:
        infos = await asyncio.to_thread(self.engine.list)
        return pb.ListTokenizersResponse(tokenizers=[wire.info_to_pb(i) for i in infos])

    @grpc_errors
    async def Retokenize(self, request: pb.RetokenizeRequest,
                         context: grpc.aio.ServicerContext) -> pb.RetokenizeResponse:
        if len(request.texts) > self.engine.limits.max_batch:  # before the budget and copies
            raise InvalidArgument("texts", f"{len(request.texts)} entries, over the limit of "
                                  f"{self.engine.limits.max_batch} per call")
        # The answer is built under the budget too: it is as large as the work.
        with self.budget.hold(request.ByteSize(), "texts"):
            return await asyncio.to_thread(self._retokenize, request)

    def _retokenize(self, request: pb.RetokenizeRequest) -> pb.RetokenizeResponse:
        results = self.engine.retokenize(request.tokenizer_id, list(request.texts),
                                         request.add_special_tokens, request.apply_chat_template)
        target = request.tokenizer_id
        for r in results:
            metrics.observe_text("Retokenize", target, r.residual)
        metrics.ITEMS.labels("Retokenize", target).inc(len(results))
        metrics.TARGET_TOKENS.labels("Retokenize", target).inc(
            sum(len(r.token_ids) for r in results))
        return pb.RetokenizeResponse(results=[wire.tokenized_to_pb(r) for r in results])

    @grpc_errors
    async def AlignTrace(self, request: pb.AlignTraceRequest,
                         context: grpc.aio.ServicerContext) -> pb.AlignTraceResponse:
        if request.mode not in wire.MODE_FROM_PB:
            raise InvalidArgument("mode", f"unknown AlignMode {request.mode}")
        if request.placement not in wire.PLACEMENT_FROM_PB:
            raise InvalidArgument("placement", f"unknown Placement {request.placement}")
        if len(request.items) > self.engine.limits.max_batch:  # before converting them all
            raise InvalidArgument("items", f"{len(request.items)} entries, over the limit of "
                                  f"{self.engine.limits.max_batch} per call")
        with self.budget.hold(request.ByteSize(), "items"):
            return await asyncio.to_thread(self._align_trace, request)

    def _align_trace(self, request: pb.AlignTraceRequest) -> pb.AlignTraceResponse:
        items = [wire.item_from_pb(it, i) for i, it in enumerate(request.items)]
        result = self.engine.align_trace(
            request.source_tokenizer_id, request.target_tokenizer_id, items,
            wire.MODE_FROM_PB[request.mode], wire.PLACEMENT_FROM_PB[request.placement])
        target = request.target_tokenizer_id
        for a, it in zip(result.results, items, strict=True):
            metrics.observe_text("AlignTrace", target, a.residual)
            metrics.SHARE.labels(target).observe(a.residual.multi_token_chunk_share)
            metrics.SOURCE_TOKENS.labels(target).inc(len(it.source_token_ids))
            metrics.CHUNKS.labels(target).inc(len(a.chunks))
            nt = a.chunks.target_end - a.chunks.target_start
            metrics.MULTI_TOKEN_TARGET_TOKENS.labels(target).inc(int(nt[~a.chunks.clean].sum()))
            if a.mass_error != 0.0:
                metrics.MASS_ERROR.labels(target).inc()
        metrics.ITEMS.labels("AlignTrace", target).inc(len(result.results))
        metrics.TARGET_TOKENS.labels("AlignTrace", target).inc(
            sum(len(a.target_token_ids) for a in result.results))
        return wire.result_to_pb(result)


_METHODS = (
    ("RegisterTokenizer", pb.RegisterTokenizerRequest, pb.TokenizerInfo),
    ("ListTokenizers", pb.ListTokenizersRequest, pb.ListTokenizersResponse),
    ("Retokenize", pb.RetokenizeRequest, pb.RetokenizeResponse),
    ("AlignTrace", pb.AlignTraceRequest, pb.AlignTraceResponse),
    ("DeleteRun", runs_pb.DeleteRunRequest, runs_pb.DeleteRunResponse),
)


def add_to_server(servicer: AlignmentServicer, server: grpc.aio.Server) -> None:
    """Register the servicer (the shared server answers unparsable bodies)."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name), request_deserializer=req.FromString,
            response_serializer=resp.SerializeToString)
        for name, req, resp in _METHODS
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          handlers),))

"""gRPC `mutualrl.v1.Alignment`: a thin shell over `AlignmentEngine` plus Prometheus metrics.

A body that is not valid protobuf becomes INVALID_ARGUMENT in the shared server
(`mutualrl.common.request_parsing`). Engine work (tokenization, alignment) runs in worker
threads so the event loop keeps answering health checks and other calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from mutualrl.common import alignment_wire as wire
from mutualrl.common.alignment_types import TokenizerInfo
from mutualrl.common.errors import InvalidArgument, ResourceExhausted, grpc_errors
from mutualrl.thl import metrics
from mutualrl.thl.engine import AlignmentEngine
from mutualrl.v1 import alignment_pb2 as pb
from mutualrl.v1 import runs_pb2 as runs_pb

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Alignment"].full_name

# A call whose request is at least this large hands its freed memory back to the OS afterwards.
TRIM_AFTER_BYTES = 256 * 1024


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim: freed blocks of a large call otherwise stay in the heap of the thread
    that worked on it (resident, though free) until that heap happens to be reused."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_MALLOC_TRIM = _load_malloc_trim()



@contextlib.contextmanager
def _trimmed(request_bytes: int) -> Iterator[None]:
    try:
        yield
    finally:
        if _MALLOC_TRIM is not None and request_bytes >= TRIM_AFTER_BYTES:
            _MALLOC_TRIM(0)


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

    def __init__(self, engine: AlignmentEngine, max_inflight_request_bytes: int | None = None,
                 work_threads: int = 2) -> None:
        self.engine = engine
        self.budget = RequestBudget(max_inflight_request_bytes)
        # Retokenize / AlignTrace run here: each working call holds a block of Encodings and
        # its answer, so how many run at once bounds memory as much as the budget does.
        self._work = ThreadPoolExecutor(max_workers=max(1, work_threads),
                                        thread_name_prefix="thl-work")
        registry = engine.registry
        metrics.CACHE_ENTRIES.set_function(lambda: len(registry.cached_ids()))
        metrics.CACHE_BYTES.set_function(lambda: registry.cached_bytes)
        registry.on_drop.append(metrics.forget_target)

    @grpc_errors
    async def RegisterTokenizer(self, request: pb.RegisterTokenizerRequest,
                                context: grpc.aio.ServicerContext) -> pb.TokenizerInfo:
        info = await asyncio.to_thread(self._register, request)
        return wire.info_to_pb(info)

    def _register(self, request: pb.RegisterTokenizerRequest) -> TokenizerInfo:
        with _trimmed(TRIM_AFTER_BYTES):  # a load parses the whole tokenizer.json
            return self.engine.register(request.tokenizer_id, request.path, request.overwrite,
                                        request.run_id)

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
        # A call over the limits is refused before it waits for (or is refused by) the budget.
        self.engine.check_texts(request.texts, "texts")
        # The answer is built under the budget too: it is as large as the work.
        with self.budget.hold(request.ByteSize(), "texts"):
            return await asyncio.get_running_loop().run_in_executor(
                self._work, self._retokenize, request)

    def _retokenize(self, request: pb.RetokenizeRequest) -> pb.RetokenizeResponse:
        with _trimmed(request.ByteSize()):
            return self._retokenize_response(request)

    def _retokenize_response(self, request: pb.RetokenizeRequest) -> pb.RetokenizeResponse:
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
        self.engine.check_texts([it.text for it in request.items], "items")
        with self.budget.hold(request.ByteSize(), "items"):
            return await asyncio.get_running_loop().run_in_executor(
                self._work, self._align_trace, request)

    def close(self) -> None:
        """Stop the work threads (calls still queued are cancelled)."""
        self._work.shutdown(wait=False, cancel_futures=True)

    def _align_trace(self, request: pb.AlignTraceRequest) -> pb.AlignTraceResponse:
        with _trimmed(request.ByteSize()):
            return self._align_trace_response(request)

    def _align_trace_response(self, request: pb.AlignTraceRequest) -> pb.AlignTraceResponse:
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

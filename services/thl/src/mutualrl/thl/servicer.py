"""gRPC `mutualrl.v1.Alignment`: a thin shell over `AlignmentEngine` plus Prometheus metrics.

A body that is not valid protobuf becomes INVALID_ARGUMENT (in the shared server, or, for
Retokenize and AlignTrace, which parse their own, here, naming the item that does not parse).
Engine work (tokenization, alignment) runs in worker threads so the event loop keeps answering
health checks and other calls.

What bounds THL's memory whatever clients send, in the order a call meets it: the request
bytes held at once (the shared server's budget, `thl.max_inflight_request_bytes`, taken before
the body is read and held until the answer is sent); the per-call limits, from the request's
lengths alone (INVALID_ARGUMENT / RESOURCE_EXHAUSTED before anything is parsed, queued or
converted); then the working memory calls may take at once (`WorkBudget`,
`thl.max_working_bytes`): a call whose need (`engine.working_bytes`) does not fit waits its
turn (one call alone always runs), on at most `thl.work_threads` threads. An AlignTrace
request is kept as its bytes and its items parsed one at a time (`_RequestItems`), and a
call's answer is written to the wire item by item (`alignment_wire`), so what it holds is its
request's bytes, one block's work and its answer's bytes. docs/reliability.md states the
peak this gives and the test that measures it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast, overload

import grpc
from google.protobuf.message import DecodeError, Message

from mutualrl.common import alignment_wire as wire
from mutualrl.common import memory, wire_scan
from mutualrl.common.alignment_types import (
    Residual,
    TokenizerInfo,
    TraceItem,
    aggregate_residual,
)
from mutualrl.common.errors import InvalidArgument, grpc_errors
from mutualrl.common.request_parsing import UnparsableRequest
from mutualrl.thl import metrics
from mutualrl.thl.engine import AlignmentEngine, working_bytes
from mutualrl.v1 import alignment_pb2 as pb
from mutualrl.v1 import runs_pb2 as runs_pb

M = TypeVar("M", bound=Message)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Alignment"].full_name

@contextlib.contextmanager
def _trimmed(request_bytes: int) -> Iterator[None]:
    try:
        yield
    finally:
        if request_bytes >= memory.TRIM_AFTER_BYTES:
            memory.trim()


class WorkBudget:
    """Working memory the running calls may take together, at most `limit` bytes: a call
    waits, in arrival order, until its need fits; a call alone always runs. A call holds its
    share until its answer has been sent (the RPC's done callback), so the next large call
    does not start while the last one's answer is still in memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = (
            collections.deque())

    async def acquire(self, need: int) -> None:
        if not self._waiting and (self.in_use == 0 or self.in_use + need <= self.limit):
            self._take(need)
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append((need, turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release(need)  # admitted as the caller went away
            else:
                self._waiting.remove((need, turn))
                self._admit()
            raise

    def release(self, need: int) -> None:
        self.in_use -= need
        metrics.WORKING_BYTES.set(self.in_use)
        self._admit()

    def _take(self, need: int) -> None:
        self.in_use += need
        metrics.WORKING_BYTES.set(self.in_use)

    def _admit(self) -> None:
        while self._waiting:
            need, turn = self._waiting[0]
            if self.in_use and self.in_use + need > self.limit:
                return
            self._waiting.popleft()
            self._take(need)
            turn.set_result(None)


_ITEMS_FIELD = pb.AlignTraceRequest.DESCRIPTOR.fields_by_name["items"].number
_TEXTS_FIELD = pb.RetokenizeRequest.DESCRIPTOR.fields_by_name["texts"].number
_MAX_OTHER_FIELDS = 64
"""Fields besides its items a request may hold (a real one has at most four)."""


def _split_items(data: bytes, max_items: int) -> tuple[bytes, list[memoryview]]:
    """An AlignTraceRequest's bytes as the request without its items and each item's bytes,
    read from the top-level fields' tags and lengths alone (DecodeError when they do not
    parse): the items are parsed one at a time when they are used. Stops at `max_items` + 1
    items (the request is refused for them; what it holds beyond is not read)."""
    view = memoryview(data)
    fields = wire_scan.Fields(data, max_items + 1 + _MAX_OTHER_FIELDS)
    rest: list[memoryview] = []
    items: list[memoryview] = []
    for tag, start, body, end in fields.fields():
        if tag == _ITEMS_FIELD << 3 | wire_scan.LENGTH_DELIMITED:
            items.append(view[body:end])
            if len(items) > max_items:
                break
        else:
            rest.append(view[start:end])
    return b"".join(rest), items


class _RequestItems(Sequence[TraceItem]):
    """An AlignTrace request's items, kept as their bytes and parsed when they are read: the
    engine reads each once to check it and once in its block to align it, so one item's (or
    one block's) parsed fields and arrays are alive at a time, not the whole request's. Each is
    parsed once up front for its text and lengths (a malformed one is refused then)."""

    def __init__(self, parts: Sequence[memoryview]) -> None:
        self._parts = parts
        self._texts: list[str] = []
        self._lengths: list[tuple[int, int, int, int]] = []
        for i, part in enumerate(parts):
            it = _parse(pb.TraceItem, part, f"items[{i}]")
            self._texts.append(it.text)
            self._lengths.append((len(it.source_token_ids), len(it.values),
                                  len(it.source_offset_starts), len(it.source_offset_ends)))
            del it

    def __len__(self) -> int:
        return len(self._parts)

    def texts(self) -> list[str]:
        """Every item's text."""
        return list(self._texts)

    def source_counts(self) -> list[int]:
        """Every item's source token count."""
        return [n for n, _, _, _ in self._lengths]

    def lengths(self) -> list[tuple[int, int, int, int]]:
        """Every item's (source ids, values, offset starts, offset ends) counts."""
        return list(self._lengths)

    @overload
    def __getitem__(self, index: int) -> TraceItem: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[TraceItem]: ...

    def __getitem__(self, index: int | slice) -> TraceItem | Sequence[TraceItem]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return wire.item_from_pb(_parse(pb.TraceItem, self._parts[index], f"items[{index}]"),
                                 index)


class AlignmentServicer:
    """Implements the Alignment RPCs on an engine."""

    def __init__(self, engine: AlignmentEngine, work_threads: int = 2,
                 max_working_bytes: int = 256 << 20) -> None:
        self.engine = engine
        self.work = WorkBudget(max_working_bytes)
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
        with _trimmed(memory.TRIM_AFTER_BYTES):  # a load parses the whole tokenizer.json
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
    async def Retokenize(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Takes its request as bytes and answers the serialized RetokenizeResponse
        (registered with pass-through (de)serializers: the texts are counted from the
        request's lengths before it is parsed, the answer is written to the wire text by
        text)."""
        try:
            count = wire_scan.count_fields(data, _TEXTS_FIELD, self.engine.limits.max_batch,
                                           len(data))
        except DecodeError as err:
            raise _unparsable(pb.RetokenizeRequest, err, "request") from None
        if count > self.engine.limits.max_batch:  # before parsing them
            raise _over_batch("texts", self.engine.limits.max_batch)
        request = _parse(pb.RetokenizeRequest, data)
        # A call over the limits is refused before it waits for the work budget.
        texts = list(request.texts)
        self.engine.check_texts(texts, "texts")
        await self._admitted(context, working_bytes(texts))
        return await asyncio.get_running_loop().run_in_executor(
            self._work, self._retokenize, request, texts, len(data))

    def _retokenize(self, request: pb.RetokenizeRequest, texts: list[str], size: int
                    ) -> bytes:
        with _trimmed(size):
            target = request.tokenizer_id
            out: list[bytes] = []
            tokens = 0
            for r in self.engine.iter_retokenize(target, texts, request.add_special_tokens,
                                                 request.apply_chat_template):
                metrics.observe_text("Retokenize", target, r.residual)
                tokens += len(r.token_ids)
                out.append(wire.tokenized_bytes(r))
                n = len(r.token_ids)
                del r  # gone before the next text is encoded
                memory.trim_after(n)
            metrics.ITEMS.labels("Retokenize", target).inc(len(out))
            metrics.TARGET_TOKENS.labels("Retokenize", target).inc(tokens)
            return wire.retokenize_response_bytes(out)

    @grpc_errors
    async def AlignTrace(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Takes its request as bytes and answers the serialized AlignTraceResponse (as
        Retokenize)."""
        try:
            rest, parts = _split_items(data, self.engine.limits.max_batch)
        except DecodeError as err:
            raise _unparsable(pb.AlignTraceRequest, err, "request") from None
        if len(parts) > self.engine.limits.max_batch:  # before parsing them
            raise _over_batch("items", self.engine.limits.max_batch)
        request = _parse(pb.AlignTraceRequest, rest)
        if request.mode not in wire.MODE_FROM_PB:
            raise InvalidArgument("mode", f"unknown AlignMode {request.mode}")
        if request.placement not in wire.PLACEMENT_FROM_PB:
            raise InvalidArgument("placement", f"unknown Placement {request.placement}")
        items = _RequestItems(parts)
        texts = items.texts()
        self.engine.check_texts(texts, "items")
        # Counts and values from the request's own lengths, before the call waits for the
        # work budget: a call refused for them is refused at once.
        self.engine.check_item_sizes(items)
        await self._admitted(context, working_bytes(texts))
        return await asyncio.get_running_loop().run_in_executor(
            self._work, self._align_trace, request, items, len(data))

    async def _admitted(self, context: grpc.aio.ServicerContext, need: int) -> None:
        """Wait until the call's working memory fits; it is held until the call is done."""
        await self.work.acquire(need)
        loop = asyncio.get_running_loop()
        context.add_done_callback(lambda _: loop.call_soon_threadsafe(self.work.release, need))

    def close(self) -> None:
        """Stop the work threads (calls still queued are cancelled)."""
        self._work.shutdown(wait=False, cancel_futures=True)

    def _align_trace(self, request: pb.AlignTraceRequest, items: _RequestItems, size: int
                     ) -> bytes:
        """The serialized AlignTraceResponse (`request` without its `items`), written item by
        item."""
        with _trimmed(size):
            # The answer's size first, from the request's own counts: a call refused for it is
            # refused before its arrays are converted.
            counts = items.source_counts()
            self.engine.check_align_answer(
                self.engine.registry.get(request.target_tokenizer_id, "target_tokenizer_id"),
                items.texts(), counts)
            target = request.target_tokenizer_id
            out: list[bytes] = []
            residuals: list[Residual] = []
            targets: list[int] = []
            for a, n_source in zip(self.engine.iter_align(
                    request.source_tokenizer_id, target, items,
                    wire.MODE_FROM_PB[request.mode], wire.PLACEMENT_FROM_PB[request.placement],
                    answer_checked=True), counts, strict=False):
                metrics.observe_text("AlignTrace", target, a.residual)
                metrics.SHARE.labels(target).observe(a.residual.multi_token_chunk_share)
                metrics.SOURCE_TOKENS.labels(target).inc(n_source)
                metrics.CHUNKS.labels(target).inc(len(a.chunks))
                nt = a.chunks.target_end - a.chunks.target_start
                metrics.MULTI_TOKEN_TARGET_TOKENS.labels(target).inc(
                    int(nt[~a.chunks.clean].sum()))
                if a.mass_error != 0.0:
                    metrics.MASS_ERROR.labels(target).inc()
                residuals.append(a.residual)
                targets.append(len(a.target_token_ids))
                out.append(wire.aligned_bytes(a))
                del a, nt  # gone before the next item is worked on
                memory.trim_after(targets[-1])
            metrics.ITEMS.labels("AlignTrace", target).inc(len(out))
            metrics.TARGET_TOKENS.labels("AlignTrace", target).inc(sum(targets))
            return wire.align_response_bytes(out, aggregate_residual(residuals, targets))


def _parse(message: type[M], data: bytes | memoryview, field: str = "request") -> M:
    """`data` parsed as `message`, or INVALID_ARGUMENT naming `field` (as the shared parsing
    layer answers for methods registered with a deserializer)."""
    try:
        # Any buffer parses (an item is a view of the request's bytes); the stubs say bytes.
        return message.FromString(cast(bytes, data))
    except DecodeError as err:
        raise _unparsable(message, err, field) from None


def _over_batch(field: str, limit: int) -> InvalidArgument:
    return InvalidArgument(field, f"more than {limit} entries, over the limit of {limit} per "
                           "call")


def _unparsable(message: type[Message], err: DecodeError, field: str) -> InvalidArgument:
    refused = UnparsableRequest(message.DESCRIPTOR.full_name, str(err) or "DecodeError")
    return InvalidArgument(field, refused.message.removeprefix("request: "))


def _as_is(answer: bytes) -> bytes:
    return answer


_METHODS = (
    ("RegisterTokenizer", pb.RegisterTokenizerRequest, pb.TokenizerInfo.SerializeToString),
    ("ListTokenizers", pb.ListTokenizersRequest, pb.ListTokenizersResponse.SerializeToString),
    ("Retokenize", None, _as_is),  # read, parsed and written by `Retokenize`
    ("AlignTrace", None, _as_is),  # read, parsed and written by `AlignTrace`
    ("DeleteRun", runs_pb.DeleteRunRequest, runs_pb.DeleteRunResponse.SerializeToString),
)


def add_to_server(servicer: AlignmentServicer, server: grpc.aio.Server) -> None:
    """Register the servicer (the shared server answers unparsable bodies); Retokenize and
    AlignTrace take their request as bytes."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name), request_deserializer=req.FromString if req else None,
            response_serializer=serialize)
        for name, req, serialize in _METHODS}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          handlers),))

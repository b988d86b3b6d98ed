"""gRPC servicer of experience.proto: validates requests, calls the store, maps errors.

Every round a request names is held to the run's bounds (`RunRegistry.check_round`: at most
`see.limits.max_round_ahead` past the run's current round), and every answer that lists
records or runs is one page of at most `see.limits.max_response_bytes` (the store's reads)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from mutualrl.common import ids, wire_scan
from mutualrl.common.errors import (
    InvalidArgument,
    ServiceError,
    grpc_errors,
)
from mutualrl.see.grpc import requests
from mutualrl.see.store import SeeStore
from mutualrl.see.store.paging import make_token, read_token
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.v1 import experience_pb2_grpc as pb_grpc
from mutualrl.v1 import runs_pb2 as runs_pb

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExperienceExchange"].full_name
_RECORDS_FIELD = pb.PublishRequest.DESCRIPTOR.fields_by_name["records"].number
# Leave this much of the client's deadline to send the answer back.
_DEADLINE_MARGIN_S = 0.05


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The client's deadline as a monotonic time, or None when it set none."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return time.monotonic() + max(0.0, remaining - _DEADLINE_MARGIN_S)


class ExperienceExchangeServicer(pb_grpc.ExperienceExchangeServicer):
    def __init__(self, store: SeeStore) -> None:
        self.store = store

    @grpc_errors
    async def CreateRun(self, request: pb.CreateRunRequest,
                        context: grpc.aio.ServicerContext) -> pb.Run:
        return await self.store.create_run(request.config, request.exist_ok)

    @grpc_errors
    async def GetRun(self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext) -> pb.Run:
        return await self.store.get_run(request.run_id, use_cache=False)

    @grpc_errors
    async def ListRuns(self, request: pb.ListRunsRequest,
                       context: grpc.aio.ServicerContext) -> pb.ListRunsResponse:
        size = requests.check_page_size(request.page_size)
        after = read_token(request.page_token, "runs")
        if after is not None:
            ids.check_run_id(after, "page_token")
        runs, last = await self.store.list_runs_page(size, after)
        return pb.ListRunsResponse(runs=runs, next_page_token=make_token("runs", last)
                                   if last is not None else "")

    @grpc_errors
    async def Publish(self, request: bytes, context: grpc.aio.ServicerContext
                      ) -> pb.PublishResponse:
        """Registered without a request deserializer (see `add_to_server`): the store sizes the
        batch from its bytes."""
        most = self.store.cfg.limits.max_batch_records
        try:
            # Counted from the lengths first: a batch over the limit is refused unparsed.
            count = wire_scan.count_fields(request, _RECORDS_FIELD, most, len(request))
            if count > most:
                raise InvalidArgument("records", f"more than {most} records: at most {most} "
                                      "per call")
            req = pb.PublishRequest.FromString(request)
        except DecodeError as err:
            raise InvalidArgument("records", f"malformed PublishRequest: {err}") from None
        requests.check_publish(req, most)
        return await self.store.publish(req.run_id, req.records, batch_bytes=len(request))

    @grpc_errors
    async def FetchRollouts(self, request: pb.FetchRolloutsRequest,
                            context: grpc.aio.ServicerContext) -> pb.FetchRolloutsResponse:
        requests.check_fetch(request, await self.store.get_run(request.run_id))
        if request.current_round >= 0:
            await self.store.runs.check_round(request.run_id, request.current_round,
                                              "current_round")
        return await self.store.fetch_rollouts(request, _deadline(context))

    @grpc_errors
    async def Ack(self, request: pb.AckRequest, context: grpc.aio.ServicerContext
                  ) -> pb.AckResponse:
        requests.check_ack(request, await self.store.get_run(request.run_id))
        n = await self.store.ack(request.run_id, request.policy_id, request.delivery_ids)
        return pb.AckResponse(acked=n)

    @grpc_errors
    async def GetRoundStats(self, request: pb.RoundStatsRequest,
                            context: grpc.aio.ServicerContext) -> pb.RoundStatsResponse:
        requests.check_round_stats(request, await self.store.get_run(request.run_id))
        await self.store.runs.check_round(request.run_id, request.round, "round")
        return await self.store.round_stats(request, _deadline(context))

    @grpc_errors
    async def GetVerifiedSuccesses(self, request: pb.SuccessesRequest,
                                   context: grpc.aio.ServicerContext) -> pb.SuccessesResponse:
        requests.check_successes(request, await self.store.get_run(request.run_id))
        if request.min_round > 0:  # (0 or below: no filter, as before)
            await self.store.runs.check_round(request.run_id, request.min_round,
                                              "min_round")
        return await self.store.successes(request)

    @grpc_errors
    async def Subscribe(self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[pb.ExperienceEvent]:
        await self.store.get_run(request.run_id)
        requests.check_subscribe(request)
        stream = self.store.subscribe(request)
        try:
            async for event in stream:
                yield event
        finally:  # client cancelled (CancelledError) or server stopping: release the read
            await stream.aclose()

    @grpc_errors
    async def GetRunStats(self, request: pb.RunStatsRequest,
                          context: grpc.aio.ServicerContext) -> pb.RunStats:
        return await self.store.run_stats(request.run_id, request.page_token)

    @grpc_errors
    async def DeleteRun(self, request: runs_pb.DeleteRunRequest,
                        context: grpc.aio.ServicerContext) -> runs_pb.DeleteRunResponse:
        deleted = await self.store.delete_run(request.run_id)
        return runs_pb.DeleteRunResponse(run_id=request.run_id, deleted=deleted)


__all__ = ["SERVICE_NAME", "ExperienceExchangeServicer", "ServiceError"]


def add_to_server(servicer: ExperienceExchangeServicer, server: grpc.aio.Server) -> None:
    """Register the service like the generated helper does, except Publish, which takes the
    request as bytes (the store sizes the batch from them)."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    sym = pb.DESCRIPTOR.services_by_name["ExperienceExchange"]
    for method in sym.methods:
        fn = getattr(servicer, method.name)
        req = GetMessageClass(method.input_type)
        resp = GetMessageClass(method.output_type)
        if method.name == "Publish":
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                fn, response_serializer=resp.SerializeToString)
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                fn, request_deserializer=req.FromString,
                response_serializer=resp.SerializeToString)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req.FromString,
                response_serializer=resp.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)

"""gRPC servicer of run_metrics.proto (trainers report per-round metrics to SEE)."""

from __future__ import annotations

import grpc

from mutualrl.common.errors import grpc_errors
from mutualrl.see.store import SeeStore
from mutualrl.see.store.runmetrics import RunMetricsStore
from mutualrl.v1 import run_metrics_pb2 as mpb
from mutualrl.v1 import run_metrics_pb2_grpc as mpb_grpc

SERVICE_NAME = mpb.DESCRIPTOR.services_by_name["RunMetrics"].full_name


class RunMetricsServicer(mpb_grpc.RunMetricsServicer):
    def __init__(self, store: SeeStore) -> None:
        self.metrics = RunMetricsStore(store)

    @grpc_errors
    async def ReportMetrics(self, request: mpb.ReportMetricsRequest,
                            context: grpc.aio.ServicerContext) -> mpb.ReportMetricsResponse:
        return mpb.ReportMetricsResponse(stored=await self.metrics.report(request))


def add_to_server(servicer: RunMetricsServicer, server: grpc.aio.Server) -> None:
    mpb_grpc.add_RunMetricsServicer_to_server(servicer, server)

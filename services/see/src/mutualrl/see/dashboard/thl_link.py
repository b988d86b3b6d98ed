"""SEE's REST layer asking THL for token boundaries (SEE owns no tokenizer: docs/design.md).

The record browser shows a record's text under every receiver's tokenizer with THL's chunks.
THL holds the tokenizers, so the REST route calls THL's gRPC `AlignTrace` / `Retokenize` at
`see.thl_address` with SEE's own bearer token. One channel per dashboard request: these are
human-rate calls, and nothing outlives the request.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from mutualrl.common.channel import ClientOptions, aio_channel
from mutualrl.v1 import alignment_pb2 as apb
from mutualrl.v1 import alignment_pb2_grpc as apb_grpc

NOT_CONFIGURED = ("SEE has no THL address (set see.thl_address): receivers' token boundaries "
                  "come from THL")


class ThlError(Exception):
    """A THL call failed; the message is shown to the person in place of the alignment."""


class ThlLink:
    def __init__(self, address: str | None, token: str | None, tls_ca: Path | None = None,
                 timeout: float = 10.0) -> None:
        self.address = address
        self._opts = ClientOptions(address=address or "127.0.0.1:0", token=token,
                                   tls_ca=tls_ca, timeout=timeout)

    @property
    def configured(self) -> bool:
        return self.address is not None

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[ThlSession]:
        if self.address is None:
            raise ThlError(NOT_CONFIGURED)
        channel = aio_channel(self._opts)
        try:
            stub: Any = apb_grpc.AlignmentStub(channel)
            yield ThlSession(stub, self._opts, self.address)
        finally:
            await channel.close()


class ThlSession:
    """The calls of one request over one channel; gRPC errors become ThlError with a message
    a person can act on."""

    def __init__(self, stub: Any, opts: ClientOptions, address: str) -> None:
        self.stub, self.opts, self.address = stub, opts, address

    def _explain(self, err: grpc.aio.AioRpcError, tokenizers: Sequence[str]) -> ThlError:
        code = err.code()
        if code == grpc.StatusCode.NOT_FOUND:
            return ThlError(f"THL does not know tokenizer {' or '.join(map(repr, tokenizers))} "
                            f"(each trainer registers its own when it starts): {err.details()}")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return ThlError(f"THL at {self.address} did not answer: {err.details()}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return ThlError(f"THL at {self.address} refused SEE's token")
        return ThlError(f"THL refused ({code.name}): {err.details()}")

    async def align(self, source: str, target: str, items: Sequence[apb.TraceItem]
                    ) -> apb.AlignTraceResponse:
        req = apb.AlignTraceRequest(source_tokenizer_id=source, target_tokenizer_id=target,
                                    items=list(items), mode=apb.ALIGN_MODE_CHUNK)
        try:
            resp: apb.AlignTraceResponse = await self.stub.AlignTrace(
                req, timeout=self.opts.timeout, metadata=self.opts.metadata())
        except grpc.aio.AioRpcError as err:
            raise self._explain(err, [source, target]) from err
        return resp

    async def retokenize(self, tokenizer: str, texts: Sequence[str]) -> apb.RetokenizeResponse:
        req = apb.RetokenizeRequest(tokenizer_id=tokenizer, texts=list(texts))
        try:
            resp: apb.RetokenizeResponse = await self.stub.Retokenize(
                req, timeout=self.opts.timeout, metadata=self.opts.metadata())
        except grpc.aio.AioRpcError as err:
            raise self._explain(err, [tokenizer]) from err
        return resp

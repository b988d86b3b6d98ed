"""Clients of THL (`mutualrl.v1.Alignment`): `ThlClient` (sync) and `AsyncThlClient` (asyncio).

Both have the same methods, arguments and return types as the in-process
`mutualrl.thl.engine.AlignmentEngine` (register, list, retokenize, align_trace), so a trainer can
swap one for the other. Calls carry the bearer token from `ClientOptions` (or
MUTUALRL_AUTH_TOKEN) and retry UNAVAILABLE within the outage budget (`mutualrl.client.base`);
other errors surface as `grpc.RpcError` with INVALID_ARGUMENT / NOT_FOUND / ... and a message
naming the field.

    with ThlClient("127.0.0.1:50052") as thl:
        thl.register("policy-a", "/ckpt/policy-a", run_id="run1")
        out = thl.align_trace("policy-a", "policy-b", [TraceItem(text, ids, logps, offsets)])
"""

from __future__ import annotations

import builtins  # the classes below define a `list` method
from collections.abc import Sequence
from typing import Any

from mutualrl.client.base import AsyncClient, Client, Target
from mutualrl.client.blocking import blocking
from mutualrl.common import alignment_wire as wire
from mutualrl.common.alignment_types import (
    AlignTraceResult,
    Mode,
    Placement,
    TokenizedText,
    TokenizerInfo,
    TraceItem,
)
from mutualrl.common.channel import ClientOptions
from mutualrl.v1 import alignment_pb2 as pb
from mutualrl.v1 import alignment_pb2_grpc as pb_grpc

__all__ = ["AsyncThlClient", "ClientOptions", "ThlClient", "TraceItem"]

DEFAULT_ADDRESS = "127.0.0.1:50052"


def _align_request(source_tokenizer_id: str, target_tokenizer_id: str,
                   items: Sequence[TraceItem], mode: Mode, placement: Placement
                   ) -> pb.AlignTraceRequest:
    if mode not in wire.MODE_TO_PB:
        raise ValueError(f"mode must be one of {tuple(wire.MODE_TO_PB)}, got {mode!r}")
    if placement not in wire.PLACEMENT_TO_PB:
        raise ValueError(f"placement must be one of {tuple(wire.PLACEMENT_TO_PB)}, "
                         f"got {placement!r}")
    return pb.AlignTraceRequest(source_tokenizer_id=source_tokenizer_id,
                                target_tokenizer_id=target_tokenizer_id,
                                items=[wire.item_to_pb(it) for it in items],
                                mode=wire.MODE_TO_PB[mode],
                                placement=wire.PLACEMENT_TO_PB[placement])


class AsyncThlClient(AsyncClient):
    """asyncio THL client (constructor: `mutualrl.client.base`); use as an async context
    manager or await `close()`. `ThlClient` is its blocking facade."""

    default_address = DEFAULT_ADDRESS
    service = "THL"

    def __init__(self, target: Target = None, **overrides: Any) -> None:
        super().__init__(target, **overrides)
        self.stub = pb_grpc.AlignmentStub(self.channel)

    async def register(self, tokenizer_id: str, path: str, overwrite: bool = False,
                       run_id: str = "") -> TokenizerInfo:
        """Register a fast tokenizer at a path on the THL host, for `run_id` when given
        (`delete_run` releases it)."""
        msg = await self._call(self.stub.RegisterTokenizer, pb.RegisterTokenizerRequest(
            tokenizer_id=tokenizer_id, path=path, overwrite=overwrite, run_id=run_id))
        return wire.info_from_pb(msg)

    async def list(self) -> list[TokenizerInfo]:
        """Every registered tokenizer, sorted by id."""
        msg = await self._call(self.stub.ListTokenizers, pb.ListTokenizersRequest())
        return [wire.info_from_pb(t) for t in msg.tokenizers]

    async def retokenize(self, tokenizer_id: str, texts: Sequence[str],
                         add_special_tokens: bool = False,
                         apply_chat_template: bool = False) -> builtins.list[TokenizedText]:
        """Encode texts with a registered tokenizer (ids, char offsets, residual)."""
        msg = await self._call(self.stub.Retokenize, pb.RetokenizeRequest(
            tokenizer_id=tokenizer_id, texts=list(texts), add_special_tokens=add_special_tokens,
            apply_chat_template=apply_chat_template))
        return [wire.tokenized_from_pb(r) for r in msg.results]

    async def align_trace(self, source_tokenizer_id: str, target_tokenizer_id: str,
                          items: Sequence[TraceItem], mode: Mode = "chunk",
                          placement: Placement = "last") -> AlignTraceResult:
        """Move source token traces onto the target tokenizer's tokens."""
        req = _align_request(source_tokenizer_id, target_tokenizer_id, items, mode, placement)
        return wire.result_from_pb(await self._call(self.stub.AlignTrace, req))



class ThlClient(Client[AsyncThlClient], core=AsyncThlClient,
                stub=pb_grpc.AlignmentStub):
    """Blocking THL client (constructor: `mutualrl.client.base`); use as a context manager or
    call `close()`. The blocking facade of `AsyncThlClient`."""

    register = blocking(AsyncThlClient.register)
    list = blocking(AsyncThlClient.list)
    retokenize = blocking(AsyncThlClient.retokenize)
    align_trace = blocking(AsyncThlClient.align_trace)

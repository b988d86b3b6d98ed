"""One constructor shape for every client (mutualrl.client.base): (target, **overrides), where
target is ClientOptions, an address or None, and overrides are ClientOptions fields. Channels
connect lazily, so nothing here touches the network."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mutualrl.client.base import AsyncClient, Client
from mutualrl.client.mwra import AsyncMwraClient, MwraClient
from mutualrl.client.see import AsyncSeeClient, SeeClient
from mutualrl.client.thl import AsyncThlClient, ThlClient
from mutualrl.common.channel import ClientOptions

SYNC = {SeeClient: "127.0.0.1:50051", ThlClient: "127.0.0.1:50052",
        MwraClient: "127.0.0.1:50053"}
ASYNC = {AsyncSeeClient: "127.0.0.1:50051", AsyncThlClient: "127.0.0.1:50052",
         AsyncMwraClient: "127.0.0.1:50053"}


@pytest.mark.parametrize(("cls", "default"), list(SYNC.items()))
def test_sync_clients_share_one_constructor(cls: type[Client], default: str) -> None:
    with cls() as c:
        assert c.options.address == default and c.stub is not None
    with cls("h:1", token="t", timeout=2.5) as c:
        assert (c.options.address, c.options.token, c.options.timeout) == ("h:1", "t", 2.5)
    base = ClientOptions(address="h:2", outage_budget=0, backoff_max=1.5)
    with cls(base, address="h:3", timeout=9) as c:
        assert (c.options.address, c.options.outage_budget, c.options.timeout) == ("h:3", 0, 9)
        assert c.options.backoff_max == 1.5
    with cls(address="h:4") as c:
        assert c.options.address == "h:4"
    with pytest.raises(ValidationError, match="timeout"):
        cls("h:1", timeout=-1)
    with pytest.raises(ValidationError, match="no_such_field"):
        cls("h:1", no_such_field=1)
    with pytest.raises(TypeError):
        cls(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cls", "default"), list(ASYNC.items()))
async def test_async_clients_share_one_constructor(cls: type[AsyncClient], default: str) -> None:
    async with cls() as c:
        assert c.options.address == default and c.stub is not None
    async with cls("h:1", outage_budget=3) as c:
        assert (c.options.address, c.options.outage_budget) == ("h:1", 3)
    async with cls(ClientOptions(address="h:2"), token="x") as c:
        assert (c.options.address, c.options.token) == ("h:2", "x")

"""Operations on a whole run across the services.

    deleted = delete_run("run1", see="127.0.0.1:50051", thl="127.0.0.1:50052",
                         mwra="127.0.0.1:50053", token=token)
    # {"see": 5123, "thl": 2, "mwra": 9}: keys (THL: registrations) each service removed
"""

from __future__ import annotations

from typing import Any

import grpc

from mutualrl.client.base import Client


def delete_run(run_id: str, *, see: str | None = None, thl: str | None = None,
               mwra: str | None = None, **options: Any) -> dict[str, int]:
    """DeleteRun on each service whose address is given; returns what each removed (0 where
    it held nothing: NOT_FOUND is not an error here). `options` are `ClientOptions` fields
    (token, timeout, retries, tls_ca)."""
    from mutualrl.client.mwra import MwraClient
    from mutualrl.client.see import SeeClient
    from mutualrl.client.thl import ThlClient

    clients: dict[str, tuple[type[Client], str | None]] = {
        "see": (SeeClient, see), "thl": (ThlClient, thl), "mwra": (MwraClient, mwra)}
    out: dict[str, int] = {}
    for name, (cls, address) in clients.items():
        if address is None:
            continue
        with cls(address, **options) as client:
            try:
                out[name] = client.delete_run(run_id)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                out[name] = 0
    return out

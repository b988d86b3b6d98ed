"""Which of SEE's RPCs the scoped tokens may call (`mutualrl.common.auth`): a policy's token
publishes, fetches, acks and asks for stats and successes as that policy only; any valid token
reads runs and their streams; creating and deleting runs takes the run's secret itself.

CreateRun stays admin only, also with `exist_ok`: a policy token is derived from the secret,
not from a run, so it could not be confined to "its" run. Allowed to create, any trainer could
open runs under any id (each one holding streams and keys until its TTL) and would fix the
run's policies, tau and retention for everyone by being first. Whoever holds the secret creates
the run (`mutualrl up` does, before it starts the trainers); a trainer holding a policy token
only checks, through GetRun, that its run exists and lists its policy
(`mutualrl.trainer.sharing.exchange.PeerExchange.join`)."""

from __future__ import annotations

from mutualrl.common.auth import READ, Rules, as_policies, as_policy
from mutualrl.see.config import SeeLimits
from mutualrl.see.store.runmetrics import MAX_ROWS
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.v1 import run_metrics_pb2 as mpb

_EXCHANGE = pb.DESCRIPTOR.services_by_name["ExperienceExchange"].full_name
_METRICS = mpb.DESCRIPTOR.services_by_name["RunMetrics"].full_name



def access(limits: SeeLimits) -> Rules:
    """SEE's rules; a policy's Publish or ReportMetrics with more entries than the limits
    allow is refused before the rest of its body is scanned."""
    return {**ACCESS,
            f"/{_EXCHANGE}/Publish": as_policies("records", most=limits.max_batch_records)}


ACCESS: Rules = {
    **{f"/{_EXCHANGE}/{name}": access for name, access in {
        "Publish": as_policies("records"),
        "FetchRollouts": as_policy(),
        "Ack": as_policy(),
        "GetRoundStats": as_policy(),
        "GetVerifiedSuccesses": as_policy(),
        "GetRun": READ,
        "ListRuns": READ,
        "GetRunStats": READ,
        "Subscribe": READ,
    }.items()},
    f"/{_METRICS}/ReportMetrics": as_policies("rows", most=MAX_ROWS),
}

LARGE_REQUESTS = (f"/{_EXCHANGE}/Publish", f"/{_METRICS}/ReportMetrics")
"""The methods whose requests may take up to `max_message_bytes`; every other SEE request is
at most `max_request_bytes`."""

"""Validation of SEE's requests (pure: no grpc, no redis); the servicer runs these before it
calls the store. Each rule raises `InvalidArgument` naming the offending field."""

from __future__ import annotations

from collections.abc import Sequence

from mutualrl.common import bounds, ids
from mutualrl.common.errors import InvalidArgument, quote, require_nonnegative
from mutualrl.see.keys import KINDS
from mutualrl.see.store.entries import check_stream_id
from mutualrl.v1 import experience_pb2 as pb

MAX_PROMPTS = 4096
MAX_FETCH = 4096
MAX_BLOCK_MS = 30_000
MAX_ACK = 65536
MAX_ROUND_WAIT_MS = 60_000
MAX_PAGE = 1000


def check_policy(run: pb.Run, policy_id: str, field: str = "policy_id") -> None:
    if policy_id not in run.config.policies:
        raise InvalidArgument(field, f"{quote(policy_id)} is not a policy of run "
                                     f"{quote(run.config.run_id)}")


def _prompt_ids(prompt_ids: Sequence[str], no_bar: bool) -> None:
    if not prompt_ids:
        raise InvalidArgument("prompt_ids", "at least one prompt id is required")
    if len(prompt_ids) > MAX_PROMPTS:
        raise InvalidArgument("prompt_ids", f"at most {MAX_PROMPTS} prompts")
    for i, p in enumerate(prompt_ids):
        if not p or (no_bar and "|" in p):
            raise InvalidArgument(f"prompt_ids[{i}]", "must be a non-empty prompt id")


def check_fetch(req: pb.FetchRolloutsRequest, run: pb.Run) -> None:
    """The fields of a FetchRollouts request but `current_round` (a round of the run: the
    servicer checks it against the run's current round)."""
    check_policy(run, req.policy_id)
    ids.check_name(req.consumer, "consumer")  # e.g. the trainer's pod name
    if not 1 <= req.max_records <= MAX_FETCH:
        raise InvalidArgument("max_records", f"must lie in [1, {MAX_FETCH}]")
    if not 0 <= req.block_ms <= MAX_BLOCK_MS:
        raise InvalidArgument("block_ms", f"must lie in [0, {MAX_BLOCK_MS}]")
    bounds.check_int(req.max_round_lag, "max_round_lag", bounds.MAX_ROUND)
    bounds.check_int(req.min_policy_version, "min_policy_version", bounds.MAX_POLICY_VERSION,
                     least=-bounds.MAX_POLICY_VERSION)
    bounds.check_int(req.claim_idle_ms, "claim_idle_ms", bounds.MAX_COUNT)


def check_ack(req: pb.AckRequest, run: pb.Run) -> None:
    check_policy(run, req.policy_id)
    if len(req.delivery_ids) > MAX_ACK:
        raise InvalidArgument("delivery_ids", f"at most {MAX_ACK} per call")
    for i, did in enumerate(req.delivery_ids):
        check_stream_id(did, f"delivery_ids[{i}]")


def check_round_stats(req: pb.RoundStatsRequest, run: pb.Run) -> None:
    """The fields of a GetRoundStats request but `round` (checked against the run's current
    round) and `page_token` (`paging`)."""
    _prompt_ids(req.prompt_ids, no_bar=True)
    if req.policy_id:
        check_policy(run, req.policy_id)
    for i, p in enumerate(req.expect_policies):
        check_policy(run, p, f"expect_policies[{i}]")
    if not 0 <= req.wait_ms <= MAX_ROUND_WAIT_MS:
        raise InvalidArgument("wait_ms", f"must lie in [0, {MAX_ROUND_WAIT_MS}]")


def check_successes(req: pb.SuccessesRequest, run: pb.Run) -> None:
    """The fields of a GetVerifiedSuccesses request but `min_round` (checked against the run's
    current round) and `page_token` (`paging`)."""
    check_policy(run, req.policy_id)
    _prompt_ids(req.prompt_ids, no_bar=False)
    require_nonnegative("max_per_prompt", req.max_per_prompt)


def check_page_size(size: int, field: str = "page_size") -> int:
    """A page size: 0 means the most, MAX_PAGE."""
    if not 0 <= size <= MAX_PAGE:
        raise InvalidArgument(field, f"must lie in [0, {MAX_PAGE}] (0 = {MAX_PAGE})")
    return size or MAX_PAGE


def check_subscribe(req: pb.SubscribeRequest) -> None:
    for i, k in enumerate(dict.fromkeys(req.kinds)):
        if k not in KINDS:
            raise InvalidArgument(f"kinds[{i}]", f"unknown record kind {k}")
    if req.after_id:
        check_stream_id(req.after_id, "after_id")


def check_publish(req: pb.PublishRequest, max_batch_records: int) -> None:
    if len(req.records) > max_batch_records:
        raise InvalidArgument("records", f"{len(req.records)} records: at most "
                                         f"{max_batch_records} per call")

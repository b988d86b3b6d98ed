"""SEE's Publish answer, entry headers, keys, stats rules."""

from __future__ import annotations

import numpy as np
import pytest

from mutualrl.bench.testing.see import stats_record
from mutualrl.common.errors import InvalidArgument
from mutualrl.common.records import validate_record
from mutualrl.see.config import SeeConfig, SeeLimits
from mutualrl.see.keys import RunKeys
from mutualrl.see.store.layout import Header
from mutualrl.see.store.publish import publish_response
from mutualrl.see.validate import normalise_text, text_digest
from mutualrl.v1 import experience_pb2 as pb

RUN = pb.RunConfig(run_id="r1", policies=["a", "b"], tau=1.0)
POL = frozenset(RUN.policies)
LIM = SeeLimits()


def test_publish_response_counts_and_orders_results() -> None:
    resp = publish_response(["x/1", "y", "z"], "101")
    assert [(r.record_id, r.status) for r in resp.results] == [
        ("x/1", pb.PUBLISH_STATUS_STORED), ("y", pb.PUBLISH_STATUS_DUPLICATE),
        ("z", pb.PUBLISH_STATUS_STORED)]
    assert (resp.stored, resp.duplicates) == (2, 1)
    assert publish_response([], "") == pb.PublishResponse()
    with pytest.raises(ValueError):  # one flag per record
        publish_response(["x"], "")


def test_header_round_trip_and_keys() -> None:
    h = Header.of({b"h": "\x1f".join(("a/1", "a", "p0", "3", "1", "7")).encode()})
    assert (h.record_id, h.policy_id, h.prompt_id, h.round, h.verified, h.policy_version) == (
        "a/1", "a", "p0", 3, True, 7)
    k = RunKeys("mrl", "run-1")
    # Every key of a run shares one hash tag: one cluster slot.
    assert all(key.startswith("mrl:see:{run-1}:") for key in k.fixed())
    assert k.round_stats(4) == "mrl:see:{run-1}:rs:4"


def test_text_normalisation() -> None:
    assert normalise_text("  x   =\n\t2 ") == "x = 2"
    assert text_digest("x = 2") == text_digest(" x =  2\n")
    assert text_digest("x = 2") != text_digest("x = 3")


def test_stats_rules_and_config_defaults() -> None:
    ok = stats_record("a", 0, "p", [1.0, 0.0, 0.5])
    validate_record(ok, 0, RUN, POL, LIM)
    ok.stats.max = 0.1  # below the mean
    with pytest.raises(InvalidArgument, match=r"records\[0\].stats.max"):
        validate_record(ok, 0, RUN, POL, LIM)
    cfg = SeeConfig()
    assert (cfg.port, cfg.rest_port) == (50051, 8080)
    assert cfg.limits.max_batch_records == 4096
    assert np.isfinite(cfg.retention.max_stream_len)
    # Every field documented (the config rule of CONTRIBUTING.md).
    for model in (SeeConfig, SeeLimits):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"

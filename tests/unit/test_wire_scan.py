"""The policies a request acts as, read from its tags and lengths (`mutualrl.common.wire_scan`,
what the shared server checks before it parses a policy's request), are what protobuf's parser
reads: for any request built from fields, for the same field sent twice (the last counts), and
for any bytes protobuf accepts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.common.auth import SCAN_TAGS
from mutualrl.common.wire_scan import field_path, strings_at
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.v1 import run_metrics_pb2 as mpb

NAMES = st.text(max_size=12)
ROWS = field_path(mpb.ReportMetricsRequest.DESCRIPTOR, ("rows", "policy_id"))
POLICY = field_path(pb.AckRequest.DESCRIPTOR, ("policy_id",))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(NAMES, st.integers(0, 2**31), st.dictionaries(NAMES, st.floats()),
                          NAMES), max_size=8), NAMES)
def test_rows_policies_are_what_protobuf_reads(rows: list[tuple[str, int, dict[str, float],
                                                                 str]], run_id: str) -> None:
    """Each row's policy, also when a row carries its policy twice (split over two copies of
    the row message: protobuf merges them, the last policy counts)."""
    msg = mpb.ReportMetricsRequest(run_id=run_id, rows=[
        mpb.MetricRow(policy_id=p, round=r, values=v) for p, r, v, _ in rows])
    data = msg.SerializeToString()
    assert strings_at(data, ROWS, SCAN_TAGS) == [r.policy_id for r in msg.rows]
    twice = b"".join(_row_twice(p, again, v) for p, _, v, again in rows)
    parsed = mpb.ReportMetricsRequest.FromString(twice)
    assert strings_at(twice, ROWS, SCAN_TAGS) == [r.policy_id for r in parsed.rows]


def _row_twice(first: str, last: str, values: dict[str, float]) -> bytes:
    """One `rows` entry whose policy_id is set twice, with values between."""
    inner = (mpb.MetricRow(policy_id=first).SerializeToString()
             + mpb.MetricRow(values=values).SerializeToString()
             + mpb.MetricRow(policy_id=last).SerializeToString())
    return _length_delimited(2, inner)


def _length_delimited(number: int, body: bytes) -> bytes:
    size, out = len(body), bytearray([number << 3 | 2])
    while True:
        out.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            return bytes(out) + body


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_protobuf_accepts_scan_to_its_policy(data: bytes) -> None:
    try:
        parsed = pb.AckRequest.FromString(data)
    except Exception:  # refused by the parse that follows the scan
        return
    assert strings_at(data, POLICY, SCAN_TAGS) == [parsed.policy_id]

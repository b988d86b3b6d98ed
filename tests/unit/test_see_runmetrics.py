"""Validation of ReportMetrics batches (run_metrics.proto): the error names the first bad field."""

import math

import pytest

from mutualrl.common.errors import InvalidArgument
from mutualrl.see.store.runmetrics import MAX_ROWS, MAX_VALUES, check_rows
from mutualrl.v1 import run_metrics_pb2 as mpb

POLICIES = ["a", "b"]


def row(policy: str = "a", round_: int = 0, **values: float) -> mpb.MetricRow:
    return mpb.MetricRow(policy_id=policy, round=round_, values=values or {"reward_mean": 0.5})


def test_a_good_batch_passes() -> None:
    check_rows([row("a", 0), row("b", 3, loss=-1.5), row("a", 1, **{"heldout/add": 1.0})],
               POLICIES)


@pytest.mark.parametrize(("rows", "field"), [
    ([], "rows"),
    ([row()] * (MAX_ROWS + 1), "rows"),
    ([row("a"), row("c")], "rows[1].policy_id"),
    ([row("a", -1)], "rows[0].round"),
    ([mpb.MetricRow(policy_id="a", round=0, unix_ms=-5)], "rows[0].unix_ms"),
    ([row(loss=math.inf)], "rows[0].values[loss]"),
    ([row(loss=math.nan)], "rows[0].values[loss]"),
    ([row(**{"": 1.0})], "rows[0].values"),
    ([row(**{"x" * 129: 1.0})], "rows[0].values"),
    ([row(**{"tab\there": 1.0})], "rows[0].values"),
    ([row(**{f"m{i}": 1.0 for i in range(MAX_VALUES + 1)})], "rows[0].values"),
])
def test_bad_rows_name_the_field(rows: list[mpb.MetricRow], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_rows(rows, POLICIES)
    assert err.value.field == field


def test_names_may_be_any_printable_text() -> None:
    check_rows([row(**{"heldout/number theory": 0.1, "rescued/données": 2.0})], POLICIES)

"""MWRA's answers fit the message limit by construction: the largest allocation table a run can
hold at its limits (every label, id and address at its longest, every policy holding a slice of
every worker) is within `config.table_bound`, and a config whose limits would pass the message
limit is refused at start-up."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mutualrl.mwra.config import MAX_ADDRESS_CHARS, MAX_LABEL_BYTES, MwraConfig, table_bound
from mutualrl.v1 import allocation_pb2 as pb


def _worst_table(workers: int, policies: int) -> pb.AllocationTable:
    wid = [f"w{i:0127d}" for i in range(workers)]
    pid = [f"p{i:0127d}" for i in range(policies)]
    address = "h" * (MAX_ADDRESS_CHARS - 6) + ":65535"
    # 64 labels taking the 8 KiB of UTF-8 between them.
    labels = {f"k{j:02d}" + "é" * 20: "v" * (MAX_LABEL_BYTES // 64 - 3 - 40)
              for j in range(64)}
    assert sum(len(k.encode()) + len(v.encode()) for k, v in labels.items()) <= MAX_LABEL_BYTES
    big = 2**31 - 1
    table = pb.AllocationTable(run_id="r" * 64, epoch=2**62, round=big, strategy="time-share",
                               leader="x" * 128, idle_units=big, pool_units=big)
    for p in pid:
        slices = [pb.WorkerSlice(worker_id=w, units=big, rollout_address=address) for w in wid]
        table.allocations.add(run_id="r" * 64, policy_id=p, epoch=2**62, round=big,
                              worker_ids=wid, units=big, threads=big, rollout_budget=big,
                              active=True, strategy="time-share",
                              rollout_addresses=[address] * workers, slices=slices,
                              pool_units=big)
        table.policies.add(run_id="r" * 64, policy_id=p, trainer_id="t" * 128,
                           smoothed_cost=1e300, live=True, last_seen_unix_ms=2**62,
                           min_units=big, weight=1e6, rollout_budget=big, reports=2**62,
                           last_seconds=1e6, last_tokens=2**53, last_samples=2**53,
                           last_units=big, last_round=big)
    for w in wid:
        table.workers.add(
            worker=pb.Worker(worker_id=w, labels=labels, rollout_address=address,
                             capacity=pb.WorkerCapacity(cpu_slots=big, gpu_count=big,
                                                        gpu_kind="g" * 128)),
            lease=pb.Lease(worker_id=w, lease_seconds=1e6, expires_unix_ms=2**62),
            state="lost", holder=",".join(pid), units_by_policy={p: big for p in pid},
            units=big)
    return table


@pytest.mark.parametrize(("workers", "policies"), [(1, 1), (16, 4), (4, 16)])
def test_the_largest_table_is_within_the_bound(workers: int, policies: int) -> None:
    assert _worst_table(workers, policies).ByteSize() <= table_bound(workers, policies)


def test_limits_that_could_pass_the_message_limit_are_refused() -> None:
    cfg = MwraConfig()
    assert table_bound(cfg.max_workers, cfg.max_policies) < cfg.max_message_bytes
    with pytest.raises(ValidationError, match="allocation table"):
        MwraConfig(max_workers=4096, max_policies=4096)

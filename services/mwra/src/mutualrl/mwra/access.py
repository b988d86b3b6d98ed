"""Which of MWRA's RPCs the scoped tokens may call (`mutualrl.common.auth`): a policy's token
registers, reports and asks for allocations as that policy only; any valid token lists the
allocation table; workers and run deletion take the run's secret itself."""

from __future__ import annotations

from mutualrl.common.auth import READ, Rules, as_policy
from mutualrl.v1 import allocation_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Allocator"].full_name

ACCESS: Rules = {
    **{f"/{_SERVICE}/{name}": as_policy()
       for name in ("RegisterPolicy", "ReportStepCost", "PolicyHeartbeat", "DeregisterPolicy",
                    "GetAllocation", "WatchAllocation")},
    f"/{_SERVICE}/ListAllocations": READ,
}

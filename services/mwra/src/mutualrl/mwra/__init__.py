"""mutualrl.mwra: Multi-Worker Resource Allocation.

`allocation` (pure math: static / balanced min-makespan / time-share / shared; docs/design.md
(11)), `requests` (request validation, pure), `store` (Redis state), `coordinator` (leader lock,
tick loop, rebalancing, admission of late policies, time-share turns), `servicer` (the gRPC
RPCs, a thin shell over both), `access` (token scopes), `metrics`, `server`, `config`, `cli`.
A trainer applies an allocation with `mutualrl.trainer.runtime.allocator.apply_allocation`.
"""

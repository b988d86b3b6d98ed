"""mutualrl.mwra: Multi-Worker Resource Allocation.

`allocation` (pure math: static / balanced min-makespan / time-share; docs/design.md (11)),
`store` (Redis state),
`service` (gRPC servicer with leases and leader election), `metrics`, `server`, `config`, `cli`.
A trainer applies an allocation with `mutualrl.trainer.allocator.apply_allocation`.
"""

"""mutualrl.mwra: Multi-Worker Resource Allocation.

`allocation` (pure math: static / balanced min-makespan / time-share), `simulate` (seeded round
simulation behind `mutualrl bench mwra`), `local` (apply an allocation in a trainer), `store`
(Redis state), `service` (gRPC servicer with leases and leader election), `server`, `config`,
`cli`.
"""

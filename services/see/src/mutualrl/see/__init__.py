"""mutualrl.see: the Shared Experience Exchange.

A grpc.aio service (`experience.proto`) plus a FastAPI inspection app in one process, over
Redis (redis.asyncio). Modules:

- `config`: `SeeConfig`, the `see:` section of a run YAML.
- `requests`, `validate`: request validation (the servicer runs it; `validate` checks a
  Publish batch as whole-batch columns, per-token rules vectorised over the batch); `entries`:
  stream-entry headers and ids (all pure: no network code).
- `keys`, `lua`: the Redis key layout (`<prefix>:see:{<run>}:...`, the common scheme) and the
  batch script.
- `store`: one object over the Redis parts: `runs`, `publish`, `rollouts` (consumer groups),
  `roundstats`, `successes`, `inspection` (Subscribe, run stats, records); `connect`: the client.
- `servicer`, `rest`, `server`: the gRPC servicer, the REST app, and running both.
- `metrics`: SEE's Prometheus metrics.
- `cli`: `mutualrl see serve`; `mutualrl inspect ...` is the SDK's (`mutualrl.cli.inspect`),
  `mutualrl bench see` the benchmarks' (`mutualrl.bench.see`).
"""

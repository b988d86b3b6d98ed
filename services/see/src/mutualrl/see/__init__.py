"""mutualrl.see: the Shared Experience Exchange.

A grpc.aio service (`experience.proto`) plus a FastAPI inspection app in one process, over
Redis (redis.asyncio). Modules:

- `config`: `SeeConfig`, the `see:` section of a run YAML.
- `hotpath`: the compiled (numba) scan that accepts the common Publish batch in one pass;
  `validate`: the reference validator that names the field of anything else; `wire`: the
  protobuf wire helpers (all pure: no network code).
- `keys`, `lua`: the Redis key layout (`<prefix>:see:{<run>}:...`, the common scheme) and the
  batch script.
- `store`: all Redis access (publish, consumer groups, round stats, successes, inspection,
  DeleteRun).
- `servicer`, `rest`, `server`: the gRPC servicer, the REST app, and running both.
- `metrics`: SEE's Prometheus metrics.
- `cli`: `mutualrl see serve`, `mutualrl bench see` (`bench`); `mutualrl inspect ...` is the
  SDK's (`mutualrl.cli.inspect`).
"""

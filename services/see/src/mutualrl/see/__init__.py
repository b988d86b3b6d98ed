"""mutualrl.see: the Shared Experience Exchange.

A grpc.aio service (`experience.proto`) plus a FastAPI inspection app in one process, over
Redis (redis.asyncio). Modules:

- `config`: `SeeConfig`, the `see:` section of a run YAML.
- `hotpath`: the compiled (numba) scan that accepts the common Publish batch in one pass;
  `validate`: the reference validator that names the field of anything else; `wire`: the
  protobuf wire helpers (all pure: no network code).
- `keys`, `lua`: the Redis key layout (every key hash-tagged by run) and the batch script.
- `store`: all Redis access (publish, consumer groups, round stats, successes, inspection).
- `servicer`, `rest`, `server`: the gRPC servicer, the REST app, and running both.
- `cli`: `mutualrl see serve`, `mutualrl inspect ...`, `mutualrl bench see` (`bench`).
"""

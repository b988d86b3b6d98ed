"""mutualrl.see: the Shared Experience Exchange.

A grpc.aio service (`experience.proto`) plus a FastAPI inspection app in one process, over
Redis (redis.asyncio). Subpackages:

- `store`: `SeeStore`, one object over the Redis parts: `runs`, `publish` (with `lua`, the batch
  script, and `durability`), `rollouts` (consumer groups), `roundstats`, `successes`,
  `inspection` (Subscribe, run stats, records), `runmetrics`, `transfers`; `layout` (the
  storage format: separators, stream-entry headers, stream ids, index entries, the publish
  script's ARGV, each with its build and parse), `entries` (stream-id checks, reply shapes) and
  `ranges` (record ranges, pure), `part`, `blocking`, `connect` (the client).
- `grpc`: the Experience and RunMetrics servicers, token scopes (`access`), request checks.
- `rest`: the REST inspection app; `dashboard`: the `/ui` pages and the routes they read.

Modules: `config` (`SeeConfig`, the `see:` section of a run YAML), `keys` (the Redis key layout,
`<prefix>:see:{<run>}:...`, pure), `validate` (a Publish batch checked as whole-batch columns,
per-token rules vectorised over the batch; pure), `server` (running gRPC and REST together),
`metrics` (Prometheus), `cli` (`mutualrl see serve`; `mutualrl inspect ...` is the SDK's,
`mutualrl bench see` the benchmarks').
"""

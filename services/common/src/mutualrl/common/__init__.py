"""What every MutualRL package shares: typed config (`config`), the id rule (`ids`), the Redis
key scheme (`keys`) and error mapping (`redis_errors`, with the `redis` extra), service errors
(`errors`), auth, the server lifecycle (`grpc_server`), client channels (`channel`), the command
registry (`commands`) and the alignment contract's plain data (`alignment_types`, `_wire`)."""

"""mutualrl.thl — the Tokenizer Heterogeneity Layer.

Pure (no network code): `align` (chunk alignment core), `residual` (round-trip / coverage
metrics), `types` (plain data shared by engine and clients), `corpus` (seeded synthetic text).
Service: `registry` (tokenizer ids -> paths, persisted, LRU), `engine` (`AlignmentEngine`,
in-process THL), `servicer` / `server` (gRPC `mutualrl.v1.Alignment`), `metrics`, `config`
(`ThlConfig`), `cli` (`mutualrl thl ...`, `mutualrl bench thl`), `bench`, `testing`.
"""

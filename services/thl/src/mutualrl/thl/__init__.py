"""mutualrl.thl — the Tokenizer Heterogeneity Layer.

Pure (no network code): `align` (chunk alignment core, docs/design.md (10)), `residual`
(round-trip / coverage metrics), `corpus` (seeded synthetic text), `tokenizers` (offline
tokenizer builders); the plain data shared with clients is `mutualrl.common.alignment_types`.
Service: `registry` (tokenizer ids -> paths, persisted, LRU), `engine` (`AlignmentEngine`,
in-process THL), `servicer` / `server` (gRPC `mutualrl.v1.Alignment`), `metrics`, `config`
(`ThlConfig`), `cli` (`mutualrl thl serve`; `thl register|list` are the SDK's). The benchmark
(`mutualrl bench thl`) and the test tokenizers are in `mutualrl.bench`.
"""

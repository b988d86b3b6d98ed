"""mutualrl.bench: the benchmarks behind `mutualrl bench ...`, each a ratio against an anchor
measured in the same run, and the helpers the tests share with them.

One module per benchmark: `see` (Publish vs raw Redis pipelines), `thl` (alignment vs
spacy-alignments), `mwra` (seeded round simulation: balanced vs static), `trainer` (GRPO
steps/s vs TRL), `memory` (peak RSS of a step vs TRL), `rounds` (N policies through
`mutualrl up` vs their steps in sequence). `cli` registers their commands. `testing`: realistic
SEE records and an in-process SEE (`testing.see`), THL's test tokenizers (`testing.thl`),
private Redis servers and clusters (`testing.redis_servers`).

The service packages never import this one, and no service image installs it.
"""

"""The trainer's commands (`mutualrl train`, `eval`, `sft`, `export`), on top of every other
layer."""

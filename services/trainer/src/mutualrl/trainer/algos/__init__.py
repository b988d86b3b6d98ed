"""Pure math of the trainer: GRPO and the three sharing probes.

Only torch and the standard library are imported here, so every formula is unit-tested in
microseconds and shared by the loop, the probes and the benchmarks.
"""

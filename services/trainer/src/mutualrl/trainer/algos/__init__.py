"""Pure math of the trainer: GRPO and the sharing probes (PRP, XGRPO, SGT; HACPO, SAPO, F-TIS).

Only torch and the standard library are imported here, so every formula is unit-tested in
microseconds and shared by the loop, the probes and the benchmarks.
"""

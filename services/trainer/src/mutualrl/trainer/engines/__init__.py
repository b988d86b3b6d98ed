"""Rollout engines: the engine protocol and `Sample`, the HF engine (its fast path over a static
cache with CUDA graphs, its sampler), vLLM, SGLang and the factory that picks one."""

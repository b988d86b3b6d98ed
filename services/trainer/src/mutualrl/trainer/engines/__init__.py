"""Rollout engines: the engine protocol and `Sample`, the HF engine, vLLM, SGLang and the
factory that picks one."""

"""One policy's trainer at run time: session, loop, step, checkpoints, data-parallel ranks,
metrics, the memory plan, the rollout worker, presets and the SFT warm start."""

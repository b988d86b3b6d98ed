"""One policy's trainer at run time: session, loop, step, checkpoints, data-parallel ranks,
metrics, the memory plan, presets and the SFT warm start."""

"""The policy as a torch module: forward passes over packed rows (log-probs, entropy) and LoRA
adapters."""

"""Policy trainer: GRPO math (pure), sharing probes, tasks, rollout engines, the loop."""

"""What the policies train and are scored on: tasks, datasets, reward functions, answer
parsing, chat rendering and benchmarks."""

"""The rollout jobs: the engines (hf, vllm, server) and what they share, the decode loop, the stop rule,
the weight push, and multi-turn rollouts with tools (`agent`). Knows nothing of how the actor trains
(`workers.training`)."""

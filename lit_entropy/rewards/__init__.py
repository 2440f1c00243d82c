"""Reward functions and their isolated execution."""

from lit_entropy.rewards.runner import RewardRunner, RewardStats, RewardTimeout, is_trusted, trusted_reward

__all__ = ["RewardRunner", "RewardStats", "RewardTimeout", "is_trusted", "trusted_reward"]

"""Reward functions and their isolated execution."""

from lit_entropy.rewards.runner import RewardRunner, RewardStats

__all__ = ["RewardRunner", "RewardStats"]

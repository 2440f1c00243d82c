from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig

__all__ = ["Generation", "RolloutEngine", "SamplingConfig"]

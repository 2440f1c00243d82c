"""The policy and its passes: the forward passes over rows (whole, on shared prompts, replaying the sampler's
truncation), the model families and their loading, the tokenizer, LoRA, precision and the distributed strategies.
A floor below the rollout engines and the data: nothing here imports them (the LightningModule that wires all of
them is :mod:`lit_entropy.module`). Nothing is imported here, so a submodule loads only what it needs."""

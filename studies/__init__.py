"""The studies: a protocol declared before any run, its runs launched, their doses, verdicts and records.

Not part of the installed package: it runs from a checkout, through one entry point, ``scripts/study.py``
(``scripts/study_table.py`` prints a controller study's table). It reads lit-entropy through the package's public
surface only: the ``train`` command's runs (subprocesses), their TensorBoard files
(:mod:`lit_entropy.analysis.runs`), the registries of methods (:data:`lit_entropy.callbacks.CONTROLLERS`,
:data:`lit_entropy.objectives.registry.SELECTION_RULES`), the law fit (:mod:`lit_entropy.diagnostics.entropy_law`),
the config folder (:mod:`lit_entropy.utils.config_path`), the logging steps (:mod:`lit_entropy.utils.log_steps`) and the
run builder's callbacks (:func:`lit_entropy.train.instantiate_callbacks`, for a preview).

* :mod:`~studies.protocol`, :mod:`~studies.protocol_phases`, :mod:`~studies.protocol_preview`: a protocol file
  (``conf/protocol/*.yaml``), its tune and evaluate phases, what it would run.
* :mod:`~studies.method_study`: the launcher (one run per cell and seed, pinned to cores, resumable) and the
  run summaries; :mod:`~studies.study_plot` its figure.
* :mod:`~studies.dose`: each method's dose metrics; :mod:`~studies.verdicts`: the verdict rule;
  :mod:`~studies.seed_claims`: the seed papers' claims; :mod:`~studies.lab_to_real`: the lab's verdicts beside
  the real model's; :mod:`~studies.records`: the shipped records (``docs/data/*.json.gz``).
* :mod:`~studies.study`: a controller study's table (``scripts/study_table.py``).
* :mod:`~studies.bf16_via_fp32`: a study's bf16 linear layers through fp32 kernels, on a CPU without bf16 units
  (loaded into the study's environment at start-up, so that its pinned code is unchanged).
"""

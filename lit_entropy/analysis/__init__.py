"""Reading finished runs back (behind ``lit-entropy-compare`` and the analysis scripts in ``scripts/``).

* :mod:`~lit_entropy.analysis.runs`: find run folders, load their TensorBoard scalars, label them.
* :mod:`~lit_entropy.analysis.compare`: chosen metrics overlaid across runs, plus a final/best table
  (``scripts/compare.py``).
* :mod:`~lit_entropy.analysis.entropy_law_fit`: the entropy-performance law fitted to runs and plotted
  (``scripts/fit_entropy_law.py``; the fit itself is :mod:`lit_entropy.diagnostics.entropy_law`).

The studies (protocols, launchers, verdicts, records) are the repository's ``studies/`` folder, outside the
installed package.
"""

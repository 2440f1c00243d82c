"""Reading finished runs back and summarising them (behind the analysis scripts in ``scripts/``).

* :mod:`~lit_entropy.analysis.runs`: find run folders, load their TensorBoard scalars, label them.
* :mod:`~lit_entropy.analysis.compare`: chosen metrics overlaid across runs, plus a final/best table
  (``scripts/compare.py``).
* :mod:`~lit_entropy.analysis.entropy_law_fit`: the entropy-performance law fitted to runs and plotted
  (``scripts/fit_entropy_law.py``; the fit itself is :mod:`lit_entropy.diagnostics.entropy_law`).
* :mod:`~lit_entropy.analysis.study`: a controller study's table, how closely each run held its
  entropy target (``scripts/study_table.py``).
"""

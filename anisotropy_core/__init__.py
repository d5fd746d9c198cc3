"""The mathematics of embedding anisotropy, in numpy, with no Spark import anywhere in this package.

The math (moments, diagnostics, decision, transforms, k-means, flow, evaluation) needs numpy only. Three other
libraries are imported by the modules that need them:

* ``pyarrow`` — :mod:`.storage` (local and object-store files through ``pyarrow.fs``), hence :mod:`.artifact`
  and :mod:`.index`, which read and write through it;
* ``faiss`` — :mod:`.index` (the corpus index) and :mod:`.mixture_evidence` (its k-means);
* ``matplotlib`` — :mod:`.report` (the pictures; the Agg canvas, no display).

A serving process that loads an artifact (:func:`.artifact.load_artifact`) therefore needs numpy and pyarrow.
"""

from .diagnostics import Diagnosis, artefact_test, diagnose
from .moments import InvalidVectorsError, Moments

__all__ = ["diagnose", "Diagnosis", "artefact_test", "Moments", "InvalidVectorsError"]

"""Pure-numpy mathematics of embedding anisotropy (no Spark import anywhere in this package)."""
from .diagnostics import Diagnosis, artefact_test, diagnose
from .moments import InvalidVectorsError, Moments

__all__ = ["diagnose", "Diagnosis", "artefact_test", "Moments", "InvalidVectorsError"]

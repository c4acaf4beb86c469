"""tkx: a megakernel training compiler for PyTorch whose every stage is an object you can look at.

Stages: :func:`capture` -> :class:`CapturedGraph` -> ``.lower()`` -> :class:`Program` ->
passes -> schedule -> arena -> CUDA source -> compiled runner -> benchmark.
"""

from __future__ import annotations

from . import examples, ir, reference
from .capture import CapturedGraph, capture
from .errors import SourceLine, TkxError, UnsupportedError
from .ir import Op, Program, TensorSpec, validate

__version__ = "0.1.0"

__all__ = [
    "capture", "CapturedGraph", "Program", "Op", "TensorSpec", "validate",
    "TkxError", "UnsupportedError", "SourceLine", "ir", "reference", "examples", "__version__",
]

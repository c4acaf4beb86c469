"""tkx: a megakernel training compiler for PyTorch whose every stage is an object you can look at.

Stages: :func:`capture` -> :class:`CapturedGraph` -> ``.lower()`` -> :class:`Program` ->
passes -> schedule -> arena -> CUDA source -> compiled runner -> benchmark.
"""

from __future__ import annotations

from . import bench, examples, ir, reference, runtime
from .arena import ArenaPlan
from .capture import CapturedGraph, capture
from .errors import SourceLine, TkxError, UnsupportedError
from .explore import Exploration, explore
from .ir import Op, Program, TensorSpec, validate
from .options import Options, OptionsError
from .passes import PassTrace, register_pass, run_passes
from .schedule import FusedSchedule, fuse, fusion_rule, keep, schedule

__version__ = "0.1.0"

__all__ = [
    "capture", "CapturedGraph", "Program", "Op", "TensorSpec", "validate", "explore", "Exploration",
    "Options", "OptionsError", "register_pass", "run_passes", "PassTrace", "schedule", "FusedSchedule",
    "fusion_rule", "fuse", "keep", "ArenaPlan",
    "TkxError", "UnsupportedError", "SourceLine", "ir", "reference", "examples", "runtime", "bench", "__version__",
]

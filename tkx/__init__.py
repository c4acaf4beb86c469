"""tkx: a megakernel training compiler for PyTorch whose every stage is an object you can look at.

Stages: :func:`capture` -> :class:`CapturedGraph` -> ``.lower()`` -> :class:`Program` ->
passes -> schedule -> arena -> CUDA source -> compiled runner -> benchmark.
:func:`report` writes every stage to one self-contained HTML file. :mod:`tkx.pipeline` lists the
stages (one table); :mod:`tkx.display` is the registry through which each stage finds its views.
"""

from __future__ import annotations

from . import bench, display, examples, ir, ops, pipeline, random, reference, runtime
from .arena import ArenaPlan
from .capture import CapturedGraph, capture
from .capture.decompositions import register_decomposition, unregister_decomposition
from .capture.lowerings import register_lowering, unregister_lowering
from .errors import KernelError, SourceLine, TkxError, UnsupportedError
from .explore import Exploration, explore
from .ir import Op, Program, TensorSpec, validate
from .loop import TrainingLoop, eager_training_loop, training_loop
from .options import Options, OptionsError
from .passes import PassTrace, register_pass, run_passes
from .render.report import report
from .schedule import FusedSchedule, fuse, fusion_rule, keep

__version__ = "0.1.0"

__all__ = [
    "capture", "CapturedGraph", "Program", "Op", "TensorSpec", "validate", "explore", "Exploration",
    "Options", "OptionsError", "register_pass", "run_passes", "PassTrace", "FusedSchedule",
    "fusion_rule", "fuse", "keep", "ArenaPlan", "report",
    "register_lowering", "unregister_lowering", "register_decomposition", "unregister_decomposition",
    "TkxError", "UnsupportedError", "KernelError", "SourceLine", "ir", "ops", "random", "reference", "examples",
    "runtime", "training_loop", "TrainingLoop", "eager_training_loop",
    "bench", "pipeline", "display", "__version__",
]

# The widgets need ipywidgets and anywidget: imported on first use, so `import tkx` works without them.
_LAZY = {"Explorer": "tkx.explorer", "PassStepper": "tkx.explorer", "LinkedView": "tkx.explorer"}


def __getattr__(name: str):
    """``tkx.Explorer``, ``tkx.PassStepper`` and ``tkx.LinkedView``, imported from :mod:`tkx.explorer` on first use."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tkx' has no attribute {name!r}")

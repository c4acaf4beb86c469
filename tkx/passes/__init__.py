"""Passes: pure, named ``Program -> Program`` rewrites, run and traced by :func:`run_passes`.

Built-ins (:mod:`tkx.passes.builtin`), in default-pipeline order:

* ``canonicalize_views``: one spelling per view; drop self-copies (``cast`` to the same dtype);
* ``simplify``: fill folding, ``x*1``/``x+0``/``neg(neg x)``/lossless ``cast(cast x)``;
* ``cse``: compute each distinct value once;
* ``transpose_gemm``: produce a GEMM result transposed when every reader wants it so;
* ``dce``: drop ops nothing needs.

``run_passes(program)`` returns a :class:`PassTrace` (one :class:`PassStep` per pass:
programs before/after, added/removed/changed op ids, milliseconds, ``diff_text()``).
Register your own with ``@register_pass("name")``.
"""

from __future__ import annotations

from . import builtin
from .builtin import canonicalize_views, cse, dce, simplify, transpose_gemm
from .registry import (
    DEFAULT_PIPELINE,
    PassError,
    PassInfo,
    UnknownPassError,
    default_pipeline,
    get_pass,
    pass_info,
    pass_names,
    register_pass,
    run_passes,
    unregister_pass,
)
from .trace import PassStep, PassTrace, op_delta
from .views import canonical_view, compose

__all__ = [
    "DEFAULT_PIPELINE", "PassError", "PassInfo", "PassStep", "PassTrace", "UnknownPassError",
    "builtin", "canonical_view", "canonicalize_views", "compose", "cse", "dce", "default_pipeline",
    "get_pass", "op_delta", "pass_info", "pass_names", "register_pass", "run_passes", "simplify",
    "transpose_gemm", "unregister_pass",
]

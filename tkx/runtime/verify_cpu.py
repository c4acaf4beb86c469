"""``exp.verify()``: both interpreters against eager PyTorch on the CPU, arbitrated in float64.

The reference interpreter (the optimised program op by op) and the schedule interpreter (the
fused schedule and the arena) each run the step on copies of the same inputs; eager PyTorch runs
the user's step on copies too (for a step captured with ``state=``, the user's own modules and
optimizer on copies of their lifted tensors, with the learning rate as a Python float). Every
output and in-place update of each interpreter is compared with eager and the reference under
the rule of :func:`tkx.runtime.verify.verify` (relative error within the dtype's tolerance, or
as close to a float64 run of the reference as eager is), which the GPU's ``runner.verify()``
applies too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..random import drawing, with_state
from .verify import Comparison, Verification, VerificationError, clone_exact, compare, reference_fp64, tolerance_for


def _inputs(exp: Any, args: Sequence[Any] | None) -> tuple:
    user = tuple(args) if args is not None else exp.example_inputs
    user = tree_map(lambda t: clone_exact(t) if isinstance(t, torch.Tensor) else t, user)
    stateful = exp.captured.stateful
    if stateful is None:
        return user
    return (*stateful.snapshot(), *user)


def verify_cpu(exp: Any, args: Sequence[Any] | None = None, *, tolerances: Mapping[str, float] | None = None,
               strict: bool = False, show: bool = True) -> Verification:
    """Run the reference and the schedule interpreter against eager on the example inputs (or
    ``args``: the step's own arguments) and print :meth:`Verification.table` (``show=False``: don't).

    Returns the :class:`~tkx.runtime.verify.Verification` (kinds ``output``/``update``, with the
    interpreter in brackets). Neither the user's tensors nor the modules and optimizers change.
    Raises :class:`~tkx.runtime.verify.VerificationError` on a mismatch when ``strict=True``.
    """
    from .. import reference
    from ..schedule.interpreter import run as run_schedule

    program = exp.optimized
    inputs = _inputs(exp, args)
    stateful = exp.captured.stateful
    flat = with_state(program, tree_flatten(inputs)[0])  # one Philox state for every run of a random step
    eager_args = tree_map(lambda t: clone_exact(t) if isinstance(t, torch.Tensor) else t, inputs)
    rng = program.rng_input
    with drawing(flat[rng]) if rng is not None else contextlib.nullcontext():  # eager draws the same numbers
        out = stateful.eager(*eager_args) if stateful is not None else exp.step_fn(*eager_args)
    eager_out, eager_in = tree_flatten(out)[0], tree_flatten(eager_args)[0]
    ref = reference.run(program, [clone_exact(t) for t in flat])
    fused = run_schedule(exp.schedule, exp.arena, [clone_exact(t) for t in flat])
    exact = reference_fp64(program, flat)
    n_out = len(program.outputs)
    comparisons: list[Comparison] = []
    notes: list[str] = []
    if len(eager_out) != n_out:
        notes.append(f"eager returned {len(eager_out)} outputs, the program has {n_out}; outputs not compared")
    for which, run in (("reference", ref), ("schedule", fused)):
        for k, spec in enumerate(program.outputs if len(eager_out) == n_out else ()):
            dtype = spec.value.dtype
            c = compare(spec.name, f"output ({which})", dtype, 0, run.outputs[k], eager_out[k].detach(),
                        ref.outputs[k], exact[k], tolerance_for(dtype, exp.options, tolerances, program))
            comparisons.append(c)
        for u in program.updates:
            spec = program.inputs[u.input_index]
            dtype = spec.value.dtype
            comparisons.append(compare(spec.name, f"update ({which})", dtype, 0, run.updates[u.input_index],
                                       eager_in[u.input_index].detach(), ref.updates[u.input_index],
                                       exact[n_out + u.input_index],
                                       tolerance_for(dtype, exp.options, tolerances, program)))
    result = Verification(tuple(comparisons), (0,), tuple(notes))
    if show:
        print(result.table())
    if strict and not result.passed:
        raise VerificationError(result)
    return result

"""The compiled stateful step: ``runner(x, y)`` updates the model and the optimizer in place.

:class:`StatefulRunner` wraps a :class:`~tkx.runtime.CompiledRunner` of the lifted functional
step (:mod:`tkx.capture.stateful`): before each launch it gathers the live parameters,
buffers, gradients, optimizer state and learning rates (creating what ``torch.optim`` creates
lazily, as eager does), after it writes back what lives on another device (``torch.optim``'s CPU
step counts) and clears the gradients the step leaves at ``None``. A module switched between
``train()`` and ``eval()``, or a changed hyperparameter other than the learning rate, compiles the
step again (kept per variant).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["StatefulRunner"]


class StatefulRunner:
    """A compiled ``loss.backward(); opt.step()`` step, called with the step's own arguments.

    Attributes: ``runner`` (the :class:`~tkx.runtime.CompiledRunner` of the current variant),
    ``stateful`` (its :class:`~tkx.capture.stateful.StatefulStep`), ``variants`` (structure ->
    runner: one per train/eval and hyperparameter setting met so far). Raises what
    :func:`tkx.runtime.build` raises.
    """

    def __init__(self, make: Callable[[tuple], tuple[Any, Any]], example_inputs: Sequence[Any]) -> None:
        #: ``make(example_inputs) -> (CompiledRunner, StatefulStep)``: captures and compiles one variant
        self.make = make
        self.example_inputs = tuple(example_inputs)
        self.variants: dict[Any, Any] = {}
        self.runner, self.stateful = self._build(self.example_inputs)

    def _build(self, example_inputs: tuple) -> tuple[Any, Any]:
        runner, stateful = self.make(example_inputs)
        self.variants[stateful.captured_structure] = (runner, stateful)
        return runner, stateful

    def _current(self, args: tuple) -> None:
        """Switch to (or compile) the variant that fits the modules and optimizers now."""
        if self.stateful.stale() is None:
            return
        for runner, stateful in self.variants.values():
            if stateful.stale() is None:
                self.runner, self.stateful = runner, stateful
                return
        self.runner, self.stateful = self._build(args)

    @property
    def program(self) -> Any:
        return self.runner.program

    def __call__(self, *args: Any, check: bool = True) -> Any:
        """One step: what ``step_fn(*args)`` returns; the modules and optimizers are updated in place."""
        self._current(args)
        lifted = self.stateful.prepare()
        try:
            return self.runner(*lifted, *args, check=check)
        finally:
            self.stateful.finish()

    def verify(self, seeds: Sequence[int] = (0,), make_inputs: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
        """:meth:`CompiledRunner.verify` from the live state: the kernel, the reference interpreter and
        the user's step run eagerly (on copies of the lifted tensors), each on copies of the current
        parameters, buffers, gradients, optimizer state and learning rates and the example arguments
        (or ``make_inputs(seed)``). The modules and optimizers are not changed."""
        from .verify import call_make_inputs, clone_exact

        self._current(self.example_inputs)
        lifted = self.stateful.snapshot()

        def inputs(seed: int, device: Any = None) -> tuple:
            user = (call_make_inputs(make_inputs, seed, self.runner.device) if make_inputs is not None
                    else self.example_inputs)
            from torch.utils._pytree import tree_map
            user = tree_map(lambda t: clone_exact(t) if isinstance(t, torch.Tensor) else t, tuple(user))
            return (*[clone_exact(t) for t in lifted], *user)

        return self.runner.verify(seeds, inputs, **kwargs)

    def __repr__(self) -> str:
        return f"<tkx.StatefulRunner {self.runner.program.name}: {len(self.stateful.slots)} lifted tensors, " \
               f"{len(self.variants)} variant(s)>"

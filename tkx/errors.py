"""The public exceptions of tkx.

Every error raised on bad user input is a :class:`UnsupportedError` (or its parent
:class:`TkxError`). Its message names the offending operation, the FX node it became,
the user's source line and what to do instead, so a notebook cell shows one readable
sentence rather than a torch traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

#: Error code in ``status[0]`` written by the kernel -> what it means (``status[1]`` holds the
#: stage index, or for an index out of range the op's position). The one table: the prelude's
#: ``#define``s and the runtime's messages read it.
ERROR_CODES: Mapping[int, str] = MappingProxyType({
    0: "ok",
    1: "grid barrier timed out (a block never arrived: grid larger than the GPU can hold at once?)",
    2: "kernel launched with a block size other than the one it was generated for",
    3: "an index out of range (a label or index outside its table; status[1] holds the op's position)",
    4: "a counter wait timed out (a task's producers never finished; status[3] packs the group and counter)",
})
ERR_BARRIER_TIMEOUT = 1
ERR_BAD_LAUNCH = 2
ERR_INDEX = 3
ERR_WAIT_TIMEOUT = 4


class TkxError(Exception):
    """Base class of every error tkx raises on purpose. ``TkxError(message, **details)`` keeps each keyword
    detail as an attribute of the error (``err.op``, ``err.source``)."""

    def __init__(self, *args: object, **details: object) -> None:
        super().__init__(*args)
        self.__dict__.update(details)


class UnknownOpError(TkxError, KeyError):
    """A name that is not an op id (or group id) of the program or schedule asked.

    The message says what the name is instead (an op kind, a printer name such as ``%25``,
    a group id, an input) or suggests close op ids. A ``KeyError``, so ``except KeyError``
    keeps working.
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class SourceLine:
    """Where a value came from in the user's program.

    ``file`` and ``line`` point at the user's Python source (1-based line number),
    ``code`` is the stripped text of that line and ``function`` the enclosing function.
    """

    file: str
    line: int
    code: str = ""
    function: str = ""

    def short(self) -> str:
        """``file.py:LINE`` with the folder stripped (deterministic across machines)."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"

    def __str__(self) -> str:
        text = f"{self.short()} in {self.function}" if self.function else self.short()
        return f"{text}: {self.code}" if self.code else text


class UnsupportedError(TkxError):
    """The training step uses something tkx cannot compile.

    Attributes
    ----------
    kind: short machine-readable category (``"unsupported-op"``, ``"dynamic-shape"``,
        ``"data-dependent-control-flow"``, ``"closed-over-tensor"``, ``"random-op"``,
        ``"unsupported-dtype"``, ``"bad-input"``, ``"bad-call"`` (``step_fn(*example_inputs)``
        does not match ``step_fn``'s parameters, or ``step_fn`` is not callable),
        ``"device-mismatch"``, ``"integer-arithmetic"`` (an op that is not exact on integers),
        ``"not-functional"`` (``loss.backward()``,
        ``requires_grad_()`` or a ``torch.optim`` optimizer inside the step), ``"step-raised"``
        (the user's own code raised while tracing; the original exception is chained),
        ``"overlapping-write"`` (an in-place update of an input whose elements share memory)).
    op: the PyTorch operation involved (e.g. ``aten.nonzero.default``) or ``None``.
    node: the FX node name, or ``None`` when the error precedes tracing.
    source: the user's :class:`SourceLine`, or ``None`` when unknown.
    hint: what to do instead.
    """

    def __init__(self, kind: str, what: str, *, op: str | None = None, node: str | None = None,
                 source: SourceLine | None = None, hint: str = "") -> None:
        parts = [f"tkx cannot compile this step ({kind}): {what}"]
        if op is not None:
            parts.append(f"  op:     {op}" + (f" (FX node {node})" if node else ""))
        elif node is not None:
            parts.append(f"  node:   {node}")
        if source is not None:
            parts.append(f"  source: {source}")
        if hint:
            parts.append(f"  fix:    {hint}")
        super().__init__("\n".join(parts), kind=kind, what=what, op=op, node=node, source=source, hint=hint)


class KernelError(TkxError):
    """The kernel (or an interpreter running the same program) reported an error.

    ``code``: the status code (:data:`tkx.codegen.abi.ERRORS`); ``stage``: the stage whose
    barrier failed (``-1`` at kernel entry or when no stage applies); ``block``: the block
    that saw it (``-1`` from an interpreter); ``hazards``: why that barrier exists; ``op``:
    the IR op id that raised it (an index out of range) and ``source`` the user's line.
    """

    def __init__(self, message: str, *, code: int, stage: int = -1, block: int = -1,
                 hazards: tuple[str, ...] = (), op: str | None = None,
                 source: SourceLine | None = None) -> None:
        super().__init__(message, code=code, stage=stage, block=block, hazards=hazards, op=op, source=source)

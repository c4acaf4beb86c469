"""The kernel's sync and status words, and turning a nonzero status into a readable error.

One ``int32`` tensor of :data:`WORDS` words per runner (and per captured graph), zeroed once:

* words ``0..1`` - ``sync``: the grid barrier's state (``Options.grid_barrier``:
  one 64-bit arrival count that only grows, or an arrival count and a generation); the barrier
  leaves them ready for the next launch of the same grid; they are re-zeroed only after an error;
* words ``4..7`` - ``status``: ``status[0]`` the error code (:data:`tkx.codegen.abi.ERROR_CODES`),
  ``status[1]`` the stage whose barrier failed, ``status[2]`` the block that saw it.

``status`` starts 16 bytes into the tensor, so both pointers are 16-byte aligned.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ERR_INDEX, KernelError, TkxError  # noqa: F401 (KernelError lives in tkx.errors)
from ..indexing import index_error

WORDS = 8
SYNC_OFFSET = 0      # words
STATUS_OFFSET = 4    # words


def error_names() -> dict[int, str]:
    """Error code -> meaning, from the one table :data:`tkx.codegen.abi.ERROR_CODES` (``0``, ok, left out)."""
    from ..codegen import abi

    return {code: text for code, text in abi.ERROR_CODES.items() if code}


def new_words(device: torch.device, words: int = WORDS) -> torch.Tensor:
    """A zeroed words tensor (sync + status, and with ``sync="counters"`` the epoch and the
    counters: ``words`` = :attr:`CudaSource.sync_words`) on ``device``."""
    return torch.zeros(max(WORDS, int(words)), dtype=torch.int32, device=device)


def words_of(source: Any) -> int:
    """How many words the kernel of ``source`` needs (8 without counters)."""
    return int(getattr(source, "sync_words", WORDS) or WORDS)


def word_pointers(words: torch.Tensor) -> tuple[int, int]:
    """``(sync address, status address)`` inside a words tensor."""
    base = words.data_ptr()
    return base + 4 * SYNC_OFFSET, base + 4 * STATUS_OFFSET


def barrier_hazards(schedule: Any, stage: int) -> tuple[str, ...]:
    """The hazards the schedule recorded for the barrier before ``stage`` (empty if unknown)."""
    for barrier in getattr(schedule, "barriers", ()) or ():
        if getattr(barrier, "stage", None) == stage:
            return tuple(getattr(barrier, "hazards", ()) or ())
    return ()


def describe_status(code: int, stage: int, block: int, schedule: Any = None, launch: str = "") -> KernelError:
    """The :class:`KernelError` for status words ``(code, stage, block)``.

    Names the error, the stage whose barrier failed and the hazards that barrier guards
    (from ``schedule.barriers``); ``launch`` describes the launch (grid, block) for context.
    """
    meaning = error_names().get(code, f"unknown error code {code}")
    if code == ERR_INDEX:
        return _index_error(stage, block, schedule, launch)
    where = "at kernel entry" if stage < 0 else f"at the barrier before stage {stage}"
    lines = [f"the tkx kernel reported error {code}: {meaning}, {where} (seen by block {block})"]
    hazards = barrier_hazards(schedule, stage) if stage >= 0 else ()
    if hazards:
        lines.append("that barrier orders: " + "; ".join(hazards))
    stages = getattr(schedule, "stages", None)
    if stages is not None and 0 <= stage < len(stages):
        lines.append(f"stage {stage} runs groups {', '.join(stages[stage])}")
    if launch:
        lines.append(f"launch: {launch}")
    if code == 1:
        lines.append("a grid barrier times out when a block never arrives: the grid exceeded the co-resident "
                     "blocks, another kernel occupied the GPU, or a stage before it hung; raise "
                     "Options.spin_limit for very long stages or try Options(mode='block') to isolate it")
    return KernelError("\n  ".join(lines), code=code, stage=stage, block=block, hazards=hazards)


def _index_error(op_number: int, block: int, schedule: Any, launch: str) -> KernelError:
    """An out-of-range index: status[1] holds the position of the op in the program."""
    program = getattr(schedule, "program", None)
    op = program.ops[op_number] if program is not None and 0 <= op_number < len(program.ops) else None
    if op is None:
        return KernelError(f"the tkx kernel reported error {ERR_INDEX}: an index out of range (op #{op_number})",
                           code=ERR_INDEX, stage=-1, block=block)
    err = index_error(op, "an index read or written by this op is outside its dimension", "the kernel")
    lines = [str(err), f"seen by block {block}"]
    if launch:
        lines.append(f"launch: {launch}")
    lines.append("eager PyTorch raises here too: check the labels/indices you pass against the table sizes")
    return KernelError("\n  ".join(lines), code=ERR_INDEX, stage=-1, block=block, op=op.id, source=op.source)


def read_and_clear(words: torch.Tensor, schedule: Any = None, launch: str = "", *,
                   synchronize: bool = False) -> KernelError | None:
    """Read the status words; on an error, zero all the words (sync included, so the next
    launch starts clean) and return the :class:`KernelError` (``None`` when all is well).

    The read is a blocking copy on the current stream, so it waits for the launches made on
    that stream; ``synchronize=True`` first waits for the whole device (launches or graph
    replays on other streams)."""
    if synchronize and words.is_cuda:
        torch.cuda.synchronize(words.device)
    host = words.cpu()
    code, stage, block = (int(x) for x in host[STATUS_OFFSET:STATUS_OFFSET + 3])
    if code == 0:
        return None
    words.zero_()
    if words.is_cuda:
        torch.cuda.synchronize(words.device)
    if code == ERR_WAIT_TIMEOUT:
        return wait_error(stage, block, int(host[STATUS_OFFSET + 3]), int(host[8]), int(host[9]), schedule, launch)
    return describe_status(code, stage, block, schedule, launch)


ERR_WAIT_TIMEOUT = 4


def wait_error(item: int, block: int, where: int, value: int, threshold: int, schedule: Any = None,
               launch: str = "") -> KernelError:
    """The :class:`KernelError` of a counter wait that timed out: ``where`` packs the waiting
    group's position in the global order (high 16 bits) and the counter (low 16 bits; counter
    ``k`` belongs to the ``k``-th group of that order)."""
    pos, counter = where >> 16, where & 0xFFFF
    order = [g for st in getattr(schedule, "stages", ()) for g in st]
    waiting = order[pos] if 0 <= pos < len(order) else f"group #{pos}"
    producer = order[counter] if 0 <= counter < len(order) else f"group #{counter}"
    lines = [f"the tkx kernel reported error {ERR_WAIT_TIMEOUT}: a counter wait timed out: task {waiting} item "
             f"{item} (block {block}) waited on counter c{counter} of {producer}, which stood at {value} of "
             f"threshold {threshold}"]
    if launch:
        lines.append(f"launch: {launch}")
    lines.append("a wait times out when a producer's tiles never finish: the grid exceeded the co-resident "
                 "blocks, a producer failed, or the counters were not zeroed after an error; raise "
                 "Options.spin_limit for very long tasks or try Options(sync='barrier') to isolate it")
    return KernelError("\n  ".join(lines), code=ERR_WAIT_TIMEOUT, stage=-1, block=block)

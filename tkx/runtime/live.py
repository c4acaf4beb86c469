"""Watching a training loop while its launch is in flight: mapped host words and progress displays.

* :class:`MappedWords` - pinned host memory mapped into the device's address space
  (``cuMemHostAlloc`` with ``CU_MEMHOSTALLOC_DEVICEMAP``, the device address from
  ``cuMemHostGetDevicePointer``, through ``cuda.bindings``): the kernel stores its step count
  and latest loss there with system-scope releases and polls the stop word; Python reads and
  writes the same bytes without touching the stream. :class:`HostWords` is the same interface
  over plain memory (no device: the CPU path and tests).
* :func:`progress_display` - a ``rich`` progress bar in a terminal, an ``ipywidgets`` progress
  bar with a loss curve and a stop button in a notebook (ipywidgets imported only then).

Word layout: :mod:`tkx.codegen.loop` (``LIVE_DONE``, ``LIVE_LOSS``, ``LIVE_STOP``, ``LIVE_FINISHED``).
"""

from __future__ import annotations

import ctypes
import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..codegen.loop import LIVE_DONE, LIVE_FINISHED, LIVE_LOSS, LIVE_STOP, LIVE_WORDS
from ..errors import TkxError


@dataclass(frozen=True)
class Snapshot:
    """What the kernel has published: ``done`` steps of this launch, ``loss`` the latest loss (NaN before
    the first publication), ``finished`` whether the loop is over."""

    done: int
    loss: float
    finished: bool


class HostWords:
    """:data:`~tkx.codegen.loop.LIVE_WORDS` 32-bit words in ordinary host memory (``device_address`` 0)."""

    def __init__(self, words: int = LIVE_WORDS) -> None:
        self._buffer = (ctypes.c_uint32 * words)()
        self.words = self._buffer
        self.device_address = 0

    def clear(self) -> None:
        """Zero every word (before a launch: no progress, no stop request); the loss word becomes NaN."""
        for i in range(len(self.words)):
            self.words[i] = 0
        self.words[LIVE_LOSS] = 0x7FC00000

    def read(self) -> Snapshot:
        """The published progress: the step count first, then the loss (stored before the count, so it is at
        least as recent)."""
        done = int(self.words[LIVE_DONE])
        loss = struct.unpack("<f", struct.pack("<I", int(self.words[LIVE_LOSS])))[0]
        return Snapshot(done, float(loss), bool(self.words[LIVE_FINISHED]))

    def publish(self, done: int, loss: float, finished: bool = False) -> None:
        """Publish from the host as the kernel does (the CPU loop): the loss (float32 bits), then the count."""
        self.words[LIVE_LOSS] = struct.unpack("<I", struct.pack("<f", float(loss)))[0]
        self.words[LIVE_DONE] = int(done) & 0xFFFFFFFF
        self.words[LIVE_FINISHED] = int(finished)

    def request_stop(self) -> None:
        """Ask the running loop to stop at a step boundary (the kernel polls this word)."""
        self.words[LIVE_STOP] = 1

    @property
    def stop_requested(self) -> bool:
        return bool(self.words[LIVE_STOP])

    def close(self) -> None:
        pass


class MappedWords(HostWords):
    """Pinned host words mapped into ``device``'s address space (needs ``cuda.bindings`` and a GPU).

    ``device_address`` is what the kernel gets; ``words`` reads and writes the same bytes from Python.
    Raises :class:`TkxError` naming the driver error when the memory cannot be allocated or mapped.
    """

    def __init__(self, device: Any, words: int = LIVE_WORDS) -> None:
        from cuda.bindings import driver

        from .device import make_current

        make_current(device)
        flags = int(driver.CU_MEMHOSTALLOC_DEVICEMAP) | int(driver.CU_MEMHOSTALLOC_PORTABLE)
        err, host = driver.cuMemHostAlloc(4 * words, flags)
        if int(err) != 0:
            raise TkxError(f"cuMemHostAlloc of {4 * words} bytes of mapped pinned memory failed: {err}")
        self._host = int(host)
        err, dptr = driver.cuMemHostGetDevicePointer(self._host, 0)
        if int(err) != 0:
            driver.cuMemFreeHost(self._host)
            raise TkxError(f"cuMemHostGetDevicePointer failed: {err} (the device cannot map host memory)")
        self.words = (ctypes.c_uint32 * words).from_address(self._host)
        self.device_address = int(dptr)
        self._driver = driver
        self.clear()

    def close(self) -> None:
        """Free the pinned memory (only once no launch that uses it is in flight)."""
        if getattr(self, "_host", 0):
            self._driver.cuMemFreeHost(self._host)
            self._host = 0

    def __del__(self) -> None:  # pragma: no cover - depends on the garbage collector
        try:
            self.close()
        except Exception:
            pass


# --------------------------------------------------------------------------------------
# Displays
# --------------------------------------------------------------------------------------
class NoDisplay:
    """Shows nothing (``progress=False``, or no terminal and no notebook)."""

    def update(self, snap: Snapshot) -> None:
        pass

    def close(self, snap: Snapshot, note: str = "", losses: list[float] | None = None) -> None:
        pass


class TerminalDisplay:
    """A ``rich`` progress bar: steps done of ``steps``, the latest loss, steps per second."""

    def __init__(self, steps: int, title: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
                                  transient=False)
        self._progress.start()
        self._task = self._progress.add_task(title, total=max(1, steps), loss="-")

    def update(self, snap: Snapshot) -> None:
        loss = f"{snap.loss:.5g}" if math.isfinite(snap.loss) else "-"
        self._progress.update(self._task, completed=snap.done, loss=loss)

    def close(self, snap: Snapshot, note: str = "", losses: list[float] | None = None) -> None:
        self.update(snap)
        if note:
            self._progress.update(self._task, description=note)
        self._progress.stop()


#: Points the final loss curve keeps (every n-th step's loss, and the last).
CURVE_POINTS = 400
#: The loss curve's y axis turns logarithmic when the largest positive loss is over this many times the smallest.
LOG_SPAN = 100.0


def curve_svg(points: list[tuple[int, float]], steps: int, width: int = 360, height: int = 120) -> str:
    """An inline SVG line of ``(step, loss)`` points, the x axis from 0 to ``steps``, the y axis from the
    smallest to the largest finite loss (empty axes when there is none); logarithmic, and labelled so, when
    every loss is positive and they span more than LOG_SPAN (a training loss falling from 2.4 to 1e-3 is
    otherwise a flat line on the floor after the first steps)."""
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    pad = 6
    frame = (f'<rect x="0" y="0" width="{width}" height="{height}" fill="white" stroke="#bbb"/>')
    if not finite:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">{frame}</svg>'
    lo, hi = min(v for _, v in finite), max(v for _, v in finite)
    log = lo > 0 and hi / lo > LOG_SPAN
    scale = math.log10 if log else (lambda v: v)
    span = (scale(hi) - scale(lo)) or 1.0
    xs = [(pad + (width - 2 * pad) * s / max(1, steps)) for s, _ in finite]
    ys = [(height - pad - (height - 2 * pad) * (scale(v) - scale(lo)) / span) for _, v in finite]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">{frame}'
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{line}"/>'
            f'<text x="{width - pad}" y="14" font-size="11" text-anchor="end">max {hi:.4g}</text>'
            f'<text x="{width - pad}" y="{height - pad - 2}" font-size="11" text-anchor="end">min {lo:.4g}</text>'
            + (f'<text x="{pad}" y="{height - pad - 2}" font-size="11">log scale</text>' if log else "")
            + '</svg>')


class NotebookDisplay:
    """An ipywidgets progress bar, the latest loss, a loss curve (SVG) and a stop button.

    The button calls ``on_stop`` (which sets the stop word); a click is handled while the kernel of the
    notebook is idle, so start the loop with ``wait=False`` to be able to stop it."""

    def __init__(self, steps: int, title: str, on_stop: Callable[[], None] | None) -> None:
        import ipywidgets as widgets
        from IPython.display import display

        self.steps = max(1, steps)
        self.points: list[tuple[int, float]] = []
        self.bar = widgets.IntProgress(value=0, min=0, max=self.steps, description=title[:20])
        self.label = widgets.Label(value=f"0 / {steps} steps")
        self.curve = widgets.HTML(value=curve_svg([], self.steps))
        self.button = widgets.Button(description="Stop", button_style="danger", icon="stop")
        if on_stop is not None:
            self.button.on_click(lambda _b: on_stop())
        else:
            self.button.disabled = True
        self.box = widgets.VBox([widgets.HBox([self.bar, self.label, self.button]), self.curve])
        display(self.box)

    def update(self, snap: Snapshot) -> None:
        self.bar.value = min(snap.done, self.steps)
        loss = f", loss {snap.loss:.5g}" if math.isfinite(snap.loss) else ""
        self.label.value = f"{snap.done} / {self.steps} steps{loss}"
        if math.isfinite(snap.loss) and (not self.points or self.points[-1][0] != snap.done):
            self.points.append((snap.done, snap.loss))
            self.curve.value = curve_svg(self.points, self.steps)

    def close(self, snap: Snapshot, note: str = "", losses: list[float] | None = None) -> None:
        if losses:
            stride = max(1, len(losses) // CURVE_POINTS)
            self.points = [(i + 1, v) for i, v in enumerate(losses) if i % stride == 0 or i == len(losses) - 1]
        self.update(snap)
        self.curve.value = curve_svg(self.points, self.steps)
        self.button.disabled = True
        if note:
            self.label.value = f"{self.label.value} ({note})"


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel with ipywidgets installed."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except AttributeError:
        return False
    if ip is None or type(ip).__name__ != "ZMQInteractiveShell":
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def progress_display(progress: Any, steps: int, title: str, on_stop: Callable[[], None] | None = None) -> Any:
    """The display for ``progress``: ``"auto"`` (a notebook's widgets, else a rich bar on a terminal, else
    nothing), ``"notebook"``, ``"terminal"``, or ``False``/``None`` (nothing). Raises ``ValueError`` for
    anything else."""
    if progress in (False, None, "none"):
        return NoDisplay()
    if progress == "auto":
        if in_notebook():
            progress = "notebook"
        elif sys.stderr.isatty() or sys.stdout.isatty():
            progress = "terminal"
        else:
            return NoDisplay()
    if progress == "notebook":
        return NotebookDisplay(steps, title, on_stop)
    if progress == "terminal":
        return TerminalDisplay(steps, title)
    raise ValueError(f"progress must be 'auto', 'notebook', 'terminal' or False, not {progress!r}")

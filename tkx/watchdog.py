"""A time limit on user code that tkx calls (registered passes, fusion rules).

A pass or fusion rule written in a notebook cell can loop forever; without a limit the
notebook hangs in a call that is not the user's own. :func:`user_code` arms one watchdog
thread for the duration of a call: if the call runs longer than the limit, the watchdog
raises an exception *inside* it (``PyThreadState_SetAsyncExc``; it lands at the next Python
bytecode, so a pure-Python ``while True`` loop is stopped), and :func:`user_code` turns that
into one :class:`UserCodeTimeout` naming the pass or rule. Entering and leaving costs two
dictionary updates; one daemon thread serves every call.

The limit is :data:`TIME_LIMIT_SECONDS` (``$TKX_USER_CODE_SECONDS``, default 60 s; ``0``
turns it off). Code stuck inside one C call (a huge torch op) is only stopped when it returns.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import TkxError

__all__ = ["UserCodeTimeout", "user_code", "TIME_LIMIT_SECONDS"]


def _limit_from_env() -> float:
    try:
        return float(os.environ.get("TKX_USER_CODE_SECONDS", "60"))
    except ValueError:
        return 60.0


#: Seconds one call of user code may run (``0`` or less: no limit).
TIME_LIMIT_SECONDS = _limit_from_env()


class UserCodeTimeout(TkxError):
    """A registered pass or fusion rule ran past the time limit. ``what`` names it,
    ``seconds`` is the limit."""

    def __init__(self, what: str, seconds: float) -> None:
        self.what = what
        self.seconds = seconds
        super().__init__(
            f"{what} ran for more than {seconds:g} s and was stopped (an infinite loop?); fix it, or "
            f"remove it (tkx.passes.unregister_pass / tkx.schedule.remove_fusion_rule), or raise the limit with "
            f"tkx.watchdog.TIME_LIMIT_SECONDS / $TKX_USER_CODE_SECONDS")


class _Expired(BaseException):
    """Raised asynchronously inside user code that ran out of time (never escapes)."""


_REPEAT = 0.5


class _Watchdog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.active: dict[int, list] = {}  # thread id -> [deadline, fired]
        self.thread: threading.Thread | None = None

    def _ensure(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="tkx-watchdog", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                soonest = None
                for tid, entry in self.active.items():
                    if now >= entry[0]:
                        # fire, and again every REPEAT s should user code swallow it (bare except)
                        entry[1] = True
                        entry[0] = now + _REPEAT
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(_Expired))
                    soonest = entry[0] if soonest is None else min(soonest, entry[0])
                self.wake.wait(None if soonest is None else max(0.005, soonest - now))

    def arm(self, tid: int, seconds: float) -> list | None:
        with self.lock:
            if tid in self.active:  # nested user code: the outer limit stands
                return None
            self._ensure()
            entry = [time.monotonic() + seconds, False]
            self.active[tid] = entry
            self.wake.notify()
            return entry

    def disarm(self, tid: int, entry: list) -> None:
        with self.lock:
            self.active.pop(tid, None)
            if entry[1]:  # fired: make sure no exception is still pending for this thread
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)


_WATCHDOG = _Watchdog()


@contextmanager
def user_code(what: str, seconds: float | None = None) -> Iterator[None]:
    """Run the body under the time limit; past it raise :class:`UserCodeTimeout` naming
    ``what`` (e.g. ``"pass 'fold_my_thing'"``)."""
    limit = TIME_LIMIT_SECONDS if seconds is None else seconds
    if not limit or limit <= 0:
        yield
        return
    tid = threading.get_ident()
    entry = _WATCHDOG.arm(tid, limit)
    if entry is None:
        yield
        return
    try:
        yield
    except _Expired:
        _WATCHDOG.disarm(tid, entry)
        raise UserCodeTimeout(what, limit) from None
    finally:
        _WATCHDOG.disarm(tid, entry)

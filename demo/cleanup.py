"""Undo steps, run last-registered first, every one of them even when an earlier one fails, and
not cut short by a second Ctrl-C: while they run SIGINT and SIGTERM are ignored."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

CLEANUP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C (also a BaseException, so that no
    `except Exception` swallows it) and let the clean-up run."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# Signals seen and not yet acted on. gRPC's blocking calls can swallow the exception a handler
# raises (it surfaces inside gRPC's own code), so the steps also look here between them.
_pending: list[int] = []


def _exception_for(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Interrupted(signum)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _pending.append(signum)
    raise _exception_for(signum)


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install_signal_handlers() -> None:
    """SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP raise Interrupted; each is also
    remembered for raise_if_interrupted."""
    if on_main_thread():
        for signum in CLEANUP_SIGNALS:
            signal.signal(signum, _on_signal)


def raise_if_interrupted() -> None:
    """Raises for a signal whose exception got lost; call between steps."""
    if _pending:
        signum = _pending[-1]
        _pending.clear()
        raise _exception_for(signum)


def forget_signals() -> None:
    """The signal's exception has arrived and is being handled."""
    _pending.clear()


Step = Callable[[], Iterable[str] | None]


class Cleanup:
    """A stack of named undo steps. A step returns the problems it could not fix (or None); one
    that raises is recorded as a problem and the next step still runs."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Step]] = []

    def push(self, what: str, step: Step) -> None:
        self._steps.append((what, step))

    def run(self) -> list[str]:
        previous = self._ignore_signals()
        problems: list[str] = []
        try:
            while self._steps:
                what, step = self._steps.pop()
                try:
                    problems += [f"{what}: {p}" for p in (step() or ())]
                except Exception as exc:  # noqa: BLE001 - one failed step must not skip the others
                    problems.append(f"{what}: {type(exc).__name__}: {exc}")
        finally:
            self._restore(previous)
        return problems

    @staticmethod
    def _ignore_signals() -> dict[int, object]:
        if not on_main_thread():
            return {}
        return {s: signal.signal(s, signal.SIG_IGN) for s in CLEANUP_SIGNALS}

    @staticmethod
    def _restore(previous: dict[int, object]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

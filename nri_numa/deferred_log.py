"""Loggers that import ``logging`` only when a line has to go through it.

The modules a hook process loads log through these (``get_logger``): ``logging`` and what it
imports (traceback, tokenize, textwrap, string, weakref) cost each hook run ~10 ms on a 2-CPU
VM, and a hook's lines go to its own log file without it (nri_numa.hook.log_file). While a hook
run has that file open (``route_to``), every line of these loggers at INFO or above goes there
and nowhere else: what the hook's handler on the package's logger did before. Otherwise a line
goes to ``logging.getLogger(name)``, keyword arguments (``extra``, ``exc_info``) and all, as it
would from any logger; the agent never routes.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # as typing.TYPE_CHECKING: a hook process does not import typing
if TYPE_CHECKING:
    from typing import Any, Protocol

    class Sink(Protocol):
        def write(self, level: int, message: str, exc_info: Any) -> None: ...

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40  # logging's numbers
_routes: list[Sink] = []


def get_logger(name: str) -> DeferredLogger:
    return DeferredLogger(name)


def route_to(sink: Sink) -> None:
    """Send the lines of every deferred logger to ``sink`` until ``unroute(sink)``."""
    _routes.append(sink)


def unroute(sink: Sink) -> None:
    if sink in _routes:
        _routes.remove(sink)


def message(msg: object, args: tuple) -> str:
    """The line's text as logging makes it (``str(msg) % args``); a format that does not fit
    its arguments still gives a line, as logging's own error report would."""
    text = str(msg)
    if not args:
        return text
    try:
        return text % args
    except (TypeError, ValueError, KeyError):
        return f"{text} {args!r}"


class DeferredLogger:
    """The part of ``logging.Logger`` the hook's modules use."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(ERROR, msg, args, kwargs)

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        self._log(ERROR, msg, args, {**kwargs, "exc_info": exc_info})

    def _log(self, level: int, msg: object, args: tuple, kwargs: dict[str, Any]) -> None:
        if _routes:
            if level >= INFO:
                text = message(msg, args)
                exc_info = kwargs.get("exc_info")
                if exc_info is True:
                    exc_info = sys.exc_info()
                elif isinstance(exc_info, BaseException):  # logging takes the exception too
                    exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
                for sink in tuple(_routes):
                    sink.write(level, text, exc_info)
            return
        import logging

        kwargs.setdefault("stacklevel", 3)  # the record names the line that logged, not this one
        logging.getLogger(self.name).log(level, msg, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<DeferredLogger {self.name}>"

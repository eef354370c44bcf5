"""What an exception says, in one line, for log lines and tables."""

from __future__ import annotations


def error_line(err: BaseException, default: str = "") -> str:
    """The last non-empty line of ``err``'s message (TVM's errors end with the reason, after
    a traceback), or ``default`` where it has none (a bare ``assert``)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else default


def error_summary(err: BaseException) -> str:
    """``Type: last line`` of ``err`` (:func:`error_line`), for a reason in a log or a report."""
    return f"{type(err).__name__}: {error_line(err, 'no message')}"

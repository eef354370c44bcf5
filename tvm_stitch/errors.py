"""What an exception says, in one line, for log lines and tables."""

from __future__ import annotations


def error_line(err: BaseException, default: str = "") -> str:
    """The last non-empty line of ``err``'s message (TVM's errors end with the reason, after
    a traceback); where that line has no word (the closing brace of code printed after the
    reason), the first line that has one; ``default`` where there is none (a bare
    ``assert``)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if lines and not any(c.isalnum() for c in lines[-1]):
        worded = [line for line in lines if any(c.isalnum() for c in line)]
        return worded[0] if worded else lines[-1]
    return lines[-1] if lines else default


def error_summary(err: BaseException) -> str:
    """``Type: last line`` of ``err`` (:func:`error_line`), for a reason in a log or a report."""
    return f"{type(err).__name__}: {error_line(err, 'no message')}"

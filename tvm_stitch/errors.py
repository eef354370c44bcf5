"""What an exception says, in one line, for log lines and tables."""

from __future__ import annotations


def error_line(err: BaseException) -> str:
    """The last non-empty line of ``err``'s message (TVM's errors end with the reason, after
    a traceback), or ``""`` where it has none (a bare ``assert``)."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""

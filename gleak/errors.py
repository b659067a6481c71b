"""One exception type for every problem caused by the user's input (exit code 2)."""

from __future__ import annotations


class GleakError(Exception):
    """Bad input: an unreadable file, a mismatch, missing metadata. The CLI prints it in one line, exit 2."""

    exit_code = 2

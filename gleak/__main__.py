"""``python -m gleak`` and the ``gleak`` console script. The command line's imports (Typer, Rich, every command
module) are made inside :func:`main`, so that Ctrl-C while they load ends the process with exit 130 and one line,
like Ctrl-C anywhere later (gleak.cli.main), instead of a traceback."""

from __future__ import annotations

import os
import sys

from gleak.errors import INTERRUPTED


def main() -> None:
    try:
        from gleak.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")  # as gleak.cli.common.fail writes it
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    run()


if __name__ == "__main__":
    main()

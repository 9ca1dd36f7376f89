"""The agent's output lines, each in one write.

The agent runs unbuffered (`python -u`, infra/startup.py) with stdout and stderr on one journal stream, so
`print` would write a line's text and its newline apart, and another thread's line could land between them:
a JSON entry Cloud Logging can no longer parse. One write per line keeps every line whole.
"""

from __future__ import annotations

import sys
from typing import TextIO


def line(text: str, stream: TextIO | None = None) -> None:
    """Write `text` and its newline in one call, and flush."""
    out = stream if stream is not None else sys.stdout
    out.write(text + "\n")
    out.flush()

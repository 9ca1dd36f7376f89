"""Output lines, each in one write: the VM agent's (vm_agent/) and a program's (runlib, workloads/lib/).

Unbuffered (the agent runs under `python -u`, infra/startup.py; container images often set PYTHONUNBUFFERED),
`print` writes a line's text and its newline apart, and whatever else reaches the same journal or log
meanwhile lands between them: another thread's line (a clean-clone run saw a telemetry warning inside an
agent's JSON entry), or a line the framework's C++ writes to stderr (TensorStore's first gs:// access, during
a program's first checkpoint save). The JSON entry it lands in is one that the agent's timeline and Cloud
Logging can no longer parse. One write per line keeps every line whole.
"""

from __future__ import annotations

import sys
from typing import TextIO


def line(text: str, stream: TextIO | None = None) -> None:
    """Write `text` and its newline to `stream` (stdout when none) in one write, and flush."""
    out = stream if stream is not None else sys.stdout
    out.write(text + "\n")
    out.flush()

"""Where a run's output lines go besides the agent's stdout (the journal).

The second part of the design fills this in (Cloud Logging entries, Cloud Monitoring metrics); the
runner calls `ship` for every line the program prints, so that part plugs in here alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vm_agent.sources import RunSpec


def ship(line: str, run: RunSpec) -> None:
    """Ship one output line of `run`. The default ships nothing: the journal already has it."""

"""A run's state record, `<vm>/runs/<runId>/status.json` (run_contract.paths.status_name): written by the
agent on every transition, read by `tpu-runs` and by the agent after a reboot."""

from __future__ import annotations

STATES = ("queued", "starting", "running", "stopping", "finished", "failed", "stopped", "retry")
ENDED = ("finished", "failed", "stopped")  # a run in one of these never changes state again
RESUMABLE = tuple(state for state in STATES if state not in ENDED)  # a reboot resumes a request's run from these

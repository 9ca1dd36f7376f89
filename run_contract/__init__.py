"""The run contract: what the platform's runtimes tell each other about a run, defined once.

Five runtimes meet on it: the VM agent (vm_agent/) runs a run and records it, the guard
(functions/tpu_guard/) acts on its completion marker, `tpu-runs` (tpu_runs/) submits requests and reads
states, runlib (workloads/lib/) is the program's side, and the Pulumi program (infra/) renders the spec and
reads the marker. Each imports this package and keeps no copy of it:

- `spec`: the run spec (what a run is: source folder or image, command, env, ...) and its strict parser;
- `request`: a researcher's run or stop request (tpu-runs -> agent), its object name and run id;
- `status`: the run's state record (`status.json`) and its states;
- `timeline`: a run's events as the agent records them, and its time by category (goodput and cost);
- `completion_marker`: `<vm>/COMPLETE`, written when the stack's run has finished;
- `names`: the metadata keys, the environment the platform sets for a run, exit codes, object paths.
- `lines`: the agent's and a program's output lines, each in one write so that no other output lands inside one.
- `cel`: a CEL string literal, as the agent's access boundaries and the program's IAM conditions quote a value.

Standard library only, Python 3.8 (the oldest a TPU VM image ships; tests run vermin on it), and no
import from the rest of this repository: the package ships inside every artefact (the agent's archive,
the guard's source, the `tpu-runs` and runlib wheels), and a test checks that each carries the same
`digest()`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping

HOME = Path(__file__).resolve().parent


def files() -> dict[str, bytes]:
    """The package's modules by file name: what every artefact must carry."""
    return {path.name: path.read_bytes() for path in sorted(HOME.glob("*.py"))}


def digest(modules: Mapping[str, bytes] | None = None) -> str:
    """sha256 over the modules' names and bytes (this package's, by default)."""
    found = files() if modules is None else modules
    total = hashlib.sha256()
    for name in sorted(found):
        total.update(f"{name}\0{len(found[name])}\0".encode())
        total.update(found[name])
    return total.hexdigest()

"""The repository's example workloads: ordinary source folders under `workloads/` that describe
themselves (`example.json`: the framework they run on and their entry file).

`program: <name>` in a stack file is shorthand for one of them: `source: {folder: workloads/<name>}`,
the command `python <entry>` with runlib's flags from the workload's settings, and the framework the
catalog checks against the runtime. Nothing here lists them: a folder with an `example.json` is one.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from infra.config.workload_code import repository

EXAMPLES_FOLDER = "workloads"
FRAMEWORKS = ("tensorflow", "jax")


@dataclass(frozen=True)
class Example:
    name: str
    framework: str  # one of FRAMEWORKS
    entry: str  # the file the command runs, in the folder

    @property
    def folder(self) -> str:
        return f"{EXAMPLES_FOLDER}/{self.name}"


def not_an_example(name: object) -> str:
    """Why `program: <name>` is refused: no such example in the repository being read."""
    return (
        f"not an example of the stack's repository ({EXAMPLES_FOLDER}/{name}/example.json); "
        f"its examples: {', '.join(examples()) or 'none'}"
    )


def examples() -> dict[str, Example]:
    """The examples of the repository whose stack is being read (infra/config/workload_code.py `repository`)."""
    return _examples(repository())


@functools.cache
def _examples(root: Path) -> dict[str, Example]:
    out: dict[str, Example] = {}
    for manifest in sorted((root / EXAMPLES_FOLDER).glob("*/example.json")):
        data = json.loads(manifest.read_text())
        example = Example(manifest.parent.name, data["framework"], data["entry"])
        # A broken example is the repository's bug, not the stack's: fail loudly in the tests.
        assert example.framework in FRAMEWORKS, f"{manifest}: framework {example.framework!r}"
        assert (manifest.parent / example.entry).is_file(), f"{manifest}: no {example.entry}"
        out[example.name] = example
    return out

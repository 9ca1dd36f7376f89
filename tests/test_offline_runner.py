"""The offline runner: what it collects from a program, and what planning a stack loads."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pulumi
import pulumi_gcp as gcp
import pytest
import yaml

from benchmarks.plan_scale import fleet_stack
from tools.offline.mocks import SECRET
from tools.offline.runner import plan_stack, run_program

ROOT = Path(__file__).resolve().parents[1]


def test_stack_outputs_are_what_from_input_resolves_them_to():
    """The runner walks each output itself; the values must be those `Output.from_input` gives, secrets
    masked as a whole key, for every kind of value it unwraps."""
    by_sdk: dict[str, object] = {}

    def program() -> None:
        bucket = gcp.storage.Bucket("b", location="EU")

        async def later() -> str:
            return "awaited"

        outputs = {
            "plain": {"a": [1, (2, 3)], "empty": {}, "none": None, "list": []},
            "nested": {"name": bucket.name, "deeper": [pulumi.Output.from_input({"x": bucket.location})]},
            "output of outputs": bucket.name.apply(lambda n: {"n": pulumi.Output.from_input(n), "t": ("a", n)}),
            "args": gcp.storage.BucketIAMMemberConditionArgs(title=bucket.name, expression="true"),
            "awaitable": later(),
            "secret inside": {"ok": "shown", "key": pulumi.Output.secret("hunter2")},
            "secret": pulumi.Output.secret(["s"]),
        }
        for key, value in outputs.items():
            pulumi.export(key, value)
            if key != "awaitable":  # an awaitable can be awaited once
                pulumi.Output.from_input(value).apply(lambda v, key=key: by_sdk.__setitem__(key, v))

    result = run_program("dev", {"gcp:project": "p"}, program)
    expected = {**by_sdk, "awaitable": "awaited", "secret inside": SECRET, "secret": SECRET}
    assert result.outputs == expected
    assert result.outputs["nested"]["deeper"] == [{"x": "EU"}]
    assert result.outputs["output of outputs"]["t"][0] == "a"
    assert isinstance(result.outputs["args"], gcp.storage.BucketIAMMemberConditionArgs)


def test_a_stack_without_gke_teams_plans_without_loading_the_cluster_validator():
    """jsonschema and the CEL interpreter check the queues of a stack with GKE teams; importing them is a
    third of what the program loads beyond the SDK, so a stack without teams does not pay for them."""
    code = (
        "import json, sys\n"
        "from tools.offline.runner import plan_stack\n"
        "plan_stack('dev')\n"
        "print(json.dumps(sorted(m for m in ('jsonschema', 'celpy', 'infra.gke.validation') if m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == []


OUR_CODE = tuple(str(ROOT / folder) + os.sep for folder in ("infra", "tools", "policy", "run_contract", "bootstrap"))


def _lines_of_our_code_run(stack_file: Path) -> int:
    """How many lines of this project's code the plan of `stack_file` runs, the mocks' included: they answer
    the SDK in its executor's threads, so the plan gets a fresh executor whose threads start traced."""
    lines = 0

    def count(frame, event, arg):
        nonlocal lines
        lines += event == "line"
        return count

    def ours(frame, event, arg):
        return count if frame.f_code.co_filename.startswith(OUR_CODE) else None

    loop = asyncio.get_event_loop()
    traced = ThreadPoolExecutor()
    loop.set_default_executor(traced)
    before = sys.gettrace(), threading.gettrace()  # a coverage tool's, if one runs
    threading.settrace(ours)
    sys.settrace(ours)
    try:
        plan_stack("dev", stack_file)
    finally:
        sys.settrace(before[0])
        threading.settrace(before[1])
        traced.shutdown()
        loop.set_default_executor(ThreadPoolExecutor())
    return lines


@pytest.mark.slow  # five plans under a tracer: 6 s alone, more on shared cores
def test_each_further_tpu_vm_costs_the_plan_the_same_lines_of_our_code(tmp_path):
    """The plan's work per TPU VM must not grow with the fleet: a rule, a mock or a name check that scans
    every VM (or every registration) once per VM made the stack reader quadratic before (310a050). Lines run
    are counted, not timed: each line of a loop's body counts once per pass, so such a scan adds lines per VM
    with every VM, while a linear plan adds the same lines for each. Fleets are benchmarks/plan_scale.py's."""
    stack_files = {}
    for count in (2, 4, 6, 8):
        stack_files[count] = tmp_path / str(count) / "Pulumi.dev.yaml"
        stack_files[count].parent.mkdir()
        stack_files[count].write_text(yaml.safe_dump(fleet_stack(count)))
    # The first plan in a process also runs imports and fills caches: the largest fleet first, not counted,
    # so each counted plan finds the same caches whatever other tests planned before.
    _lines_of_our_code_run(stack_files[8])
    runs = {count: _lines_of_our_code_run(stack_file) for count, stack_file in stack_files.items()}
    per_two_vms = [runs[4] - runs[2], runs[6] - runs[4], runs[8] - runs[6]]
    assert per_two_vms[0] > 0 and per_two_vms == [per_two_vms[0]] * 3, runs

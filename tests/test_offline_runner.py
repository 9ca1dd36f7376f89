"""The offline runner: what it collects from a program, and what planning a stack loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from tools.offline.mocks import SECRET
from tools.offline.runner import run_program

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

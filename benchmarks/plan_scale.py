#!/usr/bin/env python3
"""How the offline plan scales with the fleet, against the Pulumi SDK's own floor.

For the dev stack and for generated stacks of N TPU VMs, each run in a fresh process:
- the program: the real program under the offline mocks (`tools.offline.runner.plan_stack`);
- the floor: the same resources (type, name, inputs, parent, as the program's run recorded them)
  registered as bare `CustomResource`s/`ComponentResource`s under the same mocks, after importing the
  same pulumi-gcp modules: what any program declaring these resources pays the SDK;
- the offline tool's extras on the program's plan, each timed alone, after a collection of the plan's cyclic
  garbage (timed too): the stack reader again (who-can-do-what reads the stack's identities from it), the
  policy pack, the cost estimate and its table, the JSON and text plans, the later deploy's plan (from the
  program's one run: tools/offline/deploys.py) and who-can-do-what (the access computation on both plans).
  Their marginal cost per extra VM shows whether each is linear.

Prints wall time and CPU time (the process, imports included) and peak memory (max RSS) of both, their ratios, the
extras, and the marginal cost per extra VM. The machine may be shared: `--rounds` runs the floor and the
program back to back several times, and the ratios of each round are what to read. Not a test: figures only.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before the imports: a process's wall time includes them

import argparse  # noqa: E402
import gc  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ZONES = ["us-central1-b", "us-central1-c"]  # v2-8 zones inside the dev stack's single region
VM_TYPE = "gcp:tpu/v2Vm:V2Vm"


def fleet_stack(count: int, on_completion: str | None = None) -> dict:
    """dev with `count` copies of its TPU VM; `on_completion`: theirs instead of dev's (`delete` makes the
    program read each VM's completion marker in a later deploy)."""
    stack = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    config = stack["config"]
    template = config["tpu-platform:tpuVms"][0]
    if on_completion:
        template["onCompletion"] = on_completion
    config["tpu-platform:budget"].update(amount=10**9, failOverBudget=False)  # measure planning, not budgets
    config["tpu-platform:tpuVms"] = [
        {**template, "name": f"mnist-{i:04d}", "zone": ZONES[i % len(ZONES)]} for i in range(count)
    ]
    return stack


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _figures() -> dict[str, Any]:
    """Wall time, CPU time (both since the process started) and peak memory: on a shared machine a
    process's CPU time moves far less with the load than its wall time."""
    return {"wall_s": time.perf_counter() - STARTED, "cpu_s": time.process_time(), "peak_mib": _peak_mib()}


def _lazy(module: object) -> bool:
    """A module pulumi's lazy import put in sys.modules and nothing loaded yet (pulumi._utils._LazyModule)."""
    return type(module).__name__ == "_LazyModule"


# --- the child processes ---------------------------------------------------------------------------


def _program(stack_file: Path, record: Path, extras: bool = True) -> dict:
    """Plan the stack; then (outside the figures) record what it registered and time the extras."""
    sys.path.insert(0, str(ROOT))
    from infra.config.stackfile import stack_of
    from tools.offline.runner import plan_stack

    stack = stack_of(stack_file)
    result = plan_stack(stack, stack_file)
    figures: dict[str, Any] = _figures()
    figures["resources"] = len(result.resources)
    figures["vms"] = len(result.of_type(VM_TYPE))
    # What the program loaded; a provider SDK's subpackages it never touched stay lazy placeholders.
    modules = sorted(m for m, module in sys.modules.items() if m.startswith("pulumi_") and not _lazy(module))
    registrations = [
        {"type": r.type, "name": r.name, "parent": r.parent, "custom": r.custom, "urn": r.urn, "inputs": r.inputs}
        for r in result.resources
    ]
    record.write_text(json.dumps({"modules": modules, "registrations": registrations}))
    figures["extras"] = _extras(result) if extras else {}
    return figures


def _timed(extras: dict[str, float], name: str, work):
    started = time.perf_counter()
    value = work()
    extras[name] = time.perf_counter() - started
    return value


def _extras(result) -> dict[str, float]:
    """Each of the offline tool's extras on the program's plan, timed alone (the command runs them all)."""
    from infra.config import parse_stack_config
    from infra.cost import cost_table, estimate
    from tools.offline.access import who_can_do_what
    from tools.offline.deploys import plan_deploys
    from tools.offline.policy_check import check_policies
    from tools.offline.render import to_json, to_text

    extras: dict[str, float] = {}
    # The plan leaves cyclic garbage behind (the SDK's, some 1.3 million objects at 1,000 VMs), and the first
    # collection after it freed it inside whichever extra came first: a third of the policy pack's time at
    # 1,000 VMs. Collected here, on a line of its own, each extra's figure is its own work.
    _timed(extras, "collector (the plan's garbage)", gc.collect)
    # The stack reader again, as who-can-do-what and the later plan use it (the program's own run is in its figures).
    cfg = _timed(extras, "stack reader", lambda: parse_stack_config(result.stack, result.config))
    violations = _timed(extras, "policy pack", lambda: check_policies(result))
    pools = cfg.gke.slice_pools if cfg.gke else ()
    _timed(extras, "cost", lambda: cost_table(estimate(cfg.tpu_vms, cfg.budget, pools).as_output()))
    _timed(extras, "JSON plan", lambda: json.dumps(to_json(result, [v.as_dict() for v in violations]), default=str))
    _timed(extras, "text plan", lambda: to_text(result))
    deploys = _timed(extras, "later plan", lambda: plan_deploys(result))
    _timed(extras, "who-can-do-what", lambda: who_can_do_what(deploys))
    return extras


def _floor(stack_file: Path, record: Path) -> dict:
    """The recorded registrations replayed as bare resources, under the same mocks."""
    sys.path.insert(0, str(ROOT))
    import importlib

    import pulumi

    from infra.config.stackfile import stack_of
    from tools.offline.runner import plan_stack

    recorded = json.loads(record.read_text())
    for name in recorded["modules"]:
        module = importlib.import_module(name)
        getattr(module, "__all__", None)  # any attribute but the introspection ones loads a lazy module
    registrations = recorded["registrations"]
    stack = stack_of(stack_file)

    def replay() -> None:
        made: dict[str, pulumi.Resource] = {}
        for r in registrations:
            opts = pulumi.ResourceOptions(parent=made.get(r["parent"]))
            if r["type"].startswith("pulumi:providers:"):
                package = r["type"].removeprefix("pulumi:providers:")
                made[r["urn"]] = pulumi.ProviderResource(package, r["name"], r["inputs"], opts)
            elif r["custom"]:
                made[r["urn"]] = pulumi.CustomResource(r["type"], r["name"], r["inputs"], opts)
            else:
                made[r["urn"]] = pulumi.ComponentResource(r["type"], r["name"], None, opts)

    result = plan_stack(stack, stack_file, program=replay)
    figures = _figures()
    figures["resources"] = len(result.resources)
    assert figures["resources"] == len(registrations), "the floor registered another number of resources"
    return figures


# --- the driver ------------------------------------------------------------------------------------


def _child(phase: str, stack_file: Path, record: Path) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", phase, str(stack_file), str(record)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"the {phase} run of {stack_file} failed:\n{done.stderr[-5000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def measure(label: str, stack_file: Path, rounds: int, folder: Path, extras: bool = True) -> dict:
    """The program then the floor, back to back, `rounds` times; medians and each round's ratio."""
    record = folder / f"{label}.registrations.json"
    programs, floors = [], []
    for _ in range(rounds):
        programs.append(_child("program" if extras else "program-alone", stack_file, record))
        floors.append(_child("floor", stack_file, record))
    last = programs[-1]
    assert floors[-1]["resources"] == last["resources"]
    return {
        "label": label,
        "vms": last["vms"],
        "resources": last["resources"],
        "program_s": statistics.median(p["wall_s"] for p in programs),
        "floor_s": statistics.median(f["wall_s"] for f in floors),
        "ratios": [p["wall_s"] / f["wall_s"] for p, f in zip(programs, floors, strict=True)],
        "program_cpu_s": statistics.median(p["cpu_s"] for p in programs),
        "floor_cpu_s": statistics.median(f["cpu_s"] for f in floors),
        "program_mib": statistics.median(p["peak_mib"] for p in programs),
        "floor_mib": statistics.median(f["peak_mib"] for f in floors),
        "extras": {k: statistics.median(p["extras"][k] for p in programs) for k in last["extras"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 400])
    parser.add_argument("--rounds", type=int, default=1, help="program and floor back to back, this many times")
    parser.add_argument("--no-dev", action="store_true", help="skip the dev stack itself")
    parser.add_argument("--no-extras", action="store_true", help="skip timing the offline tool's extras")
    parser.add_argument(
        "--on-completion", choices=("stop", "delete"), help="the fleet's onCompletion instead of dev's VM's"
    )
    parser.add_argument("--child", nargs=3, metavar=("PHASE", "STACK_FILE", "RECORD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        phase, stack_file, record = args.child
        if phase == "floor":
            figures = _floor(Path(stack_file), Path(record))
        else:
            figures = _program(Path(stack_file), Path(record), extras=phase == "program")
        print(json.dumps(figures))
        return

    print(f"load before: {os.getloadavg()[0]:.2f} (1-minute load average, {os.cpu_count()} CPUs)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if not args.no_dev:
            rows.append(measure("dev", ROOT / "Pulumi.dev.yaml", args.rounds, folder, not args.no_extras))
        for size in sorted(args.sizes):
            path = folder / str(size) / "Pulumi.dev.yaml"
            path.parent.mkdir()
            path.write_text(yaml.safe_dump(fleet_stack(size, args.on_completion)))
            row = measure(f"{size} VMs", path, args.rounds, folder, not args.no_extras)
            assert row["vms"] == size, f"planned {row['vms']} VMs, expected {size}"
            rows.append(row)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(
        f"{'stack':>9} {'resources':>9} {'program s':>9} {'floor s':>8} {'ratio':>6}"
        f" {'program MiB':>11} {'floor MiB':>9} {'ratio':>6} {'program CPU s':>13} {'floor CPU s':>11} {'ratio':>6}"
        "  ratio per round"
    )
    for row in rows:
        rounds = ", ".join(f"{r:.2f}" for r in row["ratios"])
        print(
            f"{row['label']:>9} {row['resources']:>9} {row['program_s']:>9.2f} {row['floor_s']:>8.2f}"
            f" {row['program_s'] / row['floor_s']:>6.2f} {row['program_mib']:>11.0f} {row['floor_mib']:>9.0f}"
            f" {row['program_mib'] / row['floor_mib']:>6.2f} {row['program_cpu_s']:>13.2f} {row['floor_cpu_s']:>11.2f}"
            f" {row['program_cpu_s'] / row['floor_cpu_s']:>6.2f}  {rounds}"
        )
    if not args.no_extras:
        print("the offline tool's extras on the program's plan, seconds:")
    for row in rows if not args.no_extras else []:
        print(f"{row['label']:>9}: " + ", ".join(f"{k} {v:.2f}" for k, v in row["extras"].items()))
    # Constant marginal cost means planning is linear in the fleet: no per-VM work grows with its size.
    fleets = [row for row in rows if row["label"] != "dev"]
    for smaller, larger in itertools.pairwise(fleets):
        span = larger["vms"] - smaller["vms"]
        program = 1000 * (larger["program_s"] - smaller["program_s"]) / span
        floor = 1000 * (larger["floor_s"] - smaller["floor_s"]) / span
        print(
            f"marginal cost {smaller['vms']} -> {larger['vms']} VMs: {program:.1f} ms per extra TPU VM"
            f" (floor {floor:.1f} ms)"
        )
        if not args.no_extras:
            each = {k: 1000 * (larger["extras"][k] - smaller["extras"][k]) / span for k in larger["extras"]}
            print("  extras, ms per extra TPU VM: " + ", ".join(f"{k} {v:.2f}" for k, v in each.items()))


if __name__ == "__main__":
    main()

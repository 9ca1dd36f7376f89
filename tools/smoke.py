"""`python -m tools.smoke`: a smoke test on a real sandbox project. It costs money and needs credentials.

It writes a tiny stack file (tools/smoke_stack.yaml filled in: the cheapest single-host TPU the catalog
offers in the zone, spot, one epoch of MNIST, `onCompletion: stop`), checks it with the real config parser
and the offline plan, then:

  1. `pulumi stack init` (a throwaway stack, passphrase secrets) and `pulumi up`;
  2. waits for the completion marker `gs://<status bucket>/<vm>/COMPLETE`;
  3. checks a checkpoint exists under `gs://<checkpoints bucket>/<workload>/<vm>/<run>/`;
  4. checks the completion action: the guard stopped the node (`gcloud compute tpus tpu-vm describe`);
  5. tries on the project the GCP behaviours the platform relies on but cannot prove offline (`probes`):
     Artifact Registry's service identity (generateServiceIdentity), and a spot node made by a queued
     request in the stack's network: that it names its request (Node.queuedResource), the Python of its
     tpu-vm-tf-* image, what a stop does to it, and that deleting the request with `--force` deletes it;
  6. always (a `finally`, whatever failed before): `pulumi destroy`, then checks the spot node is gone
     and the data and status buckets survived (`retain_on_delete`), and `pulumi stack rm`;

and prints what it verified. `--dry-run` prints the stack file and every command in the order the run
would issue them, and runs none (the same code path, with a shell that only prints).

Pulumi reads the stack file through `--config-file` (Pulumi CLI: "Use the configuration values in the
specified file rather than detecting the file name"), so no Pulumi.<stack>.yaml lands in the checkout.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from infra.catalog import AcceleratorType, load_catalog, version_key
from infra.config import PlatformConfig, parse_stack_config
from infra.schema import ConfigError
from infra.tpu.metadata import run_prefix
from tools.offline.stackfile import ROOT, read_stack_config

TEMPLATE = Path(__file__).with_name("smoke_stack.yaml")
VM, WORKLOAD, RUN = "smoke-tpu", "mnist", "smoke"
SMOKE_TF = "2.15.0"  # the TF the prod stack runs on v5e; older generations' tf_min is far older


def plan_offline(stack: str, stack_file: Path) -> list[str]:
    """The offline plan of the stack file (its warnings); raises on any error.

    The one import of the offline planner here (it is moving to tools/; update this line when it does).
    """
    from tools.offline.runner import plan_stack

    return plan_stack(stack, stack_file).warnings


@dataclass(frozen=True)
class TpuChoice:
    accelerator: AcceleratorType
    runtime: str
    tf_version: str
    usd_per_hour: float


def cheapest_tpu(zone: str) -> TpuChoice:
    """The single-host TPU type offered in `zone` with the lowest spot price per hour (chips x price)."""
    catalog = load_catalog()
    offered = []
    for generation in catalog.generations.values():
        for size in sorted(generation.single_host):
            if zone not in generation.zones_for(size):
                continue
            accelerator = AcceleratorType(generation, size)
            price = catalog.price_per_chip_hour(accelerator, "spot", zone.rsplit("-", 1)[0])
            if price is not None:  # the zone's own region's price, never another's
                offered.append((price * accelerator.chips, accelerator))
    if not offered:
        zones = sorted({z for g in catalog.generations.values() for z in g.zones})
        raise SystemExit(
            f"error: the TPU catalog offers no single-host TPU in {zone}; zones it knows: {', '.join(zones)}"
        )
    usd, accelerator = min(offered, key=lambda item: (item[0], item[1].name))
    tf = max(SMOKE_TF, accelerator.generation.tf_min, key=version_key)
    return TpuChoice(accelerator, catalog.expected_tf_runtime(accelerator, tf), tf, usd)


@dataclass(frozen=True)
class SmokeArgs:
    project: str
    billing_account: str
    zone: str
    stack: str
    owner: str
    email: str
    budget: float
    bucket_location: str


def stack_file_text(args: SmokeArgs, choice: TpuChoice) -> str:
    region = args.zone.rsplit("-", 1)[0]
    return Template(TEMPLATE.read_text()).substitute(
        project=args.project,
        region=region,
        owner=args.owner,
        billing_account=args.billing_account,
        bucket_location=args.bucket_location or region.upper(),
        budget=f"{args.budget:g}",
        email=args.email,
        tf_version=choice.tf_version,
        run=RUN,
        batch_size=128 * choice.accelerator.devices,  # splits evenly over the devices, 128 each
        vm=VM,
        accelerator=choice.accelerator.name,
        zone=args.zone,
        runtime=choice.runtime,
    )


@dataclass
class Shell:
    """Runs commands, or (dry run) prints them and answers as a successful run would."""

    dry_run: bool
    env: dict[str, str] = field(default_factory=dict)
    printed: list[str] = field(default_factory=list)

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, answer: str = "") -> tuple[int, str]:
        line = shlex.join(argv)
        self.printed.append(line)
        print(f"$ {line}", flush=True)
        if self.dry_run:
            return 0, answer
        done = subprocess.run(list(argv), cwd=cwd, env={**os.environ, **self.env}, capture_output=True, text=True)
        if done.returncode:
            print(done.stderr.strip()[-2000:], file=sys.stderr)
        return done.returncode, done.stdout.strip()


@dataclass
class Report:
    dry_run: bool = False
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    observed: list[tuple[str, str]] = field(default_factory=list)  # what GCP did where nothing relies on it

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, ok, detail))
        verdict = "check" if self.dry_run else "ok   " if ok else "FAIL "
        print(f"{verdict} {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    def note(self, name: str, detail: str) -> None:
        self.observed.append((name, detail))
        print(f"{'note ' if self.dry_run else 'seen '} {name}: {detail}", flush=True)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(ok for _, ok, _ in self.checks)

    def text(self) -> str:
        lines = ["", "Smoke test: what was verified"]
        lines += [
            f"  [{'x' if ok else ' '}] {name}{' (' + detail + ')' if detail else ''}"
            for name, ok, detail in self.checks
        ]
        lines += [f"  seen: {name}: {detail}" for name, detail in self.observed]
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


def wait_for(
    shell: Shell, argv: Sequence[str], done: Callable[[int, str], bool], *, minutes: float, every: float, answer: str
) -> bool:
    """Run `argv` until `done(rc, output)` or `minutes` have passed (a dry run answers `answer` at once)."""
    deadline = time.monotonic() + minutes * 60
    while True:
        rc, out = shell.run(argv, answer=answer)
        if done(rc, out):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(every)


def smoke(
    cfg: PlatformConfig, stack_file: Path, shell: Shell, *, run_minutes: float, poll_seconds: float,
    action_minutes: float = 15,
) -> Report:  # fmt: skip
    """Deploy, check, destroy: the steps of the module docstring. Destroy runs whatever happened before."""
    report = Report(shell.dry_run)
    vm = cfg.tpu_vms[0]
    stack = ["--stack", cfg.stack]
    config = ["--config-file", str(stack_file)]
    status, checkpoints = cfg.bucket_name("status"), cfg.bucket_name("checkpoints")
    project = ["--project", cfg.project]
    rc, _ = shell.run(["pulumi", "stack", "init", cfg.stack, "--secrets-provider", "passphrase"], cwd=ROOT)
    if not report.add("pulumi stack init", rc == 0):
        return report
    try:
        rc, _ = shell.run(["pulumi", "up", *stack, *config, "--yes", "--skip-preview"], cwd=ROOT)
        if not report.add("pulumi up", rc == 0):
            return report
        marker = f"gs://{status}/{vm.name}/COMPLETE"
        complete = wait_for(shell, ["gcloud", "storage", "ls", *project, marker], lambda rc, out: rc == 0 and bool(out),
                            minutes=run_minutes, every=poll_seconds, answer=marker)  # fmt: skip
        report.add("the run completed: completion marker written", complete, marker)
        prefix = f"gs://{checkpoints}/{run_prefix(cfg, vm)}/"
        rc, out = shell.run(
            ["gcloud", "storage", "ls", "--recursive", *project, prefix], answer=f"{prefix}ckpt-1.index"
        )
        report.add("a checkpoint was written", rc == 0 and bool(out), prefix)
        describe = ["gcloud", "compute", "tpus", "tpu-vm", "describe", vm.name, "--zone", vm.zone, *project,
                    "--format", "value(state)"]  # fmt: skip
        stopped = complete and wait_for(
            shell,
            describe,
            lambda rc, out: rc == 0 and out == "STOPPED",
            minutes=action_minutes,
            every=poll_seconds,
            answer="STOPPED",
        )
        report.add(f"the guard carried out onCompletion: {vm.on_completion} (node STOPPED)", stopped, vm.name)
        probes(cfg, shell, report, poll_seconds=poll_seconds, wait_minutes=action_minutes)
    finally:
        rc, _ = shell.run(["pulumi", "destroy", *stack, *config, "--yes", "--skip-preview"], cwd=ROOT)
        report.add("pulumi destroy", rc == 0)
        rc, out = shell.run([*tpu_vm("describe", vm.name, vm.zone, cfg.project), "--format", "value(name)"])
        report.add("a spot node is deleted (destroy deleted the stopped node)", rc != 0 or not out, vm.name)
        for purpose in ("data", "status"):  # retained by destroy in every stack (infra/storage.py, lifecycle.py)
            bucket = f"gs://{cfg.bucket_name(purpose)}"
            rc, _ = shell.run(["gcloud", "storage", "buckets", "describe", bucket, *project, "--format", "value(name)"])
            report.add(f"the {purpose} bucket survived destroy", rc == 0, bucket)
        rc, _ = shell.run(["pulumi", "stack", "rm", cfg.stack, "--yes"], cwd=ROOT)
        report.add("pulumi stack rm", rc == 0)
    return report


# --- GCP behaviours the platform relies on, tried on the real project --------------------------------

PROBE = "smoke-probe"  # a queued request, and the node it makes, for the probes
AGENT_EMAIL = re.compile(r"service-\d+@gcp-sa-artifactregistry\.iam\.gserviceaccount\.com")


def tpu_vm(verb: str, node: str, zone: str, project: str) -> list[str]:
    return ["gcloud", "compute", "tpus", "tpu-vm", verb, node, "--zone", zone, "--project", project]


def queued(verb: str, zone: str, project: str) -> list[str]:
    return ["gcloud", "compute", "tpus", "queued-resources", verb, PROBE, "--zone", zone, "--project", project]


def probes(cfg: PlatformConfig, shell: Shell, report: Report, *, poll_seconds: float, wait_minutes: float) -> None:
    """What the plan and the guard take from Google's documents and schemas, tried once for real.

    - Artifact Registry's service agent is provisioned by generateServiceIdentity (the bootstrap's
      ServiceIdentity resources; `gcloud beta services identity create`).
    - A node made by a queued request names it (tpu.v2 Node.queuedResource): the guard deletes a queued VM
      through that name. Deleting the request with force deletes the node (queuedResources.delete `force`).
    - What stopping such a node does (the plan refuses stop for queued VMs: nothing relies on it; noted).
    - The Python of a `tpu-vm-tf-*` image, which Google does not document (the catalog says `unknown`).
    The request is deleted whatever happens, before `destroy` removes the network it uses.
    """
    vm, project = cfg.tpu_vms[0], cfg.project
    identity = ["gcloud", "beta", "services", "identity", "create", "--service=artifactregistry.googleapis.com"]
    rc, out = shell.run([*identity, "--project", project, "--format", "value(email)"],
                        answer="service-123456789012@gcp-sa-artifactregistry.iam.gserviceaccount.com")  # fmt: skip
    report.add("Artifact Registry's service identity is generated", rc == 0 and bool(AGENT_EMAIL.fullmatch(out)), out)
    network = f"tpu-{cfg.stack}"  # infra/network.py: the stack's network, its subnet per region, the IAP-SSH tag
    rc, _ = shell.run([*queued("create", vm.zone, project), "--node-id", PROBE, "--accelerator-type",
                       vm.accelerator.name, "--runtime-version", vm.runtime_version, "--spot", "--network", network,
                       "--subnetwork", f"{network}-{vm.region}", "--internal-ips", "--tags", "tpu-vm"])  # fmt: skip
    if not report.add("a queued spot request is accepted", rc == 0, f"{PROBE} in {vm.zone}"):
        return
    try:
        describe = [*queued("describe", vm.zone, project), "--format", "value(state.state)"]
        active = wait_for(shell, describe, lambda rc, out: rc == 0 and out == "ACTIVE", minutes=wait_minutes,
                          every=poll_seconds, answer="ACTIVE")  # fmt: skip
        if not report.add("the queued request became ACTIVE", active, PROBE):
            return
        rc, out = shell.run([*tpu_vm("describe", PROBE, vm.zone, project), "--format", "value(queuedResource)"],
                            answer=f"projects/{project}/locations/{vm.zone}/queuedResources/{PROBE}")  # fmt: skip
        names = rc == 0 and out.endswith(f"/locations/{vm.zone}/queuedResources/{PROBE}")
        report.add("a node made by a queued request names it (Node.queuedResource)", names, out)
        python = "import platform; print(platform.python_version())"
        rc, out = shell.run([*tpu_vm("ssh", PROBE, vm.zone, project), "--tunnel-through-iap", "--command",
                             f"python3 -c '{python}'"], answer="3.10.12")  # fmt: skip
        image = load_catalog().runtime_image(vm.runtime_version)
        known = image.python if image and image.python else "not documented: record it in infra/catalog/tpu.yaml"
        found = rc == 0 and bool(re.fullmatch(r"\d+\.\d+\.\d+", out))
        report.add(f"the Python of {vm.runtime_version}", found, f"{out} (the catalog: {known})")
        rc, out = shell.run(tpu_vm("stop", PROBE, vm.zone, project), answer="")
        report.note("stop on a node made by a queued request", "accepted" if rc == 0 else f"refused: {out}")
    finally:
        rc, _ = shell.run([*queued("delete", vm.zone, project), "--force", "--quiet"])
        report.add("deleting a queued request with --force is accepted", rc == 0, PROBE)
        rc, out = shell.run([*tpu_vm("describe", PROBE, vm.zone, project), "--format", "value(name)"])
        report.add("... and deletes the node it made", rc != 0 or not out, PROBE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--project", required=True, help="a sandbox GCP project (it will hold a TPU for a while)")
    parser.add_argument("--billing-account", required=True, help="the project's billing account id (the budget's)")
    parser.add_argument("--zone", default="us-central1-a", help="zone of the TPU (default: us-central1-a)")
    parser.add_argument("--stack", default="smoke", help="throwaway Pulumi stack name (default: smoke)")
    parser.add_argument("--owner", default="smoke-test")
    parser.add_argument("--email", required=True, help="where the stack's budget and alerts notify")
    parser.add_argument("--budget", type=float, default=200.0, help="monthly budget in USD (default: 200)")
    parser.add_argument("--bucket-location", default="", help="bucket location (default: the zone's region)")
    parser.add_argument("--run-minutes", type=float, default=90, help="how long to wait for the run to complete")
    parser.add_argument("--poll-seconds", type=float, default=60)
    parser.add_argument("--dry-run", action="store_true", help="print the stack file and the commands; run nothing")
    args = parser.parse_args(argv)

    choice = cheapest_tpu(args.zone)
    smoke_args = SmokeArgs(args.project, args.billing_account, args.zone, args.stack, args.owner, args.email,
                           args.budget, args.bucket_location)  # fmt: skip
    text = stack_file_text(smoke_args, choice)
    workdir = Path(tempfile.mkdtemp(prefix="tpu-smoke-"))
    stack_file = workdir / f"Pulumi.{args.stack}.yaml"
    stack_file.write_text(text)
    print(f"# {choice.accelerator.name} spot in {args.zone}: about {choice.usd_per_hour:.2f} USD/hour (catalog prices)")
    print(f"# stack file {stack_file}:\n{text}")
    try:
        cfg = parse_stack_config(args.stack, read_stack_config(args.stack, ROOT, stack_file))
        for warning in plan_offline(args.stack, stack_file):
            print(f"# plan warning: {warning}")
    except ConfigError as error:
        print(f"error: the smoke stack file does not validate:\n{error}", file=sys.stderr)
        return 2
    print("# the stack file validates and plans offline")
    # A throwaway stack: its secrets provider's passphrase lives as long as this process.
    shell = Shell(args.dry_run, {"PULUMI_CONFIG_PASSPHRASE": secrets.token_urlsafe(24)})
    report = smoke(cfg, stack_file, shell, run_minutes=args.run_minutes, poll_seconds=args.poll_seconds)
    if args.dry_run:
        print("\n# dry run: nothing was run; the checks above are what a real run verifies")
        return 0
    print(report.text())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())

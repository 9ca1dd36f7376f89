"""`python -m tools.smoke`: a smoke test on a real sandbox project. It costs money and needs credentials.

It writes a tiny stack file (tools/smoke_stack.yaml filled in: the cheapest single-host TPU the catalog
offers in the zone, spot, one epoch of MNIST, `onCompletion: stop`), checks it with the real config parser
and the offline plan, then:

  0. checks what only a real project shows of the permission model: custom roles accept every computed
     permission (its support level), and a `modifiedGrantsByRole`-limited project IAM admin may change
     the audit config; then does the bootstrap's part for this stack: its service accounts, custom roles
     and act-as grants (`stack_identities`), which the stack names but does not make;
  1. `pulumi stack init` (a throwaway stack, passphrase secrets), the time provider's plugin, `pulumi up`,
     and (domain-restricted sharing may refuse it) Billing's publish grant on the budget's topic;
  2. waits for the completion marker `gs://<status bucket>/<vm>/COMPLETE`;
  3. checks a checkpoint exists under `gs://<checkpoints bucket>/<workload>/<vm>/<run>/`;
  4. checks the completion action: the guard stopped the node (`gcloud compute tpus tpu-vm describe`);
  5. tries on the project the GCP behaviours the platform relies on but cannot prove offline (`probes`):
     Artifact Registry's service identity (generateServiceIdentity), and a spot node made by a queued
     request in the stack's network: that it names its request (Node.queuedResource), the Python of its
     tpu-vm-tf-* image, what a stop does to it, and that deleting the request with `--force` deletes it;
     and on that node, what only a real TPU proves about runs (vm_agent/tpu_probe.py, copied there): the
     device nodes its generation exposes, the framework initialising as a fresh unprivileged uid in the
     agent's jail, again as the next run's uid (libtpu's lockfile, jax-ml/jax#10192), without the metadata
     server (TPU_SKIP_MDS_QUERY and the TPU_* variables), with a low memlock (noted: VFIO needs it), and
     in an image run with the agent's docker flags (no --privileged);
  5b. with the operator's own token, what Cloud Storage does with a run's boundary (the tests model it
     in CEL): the token exchanged for the run's checkpoint folder lists, writes and deletes there and gets
     403 on another run's folder and on the completion marker;
  6. always (a `finally`, whatever failed before): `pulumi destroy`, then checks the spot node is gone
     and the data and status buckets survived (`retain_on_delete`), and `pulumi stack rm`, and removes
     what step 0 made;

and prints what it verified. `--dry-run` prints the stack file and every command in the order the run
would issue them, and runs none (the same code path, with a shell that only prints).

`--engine gke` smoke-tests the GKE engine instead (tools/smoke_gke_stack.yaml: a spot v5e-16 slice and a
reserved tpu7x-16 slice in us-central1), checking what only a real project proves:

  1. `pulumi up`; the TPU7x pool RUNNING with its workload policy, its topology and no placement type;
  2. a second `pulumi preview --expect-no-changes`: nothing GKE reports back (TPU7x's empty placement
     type, the fields GKE sets on TPU nodes) diffs or replaces a pool;
  3. the TPU7x nodes labelled with their accelerator and topology (what queues and jobs select);
  4. the teams (part 2): the stack file again, now with two teams; the admin phase (gke-admin/) up: JobSet
     and Kueue downloaded and installed only as their pinned sha256, each controller available and running
     its pinned image digest; the environment up again: the queues phase through the DNS endpoint, Kueue's
     webhooks admitting its objects, each ClusterQueue active; RBAC as the permission model says it (a member
     creates JobSets in its team's namespace, not in the other's, and no pods); pod security and the priority
     ceiling refusing a privileged pod, a host-network pod and a pod above the team's priority; a JobSet of
     the team (unprivileged, no host network, the team's service account) admitted on the spot slice, its four
     hosts finding each other and seeing 4 chips each, 16 in all, and writing under the team's prefix of the
     checkpoints bucket, refused under the other team's (Workload Identity Federation); GKE's injection of
     TPU_WORKER_ID and TPU_WORKER_HOSTNAMES into each of its pods, read by the run contract as every worker's
     own place and one coordinator; its pods' lines in the team's log view (its own log bucket, filled by the
     sink of its namespace), under the pod label `tpu-runs logs --team` selects a run by; a JobSet without a
     queue label held suspended; a team's folder source (`tpu-runs submit --team --folder`) in a public image
     pinned by digest, each pod's fetch step reading the runner and the folder's archive as the team's account
     through the GKE metadata server and checking both digests, the program running in the folder; the same
     archive under a digest it does not have failing its JobSet at once (the fetch step's 78);
  5. a preempted spot slice: a team's run on it writes its first checkpoint, one node's preemption is
     simulated, then the whole slice is Ready again (the preempted node registered anew) and the run,
     restarted without counting against its restarts, resumes from its checkpoint and finishes; then the
     teams removed (the environment up without them) and the admin phase destroyed (without teams, the
     preemption alone);
  6. always: `pulumi destroy` and `pulumi stack rm`.

Pulumi reads the stack file through `--config-file` (Pulumi CLI: "Use the configuration values in the
specified file rather than detecting the file name"), so no Pulumi.<stack>.yaml lands in the checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from bootstrap.program import PROJECT_IAM_ADMIN, modified_grants_condition
from infra import naming
from infra.access.accounts import SERVICE_ACCOUNT_USER
from infra.catalog import AcceleratorType, load_catalog, version_key
from infra.config import PlatformConfig, parse_stack_config
from infra.config.model import SlicePoolSettings, TeamSettings
from infra.config.problems import ConfigError
from infra.config.stackfile import ROOT, read_stack_config
from infra.gke.controllers import RELEASES
from infra.gke.jobsets import FETCH_CONTAINER, FolderRun, run_jobset, team_jobset
from infra.gke.queues import queue_objects
from infra.gke.specs import shape_of
from infra.gke.validation import platform_validator, validate_all
from infra.packaging import package
from infra.platform import stack_identities
from infra.startup import Artifact
from infra.tpu.metadata import agent_package, run_prefix
from run_contract import paths
from run_contract.names import WorkerPlace, worker_place
from run_contract.spec import FolderSource, RunSpec
from tpu_runs.gke import RUN_POD_LABEL

TEMPLATE = Path(__file__).with_name("smoke_stack.yaml")
GKE_TEMPLATE = Path(__file__).with_name("smoke_gke_stack.yaml")
VM, WORKLOAD, RUN = "smoke-tpu", "mnist", "smoke"
SPOT_POOL, TPU7X_POOL = "spot", "iron"  # the GKE smoke stack's slice pools
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


@contextlib.contextmanager
def throwaway_stack(
    cfg: PlatformConfig, stack_file: Path, shell: Shell, report: Report, *, after_destroy: Callable[[], None]
) -> Iterator[bool]:
    """`pulumi stack init` and `up`, yielding whether `up` succeeded; then, whatever happened in between
    (a failed check, an exception), `pulumi destroy`, `after_destroy` and `pulumi stack rm`."""
    stack, config = ["--stack", cfg.stack], ["--config-file", str(stack_file)]
    rc, _ = shell.run(["pulumi", "stack", "init", cfg.stack, "--secrets-provider", "passphrase"], cwd=ROOT)
    if not report.add("pulumi stack init", rc == 0):
        yield False
        return
    try:
        version = next(
            line.split("==")[1]
            for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.startswith("pulumiverse-time==")
        )
        shell.run(
            [
                "pulumi",
                "plugin",
                "install",
                "resource",
                "time",
                f"v{version}",
                "--server",
                "github://api.github.com/pulumiverse",
            ]
        )
        rc, _ = shell.run(["pulumi", "up", *stack, *config, "--yes", "--skip-preview"], cwd=ROOT)
        yield report.add("pulumi up", rc == 0)
    finally:
        rc, _ = shell.run(["pulumi", "destroy", *stack, *config, "--yes", "--skip-preview"], cwd=ROOT)
        report.add("pulumi destroy", rc == 0)
        after_destroy()
        rc, _ = shell.run(["pulumi", "stack", "rm", cfg.stack, "--yes"], cwd=ROOT)
        report.add("pulumi stack rm", rc == 0)


def computed_permissions() -> set[str]:
    """Every permission the bootstrap puts into a custom role, in every environment (bootstrap/access.json)."""
    access = json.loads((ROOT / "bootstrap" / "access.json").read_text())
    return {
        p
        for entry in access.values()
        for p in [
            *entry["deployerPermissions"],
            *entry["deployerLogPermissions"],
            *entry["previewerPermissions"],
            *(q for role in entry["roles"].values() for q in role["permissions"]),
        ]
    }


def real_project_checks(cfg: PlatformConfig, shell: Shell, report: Report, workdir: Path) -> list[list[str]]:
    """What the offline model cannot prove, each a step; the commands that undo what they made."""
    project = ["--project", cfg.project]
    resource = f"//cloudresourcemanager.googleapis.com/projects/{cfg.project}"
    rc, out = shell.run(
        [
            "gcloud",
            "iam",
            "list-testable-permissions",
            resource,
            "--filter=customRolesSupportLevel=NOT_SUPPORTED",
            "--format=value(name)",
        ]
    )
    refused = sorted(computed_permissions() & set(out.split()))
    report.add(
        "custom roles accept every computed permission (customRolesSupportLevel)",
        rc == 0 and not refused,
        ", ".join(refused),
    )
    # A project IAM admin limited by modifiedGrantsByRole (as each deployer is) changes the audit config.
    limited = f"tpu-smoke-limited-{cfg.stack}"[:30]
    email = f"{limited}@{cfg.project}.iam.gserviceaccount.com"
    original = workdir / "policy-before.json"
    rc, text = shell.run(["gcloud", "projects", "get-iam-policy", cfg.project, "--format=json"], answer="{}")
    before = {k: v for k, v in json.loads(text or "{}").items() if k != "etag"}  # restored as it was
    original.write_text(json.dumps(before))
    undo = [
        ["gcloud", "projects", "set-iam-policy", cfg.project, str(original), "--quiet"],
        ["gcloud", "iam", "service-accounts", "delete", email, *project, "--quiet"],
    ]
    condition = modified_grants_condition(["roles/logging.logWriter"]).replace(",", "\\,")
    _, caller = shell.run(["gcloud", "config", "get-value", "account"], answer="smoke@example.iam.gserviceaccount.com")
    who = f"{'serviceAccount' if caller.endswith('.gserviceaccount.com') else 'user'}:{caller}"
    steps = [
        ["gcloud", "iam", "service-accounts", "create", limited, *project],
        [
            "gcloud",
            "projects",
            "add-iam-policy-binding",
            cfg.project,
            f"--member=serviceAccount:{email}",
            f"--role={PROJECT_IAM_ADMIN}",
            f"--condition=expression={condition},title=smoke-limited",
        ],
        [
            "gcloud",
            "iam",
            "service-accounts",
            "add-iam-policy-binding",
            email,
            f"--member={who}",
            "--role=roles/iam.serviceAccountTokenCreator",
            *project,
        ],
    ]
    ok = all(shell.run(step)[0] == 0 for step in steps)
    rc, text = shell.run(
        ["gcloud", "projects", "get-iam-policy", cfg.project, "--format=json"], answer='{"bindings": []}'
    )
    if ok and rc == 0:
        current = json.loads(text or "{}")
        current.setdefault("auditConfigs", []).append(
            {"service": "tpu.googleapis.com", "auditLogConfigs": [{"logType": "DATA_READ"}]}
        )
        policy = workdir / "policy.json"
        policy.write_text(json.dumps(current))
        rc, _ = shell.run(
            ["gcloud", "projects", "set-iam-policy", cfg.project, str(policy), f"--impersonate-service-account={email}"]
        )
    report.add("a modifiedGrantsByRole-limited IAM admin may change the audit config", ok and rc == 0, email)
    return undo


def make_identities(cfg: PlatformConfig, shell: Shell, report: Report) -> list[list[str]]:
    """The bootstrap's part for this stack (its accounts, custom roles, act-as grants); the undo commands."""
    identities = stack_identities(cfg)
    project = ["--project", cfg.project]
    steps, undo = [], []
    for account in identities.accounts:
        steps.append(
            [
                "gcloud",
                "iam",
                "service-accounts",
                "create",
                account.account_id,
                *project,
                f"--display-name={account.display_name}",
            ]
        )
        undo.append(["gcloud", "iam", "service-accounts", "delete", account.email(cfg.project), *project, "--quiet"])
    ok = all(shell.run(step)[0] == 0 for step in steps)
    # Custom roles stay (a deleted role's id is taken for weeks, so a re-run updates the one left behind).
    for role in identities.roles:
        spec = [role.role_id, *project, f"--title={role.title}", f"--permissions={','.join(role.permissions)}"]
        rc, _ = shell.run(["gcloud", "iam", "roles", "create", *spec, "--stage=GA"])
        ok = ok and (rc == 0 or shell.run(["gcloud", "iam", "roles", "update", *spec])[0] == 0)
    emails = {a.account_id: a.email(cfg.project) for a in identities.accounts}
    for actor, target in identities.acts_as:
        member = f"--member=serviceAccount:{emails[actor]}"
        step = [
            "gcloud",
            "iam",
            "service-accounts",
            "add-iam-policy-binding",
            emails[target],
            member,
            f"--role={SERVICE_ACCOUNT_USER}",
            *project,
        ]
        ok = shell.run(step)[0] == 0 and ok
    report.add(
        "the bootstrap's part: the stack's accounts, custom roles and act-as",
        ok,
        f"{len(identities.accounts)} accounts, {len(identities.roles)} roles",
    )
    return undo


def smoke(
    cfg: PlatformConfig,
    stack_file: Path,
    shell: Shell,
    *,
    run_minutes: float,
    poll_seconds: float,
    action_minutes: float = 15,
) -> Report:
    """Deploy, check, destroy: the steps of the module docstring. Destroy runs whatever happened before."""
    report = Report(shell.dry_run)
    vm = cfg.tpu_vms[0]
    status, checkpoints = cfg.bucket_name("status"), cfg.bucket_name("checkpoints")
    project = ["--project", cfg.project]
    undo = real_project_checks(cfg, shell, report, stack_file.parent)
    undo += make_identities(cfg, shell, report)

    def after_destroy() -> None:
        rc, out = shell.run([*tpu_vm("describe", vm.name, vm.zone, cfg.project), "--format", "value(name)"])
        report.add("a spot node is deleted (destroy deleted the stopped node)", rc != 0 or not out, vm.name)
        for purpose in ("data", "status"):  # retained by destroy in every stack (infra/storage.py, lifecycle.py)
            bucket = f"gs://{cfg.bucket_name(purpose)}"
            rc, _ = shell.run(["gcloud", "storage", "buckets", "describe", bucket, *project, "--format", "value(name)"])
            report.add(f"the {purpose} bucket survived destroy", rc == 0, bucket)
        for command in undo:  # what the checks and the bootstrap's part made
            shell.run(command)

    with throwaway_stack(cfg, stack_file, shell, report, after_destroy=after_destroy) as deployed:
        if not deployed:
            return report
        topic = f"{cfg.stack}-budget-alerts"  # infra/budget.py: Billing granted its agent publish on it
        rc, out = shell.run(
            ["gcloud", "pubsub", "topics", "get-iam-policy", topic, *project, "--format=json"],
            answer='{"bindings": [{"role": "roles/pubsub.publisher"}]}',
        )
        report.add(
            "the budget's topic: Billing's agent may publish (domain-restricted sharing allowed it)",
            rc == 0 and "roles/pubsub.publisher" in out,
            topic,
        )
        marker = f"gs://{status}/{vm.name}/COMPLETE"
        complete = wait_for(
            shell,
            ["gcloud", "storage", "ls", *project, marker],
            lambda rc, out: rc == 0 and bool(out),
            minutes=run_minutes,
            every=poll_seconds,
            answer=marker,
        )
        report.add("the run completed: completion marker written", complete, marker)
        prefix = f"gs://{checkpoints}/{run_prefix(cfg, vm)}/"
        rc, out = shell.run(
            ["gcloud", "storage", "ls", "--recursive", *project, prefix], answer=f"{prefix}ckpt-1.index"
        )
        report.add("a checkpoint was written", rc == 0 and bool(out), prefix)
        boundary_probe(cfg, shell, report, marker)
        describe = [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "describe",
            vm.name,
            "--zone",
            vm.zone,
            *project,
            "--format",
            "value(state)",
        ]
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
    rc, out = shell.run(
        [*identity, "--project", project, "--format", "value(email)"],
        answer="service-123456789012@gcp-sa-artifactregistry.iam.gserviceaccount.com",
    )
    report.add("Artifact Registry's service identity is generated", rc == 0 and bool(AGENT_EMAIL.fullmatch(out)), out)
    network = f"tpu-{cfg.stack}"  # infra/network.py: the stack's network, its subnet per region, the IAP-SSH tag
    rc, _ = shell.run(
        [
            *queued("create", vm.zone, project),
            "--node-id",
            PROBE,
            "--accelerator-type",
            vm.accelerator.name,
            "--runtime-version",
            vm.runtime_version,
            "--spot",
            "--network",
            network,
            "--subnetwork",
            f"{network}-{vm.region}",
            "--internal-ips",
            "--tags",
            "tpu-vm",
        ]
    )
    if not report.add("a queued spot request is accepted", rc == 0, f"{PROBE} in {vm.zone}"):
        return
    try:
        describe = [*queued("describe", vm.zone, project), "--format", "value(state.state)"]
        active = wait_for(
            shell,
            describe,
            lambda rc, out: rc == 0 and out == "ACTIVE",
            minutes=wait_minutes,
            every=poll_seconds,
            answer="ACTIVE",
        )
        if not report.add("the queued request became ACTIVE", active, PROBE):
            return
        rc, out = shell.run(
            [*tpu_vm("describe", PROBE, vm.zone, project), "--format", "value(queuedResource)"],
            answer=f"projects/{project}/locations/{vm.zone}/queuedResources/{PROBE}",
        )
        names = rc == 0 and out.endswith(f"/locations/{vm.zone}/queuedResources/{PROBE}")
        report.add("a node made by a queued request names it (Node.queuedResource)", names, out)
        python = "import platform; print(platform.python_version())"
        rc, out = shell.run(
            [*tpu_vm("ssh", PROBE, vm.zone, project), "--tunnel-through-iap", "--command", f"python3 -c '{python}'"],
            answer="3.10.12",
        )
        image = load_catalog().runtime_image(vm.runtime_version)
        known = image.python if image and image.python else "not documented: record it in infra/catalog/tpu.yaml"
        found = rc == 0 and bool(re.fullmatch(r"\d+\.\d+\.\d+", out))
        report.add(f"the Python of {vm.runtime_version}", found, f"{out} (the catalog: {known})")
        tpu_probe(cfg, shell, report)
        rc, out = shell.run(tpu_vm("stop", PROBE, vm.zone, project), answer="")
        report.note("stop on a node made by a queued request", "accepted" if rc == 0 else f"refused: {out}")
    finally:
        rc, _ = shell.run([*queued("delete", vm.zone, project), "--force", "--quiet"])
        report.add("deleting a queued request with --force is accepted", rc == 0, PROBE)
        rc, out = shell.run([*tpu_vm("describe", PROBE, vm.zone, project), "--format", "value(name)"])
        report.add("... and deletes the node it made", rc != 0 or not out, PROBE)


# What a TPU's framework does to say it found the chips (vm_agent/tpu_probe.py COMMAND), per framework.
FOUND_TPU = {
    "tensorflow": "import sys, tensorflow as tf; sys.exit(0 if tf.config.list_logical_devices('TPU') else 1)",
    "jax": "import sys, jax; sys.exit(0 if jax.device_count() > 0 and jax.devices()[0].platform == 'tpu' else 1)",
}
# Google's public JAX image for TPUs ("Run JAX on a TPU in a container", cloud.google.com/tpu/docs): the image
# run of the probe, with the agent's docker flags.
TPU_IMAGE = "us-docker.pkg.dev/cloud-tpu-images/jax-ai-image/tpu:latest"
PROBE_DIR = "/tmp/tpu-probe"
DRY_PROBE = (
    '{"devices": ["/dev/vfio/0"], "shared": ["/dev/vfio/vfio"], "tpu_env": {"TPU_SKIP_MDS_QUERY": "true"}, '
    '"non_root": {"ok": true, "uid": 61184}, "second_uid": {"ok": true, "uid": 61185}, '
    '"no_metadata_server": {"ok": true, "uid": 61186}, "low_memlock": {"ok": false, "uid": 61187}}'
)


def tpu_probe(cfg: PlatformConfig, shell: Shell, report: Report) -> None:
    """vm_agent/tpu_probe.py on the probe node (the module docstring's step 5): the agent's own code, as root."""
    vm, project = cfg.tpu_vms[0], cfg.project
    ssh = [*tpu_vm("ssh", PROBE, vm.zone, project), "--tunnel-through-iap", "--command"]
    rc, _ = shell.run([*ssh, f"rm -rf {PROBE_DIR} && mkdir -p {PROBE_DIR}"])
    # The agent's package and the run contract's, which it imports.
    scp = [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "scp",
        "--recurse",
        str(ROOT / "vm_agent"),
        str(ROOT / "run_contract"),
        f"{PROBE}:{PROBE_DIR}/",
        "--zone",
        vm.zone,
        "--project",
        project,
        "--tunnel-through-iap",
    ]
    rc, _ = shell.run(scp) if rc == 0 else (rc, "")
    if not report.add("the agent's code is on the probe node", rc == 0, PROBE_DIR):
        return
    workload = cfg.workload(vm.workload)
    runtime = load_catalog().runtime_environment(vm.runtime_version, PROBE)
    found = ["env", *(f"{k}={v}" for k, v in runtime), "python3", "-c", FOUND_TPU[workload.framework]]
    rc, out = shell.run(
        [*ssh, f"cd {PROBE_DIR} && sudo python3 -m vm_agent.tpu_probe -- {shlex.join(found)}"], answer=DRY_PROBE
    )
    seen = _json_line(out)
    kinds = "/dev/accel* or /dev/vfio/N"
    report.add(
        f"{vm.accelerator.name} exposes its chips as {kinds}", bool(seen.get("devices")), str(seen.get("devices"))
    )
    checks = (
        ("non_root", "the framework finds the TPU as a fresh unprivileged uid in the agent's jail"),
        ("second_uid", "... and as the next run's uid, after the first (libtpu's lockfile in its private /tmp)"),
        ("no_metadata_server", "... with the metadata server out of reach (TPU_SKIP_MDS_QUERY, TPU_* as GKE sets)"),
    )
    for key, name in checks:
        report.add(
            name, rc == 0 and bool((seen.get(key) or {}).get("ok")), str((seen.get(key) or {}).get("tail", ""))[-200:]
        )
    low = seen.get("low_memlock") or {}
    report.note(
        "the framework with a 64 KiB memlock limit", "initialises" if low.get("ok") else "fails (memlock needed)"
    )
    image = [
        *ssh,
        f"cd {PROBE_DIR} && sudo python3 -m vm_agent.tpu_probe --image {TPU_IMAGE} -- "
        f"{shlex.join(['python3', '-c', FOUND_TPU['jax']])}",
    ]
    rc, out = shell.run(image, answer='{"image": {"ok": true, "uid": 61188}}')
    ran = _json_line(out).get("image") or {}
    name = "an image run with the agent's docker flags finds the TPU (no --privileged)"
    report.add(name, rc == 0 and bool(ran.get("ok")), str(ran.get("tail", ""))[-200:])


def boundary_probe(cfg: PlatformConfig, shell: Shell, report: Report, marker: str) -> None:
    """The module docstring's step 5b: the real STS and Cloud Storage answering a run's boundary."""
    vm = cfg.tpu_vms[0]
    checkpoints = cfg.bucket_name("checkpoints")
    inside = f"gs://{checkpoints}/{run_prefix(cfg, vm)}/"
    outside = f"gs://{checkpoints}/{run_prefix(cfg, vm).rsplit('/', 1)[0]}/another-run/"
    # google-auth does the exchange (vm_agent/credentials.py): this environment has it, a bare python3 need not.
    probe = shlex.join([sys.executable, "-m", "vm_agent.tpu_probe", "boundary", inside, outside, marker])
    names = ("list_inside", "write_inside", "delete_inside", "list_outside", "write_outside", "read_marker")
    answer = json.dumps({n: {"ok": True, "status": 403 if "outside" in n or "marker" in n else 200} for n in names})
    rc, out = shell.run(["bash", "-c", f"gcloud auth print-access-token | {probe}"], cwd=ROOT, answer=answer)
    seen = _json_line(out)
    for name in names:
        got = seen.get(name) or {}
        report.add(
            f"a run's downscoped token: {name.replace('_', ' ')}",
            rc == 0 and bool(got.get("ok")),
            f"HTTP {got.get('status')}",
        )


def _json_line(out: str) -> dict:
    """The last line of `out` that is a JSON object ({} when none is)."""
    for line in reversed(out.splitlines()):
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                return found
    return {}


# The GKE smoke stack's teams (part 2): the operator's team on the spot slice, another on the TPU7x slice.
SMOKE_TEAMS = """    teams:
      - name: smoke-a
        members: [user:${email}]
        nominalChips: {${spot_pool}: 16}
        priority: high
      - name: smoke-b
        members: [user:nobody@example.com]
        nominalChips: {${tpu7x_pool}: 8}
"""


def gke_stack_file_text(args: SmokeArgs, tpu7x_reservation: str, teams: bool = False) -> str:
    """The GKE smoke stack; with `teams`, the same and two teams (a fresh environment comes up without
    teams: their queues need the Kueue the admin phase installs afterwards)."""
    return Template(GKE_TEMPLATE.read_text() + (SMOKE_TEAMS if teams else "")).substitute(
        project=args.project,
        owner=args.owner,
        billing_account=args.billing_account,
        budget=f"{args.budget:g}",
        email=args.email,
        spot_pool=SPOT_POOL,
        tpu7x_pool=TPU7X_POOL,
        tpu7x_reservation=tpu7x_reservation,
    )


SMOKE_PROGRAM = """
import json
import os

import jax
from google.api_core.exceptions import Forbidden
from google.cloud import storage

print("place", json.dumps({{name: os.environ.get(name, "") for name in ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES")}}))
counts = (jax.local_device_count(), jax.device_count())
assert counts == ({local}, {total}), counts
bucket = storage.Client().bucket("{bucket}")
host = jax.process_index()
bucket.blob(f"{own}smoke/{{host}}").upload_from_string("ok")
try:
    bucket.blob(f"{other}smoke/{{host}}").upload_from_string("not ours")
except Forbidden:
    print("chips", counts, "wrote its own prefix, refused another team's")
else:
    raise SystemExit("wrote into another team's prefix")
"""


def smoke_jobset(
    team: TeamSettings, pool: SlicePoolSettings, name: str, checkpoints: str, other: TeamSettings, queued: bool = True
) -> dict[str, object]:
    """A team's JobSet on one slice of `pool` (infra/gke/jobsets.py) whose program asks JAX for its chips
    (every host sees its own and the slice's: GKE injects TPU_WORKER_* into Indexed Jobs asking for
    google.com/tpu), without privilege or host network; then, as the team's Kubernetes service account
    (Workload Identity Federation, no Google account), writes under its own prefix of the checkpoints
    bucket and is refused under another team's."""
    shape = shape_of(pool)
    program = SMOKE_PROGRAM.format(
        local=shape.chips_per_vm,
        total=shape.chips_per_slice,
        bucket=checkpoints,
        own=naming.team_prefix(team.name),
        other=naming.team_prefix(other.name),
    )
    return _python_jobset(team, pool, name, program, queued)


# A run on the spot slice that checkpoints each step under its team's prefix (one object per worker) and
# resumes from it: what a preempted slice must give back to the run, not only its nodes.
RESUME_PROGRAM = """
import os
import time

from google.cloud import storage

blob = storage.Client().bucket("{bucket}").blob("{own}smoke-resume/step-" + os.environ.get("TPU_WORKER_ID", "0"))
step = int(blob.download_as_text()) if blob.exists() else 0
if step:
    print("resumed from step", step, flush=True)
while step < {steps}:
    time.sleep({seconds})
    step += 1
    blob.upload_from_string(str(step))
print("finished at step", step, flush=True)
"""
RESUME_STEPS, RESUME_STEP_SECONDS = 60, 10  # ten minutes: the preemption lands while it runs
# JobSet labels each of its pods with its name (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go
# JobSetNameKey).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def _python_jobset(team: TeamSettings, pool: SlicePoolSettings, name: str, program: str, queued: bool = True):
    """A team's JobSet on one slice of `pool` running `program` in a public Python image (its pip installs first)."""
    # bash -c SCRIPT ARG0: the program arrives as $0, with no shell quoting in between.
    command = ["bash", "-c", 'pip install --quiet "jax[tpu]" google-cloud-storage && exec python -c "$0"', program]
    return team_jobset(team, shape_of(pool), name, image="python:3.11-slim", command=command, queued=queued)


def resume_jobset(team: TeamSettings, pool: SlicePoolSettings, checkpoints: str) -> dict[str, object]:
    """The team's run that a preempted spot slice must resume from its checkpoint."""
    program = RESUME_PROGRAM.format(
        bucket=checkpoints, own=naming.team_prefix(team.name), steps=RESUME_STEPS, seconds=RESUME_STEP_SECONDS
    )
    return _python_jobset(team, pool, "smoke-resume", program)


def injected_places(logs: str) -> list[WorkerPlace]:
    """Each worker's place in its slice as the run contract reads it from what GKE injected into its pod (the
    smoke program's `place` lines). ValueError when a pod's variables make no place."""
    return sorted(
        worker_place(json.loads(line.removeprefix("place ")))
        for line in logs.splitlines()
        if line.startswith("place {")
    )


def _dry_run_logs(vms: int, name: str) -> str:
    """What a dry run answers for the pods' `place` lines: GKE's variables for each of a slice's `vms` pods."""
    hosts = ",".join(f"{name}-slice-0-{i}.{name}" for i in range(vms))
    return "\n".join(
        "place " + json.dumps({"TPU_WORKER_ID": str(i), "TPU_WORKER_HOSTNAMES": hosts}) for i in range(vms)
    )


def _refused_pod(shell: Shell, namespace: str, name: str, spec: Mapping[str, object]) -> bool:
    """Whether admission refuses a pod (a server-side dry run: nothing is created)."""
    pod_spec = {"containers": [{"name": name, "image": "busybox"}], **spec}
    overrides = json.dumps({"apiVersion": "v1", "spec": pod_spec})
    rc, _ = shell.run(
        [
            "kubectl",
            "run",
            name,
            "-n",
            namespace,
            "--image=busybox",
            "--restart=Never",
            "--dry-run=server",
            "--overrides",
            overrides,
        ],
        answer="refused",
    )
    return shell.dry_run or rc != 0


def smoke_gke_teams(
    cfg: PlatformConfig,
    teams_file: Path,
    plain_file: Path,
    shell: Shell,
    report: Report,
    *,
    run_minutes: float,
    preempt: Callable[[], bool],
    poll_seconds: float = 30,
) -> None:
    """Part 2 on a running cluster: the admin phase, the queues phase, and what the teams can and cannot do;
    then a team's run on the spot slice while `preempt` preempts a node of it. Leaves the environment as it
    found it: the teams removed (`plain_file`), the admin phase destroyed."""
    gke = cfg.gke
    assert gke is not None and len(gke.teams) == 2, "the GKE smoke stack's teams file declares two teams"
    a, b = gke.teams
    pools = {p.name: p for p in gke.slice_pools}
    admin_dir, config = ROOT / "gke-admin", ["--config-file", str(teams_file)]
    env_up = ["pulumi", "up", "--stack", cfg.stack, "--yes", "--skip-preview"]
    rc, _ = shell.run(["pulumi", "stack", "init", cfg.stack, "--secrets-provider", "passphrase"], cwd=admin_dir)
    if not report.add("pulumi stack init (the admin phase, gke-admin/)", rc == 0):
        return
    try:
        rc, _ = shell.run(["pulumi", "up", "--stack", cfg.stack, *config, "--yes", "--skip-preview"], cwd=admin_dir)
        if not report.add("the admin phase: JobSet and Kueue downloaded and installed as their pinned sha256", rc == 0):
            return
        for release in RELEASES:
            rc, _ = shell.run(
                [
                    "kubectl",
                    "wait",
                    f"deployment/{release.name}-controller-manager",
                    "-n",
                    release.namespace,
                    "--for=condition=Available",
                    "--timeout=10m",
                ]
            )
            report.add(f"{release.name} {release.version} is available", rc == 0)
            rc, out = shell.run(
                [
                    "kubectl",
                    "get",
                    "pods",
                    "-n",
                    release.namespace,
                    "-o",
                    "jsonpath={.items[*].status.containerStatuses[*].imageID}",
                ],
                answer=release.pinned_image,
            )
            report.add(f"{release.name} runs the pinned image digest", rc == 0 and release.digest in out, out)
        rc, _ = shell.run([*env_up, *config], cwd=ROOT)
        if not report.add("the queues phase: the teams' queues through the DNS endpoint, admitted by Kueue", rc == 0):
            return
        for team in (a, b):
            active = 'jsonpath={.status.conditions[?(@.type=="Active")].status}'
            rc, out = shell.run(["kubectl", "get", "clusterqueue", team.name, "-o", active], answer="True")
            report.add(f"ClusterQueue {team.name} is active (its flavors found)", rc == 0 and out == "True")
        member = ["--as", a.members[0].partition(":")[2]]
        can = ["kubectl", "auth", "can-i"]
        rc, out = shell.run([*can, "create", "jobsets.jobset.x-k8s.io", "-n", a.namespace, *member], answer="yes")
        report.add("a member creates JobSets in its team's namespace", out == "yes", a.namespace)
        rc, out = shell.run([*can, "create", "jobsets.jobset.x-k8s.io", "-n", b.namespace, *member], answer="no")
        report.add("... and not in another team's", out == "no", b.namespace)
        rc, out = shell.run([*can, "create", "pods", "-n", a.namespace, *member], answer="no")
        report.add("... and makes no pods of its own (only JobSets, which Kueue admits)", out == "no")
        privileged = {
            "containers": [{"name": "smoke-privileged", "image": "busybox", "securityContext": {"privileged": True}}]
        }
        report.add(
            "pod security refuses a privileged pod in a team namespace",
            _refused_pod(shell, a.namespace, "smoke-privileged", privileged),
        )
        report.add(
            "pod security refuses a host-network pod in a team namespace",
            _refused_pod(shell, a.namespace, "smoke-host-network", {"hostNetwork": True}),
        )
        report.add(
            f"the priority ceiling refuses a very-high pod of team {b.name} ({b.priority} at most)",
            _refused_pod(shell, b.namespace, "smoke-above", {"priorityClassName": "very-high"}),
        )
        checkpoints = cfg.bucket_name("checkpoints")
        jobsets = {
            name: smoke_jobset(a, pools[SPOT_POOL], name, checkpoints, b, queued)
            for name, queued in (("smoke-jax", True), ("smoke-unqueued", False))
        }
        shapes = {p.name: shape_of(p) for p in gke.slice_pools}
        checked = [*queue_objects(gke.teams, shapes), jobsets["smoke-jax"]]
        offline = validate_all(platform_validator(), checked, list(shapes.values()))
        report.add(
            "the team's JobSet passes the offline checks its queue and the schemas make",
            offline.ok,
            "; ".join(str(f) for f in offline.findings),
        )
        applied = {}
        for name, jobset in jobsets.items():  # the JobSet checked offline is the one applied
            path = teams_file.with_name(f"{name}.json")
            path.write_text(json.dumps(jobset, indent=2))
            rc, _ = shell.run(["kubectl", "apply", "--server-side", "-f", str(path)])
            applied[name] = rc == 0
        rc, _ = shell.run(
            [
                "kubectl",
                "wait",
                "jobset/smoke-jax",
                "-n",
                a.namespace,
                "--for=condition=Completed",
                f"--timeout={max(int(run_minutes), 1)}m",
            ]
        )
        report.add(
            "an unprivileged multi-host JobSet without host network sees 4 chips a host, 16 in all, and as "
            "its team's Kubernetes account writes its team's prefix, not another's",
            applied["smoke-jax"] and rc == 0,
            f"{a.namespace}/smoke-jax",
        )
        vms = shape_of(pools[SPOT_POOL]).vms_per_slice
        logs = ["kubectl", "logs", "-n", a.namespace, "-l", f"{JOBSET_NAME_LABEL}=smoke-jax", "--tail=-1"]
        rc, out = shell.run(logs, answer=_dry_run_logs(vms, "smoke-jax"))
        try:
            places = injected_places(out)
            seen = "; ".join(f"worker {p.worker_id} of {p.worker_count}, coordinator {p.coordinator}" for p in places)
        except ValueError as error:
            places, seen = [], str(error)
        report.add(
            "GKE injects TPU_WORKER_ID and TPU_WORKER_HOSTNAMES into each pod of a multi-host slice, from which "
            "the run contract gives every worker its own place and one coordinator (run_contract.names.worker_place)",
            rc == 0
            and [p.worker_id for p in places] == list(range(vms))
            and {(p.worker_count, p.coordinator) for p in places} == {(vms, places[0].coordinator)},
            seen or "no pod printed its place",
        )
        smoke_team_log_view(cfg, a, vms, shell, report, poll_seconds)
        smoke_folder_run(cfg, a, pools[SPOT_POOL], teams_file, shell, report, run_minutes)
        smoke_preempted_run(cfg, a, pools[SPOT_POOL], teams_file, shell, report, run_minutes, preempt)
        rc, out = shell.run(
            ["kubectl", "get", "jobset", "smoke-unqueued", "-n", a.namespace, "-o", "jsonpath={.spec.suspend}"],
            answer="true",
        )
        report.add("a JobSet without a queue label is held suspended", applied["smoke-unqueued"] and out == "true")
        shell.run(["kubectl", "delete", "jobset", "smoke-jax", "smoke-unqueued", "-n", a.namespace, "--wait"])
    finally:
        rc, _ = shell.run([*env_up, "--config-file", str(plain_file)], cwd=ROOT)  # the queues go before Kueue's CRDs
        report.add("the environment without its teams: the queues deleted", rc == 0)
        rc, _ = shell.run(
            ["pulumi", "destroy", "--stack", cfg.stack, *config, "--yes", "--skip-preview"], cwd=admin_dir
        )
        report.add("pulumi destroy (the admin phase)", rc == 0)
        rc, _ = shell.run(["pulumi", "stack", "rm", cfg.stack, "--yes"], cwd=admin_dir)
        report.add("pulumi stack rm (the admin phase)", rc == 0)


def smoke_team_log_view(
    cfg: PlatformConfig, team: TeamSettings, vms: int, shell: Shell, report: Report, poll_seconds: float
) -> None:
    """What `tpu-runs logs --team` relies on and only Cloud Logging shows: the team's sink routes its namespace's
    container lines into its log bucket, they show in its log view, and they carry JobSet's pod label the command
    selects a run by, as `k8s-pod/jobset_sigs_k8s_io/jobset-name` (infra/gke/team_access.py, tpu_runs/gke.py).
    Routing takes a moment: read again, ten times `poll_seconds` apart."""
    read = [
        "gcloud",
        "logging",
        "read",
        f'labels."{RUN_POD_LABEL}"="smoke-jax"',
        "--project",
        cfg.project,
        "--bucket",
        naming.team_log_bucket(cfg.stack, team.name),
        "--location",
        naming.TEAM_LOG_LOCATION,
        "--view",
        naming.TEAM_LOG_VIEW,
        "--freshness",
        "1d",
        "--format",
        "value(textPayload)",
    ]
    workers: list[int] = []
    for _attempt in range(10):
        rc, out = shell.run(read, answer=_dry_run_logs(vms, "smoke-jax"))
        try:
            workers = sorted(p.worker_id for p in injected_places(out)) if rc == 0 else []
        except ValueError:
            workers = []
        if workers == list(range(vms)) or shell.dry_run:
            break
        time.sleep(poll_seconds)
    report.add(
        f"the run's lines reach team {team.name}'s log bucket through its sink and show in its log view, selected "
        "by the pod label tpu-runs logs --team reads (every host's)",
        workers == list(range(vms)),
        f"workers seen: {workers}",
    )


# The folder step's image: Google's Cloud SDK image, pinned to the digest its `slim` tag names when the smoke test
# runs, as a stack pins gke.folderImage. It holds what the fetch step needs (infra/startup.py render_pod_fetch):
# GoogleCloudPlatform/cloud-sdk-docker debian_slim/Dockerfile (commit 91b7ffa786a5) is `FROM debian:trixie-slim`
# and installs curl and python3-dev (so python3, Debian 13's 3.13, over the runner's floor), and checks
# `python3 --version` as it builds; bash, coreutils (sha256sum), tar and gzip are Debian's Essential packages,
# in every debian:*-slim. Debian 13's curl is 8.14, past the 7.71 that --retry-all-errors needs.
FOLDER_IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli"
FOLDER_PROGRAM = (
    'import os\nprint("folder run on worker", os.environ["TPU_WORKER_ID"], "in", os.getcwd(), flush=True)\n'
)


def smoke_folder_run(
    cfg: PlatformConfig,
    team: TeamSettings,
    pool: SlicePoolSettings,
    teams_file: Path,
    shell: Shell,
    report: Report,
    run_minutes: float,
) -> None:
    """A team's folder source on the spot slice (`tpu-runs submit --team --folder`): what only a cluster proves is
    that each pod's fetch step reads the runner and the folder's archive as the team's Kubernetes account through
    the GKE metadata server (Workload Identity Federation), in the pinned public image, before the program runs in
    the folder; and that a JobSet naming another digest for the same archive fails at once (the fetch step's 78,
    podFailurePolicy), never restarted."""
    _, digest = shell.run(
        [
            "gcloud",
            "container",
            "images",
            "describe",
            f"{FOLDER_IMAGE}:slim",
            "--format",
            "value(image_summary.digest)",
        ],
        answer="sha256:" + "0" * 64,
    )
    image = f"{FOLDER_IMAGE}@{digest}"
    stack_file = teams_file.with_name(f"Pulumi.{cfg.stack}.folder.yaml")
    stack_file.write_text(teams_file.read_text() + f"    folderImage: {image}\n")
    folder = teams_file.with_name("smoke-folder")
    folder.mkdir(exist_ok=True)
    (folder / "main.py").write_text(FOLDER_PROGRAM)
    submit = [sys.executable, "-m", "tpu_runs", "submit", "--stack", cfg.stack, "--stack-file", str(stack_file)]
    submit += ["--team", team.name, "--pool", pool.name, "--folder", str(folder), "--run-id", "smoke-folder"]
    rc, _ = shell.run([*submit, "--", "python3", "main.py"], cwd=ROOT)
    if not report.add(f"tpu-runs submit --team {team.name} --folder: uploaded under its sources, applied", rc == 0):
        return
    wait = ["kubectl", "wait", "-n", team.namespace, f"--timeout={max(int(run_minutes), 1)}m"]
    rc, _ = shell.run([*wait, "jobset/smoke-folder", "--for=condition=Completed"])
    label = f"{JOBSET_NAME_LABEL}=smoke-folder"
    vms = shape_of(pool).vms_per_slice
    _, fetched = shell.run(
        ["kubectl", "logs", "-n", team.namespace, "-l", label, "-c", FETCH_CONTAINER, "--tail=-1"],
        answer="tpu-platform: ... checked and unpacked into /tpu-platform/source\n" * vms,
    )
    _, ran = shell.run(
        ["kubectl", "logs", "-n", team.namespace, "-l", label, "-c", "main", "--tail=-1"],
        answer="".join(f"folder run on worker {w} in /tpu-platform/source\n" for w in range(vms)),
    )
    report.add(
        "each pod's fetch step reads the runner and the folder as the team's Kubernetes account, checks both "
        "digests in the pinned public image, and the program runs in the folder",
        rc == 0
        and fetched.count("checked and unpacked") == vms
        and sorted(re.findall(r"folder run on worker (\d+) in /tpu-platform/source", ran))
        == [str(w) for w in range(vms)],
        image,
    )
    # The same archive under a digest it does not have: the fetch step refuses it and the JobSet fails at once.
    sha256 = package(folder).sha256
    artifacts = cfg.bucket_name(naming.ARTIFACTS)
    name = paths.source_object(sha256, naming.team_sources_prefix(team.name))
    source = FolderSource(f"gs://{artifacts}/{name}", "0" * 64)
    runner = agent_package()
    spec = RunSpec(run_id="smoke-tampered", source=source, command=("python3", "main.py"), requester=team.members[0])
    tampered = run_jobset(
        spec,
        team,
        shape_of(pool),
        checkpoints=cfg.bucket_name("checkpoints"),
        models=cfg.bucket_name("models"),
        folder=FolderRun(image, Artifact(artifacts, runner.object_name, runner.sha256)),
    )
    path = teams_file.with_name("smoke-tampered.json")
    path.write_text(json.dumps(tampered, indent=2))
    rc, _ = shell.run(["kubectl", "apply", "--server-side", "-f", str(path)])
    rc2, _ = shell.run([*wait, "jobset/smoke-tampered", "--for=condition=Failed"])
    _, restarts = shell.run(
        ["kubectl", "get", "jobset", "smoke-tampered", "-n", team.namespace, "-o", "jsonpath={.status.restarts}"],
        answer="0",
    )
    report.add(
        "a folder's archive that does not match the digest its JobSet names fails the run at once (the fetch "
        "step's exit 78), never restarted",
        rc == 0 and rc2 == 0 and restarts.strip() in ("", "0"),
        f"restarts: {restarts!r}",
    )
    shell.run(["kubectl", "delete", "jobset", "smoke-folder", "smoke-tampered", "-n", team.namespace, "--wait"])


def smoke_preempted_run(
    cfg: PlatformConfig,
    team: TeamSettings,
    pool: SlicePoolSettings,
    teams_file: Path,
    shell: Shell,
    report: Report,
    run_minutes: float,
    preempt: Callable[[], bool],
) -> None:
    """A team's run on the spot slice, preempted after its first checkpoint: the node lost restarts the JobSet
    without counting against its restarts (infra/gke/jobsets.py), and the run resumes from its checkpoint."""
    path = teams_file.with_name("smoke-resume.json")
    path.write_text(json.dumps(resume_jobset(team, pool, cfg.bucket_name("checkpoints")), indent=2))
    rc, _ = shell.run(["kubectl", "apply", "--server-side", "-f", str(path)])
    if not report.add("a team's run on the spot slice, checkpointing under its team's prefix", rc == 0):
        return
    first = f"gs://{cfg.bucket_name('checkpoints')}/{naming.team_prefix(team.name)}smoke-resume/step-0"
    checkpointed = wait_for(
        shell,
        ["gcloud", "storage", "cat", first, "--project", cfg.project],
        lambda rc, out: rc == 0 and out.strip().isdigit(),
        minutes=max(run_minutes, 1),
        every=RESUME_STEP_SECONDS,
        answer="1",
    )
    report.add("... its first checkpoint written", checkpointed, first)
    report.add("a preempted spot slice comes back whole", checkpointed and preempt())
    wait = ["kubectl", "wait", "jobset/smoke-resume", "-n", team.namespace, "--for=condition=Completed"]
    rc, _ = shell.run([*wait, f"--timeout={max(int(run_minutes), 1)}m"])
    restarts = "jsonpath={.status.restarts} {.status.restartsCountTowardsMax}"
    _, counted = shell.run(
        ["kubectl", "get", "jobset", "smoke-resume", "-n", team.namespace, "-o", restarts], answer="1 "
    )
    logs = ["kubectl", "logs", "-n", team.namespace, "-l", f"{JOBSET_NAME_LABEL}=smoke-resume", "--tail=-1"]
    _, out = shell.run(logs, answer=f"resumed from step 3\nfinished at step {RESUME_STEPS}")
    times = counted.split()
    report.add(
        "the preempted run restarted on the slice without counting against its restarts, resumed from its "
        "checkpoint and finished",
        rc == 0
        and bool(times)
        and times[0] not in ("", "0")
        and times[1:] in ([], ["0"])
        and "resumed from step" in out
        and f"finished at step {RESUME_STEPS}" in out,
        f"restarts, counted: {counted!r}",
    )
    shell.run(["kubectl", "delete", "jobset", "smoke-resume", "-n", team.namespace, "--wait"])


def smoke_gke(
    cfg: PlatformConfig,
    stack_file: Path,
    shell: Shell,
    *,
    ready_minutes: float,
    poll_seconds: float,
    teams_file: Path | None = None,
    run_minutes: float = 45,
) -> Report:
    """Deploy the GKE stack, check its slices as only GKE can show them, destroy it whatever happened."""
    report = Report(shell.dry_run)
    gke = cfg.gke
    assert gke is not None, "the GKE smoke stack declares the gke section"
    pools = {p.name: p for p in gke.slice_pools}
    iron, spot = pools[TPU7X_POOL], pools[SPOT_POOL]
    cluster, region = naming.gke_cluster(cfg.stack), gke.region
    stack, config = ["--stack", cfg.stack], ["--config-file", str(stack_file)]
    project, location = ["--project", cfg.project], ["--cluster", cluster, "--location", region]
    teams_cfg = parse_stack_config(cfg.stack, read_stack_config(cfg.stack, ROOT, teams_file)) if teams_file else None
    # The nodes' account (and, with the teams, their members' role), as the bootstrap makes them.
    undo = make_identities(teams_cfg or cfg, shell, report)

    def after_destroy() -> None:
        for command in undo:
            shell.run(command)

    with throwaway_stack(cfg, stack_file, shell, report, after_destroy=after_destroy) as deployed:
        if not deployed:
            return report
        # TPU7x: placed by the named HIGH_THROUGHPUT policy; GKE keeps its topology and no type.
        placed = "\t".join(("RUNNING", naming.workload_policy(cfg.stack, iron.name), iron.accelerator.topology, ""))
        rc, out = shell.run(
            [
                "gcloud",
                "container",
                "node-pools",
                "describe",
                naming.slice_node_pool(iron.name, 0),
                *location,
                *project,
                "--format",
                "value(status,placementPolicy.policyName,placementPolicy.tpuTopology,placementPolicy.type)",
            ],
            answer=placed,
        )
        report.add(
            "the TPU7x pool runs, placed by its workload policy with its topology and no type",
            rc == 0 and out == placed,
            naming.slice_node_pool(iron.name, 0),
        )
        rc, _ = shell.run(["pulumi", "preview", *stack, *config, "--expect-no-changes", "--refresh"], cwd=ROOT)
        report.add("a second preview changes nothing (no pool replaced by what GKE reports back)", rc == 0)
        rc, _ = shell.run(
            [
                "gcloud",
                "container",
                "clusters",
                "get-credentials",
                cluster,
                "--location",
                region,
                *project,
                "--dns-endpoint",
            ]
        )
        if not report.add("kubectl credentials through the DNS endpoint", rc == 0):
            return report
        shape = shape_of(iron)
        selector = ",".join(f"{k}={v}" for k, v in shape.node_labels.items())
        rc, out = shell.run(
            ["kubectl", "get", "nodes", "-l", selector, "-o", "name"],
            answer="\n".join(f"node/iron-{i}" for i in range(shape.vms_per_slice)),
        )
        report.add(
            "the TPU7x nodes carry the accelerator and topology labels queues select",
            rc == 0 and len(out.split()) == shape.vms_per_slice,
            selector,
        )

        def preempt() -> bool:
            node_pool = naming.slice_node_pool(spot.name, 0)
            return _preempt_a_spot_slice(shell, node_pool, spot, project, ready_minutes, poll_seconds)

        if teams_file is not None and teams_cfg is not None:  # the preemption lands on a team's run
            smoke_gke_teams(
                teams_cfg,
                teams_file,
                stack_file,
                shell,
                report,
                run_minutes=run_minutes,
                preempt=preempt,
                poll_seconds=poll_seconds,
            )
        else:
            report.add("a preempted spot slice comes back whole", preempt(), naming.slice_node_pool(spot.name, 0))
    return report


def _preempt_a_spot_slice(
    shell: Shell, node_pool: str, pool: SlicePoolSettings, project: list[str], minutes: float, every: float
) -> bool:
    """Simulate one node's preemption (Compute Engine: a Spot VM's maintenance event preempts it), then wait
    for GKE to bring the whole slice back: every node Ready, the preempted one registered anew."""
    vms = pool.accelerator.vms_per_slice
    pool_nodes = ["kubectl", "get", "nodes", "-l", f"cloud.google.com/gke-nodepool={node_pool}"]
    rc, node = shell.run([*pool_nodes, "-o", "jsonpath={.items[0].metadata.name}"], answer=f"gke-{node_pool}-0")
    if rc or not node:
        return False
    created = ["kubectl", "get", "node", node, "-o", "jsonpath={.metadata.creationTimestamp}"]
    rc, before = shell.run(created, answer="2026-01-01T00:00:00Z")
    if rc:
        return False
    rc, _ = shell.run(
        ["gcloud", "compute", "instances", "simulate-maintenance-event", node, "--zone", pool.zone, *project]
    )
    if rc:
        return False
    ready = [*pool_nodes, "-o", 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status} {end}']
    back = wait_for(
        shell,
        ready,
        lambda rc, out: rc == 0 and out.split() == ["True"] * vms,
        minutes=minutes,
        every=every,
        answer=" ".join(["True"] * vms),
    )
    rc, after = shell.run(created, answer="2026-01-01T00:10:00Z")
    return back and rc == 0 and bool(after) and after != before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.smoke", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--project", required=True, help="a sandbox GCP project (it will hold a TPU for a while)")
    parser.add_argument("--billing-account", required=True, help="the project's billing account id (the budget's)")
    parser.add_argument("--zone", default="us-central1-a", help="zone of the TPU (default: us-central1-a)")
    parser.add_argument("--stack", default="smoke", help="throwaway Pulumi stack name (default: smoke)")
    parser.add_argument("--owner", default="smoke-test")
    parser.add_argument("--email", required=True, help="where the stack's budget and alerts notify")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="monthly budget in USD (default: 200; 10000 with --engine gke, two slices for a month)",
    )
    parser.add_argument("--engine", choices=("vm", "gke"), default="vm", help="what to smoke-test (default: vm)")
    parser.add_argument(
        "--tpu7x-reservation",
        default="",
        help="with --engine gke: the reservation in us-central1-c the tpu7x-16 slice consumes",
    )
    parser.add_argument("--ready-minutes", type=float, default=45, help="with --engine gke: wait for a slice")
    parser.add_argument("--bucket-location", default="", help="bucket location (default: the zone's region)")
    parser.add_argument("--run-minutes", type=float, default=90, help="how long to wait for the run to complete")
    parser.add_argument("--poll-seconds", type=float, default=60)
    parser.add_argument("--dry-run", action="store_true", help="print the stack file and the commands; run nothing")
    args = parser.parse_args(argv)
    gke = args.engine == "gke"
    if gke and not args.tpu7x_reservation:
        parser.error("--engine gke needs --tpu7x-reservation: TPU7x capacity comes from a reservation")
    budget = args.budget if args.budget is not None else 10_000.0 if gke else 200.0
    smoke_args = SmokeArgs(
        args.project, args.billing_account, args.zone, args.stack, args.owner, args.email, budget, args.bucket_location
    )
    teams_text = ""
    if gke:
        text = gke_stack_file_text(smoke_args, args.tpu7x_reservation)
        teams_text = gke_stack_file_text(smoke_args, args.tpu7x_reservation, teams=True)
    else:
        choice = cheapest_tpu(args.zone)
        text = stack_file_text(smoke_args, choice)
        print(
            f"# {choice.accelerator.name} spot in {args.zone}: about {choice.usd_per_hour:.2f} USD/hour "
            "(catalog prices)"
        )
    workdir = Path(tempfile.mkdtemp(prefix="tpu-smoke-"))
    stack_file = workdir / f"Pulumi.{args.stack}.yaml"
    stack_file.write_text(text)
    print(f"# stack file {stack_file}:\n{text}")
    teams_file = workdir / f"Pulumi.{args.stack}.teams.yaml"
    if teams_text:
        teams_file.write_text(teams_text)
        print(f"# with the teams, {teams_file}:\n{teams_text}")
    try:
        cfg = parse_stack_config(args.stack, read_stack_config(args.stack, ROOT, stack_file))
        for warning in plan_offline(args.stack, stack_file):
            print(f"# plan warning: {warning}")
        if teams_text:
            for warning in plan_offline(args.stack, teams_file):
                print(f"# plan warning (with the teams): {warning}")
    except ConfigError as error:
        print(f"error: the smoke stack file does not validate:\n{error}", file=sys.stderr)
        return 2
    print("# the stack file validates and plans offline")
    # A throwaway stack: its secrets provider's passphrase lives as long as this process.
    shell = Shell(args.dry_run, {"PULUMI_CONFIG_PASSPHRASE": secrets.token_urlsafe(24)})
    if gke:
        report = smoke_gke(
            cfg,
            stack_file,
            shell,
            ready_minutes=args.ready_minutes,
            poll_seconds=args.poll_seconds,
            teams_file=teams_file,
            run_minutes=args.run_minutes,
        )
    else:
        report = smoke(cfg, stack_file, shell, run_minutes=args.run_minutes, poll_seconds=args.poll_seconds)
    if args.dry_run:
        print("\n# dry run: nothing was run; the checks above are what a real run verifies")
        return 0
    print(report.text())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())

"""The real-GCP smoke test (tools/smoke.py, .github/workflows/smoke.yml). It cannot run here (no
credentials, no Pulumi CLI): its dry run, its order of commands, its `finally` and its workflow are tested."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from infra.config import parse_stack_config
from infra.config.stackfile import ROOT, read_stack_config
from tests.test_workflows import auth_accounts, steps, uses, workflow
from tools import smoke

ARGS = ["--project", "acme-ml-sandbox", "--billing-account", "01A2B3-C4D5E6-F7A8B9", "--email", "ml@acme.example"]


def dry_run(capsys, *extra: str) -> tuple[int, str, list[str]]:
    code = smoke.main([*ARGS, "--dry-run", *extra])
    out = capsys.readouterr().out
    return code, out, [line[2:] for line in out.splitlines() if line.startswith("$ ")]


def stack_file_of(out: str) -> Path:
    (path,) = re.findall(r"^# stack file (\S+):$", out, flags=re.M)
    return Path(path)


def test_the_cheapest_tpu_is_the_cheapest_spot_single_host_type_of_the_zone():
    choice = smoke.cheapest_tpu("us-central1-a")
    assert choice.accelerator.name == "v5litepod-1"  # 1 chip x 0.213 USD; a v2-8 is 4 chips x 0.34
    assert choice.runtime == "tpu-vm-tf-2.15.0-pjrt"
    assert smoke.cheapest_tpu("us-central1-b").accelerator.name != "v5litepod-1"  # not offered there
    with pytest.raises(SystemExit, match="offers no single-host TPU in mars-north1-a"):
        smoke.cheapest_tpu("mars-north1-a")


def test_dry_run_prints_a_stack_file_that_parses_and_plans_and_runs_nothing(capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(smoke.subprocess, "run", lambda *a, **k: ran.append(a))
    code, out, commands = dry_run(capsys, "--stack", "smoke-123")
    assert code == 0 and ran == [] and commands
    assert "# the stack file validates and plans offline" in out
    path = stack_file_of(out)
    assert path.parent != ROOT and not (ROOT / path.name).exists()  # no Pulumi.<stack>.yaml in the checkout
    cfg = parse_stack_config("smoke-123", read_stack_config("smoke-123", ROOT, path))
    (vm,) = cfg.tpu_vms
    assert (vm.accelerator.name, vm.provisioning, vm.on_completion) == ("v5litepod-1", "spot", "stop")
    assert cfg.workload(vm.workload).epochs == 1
    assert smoke.plan_offline("smoke-123", path) == []  # no error, not even a warning (the cost fits the budget)


def test_the_commands_come_in_order_and_destroy_is_among_them(capsys):
    _, _, every = dry_run(capsys)
    # From `stack init` on, without the permission model's steps (tested below) and the plugin's install.
    start = next(i for i, c in enumerate(every) if c.startswith("pulumi stack init"))
    skip = ("pulumi plugin", "gcloud pubsub", "gcloud iam", "gcloud projects", "gcloud config")
    commands = [c for c in every[start:] if not c.startswith(skip)]
    verbs = [" ".join(c.split()[:3]) for c in commands]
    assert verbs == [
        "pulumi stack init",
        "pulumi up --stack",
        "gcloud storage ls",  # the completion marker
        "gcloud storage ls",  # a checkpoint
        "bash -c 'gcloud",  # a run's boundary against the real STS and Cloud Storage
        "gcloud compute tpus",  # the node STOPPED by the guard
        "gcloud beta services",  # Artifact Registry's service identity
        "gcloud compute tpus",  # a queued spot request ...
        "gcloud compute tpus",  # ... ACTIVE
        "gcloud compute tpus",  # its node names it
        "gcloud compute tpus",  # the image's Python (ssh)
        "gcloud compute tpus",  # the agent's code onto the node: a folder (ssh) ...
        "gcloud compute tpus",  # ... and scp
        "gcloud compute tpus",  # the TPU as the agent runs a run (vm_agent/tpu_probe.py)
        "gcloud compute tpus",  # ... and an image run
        "gcloud compute tpus",  # stop, noted
        "gcloud compute tpus",  # the request deleted with --force ...
        "gcloud compute tpus",  # ... and its node with it
        "pulumi destroy --stack",
        "gcloud compute tpus",  # the spot node is gone
        "gcloud storage buckets",  # data survived
        "gcloud storage buckets",  # status survived
        "pulumi stack rm",
    ]
    assert commands[2].endswith("gs://acme-ml-sandbox-smoke-status/smoke-tpu/COMPLETE")
    assert commands[3].endswith("gs://acme-ml-sandbox-smoke-checkpoints/mnist/smoke-tpu/smoke/")
    assert all("--config-file" in c for c in commands if c.startswith(("pulumi up", "pulumi destroy")))


def test_what_only_a_real_tpu_proves_about_runs_is_in_the_dry_run(capsys):
    """The agent's own code on the probe node: the framework as a fresh uid in the jail, twice, without the
    metadata server, with a low memlock; an image run with the agent's flags; and a run's boundary against the
    real STS and Cloud Storage (403 on another run's folder and the completion marker)."""
    _, out, commands = dry_run(capsys)
    (jail,) = [c for c in commands if "vm_agent.tpu_probe -- " in c]
    assert "sudo python3 -m vm_agent.tpu_probe -- env NEXT_PLUGGABLE_DEVICE_USE_C_API=true" in jail
    assert "list_logical_devices" in jail  # the smoke stack's TensorFlow on tpu-vm-tf-2.15.0-pjrt
    (image,) = [c for c in commands if "tpu_probe --image" in c]
    assert "us-docker.pkg.dev/cloud-tpu-images/jax-ai-image/tpu:latest" in image and "device_count" in image
    (scp,) = [c for c in commands if " scp --recurse " in c]
    assert scp.split()[6].endswith("/vm_agent") and "smoke-probe:/tmp/tpu-probe/" in scp
    (boundary,) = [c for c in commands if "tpu_probe boundary" in c]
    # by this environment's Python, which has google-auth (the exchange is its: vm_agent/credentials.py)
    assert f"gcloud auth print-access-token | {sys.executable} -m vm_agent.tpu_probe boundary" in boundary
    assert "gs://acme-ml-sandbox-smoke-checkpoints/mnist/smoke-tpu/smoke/" in boundary
    assert "gs://acme-ml-sandbox-smoke-checkpoints/mnist/smoke-tpu/another-run/" in boundary
    assert "gs://acme-ml-sandbox-smoke-status/smoke-tpu/COMPLETE" in boundary
    for check in (
        "as a fresh unprivileged uid in the agent's jail",
        "as the next run's uid",
        "with the metadata server out of reach",
        "no --privileged",
        "list outside",
        "read marker",
    ):
        assert check in out, check


def test_the_probes_try_what_the_guard_relies_on_and_always_delete_their_request(capsys):
    _, _, commands = dry_run(capsys)
    probe = [c for c in commands if "smoke-probe" in c]
    assert probe[0].startswith("gcloud compute tpus queued-resources create smoke-probe --zone us-central1-a")
    assert "--spot --network tpu-smoke --subnetwork tpu-smoke-us-central1 --internal-ips --tags tpu-vm" in probe[0]
    assert "value(queuedResource)" in probe[2] and probe[3].startswith("gcloud compute tpus tpu-vm ssh smoke-probe")
    assert probe[-2].endswith(
        "queued-resources delete smoke-probe --zone us-central1-a --project acme-ml-sandbox --force --quiet"
    )
    assert any("identity create --service=artifactregistry.googleapis.com" in c for c in commands)


@pytest.mark.parametrize(
    "failing", ["gcloud compute tpus tpu-vm describe smoke-probe", "gcloud compute tpus tpu-vm ssh"]
)
def test_the_probe_request_is_deleted_whatever_failed(failing, tmp_path):
    shell = FailingShell(failing)
    report = smoke_with(shell, tmp_path)
    assert not report.passed
    deleted = [i for i, c in enumerate(shell.printed) if "queued-resources delete smoke-probe" in c]
    destroyed = [i for i, c in enumerate(shell.printed) if c.startswith("pulumi destroy")]
    assert deleted and destroyed and deleted[0] < destroyed[0]  # before destroy removes its network


class FailingShell(smoke.Shell):
    """Answers like a real run in which one command fails."""

    def __init__(self, failing: str):
        super().__init__(dry_run=True)
        self.failing = failing

    def run(self, argv, *, cwd=None, answer=""):
        super().run(argv, cwd=cwd, answer=answer)
        return (1, "") if " ".join(argv).startswith(self.failing) else (0, answer)


def smoke_with(shell: smoke.Shell, tmp_path: Path) -> smoke.Report:
    """The smoke run of a stack file written like main's, through `shell`, with no waiting."""
    path = tmp_path / "Pulumi.smoke.yaml"
    args = smoke.SmokeArgs(
        "acme-ml-sandbox", "01A2B3-C4D5E6-F7A8B9", "us-central1-a", "smoke", "o", "a@b.example", 200, ""
    )
    path.write_text(smoke.stack_file_text(args, smoke.cheapest_tpu("us-central1-a")))
    cfg = parse_stack_config("smoke", read_stack_config("smoke", ROOT, path))
    return smoke.smoke(cfg, path, shell, run_minutes=0, poll_seconds=0, action_minutes=0)


@pytest.mark.parametrize("failing", ["pulumi up", "gcloud storage ls", "gcloud compute tpus"])
def test_destroy_runs_whatever_failed_before(failing, tmp_path, capsys):
    shell = FailingShell(failing)
    report = smoke_with(shell, tmp_path)
    assert not report.passed
    assert any(c.startswith("pulumi destroy") for c in shell.printed)
    assert shell.printed[-1].startswith("pulumi stack rm")
    assert "FAILED" in report.text()


def test_a_crash_mid_run_still_destroys(tmp_path):
    class Crashing(FailingShell):
        def run(self, argv, *, cwd=None, answer=""):
            if argv[:2] == ["gcloud", "compute"]:
                raise KeyboardInterrupt
            return super().run(argv, cwd=cwd, answer=answer)

    shell = Crashing("nothing")
    with pytest.raises(KeyboardInterrupt):
        smoke_with(shell, tmp_path)
    assert any(c.startswith("pulumi destroy") for c in shell.printed)


def test_the_workflow_is_manual_gated_minimal_and_runs_the_command():
    data = workflow("smoke.yml")
    assert data["on"] == {"workflow_dispatch": data["on"]["workflow_dispatch"]}  # by hand only
    assert data["permissions"] == {"contents": "read"}
    (job,) = data["jobs"].values()
    assert job["environment"] == "smoke"
    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    assert auth_accounts(job) == ["${{ vars.SMOKE_SERVICE_ACCOUNT }}"]
    assert [s.get("with") for s in steps(job) if uses(s, "pulumi/actions")] == [None], "installs the CLI only"
    (run,) = [s for s in steps(job) if "tools.smoke" in s.get("run", "")]
    assert "--dry-run" not in run["run"]
    assert all("${{" not in line for line in run["run"].splitlines()), "values reach the shell through env only"
    assert run["env"]["PULUMI_BACKEND_URL"] == "${{ vars.SMOKE_STATE_BACKEND }}"


GKE = ["--engine", "gke", "--tpu7x-reservation", "ironwood-res"]


def test_gke_dry_run_plans_the_gke_stack_offline_and_lists_what_only_a_real_project_proves(capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(smoke.subprocess, "run", lambda *a, **k: ran.append(a))
    code, out, commands = dry_run(capsys, *GKE)
    assert code == 0 and ran == [] and "# the stack file validates and plans offline" in out
    cfg = parse_stack_config("smoke", read_stack_config("smoke", ROOT, stack_file_of(out)))
    assert cfg.gke is not None
    assert {(p.name, p.accelerator.name, p.provisioning) for p in cfg.gke.slice_pools} == {
        ("spot", "v5litepod-16", "spot"),
        ("iron", "tpu7x-16", "reserved"),
    }
    assert smoke.plan_offline("smoke", stack_file_of(out)) == []  # within its budget, no warning
    # The nodes' account is the bootstrap's: made before, removed after (the permission model's steps).
    made = [c for c in commands if c.startswith("gcloud iam service-accounts")]
    assert any(c.startswith("gcloud iam service-accounts create tpu-gke-nodes-smoke") for c in made)
    assert "delete" in made[-1]
    # ... and so is the teams' member role, before any up (the stack with teams grants it).
    (role,) = [c for c in commands if c.startswith("gcloud iam roles create tpuPlatformGkeTeamSmoke")]
    assert "--permissions=container.clusters.connect,container.clusters.get" in role
    assert commands.index(role) < commands.index(next(c for c in commands if c.startswith("pulumi up")))
    commands = [c for c in commands if not c.startswith(("gcloud iam", "pulumi plugin"))]
    verbs = [" ".join(c.split()[:4]) for c in commands]
    assert verbs == [
        "pulumi stack init smoke",
        "pulumi up --stack smoke",
        "gcloud container node-pools describe",  # TPU7x placed by its workload policy
        "pulumi preview --stack smoke",  # --expect-no-changes: nothing GKE reports replaces a pool
        "gcloud container clusters get-credentials",
        "kubectl get nodes -l",  # the TPU7x nodes' labels
        # part 2: the admin phase (in gke-admin/), the queues phase, what the teams can and cannot do
        "pulumi stack init smoke",
        "pulumi up --stack smoke",
        "kubectl wait deployment/jobset-controller-manager -n",
        "kubectl get pods -n",  # the image it runs, by digest
        "kubectl wait deployment/kueue-controller-manager -n",
        "kubectl get pods -n",
        "pulumi up --stack smoke",  # the queues phase
        "kubectl get clusterqueue smoke-a",
        "kubectl get clusterqueue smoke-b",
        "kubectl auth can-i create",  # in its own namespace
        "kubectl auth can-i create",  # in the other team's
        "kubectl auth can-i create",  # pods
        "kubectl run smoke-privileged -n",
        "kubectl run smoke-host-network -n",
        "kubectl run smoke-above -n",
        "kubectl apply --server-side -f",
        "kubectl apply --server-side -f",
        "kubectl wait jobset/smoke-jax -n",
        "kubectl logs -n team-smoke-a",  # each pod's place in its slice, from what GKE injected
        'gcloud logging read \'labels."k8s-pod/jobset_sigs_k8s_io/jobset-name"="smoke-jax"\'',  # the team's log view
        "gcloud container images describe",  # the folder image, pinned to its digest
        f"{sys.executable} -m tpu_runs submit",  # a team's folder source
        "kubectl wait -n team-smoke-a",  # ... finished
        "kubectl logs -n team-smoke-a",  # each pod's fetch step
        "kubectl logs -n team-smoke-a",  # ... and its program, in the folder
        "kubectl apply --server-side -f",  # the same archive under another digest
        "kubectl wait -n team-smoke-a",  # ... failed
        "kubectl get jobset smoke-tampered",  # ... never restarted
        "kubectl delete jobset smoke-folder",
        "kubectl apply --server-side -f",  # a team's run on the spot slice
        "gcloud storage cat gs://acme-ml-sandbox-smoke-checkpoints/teams/smoke-a/smoke-resume/step-0",  # its checkpoint
        "kubectl get nodes -l",  # a node of the spot slice
        "kubectl get node gke-spot-0-0",
        "gcloud compute instances simulate-maintenance-event",  # its preemption
        "kubectl get nodes -l",  # the slice Ready again
        "kubectl get node gke-spot-0-0",  # registered anew
        "kubectl wait jobset/smoke-resume -n",  # the run finished
        "kubectl get jobset smoke-resume",  # restarted, not counted against its restarts
        "kubectl logs -n team-smoke-a",  # resumed from its checkpoint
        "kubectl delete jobset smoke-resume",
        "kubectl get jobset smoke-unqueued",
        "kubectl delete jobset smoke-jax",
        "pulumi up --stack smoke",  # the teams removed: their queues go before Kueue's CRDs
        "pulumi destroy --stack smoke",  # the admin phase
        "pulumi stack rm smoke",
        "pulumi destroy --stack smoke",
        "pulumi stack rm smoke",
    ]
    assert "--expect-no-changes" in commands[3]
    teams_file = stack_file_of(out).with_name("Pulumi.smoke.teams.yaml")
    assert commands[7].endswith(f"--config-file {teams_file} --yes --skip-preview")  # the admin phase's up
    assert commands[12].endswith(f"--config-file {teams_file}")  # the environment with its teams
    assert commands[-5].endswith(f"--config-file {stack_file_of(out)}")  # and without them again
    assert "jobset.sigs.k8s.io/jobset-name=smoke-resume" in commands[-9]
    teams = parse_stack_config("smoke", read_stack_config("smoke", ROOT, teams_file))
    assert teams.gke is not None and [t.name for t in teams.gke.teams] == ["smoke-a", "smoke-b"]
    assert "'privileged': true" in commands[18].replace('"', "'") and "hostNetwork" in commands[19]
    assert "value(status,placementPolicy.policyName,placementPolicy.tpuTopology,placementPolicy.type)" in commands[2]
    assert "cloud.google.com/gke-tpu-accelerator=tpu7x,cloud.google.com/gke-tpu-topology=2x2x2" in commands[5]


def test_gke_needs_the_tpu7x_reservation(capsys):
    with pytest.raises(SystemExit):
        smoke.main([*ARGS, "--engine", "gke", "--dry-run"])
    assert "--engine gke needs --tpu7x-reservation" in capsys.readouterr().err


@pytest.mark.parametrize(
    "failing",
    ["pulumi up", "gcloud container node-pools", "pulumi preview", "gcloud compute instances", "kubectl get node "],
)
def test_the_gke_smoke_destroys_whatever_failed_before(failing, tmp_path):
    path = tmp_path / "Pulumi.smoke.yaml"
    args = smoke.SmokeArgs(
        "acme-ml-sandbox", "01A2B3-C4D5E6-F7A8B9", "us-central1-a", "smoke", "o", "a@b.example", 10_000, ""
    )
    path.write_text(smoke.gke_stack_file_text(args, "ironwood-res"))
    cfg = parse_stack_config("smoke", read_stack_config("smoke", ROOT, path))
    shell = FailingShell(failing)
    report = smoke.smoke_gke(cfg, path, shell, ready_minutes=0, poll_seconds=0)
    assert not report.passed
    destroy = max(i for i, c in enumerate(shell.printed) if c.startswith("pulumi destroy"))
    # Then only the removal of what the bootstrap's part made, and the stack itself.
    assert all(c.startswith("gcloud iam service-accounts delete") for c in shell.printed[destroy + 1 : -1])
    assert shell.printed[-1].startswith("pulumi stack rm")


def test_a_slice_that_does_not_come_back_fails_the_gke_smoke(tmp_path):
    class NotBack(FailingShell):
        def run(self, argv, *, cwd=None, answer=""):
            if "jsonpath={range" in " ".join(argv):
                answer = "True False True True"
            return super().run(argv, cwd=cwd, answer=answer)

    path = tmp_path / "Pulumi.smoke.yaml"
    args = smoke.SmokeArgs(
        "acme-ml-sandbox", "01A2B3-C4D5E6-F7A8B9", "us-central1-a", "smoke", "o", "a@b.example", 10_000, ""
    )
    path.write_text(smoke.gke_stack_file_text(args, "ironwood-res"))
    cfg = parse_stack_config("smoke", read_stack_config("smoke", ROOT, path))
    report = smoke.smoke_gke(cfg, path, NotBack("nothing"), ready_minutes=0, poll_seconds=0)
    assert [name for name, ok, _ in report.checks if not ok] == ["a preempted spot slice comes back whole"]


def test_the_dry_run_lists_a_step_for_each_check_only_a_real_project_can_make(capsys):
    """The list of what the offline model cannot prove (docs/ci-and-bootstrap.md), each a step of the real run."""
    _, out, commands = dry_run(capsys)
    checks = [line.removeprefix("check ") for line in out.splitlines() if line.startswith("check ")]
    for step in (
        "custom roles accept every computed permission (customRolesSupportLevel)",
        "a modifiedGrantsByRole-limited IAM admin may change the audit config",
        "the budget's topic: Billing's agent may publish (domain-restricted sharing allowed it)",
        "the bootstrap's part: the stack's accounts, custom roles and act-as",
    ):
        assert any(c.startswith(step) for c in checks), step
    # Support levels are read for every permission the bootstrap puts in a custom role.
    assert any("list-testable-permissions" in c and "NOT_SUPPORTED" in c for c in commands)
    assert "iam.roles" not in " ".join(smoke.computed_permissions())  # no deployer holds iam.roles.* any more
    (audit,) = [c for c in commands if c.startswith("gcloud projects set-iam-policy") and "impersonate" in c]
    assert "--impersonate-service-account=tpu-smoke-limited-smoke@" in audit  # as the limited admin
    (grant,) = [c for c in commands if c.startswith("gcloud projects add-iam-policy-binding")]
    assert "modifiedGrantsByRole" in grant and "projectIamAdmin" in grant
    # The stack's accounts are made before `pulumi up`, which names but does not make them.
    made = next(i for i, c in enumerate(commands) if c.startswith("gcloud iam service-accounts create tpu-mnist-smoke"))
    assert made < next(i for i, c in enumerate(commands) if c.startswith("pulumi up"))


def gke_smoke_with_teams(shell: smoke.Shell, tmp_path: Path) -> tuple[smoke.Report, Path, Path]:
    """The GKE smoke run with its teams part, through `shell`, with no waiting: its report, stack file, teams file."""
    args = smoke.SmokeArgs(
        "acme-ml-sandbox", "01A2B3-C4D5E6-F7A8B9", "us-central1-a", "smoke", "o", "a@b.example", 10_000, ""
    )
    path, teams = tmp_path / "Pulumi.smoke.yaml", tmp_path / "Pulumi.smoke.teams.yaml"
    path.write_text(smoke.gke_stack_file_text(args, "ironwood-res"))
    teams.write_text(smoke.gke_stack_file_text(args, "ironwood-res", teams=True))
    cfg = parse_stack_config("smoke", read_stack_config("smoke", ROOT, path))
    report = smoke.smoke_gke(cfg, path, shell, ready_minutes=0, poll_seconds=0, teams_file=teams, run_minutes=0)
    return report, path, teams


@pytest.mark.parametrize("failing", ["kubectl wait jobset", "kubectl auth can-i", "kubectl get clusterqueue"])
def test_the_teams_part_removes_the_teams_and_the_admin_phase_whatever_failed(failing, tmp_path):
    shell = FailingShell(failing)
    report, path, teams = gke_smoke_with_teams(shell, tmp_path)
    assert not report.passed
    failed = next(i for i, c in enumerate(shell.printed) if c.startswith(failing))
    cleanup = [c for c in shell.printed[failed + 1 :] if c.startswith("pulumi")]
    assert cleanup == [
        f"pulumi up --stack smoke --yes --skip-preview --config-file {path}",  # the teams' queues removed
        f"pulumi destroy --stack smoke --config-file {teams} --yes --skip-preview",  # the admin phase
        "pulumi stack rm smoke --yes",
        f"pulumi destroy --stack smoke --config-file {path} --yes --skip-preview",  # the environment
        "pulumi stack rm smoke --yes",
    ]


def test_the_gke_dry_run_lists_the_run_steps_only_a_real_cluster_proves(capsys):
    """GKE's injection of each worker's place, and a preempted spot slice giving its run back from its checkpoint."""
    _, out, _ = dry_run(capsys, *GKE)
    checks = [line.removeprefix("check ") for line in out.splitlines() if line.startswith("check ")]
    for step in (
        "GKE injects TPU_WORKER_ID and TPU_WORKER_HOSTNAMES into each pod of a multi-host slice",
        "the run's lines reach team smoke-a's log bucket through its sink and show in its log view",
        "a team's run on the spot slice, checkpointing under its team's prefix",
        "... its first checkpoint written",
        "a preempted spot slice comes back whole",
        "the preempted run restarted on the slice without counting against its restarts, resumed from its "
        "checkpoint and finished",
        "tpu-runs submit --team smoke-a --folder: uploaded under its sources, applied",
        "each pod's fetch step reads the runner and the folder as the team's Kubernetes account, checks both "
        "digests in the pinned public image, and the program runs in the folder",
        "a folder's archive that does not match the digest its JobSet names fails the run at once",
    ):
        assert any(c.startswith(step) for c in checks), step
    # The dry run's answer is read by the run contract: four workers of one slice, one coordinator.
    injected = next(c for c in checks if c.startswith("GKE injects"))
    assert "worker 3 of 4, coordinator smoke-jax-slice-0-0.smoke-jax:8482" in injected
    # The preemption lands on the team's run, once: after its first checkpoint, before it is waited for.
    assert (
        checks.index("a preempted spot slice comes back whole")
        == checks.index(next(c for c in checks if c.startswith("... its first checkpoint written"))) + 1
    )


class Answering(FailingShell):
    """A real run's answers, but `answers` for the commands that start with their keys."""

    def __init__(self, answers: dict[str, str]):
        super().__init__("nothing")
        self.answers = answers

    def run(self, argv, *, cwd=None, answer=""):
        line = " ".join(argv)
        answer = next((a for start, a in self.answers.items() if line.startswith(start)), answer)
        return super().run(argv, cwd=cwd, answer=answer)


@pytest.mark.parametrize(
    ("answers", "failed"),
    [
        # GKE injected nothing: every worker would think itself alone.
        (
            {"kubectl logs -n team-smoke-a -l jobset.sigs.k8s.io/jobset-name=smoke-jax": 'place {"TPU_WORKER_ID": ""}'},
            "GKE injects",
        ),
        # The team's log view shows none of the run's lines (no sink routed them, or another label).
        ({"gcloud logging read": ""}, "the run's lines reach team smoke-a's log bucket"),
        # The node's loss counted against the run's restarts.
        ({"kubectl get jobset smoke-resume": "1 1"}, "the preempted run restarted"),
        # The folder's fetch step never ran (or the image lacked what it needs): the program ran on nothing.
        (
            {"kubectl logs -n team-smoke-a -l jobset.sigs.k8s.io/jobset-name=smoke-folder -c fetch-source": ""},
            "each pod's fetch step",
        ),
        # An archive under a digest it does not have was retried, not refused for good.
        ({"kubectl get jobset smoke-tampered": "1"}, "a folder's archive that does not match"),
        # It started over instead of resuming.
        (
            {"kubectl logs -n team-smoke-a -l jobset.sigs.k8s.io/jobset-name=smoke-resume": "finished at step 60"},
            "the preempted run restarted",
        ),
    ],
)
def test_the_gke_run_steps_fail_when_the_cluster_does_not_do_it(answers, failed, tmp_path):
    report, _, _ = gke_smoke_with_teams(Answering(answers), tmp_path)
    assert [name for name, ok, _ in report.checks if not ok] == [
        next(name for name, _, _ in report.checks if name.startswith(failed))
    ]

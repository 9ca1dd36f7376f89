"""Narrow component contracts: each component is built alone, from an `Env` and its own args.

- `infra/platform.py` is the one reader of the whole `PlatformConfig`; every other module under infra/
  that names it is listed below with the reason it needs the whole config (checked on the source).
- Each component is declared here under the recording mocks with no PlatformConfig at all, and with
  only the project APIs its module declares: `ProjectApis.needs` refuses an API nobody enabled, so a
  component that uses an API its module does not declare fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pytest

from infra import naming
from infra.apis import ProjectApis, required_apis
from infra.budget import BudgetAlerts, BudgetAlertsArgs, budget_apis
from infra.catalog import AcceleratorType, load_catalog
from infra.catalog.gke import load_gke_catalog
from infra.config import (
    AutomationSettings,
    BucketSettings,
    BudgetSettings,
    Env,
    NetworkSettings,
    ScheduleSettings,
    Threshold,
    TpuVmSettings,
    WorkloadSettings,
)
from infra.config.model import BucketAccess, GkeSettings, MaintenanceWindow, Recovery, SlicePoolSettings, SystemPool
from infra.gke.cluster import GKE_APIS, GkeCluster, GkeClusterArgs
from infra.gke.slice_pools import SlicePool, SlicePoolArgs
from infra.identity import IDENTITY_APIS, WorkloadIdentity, WorkloadIdentityArgs
from infra.lifecycle import (
    RUN_STATUS_APIS,
    SCHEDULES_APIS,
    RunStatus,
    RunStatusArgs,
    StartTarget,
    TpuSchedules,
    TpuSchedulesArgs,
)
from infra.monitoring import MONITORING_APIS, PREEMPTED_EVENT, TpuMonitoring, TpuMonitoringArgs
from infra.network import IAP_SSH_RANGE, NETWORK_APIS, ClusterRanges, PrivateNetwork
from infra.storage import STORAGE_APIS, PlatformBuckets
from infra.tpu.cloud_tpu import BACKENDS
from infra.tpu.vm import TPU_VM_APIS, TpuVm
from infra.tpu_guard import GUARD_APIS, TpuGuard, TpuGuardArgs, guard_apis
from run_contract import paths
from tests.support import depends_on, fixture_config, plan, with_object
from tools.offline.runner import PlanResult, run_program

INFRA = Path(__file__).resolve().parents[1] / "infra"

# Modules under infra/ that may name PlatformConfig, and why each needs the whole of it.
WHOLE_CONFIG_READERS = {
    # The composition root: decides which components a stack declares and builds their args.
    "platform.py": "the one reader",
    # The composition root of the GKE engine's admin phase (its own project, gke-admin/), as platform.py is
    # the environment's: it reads the environment's settings to install into its cluster.
    "gke/admin.py": "the admin phase's composition root",
    # Defines, parses and checks it.
    "config/__init__.py": "exports it",
    "config/model.py": "defines it",
    "config/reader.py": "parses the raw stack config into it",
    "config/rules.py": "cross-setting rules read several parts at once",
    "config/settings.py": "lists its fields' declarations as rows (the schema, the settings table)",
    # The Pulumi edge: reads the raw config and hands the parsed whole to platform.py.
    "stack.py": "the edge that builds it",
    # Pure (no Pulumi): a VM's metadata joins the VM, its workload's settings, the stack's bucket
    # names and the stack; it is computed for every VM before anything is declared.
    "tpu/metadata.py": "joins a VM with its workload and the stack's buckets",
}
ENV = Env(
    stack="solo", project="solo-project", region="europe-west4", owner="team-a", production=False, name_prefix="acme"
)
PROD = Env("live", "live-project", "europe-west4", owner="team-a", production=True, name_prefix="")
ZONE = "europe-west4-a"
CATALOG = load_catalog()


def whole_config_names(path: Path) -> list[str]:
    """Where a module names PlatformConfig or takes a `cfg` parameter (the whole config's usual name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = node.id if isinstance(node, ast.Name) else node.name if isinstance(node, ast.alias) else None
        if name == "PlatformConfig":
            found.append(f"line {getattr(node, 'lineno', '?')}: PlatformConfig")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            found += [f"line {node.lineno}: {node.name}(cfg)" for p in params if p.arg == "cfg"]
    return found


def test_platform_is_the_one_reader_of_the_whole_config():
    readers = {
        str(path.relative_to(INFRA)): names
        for path in sorted(INFRA.rglob("*.py"))
        if (names := whole_config_names(path)) and str(path.relative_to(INFRA)) not in WHOLE_CONFIG_READERS
    }
    assert readers == {}, "take Env and a small args object instead (see infra/network.py)"
    assert all((INFRA / module).exists() for module in WHOLE_CONFIG_READERS)  # no stale entry


def test_the_reader_check_sees_a_component_taking_the_whole_config(tmp_path):
    module = tmp_path / "component.py"
    module.write_text(
        "from infra.config import PlatformConfig\n\n"
        "class Thing:\n    def __init__(self, name, cfg: PlatformConfig): ...\n\n"
        "def helper(cfg): ...\n"
    )
    assert len(whole_config_names(module)) == 4  # the import, its use, and two `cfg` parameters


def build(program: Callable[[], Any], stack: str = ENV.stack) -> PlanResult:
    """Run `program` alone under the recording mocks: no stack config, no PlatformConfig."""
    return run_program(stack, {}, program=program)


def enabled(*apis: tuple[str, ...] | list[str]) -> ProjectApis:
    return ProjectApis("apis", ENV.project, required_apis(*apis))


def one(result: PlanResult, token: str, name: str | None = None):
    found = [r for r in result.of_type(token) if name is None or r.name == name]
    assert len(found) == 1, [r.name for r in result.of_type(token)]
    return found[0]


def vm_settings(name: str = "solo-vm", **changes) -> TpuVmSettings:
    accelerator = CATALOG.accelerator("v5litepod-8")
    assert isinstance(accelerator, AcceleratorType)
    settings = {
        "name": name,
        "accelerator": accelerator,
        "zone": ZONE,
        "runtime_version": "v2-alpha-tpuv5-lite",
        "provisioning": "spot",
        "workload": "trainer",
        "labels": (("team", "vision"),),
        "description": "",
        "schedule": None,
        "on_completion": "keep",
    }
    return TpuVmSettings(**(settings | changes))


NETWORK = NetworkSettings(subnets=(("europe-west4", "10.8.0.0/20"),), flow_log_sampling=0.5)
BUCKETS = BucketSettings(
    location="EUROPE-WEST4",
    storage_class="STANDARD",
    kms_key_name=None,
    noncurrent_versions_to_keep=3,
    noncurrent_version_days=7,
    destroyable=("data",),
)
WORKLOAD = WorkloadSettings(
    name="trainer",
    description="trains",
    bucket_levels=BucketAccess(data="read", checkpoints="write", models="none"),
    project_roles=("roles/logging.logWriter",),
    program="jax_mnist",
    framework="jax",
    framework_version="0.4.35",
    memory_gib_per_chip=None,
    run="r1",
    checkpoint_every_steps=100,
    checkpoint_every_minutes=10,
    epochs=1,
    batch_size=128,
)


def test_private_network_alone():
    result = build(lambda: PrivateNetwork("net", ENV, NETWORK, enabled(NETWORK_APIS)))
    subnet = one(result, "gcp:compute/subnetwork:Subnetwork")
    assert (subnet.inputs["region"], subnet.inputs["ipCidrRange"], subnet.inputs["privateIpGoogleAccess"]) == (
        "europe-west4",
        "10.8.0.0/20",
        True,
    )
    assert subnet.inputs["logConfig"]["flowSampling"] == 0.5
    assert one(result, "gcp:compute/network:Network").inputs["name"] == "tpu-solo"
    ssh = one(result, "gcp:compute/firewall:Firewall", "net-ssh-from-iap")
    assert ssh.inputs["sourceRanges"] == [IAP_SSH_RANGE]
    assert {r.inputs["project"] for r in result.resources if r.custom} == {ENV.project}


def test_platform_buckets_alone():
    result = build(lambda: PlatformBuckets("buckets", PROD, BUCKETS, enabled(STORAGE_APIS)), PROD.stack)
    buckets = {r.inputs["name"]: r for r in result.of_type("gcp:storage/bucket:Bucket")}
    assert set(buckets) == {PROD.bucket_name(p) for p in ("data", "checkpoints", "models")}
    data, models = buckets[PROD.bucket_name("data")], buckets[PROD.bucket_name("models")]
    assert data.inputs["forceDestroy"] is True and not data.retain_on_delete  # listed as destroyable
    assert models.retain_on_delete and models.protect  # kept, and protected in production
    assert models.inputs["labels"] == {**PROD.labels, "purpose": "models"}
    assert models.inputs["labels"]["environment-class"] == "production"
    assert models.inputs["publicAccessPrevention"] == "enforced"
    one(result, "gcp:projects/iAMAuditConfig:IAMAuditConfig")


def plain_buckets() -> dict[str, gcp.storage.Bucket]:
    return {p: gcp.storage.Bucket(p, name=ENV.bucket_name(p), location="EU") for p in ("data", "checkpoints", "models")}


def test_workload_identity_alone():
    args = WorkloadIdentityArgs(WORKLOAD)
    result = build(lambda: WorkloadIdentity("wl", ENV, args, plain_buckets(), enabled(IDENTITY_APIS)))
    assert not result.of_type("gcp:serviceaccount/account:Account")  # the bootstrap makes it
    account = f"serviceAccount:{naming.workload_account_id('trainer', ENV.stack)}@{ENV.project}.iam.gserviceaccount.com"
    assert {r.inputs["member"] for r in result.resources if "member" in r.inputs} == {account}
    grants = {r.name: r.inputs for r in result.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert set(grants) == {"wl-data-read", "wl-checkpoints-write"}  # no models access: none asked for
    assert "condition" not in grants["wl-data-read"]  # data is shared input
    assert ENV.bucket_name("checkpoints") in grants["wl-checkpoints-write"]["condition"]["expression"]
    assert one(result, "gcp:projects/iAMMember:IAMMember").inputs["role"] == "roles/logging.logWriter"


def test_self_service_identity_alone():
    """A self-service VM's own account (the bootstrap makes it): the workload's rights, narrowed to the VM's
    prefix `<workload>/<vm>/`, never the workload's `<workload>/` nor its account."""
    from infra.access.identities import self_service_account

    args = WorkloadIdentityArgs(WORKLOAD, vm="solo-vm")
    result = build(lambda: WorkloadIdentity("ss", ENV, args, plain_buckets(), enabled(IDENTITY_APIS)))
    assert not result.of_type("gcp:serviceaccount/account:Account")
    account = self_service_account("solo-vm", ENV.stack)
    assert account.account_id == naming.self_service_account_id("solo-vm", ENV.stack)
    assert account.account_id != naming.workload_account_id("trainer", ENV.stack)
    assert {r.inputs["member"] for r in result.resources if "member" in r.inputs} == {account.member(ENV.project)}
    grants = {r.name: r.inputs for r in result.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert set(grants) == {"ss-data-read", "ss-checkpoints-write"}
    assert '/objects/trainer/solo-vm/")' in grants["ss-checkpoints-write"]["condition"]["expression"]
    assert '/objects/trainer/")' not in grants["ss-checkpoints-write"]["condition"]["expression"]
    assert not result.of_type("gcp:serviceaccount/iAMMember:IAMMember")  # act-as is the bootstrap's


def test_budget_alerts_alone():
    budget = BudgetSettings(
        amount=1234.5,
        currency="EUR",
        thresholds=(Threshold(percent=50),),
        emails=("a@example.com",),
        pubsub_topic=True,
        fail_over_budget=False,
    )
    key = "projects/keys/locations/europe-west4/keyRings/r/cryptoKeys/k"
    args = BudgetAlertsArgs(budget, "012345-6789AB-CDEF01", key)
    result = build(lambda: BudgetAlerts("budget", ENV, args, enabled(budget_apis(args))))
    amount = one(result, "gcp:billing/budget:Budget").inputs["amount"]["specifiedAmount"]
    assert (amount["currencyCode"], amount["units"], amount["nanos"]) == ("EUR", "1234", 500_000_000)
    topic = one(result, "gcp:pubsub/topic:Topic").inputs
    assert topic["kmsKeyName"] == key
    assert topic["messageStoragePolicy"]["allowedPersistenceRegions"] == ["europe-west4"]  # the key's region
    assert one(result, "gcp:monitoring/notificationChannel:NotificationChannel").inputs["userLabels"] == ENV.labels
    # Pub/Sub only when there is a topic: without one, the budget declares neither.
    without = dataclasses.replace(args, budget=budget.model_copy(update={"pubsub_topic": False}), kms_key_name=None)
    assert "pubsub.googleapis.com" in budget_apis(args) and "pubsub.googleapis.com" not in budget_apis(without)
    assert (
        build(lambda: BudgetAlerts("budget", ENV, without, enabled(budget_apis(without)))).of_type(
            "gcp:pubsub/topic:Topic"
        )
        == []
    )


def test_run_status_alone():
    args = RunStatusArgs("EUROPE-WEST4", (("vm-a", "trainer"), ("vm-b", "trainer")))

    def program() -> None:
        apis = enabled(RUN_STATUS_APIS)
        accounts = {"trainer": "trainer@solo-project.iam.gserviceaccount.com"}
        RunStatus("status", ENV, args, accounts, None, apis.needs("storage"))

    result = build(program)
    bucket = one(result, "gcp:storage/bucket:Bucket")
    assert bucket.inputs["name"] == ENV.bucket_name("status") and bucket.retain_on_delete
    grant = one(result, "gcp:storage/bucketIAMMember:BucketIAMMember", "status-vm-b-writer").inputs
    assert paths.status_prefix("vm-b") in grant["condition"]["expression"]
    assert grant["member"] == "serviceAccount:trainer@solo-project.iam.gserviceaccount.com"


def test_tpu_vm_alone_with_its_network_and_identity():
    vm = vm_settings()

    def program() -> None:
        apis = enabled(NETWORK_APIS, IDENTITY_APIS, TPU_VM_APIS)
        network = PrivateNetwork("net", ENV, NETWORK, apis)
        identity = WorkloadIdentity("wl", ENV, WorkloadIdentityArgs(WORKLOAD), plain_buckets(), apis)
        metadata = {"startup-script": "#!/bin/bash\ntrue\n"}
        TpuVm("tpu", ENV, vm, metadata, identity, network, BACKENDS["cloud-tpu"], apis, needs=[])

    result = build(program)
    node = one(result, "gcp:tpu/v2Vm:V2Vm")
    assert node.inputs["labels"] == {"team": "vision", **ENV.labels, "workload": "trainer", "provisioning": "spot"}
    assert node.inputs["schedulingConfig"]["spot"] is True
    assert node.inputs["networkConfig"]["enableExternalIps"] is False
    tpu_api = one(result, "gcp:projects/service:Service", "apis-tpu")
    assert depends_on(result, node, tpu_api.urn)
    assert depends_on(result, node, one(result, "gcp:compute/routerNat:RouterNat").urn)  # boots with egress


def test_tpu_guard_alone():
    vm = vm_settings(
        on_completion="stop",
        max_run_hours=5.0,
        schedule=ScheduleSettings(start="0 8 * * 1-5", stop="0 20 * * *", time_zone="UTC"),
    )
    automation = AutomationSettings(recovery=Recovery(max_attempts=3))
    args = TpuGuardArgs(
        automation, (vm,), (("solo-vm", "solo/trainer/solo-vm/r1"),), "012345-6789AB-CDEF01", "EUROPE-WEST4"
    )
    assert args.needed and "cloudscheduler.googleapis.com" not in guard_apis(args)  # no recovery job

    def program() -> None:
        apis = enabled(guard_apis(args))
        status = gcp.storage.Bucket("status", name=ENV.bucket_name("status"), location="EU")
        TpuGuard("guard", ENV, args, apis, None, [], status, None, pulumi.Output.from_input("budget"))

    result = build(program)
    functions = {r.inputs["name"]: r.inputs for r in result.of_type("gcp:cloudfunctionsv2/function:Function")}
    # Run completion and scheduled starts; no budget action or recovery was asked for.
    assert set(functions) == {naming.function_name(f, ENV.stack) for f in ("complete", "scheduled-start")}
    settings = functions[naming.function_name("complete", ENV.stack)]["serviceConfig"]["environmentVariables"]
    assert json.loads(settings["CURRENT_RUNS"]) == {"solo-vm": "solo/trainer/solo-vm/r1"}
    assert json.loads(settings["TPU_VMS"]) == {
        "solo-vm": {"nodes": ["solo-vm"], "zones": [ZONE], "onCompletion": "stop", "maxRunHours": 5.0}
    }
    assert settings["ZONES"] == ZONE and settings["PROJECT"] == ENV.project
    assert result.of_type("gcp:cloudscheduler/job:Job") == []


def test_guard_is_needed_exactly_when_a_feature_uses_it():
    off = AutomationSettings(recovery=Recovery(max_attempts=3))
    kept = vm_settings()
    assert not TpuGuardArgs(off, (kept,), (), "", "EU").needed
    assert TpuGuardArgs(off, (vm_settings(on_completion="delete"),), (), "", "EU").needed
    assert TpuGuardArgs(AutomationSettings(recovery=Recovery(every_minutes=10)), (kept,), (), "", "EU").needed
    # A scheduled start goes through the guard; a scheduled stop straight to the TPU API.
    starts, stops = (
        ScheduleSettings(start="0 8 * * *", time_zone="UTC"),
        ScheduleSettings(stop="0 20 * * *", time_zone="UTC"),
    )
    assert TpuGuardArgs(off, (vm_settings(schedule=starts),), (), "", "EU").needed
    assert not TpuGuardArgs(off, (vm_settings(schedule=stops),), (), "", "EU").needed
    assert "cloudscheduler.googleapis.com" in guard_apis(
        TpuGuardArgs(AutomationSettings(recovery=Recovery(every_minutes=10)), (kept,), (), "", "EU")
    )
    assert set(GUARD_APIS) <= set(guard_apis(TpuGuardArgs(off, (kept,), (), "", "EU")))


def test_tpu_schedules_alone():
    vm = vm_settings(schedule=ScheduleSettings(start="0 8 * * 1-5", stop="0 20 * * 1-5", time_zone="Europe/Amsterdam"))
    args = TpuSchedulesArgs((vm,))

    def program() -> None:
        apis = enabled(SCHEDULES_APIS)
        node = gcp.storage.Bucket("node-stand-in", location="EU")  # any resource: the jobs wait for it
        url = pulumi.Output.from_input("https://start.example")
        start = StartTarget(url, pulumi.Output.from_input("invoker@solo-project.iam.gserviceaccount.com"), [], "300s")
        TpuSchedules("schedules", ENV, args, apis, {"solo-vm": node}, start)

    result = build(program)
    jobs = {r.name: r.inputs for r in result.of_type("gcp:cloudscheduler/job:Job")}
    assert set(jobs) == {"schedules-solo-vm-stop", "schedules-solo-vm-start"}
    stop = jobs["schedules-solo-vm-stop"]
    assert stop["httpTarget"]["uri"].endswith(f"{naming.node_path(ENV.project, ZONE, 'solo-vm')}:stop")
    assert (stop["schedule"], stop["timeZone"], stop["region"]) == ("0 20 * * 1-5", "Europe/Amsterdam", "europe-west4")
    assert jobs["schedules-solo-vm-start"]["httpTarget"]["uri"] == "https://start.example"
    grant = one(result, "gcp:projects/iAMMember:IAMMember").inputs  # of the role the bootstrap makes
    assert grant["role"] == f"projects/{ENV.project}/roles/{naming.custom_role_id('scheduler', ENV.stack)}"


def test_tpu_monitoring_alone():
    always_on = vm_settings("always-on")
    scheduled = vm_settings("nightly", schedule=ScheduleSettings(start="0 8 * * *", stop="0 20 * * *", time_zone="UTC"))
    args = TpuMonitoringArgs(idle_minutes=45, vms=(always_on, scheduled), recovery=False)
    result = build(lambda: TpuMonitoring("monitoring", ENV, args, enabled(MONITORING_APIS), []))
    policies = {r.name: r.inputs for r in result.of_type("gcp:monitoring/alertPolicy:AlertPolicy")}
    assert set(policies) == {"monitoring-idle", "monitoring-not-reporting", "monitoring-preempted"}
    assert policies["monitoring-idle"]["conditions"][0]["conditionThreshold"]["thresholdValue"] == 45 * 60
    absent = policies["monitoring-not-reporting"]["conditions"][0]["conditionAbsent"]["filter"]
    assert "always-on" in absent and "nightly" not in absent  # a scheduled VM is off on purpose
    preempted = policies["monitoring-preempted"]["conditions"][0]["conditionMatchedLog"]["filter"]
    assert PREEMPTED_EVENT in preempted and f'jsonPayload.environment = "{ENV.stack}"' in preempted
    assert json.loads(one(result, "gcp:monitoring/dashboard:Dashboard").inputs["dashboardJson"])["displayName"] == (
        f"TPU platform ({ENV.stack})"
    )


@pytest.mark.parametrize(
    ("component", "apis"),
    [("network", ()), ("schedules", ("iam.googleapis.com",))],
)
def test_a_component_missing_a_declared_api_is_refused(component, apis):
    """The check the tests above rely on: a component needing an API that is not enabled fails loudly."""

    def program() -> None:
        enabled_apis = enabled(apis)
        if component == "network":
            PrivateNetwork("net", ENV, NETWORK, enabled_apis)
        else:
            start = StartTarget(pulumi.Output.from_input("u"), pulumi.Output.from_input("e"), [], "300s")
            stops = vm_settings(
                schedule=ScheduleSettings(stop="0 20 * * *", time_zone="UTC")
            )  # its grant needs the API
            TpuSchedules("s", ENV, TpuSchedulesArgs((stops,)), enabled_apis, {}, start)

    with pytest.raises(ValueError, match="APIs not enabled"):
        build(program)


def test_the_guard_and_its_apis_come_and_go_together():
    """Which features are on is decided once: the stack that needs no guard enables none of its APIs."""
    small = fixture_config("small")
    without = plan(small, "small")
    needing = plan(with_object(small, "tpuVms", lambda vms: vms[0].update(onCompletion="stop")), "small")
    for result, guarded in ((without, False), (needing, True)):
        apis = {s.inputs["service"] for s in result.of_type("gcp:projects/service:Service")}
        guards = [r for r in result.resources if r.type == "tpu-platform:automation:TpuGuard"]
        assert (len(guards) == 1, "cloudfunctions.googleapis.com" in apis) == (guarded, guarded)


def test_workload_artifacts_alone():
    from infra.artifacts import ARTIFACTS_APIS, ArtifactsArgs, WorkloadArtifacts, WorkloadCode
    from infra.packaging import repository_folder

    agent = repository_folder("vm_agent")
    args = ArtifactsArgs(
        location="US-CENTRAL1",
        kms_key_name=None,
        destroyable=False,
        noncurrent_versions_to_keep=2,
        noncurrent_version_days=7,
        packages={"vm-agent": agent},
        workloads={"solo": WorkloadCode(packages=("vm-agent",)), "shared": WorkloadCode(any_source=True)},
    )

    def program() -> None:
        apis = enabled(ARTIFACTS_APIS)
        needs = apis.needs(*(a.removesuffix(".googleapis.com") for a in ARTIFACTS_APIS))
        WorkloadArtifacts(
            "artifacts",
            ENV,
            args,
            {"solo": "solo@x.iam.gserviceaccount.com", "shared": "shared@x.iam.gserviceaccount.com"},
            needs,
        )

    result = build(program)
    bucket = one(result, "gcp:storage/bucket:Bucket")
    assert bucket.inputs["name"] == ENV.bucket_name("artifacts") and bucket.retain_on_delete
    assert one(result, "gcp:storage/bucketObject:BucketObject").inputs["name"] == f"sources/{agent.sha256}.tar.gz"
    grants = {
        r.name: r.inputs["condition"]["expression"]
        for r in result.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    }
    assert grants["artifacts-solo-sources"].endswith(f'/objects/sources/{agent.sha256}.tar.gz"')
    assert "startsWith" in grants["artifacts-shared-sources"]  # self-service: any archive researchers submit
    assert one(result, "gcp:artifactregistry/repository:Repository").inputs["repositoryId"] == f"tpu-{ENV.stack}"


def test_researcher_access_alone():
    from infra.researchers import ResearcherAccess, ResearcherArgs, SelfServiceVm, researcher_apis

    vm = SelfServiceVm("solo-vm", "solo", data=True, checkpoints=True, models=True)
    args = ResearcherArgs(
        members=("user:ada@acme.example",),
        vms=(vm,),
        status_bucket=ENV.bucket_name("status"),
        models_bucket=ENV.bucket_name("models"),
        artifacts_bucket=ENV.bucket_name("artifacts"),
        ssh=False,
    )
    result = build(lambda: ResearcherAccess("researchers", ENV, args, enabled(researcher_apis(args)), []))
    assert not result.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")  # the bootstrap makes the roles
    roles = {r.inputs["role"] for r in result.resources if "role" in r.inputs}
    assert f"projects/{ENV.project}/roles/tpuPlatformResearcherSolo" in roles
    members = {r.inputs["member"] for r in result.resources if "member" in r.inputs}
    assert members == {"user:ada@acme.example"}
    assert "iap.googleapis.com" not in researcher_apis(args)  # SSH off: no IAP, no OS Login


def gke_settings(**changes) -> GkeSettings:
    catalog = load_gke_catalog()
    v5e, tpu7x = catalog.accelerator("v5litepod-16"), catalog.accelerator("tpu7x-16")
    assert not isinstance(v5e, str) and not isinstance(tpu7x, str)
    settings = {
        "region": "us-central1",
        "node_cidr": "10.40.0.0/20",
        "pod_cidr": "10.44.0.0/14",
        "service_cidr": "10.48.0.0/20",
        "release_channel": "STABLE",
        "maintenance": MaintenanceWindow(days=("SU",), start_utc="03:00", hours=12),
        "tpu_pool_upgrades": "end-of-support",
        "system_pool": SystemPool(machine_type="e2-standard-8", nodes_per_zone=2),
        "slice_pools": (
            SlicePoolSettings(name="v5e", accelerator=v5e, zone="us-central1-a", provisioning="spot", slices=2),
            SlicePoolSettings(
                name="iron",
                accelerator=tpu7x,
                zone="us-central1-c",
                provisioning="reserved",
                reservation_name="iron-res",
            ),
        ),
    }
    return GkeSettings(**(settings | changes))


def gke_program():
    gke = gke_settings()

    def program() -> None:
        apis = enabled(NETWORK_APIS, GKE_APIS)
        ranges = ClusterRanges(gke.region, gke.node_cidr, gke.pod_cidr, gke.service_cidr)
        network = PrivateNetwork("net", ENV, NetworkSettings(subnets=(), flow_log_sampling=0.5), apis, cluster=ranges)
        cluster = GkeCluster("gke", ENV, GkeClusterArgs(gke), network, apis)
        for pool in gke.slice_pools:
            SlicePool(f"slices-{pool.name}", ENV, SlicePoolArgs(pool, gke.tpu_pool_upgrades), cluster, apis)

    return program


def test_gke_cluster_alone():
    result = build(gke_program())
    cluster = one(result, "gcp:container/cluster:Cluster").inputs
    assert (cluster["name"], cluster["location"]) == (naming.gke_cluster(ENV.stack), "us-central1")
    assert cluster["privateClusterConfig"]["enablePrivateNodes"] is True
    assert cluster["controlPlaneEndpointsConfig"]["ipEndpointsConfig"] == {"enabled": False}  # DNS endpoint only
    assert cluster["enableLegacyAbac"] is False
    assert cluster["workloadIdentityConfig"] == {"workloadPool": f"{ENV.project}.svc.id.goog"}
    assert cluster["datapathProvider"] == "ADVANCED_DATAPATH"
    assert cluster["releaseChannel"] == {"channel": "STABLE"}
    assert cluster["maintenancePolicy"]["recurringWindow"]["recurrence"] == "FREQ=WEEKLY;BYDAY=SU"
    assert (cluster["removeDefaultNodePool"], cluster["initialNodeCount"]) == (True, 1)
    nodes = f"{naming.platform_account_id('gke-nodes', ENV.stack)}@{ENV.project}.iam.gserviceaccount.com"
    assert cluster["nodeConfig"]["serviceAccount"] == nodes  # even the removed default pool: never Compute's
    assert cluster["nodeLocations"] == ["us-central1-a", "us-central1-c"]
    assert cluster["deletionProtection"] is False  # not production: `destroy` may remove it
    system = one(result, "gcp:container/nodePool:NodePool", "gke-system").inputs
    assert (system["name"], system["nodeCount"], system["nodeConfig"]["machineType"]) == ("system", 2, "e2-standard-8")
    assert system["nodeConfig"]["serviceAccount"] == nodes
    role = one(result, "gcp:projects/iAMMember:IAMMember").inputs
    assert (role["role"], role["member"]) == ("roles/container.defaultNodeServiceAccount", f"serviceAccount:{nodes}")
    # The account, and act-as on it, are the bootstrap's (infra/access/accounts.py).
    assert not result.of_type("gcp:serviceaccount/account:Account")
    assert not result.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    subnet = one(result, "gcp:compute/subnetwork:Subnetwork").inputs
    assert [r["rangeName"] for r in subnet["secondaryIpRanges"]] == ["pods", "services"]
    assert cluster["subnetwork"].endswith(f"/subnetworks/{naming.gke_subnet(ENV.stack)}")
    for dependency in ("gcp:compute/routerNat:RouterNat", "gcp:projects/iAMMember:IAMMember"):
        assert one(result, dependency).urn in one(result, "gcp:container/cluster:Cluster").dependencies
    assert depends_on(
        result,
        one(result, "gcp:container/cluster:Cluster"),
        one(result, "gcp:projects/service:Service", "apis-container").urn,
    )


def test_slice_pools_alone():
    result = build(gke_program())
    pools = {r.inputs["name"]: r for r in result.of_type("gcp:container/nodePool:NodePool")}
    assert set(pools) == {"system", "v5e-0", "v5e-1", "iron-0"}  # one node pool per slice
    v5e = pools["v5e-1"].inputs
    assert (v5e["nodeCount"], v5e["nodeLocations"], v5e["nodeConfig"]["spot"]) == (4, ["us-central1-a"], True)
    assert v5e["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
    assert v5e["maintenancePolicies"] == [{"exclusionUntilEndOfSupports": [{"enabled": True}]}]
    assert set(pools["v5e-1"].ignore_changes) >= {"nodeConfig.advancedMachineFeatures", "upgradeSettings"}
    policy = one(result, "gcp:compute/resourcePolicy:ResourcePolicy")
    assert policy.inputs["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    iron = pools["iron-0"]
    assert iron.inputs["placementPolicy"] == {"type": "", "policyName": policy.inputs["name"], "tpuTopology": "2x2x2"}
    assert iron.inputs["nodeConfig"]["reservationAffinity"]["values"] == ["iron-res"]
    assert policy.urn in iron.dependencies  # the policy exists before the pool names it
    assert one(result, "gcp:container/cluster:Cluster").urn in iron.dependencies


def test_the_gke_network_is_declared_only_with_the_cluster():
    result = build(lambda: PrivateNetwork("net", ENV, NETWORK, enabled(NETWORK_APIS)))
    assert [r.inputs["name"] for r in result.of_type("gcp:compute/subnetwork:Subnetwork")] == ["tpu-solo-europe-west4"]

"""The artifacts bucket, the image repository, who may read them, and the run spec in each VM's metadata."""

from __future__ import annotations

import io
import json
import shutil
import tarfile

import pytest

from infra import packaging, platform
from infra.access import iamdata
from infra.access.model import custom_roles, grants_to
from infra.artifacts import PULL_PERMISSIONS, SOURCE_METHODS
from infra.config import parse_stack_config
from infra.config.examples import examples
from infra.config.workload_code import REPO_ROOT
from infra.packaging import agent_wheelhouse, package, repository_folder
from infra.tpu import metadata as vm_metadata_module
from infra.tpu.metadata import RUN_ATTRIBUTE, run_spec, source_digests, vm_metadata
from tests.support import TF_MNIST_DEFAULT_COMMAND, depends_on, fixture_config, plan, with_object
from tools.offline.access import declared
from tools.offline.diff import diff_markdown
from tools.offline.render import to_json
from tools.offline.runner import run_program

DIGEST = "0123456789abcdef" * 4
TF_MNIST = examples()["tf_mnist"].folder  # the sources fixture's `mnist` (program: tf_mnist)
JAX_MNIST = examples()["jax_mnist"].folder  # and its `byo` (source: {folder: workloads/jax_mnist})
TF_SHA, JAX_SHA = repository_folder(TF_MNIST).sha256, repository_folder(JAX_MNIST).sha256
AGENT_SHA = vm_metadata_module.agent_package().sha256
WHEELHOUSE_SHA = agent_wheelhouse().sha256


@pytest.fixture
def repository_copy(tmp_path, monkeypatch):
    """A copy of the repository's agent and example folders under tmp_path, which the packager then reads
    (as a clean clone in CI would be); links stay links, as git checks them out."""
    for folder in (*vm_metadata_module.AGENT_PACKAGES, "workloads"):
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder, symlinks=True, ignore=ignore)
    for link in [p for p in tmp_path.rglob("*") if p.is_symlink()]:  # and the files they link to elsewhere
        target = (REPO_ROOT / link.relative_to(tmp_path)).resolve().relative_to(REPO_ROOT)
        if not (tmp_path / target).exists():
            (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / target, tmp_path / target)
    monkeypatch.setattr(packaging, "REPO_ROOT", tmp_path)
    packaging.repository_folder.cache_clear()
    packaging.repository_packages.cache_clear()
    yield tmp_path
    packaging.repository_folder.cache_clear()
    packaging.repository_packages.cache_clear()


def sources_plan():
    return plan(fixture_config("sources"), "sources")


def by_name(result, token):
    return {r.name: r for r in result.of_type(token)}


def test_the_artifacts_bucket_is_secured_like_the_others_and_kept():
    result = plan(fixture_config("scheduled"), "scheduled")
    bucket = by_name(result, "gcp:storage/bucket:Bucket")["artifacts-bucket"]
    assert bucket.inputs["name"] == "fixture-project-scheduled-artifacts"
    assert bucket.inputs["uniformBucketLevelAccess"] is True
    assert bucket.inputs["publicAccessPrevention"] == "enforced"
    assert bucket.inputs["versioning"] == {"enabled": True}
    assert bucket.retain_on_delete and not bucket.inputs["forceDestroy"]  # the fixture lists only checkpoints, models
    prod = by_name(plan(fixture_config("production"), "production"), "gcp:storage/bucket:Bucket")["artifacts-bucket"]
    key = parse_stack_config("production", fixture_config("production")).buckets.kms_key_name
    assert prod.inputs["encryption"] == {"defaultKmsKeyName": key}
    assert prod.protect and prod.retain_on_delete


def test_a_destroyable_artifacts_bucket_may_be_emptied_and_deleted():
    raw = with_object(fixture_config("sources"), "buckets", lambda b: b.update(destroyable=["artifacts"]))
    result = plan(raw, "sources")
    bucket = by_name(result, "gcp:storage/bucket:Bucket")["artifacts-bucket"]
    assert bucket.inputs["forceDestroy"] is True and not bucket.retain_on_delete
    (repository,) = result.of_type("gcp:artifactregistry/repository:Repository")
    assert not repository.retain_on_delete


def test_each_folder_is_one_object_named_by_its_content_and_kept_when_replaced():
    objects = by_name(sources_plan(), "gcp:storage/bucketObject:BucketObject")
    # mnist (program: tf_mnist) and byo (workloads/jax_mnist) run one folder each; the agent is the third, and
    # its wheelhouse (built before the plan, named by the digest requirements-agent.wheelhouse pins) the fourth.
    assert sorted(objects) == [
        "artifacts-source-workloads-jax-mnist",
        "artifacts-source-workloads-tf-mnist",
        "artifacts-vm-agent",
        "artifacts-vm-agent-wheelhouse",
    ]
    for key, name, sha in (
        ("source-workloads-tf-mnist", "sources", TF_SHA),
        ("source-workloads-jax-mnist", "sources", JAX_SHA),
        ("vm-agent", "runners", AGENT_SHA),  # the deployer's own prefix, which no researcher writes
        ("vm-agent-wheelhouse", "sources", WHEELHOUSE_SHA),
    ):
        archive = objects[f"artifacts-{key}"]
        assert archive.inputs["name"] == f"{name}/{sha}.tar.gz"
        assert archive.inputs["source"] == {"file": f"{sha}.tar.gz", "sha256": sha[:16]}
        assert archive.retain_on_delete  # old archives stay: rollbacks, audits, re-created VMs


def test_two_workloads_running_one_folder_share_one_archive():
    raw = with_object(fixture_config("sources"), "workloads", lambda w: w["byo"]["source"].update(folder=TF_MNIST))
    raw = with_object(raw, "workloads", lambda w: w["byo"].update(command=["python", "tf_mnist.py"]))
    objects = by_name(plan(raw, "sources"), "gcp:storage/bucketObject:BucketObject")
    assert sorted(objects) == [
        "artifacts-source-workloads-tf-mnist",
        "artifacts-vm-agent",
        "artifacts-vm-agent-wheelhouse",
    ]


def test_each_workload_reads_only_the_archives_it_runs_and_pulls_only_if_it_runs_an_image():
    result = sources_plan()
    resources = declared(result)
    bucket = "fixture-project-sources-artifacts"

    def objects(*digests: str) -> set[str]:
        return {
            f'resource.name == "projects/_/buckets/{bucket}/objects/{"runners" if sha == AGENT_SHA else "sources"}/'
            f'{sha}.tar.gz"'
            for sha in digests
        }

    # Every VM fetches the agent and its wheelhouse; a folder workload its own archive too; an image workload
    # no archive more.
    for workload, reads, pulls in (
        ("mnist", objects(TF_SHA, AGENT_SHA, WHEELHOUSE_SHA), False),
        ("byo", objects(JAX_SHA, AGENT_SHA, WHEELHOUSE_SHA), False),
        ("img", objects(AGENT_SHA, WHEELHOUSE_SHA), True),
    ):
        member = f"serviceAccount:tpu-{workload}-sources@fixture-project.iam.gserviceaccount.com"
        held = grants_to(member, resources, result.project, custom_roles(resources, result.project))
        sources = [g for g in held if g.scope == f"buckets/{bucket}"]
        assert [g.role for g in sources] == ["roles/storage.objectViewer"], workload
        assert set((sources[0].condition or "").split(" || ")) == reads, workload
        # What the VM calls to fetch an archive.
        needed = {p for m in SOURCE_METHODS for p in iamdata.method_permissions(m, acls=False)}
        assert needed <= sources[0].permissions, workload
        pulling = [g for g in held if g.scope.startswith("repositories/")]
        assert [g.role for g in pulling] == (["roles/artifactregistry.reader"] if pulls else []), workload
        if pulls:
            assert set(PULL_PERMISSIONS) <= pulling[0].permissions  # docker pull
        # Never on the project: Artifact Registry and Cloud Storage reads are granted on the resource only.
        on_project = {p for g in held if g.scope.startswith("projects/") for p in g.permissions}
        assert not {p for p in on_project if p.startswith(("artifactregistry.", "storage."))}, workload


def test_the_repository_keeps_what_the_stack_runs_scans_and_takes_the_stack_key():
    (repository,) = sources_plan().of_type("gcp:artifactregistry/repository:Repository")
    inputs = repository.inputs
    assert inputs["repositoryId"] == "tpu-sources" and inputs["format"] == "DOCKER"
    assert inputs["location"] == "us-central1"
    assert inputs["dockerConfig"] == {"immutableTags": True}
    assert inputs["vulnerabilityScanningConfig"] == {"enablementConfig": "INHERITED"}
    policies = {p["id"]: p for p in inputs["cleanupPolicies"]}
    assert policies["keep-used-by-stack"] == {
        "id": "keep-used-by-stack",
        "action": "KEEP",
        "condition": {"tagState": "ANY", "versionNamePrefixes": [f"sha256:{DIGEST}"]},
    }
    assert policies["delete-old-untagged"]["condition"] == {"tagState": "UNTAGGED", "olderThan": f"{30 * 86400}s"}
    assert policies["keep-newest"]["mostRecentVersions"] == {"keepCount": 10}
    # The workloads' repository (the guard's functions have their own).
    repositories = plan(fixture_config("production"), "production").of_type(
        "gcp:artifactregistry/repository:Repository"
    )
    (prod,) = [r for r in repositories if r.inputs["repositoryId"] == "tpu-production"]
    assert (
        prod.inputs["kmsKeyName"] == parse_stack_config("production", fixture_config("production")).buckets.kms_key_name
    )
    assert prod.protect


def test_a_vm_waits_for_its_workloads_source_grant():
    result = sources_plan()
    (vm,) = result.of_type("gcp:tpu/v2Vm:V2Vm")
    grant = by_name(result, "gcp:storage/bucketIAMMember:BucketIAMMember")["artifacts-mnist-sources"]
    assert depends_on(result, vm, grant.urn)


def test_the_agent_is_the_real_vm_agent_package_and_readable_by_every_workload():
    cfg = parse_stack_config("sources", fixture_config("sources"))
    args = platform.artifacts_args(cfg, source_digests(cfg))
    agent = args.packages["vm-agent"]
    assert agent.sha256 == AGENT_SHA
    with tarfile.open(fileobj=io.BytesIO(agent.data)) as tar:
        names = set(tar.getnames())
    # The agent's package and the run contract's, side by side (the start-up script unpacks both).
    agent_files = {f"vm_agent/{name}" for name in ("__init__.py", "__main__.py", "agent.py", "runner.py", "sources.py")}
    assert agent_files | {"run_contract/__init__.py", "run_contract/spec.py"} <= names
    assert {w: code.packages for w, code in args.workloads.items()} == {
        "byo": ("vm-agent", "vm-agent-wheelhouse", "source-workloads-jax-mnist"),
        "img": ("vm-agent", "vm-agent-wheelhouse"),
        "mnist": ("vm-agent", "vm-agent-wheelhouse", "source-workloads-tf-mnist"),
    }
    # The wheelhouse is uploaded from where `make agent-wheelhouse` built it; the plan never reads its bytes.
    wheelhouse = args.packages["vm-agent-wheelhouse"]
    assert wheelhouse.sha256 == WHEELHOUSE_SHA and wheelhouse.data == b""
    assert wheelhouse.built == REPO_ROOT / "build" / "agent-wheelhouse" / f"{WHEELHOUSE_SHA}.tar.gz"


# --- the run spec -----------------------------------------------------------------------------------


def test_the_run_spec_in_metadata_is_the_designs():
    cfg = parse_stack_config("scheduled", fixture_config("scheduled"))
    (vm,) = cfg.tpu_vms
    spec = json.loads(vm_metadata(cfg)[vm.name][RUN_ATTRIBUTE])
    assert spec == {
        "runId": "scheduled/mnist/office-v2/r1",
        "source": {
            "kind": "folder",
            "uri": f"gs://fixture-project-scheduled-artifacts/sources/{TF_SHA}.tar.gz",
            "sha256": TF_SHA,
        },
        "command": list(TF_MNIST_DEFAULT_COMMAND),
        "env": {},
        "requester": "stack",
        "data": "gs://fixture-project-scheduled-data/mnist/mnist.npz",
        "checkpointDir": "gs://fixture-project-scheduled-checkpoints/mnist/office-v2/r1",
        "modelDir": "gs://fixture-project-scheduled-models/mnist/office-v2/r1",
        "completion": True,
    }


def test_an_image_run_spec_names_the_image_and_a_folder_one_its_python():
    cfg = parse_stack_config("sources", fixture_config("sources"))
    (vm,) = cfg.tpu_vms
    image_vm = vm.model_copy(update={"workload": "img"})
    folder_vm = vm.model_copy(update={"workload": "byo"})
    image = run_spec(cfg, image_vm, {})
    assert image["source"] == {
        "kind": "image",
        "image": f"us-central1-docker.pkg.dev/fixture-project/tpu-sources/trainer@sha256:{DIGEST}",
    }
    assert image["command"] == ["python", "-m", "trainer", "--steps", "100"] and "python" not in image
    folder = run_spec(cfg, folder_vm, source_digests(cfg))
    assert folder["python"] == "3.11" and folder["env"] == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    assert folder["source"]["sha256"] == JAX_SHA


def test_a_secret_in_a_workloads_env_never_reaches_metadata():
    from infra.config.problems import ConfigError
    from infra.platform import refuse_secrets_in_metadata

    raw = with_object(
        fixture_config("scheduled"), "workloads", lambda w: w["mnist"].update(env={"TOKEN": "s3cr3t-value"})
    )
    cfg = parse_stack_config("scheduled", raw)
    metadata = vm_metadata(cfg)
    # Only the run spec carries a workload's env: the existing refusal reads every metadata value.
    assert [k for k, v in metadata["office-v2"].items() if "s3cr3t-value" in v] == [RUN_ATTRIBUTE]
    with pytest.raises(ConfigError, match="a value marked secure would reach the metadata of TPU VM office-v2"):
        refuse_secrets_in_metadata(cfg, metadata, {"s3cr3t-value": "tpu-platform:workloads.mnist.env.TOKEN"})


# --- a new run without a reboot: only metadata changes -------------------------------------------------


def as_json(result) -> dict:
    return json.loads(json.dumps(to_json(result), default=str))


def test_a_changed_command_or_env_updates_only_the_vms_metadata():
    base = as_json(plan(fixture_config("scheduled"), "scheduled"))
    head = as_json(
        plan(
            with_object(fixture_config("scheduled"), "workloads", lambda w: w["mnist"].update(env={"SEED": "7"})),
            "scheduled",
        )
    )
    markdown = diff_markdown(base, head)
    assert "+- 0 to replace" in markdown and "~ 1 to update" in markdown, markdown
    assert "  - `inputs.metadata.tpu-platform-run`:" in markdown
    assert "forces replacement" not in markdown


def test_a_changed_source_folder_is_a_new_archive_and_only_a_metadata_update_of_the_vm(repository_copy):
    packaging.repository_folder.cache_clear()  # the base plan reads the checkout, the head its changed copy
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packaging, "REPO_ROOT", REPO_ROOT)
        base = as_json(run_program("scheduled", fixture_config("scheduled")))
    packaging.repository_folder.cache_clear()
    copy = repository_copy / TF_MNIST
    (copy / "requirements.txt").write_text((copy / "requirements.txt").read_text() + "# one more line\n")
    head = as_json(run_program("scheduled", fixture_config("scheduled")))
    markdown = diff_markdown(base, head)
    replaced = markdown.split("#### +- Replace (destroyed and created again)\n", 1)[1].split("####")[0]
    # The archive has a new name (the old one is kept: retain_on_delete); the grant names the new object.
    assert "`artifacts-source-workloads-tf-mnist` (gcp:storage/bucketObject:BucketObject)" in replaced
    assert "`artifacts-mnist-sources` (gcp:storage/bucketIAMMember:BucketIAMMember)" in replaced
    assert "V2Vm" not in replaced
    assert "+ 0 to create, ~ 1 to update, +- 2 to replace, - 0 to delete" in markdown
    updated = markdown.split("#### ~ Update in place\n", 1)[1]
    assert "`tpu-office-v2-node` (gcp:tpu/v2Vm:V2Vm)" in updated
    vm_lines = updated.split("`tpu-office-v2-node`", 1)[1].split("\n- `", 1)[0]
    assert "inputs.metadata.tpu-platform-run" in vm_lines
    assert "startup-script" not in vm_lines and "forces replacement" not in vm_lines


def test_the_deployer_of_a_stack_with_an_image_may_grant_pulls_on_the_repository_only():
    """What `pulumi up` calls for the repository and its pull grant, from the mapping in infra/access/calls.py."""
    from infra.access.environment import Plan, environment_access
    from tools.offline.access import identities_of

    result = sources_plan()
    plans = [Plan(declared(result), result.invokes)]
    access = environment_access("sources", result.project, plans, None, identities_of("sources", result.config))
    assert {
        "artifactregistry.repositories.create",
        "artifactregistry.repositories.get",
        "artifactregistry.repositories.update",
        "artifactregistry.repositories.delete",
        "artifactregistry.repositories.getIamPolicy",
        "artifactregistry.repositories.setIamPolicy",
    } <= set(access.deployer_permissions)
    # A repository grant is no project grant: the limited project IAM admin is not widened by it.
    assert "roles/artifactregistry.reader" not in access.grantable_roles
    assert "artifactregistry.repositories.get" in access.previewer_permissions


def test_a_folder_that_cannot_be_packaged_is_a_config_error_naming_the_workload(repository_copy):
    from infra.config.problems import ConfigError

    (repository_copy / TF_MNIST / "data").symlink_to("/etc")
    cfg = parse_stack_config("sources", fixture_config("sources"))
    with pytest.raises(ConfigError) as caught:
        source_digests(cfg)
    message = str(caught.value)
    assert "tpu-platform:workloads.mnist.program = 'tf_mnist': cannot be packaged" in message
    assert "data is a symbolic link" in message


def test_two_folders_that_would_share_a_resource_name_are_refused(repository_copy):
    from infra.config import ConfigError

    for folder in ("a/b", "a-b"):
        (repository_copy / folder).mkdir(parents=True)
        (repository_copy / folder / "train.py").write_text("")
    cfg = parse_stack_config("sources", fixture_config("sources"))
    with pytest.raises(ConfigError, match="source folders a-b and a/b would share the resource name source-a-b"):
        digests = {folder: package(repository_copy / folder).sha256 for folder in ("a/b", "a-b")}
        platform.artifacts_args(cfg, digests)

"""The artifacts bucket, the image repository, who may read them, and the run spec in each VM's metadata."""

from __future__ import annotations

import json
import shutil

import pytest

from infra import platform
from infra.access import iamdata
from infra.access.model import custom_roles, grants_to
from infra.artifacts import PULL_PERMISSIONS, SOURCE_METHODS
from infra.config import parse_stack_config
from infra.config.model import PROGRAM_FOLDER
from infra.config.sources import REPO_ROOT
from infra.packaging import package
from infra.tpu import metadata as vm_metadata_module
from infra.tpu.metadata import RUN_ATTRIBUTE, run_spec, source_digests, vm_metadata
from tests.support import depends_on, fixture_config, plan, stack_config, with_object
from tools.offline.access import declared
from tools.offline.diff import diff_markdown
from tools.offline.render import to_json
from tools.offline.runner import plan_stack, run_program

DIGEST = "0123456789abcdef" * 4
WORKLOADS_SHA = package(REPO_ROOT / PROGRAM_FOLDER).sha256


def sources_plan():
    return plan(fixture_config("sources"), "sources")


def by_name(result, token):
    return {r.name: r for r in result.of_type(token)}


def test_the_artifacts_bucket_is_secured_like_the_others_and_kept():
    result = plan_stack("dev")
    bucket = by_name(result, "gcp:storage/bucket:Bucket")["artifacts-bucket"]
    assert bucket.inputs["name"] == "acme-ml-sandbox-dev-artifacts"
    assert bucket.inputs["uniformBucketLevelAccess"] is True
    assert bucket.inputs["publicAccessPrevention"] == "enforced"
    assert bucket.inputs["versioning"] == {"enabled": True}
    assert bucket.retain_on_delete and not bucket.inputs["forceDestroy"]  # dev lists only checkpoints, models
    prod = by_name(plan_stack("prod"), "gcp:storage/bucket:Bucket")["artifacts-bucket"]
    key = parse_stack_config("prod", stack_config("prod")).buckets.kms_key_name
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
    # mnist (program) and byo both run the folder `workloads`: one archive.
    assert list(objects) == ["artifacts-source-workloads"]
    archive = objects["artifacts-source-workloads"]
    assert archive.inputs["name"] == f"sources/{WORKLOADS_SHA}.tar.gz"
    assert archive.inputs["source"] == {"file": f"{WORKLOADS_SHA}.tar.gz", "sha256": WORKLOADS_SHA[:16]}
    assert archive.retain_on_delete  # old archives stay: rollbacks, audits, re-created VMs


def test_each_workload_reads_only_the_archives_it_runs_and_pulls_only_if_it_runs_an_image():
    result = sources_plan()
    resources = declared(result)
    bucket = "fixture-project-sources-artifacts"
    objects = f"projects/_/buckets/{bucket}/objects/sources/{WORKLOADS_SHA}.tar.gz"
    for workload, reads, pulls in (("mnist", True, False), ("byo", True, False), ("img", False, True)):
        member = f"serviceAccount:tpu-{workload}-sources@fixture-project.iam.gserviceaccount.com"
        held = grants_to(member, resources, result.project, custom_roles(resources, result.project))
        sources = [g for g in held if g.scope == f"buckets/{bucket}"]
        assert [(g.role, g.condition) for g in sources] == (
            [("roles/storage.objectViewer", f'resource.name == "{objects}"')] if reads else []
        ), workload
        if reads:  # what the VM calls to fetch its archive
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
    (prod,) = plan_stack("prod").of_type("gcp:artifactregistry/repository:Repository")
    assert prod.inputs["kmsKeyName"] == parse_stack_config("prod", stack_config("prod")).buckets.kms_key_name
    assert prod.protect


def test_a_vm_waits_for_its_workloads_source_grant():
    result = sources_plan()
    (vm,) = result.of_type("gcp:tpu/v2Vm:V2Vm")
    grant = by_name(result, "gcp:storage/bucketIAMMember:BucketIAMMember")["artifacts-mnist-sources"]
    assert depends_on(result, vm, grant.urn)


def test_the_agent_folder_is_packaged_and_readable_by_every_workload_once_it_exists(tmp_path, monkeypatch):
    agent = tmp_path / vm_metadata_module.AGENT_FOLDER
    agent.mkdir()
    (agent / "__main__.py").write_text("print('agent')\n")  # a placeholder: the real agent is another branch's
    shutil.copytree(REPO_ROOT / PROGRAM_FOLDER, tmp_path / PROGRAM_FOLDER)
    monkeypatch.setattr(platform, "REPO_ROOT", tmp_path)
    cfg = parse_stack_config("sources", fixture_config("sources"))
    args = platform.artifacts_args(cfg, source_digests(cfg))
    assert args.packages["vm-agent"].sha256 == package(agent).sha256
    assert {w: code.packages for w, code in args.workloads.items()} == {
        "byo": ("vm-agent", "source-workloads"),
        "img": ("vm-agent",),
        "mnist": ("vm-agent", "source-workloads"),
    }


# --- the run spec -----------------------------------------------------------------------------------


def test_the_run_spec_in_metadata_is_the_designs():
    cfg = parse_stack_config("dev", stack_config("dev"))
    (vm,) = cfg.tpu_vms
    spec = json.loads(vm_metadata(cfg)[vm.name][RUN_ATTRIBUTE])
    assert spec == {
        "runId": "dev/mnist/mnist-v2-spot/r1",
        "source": {
            "kind": "folder",
            "uri": f"gs://acme-ml-sandbox-dev-artifacts/sources/{WORKLOADS_SHA}.tar.gz",
            "sha256": WORKLOADS_SHA,
        },
        "command": ["python", "tf_mnist.py", "--epochs", "5", "--batch-size", "256",
                    "--checkpoint-every-steps", "200", "--checkpoint-every-minutes", "10"],
        "env": {},
        "requester": "stack",
        "data": "gs://acme-ml-sandbox-dev-data/mnist/mnist.npz",
        "checkpointDir": "gs://acme-ml-sandbox-dev-checkpoints/mnist/mnist-v2-spot/r1",
        "modelDir": "gs://acme-ml-sandbox-dev-models/mnist/mnist-v2-spot/r1",
        "completion": True,
    }  # fmt: skip


def test_an_image_run_spec_names_the_image_and_a_folder_one_its_python():
    cfg = parse_stack_config("sources", fixture_config("sources"))
    (vm,) = cfg.tpu_vms
    image_vm = type(vm)(**{**vm.__dict__, "workload": "img"})
    folder_vm = type(vm)(**{**vm.__dict__, "workload": "byo"})
    image = run_spec(cfg, image_vm, {})
    assert image["source"] == {
        "kind": "image",
        "image": f"us-central1-docker.pkg.dev/fixture-project/tpu-sources/trainer@sha256:{DIGEST}",
    }
    assert image["command"] == ["python", "-m", "trainer", "--steps", "100"] and "python" not in image
    folder = run_spec(cfg, folder_vm, source_digests(cfg))
    assert folder["python"] == "3.11" and folder["env"] == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    assert folder["source"]["sha256"] == WORKLOADS_SHA


def test_a_secret_in_a_workloads_env_never_reaches_metadata():
    from infra.platform import refuse_secrets_in_metadata
    from infra.schema import ConfigError

    raw = with_object(stack_config("dev"), "workloads", lambda w: w["mnist"].update(env={"TOKEN": "s3cr3t-value"}))
    cfg = parse_stack_config("dev", raw)
    metadata = vm_metadata(cfg)
    # Only the run spec carries a workload's env: the existing refusal reads every metadata value.
    assert [k for k, v in metadata["mnist-v2-spot"].items() if "s3cr3t-value" in v] == [RUN_ATTRIBUTE]
    with pytest.raises(ConfigError, match="a value marked secure would reach the metadata of TPU VM mnist-v2-spot"):
        refuse_secrets_in_metadata(cfg, metadata, {"s3cr3t-value": "tpu-platform:workloads.mnist.env.TOKEN"})


# --- a new run without a reboot: only metadata changes -------------------------------------------------


def as_json(result) -> dict:
    return json.loads(json.dumps(to_json(result), default=str))


def test_a_changed_command_or_env_updates_only_the_vms_metadata():
    base = as_json(plan_stack("dev"))
    head = as_json(plan(with_object(stack_config("dev"), "workloads", lambda w: w["mnist"].update(env={"SEED": "7"}))))
    markdown = diff_markdown(base, head)
    assert "+- 0 to replace" in markdown and "~ 1 to update" in markdown, markdown
    assert "  - `inputs.metadata.tpu-platform-run`:" in markdown
    assert "forces replacement" not in markdown


def test_a_changed_source_folder_is_a_new_archive_and_only_a_metadata_update_of_the_vm(tmp_path, monkeypatch):
    base = as_json(plan_stack("dev"))
    copy = tmp_path / PROGRAM_FOLDER
    shutil.copytree(REPO_ROOT / PROGRAM_FOLDER, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (copy / "README.md").write_text((copy / "README.md").read_text() + "one more line\n")
    monkeypatch.setattr(platform, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(vm_metadata_module, "REPO_ROOT", tmp_path)
    head = as_json(run_program("dev", stack_config("dev")))
    markdown = diff_markdown(base, head)
    replaced = markdown.split("#### +- Replace (destroyed and created again)\n", 1)[1].split("####")[0]
    # The archive has a new name (the old one is kept: retain_on_delete); the grant names the new object.
    assert "`artifacts-source-workloads` (gcp:storage/bucketObject:BucketObject)" in replaced
    assert "`artifacts-mnist-sources` (gcp:storage/bucketIAMMember:BucketIAMMember)" in replaced
    assert "V2Vm" not in replaced
    assert "+ 0 to create, ~ 1 to update, +- 2 to replace, - 0 to delete" in markdown
    updated = markdown.split("#### ~ Update in place\n", 1)[1]
    assert "`tpu-mnist-v2-spot-node` (gcp:tpu/v2Vm:V2Vm)" in updated
    vm_lines = updated.split("`tpu-mnist-v2-spot-node`", 1)[1].split("\n- `", 1)[0]
    assert "inputs.metadata.tpu-platform-run" in vm_lines
    assert "startup-script" not in vm_lines and "forces replacement" not in vm_lines


def test_the_deployer_of_a_stack_with_an_image_may_grant_pulls_on_the_repository_only():
    """What `pulumi up` calls for the repository and its pull grant, from the mapping in infra/access/calls.py."""
    from infra.access.environment import environment_access

    result = sources_plan()
    access = environment_access("sources", result.project, declared(result), result.invokes)
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


def test_a_folder_that_cannot_be_packaged_is_a_config_error_naming_the_workload(tmp_path, monkeypatch):
    from infra.schema import ConfigError

    shutil.copytree(REPO_ROOT / PROGRAM_FOLDER, tmp_path / PROGRAM_FOLDER)
    (tmp_path / PROGRAM_FOLDER / "data").symlink_to("/etc")
    monkeypatch.setattr(vm_metadata_module, "REPO_ROOT", tmp_path)
    cfg = parse_stack_config("sources", fixture_config("sources"))
    with pytest.raises(ConfigError) as caught:
        source_digests(cfg)
    message = str(caught.value)
    assert "tpu-platform:workloads.mnist.program = 'tf_mnist': cannot be packaged" in message
    assert "data is a symbolic link" in message


def test_two_folders_that_would_share_a_resource_name_are_refused(tmp_path, monkeypatch):
    from infra.config import ConfigError

    for folder in ("a/b", "a-b"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "train.py").write_text("")
    monkeypatch.setattr(platform, "REPO_ROOT", tmp_path)
    cfg = parse_stack_config("sources", fixture_config("sources"))
    with pytest.raises(ConfigError, match="source folders a-b and a/b would share the resource name source-a-b"):
        platform.artifacts_args(cfg, {"a/b": package(tmp_path / "a/b").sha256, "a-b": package(tmp_path / "a-b").sha256})

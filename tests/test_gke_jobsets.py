"""A team's JobSet as the platform renders it: its queue, its identity, its slices, nothing privileged,
and what its team's queue and the schemas make of it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from infra import naming
from infra.gke import queues
from infra.gke.jobsets import FETCH_CONTAINER, RUN_LABEL, FolderRun, run_jobset, team_jobset
from infra.gke.quota import pod_sets
from infra.gke.specs import SliceShape
from infra.gke.validation import platform_validator, validate_all
from infra.startup import Artifact
from run_contract.names import worker_place
from run_contract.spec import FolderSource, ImageSource, RunSpec
from tests import gke_objects as g


def render(**changes):
    return team_jobset(g.VISION, g.V5E_16_SPOT, "train-1", image=g.IMAGE, command=["python", "t.py"], **changes)


def test_one_pod_per_vm_of_each_slice_asking_for_the_vms_chips():
    (pods,) = pod_sets(render(slices=2))
    assert (pods.pods, pods.chips_per_pod, pods.chips) == (8, 4, 32)
    assert pods.node_selector == g.V5E_16_SPOT.node_labels


def test_it_runs_as_the_teams_account_in_its_queue_and_asks_for_nothing_privileged():
    jobset = render()
    assert jobset["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "vision"}
    assert jobset["metadata"]["namespace"] == "team-vision"
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == naming.TEAM_SERVICE_ACCOUNT
    assert "hostNetwork" not in pod and "securityContext" not in pod
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False}
    assert render(queued=False)["metadata"]["labels"] == {}


def test_it_passes_the_schemas_and_its_queue_admits_it():
    report = validate_all(platform_validator(), [*g.queue_objects(), render()], g.SHAPES)
    assert report.ok, report.findings
    too_big = team_jobset(g.VISION, g.V5E_16_SPOT, "big", image=g.IMAGE, command=["x"], slices=2)
    found = [str(f) for f in validate_all(platform_validator(), [*g.queue_objects(), too_big], g.SHAPES).findings]
    assert found == [
        "JobSet/team-vision/big: spec.replicatedJobs: asks 32 TPU chips; ClusterQueue 'vision' can admit at most 16 "
        "(its nominal quota plus what it may borrow in its cohort)"
    ]


# --- A researcher's run spec as a JobSet ------------------------------------------------------------------

SINGLE_HOST = SliceShape("tpu-v5-lite-podslice", "2x4", "ct5lp-hightpu-8t", 8, 1, 1, "on-demand")
RUN_TEAM = g.VISION.model_copy(update={"nominal_chips": (("v5e", 16), ("iron", 8), ("one", 8))})
SHAPES_BY_KIND = {  # (pool, shape, slices)
    "single-host": ("one", SINGLE_HOST, 1),
    "multi-host": ("v5e", g.V5E_16_SPOT, 1),
    "multislice": ("v6e", g.V6E_16_FLEX, 2),
}


def a_run(run_id: str = "exp-1", **changes: Any) -> RunSpec:
    fields: dict[str, Any] = {
        "source": ImageSource(g.IMAGE),
        "command": ("python3", "train.py"),  # python3: a folder runs in g.FOLDER_IMAGE, which has no `python`
        "requester": "user:ada@example.com",
        "env": (("EPOCHS", "3"),),
    }
    return RunSpec(run_id=run_id, **{**fields, **changes})


RUNNER = Artifact("acme-artifacts", "runners/" + "e" * 64 + ".tar.gz", "e" * 64)
FOLDER = FolderSource("gs://acme-artifacts/teams/vision/sources/" + "f" * 64 + ".tar.gz", "f" * 64)


IMAGE_SOURCE = ImageSource(g.IMAGE)


def run_render(kind: str, source: ImageSource | FolderSource = IMAGE_SOURCE) -> dict[str, Any]:
    _, shape, slices = SHAPES_BY_KIND[kind]
    team = g.NLP.model_copy(update={"nominal_chips": (("v6e", 32),)}) if kind == "multislice" else RUN_TEAM
    folder = FolderRun(g.FOLDER_IMAGE, RUNNER)
    run = a_run(source=source)
    return run_jobset(run, team, shape, checkpoints="ckpt", models="models", slices=slices, folder=folder)


def run_queue_objects() -> list[dict[str, Any]]:
    pools = {**g.POOLS, "one": SINGLE_HOST}
    return queues.queue_objects((RUN_TEAM, g.NLP), pools)


@pytest.mark.parametrize("source", [IMAGE_SOURCE, FOLDER], ids=["image", "folder"])
@pytest.mark.parametrize("kind", SHAPES_BY_KIND)
def test_a_run_spec_renders_a_jobset_that_passes_the_schemas_and_its_queue_admits(kind: str, source):
    jobset = run_render(kind, source)
    pools = (*g.SHAPES, SINGLE_HOST)
    report = validate_all(platform_validator(), [*run_queue_objects(), jobset], pools)
    assert report.ok, report.findings
    (pods,) = pod_sets(jobset)
    _, shape, slices = SHAPES_BY_KIND[kind]
    assert (pods.pods, pods.chips_per_pod) == (shape.vms_per_slice * slices, shape.chips_per_vm)
    assert jobset["metadata"]["name"] == "exp-1" and jobset["metadata"]["labels"][RUN_LABEL] == "exp-1"


def _pod(jobset: dict[str, Any]) -> dict[str, Any]:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_the_pods_get_the_run_contracts_environment_with_the_teams_folders():
    jobset = run_render("multi-host")
    env = {e["name"]: e["value"] for e in _pod(jobset)["containers"][0]["env"]}
    assert env["TPU_PLATFORM_CHECKPOINT_DIR"] == "gs://ckpt/teams/vision/exp-1/"
    assert env["TPU_PLATFORM_MODEL_DIR"] == "gs://models/teams/vision/exp-1/"
    assert env["EPOCHS"] == "3"
    # The worker's place is GKE's to inject, into an Indexed Job of more than one pod asking for
    # google.com/tpu (gke-tpu reference, "The JobSet"): the JobSet says none of it, so none can disagree.
    assert not {*env} & {"TPU_PLATFORM_WORKER_ID", "TPU_PLATFORM_WORKER_COUNT", "TPU_PLATFORM_COORDINATOR"}
    assert not {*env} & {"TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES"}
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (job["completionMode"], job["parallelism"]) == ("Indexed", 4)
    assert _pod(jobset)["containers"][0]["resources"]["limits"]["google.com/tpu"] == 4
    single = {e["name"]: e.get("value") for e in _pod(run_render("single-host"))["containers"][0]["env"]}
    assert _pod(run_render("single-host"))["terminationGracePeriodSeconds"] == int(single["TPU_PLATFORM_GRACE_SECONDS"])


def test_an_image_by_tag_or_a_folder_source_without_the_stacks_folder_image_is_not_rendered():
    folder = a_run(source=FolderSource("gs://artifacts/teams/vision/sources/x.tar.gz", "0" * 64))
    with pytest.raises(ValueError, match=r"a folder source needs the stack's gke\.folderImage"):
        run_jobset(folder, RUN_TEAM, g.V5E_16_SPOT, checkpoints="c", models="m")
    tagged = a_run(source=ImageSource("us-docker.pkg.dev/acme/train:latest", allow_tag=True))
    with pytest.raises(ValueError, match="pinned by digest"):
        run_jobset(tagged, RUN_TEAM, g.V5E_16_SPOT, checkpoints="c", models="m")


# How a pod's end becomes the JobSet's action: the Job controller's podFailurePolicy (its reason and, for a
# FailJob rule, its message, kubernetes/kubernetes pkg/controller/job/pod_failure_policy.go), then the JobSet's
# rules in order (reasons, then message patterns), RestartJobSet when none matches (JobSet "Failure Policy").


def _job_failure(
    job: dict[str, Any], exit_code: int, conditions: tuple[str, ...], container: str = "main"
) -> tuple[str, str] | None:
    if exit_code == 0 and not conditions:
        return None
    for index, rule in enumerate(job["podFailurePolicy"]["rules"]):
        codes = rule.get("onExitCodes")
        if codes and exit_code != 0 and codes.get("containerName", container) == container:
            hit = (exit_code in codes["values"]) == (codes["operator"] == "In")
            if hit and rule["action"] == "FailJob":
                why = f"failed with exit code {exit_code} matching FailJob rule at index {index}"
                return "PodFailurePolicy", f"Container {container} for pod ns/p {why}"
        for pattern in rule.get("onPodConditions", ()):
            if pattern["type"] in conditions and rule["action"] == "FailJob":
                return (
                    "PodFailurePolicy",
                    f"Pod ns/p has condition {pattern['type']} matching FailJob rule at index {index}",
                )
    return "BackoffLimitExceeded", "Job has reached the specified backoff limit"  # backoffLimit 0


def jobset_action(exit_code: int, *conditions: str, container: str = "main", jobset: Any = None) -> str | None:
    jobset = jobset or run_render("multi-host")
    failure = _job_failure(jobset["spec"]["replicatedJobs"][0]["template"]["spec"], exit_code, conditions, container)
    if failure is None:
        return None
    reason, message = failure
    for rule in jobset["spec"]["failurePolicy"]["rules"]:
        if reason not in rule.get("onJobFailureReasons", [reason]):
            continue
        patterns = rule.get("onJobFailureMessagePatterns")
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        return rule["action"]
    return "RestartJobSet"


def test_the_run_contracts_exit_codes_hold_in_pods():
    assert jobset_action(0) is None
    assert jobset_action(78) == "FailJobSet"  # the run cannot succeed: never retried
    assert jobset_action(75) == "RestartJobSet"  # checkpointed, retried: counted, as the VM agent counts
    assert jobset_action(1) == "RestartJobSet"
    # A node lost (spot reclaim, drain): a restart that spends none of maxRestarts, whatever the exit code.
    assert jobset_action(143, "DisruptionTarget") == "RestartJobSetAndIgnoreMaxRestarts"
    assert jobset_action(75, "DisruptionTarget") == "RestartJobSetAndIgnoreMaxRestarts"
    assert run_render("multi-host")["spec"]["failurePolicy"]["maxRestarts"] == 3


def test_a_folder_sources_fetch_step_that_refuses_its_archives_fails_the_run_at_once():
    folder = run_render("multi-host", FOLDER)
    assert jobset_action(78, container=FETCH_CONTAINER, jobset=folder) == "FailJobSet"  # a digest that does not match
    assert jobset_action(1, container=FETCH_CONTAINER, jobset=folder) == "RestartJobSet"  # anything else: retried
    assert jobset_action(78, container=FETCH_CONTAINER) == "RestartJobSet"  # an image's pod has no such step
    # The program's own codes hold as for an image.
    assert jobset_action(78, jobset=folder) == "FailJobSet" and jobset_action(75, jobset=folder) == "RestartJobSet"


def exit_code_of(script: str, function: str) -> int:
    """The status a shell function of `script` ends it with (`fatal`, `retryable`)."""
    body = re.search(rf"^{function}\(\) {{\n(.*?)^}}", script, re.MULTILINE | re.DOTALL)
    assert body, f"the script has no {function}()"
    (code,) = re.findall(r"exit (\d+)", body.group(1))
    return int(code)


def test_the_fetch_steps_refusals_fail_the_run_and_what_may_heal_is_retried_within_its_restarts():
    """The codes the rendered step itself exits with: a refusal (`fatal`) is the rule's 78; a read that still
    fails after curl's retries (`retryable`) matches no rule, so the JobSet restarts the run, counted."""
    folder = run_render("multi-host", FOLDER)
    script = _pod(folder)["initContainers"][0]["command"][2]
    refused, may_heal = exit_code_of(script, "fatal"), exit_code_of(script, "retryable")
    assert jobset_action(refused, container=FETCH_CONTAINER, jobset=folder) == "FailJobSet"
    assert jobset_action(may_heal, container=FETCH_CONTAINER, jobset=folder) == "RestartJobSet"
    assert (refused, may_heal) == (78, 75)  # the run contract's EX_CONFIG and EX_TEMPFAIL


def test_a_folder_source_runs_in_the_stacks_image_from_the_folder_its_fetch_step_checked():
    jobset = run_render("multi-host", FOLDER)
    pod = _pod(jobset)
    (fetch,) = pod["initContainers"]
    (main,) = pod["containers"]
    assert fetch["name"] == FETCH_CONTAINER and fetch["image"] == main["image"] == g.FOLDER_IMAGE
    assert pod["volumes"] == [{"name": "source", "emptyDir": {}}]
    assert fetch["volumeMounts"] == [{"name": "source", "mountPath": "/tpu-platform"}]
    assert main["volumeMounts"] == [{"name": "source", "mountPath": "/tpu-platform", "readOnly": True}]
    assert main["workingDir"] == "/tpu-platform/source" and main["command"] == ["python3", "train.py"]
    script = fetch["command"][2]
    assert fetch["command"][:2] == ["bash", "-c"]
    assert f"storage/v1/b/acme-artifacts/o/runners%2F{'e' * 64}.tar.gz?alt=media" in script
    assert f"storage/v1/b/acme-artifacts/o/teams%2Fvision%2Fsources%2F{'f' * 64}.tar.gz?alt=media" in script
    assert script.count("e" * 64) >= 3 and script.count("f" * 64) >= 3  # fetched, checked, unpacked by digest
    # The contract's environment is the image's, and the fetch step holds none of it.
    assert _env(jobset).keys() == _env(run_render("multi-host")).keys() and "env" not in fetch
    assert "initContainers" not in _pod(run_render("multi-host")) and "volumes" not in _pod(run_render("multi-host"))


# --- Multislice: what joins the slices (MEGASCALE_*), and the contract's place from it ---------------------


def _env(jobset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _pod(jobset)["containers"][0]["env"]}


def test_a_multislice_run_tells_each_pod_the_slices_its_own_and_where_slice_0_waits():
    env = _env(run_render("multislice"))
    assert env["MEGASCALE_NUM_SLICES"] == {"name": "MEGASCALE_NUM_SLICES", "value": "2"}
    assert env["MEGASCALE_SLICE_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}
    }
    assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == "exp-1-slice-0-0.exp-1"  # JobSet's host of slice 0, pod 0
    assert env["MEGASCALE_PORT"]["value"] == "8081"
    for kind in ("single-host", "multi-host"):  # one slice: nothing to join
        assert not [name for name in _env(run_render(kind)) if name.startswith("MEGASCALE_")]


def test_every_pod_of_a_multislice_run_finds_a_place_of_its_own_in_one_world():
    """Each pod's environment as it would be: the JobSet's variables, its slice id from its Job's index label
    (the downward API), and what GKE injects into a pod of an Indexed Job (its index, its slice's hosts, worker
    0 first, under JobSet's host names); the run contract then gives every pod of every slice its own place,
    one count and one coordinator: slice 0's worker 0."""
    jobset = run_render("multislice")
    _, shape, slices = SHAPES_BY_KIND["multislice"]
    rendered = _env(jobset)
    places = []
    for slice_index in range(slices):
        hosts = ",".join(f"exp-1-slice-{slice_index}-{i}.exp-1" for i in range(shape.vms_per_slice))
        for worker in range(shape.vms_per_slice):
            environ = {name: e["value"] for name, e in rendered.items() if "value" in e}
            environ |= {"MEGASCALE_SLICE_ID": str(slice_index), "TPU_WORKER_ID": str(worker)}
            environ |= {"TPU_WORKER_HOSTNAMES": hosts}
            places.append(worker_place(environ))
    count = shape.vms_per_slice * slices
    assert sorted(p.worker_id for p in places) == list(range(count))
    assert {(p.worker_count, p.coordinator) for p in places} == {(count, "exp-1-slice-0-0.exp-1:8482")}


def test_the_validator_refuses_a_multislice_jobset_that_cannot_join():
    jobset = run_render("multislice")
    pods = _pod(jobset)
    pods["containers"][0]["env"] = [e for e in pods["containers"][0]["env"] if e["name"] != "MEGASCALE_SLICE_ID"]
    jobset["spec"]["replicatedJobs"][0]["replicas"] = 3
    found = [str(f) for f in validate_all(platform_validator(), [jobset]).findings]
    where = "JobSet/team-nlp/exp-1: spec.replicatedJobs[0] container main"
    assert f"{where}: 3 slices need MEGASCALE_NUM_SLICES = {{'value': '3'}}; it has {{'value': '2'}}" in found
    assert any(f.startswith(f"{where}: 3 slices need MEGASCALE_SLICE_ID") and "it has none" in f for f in found)
    one = run_render("multi-host")
    _pod(one)["containers"][0]["env"].append({"name": "MEGASCALE_NUM_SLICES", "value": "2"})
    assert [str(f) for f in validate_all(platform_validator(), [one]).findings if "MEGASCALE" in str(f)] == [
        "JobSet/team-vision/exp-1: spec.replicatedJobs[0] container main: one slice, but MEGASCALE_NUM_SLICES says "
        "otherwise"
    ]


def test_more_slices_of_a_single_host_pool_are_refused():
    with pytest.raises(ValueError, match=r"2 slices of a single-host pool .*GKE joins slices of multi-host pools only"):
        run_jobset(a_run(), RUN_TEAM, SINGLE_HOST, checkpoints="ckpt", models="models", slices=2)

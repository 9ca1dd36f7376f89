"""Where a workload's code comes from, in the stack file: a folder of this repository or an image of the
stack's registry.

The checks of infra/config/workload_code.py, each refusal named with its key, value and what is allowed,
and generated hostile input (as tests/test_bad_input.py does for every other setting).
"""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import parse_stack_config
from infra.config.problems import ConfigError
from infra.config.workload_code import REPO_ROOT, command_problem, folder_problem, image_problem, parse_image, registry
from infra.tpu.metadata import vm_metadata
from tests.support import NS, TF_MNIST_DEFAULT_COMMAND, fixture_config, with_object
from tools.standins.contracts import document

DIGEST = "0123456789abcdef" * 4
REGISTRY = "us-central1-docker.pkg.dev/fixture-project/tpu-sources"
IMAGE = f"{REGISTRY}/trainer@sha256:{DIGEST}"


def sources() -> dict[str, str]:
    return fixture_config("sources")


def problems_of(raw: dict[str, str], stack: str = "sources") -> str:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack, raw)
    return str(caught.value)


def with_workload(raw: dict[str, str], name: str, **changes: object) -> dict[str, str]:
    def edit(workloads: dict) -> None:
        workloads[name] = {**workloads.get(name, {}), **changes}
        for key, value in changes.items():
            if value is None:
                del workloads[name][key]

    return with_object(raw, "workloads", edit)


def test_the_fixture_declares_a_program_a_folder_and_an_image():
    cfg = parse_stack_config("sources", sources())
    by_name = {w.name: w for w in cfg.workloads}
    # A built-in program is its example's folder (infra/config/examples.py).
    assert by_name["mnist"].source.folder == "workloads/tf_mnist"
    assert by_name["mnist"].command[:2] == ("python", "tf_mnist.py")
    assert by_name["byo"].source.folder == "workloads/jax_mnist" and by_name["byo"].command[1] == "jax_mnist.py"
    assert by_name["byo"].python == "3.11" and dict(by_name["byo"].env) == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    assert by_name["img"].source.image == IMAGE


def test_a_program_is_a_folder_source_with_its_own_command_and_settings():
    cfg = parse_stack_config("sources", sources())
    mnist = cfg.workload("mnist")
    assert mnist.command == TF_MNIST_DEFAULT_COMMAND


@pytest.mark.parametrize(
    ("changes", "key", "says"),
    [
        ({"source": {"folder": "../secrets"}}, "source.folder", "no absolute path, '..'"),
        ({"source": {"folder": "/etc"}}, "source.folder", "no absolute path"),
        ({"source": {"folder": "no/such/folder"}}, "source.folder", "is not a folder of the repository"),
        ({"source": {"folder": "README.md"}}, "source.folder", "is not a folder of the repository"),
        ({"source": {"folder": "workloads", "image": IMAGE}}, "source", "exactly one of folder or image"),
        ({"source": {}}, "source", "give source (folder or image) and command"),
        ({"source": {"folder": "workloads"}, "command": ["python", "train.py"]}, "command", "train.py is not a file"),
        ({"source": {"folder": "workloads"}, "command": ["python", "-m", "nope"]}, "command", "module nope is not"),
        ({"source": {"folder": "workloads"}, "command": ["torchrun", "x.py"]}, "command", "must start a file"),
        ({"source": {"folder": "workloads"}, "command": ["python", "../x.py"]}, "command", "must be a file inside"),
        ({"source": {"folder": "workloads"}, "command": ["python", ""]}, "command[1]", "not empty"),
        ({"source": {"folder": "workloads"}, "command": "python x.py"}, "command", "must be a list"),
        ({"source": {"folder": "a" * 600}}, "source.folder", "is not a folder of the repository"),
        ({"python": "2.7"}, "python", "a Python version like 3.11"),
        ({"env": {"TPU_PLATFORM_RUN_ID": "x"}}, "env.TPU_PLATFORM_RUN_ID", "not starting with TPU_PLATFORM_"),
        ({"env": {"lower": "x"}}, "env.lower", "NAME of A-Z"),
        ({"env": {"N": 3}}, "env.N", "values of at most"),
        ({"epochs": 3}, "epochs", "only with program"),
        ({"frameworkVersion": "2.15.0"}, "frameworkVersion", "only with program"),
    ],
)
def test_a_bad_folder_source_is_named_with_what_is_allowed(changes, key, says):
    message = problems_of(with_workload(sources(), "byo", **changes))
    assert f"{NS}:workloads.byo.{key} = " in message and says in message, message


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        (f"{REGISTRY}/trainer:latest", "must be pinned by digest"),
        (f"{REGISTRY}/trainer", "must be <region>-docker.pkg.dev/"),
        (f"{REGISTRY}/trainer@sha256:{DIGEST[:-1]}", "must be <region>-docker.pkg.dev/"),
        (f"{REGISTRY}/trainer@sha256:{DIGEST.upper()}", "must be <region>-docker.pkg.dev/"),
        (f"europe-west4-docker.pkg.dev/fixture-project/tpu-sources/trainer@sha256:{DIGEST}", "this stack's repository"),
        (f"us-central1-docker.pkg.dev/other-project/tpu-sources/trainer@sha256:{DIGEST}", "this stack's repository"),
        (f"us-central1-docker.pkg.dev/fixture-project/tpu-dev/trainer@sha256:{DIGEST}", "this stack's repository"),
        (f"docker.io/library/python@sha256:{DIGEST}", "must be <region>-docker.pkg.dev/"),
        (f"gcr.io/fixture-project/trainer@sha256:{DIGEST}", "must be <region>-docker.pkg.dev/"),
        (IMAGE + "\n", "must be <region>-docker.pkg.dev/"),
    ],
)
def test_an_image_outside_the_stacks_repository_or_not_by_digest_is_refused(ref, says):
    message = problems_of(with_workload(sources(), "img", source={"image": ref}))
    assert f"{NS}:workloads.img.source.image = " in message and says in message, message
    assert "tpu-sources" in message  # the repository it must be in, named


def test_a_tag_is_accepted_only_where_the_stack_allows_it_and_then_with_a_warning():
    tagged = with_workload(sources(), "img", source={"image": f"{REGISTRY}/trainer:v3"})
    assert "allowImageTags: true" in problems_of(tagged)
    allowed = with_object(tagged, "artifacts", lambda a: a.update(allowImageTags=True))
    cfg = parse_stack_config("sources", allowed)
    assert any("workloads.img.source.image" in w and "pin it by @sha256 digest" in w for w in cfg.warnings)


def test_an_image_takes_no_python_and_may_keep_its_own_command():
    message = problems_of(with_workload(sources(), "img", python="3.11"))
    assert "workloads.img.python = '3.11': only for a folder source" in message
    cfg = parse_stack_config("sources", with_workload(sources(), "img", command=None))
    assert cfg.workload("img").command == ()


def test_a_program_takes_no_source_command_or_python_and_needs_its_framework_version():
    message = problems_of(
        with_workload(sources(), "mnist", source={"folder": "workloads"}, command=["python", "x.py"], python="3.11")
    )
    for key in ("source", "command", "python"):
        assert f"workloads.mnist.{key} = " in message and "not with program" in message
    assert "workloads.mnist.frameworkVersion = (not set): required with program" in problems_of(
        with_workload(sources(), "mnist", frameworkVersion=None)
    )


def test_a_vm_runs_a_folder_source_through_the_agent():
    """The VM agent fetches any folder source by its digest (docs/run-contract.md): a VM is no longer
    limited to the built-in programs, and its run spec names the folder's archive and own command."""
    from infra.packaging import repository_folder
    from infra.tpu.metadata import run_spec, source_digests
    from run_contract import paths

    def put_byo_on_the_vm(vms: list) -> None:
        vms[0]["workload"] = "byo"

    cfg = parse_stack_config("sources", with_object(sources(), "tpuVms", put_byo_on_the_vm))
    spec = run_spec(cfg, cfg.tpu_vms[0], source_digests(cfg))
    sha256 = repository_folder("workloads/jax_mnist").sha256
    uri = f"gs://fixture-project-sources-artifacts/{paths.source_object(sha256)}"
    assert spec["source"] == {"kind": "folder", "uri": uri, "sha256": sha256}
    assert spec["command"] == ["python", "jax_mnist.py", "--epochs", "2", "--batch-size", "2"]
    assert spec["python"] == "3.11"


def test_a_key_outside_the_repository_region_is_refused_for_the_image_repository():
    key = "projects/k/locations/europe-west4/keyRings/r/cryptoKeys/c"
    raw = with_object(sources(), "buckets", lambda b: b.update(location="EUROPE-WEST4", kmsKeyName=key))
    assert "needs in the repository's region us-central1, not europe-west4" in problems_of(raw)


# --- the pure checks ----------------------------------------------------------------------------------


def test_a_symbolic_link_leading_out_of_the_repository_is_refused(tmp_path):
    root, outside = tmp_path / "repo", tmp_path / "outside"
    (root / "code").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, root / "escape")
    os.symlink(root / "code", root / "inside")
    assert "leads out of the repository" in (folder_problem("escape", root) or "")
    assert folder_problem("inside", root) is None
    assert folder_problem("code", root) is None


def test_an_entry_linked_out_of_its_folder_is_refused(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "secret.py").write_text("")
    os.symlink(tmp_path / "secret.py", tmp_path / "code" / "train.py")
    assert "is not a file of code" in (command_problem(("python", "train.py"), "code", tmp_path) or "")


def test_entries_that_are_found(tmp_path):
    (tmp_path / "code" / "pkg" / "cli").mkdir(parents=True)
    (tmp_path / "code" / "pkg" / "train.py").write_text("")
    (tmp_path / "code" / "pkg" / "cli" / "__main__.py").write_text("")
    (tmp_path / "code" / "run.sh").write_text("")
    for command in (
        ("python3", "-u", "pkg/train.py", "--epochs", "3"),
        ("python", "-m", "pkg.train"),
        ("python3.11", "-m", "pkg.cli"),
        ("bash", "run.sh"),
        ("./run.sh", "--x", "1", "--y", "1"),
    ):
        assert command_problem(command, "code", tmp_path) is None, command
    for command in (("python", "-c", "print(1)"), ("python",), ("python", "-m"), ("./missing.sh",), ()):
        assert command_problem(command, "code", tmp_path) is not None, command


COMPONENT = st.from_regex(r"[a-z0-9]{1,8}([._-][a-z0-9]{1,8}){0,2}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["us-central1", "europe-west4", "asia-east1"]),
    st.from_regex(r"[a-z][a-z0-9-]{4,20}[a-z0-9]", fullmatch=True),
    st.lists(COMPONENT, min_size=1, max_size=3),
    st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
)
def test_every_well_formed_digest_reference_parses_into_its_parts(region, project, path, digest):
    ref = f"{region}-docker.pkg.dev/{project}/tpu-dev/{'/'.join(path)}@sha256:{digest}"
    image = parse_image(ref)
    assert image is not None
    assert (image.region, image.project, image.repository, image.name, image.digest, image.tag) == (
        region,
        project,
        "tpu-dev",
        "/".join(path),
        digest,
        "",
    )
    assert image_problem(ref, stack="dev", project=project, region=region, allow_tags=False) is None
    assert image_problem(ref, stack="prod", project=project, region=region, allow_tags=True) is not None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=120))
def test_no_text_but_a_reference_into_the_repository_passes(text):
    why = image_problem(text, stack="dev", project="acme-ml", region="us-central1", allow_tags=True)
    image = parse_image(text)
    assert (why is None) == (image is not None and image.registry == "us-central1-docker.pkg.dev/acme-ml/tpu-dev")


JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10) | st.sampled_from(["..", "/", "workloads", IMAGE]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=5,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["byo", "img"]), st.sampled_from(["source", "command", "python", "env", "folder", "image"]), JUNK
)
def test_any_junk_in_a_source_setting_is_a_clean_config_error(workload, key, junk):
    def edit(workloads: dict) -> None:
        if key in ("folder", "image"):
            workloads[workload]["source"] = {key: junk}
        else:
            workloads[workload][key] = junk

    raw = with_object(sources(), "workloads", edit)
    try:
        vm_metadata(parse_stack_config("sources", raw))
    except ConfigError as error:
        assert str(error).startswith("stack 'sources'")
        assert all(p.key.startswith(f"{NS}:") and p.allowed for p in error.problems)


# What the settings library says in its own words; a platform engineer is told key, value and what is allowed.
JARGON = re.compile(r"pydantic|Input should|validation error|model_type|extra_forbidden|type=", re.IGNORECASE)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["allowImageTags", "keepImageVersions", "untaggedImageDays", "unknown"]), JUNK)
def test_any_junk_in_the_artifacts_settings_is_a_clean_config_error(key, junk):
    raw = {**sources(), f"{NS}:artifacts": json.dumps({key: junk})}
    try:
        parse_stack_config("sources", raw)
    except ConfigError as error:
        assert all(p.key.startswith(f"{NS}:artifacts") and p.allowed for p in error.problems)
        assert not JARGON.search(str(error)), str(error)


def test_the_docs_example_parses_with_the_dev_stack():
    import re

    import yaml

    from tests.support import stack_config

    page = (REPO_ROOT / "docs" / "stack-settings.md").read_text()
    block = page.split("<!-- example: workload sources", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    example = yaml.safe_load(block)["tpu-platform:workloads"]
    raw = with_object(stack_config("dev"), "workloads", lambda w: w.update(example))
    cfg = parse_stack_config("dev", raw)
    own, image = cfg.workload("jax-own"), cfg.workload("eval")
    assert (own.source.folder, own.command[:2], own.python) == (
        "workloads/jax_mnist",
        ("python", "jax_mnist.py"),
        "3.11",
    )
    assert re.fullmatch(r".*/tpu-dev/eval@sha256:[0-9a-f]{64}", image.source.image)


def test_the_registry_is_the_endpoint_artifact_registry_names():
    """Repository.registryUri in Artifact Registry v1's discovery document: the endpoint images are
    pushed to and pulled from, `<location>-docker.pkg.dev/<project>/<repository>`."""
    described = document("artifactregistry.v1")["schemas"]["Repository"]["properties"]["registryUri"]["description"]
    assert f"`{registry('us', 'my-proj', 'my-repo')}`" in described

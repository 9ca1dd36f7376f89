"""`tpu-runs --team` on the GKE engine, end to end against the loopback Kubernetes API stand-in
(tools/standins/kubernetes.py): the cluster's `get` checked against container.v1's discovery document,
every applied JobSet checked by the platform's validator, each request recorded as the authorization
checks the API server makes and decided by the team's RBAC objects as the admin phase renders them for the
stack (infra/gke/admin.py: infra/gke/teams.py admin_objects)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from infra.access import iamdata
from infra.access.calls import KUBERNETES_API
from infra.access.kubernetes import Subject, allowed, escalations, namespaces_running_code
from infra.access.researcher_calls import OPERATOR_REPORT_CALLS
from infra.config import parse_stack_config
from infra.config.stackfile import read_stack_config
from infra.gke import teams
from infra.gke.jobsets import REQUESTER_ANNOTATION, RUN_LABEL, TTL_SECONDS
from infra.packaging import package
from infra.tpu.metadata import agent_package
from tests.logging_api import LoggingState, logging_standin
from tests.sandbox import storage_emulator
from tests.support import fixture_config, plan
from tests.test_readme_examples import readme_argv, readme_tpu_runs
from tools.standins.kubernetes import Access, ClusterState, kubernetes_standin
from tpu_runs import cli, gke

STACK_FILE = Path(__file__).resolve().parent / "stacks" / "Pulumi.gke.yaml"
ROOT = Path(__file__).resolve().parents[1]
CFG = parse_stack_config("gke", read_stack_config("gke", ROOT, STACK_FILE))
ADA = "user:ada@example.com"  # team vision's member (the fixture stack)
IMAGE = "us-central1-docker.pkg.dev/fixture-gke/tpu-gke/train@sha256:" + "a" * 64
JOBSETS = ("jobset.x-k8s.io", "jobsets")
WORKLOADS = ("kueue.x-k8s.io", "workloads")
PENDING = ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads")


def plan_rbac() -> list[dict[str, Any]]:
    assert CFG.gke is not None
    return teams.admin_objects(CFG.gke.teams, CFG.deployer)


class Cluster:
    def __init__(self, url: str, state: ClusterState):
        self.url = url
        self.state = state

    def run(self, *argv: str) -> int:
        return cli.main([argv[0], "--stack", "gke", "--stack-file", str(STACK_FILE), *argv[1:]], requests.Session())


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    state = ClusterState(subject=Subject("User", "ada@example.com"), rbac_objects=plan_rbac())
    with kubernetes_standin(state) as (url, state):
        monkeypatch.setenv("CONTAINER_API_ENDPOINT", url)
        monkeypatch.setenv("KUBERNETES_API_ENDPOINT", url)
        monkeypatch.setenv("TPU_RUNS_REQUESTER", ADA)
        yield Cluster(url, state)


def submit(cluster: Cluster, run_id: str, *flags: str) -> int:
    return cluster.run(
        "submit", "--team", "vision", "--image", IMAGE, "--run-id", run_id, *flags, "--", "python", "t.py"
    )


def test_a_member_submits_lists_and_stops_a_run_through_the_teams_queue(cluster: Cluster, capsys):
    assert submit(cluster, "exp-1") == 0, capsys.readouterr().err
    jobset = cluster.state.get(*JOBSETS, "team-vision", "exp-1")
    assert jobset is not None and cluster.state.refused == []
    assert jobset["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "vision", RUN_LABEL: "exp-1"}
    assert jobset["metadata"]["annotations"][REQUESTER_ANNOTATION] == ADA
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == IMAGE and pod["containers"][0]["command"] == ["python", "t.py"]
    assert pod["priorityClassName"] == "medium"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TPU_PLATFORM_CHECKPOINT_DIR"] == f"gs://{CFG.bucket_name('checkpoints')}/teams/vision/exp-1/"
    assert cluster.state.google_methods == ["container.projects.locations.clusters.get"]

    # Kueue's Workload for it, as Kueue's controller would write it: waiting for quota.
    waiting = "couldn't assign flavors to pod set slice: insufficient unused quota for google.com/tpu, 8 more needed"
    cluster.state.put(
        *WORKLOADS,
        {
            "metadata": {
                "name": "jobset-exp-1-1a2b3",
                "namespace": "team-vision",
                "labels": {"kueue.x-k8s.io/job-uid": jobset["metadata"]["uid"]},
            },
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "message": waiting}]},
        },
    )
    # Kueue's queue: another team member's run is ahead of it.
    cluster.state.queue("team-vision", "vision", ["jobset-exp-0-9z8y7", "jobset-exp-1-1a2b3"])
    capsys.readouterr()
    assert cluster.run("list", "--team", "vision") == 0
    out = capsys.readouterr().out
    assert "exp-1" in out and "pending" in out and ADA in out
    assert f"(#2 in the team's queue, #2 in its ClusterQueue; {waiting})" in out
    cluster.state.visibility = False  # a cluster without Kueue's visibility API still lists its runs
    assert cluster.run("list", "--team", "vision") == 0
    out = capsys.readouterr().out
    assert "queue positions unknown" in out and f"pending   {ADA}" in out and f"({waiting})" in out

    assert cluster.run("stop", "--team", "vision", "exp-1") == 0
    assert cluster.state.get(*JOBSETS, "team-vision", "exp-1") is None
    assert cluster.run("stop", "--team", "vision", "exp-1") == 2
    assert "no run exp-1 in team vision" in capsys.readouterr().err


def test_the_members_role_grants_exactly_what_the_commands_ask(cluster: Cluster, capsys):
    """Every request the commands made is one the plan's RBAC allows her (the stand-in refused none), and
    every verb and resource her Role grants is one they used: nothing more."""
    assert submit(cluster, "exp-1") == 0
    assert submit(cluster, "exp-1") == 0  # applied again: an update, a patch only
    assert cluster.run("list", "--team", "vision") == 0
    assert cluster.run("stop", "--team", "vision", "exp-1") == 0
    assert cluster.state.refused == [], cluster.state.refused
    used = {(a.group, a.resource, a.verb) for a in cluster.state.accesses}

    def granted(rules: list[dict]) -> set[tuple[str, str, str]]:
        return {
            (group, resource, verb)
            for rule in rules
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    assert used == granted(teams.RUN_COMMAND_RULES) == granted(teams.RESEARCHER_RULES)
    assert {a.namespace for a in cluster.state.accesses} == {"team-vision"}
    assert Access("create", *JOBSETS, "team-vision", "exp-1") in cluster.state.accesses
    assert Access("get", *PENDING, "team-vision", "vision") in cluster.state.accesses


def test_someone_outside_the_team_is_refused_in_a_sentence(cluster: Cluster, capsys):
    cluster.state.subject = Subject("User", "mallory@example.com")
    assert submit(cluster, "exp-1") == 2
    err = capsys.readouterr().err
    assert "you may not apply JobSet team-vision/exp-1 (HTTP 403" in err
    assert "Members of team vision are listed under tpu-platform:gke.teams in Pulumi.gke.yaml" in err
    assert "Traceback" not in err


def test_a_run_its_queue_could_never_admit_is_refused_before_any_call(cluster: Cluster, capsys):
    assert submit(cluster, "big", "--slices", "2") == 2  # 2 slices of 16 chips: vision holds 16 there, none to borrow
    assert (
        "tpu-runs: run big of team vision on pool v5e: asks 32 TPU chips; ClusterQueue 'vision' can admit at most 16"
        in capsys.readouterr().err
    )
    assert submit(cluster, "high", "--priority", "very-high") == 2
    assert "--priority 'very-high': team vision may use very-low, low, medium, high" in capsys.readouterr().err
    assert cluster.run("submit", "--team", "nobody", "--image", IMAGE, "--", "x") == 2
    assert "stack 'gke' has no GKE team 'nobody' (it has: vision, nlp)" in capsys.readouterr().err
    assert cluster.run("submit", "--team", "vision", "--image", IMAGE, "--python", "3.11", "--", "x") == 2
    refused = "--python: on the GKE engine a folder source runs in the Python of the stack's folder image"
    assert f"{refused} (tpu-platform:gke.folderImage in Pulumi.gke.yaml): name it in the command, e.g. -- python3" in (
        capsys.readouterr().err
    )
    assert cluster.state.accesses == [] and cluster.state.google_methods == []


def test_the_standin_refuses_what_the_api_server_would(cluster: Cluster):
    """Its checks can fail: an apply that is not server-side apply, or a body the validator refuses."""
    assert submit(cluster, "exp-1") == 0
    jobset = cluster.state.get(*JOBSETS, "team-vision", "exp-1")
    assert jobset is not None
    url = f"{cluster.url}/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-vision/jobsets/exp-1"
    merge = requests.patch(url, json=jobset, params={"fieldManager": "x"}, timeout=10)
    assert merge.status_code == 422 and "server-side apply is application/apply-patch+yaml" in merge.json()["message"]
    apply = {"Content-Type": "application/apply-patch+yaml"}
    typo = {**jobset, "spec": {**jobset["spec"], "replicatedJob": []}}
    refused = requests.patch(url, json=typo, params={"fieldManager": "x"}, headers=apply, timeout=10)
    assert refused.status_code == 422 and "replicatedJob" in refused.json()["message"]
    unowned = requests.patch(url, json=jobset, headers=apply, timeout=10)
    assert unowned.status_code == 422 and "fieldManager is required" in unowned.json()["message"]


def test_the_readmes_gke_commands_run_as_shown(
    cluster: Cluster, team_logs: LoggingState, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
):
    """Each `--team` command of the README's table, on a stack with its team (the fixture's vision)."""
    commands = readme_tpu_runs()["GKE engine"]
    with storage_emulator() as storage:
        for bucket in (MODELS, ARTIFACTS):
            requests.post(f"{storage}/storage/v1/b", params={"project": CFG.project}, json={"name": bucket}, timeout=10)
        runner = agent_package()
        put(storage, ARTIFACTS, runner.object_name, runner.data)  # as the stack's pulumi up leaves it
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "exp").mkdir()
        shutil.copy(TRAINER / "train.py", tmp_path / "exp")
        assert cluster.run(*readme_argv(commands["submit"], IMAGE=IMAGE)) == 0, capsys.readouterr().err
        jobset = cluster.state.get(*JOBSETS, "team-vision", "exp-42")
        assert jobset is not None
        assert cluster.run(*readme_argv(commands["list"])) == 0
        assert "exp-42" in capsys.readouterr().out
        team_logs.entries.append(container_entry("team-vision", "exp-42", 0, "2026-12-01T10:00:01Z", "step 1"))
        jobset["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
        assert cluster.run(*readme_argv(commands["logs"])) == 0
        assert "step 1" in capsys.readouterr().out
        jobset.pop("status")
        upload(storage, "teams/vision/exp-42/model.keras", b"weights")
        assert cluster.run(*readme_argv(commands["fetch"])) == 0
        assert (tmp_path / "out" / "model.keras").read_bytes() == b"weights"
    assert cluster.run(*readme_argv(commands["stop"])) == 0
    assert cluster.state.get(*JOBSETS, "team-vision", "exp-42") is None and cluster.state.refused == []


def test_a_members_team_report_is_kueues_word_on_each_runs_wait_and_admitted_time(cluster: Cluster, capsys):
    """`report --team`: each run's wait from its Workload's creation to its admission and its admitted time,
    priced for the slice pool its pods select; the program's own categories are said not to be recorded. The
    calls are ones `list --team` makes already: her Role needs nothing more."""
    assert submit(cluster, "exp-1") == 0
    jobset = cluster.state.get(*JOBSETS, "team-vision", "exp-1")
    assert jobset is not None
    capsys.readouterr()
    assert cluster.run("report", "--team", "vision", "--json") == 1  # not queued by Kueue yet: nothing to say
    assert "Kueue has not queued it yet" in capsys.readouterr().out
    cluster.state.put(
        *WORKLOADS,
        {
            "metadata": {
                "name": "jobset-exp-1-1a2b3",
                "namespace": "team-vision",
                "labels": {"kueue.x-k8s.io/job-uid": jobset["metadata"]["uid"]},
                "creationTimestamp": "2026-11-20T08:00:00Z",
            },
            "status": {
                "conditions": [
                    {"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-11-20T08:20:00Z"},
                    {"type": "Admitted", "status": "True", "lastTransitionTime": "2026-11-20T08:30:00Z"},
                    {"type": "Finished", "status": "True", "lastTransitionTime": "2026-11-20T10:30:00Z"},
                ]
            },
        },
    )
    assert cluster.run("report", "--team", "vision", "exp-1", "--json") == 0
    found = json.loads(capsys.readouterr().out)
    (run,) = found["runs"]
    timeline = run["timeline"]
    assert (timeline["vm"], timeline["chips"], timeline["provisioning"]) == ("v5e", 16, "spot")
    assert timeline["seconds"]["queue"] == 1800.0 and timeline["billedSeconds"] == 7200.0
    assert timeline["seconds"]["unattributed"] == 7200.0  # nothing of the program's is recorded on GKE
    assert run["priced"]["chipHours"] == 32.0 and "no agent runs beside its program" in found["notRecorded"]
    assert cluster.run("report", "--team", "vision") == 0
    out = capsys.readouterr().out
    assert "queue                1800.0  not billed" in out and "from Kueue's Workloads" in out
    assert cluster.run("report", "--team", "vision", "--month", "2026-10") == 1
    assert cluster.state.refused == []
    assert {(a.resource, a.verb) for a in cluster.state.accesses if a.verb != "create"} <= {
        ("jobsets", "list"),
        ("workloads", "list"),
        ("jobsets", "get"),
        ("jobsets", "patch"),
    }


def admitted(jobset: dict[str, Any], name: str, created: str, admitted: str, finished: str) -> dict[str, Any]:
    """Kueue's Workload for `jobset`, as its controller writes it: created, admitted, finished."""
    return {
        "metadata": {
            "name": name,
            "namespace": jobset["metadata"]["namespace"],
            "labels": {"kueue.x-k8s.io/job-uid": jobset["metadata"]["uid"]},
            "creationTimestamp": created,
        },
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": admitted},
                {"type": "Admitted", "status": "True", "lastTransitionTime": admitted},
                {"type": "Finished", "status": "True", "lastTransitionTime": finished},
            ]
        },
    }


OPERATOR = "user:ops@example.com"


def operator_rbac(namespaces: tuple[str, ...] = ("team-vision", "team-nlp")) -> list[dict[str, Any]]:
    """OPERATOR_REPORT_RULES in a ClusterRole, bound to the operator by a RoleBinding in each team's namespace, as
    docs/goodput.md says to (the plan binds it to nobody: the stack names no operator)."""
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tpu-platform:operator-report"}
    return [
        {
            "apiVersion": teams.RBAC_API,
            "kind": "ClusterRole",
            "metadata": {"name": role["name"]},
            "rules": teams.OPERATOR_REPORT_RULES,
        },
        *(
            {
                "apiVersion": teams.RBAC_API,
                "kind": "RoleBinding",
                "metadata": {"name": role["name"], "namespace": namespace},
                "roleRef": role,
                "subjects": [teams.subject(OPERATOR)],
            }
            for namespace in namespaces
        ),
    ]


def test_an_operators_report_sums_every_teams_runs_with_the_rules_the_docs_name(cluster: Cluster, capsys, monkeypatch):
    """`report --all` on a GKE stack: each team's runs as Kueue saw them, priced for their pools, summed by team and
    for the stack. The operator's requests are exactly OPERATOR_REPORT_RULES' (lists in each team's namespace,
    nothing that runs code or grants more); a member of one team is refused in a sentence."""
    assert submit(cluster, "exp-1") == 0  # Ada, team vision (v5e, 16 chips)
    monkeypatch.setenv("TPU_RUNS_REQUESTER", "user:grace@example.com")
    cluster.state.subject = Subject("User", "grace@example.com")
    assert cluster.run("submit", "--team", "nlp", "--image", IMAGE, "--run-id", "lm-1", "--", "python", "t.py") == 0
    vision = cluster.state.get(*JOBSETS, "team-vision", "exp-1")
    nlp = cluster.state.get(*JOBSETS, "team-nlp", "lm-1")
    assert vision is not None and nlp is not None
    cluster.state.put(*WORKLOADS, admitted(vision, "jobset-exp-1-1a2b3", *NOVEMBER_20_TWO_HOURS))
    cluster.state.put(*WORKLOADS, admitted(nlp, "jobset-lm-1-4d5e6", *NOVEMBER_20_TWO_HOURS))

    monkeypatch.delenv("TPU_RUNS_REQUESTER")
    cluster.state.subject = Subject("User", "ops@example.com")
    cluster.state.rbac_objects = [*plan_rbac(), *operator_rbac()]
    cluster.state.accesses.clear()
    cluster.state.google_methods.clear()
    capsys.readouterr()
    before = time.time()
    assert cluster.run("report", "--all", "--month", "2026-11", "--json") == 0
    after = time.time()
    found = json.loads(capsys.readouterr().out)
    # The cluster holds a finished JobSet for TTL_SECONDS only: the report says which runs its team rows can hold.
    since = datetime.strptime(found["gkeCoverage"]["finishedSince"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    assert before - TTL_SECONDS - 1 <= since <= after - TTL_SECONDS
    assert "2026-11's team rows hold only its runs still running" in found["gkeCoverage"]["note"]
    by_team = {t["team"]: t for t in found["teams"]}
    assert found["vms"] == [] and sorted(by_team) == ["nlp", "vision"]
    assert [r["runId"] for r in by_team["vision"]["runs"]] == ["exp-1"] and by_team["vision"]["chipHours"] == 32.0
    assert by_team["vision"]["billedSeconds"] == 7200.0 and by_team["vision"]["queueSeconds"] == 1800.0
    # Each team's runs as its own members' report prices them: one home.
    total = found["total"]
    assert total["billedSeconds"] == 14400.0
    assert by_team["nlp"]["usd"] is None and total["unpriced"] == ["team nlp"]  # the catalog prices no Ironwood
    assert (
        total["usd"]
        == by_team["vision"]["usd"]
        == pytest.approx(32.0 * by_team["vision"]["runs"][0]["priced"]["price"]["perChipHour"])
    )
    assert total["chipHours"] == pytest.approx(sum(t["chipHours"] for t in found["teams"]))
    assert cluster.run("report", "--all") == 0
    table = capsys.readouterr().out
    assert "team vision" in table and "team nlp" in table and "from Kueue's Workloads" in table
    assert "the total's USD leaves out what has no price in the catalog: team nlp" in table
    assert "the teams' rows count only runs still running or finished since" in table

    assert cluster.state.refused == []
    used = {(a.group, a.resource, a.verb) for a in cluster.state.accesses}
    rules = teams.OPERATOR_REPORT_RULES
    assert used == {
        (g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert {a.namespace for a in cluster.state.accesses} == {"team-vision", "team-nlp"}
    operator = Subject("User", "ops@example.com")
    # The binding holds the lists in the teams' namespaces and nowhere else: `list` returns whole objects (a
    # JobSet's pod template, its `--env` values included), so a cluster-wide binding would read every namespace's.
    for group, resource in (("jobset.x-k8s.io", "jobsets"), ("kueue.x-k8s.io", "workloads")):
        assert allowed(operator_rbac(), operator, "list", resource, group, "team-vision")
        assert not allowed(operator_rbac(), operator, "list", resource, group, "kube-system")
        assert not allowed(operator_rbac(), operator, "list", resource, group, None)
    assert escalations(operator_rbac(), operator) == []
    assert namespaces_running_code(operator_rbac(), operator, ["team-vision", "team-nlp"]) == set()
    # The cluster read, then every request above through its DNS endpoint (no REST method: KUBERNETES_API).
    assert set(cluster.state.google_methods) == set(OPERATOR_REPORT_CALLS["project"]) - {KUBERNETES_API}

    cluster.state.subject = Subject("User", "ada@example.com")  # a member of one team: not an operator
    cluster.state.rbac_objects = plan_rbac()
    monkeypatch.setenv("TPU_RUNS_REQUESTER", ADA)
    assert cluster.run("report", "--all") == 2
    assert "an operator's report lists every team's JobSets" in capsys.readouterr().err


NOVEMBER_20_TWO_HOURS = ("2026-11-20T08:00:00Z", "2026-11-20T08:30:00Z", "2026-11-20T10:30:00Z")


def test_a_queue_answer_without_positions_lists_them_as_unknown(cluster: Cluster, capsys, monkeypatch):
    """Kueue writes both positions, but what serves the visibility path may not: no KeyError traceback."""
    assert submit(cluster, "exp-1") == 0
    jobset = cluster.state.get(*JOBSETS, "team-vision", "exp-1")
    assert jobset is not None
    cluster.state.put(
        *WORKLOADS,
        {
            "metadata": {
                "name": "jobset-exp-1-1a2b3",
                "namespace": "team-vision",
                "labels": {"kueue.x-k8s.io/job-uid": jobset["metadata"]["uid"]},
            },
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "message": "waiting"}]},
        },
    )
    cluster.state.queue("team-vision", "vision", ["jobset-exp-1-1a2b3"])
    answered = cluster.state.pending

    def without_positions(namespace: str, local_queue: str) -> dict[str, Any]:
        summary = answered(namespace, local_queue)
        for item in summary["items"]:
            del item["positionInClusterQueue"]
        return summary

    monkeypatch.setattr(cluster.state, "pending", without_positions)
    capsys.readouterr()
    assert cluster.run("list", "--team", "vision") == 0
    captured = capsys.readouterr()
    assert "(#1 in the team's queue, place in its ClusterQueue unknown; waiting)" in captured.out
    assert "Traceback" not in captured.err


def test_queue_positions_read_what_the_answer_holds():
    summary = {
        "items": [
            {"metadata": {"name": "a"}, "positionInLocalQueue": 0, "positionInClusterQueue": 3},
            {"metadata": {"name": "b"}, "positionInLocalQueue": "1"},
            {"metadata": {}},
            "garbage",
        ]
    }
    assert gke.queue_positions(summary) == {
        "a": "#1 in the team's queue, #4 in its ClusterQueue",
        "b": "place in the team's queue unknown, place in its ClusterQueue unknown",
    }
    assert gke.queue_positions(None) == {}


# --- logs --team: the team's log view (infra/gke/team_access.py) on the Logging stand-in ------------------


@pytest.fixture
def team_logs(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoggingState]:
    """The Logging stand-in, routing as the fixture stack's plan declares: its sinks into the teams' buckets,
    its views of them."""
    declared = plan(fixture_config("gke"), "gke")
    with logging_standin() as (url, state):
        state.route(
            [r.inputs for r in declared.of_type("gcp:logging/projectSink:ProjectSink")],
            [r.inputs for r in declared.of_type("gcp:logging/logView:LogView")],
        )
        monkeypatch.setenv("LOGGING_API_ENDPOINT", url)
        yield state


def container_entry(
    namespace: str, run: str, worker: int, at: str, text: str, *, cluster: str = "tpu-gke", slice_: int = 0
) -> dict[str, Any]:
    """A container's line as GKE's logging agent writes it: the k8s_container resource of the pod, and the
    pod's labels under `k8s-pod/` (JobSet's and the Job controller's)."""
    return {
        "logName": "projects/fixture-gke/logs/stdout",
        "resource": {
            "type": "k8s_container",
            "labels": {
                "project_id": "fixture-gke",
                "location": "us-central1",
                "cluster_name": cluster,
                "namespace_name": namespace,
                "pod_name": f"{run}-slice-{slice_}-{worker}-x1y2z",
                "container_name": "main",
            },
        },
        "labels": {gke.RUN_POD_LABEL: run, gke.SLICE_POD_LABEL: str(slice_), gke.WORKER_POD_LABEL: str(worker)},
        "timestamp": at,
        "severity": "INFO",
        "textPayload": text,
    }


def test_logs_read_the_runs_containers_through_the_teams_view_and_nothing_else(
    cluster: Cluster, team_logs: LoggingState, capsys
):
    team_logs.entries += [
        container_entry("team-vision", "exp-1", 1, "2026-12-01T10:00:02Z", "worker 1: step 10"),
        container_entry("team-vision", "exp-1", 0, "2026-12-01T10:00:01Z", "worker 0: step 10"),
        container_entry("team-vision", "exp-2", 0, "2026-12-01T10:00:03Z", "another run of the team"),
        container_entry("team-nlp", "exp-1", 0, "2026-12-01T10:00:04Z", "nlp's run of the same id"),
        container_entry("team-vision", "exp-1", 0, "2026-12-01T10:00:05Z", "another stack's", cluster="tpu-prod"),
    ]
    assert cluster.run("logs", "--team", "vision", "exp-1") == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["2026-12-01T10:00:01Z", "2026-12-01T10:00:02Z"]
    assert "0/0 worker 0: step 10" in lines[0] and "0/1 worker 1: step 10" in lines[1]
    (body,) = team_logs.bodies
    assert body["resourceNames"] == ["projects/fixture-gke/locations/global/buckets/tpu-gke-team-vision/views/runs"]
    assert body["filter"] == 'labels."k8s-pod/jobset_sigs_k8s_io/jobset-name"="exp-1"'
    assert team_logs.violations == []
    assert cluster.state.accesses == [] and cluster.state.google_methods == []  # no cluster call for a plain read


def test_logs_follow_a_run_until_its_jobset_ends(cluster: Cluster, team_logs: LoggingState, capsys):
    assert submit(cluster, "exp-1") == 0
    team_logs.entries.append(container_entry("team-vision", "exp-1", 0, "2026-12-01T10:00:01Z", "done"))
    jobset = cluster.state.get(*JOBSETS, "team-vision", "exp-1")
    assert jobset is not None
    jobset["status"] = {"conditions": [{"type": "Completed", "status": "True", "message": "jobset completed"}]}
    capsys.readouterr()
    assert cluster.run("logs", "--team", "vision", "exp-1", "--follow") == 0
    out = capsys.readouterr().out
    assert "done" in out and out.rstrip().endswith("run exp-1 finished: jobset completed")
    assert Access("list", *JOBSETS, "team-vision") in cluster.state.accesses and cluster.state.refused == []

    assert cluster.run("stop", "--team", "vision", "exp-1") == 0
    capsys.readouterr()
    assert cluster.run("logs", "--team", "vision", "exp-1", "--follow") == 1
    assert "run exp-1 is no longer in team vision's queue" in capsys.readouterr().out


def test_logs_of_a_team_one_is_not_in_are_refused_in_a_sentence(cluster: Cluster, capsys):
    """IAM refuses the view (the grants' conditions: tests/test_gke_access.py), as Logging answers a 403; the
    command says what to do."""
    refusing = requests.Session()
    refusing.request = lambda *a, **k: _forbidden()  # type: ignore[method-assign]
    code = cli.main(["logs", "--stack", "gke", "--stack-file", str(STACK_FILE), "--team", "vision", "x"], refusing)
    err = capsys.readouterr().err
    assert code == 2 and "you may not read the run's log (HTTP 403: denied)" in err
    assert "Members of team vision read its runs' output and results" in err and "Traceback" not in err


def test_other_bytes_planted_under_a_folders_digest_name_are_refused_not_reused(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
):
    """A teammate may upload under the team's sources first, under the name a known folder's archive will have:
    submit compares the stored object's MD5 (Cloud Storage's md5Hash) with the archive's, and refuses in words."""
    folder = tmp_path / "exp"
    folder.mkdir()
    shutil.copy(TRAINER / "train.py", folder)
    name = f"teams/vision/sources/{package(folder).sha256}.tar.gz"
    with storage_emulator() as storage:
        requests.post(f"{storage}/storage/v1/b", params={"project": CFG.project}, json={"name": ARTIFACTS}, timeout=10)
        runner = agent_package()
        put(storage, ARTIFACTS, runner.object_name, runner.data)
        put(storage, ARTIFACTS, name, b"junk")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage)
        assert cluster.run("submit", "--team", "vision", "--folder", str(folder), "--", "python3", "train.py") == 2
    err = capsys.readouterr().err
    assert f"gs://{ARTIFACTS}/{name} holds other bytes than {folder}'s archive" in err
    assert "Ask the stack's admins (the team's, on the GKE engine) to remove that object" in err
    assert cluster.state.accesses == [] and cluster.state.google_methods == []  # nothing submitted


def test_a_folder_source_from_someone_the_team_does_not_count_is_refused_in_a_teams_sentence(tmp_path: Path, capsys):
    """Cloud Storage answers 403 for the runner to whom the team's read grant does not apply (its condition false:
    tests/test_gke_access.py): the command names the team's members list, not the self-service researchers'."""
    folder = tmp_path / "exp"
    folder.mkdir()
    shutil.copy(TRAINER / "train.py", folder)
    refusing = requests.Session()
    refusing.request = lambda *a, **k: _forbidden()  # type: ignore[method-assign]
    argv = ["submit", "--stack", "gke", "--stack-file", str(STACK_FILE), "--team", "vision", "--folder", str(folder)]
    code = cli.main([*argv, "--", "python3", "train.py"], refusing)
    err = capsys.readouterr().err
    assert code == 2 and f"you may not read gs://{ARTIFACTS}/{agent_package().object_name} (HTTP 403: denied)" in err
    assert "Members of team vision are listed under tpu-platform:gke.teams in Pulumi.gke.yaml" in err
    assert "wait a few minutes for its IAM grants to apply" in err
    assert "Researchers" not in err and "Traceback" not in err


def test_logs_says_its_lines_are_untrusted(capsys):
    """A team's sink selects entries by fields their writer sets, and Logging records no writer (logging.v2
    LogEntry: only receiveTimestamp is Logging's own): whatever may write logs in the project can forge a line
    (docs/design-gke.md). The command says so where a member reads how to use it."""
    with pytest.raises(SystemExit):
        cli.main(["logs", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "Its lines are untrusted" in said and "Logging records no writer" in said


def _forbidden() -> requests.Response:
    answer = requests.Response()
    answer.status_code = 403
    answer._content = b'{"error": {"code": 403, "message": "denied"}}'
    return answer


# --- fetch --team: the team's run's models, as its JobSet's TPU_PLATFORM_MODEL_DIR points --------------------

MODELS = CFG.bucket_name("models")


def upload(storage: str, name: str, data: bytes) -> None:
    put(storage, MODELS, name, data)


def put(storage: str, bucket: str, name: str, data: bytes) -> None:
    requests.post(
        f"{storage}/upload/storage/v1/b/{bucket}/o", params={"uploadType": "media", "name": name}, data=data, timeout=10
    ).raise_for_status()


def test_fetch_downloads_the_teams_runs_models_where_its_jobset_wrote_them(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
):
    assert submit(cluster, "exp-1") == 0
    jobset = cluster.state.get(*JOBSETS, "team-vision", "exp-1")
    assert jobset is not None
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    model_dir = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}["TPU_PLATFORM_MODEL_DIR"]
    assert model_dir == f"gs://{MODELS}/teams/vision/exp-1/"
    with storage_emulator() as storage:
        requests.post(f"{storage}/storage/v1/b", params={"project": CFG.project}, json={"name": MODELS}, timeout=10)
        prefix = model_dir.removeprefix(f"gs://{MODELS}/")
        upload(storage, f"{prefix}model.keras", b"weights")
        upload(storage, f"{prefix}metrics/summary.json", b"{}")
        upload(storage, "teams/nlp/exp-1/model.keras", b"nlp's")  # another team's run of the same id
        upload(storage, "teams/vision/exp-10/model.keras", b"a sibling run")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage)
        assert cluster.run("fetch", "--team", "vision", "exp-1", "--to", str(tmp_path / "out")) == 0
        assert "fetched 2 files of run exp-1" in capsys.readouterr().out
        fetched = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
        assert fetched == ["metrics/summary.json", "model.keras"]
        assert (tmp_path / "out" / "model.keras").read_bytes() == b"weights"
        assert cluster.run("fetch", "--team", "vision", "exp-2", "--to", str(tmp_path / "none")) == 2
        assert f"nothing under gs://{MODELS}/teams/vision/exp-2/ yet" in capsys.readouterr().err


# --- submit --team --folder: the folder's archive under the team's sources, and a JobSet that fetches it -------

ARTIFACTS = CFG.bucket_name("artifacts")
TRAINER = ROOT / "tests/agent_sources/trainer"


def test_a_folder_source_is_uploaded_under_the_teams_sources_and_fetched_by_digest_before_it_runs(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
):
    from tests.test_gke_access import can, object_in
    from tests.test_tpu_runs import StorageChecked

    folder = tmp_path / "exp"
    folder.mkdir()
    shutil.copy(TRAINER / "train.py", folder)
    archive = package(folder)
    name = f"teams/vision/sources/{archive.sha256}.tar.gz"
    with storage_emulator() as storage:
        requests.post(f"{storage}/storage/v1/b", params={"project": CFG.project}, json={"name": ARTIFACTS}, timeout=10)
        runner = agent_package()
        put(storage, ARTIFACTS, runner.object_name, runner.data)  # as the stack's pulumi up leaves it
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage)
        session = StorageChecked(storage)
        argv = ["submit", "--team", "vision", "--folder", str(folder), "--run-id", "f-1", "--", "python3", "train.py"]
        run = [argv[0], "--stack", "gke", "--stack-file", str(STACK_FILE), *argv[1:]]
        assert cli.main(run, session) == 0, capsys.readouterr().err
        assert f"as gs://{ARTIFACTS}/{name}" in capsys.readouterr().out
        stored = requests.get(
            f"{storage}/storage/v1/b/{ARTIFACTS}/o/{quote(name, safe='')}", params={"alt": "media"}, timeout=10
        )
        assert stored.content == archive.data
        assert cli.main([*run[:-4], "f-2", "--", "python3", "train.py"], session) == 0  # the same folder again
        assert "is there already" in capsys.readouterr().out
    # The requests it made: Cloud Storage's checked against storage.v1 and each allowed her by the plan's grants,
    # IAM Conditions evaluated; the cluster's checked by the stand-in (RBAC, the validator).
    assert session.violations == []
    first = ["storage.objects.get", "storage.objects.get", "storage.objects.insert"]  # the runner, the source, upload
    assert session.methods == [*first, "storage.objects.get", "storage.objects.get"]
    assert {obj for _, _, obj in session.reached} == {runner.object_name, name}
    for method, bucket, obj in session.reached:
        assert bucket == ARTIFACTS
        for permission in iamdata.method_permissions(method, acls=False, overwrite=False):
            assert can(ADA, "artifacts", object_in("artifacts", obj), permission), (method, permission)
    assert cluster.state.refused == []
    assert cluster.state.google_methods == ["container.projects.locations.clusters.get"] * 2
    jobset = cluster.state.get(*JOBSETS, "team-vision", "f-1")
    assert jobset is not None
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    (main,) = pod["containers"]
    assert fetch["image"] == main["image"] == CFG.gke.folder_image  # type: ignore[union-attr]
    assert main["command"] == ["python3", "train.py"] and main["workingDir"] == "/tpu-platform/source"
    script = fetch["command"][2]
    for sha256, obj in ((archive.sha256, name), (runner.sha256, runner.object_name)):
        assert f"/b/{ARTIFACTS}/o/{quote(obj, safe='')}?alt=media" in script and sha256 in script


def test_a_folder_source_on_a_stack_without_a_folder_image_is_refused_before_any_upload(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
):
    text = STACK_FILE.read_text()
    without = "\n".join(line for line in text.splitlines() if "folderImage" not in line)
    assert without != text
    stack_file = tmp_path / "Pulumi.gke.yaml"
    stack_file.write_text(without + "\n")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing answers: no call may be made
    argv = ["submit", "--stack", "gke", "--stack-file", str(stack_file), "--team", "vision", "--folder", str(TRAINER)]
    assert cli.main([*argv, "--", "python3", "train.py"], requests.Session()) == 2
    err = capsys.readouterr().err
    assert "stack 'gke' names no image for folder sources on the GKE engine: set tpu-platform:gke.folderImage" in err
    assert cluster.state.accesses == [] and cluster.state.google_methods == []


def test_a_folder_with_requirements_is_refused_on_the_gke_engine_before_any_call(cluster: Cluster, capsys):
    """The VM agent installs a folder's requirements; a pod installs none, so the run would fail on its imports."""
    argv = ["submit", "--team", "vision", "--folder", str(TRAINER), "--", "python3", "train.py"]
    assert cluster.run(*argv) == 2
    assert "has requirements (requirements.lock): on the GKE engine a folder runs with the packages" in (
        capsys.readouterr().err
    )
    assert cluster.state.accesses == [] and cluster.state.google_methods == []


def test_a_folder_source_from_a_checkout_the_stack_was_not_deployed_from_is_refused_before_any_upload(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
):
    """Its runner is not the one the stack uploaded: every pod's fetch step would fail to read it."""
    folder = tmp_path / "exp"
    folder.mkdir()
    shutil.copy(TRAINER / "train.py", folder)
    with storage_emulator() as storage:
        requests.post(f"{storage}/storage/v1/b", params={"project": CFG.project}, json={"name": ARTIFACTS}, timeout=10)
        put(storage, ARTIFACTS, "runners/" + "0" * 64 + ".tar.gz", b"another checkout's runner")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage)
        assert cluster.run("submit", "--team", "vision", "--folder", str(folder), "--", "python3", "train.py") == 2
        listed = requests.get(f"{storage}/storage/v1/b/{ARTIFACTS}/o", timeout=10).json().get("items", [])
    err = capsys.readouterr().err
    assert f"stack 'gke' holds no runner gs://{ARTIFACTS}/{agent_package().object_name}" in err
    assert "run tpu-runs from the checkout the stack was deployed from" in err
    assert [item["name"] for item in listed] == ["runners/" + "0" * 64 + ".tar.gz"]  # nothing uploaded
    assert cluster.state.accesses == [] and cluster.state.google_methods == []

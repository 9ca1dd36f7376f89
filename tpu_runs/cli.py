"""`tpu-runs`: submit, list, logs, fetch, stop and report self-service runs on a stack's TPU VMs.

The stack file (Pulumi.<stack>.yaml, read with the program's own strict parser) says which project,
buckets and VMs there are, and which VMs take researchers' runs (selfService). Everything of a
researcher's is in folders of their own (infra/naming.py, docs/design-isolation.md): their requests in
`gs://<status-bucket>/<vm>/requests/<member>/`, where the VM's agent takes them, their runs' states in
`<vm>/runs/<member>/`, results in `gs://<models>/<workload>/<vm>/<member>/<runId>/`, and output in their
own log, read through their own log view. Who they are (`--requester`, else gcloud's account) names
those folders; IAM lets them read and write no one else's.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from infra import naming
from infra.config import ConfigError, PlatformConfig, TpuVmSettings, parse_stack_config
from infra.config.stackfile import ROOT, StackFileError, read_stack_config
from infra.config.workload_code import reading_repository
from infra.gke.jobsets import team_run_prefix
from infra.packaging import PackagingError, package
from run_contract import paths
from run_contract.names import IMAGE_REF, MEMBER_ADDRESS_RULE, REQUEST_RUN_ID, REQUEST_RUN_ID_RULE, RESEARCHER, RUN_ID
from run_contract.status import ENDED
from tpu_runs import gke, report
from tpu_runs.gcp import CallError, Google, adc_session
from vm_agent.installs import LOCK_NAMES, requirement_lines

# Requests and states are JSON stored as octet-stream: gcp-storage-emulator reads an `application/json`
# media upload as object metadata (its server.py), and nothing reads the content type.
JSON_BYTES = "application/octet-stream"


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class Stack:
    cfg: PlatformConfig

    @property
    def status(self) -> str:
        return self.cfg.bucket_name("status")

    @property
    def models(self) -> str:
        return self.cfg.bucket_name("models")

    @property
    def artifacts(self) -> str:
        return self.cfg.bucket_name(naming.ARTIFACTS)

    def vm(self, name: str) -> TpuVmSettings:
        for vm in self.cfg.tpu_vms:
            if vm.name == name:
                return vm
        known = ", ".join(v.name for v in self.cfg.tpu_vms) or "none"
        raise UsageError(f"stack '{self.cfg.stack}' has no TPU VM {name!r} (it has: {known})")

    def self_service(self, name: str) -> TpuVmSettings:
        vm = self.vm(name)
        if not vm.self_service:
            allowing = ", ".join(v.name for v in self.cfg.self_service_vms) or "none"
            raise UsageError(
                f"TPU VM {name} of stack '{self.cfg.stack}' does not take self-service runs (selfService is false; "
                f"runs there go through a reviewed change of Pulumi.{self.cfg.stack}.yaml). VMs that do: {allowing}"
            )
        return vm


def repository_of(stack_file: Path | None) -> Path:
    """The platform repository a stack belongs to: the nearest folder holding `Pulumi.yaml` above the
    stack file (or the working folder), else the checkout this command was installed from (editable)."""
    start = (stack_file.resolve().parent if stack_file else Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "Pulumi.yaml").is_file():
            return folder
    if (ROOT / "Pulumi.yaml").is_file():
        return ROOT
    where = f"{stack_file} is not" if stack_file else "the working folder is not"
    raise UsageError(
        f"{where} inside a tpu-platform repository (no Pulumi.yaml above it): give the stack file of your "
        "platform's checkout, like --stack-file ~/tpu-platform/Pulumi.dev.yaml"
    )


def load_stack(stack: str, stack_file: Path | None) -> Stack:
    root = repository_of(stack_file)
    try:
        raw = read_stack_config(stack, root, stack_file)
        with reading_repository(root):  # its folders and examples, not those of this command's own install
            return Stack(parse_stack_config(stack, raw))
    except (StackFileError, ConfigError) as error:
        raise UsageError(str(error)) from None


def requester(given: str | None) -> str:
    """Who asks: --requester, else TPU_RUNS_REQUESTER, else gcloud's active account (user:EMAIL)."""
    who = given or os.environ.get("TPU_RUNS_REQUESTER")
    if not who:
        config = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
        active = (config / "active_config").read_text().strip() if (config / "active_config").exists() else "default"
        parser = configparser.ConfigParser()
        parser.read(config / "configurations" / f"config_{active}")
        account = parser.get("core", "account", fallback="")
        who = f"user:{account}" if account else ""
    if not RESEARCHER.fullmatch(who or ""):
        raise UsageError(
            f"who is asking? {who!r}: pass --requester user:EMAIL, {MEMBER_ADDRESS_RULE} (or set gcloud's account)"
        )
    return who


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def _request_name(vm: str, who: str, run_id: str, stop: bool = False) -> str:
    return f"{paths.member_requests_prefix(vm, who)}{_stamp()}-{'stop-' if stop else ''}{run_id}.json"


def _put_request(google: Google, stack: Stack, name: str, body: dict[str, Any]) -> None:
    """A new request object; one of the same name (the same run, asked twice within a second) is not replaced."""
    if not google.create(stack.status, name, json.dumps(body, indent=1).encode(), JSON_BYTES):
        raise UsageError(f"gs://{stack.status}/{name} exists already: that request was made a moment ago, not again")


def _state(google: Google, stack: Stack, vm: str, who: str, run_id: str) -> dict[str, Any] | None:
    raw = google.read(stack.status, f"{paths.member_runs_prefix(vm, who)}{run_id}/status.json")
    return json.loads(raw) if raw else None


# --- commands -------------------------------------------------------------------------------------


def submit(google: Google, stack: Stack, args: argparse.Namespace) -> int:
    if args.team:
        if args.python:
            raise UsageError(
                "--python: on the GKE engine a folder source runs in the Python of the stack's folder image "
                f"(tpu-platform:gke.folderImage in Pulumi.{stack.cfg.stack}.yaml): name it in the command, "
                "e.g. -- python3 train.py"
            )
        team = gke.team_of(stack, args.team)
        run_id, command, env, source = _run_fields(stack, args)
        if source is None:
            gke.folder_image(stack)  # refused before anything is uploaded
            for lock in LOCK_NAMES:  # the VM agent installs them (vm_agent/installs.py); no pod does yet
                path = Path(args.folder) / lock
                if path.is_file() and requirement_lines(path.read_text()):
                    raise UsageError(
                        f"--folder {args.folder} has requirements ({lock}): on the GKE engine a folder runs with the "
                        "packages of the stack's gke.folderImage and installs none; build them into an --image"
                    )
            gke.check_runner(google, stack, team)
            source = _upload(google, stack, args.folder, naming.team_sources_prefix(team.name))
        request = {
            "runId": run_id,
            "source": source,
            "command": command,
            "env": env,
            "requester": requester(args.requester),
        }
        return gke.submit(google, stack, team, args, request)
    vm = stack.self_service(args.vm)
    run_id, command, env, source = _run_fields(stack, args)
    if source is None:
        source = _upload(google, stack, args.folder, paths.SOURCES_PREFIX)
    who = requester(args.requester)
    if _state(google, stack, vm.name, who, run_id) is not None:
        raise UsageError(f"run id {run_id} was used before on {vm.name}: choose another (--run-id)")
    spec: dict[str, Any] = {"runId": run_id, "source": source, "command": command, "env": env, "requester": who}
    if args.python:
        spec["python"] = args.python
    request = _request_name(vm.name, who, run_id)
    _put_request(google, stack, request, spec)
    print(f"submitted run {run_id} to {vm.name}: gs://{stack.status}/{request}")
    print(f"follow it: tpu-runs logs --stack {stack.cfg.stack} --vm {vm.name} {run_id} --follow")
    return 0


def _upload(google: Google, stack: Stack, folder: str, prefix: str) -> dict[str, str]:
    """A folder source, packaged exactly as the stack packages its folders (the same files, the same digest), as an
    object of the artifacts bucket under `prefix` named by its digest: uploaded once, never replaced."""
    try:
        archive = package(Path(folder))
    except PackagingError as error:
        raise UsageError(f"--folder {folder}: {error}") from None
    data, digest = archive.data, archive.sha256
    name = paths.source_object(digest, prefix)
    stored = google.stat(stack.artifacts, name)
    if stored is not None:
        # Anyone who may upload under the prefix may have put other bytes under this name first, and every run of
        # the folder would then fail its digest check: the object must hold these bytes. Cloud Storage keeps an
        # object's MD5 as base64 in md5Hash (storage.v1 Object; a composite object has none, and no upload of
        # ours makes one).
        if stored.get("md5Hash") != base64.b64encode(hashlib.md5(data).digest()).decode():
            raise UsageError(
                f"gs://{stack.artifacts}/{name} holds other bytes than {folder}'s archive, which is named by its "
                "digest: every run of it would fail to check them. Ask the stack's admins (the team's, on the GKE "
                "engine) to remove that object, then submit again"
            )
        print(f"source {digest[:12]} is there already")
    else:
        google.create(stack.artifacts, name, data, "application/gzip")
        print(f"uploaded {folder} ({len(data):,} bytes) as gs://{stack.artifacts}/{name}")
    return {"kind": "folder", "uri": f"gs://{stack.artifacts}/{name}", "sha256": digest}


def _run_fields(stack: Stack, args: argparse.Namespace) -> tuple[str, list[str], dict[str, str], dict[str, str] | None]:
    """What submit's flags say, on either engine: the run id, command, env, and an image source (None: a folder)."""
    run_id = args.run_id or f"r{_stamp().lower().replace('t', '-')[:15]}"
    if not REQUEST_RUN_ID.fullmatch(run_id):
        raise UsageError(f"run id {run_id!r}: {REQUEST_RUN_ID_RULE}")
    command = [c for c in args.command if c != "--"] if args.command else []
    if not command:
        raise UsageError("give the command to run after --, e.g. -- python train.py --epochs 3")
    env = dict(item.split("=", 1) for item in args.env or [] if "=" in item)
    if len(env) != len(args.env or []):
        raise UsageError("--env takes NAME=value")
    if args.image:
        image = IMAGE_REF.fullmatch(args.image)
        if image is None or not image["digest"] or image["region"] != stack.cfg.region:
            raise UsageError(
                f"--image {args.image!r}: an image of {stack.cfg.region}-docker.pkg.dev/{stack.cfg.project}/… "
                "pinned by digest (@sha256:…)"
            )
        return run_id, command, env, {"kind": "image", "image": args.image}
    return run_id, command, env, None


def list_runs(google: Google, stack: Stack, args: argparse.Namespace) -> int:
    """Each VM's TPU state; on self-service VMs, the researcher's own runs (no one else's are theirs to read).
    With --team, the team's runs on the GKE engine and their Kueue state."""
    if args.team:
        return gke.list_runs(google, stack, gke.team_of(stack, args.team))
    vms = [stack.vm(args.vm)] if args.vm else list(stack.cfg.tpu_vms)
    who = requester(args.requester)
    nodes: dict[str, dict[str, Any]] = {}
    for zone in sorted({z for vm in vms for z in vm.zones}):
        for node in google.nodes(stack.cfg.project, zone):
            nodes[node["name"].rsplit("/", 1)[-1]] = node
    for vm in vms:
        mine = [n for name, n in sorted(nodes.items()) if name == vm.name or name.startswith(f"{vm.name}-")]
        states = ", ".join(sorted({n.get("state", "?") for n in mine})) or "absent"
        service = "yes" if vm.self_service else "no"
        print(f"{vm.name}  {vm.accelerator.name}  {vm.zone}  TPU: {states}  self-service: {service}")
        if not vm.self_service:
            continue
        prefix = paths.member_runs_prefix(vm.name, who)
        for item in google.list_objects(stack.status, prefix):
            if not item["name"].endswith("/status.json"):
                continue
            raw = google.read(stack.status, item["name"])
            state = json.loads(raw) if raw else {}
            reason = f"  ({state['reason']})" if state.get("reason") else ""
            print(
                f"  {state.get('runId', '?'):<32} {state.get('state', '?'):<9} {state.get('requester') or '':<30}"
                f" {state.get('endedAt') or state.get('startedAt') or ''}{reason}"
            )
    return 0


def _format(entry: dict[str, Any]) -> str:
    payload = entry.get("jsonPayload")
    text = entry.get("textPayload")
    if payload is not None:
        text = payload.get("message") if set(payload) == {"message"} else json.dumps(payload, sort_keys=True)
    labels = entry.get("labels") or {}
    worker = labels.get("worker") or gke.worker_of(labels)  # the VM agent's label, or a GKE pod's slice/worker
    return f"{entry.get('timestamp', '')} {entry.get('severity', 'DEFAULT'):<8} {worker:>2} {text}"


def logs(google: Google, stack: Stack, args: argparse.Namespace) -> int:
    """The run's output, read through the researcher's own log view (infra/researchers.py): it shows their
    runs' log and nothing else, whatever the filter asks. With --team, through the team's view, which shows
    its namespace's containers and nothing else (infra/gke/team_access.py)."""
    if args.team:
        source = gke.log_source(google, stack, gke.team_of(stack, args.team), args.run_id)
        return _read_log(google, source.view, source.filter, args, source.ended, source.refused)
    vm = stack.self_service(args.vm)
    who = requester(args.requester)
    view = naming.researcher_log_view(stack.cfg.project, who)
    run = f"{paths.member_key(who)}/{args.run_id}"  # the agent's id of a researcher's run (vm_agent/run_requests.py)

    def ended() -> tuple[str, int] | None:
        state = _state(google, stack, vm.name, who, args.run_id) or {}
        if state.get("state") not in ENDED:
            return None
        said = f"run {args.run_id} {state['state']}" + (f": {state['reason']}" if state.get("reason") else "")
        return said, 0 if state["state"] == "finished" else 1

    return _read_log(google, view, f'labels.runId="{run}" AND labels.vm="{vm.name}"', args, ended)


def _read_log(
    google: Google,
    view: str,
    base: str,
    args: argparse.Namespace,
    ended: Callable[[], tuple[str, int] | None],
    refused: str = "",
) -> int:
    """Print the entries of `view` that `base` selects, oldest first; with --follow, then the new ones, until
    `ended` says the run is over (what to say, and the exit code)."""
    last = ""
    while True:
        token = None
        while True:
            page = google.entries(view, base + (f' AND timestamp>"{last}"' if last else ""), token, refused)
            for entry in page.get("entries", []):
                print(_format(entry), flush=True)
                last = max(last, entry.get("timestamp", ""))
            token = page.get("nextPageToken")
            if not token:
                break
        if not args.follow:
            return 0
        over = ended()
        if over is not None:
            print(over[0])
            return over[1]
        time.sleep(args.interval)


def model_prefix(vm: TpuVmSettings, who: str, run_id: str) -> str:
    """Where a researcher's run keeps its model and metrics: `<workload>/<vm>/<member>/<runId>/` in the
    models bucket; the agent gives a request's run this TPU_PLATFORM_MODEL_DIR (vm_agent/run_requests.py
    RunPlaces)."""
    return f"{paths.member_objects_prefix(vm.workload, vm.name, who)}{run_id}/"


def fetch(google: Google, stack: Stack, args: argparse.Namespace) -> int:
    """The run's model and metrics: a researcher's own run's folder, or with --team, the team's run's
    (`teams/<team>/<runId>/`, where the JobSet's TPU_PLATFORM_MODEL_DIR points: infra/gke/jobsets.py)."""
    if args.team:
        team = gke.team_of(stack, args.team)
        prefix, refused = team_run_prefix(team.name, args.run_id), gke.refused_data(stack, team)
    else:
        prefix, refused = model_prefix(stack.self_service(args.vm), requester(args.requester), args.run_id), ""
    target = Path(args.to or args.run_id)
    count = 0
    for item in google.list_objects(stack.models, prefix, refused):
        relative = item["name"][len(prefix) :]
        path = (target / relative).resolve()
        if not relative or relative.endswith("/") or not path.is_relative_to(target.resolve()):
            continue
        data = google.read(stack.models, item["name"], refused)
        if data is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        count += 1
    if not count:
        raise UsageError(f"nothing under gs://{stack.models}/{prefix} yet (has run {args.run_id} written a model?)")
    print(f"fetched {count} file{'s' if count != 1 else ''} of run {args.run_id} into {target}/")
    return 0


def stop(google: Google, stack: Stack, args: argparse.Namespace) -> int:
    """Ask the VM to stop one of the researcher's own runs: the request goes to their own folder, and
    the agent stops only a run of the member whose folder it is."""
    if args.team:
        return gke.stop(google, stack, gke.team_of(stack, args.team), args.run_id)
    vm = stack.self_service(args.vm)
    who = requester(args.requester)
    state = _state(google, stack, vm.name, who, args.run_id)
    if state is None:
        raise UsageError(f"no run {args.run_id} on {vm.name} (tpu-runs list --stack {stack.cfg.stack})")
    if state.get("state") in ENDED:
        print(f"run {args.run_id} has ended already ({state['state']})")
        return 0
    request = _request_name(vm.name, who, args.run_id, stop=True)
    _put_request(google, stack, request, {"stop": args.run_id})
    print(f"asked {vm.name} to stop run {args.run_id}: it gets SIGTERM and its grace period to checkpoint")
    return 0


def report_run(google: Google, stack: Stack, args: argparse.Namespace) -> int:
    """tpu_runs/report.py: one of the researcher's runs (or, `--stack-run`, the stack's run), or all of them."""
    pattern, rule = (
        (RUN_ID, "the stack's run id (tpuVms[].run)") if args.stack_run else (REQUEST_RUN_ID, REQUEST_RUN_ID_RULE)
    )
    if args.run_id and not pattern.fullmatch(args.run_id):
        raise UsageError(f"run id {args.run_id!r}: {rule}")
    if args.month and not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", args.month):
        raise UsageError(f"--month {args.month!r}: a UTC month like 2026-11")
    if args.whole_stack and (args.run_id or args.stack_run or args.history):
        raise UsageError("--all reports every run of the stack: it takes no RUN_ID, --stack-run or --history")
    who = "" if args.stack_run or args.whole_stack else requester(args.requester)
    return report.report(google, stack, args, who)


def _run_id(value: str) -> str:
    """A run id as submit makes them: it goes into object names and the Logging filter, so nothing else."""
    if not REQUEST_RUN_ID.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r}: {REQUEST_RUN_ID_RULE}")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tpu-runs", description=(__doc__ or "").splitlines()[0])
    commands = top.add_subparsers(dest="command_name", required=True)

    def command(
        name: str, helptext: str, vm_required: bool = True, team: bool = False, whole_stack: str = ""
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=helptext, description=helptext)
        sub.add_argument("--stack", required=True, help="the stack (Pulumi.<stack>.yaml)")
        sub.add_argument("--stack-file", type=Path, help="its file, when not ./Pulumi.<stack>.yaml")
        where = sub.add_mutually_exclusive_group(required=vm_required) if team else sub
        where.add_argument("--vm", required=vm_required and not team, help="the TPU VM (tpuVms[].name)")
        if team:
            where.add_argument("--team", help="the GKE engine: your team (gke.teams[].name)")
        if whole_stack:
            where.add_argument("--all", dest="whole_stack", action="store_true", help=whole_stack)
        sub.add_argument("--requester", help="who you are: user:EMAIL or group:EMAIL (default: gcloud's account)")
        return sub

    sub = command(
        "submit",
        "Package a folder (or name an image) and ask a self-service VM, or your team's queue, to run it.",
        team=True,
    )
    sub.add_argument("--pool", help="with --team: the slice pool (gke.slicePools[].name; default: your team's one)")
    sub.add_argument("--slices", type=int, default=1, help="with --team: slices of the pool, for a multislice run")
    sub.add_argument("--priority", help="with --team: a priority class up to your team's (default: medium)")
    what = sub.add_mutually_exclusive_group(required=True)
    what.add_argument("--folder", help="the folder to run (its requirements.txt is installed)")
    what.add_argument("--image", help="a container image in the stack's registry, pinned by digest")
    sub.add_argument("--run-id", help="the run's id (default: r<date>-<time>)")
    sub.add_argument("--env", action="append", help="NAME=value for the program (repeat)")
    sub.add_argument("--python", help="a Python version for the folder's environment, like 3.11")
    sub.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    sub.set_defaults(run=submit)
    sub = command(
        "list", "The stack's VMs, their TPU state and their runs; or your team's.", vm_required=False, team=True
    )
    sub.set_defaults(run=list_runs)
    sub = command(
        "report",
        "Where a run's time went and what it cost, by category, in chip-hours and list-price USD; or, with --team, "
        "your team's runs as Kueue saw them; or, with --all, the whole stack's.",
        team=True,
        whole_stack="an operator's report: every VM's runs (their whole folders) and every GKE team's, a line each "
        "and the stack's total (docs/goodput.md says the roles it needs)",
    )
    sub.add_argument("run_id", metavar="RUN_ID", nargs="?", help="one run (default: every run of yours on the VM)")
    sub.add_argument(
        "--stack-run",
        action="store_true",
        help="the stack's run; without RUN_ID, all runs on the VM (its whole folder)",
    )
    sub.add_argument("--month", help="without RUN_ID: runs that started in this UTC month, like 2026-11")
    sub.add_argument("--json", action="store_true", help="the report as JSON")
    sub.add_argument("--history", type=Path, help="also write the runs' preemption record here (whatif --history)")
    sub.set_defaults(run=report_run)
    for name, helptext, run in (
        (
            "logs",
            "A run's log from Cloud Logging. Its lines are untrusted: whatever may write logs in the project (a VM's "
            "or a GKE node's account) can write one that looks like your run's, and Logging records no writer.",
            logs,
        ),
        ("fetch", "Download a run's model and metrics.", fetch),
        ("stop", "Ask a self-service VM to stop a run (SIGTERM; it checkpoints).", stop),
    ):
        sub = command(name, helptext, team=True)
        sub.add_argument("run_id", metavar="RUN_ID", type=_run_id)
        sub.set_defaults(run=run)
        if name == "logs":
            sub.add_argument("--follow", "-f", action="store_true", help="keep reading until the run ends")
            sub.add_argument("--interval", type=float, default=5.0, help=argparse.SUPPRESS)
        if name == "fetch":
            sub.add_argument("--to", help="the local folder (default: ./RUN_ID)")
    return top


def main(argv: Sequence[str] | None = None, session: requests.Session | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        stack = load_stack(args.stack, args.stack_file)
        if getattr(args, "team", None):
            gke.team_of(stack, args.team)  # refused before any call
        elif (
            args.command_name != "list"
            and not getattr(args, "stack_run", False)
            and not getattr(args, "whole_stack", False)
        ):
            stack.self_service(args.vm)  # a researcher's runs are on self-service VMs only: refused before any call
        google = Google(session or adc_session(), stack.cfg.stack)
        return args.run(google, stack, args)
    except (UsageError, CallError, OSError, gke.TeamError) as error:
        print(f"tpu-runs: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # leaving `logs --follow`: the run goes on
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Render a TPU VM's start-up: the `startup-script` and the `tpu-platform-env` metadata it reads.

Pure and deterministic (same inputs, same bytes), so a plan shows no change unless the workload or
its settings changed. The script runs as root on every boot of every worker of the slice, and is
idempotent:
  1. check what the catalog could not know about the image (its Python, its framework), and install
     the pinned framework only when the image lacks it, only from the catalog's lock for that
     release (`pip --require-hashes --no-deps`; no lock: refused). A boot whose image cannot run the
     workload logs one `tpu-platform: FATAL:` line, exits 78 and starts nothing: no restart loop
     keeps a TPU billing;
  2. fetch the VM agent (vm_agent/, packaged by the stack) and its wheelhouse (Google's client library
     for Cloud Storage and its dependencies, tools/agent_wheelhouse.py) as the VM's own account, and
     keep each only if its bytes hash to the digest the stack shipped; then check the agent's own
     virtualenv against the wheelhouse, on every boot, and install it afresh from the wheelhouse when it
     is not whole (vm_agent/environment.py: pip with no index and every hash checked). An image whose
     Python the wheelhouse does not serve gets the FATAL line and exit 78, as in 1;
  3. write the agent's settings (the `tpu-platform-env` metadata, so a settings change is a metadata
     update, not a new script) with this worker's place in a multi-host slice (worker id, worker
     count, the coordinator's address), and install the agent as a systemd unit: it restarts on
     failure (a few times an hour at most, never after exit 78, a configuration error), logs to the
     journal and is stopped before Docker with the run's grace period;
  4. start it. The agent (docs/run-contract.md) runs the workload as the `tpu-platform-run` metadata
     says: it does nothing for a completed run and resumes an unfinished one from its newest
     checkpoint after a reboot, a preemption or a re-created VM.

`TPU_PLATFORM_ROOT`, `TPU_PLATFORM_PYTHON`, `GCE_METADATA_HOST`, `TPU_PLATFORM_COORDINATOR_PORT` and
`TPU_PLATFORM_METADATA_REDIRECT` let the tests run the very same script in a sandbox (files under a
temporary root, a metadata server on loopback, two workers of one slice on one machine, the machine's
firewall left alone).
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

# Worker 0 serves JAX's distributed runtime at COORDINATOR_PORT, passed explicitly so the same start-up path
# works where JAX's own detection is off (a CPU sandbox).
from run_contract.names import COORDINATOR_PORT, ENV_ATTRIBUTE, EXIT_RETRY, RUN_ATTRIBUTE

# GCE metadata limits (https://cloud.google.com/compute/docs/metadata/setting-custom-metadata#limitations).
MAX_METADATA_VALUE_BYTES = 256 * 1024
MAX_METADATA_TOTAL_BYTES = 512 * 1024

# The module each framework imports as, to check the image's version. When the image lacks the pinned
# version, the boot installs it only from the catalog's lock for it (infra/catalog/framework_locks: jax[tpu]
# with its libtpu, or tensorflow-tpu), every file checked against its hash; without a lock it refuses.
FRAMEWORK_MODULES = {"tensorflow": "tensorflow", "jax": "jax"}
_LOCK_END = "TPU_PLATFORM_FRAMEWORK_LOCK"
_SAFE_LOCK = re.compile(r"([A-Za-z0-9][A-Za-z0-9._\[\],-]*==[A-Za-z0-9.+!_-]+( --hash=sha256:[0-9a-f]{64})+\n)*")
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_./:@=+,-]*")
_SAFE_CONSTRAINT = re.compile(r"[A-Za-z0-9_.-]+(<|<=|>=|==|!=)[0-9][A-Za-z0-9.]*")
_SAFE_MESSAGE = re.compile(r'[^"$`\n\\]*')
_SAFE_BUCKET = re.compile(r"[a-z0-9][a-z0-9_.-]{1,220}[a-z0-9]")
_SAFE_OBJECT = re.compile(r"[A-Za-z0-9_./-]{1,1024}")
# The start-up script's and the agent's exit status for "this configuration cannot work": systemd
# does not restart the unit for it (RestartPreventExitStatus), and GCE does not re-run the script.
EXIT_CONFIG = 78  # EX_CONFIG of sysexits.h


@dataclass(frozen=True)
class Artifact:
    """An object the VM fetches at boot and runs only if its bytes hash to `sha256`."""

    bucket: str
    name: str
    sha256: str

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.name}"


@dataclass(frozen=True)
class StartupSpec:
    stack: str
    vm: str
    workload: str
    agent: Artifact  # the platform's runner on the VM (vm_agent/), packaged by the stack
    # The agent's wheelhouse (tools/agent_wheelhouse.py), and the Pythons it holds wheels for ("3.10", ...).
    agent_environment: Artifact
    agent_pythons: tuple[str, ...]
    # The agent's static settings (`agent.env`, docs/run-contract.md): NAME=value, from metadata.
    settings: tuple[tuple[str, str], ...]
    # The framework the image must hold for this workload ("" when the workload names none: nothing is
    # checked or installed at boot, the source's requirements bring what it needs).
    framework: str = ""
    framework_version: str = ""
    # What the runtime needs (infra/catalog): the process environment, bounds kept when the program's
    # requirements are installed, the oldest Python the framework accepts, and why the framework cannot
    # be installed at boot ("" when it can).
    environment: tuple[tuple[str, str], ...] = ()
    constraints: tuple[str, ...] = ()
    min_python: str = ""
    install_problem: str = ""
    # The catalog's lock for the framework (infra/catalog framework_lock), installed with --require-hashes
    # when the image lacks the version; "" when there is none (install_problem then says why).
    framework_lock: str = ""
    grace_seconds: int = 30


AGENT_UNIT = "tpu-platform-agent.service"


def _check(spec: StartupSpec) -> None:
    for name, value in (*spec.settings, *spec.environment):
        if not _SAFE_VALUE.fullmatch(value) or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            raise ValueError(f"unsafe setting {name}={value!r} for TPU VM {spec.vm}")
    for constraint in spec.constraints:
        if not _SAFE_CONSTRAINT.fullmatch(constraint):
            raise ValueError(f"unsafe constraint {constraint!r}")
    if not re.fullmatch(r"(\d+\.\d+)?", spec.min_python) or not _SAFE_MESSAGE.fullmatch(spec.install_problem):
        raise ValueError(f"unsafe runtime facts {spec.min_python!r}, {spec.install_problem!r}")
    if not _SAFE_LOCK.fullmatch(spec.framework_lock):
        raise ValueError("the framework lock holds a line that is not a pinned requirement with its hashes")
    if spec.framework and spec.framework not in FRAMEWORK_MODULES:
        raise ValueError(f"unknown framework {spec.framework!r}")
    if not re.fullmatch(r"[0-9][A-Za-z0-9.]*|", spec.framework_version):
        raise ValueError(f"unsafe framework version {spec.framework_version!r}")
    for artifact in (spec.agent, spec.agent_environment):
        if not (_SAFE_BUCKET.fullmatch(artifact.bucket) and _SAFE_OBJECT.fullmatch(artifact.name)):
            raise ValueError(f"unsafe agent location {artifact.uri!r}")
        if not re.fullmatch(r"[0-9a-f]{64}", artifact.sha256):
            raise ValueError(f"agent digest {artifact.sha256!r} is not a sha256")
    if not spec.agent_pythons or not all(re.fullmatch(r"3\.\d+", p) for p in spec.agent_pythons):
        raise ValueError(f"unsafe agent Pythons {spec.agent_pythons!r}")


def render_env(spec: StartupSpec) -> str:
    """The `tpu-platform-env` metadata value: the agent's settings, one NAME=value per line."""
    _check(spec)
    return "".join(f"{name}={value}\n" for name, value in spec.settings)


def _python_at_least(version: str) -> str:
    """A shell test that the image's `${PYTHON}` is `version` ("3.10") or newer."""
    major, minor = version.split(".")
    return f"""\"${{PYTHON}}\" -c 'import sys; sys.exit(sys.version_info < ({major}, {minor}))'"""


def _ensure_framework(spec: StartupSpec) -> str:
    """The boot's check of the image's framework, and its install when the image lacks it."""
    if not spec.framework:
        return ""
    module = FRAMEWORK_MODULES[spec.framework]
    if spec.min_python:
        need = f"{spec.framework} ${{FRAMEWORK_VERSION}} needs Python {spec.min_python} or newer"
        python_check = f"""  if ! {_python_at_least(spec.min_python)}; then
    fatal "{need}; this image has $("${{PYTHON}}" -V 2>&1)"
  fi
"""
    else:
        python_check = ""
    if spec.install_problem or not spec.framework_lock:
        found = "(found: ${installed:-none})"
        problem = spec.install_problem or "the catalog has no lock to install it by hash"
        why = f"{spec.framework} ${{FRAMEWORK_VERSION}} is not installed {found}: {problem}"
        install = f'    fatal "{why}"'
    else:
        # Exactly the lock's files, each checked against its sha256; pip resolves nothing of its own.
        install = f"""    log "installing {spec.framework} ${{FRAMEWORK_VERSION}} by hash (found: ${{installed:-none}})"
    local lock
    lock="$(mktemp)"
    cat > "${{lock}}" <<'{_LOCK_END}'
{spec.framework_lock}{_LOCK_END}
    "${{PYTHON}}" -m pip install --quiet --require-hashes --no-deps -r "${{lock}}"
    rm -f "${{lock}}\""""
    return f"""readonly FRAMEWORK_VERSION={spec.framework_version}

framework_version() {{
  "${{PYTHON}}" -c 'import {module}; print({module}.__version__)' 2>/dev/null || true
}}

# The framework lives in the image's Python, which every run's virtualenv sees (--system-site-packages).
ensure_framework() {{
{python_check}  local installed
  installed="$(framework_version)"
  if [[ "${{installed}}" == "${{FRAMEWORK_VERSION}}" ]]; then
    log "{spec.framework} ${{installed}} is already installed"
  else
{install}
  fi
  installed="$(framework_version)"
  if [[ "${{installed}}" != "${{FRAMEWORK_VERSION}}" ]]; then
    fatal "{spec.framework} ${{FRAMEWORK_VERSION}} does not import after the installs (found: ${{installed:-none}})"
  fi
}}

"""


# The shell functions that fetch an object of the artifacts bucket and keep it only if its bytes hash to the
# digest the platform shipped: one home, rendered into the TPU VM's start-up script and into the GKE engine's
# fetch step for a folder source (render_pod_fetch). They need METADATA, STORAGE, PYTHON, ROOT, `fatal` (a
# refusal: exit 78) and `retryable` (a failure that may heal: exit 75).
# The retries are curl's own (--retry 5: waits of 1, 2, 4, 8 and 16 s), on what Cloud Storage's retry strategy
# calls transient (https://cloud.google.com/storage/docs/retry-strategy, "Response": HTTP 408, 429 and 5xx,
# socket timeouts and TCP disconnects): curl retries 408, 429, 500, 502, 503 and 504 and timeouts by itself,
# and --retry-all-errors (curl 7.71 or newer) adds every transfer error (refused, reset, a cut body); without
# --fail an HTTP answer is no transfer error, so a 403 or 404, which no retry mends, is not retried. What
# still fails after them is sorted by its answer: none, 408, 429 or 5xx may heal (`retryable`), the rest is
# a refusal (`fatal`). A token the metadata server does not give may heal too (the GKE metadata server answers
# no pod in its first seconds: r-lib/gargle#186, googleapis/google-auth-library-python#1261).
METADATA_FUNCTION = """metadata() {
  curl --silent --fail --retry 5 --retry-connrefused -H 'Metadata-Flavor: Google' "${METADATA}/$1"
}
"""

FETCH_VERIFIED_FUNCTION = """fetch_verified() {
  local url="$1" archive="$2" sha256="$3" what="$4"
  install -d -m 0755 "${ROOT}/opt/tpu-platform"
  install -d -m 0700 "$(dirname "${archive}")"
  if [[ -f "${archive}" ]] && echo "${sha256}  ${archive}" | sha256sum --check --quiet --status; then
    return 0
  fi
  local token partial="${archive}.partial" answer status=0
  token="$(metadata instance/service-accounts/default/token \\
    | "${PYTHON}" -c 'import json, sys; print(json.load(sys.stdin)["access_token"])')" \\
    || retryable "the metadata server gave no token to read ${what}"
  # The token goes to curl on stdin, not on its command line, where any local user could read it.
  answer="$(curl --silent --show-error --retry 5 --retry-all-errors --write-out '%{http_code}' -H @- \\
    -o "${partial}" "${url}" <<< "Authorization: Bearer ${token}")" || status=$?
  if (( status != 0 )) || [[ "${answer}" != 200 ]]; then
    rm -f "${partial}"
    case "${answer}" in
      000 | 200 | 408 | 429 | 5??) retryable "cannot read ${what} (HTTP ${answer}, curl exit ${status})" ;;
      *) fatal "cannot read ${what} (HTTP ${answer:-none}, curl exit ${status})" ;;
    esac
  fi
  if ! echo "${sha256}  ${partial}" | sha256sum --check --quiet --status; then
    rm -f "${partial}"
    fatal "${what} does not match its digest ${sha256}"
  fi
  chmod 0600 "${partial}" && mv "${partial}" "${archive}"
}
"""


def render_startup_script(spec: StartupSpec) -> str:
    _check(spec)
    environment = "".join(f"Environment={name}={value}\n" for name, value in spec.environment)
    framework = _ensure_framework(spec)
    constraints = " ".join(spec.constraints)
    agent_object = urllib.parse.quote(spec.agent.name, safe="")
    environment_object = urllib.parse.quote(spec.agent_environment.name, safe="")
    pythons = "|".join(spec.agent_pythons)
    verify = (
        f'echo "{spec.agent.sha256}  @AGENT_ARCHIVE@" | sha256sum --check --quiet --status '
        f'|| {{ echo "tpu-platform: FATAL: @AGENT_ARCHIVE@ does not match {spec.agent.sha256}" >&2; '
        f"exit {EXIT_CONFIG}; }}; "
        "rm -rf @AGENT_DIR@ && mkdir -p -m 0700 @AGENT_DIR@ && "
        "tar --extract --gzip --no-same-owner --file @AGENT_ARCHIVE@ --directory @AGENT_DIR@"
    )

    return f"""#!/bin/bash
# tpu-platform start-up for TPU VM {spec.vm} (stack {spec.stack}), workload {spec.workload}.
# Rendered by infra/startup.py; runs as root on every boot of every worker. Edit the stack, not this.
# It checks the image, fetches the platform's agent (verified by its digest) and starts it; the agent
# runs the workload as the `{RUN_ATTRIBUTE}` metadata says, and starts a new run when that changes.
set -euo pipefail

readonly ROOT="${{TPU_PLATFORM_ROOT:-}}"
readonly PYTHON="${{TPU_PLATFORM_PYTHON:-/usr/bin/python3}}"
readonly METADATA="http://${{GCE_METADATA_HOST:-metadata.google.internal}}/computeMetadata/v1"
# The Cloud Storage JSON API (https://cloud.google.com/storage/docs/json_api/v1/objects/get, alt=media).
readonly STORAGE="${{STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}}"
readonly AGENT_SHA256={spec.agent.sha256}
readonly AGENT_URL="${{STORAGE}}/storage/v1/b/{spec.agent.bucket}/o/{agent_object}?alt=media"
readonly AGENT_DIR="${{ROOT}}/opt/tpu-platform/agent/${{AGENT_SHA256}}"
readonly AGENT_ARCHIVE="${{AGENT_DIR}}.tar.gz"
readonly WHEELHOUSE_SHA256={spec.agent_environment.sha256}
readonly WHEELHOUSE_URL="${{STORAGE}}/storage/v1/b/{spec.agent_environment.bucket}/o/{environment_object}?alt=media"
readonly WHEELHOUSE="${{ROOT}}/opt/tpu-platform/agent-wheelhouse/${{WHEELHOUSE_SHA256}}.tar.gz"
# The agent's own virtualenv, one per wheelhouse: root's alone, checked on every boot.
readonly AGENT_ENV="${{ROOT}}/opt/tpu-platform/agent-env/${{WHEELHOUSE_SHA256}}"
readonly ENV_FILE="${{ROOT}}/etc/tpu-platform/agent.env"
readonly UNIT_FILE="${{ROOT}}/etc/systemd/system/{AGENT_UNIT}"
readonly UNIT={AGENT_UNIT}
readonly COORDINATOR_PORT="${{TPU_PLATFORM_COORDINATOR_PORT:-{COORDINATOR_PORT}}}"

log() {{ echo "tpu-platform: $*"; }}

# A configuration this image cannot run: say so once and start nothing (GCE runs this script once
# per boot; nothing restarts it), rather than leave a unit failing in a loop while the TPU bills.
fatal() {{
  echo "tpu-platform: FATAL: $*; not starting ${{UNIT}}. Fix the stack (see the plan's catalog checks)." >&2
  exit {EXIT_CONFIG}
}}

# A failure that may heal (Cloud Storage or the metadata server unreachable or busy after curl's retries): said
# as such, with EX_TEMPFAIL; the next boot tries again.
retryable() {{
  echo "tpu-platform: FATAL: $*; not starting ${{UNIT}}. This may pass: reboot to try again." >&2
  exit {EXIT_RETRY}
}}

{METADATA_FUNCTION}
{framework}# This worker's place in its slice, for the agent's environment: its number (`agent-worker-number`), the
# number of workers and worker 0's address as the coordinator of JAX's distributed runtime. Cloud TPU
# lists the workers in `worker-network-endpoints`, worker 0 first, each `host` or `name:id:ip` (the
# two formats jax/_src/clusters/cloud_tpu_cluster.py reads). A single-host VM: one worker, no coordinator.
slice_env() {{
  local worker endpoints count=1 coordinator=""
  local -a workers=()
  worker="$(metadata instance/attributes/agent-worker-number || echo 0)"
  endpoints="$(metadata instance/attributes/worker-network-endpoints || true)"
  if [[ -n "${{endpoints}}" ]]; then
    IFS=, read -r -a workers <<< "${{endpoints}}"
    count=${{#workers[@]}}
    coordinator="${{workers[0]##*:}}"
    if ! [[ "${{coordinator}}" =~ ^[A-Za-z0-9.-]+$ ]]; then
      fatal "worker-network-endpoints names no address for worker 0: '${{endpoints}}'"
    fi
    coordinator="${{coordinator}}:${{COORDINATOR_PORT}}"
  fi
  if ! [[ "${{worker}}" =~ ^[0-9]+$ ]] || (( worker >= count )); then
    fatal "agent-worker-number '${{worker}}' is not a worker of this ${{count}}-worker slice"
  fi
  echo "TPU_WORKER_ID=${{worker}}"
  echo "TPU_PLATFORM_WORKER_ID=${{worker}}"
  echo "TPU_PLATFORM_WORKER_COUNT=${{count}}"
  echo "TPU_PLATFORM_COORDINATOR=${{coordinator}}"
}}

# An object of the artifacts bucket, as the VM's own account reads it (a token from the metadata server; no
# key on the VM): kept root's alone and fetched again only when missing or not matching the digest the
# stack shipped. Bytes that do not hash to that digest are never unpacked or run.
{FETCH_VERIFIED_FUNCTION}
# The agent runs from its own virtualenv: Google's client library for Cloud Storage and its dependencies,
# from the wheelhouse's wheels for this Python only. The unit checks the agent's archive again and unpacks it
# afresh on every start of the agent (its ExecStartPre), so nothing edited in the unpacked code outlives a
# restart; the virtualenv is checked file by file against its install records on every boot, and made
# afresh from the kept wheelhouse (no package index) when it is not whole (vm_agent/environment.py).
agent_environment() {{
  local version
  version="$("${{PYTHON}}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  case "${{version}}" in
    {pythons}) ;;
    *) fatal "the platform's agent runs on Python {", ".join(spec.agent_pythons)} (its wheelhouse's wheels); \\
this image has Python ${{version}}" ;;
  esac
  fetch_verified "${{AGENT_URL}}" "${{AGENT_ARCHIVE}}" "${{AGENT_SHA256}}" "the agent {spec.agent.uri}"
  fetch_verified "${{WHEELHOUSE_URL}}" "${{WHEELHOUSE}}" "${{WHEELHOUSE_SHA256}}" \\
    "the agent's wheelhouse {spec.agent_environment.uri}"
  # Unpacked here too (just verified): its vm_agent.environment checks the virtualenv.
  rm -rf "${{AGENT_DIR}}" && install -d -m 0700 "${{AGENT_DIR}}"
  tar --extract --gzip --no-same-owner --file "${{AGENT_ARCHIVE}}" --directory "${{AGENT_DIR}}"
  install -d -m 0700 "$(dirname "${{AGENT_ENV}}")"
  PYTHONPATH="${{AGENT_DIR}}" "${{PYTHON}}" -s -m vm_agent.environment "${{WHEELHOUSE}}" "${{AGENT_ENV}}" \\
    "${{WHEELHOUSE_SHA256}}" || exit
}}

write_env() {{
  install -d -m 0700 "$(dirname "${{ENV_FILE}}")"
  # Settings live in metadata: changing them updates the VM in place, and this script reads them anew.
  {{
    metadata "instance/attributes/{ENV_ATTRIBUTE}"
    slice_env
    echo "TPU_PLATFORM_ROOT=${{ROOT}}"
    echo "TPU_PLATFORM_PYTHON=${{PYTHON}}"
    echo "TPU_PLATFORM_PIP_CONSTRAINTS={constraints}"
    # Runs' metadata traffic goes to the agent's proxy (vm_agent/firewall.py). Only the tests' sandbox, which
    # shares its machine's firewall, turns it off (TPU_PLATFORM_METADATA_REDIRECT=0 in the script's env).
    echo "TPU_PLATFORM_METADATA_REDIRECT=${{TPU_PLATFORM_METADATA_REDIRECT:-1}}"
    # The metadata server where google-auth looks (GCE_METADATA_HOST); only a sandbox has another.
    [[ -z "${{GCE_METADATA_HOST:-}}" ]] || echo "GCE_METADATA_HOST=${{GCE_METADATA_HOST}}"
    [[ -z "${{STORAGE_EMULATOR_HOST:-}}" ]] || echo "STORAGE_EMULATOR_HOST=${{STORAGE_EMULATOR_HOST}}"
  }} > "${{ENV_FILE}}.new"
  chmod 0600 "${{ENV_FILE}}.new" && mv "${{ENV_FILE}}.new" "${{ENV_FILE}}"
}}

install_unit() {{
  mkdir -p "$(dirname "${{UNIT_FILE}}")"
  cat > "${{UNIT_FILE}}" <<'TPU_PLATFORM_UNIT'
[Unit]
Description=tpu-platform agent: runs workload {spec.workload} on TPU VM {spec.vm} (stack {spec.stack})
Wants=network-online.target
After=network-online.target
# Stopped before Docker at shutdown (the inverse of the start order, systemd.unit(5) After=), so an
# image run gets its grace period rather than dockerd's own 15 s stop of every container.
Wants=docker.service
After=docker.service
# An agent that keeps failing is given up on after 5 starts an hour, instead of billing in a loop.
StartLimitIntervalSec=3600
StartLimitBurst=5

[Service]
Type=simple
EnvironmentFile=@ENV_FILE@
Environment=PYTHONPATH=@AGENT_DIR@
# Nothing under the agent's virtualenv is written after its install, so each boot's check finds it whole.
Environment=PYTHONDONTWRITEBYTECODE=1
{environment}# Every start: the kept archive checked against the digest the stack shipped, then unpacked afresh
# (the archive holds the packages vm_agent/ and run_contract/, so PYTHONPATH holds those and nothing else).
ExecStartPre=/bin/bash -c '{verify}'
ExecStart=@AGENT_ENV@/bin/python -u -m vm_agent
Restart=on-failure
RestartSec=30
# Exit {EXIT_CONFIG}: a configuration error, which a restart cannot mend.
RestartPreventExitStatus={EXIT_CONFIG}
# Preemption notice or `systemctl stop`: the agent passes SIGTERM on, the run checkpoints within its
# grace period, and the agent records the run as stopped.
KillSignal=SIGTERM
# mixed: SIGTERM to the agent only (it relays it to the run's process group once), SIGKILL to whatever
# is left when the stop times out (systemd.kill(5) KillMode=).
KillMode=mixed
TimeoutStopSec={spec.grace_seconds + 10}
# Runs inherit it: an unprivileged uid maps the TPU's DMA buffers through VFIO into locked memory
# (vm_agent/jail.py raises each run's soft limit to this).
LimitMEMLOCK=infinity
StandardOutput=journal
StandardError=journal
SyslogIdentifier=tpu-platform-agent
TPU_PLATFORM_UNIT
  sed -i -e "s|@ENV_FILE@|${{ENV_FILE}}|" -e "s|@PYTHON@|${{PYTHON}}|" \\
    -e "s|@AGENT_DIR@|${{AGENT_DIR}}|g" -e "s|@AGENT_ARCHIVE@|${{AGENT_ARCHIVE}}|g" \\
    -e "s|@AGENT_ENV@|${{AGENT_ENV}}|g" "${{UNIT_FILE}}"
  systemctl daemon-reload
}}

{"ensure_framework" if spec.framework else ""}
agent_environment
write_env
install_unit
# Every boot: the agent resumes the run from its checkpoint, or does nothing when the run is complete.
systemctl start "${{UNIT}}"
log "agent started as ${{UNIT}}; follow it with: journalctl -u ${{UNIT}} -f"
"""


def metadata_size_problem(metadata: dict[str, str]) -> str | None:
    """Why GCP would refuse this instance metadata, or None."""
    for key, value in metadata.items():
        size = len(value.encode())
        if size > MAX_METADATA_VALUE_BYTES:
            return f"metadata '{key}' is {size:,} bytes; GCP allows {MAX_METADATA_VALUE_BYTES:,} per value"
    total = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
    if total > MAX_METADATA_TOTAL_BYTES:
        return f"metadata totals {total:,} bytes; GCP allows {MAX_METADATA_TOTAL_BYTES:,} per VM"
    return None


def render_pod_fetch(runner: Artifact, source: Artifact, root: str, folder: str, python_floor: str) -> str:
    """The GKE engine's fetch step for a folder source (an initContainer in the pinned public image the stack
    names, infra/gke/jobsets.py): the runner (vm_agent/ and run_contract/, the archive the stack uploads for its
    VMs) and the folder's archive, each fetched as the pod's own identity with a token from the GKE metadata server
    (the slice pools' `workloadMetadataConfig.mode` GKE_METADATA, which "exposes a metadata API to workloads that is
    compatible with the V1 Compute Metadata APIs": container.v1 discovery document) and kept
    only if its bytes hash to the digest the JobSet names; the runner's vm_agent.archives then checks the
    folder's archive again and unpacks it into `<root>/<folder>` refusing anything that would land outside it.
    The runner's code is held to `python_floor` (the catalog's oldest agent Python), so an older python3 in the
    image is refused before it runs. A refusal (a digest that does not match, a member outside the folder, an
    answer such as 403 or 404 that no retry mends, a missing tool) exits 78: the run cannot succeed, and its JobSet
    fails at once rather than retry. A read that still fails after curl's retries but may heal (FETCH_VERIFIED_FUNCTION)
    exits 75, which the JobSet retries within its restarts.
    `TPU_PLATFORM_ROOT` (for `root`), `GCE_METADATA_HOST` and `STORAGE_EMULATOR_HOST` let the tests run the very
    same script on loopback stand-ins, as the start-up script's."""
    for artifact in (runner, source):
        if not _SAFE_BUCKET.fullmatch(artifact.bucket) or not _SAFE_OBJECT.fullmatch(artifact.name):
            raise ValueError(f"unsafe archive location {artifact.uri!r}")
        if not re.fullmatch(r"[0-9a-f]{64}", artifact.sha256):
            raise ValueError(f"archive digest {artifact.sha256!r} is not a sha256")
    if not re.fullmatch(r"(/[A-Za-z0-9_-]+)+", root) or not re.fullmatch(r"[A-Za-z0-9_-]+", folder):
        raise ValueError(f"unsafe folder {root!r}/{folder!r}")
    if not re.fullmatch(r"3\.\d+", python_floor):
        raise ValueError(f"unsafe Python floor {python_floor!r}")

    def url(artifact: Artifact) -> str:
        return f"${{STORAGE}}/storage/v1/b/{artifact.bucket}/o/{urllib.parse.quote(artifact.name, safe='')}?alt=media"

    return f"""set -euo pipefail
# tpu-platform: fetch a folder source and the runner, each checked against its digest (infra/startup.py).
readonly ROOT="${{TPU_PLATFORM_ROOT:-{root}}}"
readonly FOLDER="${{ROOT}}/{folder}"
readonly PYTHON="${{TPU_PLATFORM_PYTHON:-python3}}"
readonly METADATA="http://${{GCE_METADATA_HOST:-metadata.google.internal}}/computeMetadata/v1"
readonly STORAGE="${{STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}}"
readonly ARCHIVES="${{ROOT}}/opt/tpu-platform/archives"
readonly RUNNER="${{ROOT}}/opt/tpu-platform/runner"

fatal() {{
  echo "tpu-platform: FATAL: $*; the run cannot start." >&2
  exit {EXIT_CONFIG}
}}

# A failure that may heal, after curl's retries: exit {EXIT_RETRY}, which no podFailurePolicy rule names, so the
# pod's failure counts against the JobSet's restarts (infra/gke/jobsets.py) and a new pod fetches again.
retryable() {{
  echo "tpu-platform: $*; the run's JobSet restarts it." >&2
  exit {EXIT_RETRY}
}}

for tool in curl sha256sum tar gzip "${{PYTHON}}"; do
  command -v "${{tool}}" >/dev/null || fatal "the folder image has no ${{tool}} (gke.folderImage)"
done
{_python_at_least(python_floor)} \\
  || fatal "the runner needs Python {python_floor}+; the folder image has $("${{PYTHON}}" -V 2>&1) (gke.folderImage)"

{METADATA_FUNCTION}
# An object of the artifacts bucket, as the pod's own identity reads it (the GKE metadata server's token).
{FETCH_VERIFIED_FUNCTION}
fetch_verified "{url(runner)}" "${{ARCHIVES}}/{runner.sha256}.tar.gz" {runner.sha256} \\
  "the runner {runner.uri}"
fetch_verified "{url(source)}" "${{ARCHIVES}}/{source.sha256}.tar.gz" {source.sha256} \\
  "the source {source.uri}"
rm -rf "${{RUNNER}}" && install -d -m 0755 "${{RUNNER}}"
tar --extract --gzip --no-same-owner --file "${{ARCHIVES}}/{runner.sha256}.tar.gz" --directory "${{RUNNER}}"
PYTHONPATH="${{RUNNER}}" "${{PYTHON}}" -s -m vm_agent.archives "${{ARCHIVES}}/{source.sha256}.tar.gz" \\
  {source.sha256} "${{FOLDER}}" || exit {EXIT_CONFIG}
echo "tpu-platform: {source.uri} checked and unpacked into ${{FOLDER}}"
"""

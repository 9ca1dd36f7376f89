"""Render a TPU VM's start-up: the `startup-script` and the `tpu-platform-env` metadata it reads.

Pure and deterministic (same inputs, same bytes), so a plan shows no change unless the workload or
its settings changed. The script runs as root on every boot of every worker of the slice, and is
idempotent:
  1. check what the catalog could not know about the image (its Python, its framework), then install
     the pinned framework and the program's extras only when the image lacks them (S21), the extras
     under the bounds the framework needs (e.g. protobuf<5 next to TensorFlow < 2.18). A boot whose
     image cannot run the workload logs one `tpu-platform: FATAL:` line, exits 78 and starts nothing:
     no restart loop keeps a TPU billing;
  2. write the program files; fetch the run settings from the metadata server (so a settings change
     is a metadata update, not a new script);
  3. if the run's completion marker exists, do nothing more;
  4. otherwise start it as a systemd service with the environment its runtime needs (and this worker's
     place in a multi-host slice: worker id, worker count, the coordinator's address): it restarts on
     failure (a few times an hour at most, never after exit 78, a configuration error), logs structured
     lines to the journal, and resumes from its newest checkpoint after a reboot, a preemption or a
     re-created VM.

`TPU_PLATFORM_ROOT`, `TPU_PLATFORM_PYTHON`, `GCE_METADATA_HOST` and `TPU_PLATFORM_COORDINATOR_PORT` let
the tests run the very same script in a sandbox (files under a temporary root, a metadata server on
loopback, two workers of one slice on one machine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# GCE metadata limits (https://cloud.google.com/compute/docs/metadata/setting-custom-metadata#limitations).
MAX_METADATA_VALUE_BYTES = 256 * 1024
MAX_METADATA_TOTAL_BYTES = 512 * 1024
ENV_ATTRIBUTE = "tpu-platform-env"

# How to install each framework's TPU build when the runtime image lacks the pinned version.
FRAMEWORK_INSTALL = {
    "tensorflow": (
        "tensorflow",
        "tensorflow-tpu=={version}",
        "https://storage.googleapis.com/libtpu-tf-releases/index.html",
    ),
    "jax": ("jax", "jax[tpu]=={version}", "https://storage.googleapis.com/jax-releases/libtpu_releases.html"),
}
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_./:@=+,-]*")
_SAFE_REQUIREMENT = re.compile(r"[A-Za-z0-9_.\[\]-]+==[0-9][A-Za-z0-9.]*")
_SAFE_CONSTRAINT = re.compile(r"[A-Za-z0-9_.-]+(<|<=|>=|==|!=)[0-9][A-Za-z0-9.]*")
_SAFE_MESSAGE = re.compile(r'[^"$`\n\\]*')
# The start-up script's and the program's exit status for "this configuration cannot work": systemd
# does not restart the unit for it (RestartPreventExitStatus), and GCE does not re-run the script.
EXIT_CONFIG = 78  # EX_CONFIG of sysexits.h
# Where worker 0 serves JAX's distributed runtime on a multi-host slice: the port JAX itself picks when
# it finds a Cloud TPU slice itself (`coordinator_port = '8482'` in jax/_src/clusters/cloud_tpu_cluster.py).
# Passed explicitly, so the same start-up path works where JAX's detection is off (a CPU sandbox).
COORDINATOR_PORT = 8482
_HEREDOC_PROGRAM = "TPU_PLATFORM_PROGRAM"


@dataclass(frozen=True)
class StartupSpec:
    stack: str
    vm: str
    workload: str
    files: tuple[tuple[str, str], ...]  # (filename, source); the first is the entry point
    framework: str
    framework_version: str
    requirements: tuple[tuple[str, str], ...]  # (import name, pinned requirement)
    # Settings for the program: environment name -> (command-line flag, value).
    settings: tuple[tuple[str, str, str], ...]
    # What the runtime needs (infra/catalog): the process environment, bounds kept when extras are
    # installed, the oldest Python the framework accepts, and why the framework cannot be installed
    # at boot ("" when it can).
    environment: tuple[tuple[str, str], ...] = ()
    constraints: tuple[str, ...] = ()
    min_python: str = ""
    install_problem: str = ""

    @property
    def unit(self) -> str:
        return f"tpu-workload-{self.workload}.service"


def _check(spec: StartupSpec) -> None:
    for env, flag, value in spec.settings:
        if not _SAFE_VALUE.fullmatch(value) or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", env):
            raise ValueError(f"unsafe setting {env}={value!r} for workload {spec.workload}")
        if not flag.startswith("--"):
            raise ValueError(f"setting {env} needs a --flag, not {flag!r}")
    for module, requirement in spec.requirements:
        if not (_SAFE_REQUIREMENT.fullmatch(requirement) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", module)):
            raise ValueError(f"unsafe requirement {requirement!r}")
    for name, value in spec.environment:
        if not _SAFE_VALUE.fullmatch(value) or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            raise ValueError(f"unsafe environment {name}={value!r} for workload {spec.workload}")
    for constraint in spec.constraints:
        if not _SAFE_CONSTRAINT.fullmatch(constraint):
            raise ValueError(f"unsafe constraint {constraint!r}")
    if not re.fullmatch(r"(\d+\.\d+)?", spec.min_python) or not _SAFE_MESSAGE.fullmatch(spec.install_problem):
        raise ValueError(f"unsafe runtime facts {spec.min_python!r}, {spec.install_problem!r}")
    for filename, source in spec.files:
        if not re.fullmatch(r"[A-Za-z0-9_]+\.py", filename):
            raise ValueError(f"unsafe file name {filename!r}")
        if any(line == _HEREDOC_PROGRAM for line in source.splitlines()):
            raise ValueError(f"{filename} contains the line {_HEREDOC_PROGRAM}, which ends the here-document")


def render_env(spec: StartupSpec) -> str:
    """The `tpu-platform-env` metadata value: the run's settings, one NAME=value per line."""
    _check(spec)
    return "".join(f"{env}={value}\n" for env, _, value in spec.settings)


def _write_file(filename: str, source: str) -> str:
    body = source if source.endswith("\n") else source + "\n"
    return f"""  cat > "${{APP_DIR}}/{filename}" <<'{_HEREDOC_PROGRAM}'
{body}{_HEREDOC_PROGRAM}
"""


def render_startup_script(spec: StartupSpec) -> str:
    _check(spec)
    module, requirement, find_links = FRAMEWORK_INSTALL[spec.framework]
    requirement = requirement.format(version=spec.framework_version)
    entry = spec.files[0][0]
    exec_args = " ".join(f"{flag} ${{{env}}}" for env, flag, _ in spec.settings)
    extras = " ".join(f"{m}={r}" for m, r in spec.requirements)
    writes = "".join(_write_file(name, source) for name, source in spec.files)
    checkpoint_env = next((env for env, flag, _ in spec.settings if flag == "--checkpoint-dir"), "")
    completed = f'"${{{checkpoint_env}:-}}"' if checkpoint_env else '""'
    environment = "".join(f"Environment={name}={value}\n" for name, value in spec.environment)
    constraints = " ".join(f"'{c}'" for c in spec.constraints)
    if spec.min_python:
        major, minor = spec.min_python.split(".")
        need = f"{spec.framework} ${{FRAMEWORK_VERSION}} needs Python {spec.min_python} or newer"
        python_check = f"""  if ! "${{PYTHON}}" -c 'import sys; sys.exit(sys.version_info < ({major}, {minor}))'; then
    fatal "{need}; this image has $("${{PYTHON}}" -V 2>&1)"
  fi
"""
    else:
        python_check = ""
    if spec.install_problem:
        found = "(found: ${installed:-none})"
        why = f"{spec.framework} ${{FRAMEWORK_VERSION}} is not installed {found}: {spec.install_problem}"
        install = f'    fatal "{why}"'
    else:
        install = f"""    log "installing {spec.framework} ${{FRAMEWORK_VERSION}} (found: ${{installed:-none}})"
    "${{PYTHON}}" -m pip install --quiet '{requirement}' -f {find_links}"""

    return f"""#!/bin/bash
# tpu-platform start-up for TPU VM {spec.vm} (stack {spec.stack}), workload {spec.workload}.
# Rendered by infra/startup.py; runs as root on every boot of every worker. Edit the stack, not this.
set -euo pipefail

readonly ROOT="${{TPU_PLATFORM_ROOT:-}}"
readonly PYTHON="${{TPU_PLATFORM_PYTHON:-/usr/bin/python3}}"
readonly METADATA="http://${{GCE_METADATA_HOST:-metadata.google.internal}}/computeMetadata/v1"
readonly APP_DIR="${{ROOT}}/opt/tpu-platform/{spec.workload}"
readonly ENV_FILE="${{ROOT}}/etc/tpu-platform/{spec.workload}.env"
readonly UNIT_FILE="${{ROOT}}/etc/systemd/system/{spec.unit}"
readonly UNIT={spec.unit}
readonly FRAMEWORK_VERSION={spec.framework_version}
readonly COORDINATOR_PORT="${{TPU_PLATFORM_COORDINATOR_PORT:-{COORDINATOR_PORT}}}"

log() {{ echo "tpu-platform: $*"; }}

# A configuration this image cannot run: say so once and start nothing (GCE runs this script once
# per boot; nothing restarts it), rather than leave a unit failing in a loop while the TPU bills.
fatal() {{
  echo "tpu-platform: FATAL: $*; not starting ${{UNIT}}. Fix the stack (see the plan's catalog checks)." >&2
  exit {EXIT_CONFIG}
}}

framework_version() {{
  "${{PYTHON}}" -c 'import {module}; print({module}.__version__)' 2>/dev/null || true
}}

metadata() {{
  curl --silent --fail --retry 5 --retry-connrefused -H 'Metadata-Flavor: Google' "${{METADATA}}/$1"
}}

ensure_packages() {{
{python_check}  local installed
  installed="$(framework_version)"
  if [[ "${{installed}}" == "${{FRAMEWORK_VERSION}}" ]]; then
    log "{spec.framework} ${{installed}} is already installed"
  else
{install}
  fi
  local extra extras=({extras})
  for extra in "${{extras[@]}}"; do
    if ! "${{PYTHON}}" -c "import ${{extra%%=*}}" 2>/dev/null; then
      log "installing ${{extra#*=}}"
      # Together with the bounds the framework needs, so pip cannot upgrade them from under it.
      "${{PYTHON}}" -m pip install --quiet "${{extra#*=}}" {constraints}
    fi
  done
  installed="$(framework_version)"
  if [[ "${{installed}}" != "${{FRAMEWORK_VERSION}}" ]]; then
    fatal "{spec.framework} ${{FRAMEWORK_VERSION}} does not import after the installs (found: ${{installed:-none}})"
  fi
}}

# This worker's place in its slice, for the unit's environment: its number (`agent-worker-number`), the
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

install_program() {{
  mkdir -p "${{APP_DIR}}" "$(dirname "${{ENV_FILE}}")" "$(dirname "${{UNIT_FILE}}")"
{writes}  # Settings live in metadata: changing them updates the VM in place, and this script reads them anew.
  metadata "instance/attributes/{ENV_ATTRIBUTE}" > "${{ENV_FILE}}.new"
  slice_env >> "${{ENV_FILE}}.new"
  mv "${{ENV_FILE}}.new" "${{ENV_FILE}}"
}}

install_unit() {{
  cat > "${{UNIT_FILE}}" <<'TPU_PLATFORM_UNIT'
[Unit]
Description=tpu-platform workload {spec.workload} (stack {spec.stack})
Wants=network-online.target
After=network-online.target
# A program that keeps failing is given up on after 5 starts an hour, instead of billing in a loop.
StartLimitIntervalSec=3600
StartLimitBurst=5

[Service]
Type=simple
EnvironmentFile=@ENV_FILE@
{environment}ExecStart=@PYTHON@ -u @APP_DIR@/{entry} {exec_args}
Restart=on-failure
RestartSec=30
# Exit {EXIT_CONFIG}: a configuration error, which a restart cannot mend.
# 3: the program refused to resume a checkpoint of another program, batch size or data (a new run
# id is the fix): retrying would refuse again, every 30 s.
RestartPreventExitStatus={EXIT_CONFIG} 3
# Preemption notice to exit: the program checkpoints on SIGTERM within this time.
TimeoutStopSec=25
StandardOutput=journal
StandardError=journal
SyslogIdentifier=tpu-workload-{spec.workload}
TPU_PLATFORM_UNIT
  sed -i -e "s|@ENV_FILE@|${{ENV_FILE}}|" -e "s|@PYTHON@|${{PYTHON}}|" -e "s|@APP_DIR@|${{APP_DIR}}|" "${{UNIT_FILE}}"
  systemctl daemon-reload
}}

run_finished() {{
  local checkpoint_dir
  # shellcheck source=/dev/null
  checkpoint_dir="$(set -a && source "${{ENV_FILE}}" && echo {completed})"
  [[ -n "${{checkpoint_dir}}" ]] || return 1
  local said runlib="${{APP_DIR}}/runlib.py"
  # shellcheck source=/dev/null
  said="$(set -a && source "${{ENV_FILE}}" && "${{PYTHON}}" "$runlib" status --checkpoint-dir "${{checkpoint_dir}}")"
  [[ "${{said}}" == complete ]]
}}

ensure_packages
install_program
install_unit
if run_finished; then
  log "workload {spec.workload} already completed its run; not starting it again"
  # A finished run never keeps idle chips billing: say so again, and the guard stops or deletes this
  # TPU as the stack says (the VM itself holds no TPU right).
  # shellcheck source=/dev/null
  (set -a && source "${{ENV_FILE}}" && "${{PYTHON}}" "${{APP_DIR}}/runlib.py" announce)
  exit 0
fi
# First boot: starts the run. Reboot, preemption or re-created VM: the run resumes from its checkpoint.
systemctl start "${{UNIT}}"
log "workload {spec.workload} started as ${{UNIT}}; follow it with: journalctl -u ${{UNIT}} -f"
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

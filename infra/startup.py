"""Render a TPU VM's `startup-script` metadata: install, write and run its workload under systemd.

Pure and deterministic (same inputs, same bytes), so a plan shows no change unless the workload or
its settings changed. The script runs as root on every boot of every worker of the slice:
  1. install the pinned framework, only when the image lacks that exact version (S21);
  2. write the program and its settings to disk;
  3. run it as a systemd service: it survives reboots, restarts on failure and logs to the journal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# GCE metadata limits (https://cloud.google.com/compute/docs/metadata/setting-custom-metadata#limitations).
MAX_METADATA_VALUE_BYTES = 256 * 1024
MAX_METADATA_TOTAL_BYTES = 512 * 1024

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
_HEREDOC_PROGRAM = "TPU_PLATFORM_PROGRAM"


@dataclass(frozen=True)
class StartupSpec:
    stack: str
    vm: str
    workload: str
    program_filename: str
    program_source: str
    framework: str
    framework_version: str
    # Settings for the program: environment name -> (command-line flag, value).
    settings: tuple[tuple[str, str, str], ...]

    @property
    def unit(self) -> str:
        return f"tpu-workload-{self.workload}.service"


def render_startup_script(spec: StartupSpec) -> str:
    for env, flag, value in spec.settings:
        if not _SAFE_VALUE.fullmatch(value) or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", env):
            raise ValueError(f"unsafe setting {env}={value!r} for workload {spec.workload}")
        if not flag.startswith("--"):
            raise ValueError(f"setting {env} needs a --flag, not {flag!r}")
    if any(line == _HEREDOC_PROGRAM for line in spec.program_source.splitlines()):
        raise ValueError(f"{spec.program_filename} contains the line {_HEREDOC_PROGRAM}, which ends the here-document")
    module, requirement, find_links = FRAMEWORK_INSTALL[spec.framework]
    requirement = requirement.format(version=spec.framework_version)
    app_dir = f"/opt/tpu-platform/{spec.workload}"
    env_file = f"/etc/tpu-platform/{spec.workload}.env"
    env_lines = "\n".join(f"{env}={value}" for env, _, value in spec.settings)
    exec_args = " ".join(f"{flag} ${{{env}}}" for env, flag, _ in spec.settings)
    source = spec.program_source if spec.program_source.endswith("\n") else spec.program_source + "\n"

    return f"""#!/bin/bash
# tpu-platform start-up for TPU VM {spec.vm} (stack {spec.stack}), workload {spec.workload}.
# Rendered by infra/startup.py; runs as root on every boot of every worker. Edit the stack, not this.
set -euo pipefail

readonly APP_DIR={app_dir}
readonly ENV_FILE={env_file}
readonly UNIT={spec.unit}
readonly FRAMEWORK_VERSION={spec.framework_version}

log() {{ echo "tpu-platform: $*"; }}

ensure_framework() {{
  local installed
  installed="$(python3 -c 'import {module}; print({module}.__version__)' 2>/dev/null || true)"
  if [[ "${{installed}}" == "${{FRAMEWORK_VERSION}}" ]]; then
    log "{spec.framework} ${{installed}} is already installed"
    return
  fi
  log "installing {spec.framework} ${{FRAMEWORK_VERSION}} (found: ${{installed:-none}})"
  python3 -m pip install --quiet '{requirement}' -f {find_links}
}}

install_program() {{
  mkdir -p "${{APP_DIR}}" "$(dirname "${{ENV_FILE}}")"
  cat > "${{APP_DIR}}/{spec.program_filename}" <<'{_HEREDOC_PROGRAM}'
{source}{_HEREDOC_PROGRAM}
  cat > "${{ENV_FILE}}" <<'TPU_PLATFORM_ENV'
{env_lines}
TPU_PLATFORM_ENV
}}

install_unit() {{
  cat > "/etc/systemd/system/${{UNIT}}" <<'TPU_PLATFORM_UNIT'
[Unit]
Description=tpu-platform workload {spec.workload} (stack {spec.stack})
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
EnvironmentFile={env_file}
ExecStart=/usr/bin/python3 -u {app_dir}/{spec.program_filename} {exec_args}
Restart=on-failure
RestartSec=30
StandardOutput=journal
StandardError=journal
SyslogIdentifier=tpu-workload-{spec.workload}

[Install]
WantedBy=multi-user.target
TPU_PLATFORM_UNIT
  systemctl daemon-reload
  systemctl enable "${{UNIT}}"
}}

ensure_framework
install_program
install_unit
# Starts the run on first boot and after a reboot; a no-op while it is already running.
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

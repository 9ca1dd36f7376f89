"""`sudo python3 -m vm_agent.tpu_probe [--image IMAGE] -- COMMAND...`: on a real TPU VM, what only a real TPU
proves about running runs as the agent does (tools/smoke.py copies vm_agent/ to a node and runs this).

COMMAND initialises the image's framework on the TPU and exits 0 when it found it (for TensorFlow:
`tf.config.list_logical_devices("TPU")` non-empty; for JAX: `jax.device_count() > 0`). Each check runs it
through the agent's own code (vm_agent/isolation.py, vm_agent/jail.py, vm_agent/runner.py container_argv),
and one JSON line reports:

- `devices`: the device nodes the generation exposes (`/dev/accel*` before v5e's VFIO, `/dev/vfio/N` from
  it; GKE's TPU device plugin names the same two kinds) and the shared `/dev/vfio/vfio`;
- `non_root`: COMMAND as a fresh unprivileged uid in the jail, the nodes lent to it (chown, 0600), memlock
  unlimited: the TPU initialises without root;
- `second_uid`: the same as the next run's uid once the first's processes are gone: nothing the first left
  (libtpu's `/tmp/libtpu_lockfile`, jax-ml/jax#10192, is in its private /tmp; the nodes went back) blocks it;
- `no_metadata_server`: with the metadata server out of reach (GCE_METADATA_IP and GCE_METADATA_HOST at a
  closed port) and the TPU_* variables GKE sets a TPU container (vm_agent/metadata_proxy.py
  tpu_environment, TPU_SKIP_MDS_QUERY among them): libtpu needs nothing from it;
- `low_memlock`: with a 64 KiB memlock limit (a note: VFIO generations are expected to fail, which is why
  the unit has LimitMEMLOCK=infinity and image runs `--ulimit memlock=-1:-1`);
- `image` (with --image, instead of the above, COMMAND then the image's): `docker run` with the agent's flags
  (its uid, --cap-drop=ALL, no-new-privileges, only the TPU's nodes, memlock, no --privileged): the TPU
  initialises in the container.

`python -m vm_agent.tpu_probe boundary INSIDE OUTSIDE MARKER` (a token on stdin, run where the smoke test
runs, by its Python): what Cloud Storage itself does with a run's boundary (vm_agent/credentials.py), which the tests
only model (CEL over object names): the token exchanged for a boundary of the folder INSIDE (gs://B/P/)
lists, writes and deletes there, and is refused (403) listing and writing OUTSIDE (a folder of another run)
and reading MARKER (the completion marker the guard acts on). The token given is the caller's own, which
reaches all three: a refusal is the boundary's.

The node's part is standard library only: it runs on the probe node's python3 (tpu-ubuntu2204-base: 3.10),
not in the agent's environment. `boundary` exchanges the token with google-auth (vm_agent/credentials.py), so
it runs in the smoke test's own environment, which has it (requirements.lock).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vm_agent.credentials import STS_URL, BoundaryError, Downscoper, boundary
from vm_agent.gcs import StorageError, split_gs
from vm_agent.isolation import Isolation, RunSandbox
from vm_agent.metadata_proxy import tpu_environment

METADATA = "http://metadata.google.internal/computeMetadata/v1/"
CLOSED = "127.0.0.1:9"  # discard: nothing listens there on a TPU VM
TIMEOUT_S = 600
UID_LOCKS = Path("/run/tpu-platform/uids")  # the agent's: one uid is never two runs' on one machine


def _run(sandbox: RunSandbox, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    full = {"PATH": path, **sandbox.environment(), **env}
    try:
        done = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=TIMEOUT_S)
        result = {"ok": done.returncode == 0, "rc": done.returncode, "tail": (done.stdout + done.stderr)[-600:]}
    except subprocess.TimeoutExpired:
        result = {"ok": False, "rc": None, "tail": f"no answer in {TIMEOUT_S} s"}
    sandbox.kill()
    return result


def probe(
    command: list[str], image: str, root: Path, dev: Path = Path("/dev"), metadata: str = METADATA
) -> dict[str, Any]:
    """The checks of the module's docstring; `root` holds the runs' folders, `dev` the TPU's device nodes."""
    tpu_env = tpu_environment(metadata)
    isolation = Isolation(root, UID_LOCKS, dev, memlock=True, proxy=None, tpu_env=tpu_env)
    report: dict[str, Any] = {
        "devices": [str(p) for p in isolation.devices.nodes()],
        "shared": [str(p) for p in isolation.devices.shared()],
        "tpu_env": tpu_env,
    }
    checks = [
        ("non_root", lambda s: s.jail(command, None), {}),
        ("second_uid", lambda s: s.jail(command, None), {}),
        (
            "no_metadata_server",
            lambda s: s.jail(command, None),
            {"GCE_METADATA_IP": CLOSED, "GCE_METADATA_HOST": CLOSED},
        ),
        ("low_memlock", lambda s: s.jail(["prlimit", "--memlock=65536:65536", "--", *command], None), {}),
    ]
    if image:  # COMMAND is the image's: the image check alone
        from vm_agent.runner import container_argv

        docker = shutil.which("docker") or "docker"
        one_host: Any = SimpleNamespace(worker_count=1)  # container_argv reads the worker count alone
        checks = [
            (
                "image",
                lambda s: container_argv(
                    docker, f"tpu-probe-{s.uid}", s, one_host, image, tuple(command), dict(tpu_env)
                ),
                {},
            )
        ]
    for name, argv_of, env in checks:
        sandbox = isolation.open()
        try:
            report[name] = {"uid": sandbox.uid, **_run(sandbox, argv_of(sandbox), {**tpu_env, **env})}
        finally:
            sandbox.close()
    return report


class _Given:
    """The caller's own token, as google-auth credentials show one (`token`, `valid`, `expiry`: no end known):
    the smoke test hands the operator's (gcloud's), not credentials."""

    valid = True
    expiry = None

    def __init__(self, token: str):
        self.token = token


def _status(method: str, url: str, token: str, body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body, method=method, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def boundary_probe(
    token: str,
    inside: str,
    outside: str,
    marker: str,
    storage: str = "https://storage.googleapis.com",
    sts_url: str = STS_URL,
) -> dict[str, Any]:
    """Each call of the module's docstring with the downscoped token: {name: {"status", "expected", "ok"}}."""
    within = boundary(inside, "", "")  # a run's, its checkpoint folder alone
    if within is None:
        raise BoundaryError(f"INSIDE {inside!r}: the folder gs://BUCKET/PREFIX/ the probe's token is narrowed to")
    narrowed = Downscoper(within, _Given(token), sts_url).token().token
    api = f"{storage}/storage/v1/b"

    def listing(url: str) -> str:
        bucket, prefix = split_gs(url)
        return f"{api}/{bucket}/o?" + urllib.parse.urlencode({"prefix": f"{prefix}/", "maxResults": "1"})

    def upload(url: str) -> str:
        bucket, prefix = split_gs(url)
        name = f"{prefix}/tpu-probe-{os.getpid()}"
        return f"{storage}/upload/storage/v1/b/{bucket}/o?" + urllib.parse.urlencode(
            {"uploadType": "media", "name": name}
        )

    def one(url: str) -> str:
        bucket, name = split_gs(url)
        return f"{api}/{bucket}/o/{urllib.parse.quote(name, safe='')}"

    written = f"{inside.rstrip('/')}/tpu-probe-{os.getpid()}"
    calls = [
        ("list_inside", "GET", listing(inside), None, (200,)),
        ("write_inside", "POST", upload(inside), b"probe", (200,)),
        ("delete_inside", "DELETE", one(written), None, (200, 204)),  # 204 No Content, as the JSON API answers
        ("list_outside", "GET", listing(outside), None, (403,)),
        ("write_outside", "POST", upload(outside), b"probe", (403,)),
        ("read_marker", "GET", one(marker) + "?alt=media", None, (403,)),
    ]
    report = {}
    for name, method, url, body, expected in calls:
        status = _status(method, url, narrowed, body)
        report[name] = {"status": status, "expected": list(expected), "ok": status in expected}
    return report


def main(argv: list[str]) -> int:
    if argv[:1] == ["boundary"] and len(argv) == 4:
        token = sys.stdin.readline().strip()
        try:
            report = boundary_probe(token, *argv[1:])
        except (BoundaryError, StorageError, ValueError) as refused:  # no gs:// folder (split_gs), STS's refusal
            print(json.dumps({"error": str(refused)}))
            return 1
        print(json.dumps(report, sort_keys=True))
        return 0
    image = ""
    if argv[:1] == ["--image"] and len(argv) > 1:
        image, argv = argv[1], argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        print((__doc__ or "").split("\n\n")[0], file=sys.stderr)
        return 2
    why = Isolation.check()
    if why:
        print(json.dumps({"error": why}))
        return 1
    root = Path(tempfile.mkdtemp(prefix="tpu-probe-"))
    try:
        print(json.dumps(probe(argv[1:], image, root), sort_keys=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

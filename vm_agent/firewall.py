"""The VM's firewall for runs: what any run's uid sends to the metadata server goes to the agent's proxy.

iptables, in chains of the platform's own (flushed and filled again at each start of the agent, so a
restart never doubles a rule), matched on the run uids' range with the `owner` match (`--uid-owner
FIRST-LAST`, iptables-extensions(8): locally generated packets, by the uid that owns their socket):
- nat OUTPUT: TCP to the metadata server's address and port is REDIRECTed to the proxy on loopback
  (`metadata.google.internal` is 169.254.169.254; GCE serves metadata on port 80);
- filter OUTPUT: anything else from a run to the metadata server's address is REJECTed, but DNS (the
  metadata server is also the VM's resolver, port 53), and, where ip6tables exists, anything from a run
  to its IPv6 address (fd20:ce::254).
Containers of single-host image runs are not local processes: they run on a Docker network of the
agent's own (`RUNS_NETWORK`, subnet `RUNS_SUBNET`), each at an address the agent gives it from its uid
(`container_ip`). Their TCP to 169.254.169.254:80 is DNATed in PREROUTING to the proxy listening on that
network's gateway, which knows each container by its address; the rest of their traffic to the metadata
server but DNS is dropped in DOCKER-USER, Docker's chain for the user's forwarding rules ("Packet
filtering and firewalls", Docker's docs). Multi-host image runs use the host's network (`--net=host`):
their processes are the run's uid, so the uid rules above hold for them.

What runs for real in the tests: the uid rules, in a network namespace of the test's own.
The bridge rules are only rendered there (no Docker daemon); the
proxy's second listener and its by-address lookup run for real.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

NAT_CHAIN = "TPU-PLATFORM-RUNS"
FILTER_CHAIN = "TPU-PLATFORM-RUNS"
BRIDGE_CHAIN = "TPU-PLATFORM-IMAGES"  # nat PREROUTING, for containers on RUNS_NETWORK
METADATA_IPV6 = "fd20:ce::254"  # Compute Engine's metadata server on IPv6 ("About VM metadata")


class FirewallError(RuntimeError):
    """The redirect could not be put in place: no run may start without it."""


def uid_rules(first: int, last: int, metadata_ip: str, metadata_port: int, proxy_port: int) -> list[list[str]]:
    """The iptables commands (without the binary) that send the runs' metadata traffic to the proxy."""
    owner = ["-m", "owner", "--uid-owner", f"{first}-{last}"]
    return [
        [
            "-t",
            "nat",
            "-A",
            NAT_CHAIN,
            "-p",
            "tcp",
            "-d",
            metadata_ip,
            "--dport",
            str(metadata_port),
            *owner,
            "-j",
            "REDIRECT",
            "--to-ports",
            str(proxy_port),
        ],
        ["-A", FILTER_CHAIN, "-d", metadata_ip, "-p", "udp", "--dport", "53", *owner, "-j", "RETURN"],
        ["-A", FILTER_CHAIN, "-d", metadata_ip, "-p", "tcp", "--dport", "53", *owner, "-j", "RETURN"],
        ["-A", FILTER_CHAIN, "-d", metadata_ip, *owner, "-j", "REJECT"],
    ]


RUNS_NETWORK = "tpu-platform-runs"  # the Docker network of single-host image runs
RUNS_BRIDGE = "tpu-runs0"  # its bridge interface
RUNS_SUBNET, RUNS_GATEWAY = "172.31.254.0/24", "172.31.254.1"  # clear of Docker's default 172.17.0.0/16


def container_ip(uid: int, first: int) -> str:
    """The address of the run of `uid` on RUNS_NETWORK (one run at a time per VM; 252 in a row never meet)."""
    return f"172.31.254.{2 + (uid - first) % 252}"


def network_create(docker: str) -> list[str]:
    return [
        docker,
        "network",
        "create",
        "--driver",
        "bridge",
        "--subnet",
        RUNS_SUBNET,
        "--gateway",
        RUNS_GATEWAY,
        "-o",
        f"com.docker.network.bridge.name={RUNS_BRIDGE}",
        RUNS_NETWORK,
    ]


def bridge_rules(proxy_port: int, metadata_ip: str = "169.254.169.254") -> list[list[str]]:
    """The uid rules' counterpart for containers on RUNS_NETWORK (module docstring)."""
    return [
        [
            "-t",
            "nat",
            "-A",
            BRIDGE_CHAIN,
            "-s",
            RUNS_SUBNET,
            "-p",
            "tcp",
            "-d",
            metadata_ip,
            "--dport",
            "80",
            "-j",
            "DNAT",
            "--to-destination",
            f"{RUNS_GATEWAY}:{proxy_port}",
        ],
        ["-I", "DOCKER-USER", "-s", RUNS_SUBNET, "-d", metadata_ip, "-p", "udp", "!", "--dport", "53", "-j", "DROP"],
        ["-I", "DOCKER-USER", "-s", RUNS_SUBNET, "-d", metadata_ip, "-p", "tcp", "!", "--dport", "53", "-j", "DROP"],
    ]


class Firewall:
    def __init__(self, iptables: str = "iptables", log: Callable[..., None] = lambda *a, **k: None):
        self.iptables = iptables
        self.log = log

    def _run(self, binary: str, args: list[str], check: bool = True) -> bool:
        done = subprocess.run([binary, "-w", *args], capture_output=True, text=True, check=False)
        if check and done.returncode != 0:
            raise FirewallError(f"{binary} {' '.join(args)}: {done.stderr.strip() or done.returncode}")
        return done.returncode == 0

    def apply(self, first: int, last: int, metadata_ip: str, metadata_port: int, proxy_port: int) -> None:
        if shutil.which(self.iptables) is None:
            raise FirewallError(f"{self.iptables} is missing: the metadata redirect needs iptables")
        for table, chain, hook in (("nat", NAT_CHAIN, "OUTPUT"), ("filter", FILTER_CHAIN, "OUTPUT")):
            self._run(self.iptables, ["-t", table, "-N", chain], check=False)  # exists after a restart
            self._run(self.iptables, ["-t", table, "-F", chain])
            if not self._run(self.iptables, ["-t", table, "-C", hook, "-j", chain], check=False):
                self._run(self.iptables, ["-t", table, "-I", hook, "1", "-j", chain])
        for rule in uid_rules(first, last, metadata_ip, metadata_port, proxy_port):
            self._run(self.iptables, rule)
        ip6tables = self.iptables.replace("iptables", "ip6tables")
        if shutil.which(ip6tables):  # an image without IPv6 tables has no IPv6 route to the metadata server either
            owner = ["-m", "owner", "--uid-owner", f"{first}-{last}"]
            self._run(ip6tables, ["-N", FILTER_CHAIN], check=False)
            if self._run(ip6tables, ["-F", FILTER_CHAIN], check=False):
                self._run(ip6tables, ["-A", FILTER_CHAIN, "-d", METADATA_IPV6, *owner, "-j", "REJECT"], check=False)
                if not self._run(ip6tables, ["-C", "OUTPUT", "-j", FILTER_CHAIN], check=False):
                    self._run(ip6tables, ["-I", "OUTPUT", "1", "-j", FILTER_CHAIN], check=False)
        self.log(
            f"runs' uids {first}-{last}: the metadata server at {metadata_ip}:{metadata_port} is the agent's "
            f"proxy on port {proxy_port}"
        )

    def apply_bridge(self, proxy_port: int, metadata_ip: str) -> None:
        """bridge_rules, in place once (a restart flushes the agent's chain and finds DOCKER-USER's rules there)."""
        self._run(self.iptables, ["-t", "nat", "-N", BRIDGE_CHAIN], check=False)
        self._run(self.iptables, ["-t", "nat", "-F", BRIDGE_CHAIN])
        if not self._run(self.iptables, ["-t", "nat", "-C", "PREROUTING", "-j", BRIDGE_CHAIN], check=False):
            self._run(self.iptables, ["-t", "nat", "-I", "PREROUTING", "1", "-j", BRIDGE_CHAIN])
        self._run(self.iptables, ["-N", "DOCKER-USER"], check=False)  # Docker makes it; so may we, first
        for rule in bridge_rules(proxy_port, metadata_ip):
            if rule[0] == "-I" and self._run(self.iptables, ["-C", *rule[1:]], check=False):
                continue
            self._run(self.iptables, rule)
        self.log(
            f"image runs on {RUNS_NETWORK} ({RUNS_SUBNET}): the metadata server is the agent's proxy at "
            f"{RUNS_GATEWAY}:{proxy_port}"
        )

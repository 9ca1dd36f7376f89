"""The GKE engine's admin phase: its own Pulumi project (gke-admin/: its __main__.py and Pulumi.yaml), run by a cluster
administrator for an environment whose stack declares the cluster (docs/design-gke.md, "Two phases").

It reads that environment's stack file (`pulumi up --config-file ../Pulumi.<env>.yaml`: the cluster and the
teams have one home), looks the cluster up, and declares JobSet and Kueue as pinned (infra/gke/controllers.py)
and each team's namespace, service account and RBAC (infra/gke/teams.py). Everything it would refuse, it
refuses before declaring anything: no GKE section, a manifest it cannot have or whose bytes are not the
pinned ones, a team object a cluster would refuse.
"""

from __future__ import annotations

from typing import Any

import pulumi_gcp as gcp

from infra import naming
from infra.config import PROJECT, PlatformConfig
from infra.config.problems import ConfigError, Problem
from infra.gke.controllers import JOBSET, KUEUE, RELEASES, Fetch, ManifestError, controller_objects
from infra.gke.install import ClusterControllers, TeamPlaces, cluster_provider
from infra.gke.teams import admin_objects
from infra.gke.validation import platform_validator, validate_all

GKE_ADMIN_PROJECT = "tpu-platform-gke-admin"  # `name:` in gke-admin/Pulumi.yaml, whose own __main__.py runs this phase


def build_admin(cfg: PlatformConfig, fetch: Fetch) -> dict[str, Any]:
    """Declare the admin phase of `cfg`'s GKE engine and return its outputs."""
    gke = cfg.gke
    if gke is None:
        raise ConfigError(
            cfg.stack,
            [
                Problem(
                    f"{PROJECT}:gke",
                    "(missing)",
                    "the GKE admin phase installs into the stack's GKE cluster: "
                    "declare the gke section and `pulumi up` the environment first",
                )
            ],
        )
    try:
        jobset, kueue = controller_objects(JOBSET, fetch), controller_objects(KUEUE, fetch)
    except ManifestError as error:
        raise ConfigError(cfg.stack, [Problem("controller manifests", "(pinned)", str(error))]) from None
    places = admin_objects(gke.teams, cfg.deployer)
    validate_all(platform_validator(), places).raise_for(cfg.stack, f"{PROJECT}:gke.teams")

    cluster_name = naming.gke_cluster(cfg.stack)
    cluster = gcp.container.get_cluster_output(name=cluster_name, location=gke.region, project=cfg.project)
    endpoint = cluster.control_plane_endpoints_configs.apply(lambda c: c[0].dns_endpoint_configs[0].endpoint)
    provider = cluster_provider("gke", endpoint, cluster_name)
    ClusterControllers("controllers", provider, jobset, kueue)
    TeamPlaces("teams", provider, places)
    return {
        "cluster": cluster_name,
        "controllers": {r.name: {"version": r.version, "image": r.pinned_image, "manifest": r.url} for r in RELEASES},
        "teams": {t.name: {"namespace": t.namespace, "serviceAccount": naming.TEAM_SERVICE_ACCOUNT} for t in gke.teams},
    }

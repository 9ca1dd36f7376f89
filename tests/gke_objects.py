"""Small GKE fixtures: pool shapes, two teams, their queue objects, and a team's JobSet (infra/gke/jobsets.py)."""

from __future__ import annotations

from typing import Any

from infra.config.model import TeamSettings
from infra.gke import queues
from infra.gke.jobsets import team_jobset
from infra.gke.specs import SliceShape

IMAGE = "us-docker.pkg.dev/acme/train@sha256:" + "0" * 64
# A folder source's image, as the fixture stack pins it (tests/stacks/Pulumi.gke.yaml gke.folderImage): Google's
# Cloud SDK image, Debian's python3 and no `python` command (docs/design-gke.md), so its commands say python3.
FOLDER_IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli@sha256:" + "c" * 64

V5E_16_SPOT = SliceShape("tpu-v5-lite-podslice", "4x4", "ct5lp-hightpu-4t", 4, 4, 1, "spot")
V6E_16_FLEX = SliceShape("tpu-v6e-slice", "4x4", "ct6e-standard-4t", 4, 4, 2, "flex-start")
TPU7X_8 = SliceShape("tpu7x", "2x2x2", "tpu7x-standard-4t", 4, 2, 1, "reserved")
POOLS = {"v5e": V5E_16_SPOT, "v6e": V6E_16_FLEX, "iron": TPU7X_8}
SHAPES = tuple(POOLS.values())

VISION = TeamSettings(
    name="vision",
    members=("group:vision@example.com",),
    namespace="team-vision",
    nominal_chips=(("v5e", 16), ("iron", 8)),
    borrowing_limit=16,
    priority="high",
)
NLP = TeamSettings(
    name="nlp",
    members=("user:ada@example.com",),
    namespace="team-nlp",
    nominal_chips=(("v6e", 32),),
    borrowing_limit=None,
    priority="medium",
)
TEAMS = (VISION, NLP)


def flavor(shape: SliceShape) -> str:
    return queues.flavor_name(shape.node_labels)


def queue_objects() -> list[dict[str, Any]]:
    return queues.queue_objects(TEAMS, POOLS)


def jobset(
    name: str = "train-1",
    team: TeamSettings = VISION,
    shape: SliceShape = V5E_16_SPOT,
    slices: int = 1,
    priority: str = "medium",
) -> dict[str, Any]:
    """The platform's team JobSet, with its failure rules (infra/gke/jobsets.py)."""
    return team_jobset(
        team, shape, name, image=IMAGE, command=["python", "train.py"], slices=slices, priority=priority, max_restarts=3
    )

"""A billing budget on the environment's project with email and Pub/Sub alerts.

A budget alerts; it never caps spend. The optional Pub/Sub topic is where an automated reaction
(stopping TPU VMs) subscribes. Setting it needs `pubsub.topics.setIamPolicy` on the topic for the
deployer; Cloud Billing then grants itself publish rights.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.apis import ProjectApis
from infra.config import BudgetSettings, Env


@dataclass(frozen=True)
class BudgetAlertsArgs:
    budget: BudgetSettings
    billing_account: str
    kms_key_name: str | None  # the stack's customer-managed key, which encrypts the topic too


def budget_apis(args: BudgetAlertsArgs) -> tuple[str, ...]:
    # The budget's project number is read with Resource Manager (projects.get).
    base = ("billingbudgets.googleapis.com", "monitoring.googleapis.com", "cloudresourcemanager.googleapis.com")
    return (*base, "pubsub.googleapis.com") if args.budget.pubsub_topic else base


class BudgetAlerts(pulumi.ComponentResource):
    def __init__(
        self, name: str, env: Env, args: BudgetAlertsArgs, apis: ProjectApis, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("tpu-platform:billing:BudgetAlerts", name, None, opts)
        budget = args.budget
        # Named from the address, never its position: removing the first address must not rewrite
        # the second's channel. Hashed, because a URN is never secret and an address may be. The alias
        # carries a channel over from its positional name of earlier versions (once: after that first
        # `pulumi up` the state holds the new name).
        self.channels = [
            gcp.monitoring.NotificationChannel(
                f"{name}-email-{hashlib.sha256(email.encode()).hexdigest()[:10]}",
                project=env.project,
                display_name=f"{env.stack} budget: {email}",
                type="email",
                labels={"email_address": email},
                user_labels=env.labels,
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=apis.needs("monitoring"), aliases=[pulumi.Alias(name=f"{name}-email-{i}")]
                ),
            )
            for i, email in enumerate(budget.emails)
        ]
        self.topic = (
            gcp.pubsub.Topic(
                f"{name}-topic",
                name=f"{env.stack}-budget-alerts",
                project=env.project,
                labels=env.labels,
                # With a customer-managed key (required in production), the topic's messages are encrypted
                # with it too, and kept only in the key's region: Pub/Sub needs the key's location to
                # cover the topic's message storage regions (Pub/Sub, "Configure message encryption").
                # The Pub/Sub agent's grant on the key is the bootstrap's.
                kms_key_name=args.kms_key_name,
                message_storage_policy=(
                    gcp.pubsub.TopicMessageStoragePolicyArgs(
                        allowed_persistence_regions=[args.kms_key_name.split("/locations/")[1].split("/")[0]]
                    )
                    if args.kms_key_name
                    else None
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("pubsub")),
            )
            if budget.pubsub_topic
            else None
        )
        project_number = gcp.organizations.get_project_output(project_id=env.project).number
        units = math.floor(budget.amount)
        self.budget = gcp.billing.Budget(
            f"{name}-budget",
            billing_account=args.billing_account,
            display_name=f"{env.project} {env.stack}"[:60],
            budget_filter=gcp.billing.BudgetBudgetFilterArgs(
                projects=[project_number.apply(lambda n: f"projects/{n}")],
                calendar_period="MONTH",
            ),
            amount=gcp.billing.BudgetAmountArgs(
                specified_amount=gcp.billing.BudgetAmountSpecifiedAmountArgs(
                    currency_code=budget.currency,
                    units=str(units),
                    nanos=round((budget.amount - units) * 1e9) or None,
                )
            ),
            threshold_rules=[
                gcp.billing.BudgetThresholdRuleArgs(threshold_percent=t.percent / 100, spend_basis=t.spend_basis)
                for t in budget.thresholds
            ],
            all_updates_rule=gcp.billing.BudgetAllUpdatesRuleArgs(
                monitoring_notification_channels=[c.name for c in self.channels],
                pubsub_topic=self.topic.id if self.topic else None,
                schema_version="1.0" if self.topic else None,
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("billingbudgets")),
        )
        self.register_outputs({"name": self.budget.name})

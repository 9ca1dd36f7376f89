"""The policy pack: `pulumi preview --policy-pack policy`. Assembles the rules of `policies.py`."""

from typing import Any

from policies import RULES, Rule
from pulumi_policy import Policy, PolicyPack, ResourceValidationPolicy, StackValidationPolicy


def to_policy(rule: Rule) -> Policy:
    # pulumi-policy types report_violation's urn as required; its implementation defaults it to None.
    validate: Any = rule.validate
    kind = StackValidationPolicy if rule.stack else ResourceValidationPolicy
    return kind(name=rule.name, description=rule.description, validate=validate, enforcement_level=rule.enforcement)


PolicyPack(name="tpu-platform", policies=[to_policy(rule) for rule in RULES])

"""The policy pack: `pulumi preview --policy-pack policy`. Assembles the rules of `policies.py`."""

import sys
from pathlib import Path
from typing import Any

# The pack's modules import each other as the `policy` package; the pack starts with only its own folder
# on the path, so the repository root (which also holds the role data) goes there too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pulumi_policy import Policy, PolicyPack, ResourceValidationPolicy, StackValidationPolicy

from policy.policies import RULES, Rule


def to_policy(rule: Rule) -> Policy:
    # pulumi-policy types report_violation's urn as required; its implementation defaults it to None.
    validate: Any = rule.validate
    kind = StackValidationPolicy if rule.stack else ResourceValidationPolicy
    return kind(name=rule.name, description=rule.description, validate=validate, enforcement_level=rule.enforcement)


PolicyPack(name="tpu-platform", policies=[to_policy(rule) for rule in RULES])

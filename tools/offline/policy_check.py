"""Run the policy pack's rules over an offline plan, as `pulumi preview --policy-pack policy` would."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from policy.policies import RULES, Rule
from tools.offline.mocks import Registration
from tools.offline.runner import PlanResult


@dataclass(frozen=True)
class Violation:
    policy: str
    enforcement: str  # "mandatory" | "advisory"
    resource: str | None  # logical name; None for the stack as a whole
    message: str

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)

    def __str__(self) -> str:
        where = self.resource or "(stack)"
        return f"[{self.enforcement}] {self.policy}: {where}: {self.message}"


def _options(registration: Registration) -> PolicyResourceOptions:
    return PolicyResourceOptions(
        protect=registration.protect,
        ignore_changes=registration.ignore_changes,
        delete_before_replace=None,
        aliases=[],
        custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
        additional_secret_outputs=[],
        parent=registration.parent or None,
    )


def _policy_resources(plan: PlanResult) -> list[PolicyResource]:
    by_urn = {
        r.urn: PolicyResource(r.type, r.inputs, r.urn, r.name, _options(r), None, None, [], {}) for r in plan.resources
    }
    for registration in plan.resources:
        resource = by_urn[registration.urn]
        resource.parent = by_urn.get(registration.parent)
        resource.dependencies = [by_urn[d] for d in registration.dependencies if d in by_urn]
    return list(by_urn.values())


def check_policies(plan: PlanResult, rules: tuple[Rule, ...] = RULES) -> list[Violation]:
    violations: list[Violation] = []
    names = {r.urn: r.name for r in plan.resources}

    def reporter(rule: Rule, resource: str | None):
        level = "mandatory" if rule.enforcement == EnforcementLevel.MANDATORY else "advisory"

        def report(message: str, urn: str | None = None) -> None:
            violations.append(Violation(rule.name, level, names.get(urn or "", resource), message))

        return report

    stack_args = StackValidationArgs(_policy_resources(plan))
    for rule in rules:
        if rule.stack:
            rule.validate(stack_args, reporter(rule, None))
            continue
        for r in plan.resources:
            args = ResourceValidationArgs(r.type, r.inputs, r.urn, r.name, _options(r), None)
            rule.validate(args, reporter(rule, r.name))
    return violations

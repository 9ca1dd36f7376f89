"""A stack value marked secure never appears in plaintext in a plan's inputs, its outputs or the state."""

from __future__ import annotations

import json

import pytest

from infra.config.problems import ConfigError
from tests.support import fixture_config, with_object
from tools.offline.mocks import GcpMocks, RecordingMonitor
from tools.offline.runner import run_program

SECRET_EMAIL = "oncall-7f3a9c@acme.example"


def test_the_offline_plan_and_its_json_never_print_a_secret(capsys):
    from tools.offline.render import to_json, to_text

    raw = with_object(fixture_config("small"), "budget", lambda b: b.update(emails=[SECRET_EMAIL]))
    result, _ = secret_run(raw, ["tpu-platform:budget"])
    assert SECRET_EMAIL not in to_text(result, []) + json.dumps(to_json(result, []), default=str)


def secret_run(raw: dict[str, str], keys: list[str]):
    monitor = RecordingMonitor(GcpMocks("fixture-project"))
    result = run_program("small", raw, monitor=monitor, secret_keys=keys)
    return result, monitor


def test_a_secure_alert_email_is_secret_in_inputs_state_and_outputs():
    raw = with_object(fixture_config("small"), "budget", lambda b: b.update(emails=[SECRET_EMAIL]))
    result, _ = secret_run(raw, ["tpu-platform:budget"])
    (channel,) = result.of_type("gcp:monitoring/notificationChannel:NotificationChannel")
    assert "labels" in channel.secret_paths  # the engine received the address as a secret
    assert channel.inputs["labels"] == "[secret]" and channel.state["labels"] == "[secret]"
    everything = json.dumps(
        [[r.inputs, r.state] for r in result.resources] + [result.outputs, result.warnings], default=str
    )
    assert SECRET_EMAIL not in everything


def test_without_the_secure_marking_nothing_is_hidden():
    raw = with_object(fixture_config("small"), "budget", lambda b: b.update(emails=[SECRET_EMAIL]))
    result, _ = secret_run(raw, [])
    (channel,) = result.of_type("gcp:monitoring/notificationChannel:NotificationChannel")
    assert not channel.secret_paths


def test_a_secret_that_would_reach_vm_metadata_is_refused_before_anything_is_registered():
    raw = with_object(
        fixture_config("small"), "workloads", lambda w: w["mnist"].update(dataObject="private/key-9b1e.npz")
    )
    monitor = RecordingMonitor(GcpMocks("fixture-project"))
    with pytest.raises(Exception, match=r"tpu-platform:workloads = '\[secret\]': a value marked secure would reach"):
        run_program("small", raw, monitor=monitor, secret_keys=["tpu-platform:workloads"])
    assert monitor.registrations == []
    assert ConfigError  # the program raises it; the engine reports it as a RunError


def test_a_production_stack_holding_a_secret_is_refused_before_anything_is_registered():
    """Any branch runs the previewer, which decrypts a stack's secrets to preview it: a production stack keeps none."""
    raw = with_object(fixture_config("production"), "budget", lambda b: b.update(emails=[SECRET_EMAIL]))
    monitor = RecordingMonitor(GcpMocks("fixture-production"))
    with pytest.raises(Exception, match=r"tpu-platform:budget = '\[secret\]': a production stack keeps no value"):
        run_program("production", raw, monitor=monitor, secret_keys=["tpu-platform:budget"])
    assert monitor.registrations == []
    # The same value, not marked secure, plans (another stack may keep secrets: only its own previews read them).
    assert run_program("production", raw).resources

"""The run timeline record: its mapping onto ml-goodput-measurement's types, its JSON, and that it can
move into a standard-library contract package (no import beyond the standard library, Python 3.8)."""

from __future__ import annotations

import ast
import calendar
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.goodput import interval
from run_contract import timeline as module
from run_contract.timeline import (
    BADPUT_TYPES,
    BY_KEY,
    CATEGORIES,
    GOODPUT_TYPES,
    UNMAPPED,
    PreemptionHistory,
    RunTimeline,
    TimelineError,
)
from tests.support import STEP_LINE_CATEGORIES
from tpu_runs import report
from vm_agent import telemetry

ROOT = Path(__file__).resolve().parents[1]
IDENTITY = {
    "run_id": "r1",
    "vm": "mnist-v5e",
    "accelerator_type": "v5litepod-8",
    "chips": 8,
    "provisioning": "spot",
    "zone": "us-central1-a",
}


def a_timeline(**changes) -> RunTimeline:
    measured = {
        "boot": 60.0,
        "installs": 30.0,
        "restore": 20.0,
        "firstStep": 40.0,
        "productive": 3000.0,
        "checkpointSave": 50.0,
        "wastedProgress": 100.0,
        "recoveryWait": 400.0,
        "queue": 90.0,
    }
    args = {**IDENTITY, "billed_s": 3400.0, "measured": measured, "preemptions": 1, "steps": 6000, **changes}
    return RunTimeline.of(**args)


def test_every_type_of_the_pinned_library_is_mapped_or_said_why_not():
    mapped = {c.library.split(".", 1)[1] for c in CATEGORIES if c.library.startswith("BadputType.")}
    assert mapped | set(UNMAPPED) == set(BADPUT_TYPES)
    assert not mapped & set(UNMAPPED)
    known = {f"BadputType.{n}" for n in BADPUT_TYPES} | {f"GoodputType.{n}" for n in GOODPUT_TYPES} | {""}
    assert {c.library for c in CATEGORIES} <= known
    assert [c.key for c in CATEGORIES if c.library == "GoodputType.TOTAL"] == ["productive"]
    assert sorted(BADPUT_TYPES.values()) == list(range(1, 15))  # the enum's values, 1…14, at the pinned commit


def test_the_pin_names_a_release_and_a_commit():
    assert module.GOODPUT_MEASUREMENT.startswith("ml-goodput-measurement 0.2.3 (")
    assert "(57092cfcf1c9c0a2ef9e5c2311734fabb8b38152)" in module.GOODPUT_MEASUREMENT


def test_billed_categories_are_those_the_node_runs_through():
    assert {c.key for c in CATEGORIES if not c.billed} == {"queue", "recoveryWait"}


def test_the_remainder_is_what_the_measured_billed_categories_leave():
    t = a_timeline()
    assert t.seconds["unattributed"] == pytest.approx(3400 - (60 + 30 + 20 + 40 + 3000 + 50 + 100))
    assert sum(t.seconds[c.key] for c in CATEGORIES if c.billed) == pytest.approx(t.billed_s)
    assert t.goodput == pytest.approx(3000 / 3400)


def test_over_attributed_time_is_refused_beyond_clock_skew():
    a_timeline(billed_s=3300 - 4.0)  # 3300 s measured: within the 5 s of skew allowed
    with pytest.raises(TimelineError, match="add up to 3300 s, more than the 3280 s billed"):
        a_timeline(billed_s=3280.0)


def test_the_remainder_is_computed_never_measured_and_unknown_categories_are_refused():
    with pytest.raises(TimelineError) as caught:
        a_timeline(measured={"unattributed": 5.0, "compile": 3.0})
    assert "seconds.compile: not a category" in str(caught.value)
    assert "seconds.unattributed: computed from the others, not measured (5.0)" in str(caught.value)


def test_json_round_trip_and_serialisable():
    t = a_timeline()
    text = json.dumps(t.to_json())
    back = RunTimeline.from_json(json.loads(text))
    assert back == t
    data = json.loads(text)
    assert data["schema"] == "tpu-platform/run-timeline" and data["version"] == 1
    assert list(data["seconds"]) == [c.key for c in CATEGORIES]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 2}, "version: 2; this reader knows version 1"),
        ({"schema": "other"}, "schema: 'other'"),
        ({"extra": 1}, "unknown keys ['extra']"),
        ({"chips": -1}, "chips: -1 is not a whole number"),
        ({"billedSeconds": float("nan")}, "billedSeconds: nan"),
        ({"stepLinesTrusted": "yes"}, "stepLinesTrusted: 'yes'"),
    ],
)
def test_a_record_that_is_not_this_version_is_refused_with_the_reason(change, message):
    data = {**a_timeline().to_json(), **change}
    with pytest.raises(TimelineError, match=message.replace("[", r"\[").replace("]", r"\]")):
        RunTimeline.from_json(data)


def test_a_record_whose_categories_do_not_add_up_to_the_bill_is_refused():
    data = a_timeline().to_json()
    data["seconds"]["productive"] += 600
    with pytest.raises(TimelineError, match="not the 3400 s billed"):
        RunTimeline.from_json(data)


def test_a_self_service_programs_step_lines_mark_what_they_decide():
    assert a_timeline().untrusted == ()
    untrusted = a_timeline(step_lines_trusted=False)
    assert set(untrusted.untrusted) == STEP_LINE_CATEGORIES
    assert untrusted.to_json()["untrusted"] == list(untrusted.untrusted)
    assert not any(BY_KEY[k].measured_by in ("agent", "guard", "TPU API") for k in untrusted.untrusted)


def test_the_library_breakdown_adds_the_categories_it_maps():
    breakdown = a_timeline().library_breakdown()
    assert breakdown["BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == pytest.approx(400 + 60 + 30)
    assert breakdown["GoodputType.TOTAL"] == 3000
    assert "queue" not in breakdown and len(breakdown) == 7


def test_a_preemption_history_sums_timelines_and_reads_back():
    runs = [a_timeline(), a_timeline(preemptions=2, lost_without_notice=1)]
    history = PreemptionHistory.of(runs, "mnist-v5e, 2026-11")
    assert (history.preemptions, history.lost_without_notice) == (3, 1)
    assert history.running_hours == pytest.approx(2 * 3400 / 3600)
    assert PreemptionHistory.from_json(json.loads(json.dumps(history.to_json()))) == history
    with pytest.raises(TimelineError, match="runningHours: 0 is not a number of hours > 0"):
        PreemptionHistory.from_json({"preemptions": 1, "runningHours": 0})


STANDALONE = (module.__file__, interval.__file__)  # the record, and the model that fills it in


@pytest.mark.parametrize("path", STANDALONE)
def test_the_record_imports_only_the_standard_library(path):
    tree = ast.parse(Path(path).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    outside = {n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"__future__"}}
    assert all(n.startswith("run_contract.") for n in outside), outside  # the contract package: stdlib only too


def test_the_record_runs_on_python_3_8():
    """vermin names the oldest Python that has every syntax form and standard-library use of a file."""
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "vermin"), "-t=3.8-", "--no-tips", "--violations", *STANDALONE],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _events(*rows) -> tuple[module.Event, ...]:
    return tuple(module.Event(kind, at, **extra) for kind, at, extra in rows)


PREEMPTED_THEN_FINISHED = _events(
    # the first boot: installs, a program that trains, saves twice, and is stopped on notice
    ("boot", 1000.0, {}),
    ("agentStart", 1030.0, {}),
    ("prepare", 1031.0, {}),
    ("programStart", 1051.0, {}),
    ("firstStep", 1061.0, {"step": 1}),
    ("checkpoint", 1100.0, {"step": 4, "seconds": 2.0}),
    ("checkpoint", 1140.0, {"step": 8, "seconds": 3.0}),
    ("step", 1160.0, {"step": 10}),
    ("sigterm", 1161.0, {}),
    ("exit", 1162.0, {"code": 75}),
    ("end", 1162.5, {}),
    # the next boot: the same run resumes from its checkpoint and finishes
    ("boot", 5000.0, {}),
    ("agentStart", 5020.0, {}),
    ("prepare", 5021.0, {}),
    ("programStart", 5026.0, {}),
    ("restored", 5030.0, {"step": 8}),
    ("firstStep", 5040.0, {"step": 9}),
    ("step", 5080.0, {"step": 12}),
    ("exit", 5081.0, {"code": 0}),
    ("end", 5082.0, {}),
)


def test_the_agents_events_measure_each_category_boot_by_boot():
    found = module.measure(PREEMPTED_THEN_FINISHED)
    assert found.billed_s == pytest.approx(162.5 + 82.0)
    assert found.seconds == pytest.approx(
        {
            "queue": 0.0,
            "recoveryWait": 0.0,
            "idle": 0.0,
            "boot": 30.0 + 20.0,
            "installs": 21.0 + 6.0,  # the agent's start to the program's
            "restore": 4.0,
            "firstStep": 10.0 + 10.0,
            "checkpointSave": 5.0,
            "wastedProgress": 20.0,  # step 10 at 1160, the last commit at 1140
            "productive": (99.0 - 5.0 - 20.0) + 40.0,
        }
    )
    assert (found.preemptions, found.lost_without_notice, found.steps) == (1, 0, 12)
    timeline = RunTimeline.of(
        **IDENTITY, billed_s=found.billed_s, measured=found.seconds, preemptions=found.preemptions, steps=found.steps
    )
    assert timeline.seconds["unattributed"] == pytest.approx(found.billed_s - sum(v for k, v in found.seconds.items()))


def test_billed_time_runs_from_the_nodes_ready_to_the_run_or_the_node_leaving_ready():
    """The node's windows decide billed time: READY (before the kernel's start) opens a boot's, with boot time
    from it; a preemption that takes the node before the agent's last event closes it."""
    states = module.NodeStates("vm")
    for state, at in (("CREATING", 900.0), ("READY", 980.0), ("PREEMPTED", 1162.0), ("NOT_LISTED", 1300.0)):
        states = states.observe(state, at) or states
    states = states.observe("READY", 4990.0) or states
    assert states.observe("READY", 5500.0) is None  # no change: nothing to keep
    windows = states.up(now=9000.0)
    assert windows == [(980.0, 1162.0), (4990.0, 9000.0)]
    found = module.measure(PREEMPTED_THEN_FINISHED, windows)
    assert found.node_billed and found.spans == ((980.0, 1162.0), (4990.0, 5082.0))
    assert found.billed_s == pytest.approx(182.0 + 92.0)
    assert found.seconds["boot"] == pytest.approx(50.0 + 30.0)  # READY to the agent's start
    assert module.covered(windows, found.spans) == pytest.approx(182.0 + 92.0)
    assert module.NodeStates.from_json(json.loads(json.dumps(states.to_json()))) == states
    # No window overlaps a boot (no record of the node): the agent's view, and said so.
    alone = module.measure(PREEMPTED_THEN_FINISHED, [(100.0, 200.0)])
    assert not alone.node_billed and alone.billed_s == pytest.approx(162.5 + 82.0)


def test_a_boot_that_ends_under_the_program_lost_its_work_without_notice():
    cut = PREEMPTED_THEN_FINISHED[:8]  # the host gone after step 10: no sigterm, no exit, no end
    found = module.measure(cut)
    assert found.lost_without_notice == 1 and found.preemptions == 0
    assert found.seconds["wastedProgress"] == pytest.approx(20.0)


def test_the_events_record_reads_back_and_marks_untrusted_categories():
    record = module.RunEvents("user-a@x.example/r1", "vm", PREEMPTED_THEN_FINISHED, step_lines_trusted=False)
    data = json.loads(json.dumps(record.to_json()))
    assert module.RunEvents.from_json(data) == record
    assert set(data["untrusted"]) == STEP_LINE_CATEGORIES
    with pytest.raises(TimelineError, match="event kind 'nap'"):
        module.RunEvents.from_json({**data, "events": [{"kind": "nap", "at": 1.0}]})


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ('{"step": 3, "loss": 0.1}', 3),
        ('{"message": "x", "step": "3"}', None),
        ('{"step": true}', None),
        ("step 3", None),
        ('{"step": 3', None),
    ],
)
def test_a_step_line_is_a_json_object_with_an_integer_step(line, step):
    found = module.step_line(line)
    assert (found or {}).get("step") == step


def test_a_line_longer_than_a_step_line_is_never_parsed():
    """A hostile program's megabyte of JSON is not read as a step line (nor, past the same bound, by telemetry)."""
    padded = json.dumps({"step": 3, "pad": "x" * module.MAX_STEP_LINE_CHARS})
    assert module.step_line(padded) is None and module.step_line(json.dumps({"step": 3, "pad": "x"}))
    assert module.MAX_STEP_LINE_CHARS == telemetry.MAX_LINE_CHARS


def test_a_save_on_notice_after_the_last_step_line_loses_no_work():
    """runlib trains, prints the step, then saves on SIGTERM and says so: the save holds the last step."""
    events = _events(
        ("agentStart", 0.0, {}),
        ("programStart", 10.0, {}),
        ("firstStep", 20.0, {"step": 50}),
        ("step", 120.0, {"step": 300}),
        ("sigterm", 121.0, {}),
        ("checkpoint", 125.0, {"step": 300, "seconds": 5.0}),
        ("exit", 126.0, {"code": 75}),
        ("end", 127.0, {}),
    )
    found = module.measure(events)
    assert found.seconds["wastedProgress"] == 0.0 and found.seconds["checkpointSave"] == 5.0
    assert found.seconds["productive"] == pytest.approx(125.0 - 20.0 - 5.0)
    earlier = (*events[:4], module.Event("checkpoint", 100.0, step=250, seconds=1.0), *events[4:5], *events[6:])
    assert module.measure(earlier).seconds["wastedProgress"] == pytest.approx(20.0)  # steps 251-300 lost


def test_the_node_states_billing_reads_are_the_tpu_apis_own():
    """Billed time reads Node.state (tpu.v2): each running state is one the API lists, and NOT_LISTED, which
    stands for a node no zone lists, is none of them, so it can never be mistaken for a state the API sent."""
    from tools.standins.contracts import document

    states = set(document("tpu.v2")["schemas"]["Node"]["properties"]["state"]["enum"])
    assert set(module.UP_STATES) <= states
    assert module.NOT_LISTED not in states
    assert "PREEMPTED" in states and "PREEMPTED" not in module.UP_STATES
    waiting = {*module.PROVISIONING_STATES, *module.DISRUPTED_STATES}
    assert waiting <= states and not waiting & set(module.UP_STATES)
    assert document("tpu.v2")["schemas"]["Node"]["properties"]["createTime"]["format"] == "google-datetime"


def test_training_begins_at_a_save_past_the_start_when_it_comes_before_the_first_step_line():
    """runlib prints a step every 50 steps and saves every checkpointEverySteps: a save of step 20 before the
    first step line (step 60) is training already, and its stall is a save's; the restore line's seconds are the
    restore, and the rest of the start to the first progress is the program's start-up."""
    events = _events(
        ("agentStart", 0.0, {}),
        ("programStart", 10.0, {}),
        ("restored", 40.0, {"step": 0, "seconds": 5.0}),
        ("checkpoint", 60.0, {"step": 20, "seconds": 2.0}),
        ("checkpoint", 70.0, {"step": 40, "seconds": 3.0}),
        ("firstStep", 80.0, {"step": 60}),
        ("checkpoint", 90.0, {"step": 60, "seconds": 4.0}),
        ("exit", 91.0, {"code": 0}),
        ("end", 92.0, {}),
    )
    seconds = module.measure(events).seconds
    assert seconds["restore"] == 5.0
    assert seconds["firstStep"] == pytest.approx(58.0 - 10.0 - 5.0)  # to the first save's start, less the restore
    assert seconds["checkpointSave"] == pytest.approx(2.0 + 3.0 + 4.0)
    assert seconds["productive"] == pytest.approx(90.0 - 58.0 - 9.0)
    # A save of the step it started from is no progress: training begins at the first step line.
    at_start = (*events[:3], module.Event("checkpoint", 50.0, step=0, seconds=1.0), *events[5:])
    assert module.measure(at_start).seconds["firstStep"] == pytest.approx(80.0 - 10.0 - 5.0)


def test_a_restore_line_without_seconds_takes_the_start_to_it():
    events = _events(
        ("programStart", 10.0, {}),
        ("restored", 40.0, {"step": 8}),
        ("firstStep", 45.0, {"step": 9}),
        ("exit", 50.0, {"code": 0}),
    )
    seconds = module.measure(events).seconds
    assert (seconds["restore"], seconds["firstStep"]) == (30.0, 5.0)


def test_a_slice_stopped_by_a_peers_notice_counts_it_once_whether_or_not_this_agent_signalled_too():
    """Worker 0 keeps a slice's record; a preemption may reach another host first, and its program stops with
    the others (runlib's collective stop) and exits EXIT_RETRY before or after worker 0's agent is told."""
    stopped = [
        module.Event("programStart", 0.0),
        module.Event("firstStep", 10.0, step=1),
        module.Event("checkpoint", 20.0, step=5, seconds=1.0),
    ]
    peer_first = (*stopped, module.Event("exit", 21.0, code=75), module.Event("end", 22.0))
    both = (*stopped, module.Event("sigterm", 20.5), module.Event("exit", 21.0, code=75), module.Event("end", 22.0))
    failed = (*stopped, module.Event("exit", 21.0, code=1), module.Event("end", 22.0))
    assert [module.measure(e).preemptions for e in (peer_first, both, failed)] == [1, 1, 0]


def test_an_untrusted_programs_own_exit_retry_is_no_preemption_but_the_agents_sigterm_is():
    """A self-service program chooses its exit code: were EXIT_RETRY a notice, it could fill the stack's
    preemption record, which sets the what-if's rate, by exiting 75 again and again."""
    started = [module.Event("programStart", 0.0), module.Event("firstStep", 10.0, step=1)]
    by_itself = (*started, module.Event("exit", 21.0, code=75), module.Event("end", 22.0))
    told = (*started, module.Event("sigterm", 20.5), module.Event("exit", 21.0, code=75), module.Event("end", 22.0))
    assert [module.measure(e, trusted=False).preemptions for e in (by_itself, told)] == [0, 1]
    assert [module.measure(e).preemptions for e in (by_itself, told)] == [1, 1]


def test_a_report_measures_a_self_service_runs_exits_as_untrusted():
    events = module.RunEvents(
        "r1",
        "vm",
        (module.Event("programStart", 0.0), module.Event("exit", 5.0, code=75), module.Event("end", 6.0)),
        step_lines_trusted=False,
    )
    assert report.measured(events, None, 10.0).preemptions == 0
    assert report.measured(dataclasses.replace(events, step_lines_trusted=True), None, 10.0).preemptions == 1


def _seen(node: str, *changes: tuple[str, float, float | None]) -> module.NodeStates:
    """The record the guard keeps of these checks: (state listed, when, the node's createTime)."""
    states = module.NodeStates(node)
    for state, at, created in changes:
        states = states.observe(state, at, created) or states
    return states


def test_a_nodes_creation_is_its_create_time_not_the_check_that_first_saw_it():
    fresh = _seen("vm", ("CREATING", 1000.0, 940.0), ("READY", 1300.0, 940.0))
    assert fresh.transitions == (("CREATING", 940.0), ("READY", 1300.0))
    # Already READY at first sight: when it got there is unknown, so no creation is kept (no made-up queue).
    assert _seen("vm", ("READY", 1300.0, 100.0)).transitions == (("READY", 1300.0),)
    # Preempted, then re-created by the guard between two checks: CREATING from the new node's createTime.
    again = _seen("vm", ("READY", 1300.0, 940.0), ("PREEMPTED", 2000.0, 940.0), ("READY", 2600.0, 2050.0))
    assert again.transitions == (("READY", 1300.0), ("PREEMPTED", 2000.0), ("CREATING", 2050.0), ("READY", 2600.0))
    assert again.observe("READY", 2900.0, 2050.0) is None  # nothing new to keep
    # Seen CREATING, its createTime first known at the next check: one CREATING, at createTime.
    listed = _seen("vm", ("NOT_LISTED", 1000.0, None), ("CREATING", 1300.0, 1100.0))
    assert listed.transitions == (("NOT_LISTED", 1000.0), ("CREATING", 1100.0))


def test_the_nodes_waits_are_its_provisioning_and_its_recovery_from_a_disruption():
    states = _seen(
        "vm",
        ("CREATING", 1000.0, 940.0),
        ("READY", 1300.0, 940.0),
        ("PREEMPTED", 2000.0, 940.0),  # the guard deletes and re-creates it at this check
        ("CREATING", 2300.0, 2050.0),
        ("READY", 2600.0, 2050.0),
        ("STOPPING", 3000.0, 2050.0),  # the owner's stop: no wait of the run's
        ("STOPPED", 3300.0, 2050.0),
        ("STARTING", 5000.0, 2050.0),
        ("READY", 5200.0, 2050.0),
    )
    assert states.waits() == [("queue", 940.0, 1300.0), ("recoveryWait", 2000.0, 2600.0), ("queue", 5000.0, 5200.0)]


def test_a_runs_waits_are_those_before_its_boots_queue_first_recovery_after():
    """The run's first boot waited for the node's creation; its second for the guard's recovery."""
    states = _seen(
        "vm",
        ("CREATING", 900.0, 860.0),
        ("READY", 980.0, 860.0),
        ("PREEMPTED", 1162.0, 860.0),
        ("CREATING", 4500.0, 4300.0),
        ("READY", 4990.0, 4300.0),
    )
    found = module.measure(PREEMPTED_THEN_FINISHED, states.up(now=9000.0), states.waits())
    assert found.seconds["queue"] == pytest.approx(980.0 - 860.0)
    assert found.seconds["recoveryWait"] == pytest.approx(4990.0 - 1162.0)
    timeline = RunTimeline.of(**IDENTITY, billed_s=found.billed_s, measured=found.seconds)
    assert timeline.billed_s == found.billed_s  # waits are not billed: the node did not run
    # A run that starts in a boot under way (its record opens with its own set-up) has none of the node's waits.
    later = module.measure(PREEMPTED_THEN_FINISHED[2:11], states.up(9000.0), states.waits())
    assert (later.seconds["queue"], later.seconds["recoveryWait"]) == (0.0, 0.0)
    # Its only boot after a recovery: the disruption was another run's (or the idle node's), not this one's.
    resumed = module.measure(PREEMPTED_THEN_FINISHED[11:], states.up(9000.0), states.waits())
    assert resumed.seconds["recoveryWait"] == 0.0


def _workload(conditions: dict[str, tuple[str, str]], **status) -> dict:
    """A Kueue Workload as Kueue writes it (kueue.x-k8s.io/v1beta2): created at 08:00, the conditions given."""
    return {
        "metadata": {"name": "jobset-exp-1-1a2b3", "creationTimestamp": "2026-11-20T08:00:00Z"},
        "status": {
            "conditions": [
                {"type": kind, "status": value, "lastTransitionTime": at, "reason": "", "message": ""}
                for kind, (value, at) in conditions.items()
            ],
            **status,
        },
    }


def test_a_gke_runs_wait_is_its_workloads_creation_to_its_admission():
    created = calendar.timegm((2026, 11, 20, 8, 0, 0))
    admitted = _workload(
        {"QuotaReserved": ("True", "2026-11-20T08:10:00Z"), "Admitted": ("True", "2026-11-20T08:12:00Z")}
    )
    wait = module.KueueWait.of(admitted)
    assert wait.queue_s(now=created + 3600) == 720.0  # quota at 10 minutes, the admission checks 2 more
    assert wait.admitted_s(now=created + 3600) == 3600.0 - 720.0 and wait.evictions == 0
    done = _workload(
        {"Admitted": ("True", "2026-11-20T08:12:00Z"), "Finished": ("True", "2026-11-20T09:12:00Z")},
    )
    assert module.KueueWait.of(done).admitted_s(now=created + 99999) == 3600.0
    pending = _workload({"QuotaReserved": ("False", "2026-11-20T08:00:01Z")})
    assert module.KueueWait.of(pending).queue_s(now=created + 300) == 300.0


def test_an_evicted_and_readmitted_runs_wait_leaves_out_its_earlier_admitted_time():
    """Conditions keep only their latest change: the time admitted before an eviction is Kueue's own count."""
    created = calendar.timegm((2026, 11, 20, 8, 0, 0))
    again = _workload(
        {"Admitted": ("True", "2026-11-20T10:00:00Z"), "Evicted": ("False", "2026-11-20T10:00:00Z")},
        accumulatedPastExecutionTimeSeconds=3000,
        schedulingStats={"evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 2}]},
    )
    wait = module.KueueWait.of(again)
    assert wait.queue_s(now=created + 9000) == 7200.0 - 3000.0
    assert wait.admitted_s(now=created + 9000) == 3000.0 + 1800.0 and wait.evictions == 2
    with pytest.raises(TimelineError, match="creationTimestamp: 'yesterday' is not a time"):
        module.KueueWait.of({**again, "metadata": {"creationTimestamp": "yesterday"}})

"""The agent's timeline recorder (vm_agent/timeline.py) on a local status folder: what it keeps of a program's
lines, what a hostile program's flood of lines can make it store and write, and a run resumed later."""

from __future__ import annotations

import json

import pytest

from run_contract.paths import timeline_name
from run_contract.timeline import RunEvents, measure
from vm_agent import timeline
from vm_agent.gcs import Folder


def recorder(tmp_path, trusted: bool = True) -> timeline.Recorder:
    return timeline.Recorder("user-a@x.example/r1", "vm", trusted, Folder(str(tmp_path)), lambda *a, **k: None)


def stored(tmp_path) -> RunEvents:
    return RunEvents.from_json(json.loads((tmp_path / timeline_name("user-a@x.example/r1")).read_text()))


def test_step_lines_make_a_first_step_one_moving_last_step_and_the_saves(tmp_path):
    run = recorder(tmp_path)
    run.record("prepare")
    run.record("programStart")
    for step in range(1, 101):
        run.line(json.dumps({"step": step, "loss": 0.5}))
        if step % 25 == 0:
            run.line(json.dumps({"message": "checkpoint saved", "step": step, "seconds": 0.5}))
    run.line("not a step line")
    run.record("exit", code=0)
    run.record("end")
    kinds = [e.kind for e in stored(tmp_path).events]
    assert kinds == [
        "prepare",
        "programStart",
        "firstStep",
        "checkpoint",
        "checkpoint",
        "checkpoint",
        "step",
        "checkpoint",
        "exit",
        "end",
    ]
    assert stored(tmp_path).events[kinds.index("step")].step == 100


def test_a_flood_of_untrusted_lines_is_capped_in_what_is_kept_and_how_often_it_is_written(tmp_path):
    run = recorder(tmp_path, trusted=False)
    run.record("programStart")
    writes = run.writes
    line = json.dumps({"message": "checkpoint saved", "step": 1, "seconds": 1e9})
    for _ in range(50_000):
        run.line(line)
        run.line(json.dumps({"step": 2}))
    assert run.writes - writes <= 2  # a write every STEP_WRITE_S at most: the flood takes well under that
    assert len(run.events) <= timeline.MAX_LINE_EVENTS + 3
    run.record("exit", code=0)
    record = stored(tmp_path)
    assert not record.step_lines_trusted
    found = measure(record.events)
    assert found.seconds["checkpointSave"] <= found.billed_s  # a claimed stall never exceeds the time it had


def test_a_run_resumed_later_adds_to_its_record_and_the_time_between_is_not_its_own(tmp_path):
    first = recorder(tmp_path)
    first.extend(timeline.boot_events(uptime=str(tmp_path / "no-such-uptime")))
    first.record("prepare")
    first.record("programStart")
    first.record("sigterm")
    first.record("exit", code=75)
    first.record("end")
    later = recorder(tmp_path)  # the stack's run went first; the request's run starts again
    assert later.events[0].kind == "agentStart"  # no uptime to read: the window opens at the agent
    later.record("prepare")
    later.record("programStart")
    later.record("exit", code=0)
    later.record("end")
    events = stored(tmp_path).events
    assert len(events) == 10
    between = events[6].at - events[5].at
    found = measure(events)
    total = events[-1].at - events[0].at
    assert found.billed_s == pytest.approx(total - between)
    assert found.lost_without_notice == 0 and found.preemptions == 1


@pytest.mark.parametrize("seconds", ["1e999", "1" + "0" * 400, "-1e999"])
def test_a_hostile_save_line_neither_stops_the_reader_nor_spoils_the_record(tmp_path, seconds):
    """`seconds` past what a float holds (JSON's 1e999 reads as infinity, a 400-digit integer overflows a
    float): the line is still a save, its stall unknown, and the record still reads back on the next boot."""
    run = recorder(tmp_path, trusted=False)
    run.record("programStart")
    run.line(f'{{"message": "checkpoint saved", "step": 4, "seconds": {seconds}}}')
    run.record("exit", code=75)
    saves = [e for e in stored(tmp_path).events if e.kind == "checkpoint"]
    assert [(e.step, e.seconds) for e in saves] in ([(4, None)], [(4, 0.0)])
    assert [e.kind for e in recorder(tmp_path).events] == ["programStart", "checkpoint", "exit"]


def test_a_run_ending_in_a_boot_publishes_its_time_by_category_from_worker_0_only(tmp_path):
    """What Monitoring gets (vm_agent/telemetry.py run_seconds): the record's seconds by category, with what the
    agent's view of billed time leaves unattributed, when the run ends; a slice's other workers keep no record
    and publish nothing."""
    published: list[tuple[str, dict[str, float], bool]] = []
    log = lambda *a, **k: None  # noqa: E731
    kept = timeline.Recorder("r1", "vm", False, Folder(str(tmp_path)), log, publish=lambda *a: published.append(a))
    for kind in ("agentStart", "prepare", "programStart"):
        kept.record(kind)
    kept.line('{"step": 1}')
    kept.line('{"step": 2}')
    kept.record("exit", code=0)
    assert published == []  # not before the end
    kept.record("end")
    ((run_id, seconds, trusted),) = published
    assert (run_id, trusted) == ("r1", False)
    found = measure(kept.events)
    assert {k: v for k, v in seconds.items() if k != "unattributed"} == found.seconds
    assert sum(seconds.values()) == pytest.approx(found.billed_s)  # every billed second in some category
    other = timeline.Recorder(
        "r1", "vm", True, Folder(str(tmp_path)), log, write=False, publish=lambda *a: published.append(a)
    )
    other.record("end")
    assert len(published) == 1


def test_a_restore_line_keeps_the_seconds_the_program_says_it_took(tmp_path):
    """runlib's restore line says how long the restore took (workloads/lib/runlib.py): the restore category is
    that, not the program's whole start-up before the line."""
    run = recorder(tmp_path)
    run.record("programStart")
    run.line(json.dumps({"message": "resumed from checkpoint", "step": 60, "resumes": 1, "seconds": 1.25}))
    run.record("exit", code=0)
    (restored,) = [e for e in stored(tmp_path).events if e.kind == "restored"]
    assert (restored.step, restored.seconds) == (60, 1.25)

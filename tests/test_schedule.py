"""Unix-cron parsing and the running hours a stop/start schedule implies."""

from __future__ import annotations

import datetime as dt

import pytest

from infra.schedule import CronError, parse_cron, running_hours_per_month


@pytest.mark.parametrize(
    ("start", "stop", "hours"),
    [
        ("0 8 * * 1-5", "0 20 * * 1-5", round(12 * 5 * 730 / 168, 2)),  # office hours: 260.71 of 730
        ("0 9 * * *", "0 17 * * *", round(8 * 7 * 730 / 168, 2)),  # every day 9-17: a third of 730
        ("30 22 * * *", "30 6 * * *", round(8 * 7 * 730 / 168, 2)),  # overnight, across midnight
        ("0 0 * * 1", "0 0 * * 6", round(5 * 24 * 730 / 168, 2)),  # Monday to Friday, nights included
    ],
)
def test_hours_per_month(start, stop, hours):
    assert running_hours_per_month(start, stop) == hours


def test_cron_fields():
    cron = parse_cron("*/15 8-10,14 1 * 0")
    assert cron.minutes == {0, 15, 30, 45} and cron.hours == {8, 9, 10, 14}
    # Day of month and day of week both restricted: either matches (cron's rule).
    assert cron.matches(dt.datetime(2026, 6, 1, 8, 15))  # the 1st, a Monday
    assert cron.matches(dt.datetime(2026, 6, 7, 9, 30))  # a Sunday
    assert not cron.matches(dt.datetime(2026, 6, 2, 9, 30))
    assert parse_cron("0 0 * * 7").weekdays == {0}  # 7 is Sunday too


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0 8 * *", "needs 5 fields"),
        ("60 8 * * *", "out of range"),
        ("*/0 8 * * *", "step '0'"),
        # croniter extensions Cloud Scheduler's unix-cron does not have:
        ("0 8 * * * *", "needs 5 fields"),  # seconds
        ("0 8 L * *", "no L, W, # or \\? extensions"),
        ("0 8 * * 1#2", "no L, W, # or \\? extensions"),
        ("0 8 ? * 1", "no L, W, # or \\? extensions"),
        ("0 8 15W * *", "no L, W, # or \\? extensions"),
        ("0 8 * * ١-٥", "not a number"),  # Arabic-Indic digits
        ("0 8 * * ²", "not a number"),
        # The text goes to Cloud Scheduler as written: only single spaces between the fields.
        ("0 8 * * 1-5\n", "separated by single spaces"),  # a YAML block scalar's newline
        (" 0 8 * * 1-5", "separated by single spaces"),
        ("0 8\t* * 1-5", "separated by single spaces"),
        ("0 8  * * 1-5", "separated by single spaces"),
    ],
)
def test_bad_cron(text, why):
    with pytest.raises(CronError, match=why):
        parse_cron(text)


@pytest.mark.parametrize(
    ("text", "same_as"),
    [("0 8 * * MON-FRI", "0 8 * * 1-5"), ("0 8 * JAN-MAR sun", "0 8 * 1-3 0"), ("0 8 * * mon,wed", "0 8 * * 1,3")],
)
def test_named_months_and_weekdays_as_cloud_scheduler_reads_them(text, same_as):
    assert parse_cron(text) == parse_cron(same_as)

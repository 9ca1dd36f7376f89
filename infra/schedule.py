"""Unix-cron (as Cloud Scheduler reads it) and the running hours a stop/start schedule implies. Pure."""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from croniter import CroniterError, croniter

FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
# "Always on": Google states monthly prices on a 730-hour month (8760 hours a year / 12; the Cloud
# pricing calculator and the Compute Engine pricing pages' "monthly estimate" use it).
HOURS_PER_MONTH = 730
# A fixed Monday: two weeks are simulated and the second, steady-state week counted.
_WEEK_START = dt.datetime(2026, 6, 1)


class CronError(ValueError):
    pass


# Cloud Scheduler reads unix-cron (https://cloud.google.com/scheduler/docs/configuring/cron-job-schedules):
# five fields, each `*`, a number, a range `a-b`, a list `a,b` or a step `*/n` / `a-b/n`; months and
# weekdays may be named (JAN, MON-FRI). croniter also reads six-field (seconds), `L`, `W`, `#` and `?`
# extensions that Cloud Scheduler refuses, so those are refused first.
_FIELD = re.compile(
    r"(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?(,(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?)*", re.ASCII
)
_NAMES = re.compile(r"[A-Za-z]+")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _check_dialect(parts: list[str]) -> None:
    if len(parts) != 5:
        raise CronError("needs 5 fields: minute hour day-of-month month day-of-week")
    for part, (name, _, _) in zip(parts, FIELDS, strict=True):
        if not _FIELD.fullmatch(part):
            raise CronError(
                f"'{part}' is not a number, range, list, step or * in the {name} field "
                "(Cloud Scheduler has no L, W, # or ? extensions)"
            )
        names = {n.lower() for n in _NAMES.findall(part)}
        known = {"month": _MONTHS, "day of week": _DAYS}.get(name, ())
        if names - set(known):
            hint = "" if known else " (Cloud Scheduler has no L, W, # or ? extensions)"
            raise CronError(f"'{part}' is not a number, range, list, step or * in the {name} field{hint}")


def _values(expanded: Sequence[int | str], low: int, high: int) -> frozenset[int]:
    if expanded == ["*"]:
        return frozenset(range(low, high + 1))
    return frozenset(int(v) for v in expanded)


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool
    any_weekday: bool

    def matches(self, moment: dt.datetime) -> bool:
        if moment.minute not in self.minutes or moment.hour not in self.hours or moment.month not in self.months:
            return False
        day_ok = moment.day in self.days
        weekday_ok = (moment.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:  # cron: both restricted means either may match
            return day_ok and weekday_ok
        return day_ok or weekday_ok


@functools.cache
def parse_cron(text: str) -> Cron:
    parts = text.split(" ")
    if text != " ".join(text.split()):
        # The text reaches Cloud Scheduler as written (a newline from a YAML block scalar, a tab): refused
        # here rather than left to its parser.
        raise CronError(
            f"{text!r}: the five fields must be separated by single spaces, with nothing before or after them"
        )
    _check_dialect(parts)
    try:
        expanded, _nth = croniter.expand(" ".join(parts))
    except (CroniterError, ValueError) as error:
        raise CronError(str(error)) from None
    minutes, hours, days, months, weekdays = (
        _values(values, low, high) for values, (_, low, high) in zip(expanded, FIELDS, strict=True)
    )
    weekdays = frozenset(d % 7 for d in weekdays)
    return Cron(minutes, hours, days, months, weekdays, parts[2] == "*", parts[4] == "*")


@functools.cache  # a fleet usually shares a few schedules; each simulation walks two weeks of minutes
def running_hours_per_month(start: str, stop: str) -> float:
    """Hours a VM runs in a 730-hour month when started and stopped by these crons (steady state)."""
    start_cron, stop_cron = parse_cron(start), parse_cron(stop)
    running = True  # the state before the first event does not matter: week one only settles it
    minutes_running = 0
    for minute in range(2 * 7 * 24 * 60):
        moment = _WEEK_START + dt.timedelta(minutes=minute)
        if stop_cron.matches(moment):
            running = False
        elif start_cron.matches(moment):
            running = True
        if minute >= 7 * 24 * 60 and running:
            minutes_running += 1
    return round(minutes_running / 60 / (7 * 24) * HOURS_PER_MONTH, 2)  # a week's hours, scaled to the month

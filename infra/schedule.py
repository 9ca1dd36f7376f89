"""Unix-cron (as Cloud Scheduler reads it) and the running hours a stop/start schedule implies. Pure."""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass

FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
HOURS_PER_MONTH = 24 * 30  # "always on", the month
# A fixed Monday: two weeks are simulated and the second, steady-state week counted.
_WEEK_START = dt.datetime(2026, 6, 1)


class CronError(ValueError):
    pass


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise CronError(f"bad step '{step_text}' in the {name} field")
        if body == "*":
            start, end = low, high
        elif "-" in body:
            a, _, b = body.partition("-")
            if not (a.isdigit() and b.isdigit()):
                raise CronError(f"bad range '{body}' in the {name} field")
            start, end = int(a), int(b)
        elif body.isdigit():
            start = end = int(body)
            if step:
                end = high
        else:
            raise CronError(f"'{body}' is not a number, range or * in the {name} field")
        if not (low <= start <= end <= high):
            raise CronError(f"'{body}' is outside {low}-{high} in the {name} field")
        values.update(range(start, end + 1, step or 1))
    return frozenset(values)


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
    parts = text.split()
    if len(parts) != 5:
        raise CronError("needs 5 fields: minute hour day-of-month month day-of-week")
    minutes, hours, days, months, weekdays = (
        _field(part, name, low, high) for part, (name, low, high) in zip(parts, FIELDS, strict=True)
    )
    weekdays = frozenset(d % 7 for d in weekdays)
    return Cron(minutes, hours, days, months, weekdays, parts[2] == "*", parts[4] == "*")


@functools.cache  # a fleet usually shares a few schedules; each simulation walks two weeks of minutes
def running_hours_per_month(start: str, stop: str) -> float:
    """Hours a VM runs in a 30-day month when started and stopped by these crons (steady state)."""
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
    return round(minutes_running / 60 / 7 * 30, 2)

"""Cron schedules as Kubernetes reads them (`robfig/cron/v3`'s standard parser).

Why by hand: the CronJob validator and controller must accept exactly what kube-apiserver
accepts and refuse the rest in its words (`expected exactly 5 fields, found 1: [garbage]`,
`end of range (60) above maximum (59): 60`), and compute the same start times, including
the `dom`/`dow` rule (either may match when both are restricted, both must when either is
`*`), `@every`, descriptors and `TZ=`/`CRON_TZ=` prefixes. Python's cron libraries
differ in those rules and wordings.

`parse(spec)` returns a `Schedule` or raises `CronError`; `Schedule.next(after, tz)` gives
the first start strictly after `after` in time zone `tz`. Used by the CronJob strategy
(validation) and the CronJob controller.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import zoneinfo

_STAR = 1 << 63


class CronError(ValueError):
    """A schedule robfig/cron refuses; the message is its error text."""


@dataclasses.dataclass(frozen=True)
class _Bounds:
    low: int
    high: int
    names: dict[str, int] = dataclasses.field(default_factory=dict)


_MINUTE = _Bounds(0, 59)
_HOUR = _Bounds(0, 23)
_DOM = _Bounds(1, 31)
_MONTH = _Bounds(
    1,
    12,
    {
        m: i + 1
        for i, m in enumerate(
            ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
        )
    },
)
_DOW = _Bounds(0, 6, {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))})

_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_GO_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


@dataclasses.dataclass(frozen=True)
class Schedule:
    minute: int = 0
    hour: int = 0
    dom: int = 0
    month: int = 0
    dow: int = 0
    every: float = 0.0  # seconds, for `@every <duration>`
    location: str = ""  # from a TZ=/CRON_TZ= prefix

    def _day_matches(self, day: datetime.date) -> bool:
        dom_match = bool(1 << day.day & self.dom)
        dow_match = bool(1 << ((day.weekday() + 1) % 7) & self.dow)
        if self.dom & _STAR or self.dow & _STAR:
            return dom_match and dow_match
        return dom_match or dow_match

    def next(self, after: datetime.datetime, tz: datetime.tzinfo | None = None) -> datetime.datetime | None:
        """The first activation strictly after `after` (an aware datetime), in `tz` (the prefix's
        location wins, as in robfig/cron); None when there is none within five years."""
        if self.every:
            # robfig rounds @every to whole seconds and schedules from `after` itself.
            step = max(int(self.every), 1)
            return (after + datetime.timedelta(seconds=step)).replace(microsecond=0)
        zone = zoneinfo.ZoneInfo(self.location) if self.location else (tz or datetime.UTC)
        local = after.astimezone(zone).replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
        day = local.date()
        start_minute = local.hour * 60 + local.minute
        for _ in range(366 * 5):
            if 1 << day.month & self.month and self._day_matches(day):
                for hour in range(start_minute // 60, 24):
                    if not 1 << hour & self.hour:
                        continue
                    first = start_minute % 60 if hour == start_minute // 60 else 0
                    for minute in range(first, 60):
                        if 1 << minute & self.minute:
                            found = _resolve(day, hour, minute, zone)
                            if found is not None and found > after:
                                return found.astimezone(after.tzinfo)
            day += datetime.timedelta(days=1)
            start_minute = 0
        return None


def _resolve(day: datetime.date, hour: int, minute: int, zone: datetime.tzinfo) -> datetime.datetime | None:
    """A wall-clock time in `zone`; None for a time skipped by a DST change."""
    naive = datetime.datetime(day.year, day.month, day.day, hour, minute)
    aware = naive.replace(tzinfo=zone)
    back = aware.astimezone(datetime.UTC).astimezone(zone)
    if back.replace(tzinfo=None) != naive:
        return None
    return aware


def parse(spec: str) -> Schedule:
    if not spec:
        raise CronError("empty spec string")
    location = ""
    if spec.startswith(("TZ=", "CRON_TZ=")):
        head, _, spec = spec.partition(" ")
        location = head.split("=", 1)[1]
        try:
            zoneinfo.ZoneInfo(location)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise CronError(f"provided bad location {location}: unknown time zone {location}") from None
        spec = spec.strip()
    if spec.startswith("@"):
        if spec.startswith("@every "):
            text = spec[len("@every ") :]
            return Schedule(every=_go_duration(text), location=location)
        if spec not in _DESCRIPTORS:
            raise CronError(f"unrecognized descriptor: {spec}")
        spec = _DESCRIPTORS[spec]
    fields = spec.split()
    if len(fields) != 5:
        raise CronError(f"expected exactly 5 fields, found {len(fields)}: [{' '.join(fields)}]")
    minute, hour, dom, month, dow = (
        _field(f, b) for f, b in zip(fields, (_MINUTE, _HOUR, _DOM, _MONTH, _DOW), strict=True)
    )
    return Schedule(minute, hour, dom, month, dow, location=location)


def _field(text: str, bounds: _Bounds) -> int:
    bits = 0
    for expr in [part for part in text.split(",") if part]:
        bits |= _range(expr, bounds)
    return bits


def _range(expr: str, bounds: _Bounds) -> int:
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    extra = 0
    if low_and_high[0] in ("*", "?"):
        start, end, extra = bounds.low, bounds.high, _STAR
    else:
        start = _int_or_name(low_and_high[0], bounds)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _int_or_name(low_and_high[1], bounds)
        else:
            raise CronError(f"too many hyphens: {expr}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _must_int(range_and_step[1])
        if len(low_and_high) == 1:
            end = bounds.high  # "N/step" means "N-max/step"
        if step > 1:
            extra = 0
    else:
        raise CronError(f"too many slashes: {expr}")
    if start < bounds.low:
        raise CronError(f"beginning of range ({start}) below minimum ({bounds.low}): {expr}")
    if end > bounds.high:
        raise CronError(f"end of range ({end}) above maximum ({bounds.high}): {expr}")
    if start > end:
        raise CronError(f"beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise CronError(f"step of range should be a positive number: {expr}")
    bits = 0
    for value in range(start, end + 1, step):
        bits |= 1 << value
    return bits | extra


def _int_or_name(text: str, bounds: _Bounds) -> int:
    if text.lower() in bounds.names:
        return bounds.names[text.lower()]
    return _must_int(text)


def _must_int(text: str) -> int:
    try:
        value = int(text, 10) if re.fullmatch(r"[+-]?[0-9]+", text) else None
    except ValueError:
        value = None
    if value is None:
        raise CronError(f'failed to parse int from {text}: strconv.Atoi: parsing "{text}": invalid syntax')
    if value < 0:
        raise CronError(f"negative number ({value}) not allowed: {text}")
    return value


def _go_duration(text: str) -> float:
    """time.ParseDuration, as `@every` reads it."""
    shown = f'failed to parse duration @every {text}: time: invalid duration "{text}"'
    if text == "0":
        return 0.0
    position, seconds = 0, 0.0
    if not text:
        raise CronError(shown)
    while position < len(text):
        match = _GO_DURATION.match(text, position)
        if match is None or match[1] in ("", "."):
            raise CronError(shown)
        seconds += float(match[1]) * _UNIT_SECONDS[match[2]]
        position = match.end()
    return seconds


def valid_time_zone(name: str) -> str:
    """Why `name` is not a time zone CronJobs accept ("" when it is), in the validator's words."""
    if not name:
        return "timeZone must be nil or non-empty string"
    if name.lower() == "local":
        return "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones"
    for part in name.split("/"):
        if part in (".", "..") or not re.fullmatch(r"[A-Za-z\.\-_0-9+]{1,14}", part):
            return f"unknown time zone {name}"
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {name}"
    return ""

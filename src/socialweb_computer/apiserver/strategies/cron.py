"""CronJob schedules, checked the way upstream's cron parser (robfig/cron v3) checks them.

Why: a CronJob whose `schedule` does not parse is refused upstream with the parser's own
sentence (`spec.schedule: Invalid value: "garbage": expected exactly 5 fields, found 1:
[garbage]`); accepting it would store a CronJob no controller could ever run. Only
parsing is done here, not scheduling. Called by `workloads.CronJobStrategy`.
"""

from __future__ import annotations

import re

_DESCRIPTORS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
_MONTHS = {name: i + 1 for i, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (minimum, maximum, names) of minute, hour, day of month, month, day of week.
_FIELDS: tuple[tuple[int, int, dict[str, int] | None], ...] = (
    (0, 59, None), (0, 23, None), (1, 31, None), (1, 12, _MONTHS), (0, 6, _DAYS))
_UNIT = r"(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)"
_DURATION = re.compile(rf"^[-+]?{_UNIT}({_UNIT})*$")


class ScheduleError(ValueError):
    pass


def schedule_error(spec: str) -> str | None:
    """cron.ParseStandard's error for `spec`, or None when it parses."""
    try:
        _parse(spec)
    except ScheduleError as e:
        return str(e)
    return None


def _parse(spec: str) -> None:
    if not spec:
        raise ScheduleError("empty spec string")
    if spec.startswith(("TZ=", "CRON_TZ=")):
        zone, _, spec = spec.partition(" ")
        spec = spec.strip()
        if not zone.partition("=")[2]:
            raise ScheduleError(f"provided bad location {zone.partition('=')[2]}: unknown time zone ")
    if spec.startswith("@"):
        _descriptor(spec)
        return
    fields = spec.split()
    if len(fields) != 5:
        raise ScheduleError(f"expected exactly 5 fields, found {len(fields)}: [{' '.join(fields)}]")
    for text, (low, high, names) in zip(fields, _FIELDS, strict=True):
        for expr in text.split(","):
            _range(expr, low, high, names)


def _descriptor(spec: str) -> None:
    if spec in _DESCRIPTORS:
        return
    if spec.startswith("@every "):
        duration = spec[len("@every "):]
        if not _DURATION.match(duration):
            raise ScheduleError(f'failed to parse duration {spec}: time: invalid duration "{duration}"')
        return
    raise ScheduleError(f"unrecognized descriptor: {spec}")


def _range(expr: str, low: int, high: int, names: dict[str, int] | None) -> None:
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    if low_and_high[0] in ("*", "?"):
        start, end = low, high
    else:
        start = _int_or_name(low_and_high[0], names)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _int_or_name(low_and_high[1], names)
        else:
            raise ScheduleError(f"too many hyphens: {expr}")
    step = 1
    if len(range_and_step) == 2:
        step = _int(range_and_step[1])
        if len(low_and_high) == 1:
            end = high  # "N/step" means "N-max/step"
    elif len(range_and_step) > 2:
        raise ScheduleError(f"too many slashes: {expr}")
    if start < low:
        raise ScheduleError(f"beginning of range ({start}) below minimum ({low}): {expr}")
    if end > high:
        raise ScheduleError(f"end of range ({end}) above maximum ({high}): {expr}")
    if start > end:
        raise ScheduleError(f"beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise ScheduleError(f"step of range should be a positive number: {expr}")


def _int_or_name(expr: str, names: dict[str, int] | None) -> int:
    if names is not None and expr.lower() in names:
        return names[expr.lower()]
    return _int(expr)


def _int(expr: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", expr):
        raise ScheduleError(
            f'failed to parse int from {expr}: strconv.Atoi: parsing "{expr}": invalid syntax')
    number = int(expr)
    if number < 0:
        raise ScheduleError(f"negative number ({number}) not allowed: {expr}")
    return number

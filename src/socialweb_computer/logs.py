"""How the gateway logs: one line per event, levels that mean something, text or JSON.

`configure()` is called once by the commands that serve (`gateway`, `apiserver`); library
code only ever does `log = logging.getLogger(__name__)`. What the levels mean here:

    DEBUG    per-request detail, and clients going away (a closed watch is ordinary)
    INFO     lifecycle: a cluster came up, was parked or deleted; the gateway started
    WARNING  something the operator should look at, the gateway carries on
    ERROR    something failed and needs a person (a traceback goes with it, on the same line)

Every record is one line whatever it carries: a traceback is folded into the line (text)
or into the `exc` field (JSON), so journald and Loki keep one event as one entry. And no
record carries a secret: `redact()` runs over every formatted line, as the last line of
defence behind code that never logs credentials in the first place (PEM private keys,
JWTs, bearer tokens and Authorization headers are replaced by `[REDACTED]`).
"""

from __future__ import annotations

import datetime
import logging
import re
import sys
from typing import Any, TextIO

import orjson

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
REDACTED = "[REDACTED]"

_SECRETS = (
    # A PEM private key, whole (RSA, EC, PKCS#8, encrypted).
    re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(-----END \1PRIVATE KEY-----|$)", re.DOTALL),
    # A JWT (ServiceAccount and OIDC tokens) wherever it appears, with or without a header.
    re.compile(r"()eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"),
    # Bearer tokens and the header that carries them, in any spelling.
    # (16 characters at least: "invalid bearer token" is a message, not a token).
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{16,}"),
    re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]+(\s+[^\s\"',}]+)?"),
    # token=..., password: ..., client-key-data: ... in query strings, kubeconfigs, YAML, JSON.
    re.compile(r"(?i)((?:token|password|secret|client-key-data)[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,}]+"),
)
# Loggers of libraries that report a client going away as an error with a traceback.
_DISCONNECT_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access")


def redact(text: str) -> str:
    """`text` with anything shaped like a credential replaced by [REDACTED]."""
    text = _SECRETS[0].sub(REDACTED, text)
    for pattern in _SECRETS[1:]:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def _exception_text(record: logging.LogRecord, formatter: logging.Formatter) -> str:
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    text = record.exc_text or ""
    if record.stack_info:
        text = f"{text}\n{formatter.formatStack(record.stack_info)}" if text else record.stack_info
    return text


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """`2026-11-02T10:00:00.123Z INFO socialweb_computer.gateway: message`, one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        trace = _exception_text(record, self)
        if trace:
            # Folded, not dropped: the traceback stays on the event's own line.
            line = f"{line} | {trace.strip()}"
        return redact(line.replace("\r", "").replace("\n", "\\n"))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, and exc when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        trace = _exception_text(record, self)
        if trace:
            entry["exc"] = redact(trace.strip())
        return orjson.dumps(entry).decode()


class ClientGoneFilter(logging.Filter):
    """A client closing its connection (a watch ended early, a browser tab closed) is not
    an error: library records about it drop to DEBUG, without their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name not in _DISCONNECT_LOGGERS or not record.exc_info:
            return True
        exc = record.exc_info[1]
        if not isinstance(exc, ConnectionError):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = "client closed the connection: %s", (exc,)
        record.exc_info, record.exc_text = None, None
        return True


def configure(level: str = "INFO", fmt: str = "text", *, stream: TextIO | None = None) -> None:
    """Route every logger to one handler on `stream` (stderr) in `fmt`; replaces earlier setup."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}: use one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ClientGoneFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # asyncio reports "Task exception was never retrieved" and slow callbacks at DEBUG/ERROR
    # itself; keep it at WARNING unless the operator asked for DEBUG.
    logging.getLogger("asyncio").setLevel(level if level == "DEBUG" else "WARNING")

"""Logging: one line per event, text or JSON, no secret, a closed connection is not an error."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from socialweb_computer import logs

KEY = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB9v3kq0aB5Z\n-----END EC PRIVATE KEY-----"


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


def _fail() -> None:
    raise RuntimeError("boom\nsecond line")


def test_text_is_one_line_per_event_even_with_a_traceback(captured: io.StringIO) -> None:
    logs.configure("INFO", "text", stream=captured)
    log = logging.getLogger("socialweb_computer.test")
    log.info("cluster %s is Ready", "ci")
    try:
        _fail()
    except RuntimeError:
        log.exception("sync failed")
    lines = captured.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("INFO socialweb_computer.test: cluster ci is Ready")
    assert " ERROR socialweb_computer.test: sync failed | Traceback (most recent call last):" in lines[1]
    assert "RuntimeError: boom\\nsecond line" in lines[1]


def test_json_is_one_object_per_line(captured: io.StringIO) -> None:
    logs.configure("DEBUG", "json", stream=captured)
    log = logging.getLogger("socialweb_computer.test")
    log.debug("watch of %s closed", "pods")
    try:
        _fail()
    except RuntimeError:
        log.error("failed", exc_info=True)
    first, second = (json.loads(line) for line in captured.getvalue().splitlines())
    assert first["level"] == "DEBUG" and first["msg"] == "watch of pods closed"
    assert first["logger"] == "socialweb_computer.test" and first["time"].endswith("Z")
    assert "exc" not in first
    assert second["level"] == "ERROR" and "RuntimeError: boom" in second["exc"]


def test_levels_filter(captured: io.StringIO) -> None:
    logs.configure("WARNING", "text", stream=captured)
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    assert "hidden" not in captured.getvalue() and "shown" in captured.getvalue()


@pytest.mark.parametrize("fmt", logs.FORMATS)
def test_no_secret_reaches_the_log(captured: io.StringIO, fmt: str) -> None:
    logs.configure("DEBUG", fmt, stream=captured)
    log = logging.getLogger("socialweb_computer.test")
    log.info("key %s", KEY)
    log.info("header Authorization: Bearer abcdef.0123456789abcdef")
    log.info("url /api?token=s3cr3t&x=1 and password: hunter2")
    log.info('kubeconfig {"client-key-data": "LS0tLS1CRUdJTg=="}')
    log.info("reviewed eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl for a pod")
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError:
        log.exception("parse")
    text = captured.getvalue()
    for secret in ("MHcCAQEEIB9v3kq0aB5Z", "0123456789abcdef", "s3cr3t", "hunter2", "LS0tLS1CRUdJTg==",
                   "eyJzdWIiOiJzeXN0ZW0ifQ"):
        assert secret not in text
    assert text.count(logs.REDACTED) >= 7
    assert "x=1" in text  # only the secret goes


def test_ordinary_words_are_kept() -> None:
    for line in ('secrets "db" not found; the token controller is running; Bearer',
                 "Unable to authenticate: [invalid bearer token, service account token has expired]"):
        assert logs.redact(line) == line


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_a_client_closing_its_connection_is_not_an_error(captured: io.StringIO, level: str) -> None:
    logs.configure(level, "text", stream=captured)
    server = logging.getLogger("aiohttp.server")
    try:
        raise ConnectionResetError("Cannot write to closing transport")
    except ConnectionResetError:
        server.exception("Error handling request from 127.0.0.1")
    try:
        raise KeyError("real bug")
    except KeyError:
        server.exception("Error handling request from 127.0.0.1")
    lines = captured.getvalue().splitlines()
    assert "Traceback" not in "".join(line for line in lines if "Cannot write" in line)
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 1 and "KeyError" in errors[0]  # a real failure still is an error
    gone = [line for line in lines if "client closed the connection" in line]
    assert len(gone) == (1 if level == "DEBUG" else 0)
    assert all(" DEBUG " in line for line in gone)

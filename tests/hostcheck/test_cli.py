"""The check-host command line: both flag spellings, environment defaults, -json, the line
format, and usage errors (exit status 2, argparse style)."""

from __future__ import annotations

import json

import pytest

from socialweb_computer.cli import main as cli_main
from socialweb_computer.hostcheck import checks, context


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main(["check-host", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: socialweb-computer check-host")
    return err.splitlines()[-1]


def test_usage_errors_exit_2(host, capsys) -> None:
    state = str(host.state)
    assert _usage_error(capsys, "-role", "bidder", "-state-dir", state) == (
        "socialweb-computer check-host: error: argument -role/--role: invalid choice: 'bidder' "
        "(choose from 'gateway', 'node')")
    missing = _usage_error(capsys, "-role", "node")
    assert "the following arguments are required: -state-dir/--state-dir" in missing
    spec = str(host.root / "none.yaml")
    assert _usage_error(capsys, "-role", "node", "-state-dir", state, "-spec", spec) == (
        f"socialweb-computer check-host: error: argument -spec/--spec: cannot read the gateway spec "
        f"{host.root / 'none.yaml'}: No such file or directory. Pass an existing file with --spec (or "
        "$SOCIALWEB_GATEWAY_SPEC), or leave it out for the defaults.")
    host.spec_path.write_text("listen: {apiPort: eighty}\n")
    assert "argument -spec/--spec: " in _usage_error(capsys, "-role", "node", "-state-dir", state, "-spec",
                                                     str(host.spec_path))


def test_single_and_double_dash_flags_and_environment_defaults_agree(host, monkeypatch) -> None:
    single = host.run("node")
    host.capsys.readouterr()
    argv = ["check-host", "--role=node", f"--state-dir={host.state}", "--spec", str(host.spec_path)]
    assert cli_main.main(argv) == 0
    double = host.capsys.readouterr().out
    monkeypatch.setenv("SOCIALWEB_STATE_DIR", str(host.state))
    monkeypatch.setenv("SOCIALWEB_GATEWAY_SPEC", str(host.spec_path))
    assert cli_main.main(["check-host", "-role", "node"]) == 0
    from_env = host.capsys.readouterr().out

    def strip_probe(out: str) -> str:  # free space moves between runs
        return "\n".join(line for line in out.splitlines() if not line.startswith("state-dir-space"))

    assert strip_probe(single.out) == strip_probe(double) == strip_probe(from_env)


def test_lines_are_aligned_columns_with_the_fix_last(host) -> None:
    (host.bin / "runc").unlink()
    run = host.run("node")
    lines = run.out.splitlines()
    width = max(len(name) for name in run.lines)
    for line in lines:
        name, status = line.split()[:2]
        assert line.startswith(f"{name:<{width}}  {status:<4}  "), line
        assert status in {"ok", "FAIL"}
    assert run.err == "check-host (role node): 1 of 22 checks failed: runc\n"


def test_json_lists_name_ok_found_fix_for_every_check(host) -> None:
    (host.bin / "runc").unlink()
    run = host.run("node", "-json")
    assert run.code == 1
    results = json.loads(run.out)
    assert [r["name"] for r in results] == [c.name for c in checks.for_role("node")]
    assert all(set(r) == {"name", "ok", "found", "fix"} for r in results)
    assert all((r["fix"] is None) == r["ok"] for r in results)
    assert {r["name"] for r in results if not r["ok"]} == {"runc"}
    assert run.err == ""


def test_a_probe_that_breaks_fails_its_line_without_stopping_the_others(tmp_path) -> None:
    def boom(ctx: context.Context) -> context.Finding:
        raise RuntimeError("unexpected /proc layout")

    check = checks.Check("broken", "why", "ask {user} about {state_dir}", boom)
    ctx = context.Context(role="node", state_dir=str(tmp_path))
    result = checks.evaluate(check, ctx)
    assert result == checks.Result("broken", False, "could not check: unexpected /proc layout",
                                   f"ask {ctx.user} about {tmp_path}")


def test_findings_are_kept_on_one_line(tmp_path) -> None:
    check = checks.Check("multi", "why", "fix", lambda ctx: context.ok("first\n  second\n"))
    result = checks.evaluate(check, context.Context(role="node", state_dir=str(tmp_path)))
    assert result.found == "first second"

#!/usr/bin/env bash
# The project's one test command: install what is missing, lint, run the test suite.
#
#   scripts/test.sh                      # everything (what CI runs, via .ci/run)
#   scripts/test.sh -m "not slow"        # skip the slow tests (VM boots) locally
#   scripts/test.sh tests/storage -x     # any pytest arguments pass through
#
# Steps: scripts/bootstrap.sh (idempotent), then `ruff check` and `pytest "$@"` with the repo's
# .tools/bin first on PATH, so `kubectl` and `helm` are the pinned ones and never the machine's.
# Both steps always run; the script fails if either fails.
#
# pytest's exit code 5 ("no tests collected"):
#   - with a selection filter (-m, -k, --deselect, --lf, or a test path / node id) it means the
#     filter matched nothing, which is not an error: we say so and count it as success;
#   - with no filter it means the suite found no tests at all, which must never pass CI.
#
# Parallel: the suite runs on $SOCIALWEB_TEST_WORKERS pytest-xdist workers (default 4: one for each
# host chain below, two for everything else; docs/testing.md has the figures).  Tests that touch host-global state (sandbox nodes, containerd,
# QEMU, netns, nft, cgroups, accounts: the `host` marker, given by a rule in tests/conftest.py)
# run as two chains, microVM tests and the rest, each on one worker, one test after another;
# every other test module runs whole on whichever worker is free (tests/conftest.py's scheduler,
# whatever --dist says).  Any -n/--numprocesses or `-p no:xdist` in the arguments wins, so one
# file still runs serially:
#
#   scripts/test.sh tests/node/test_pods_kubectl.py -n 0
#
# The last line is a plain summary ("summary: N passed, N failed, N skipped"), read from
# pytest's JUnit report.  The whole suite must stay under 30 minutes on a 2-core machine:
# `--durations` lists the slowest tests to keep that budget visible.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

bash "$REPO_ROOT/scripts/bootstrap.sh" --test

export PATH="$REPO_ROOT/.tools/bin:$REPO_ROOT/.venv/bin:$PATH"
hash -r
if [[ "$(command -v kubectl)" != "$REPO_ROOT/.tools/bin/kubectl" ]]; then
    echo "test.sh: kubectl on PATH is $(command -v kubectl), not .tools/bin/kubectl" >&2
    exit 1
fi

# True when the arguments narrow the selection, so "nothing collected" is a legitimate outcome.
has_selection_filter() {
    local arg
    for arg in "$@"; do
        case "$arg" in
            -m | -m* | -k | -k* | --deselect | --deselect=* | --lf | --last-failed) return 0 ;;
            -*) ;;
            *) [[ -e "${arg%%::*}" ]] && return 0 ;;
        esac
    done
    return 1
}

# True when the arguments say how many workers to use, or turn xdist off.
chooses_workers() {
    local arg previous=""
    for arg in "$@"; do
        case "$arg" in
            -n | -n* | --numprocesses | --numprocesses=* | -pno:xdist) return 0 ;;
        esac
        [[ "$previous" == "-p" && "$arg" == "no:xdist" ]] && return 0
        previous="$arg"
    done
    return 1
}

parallel_args=()
if ! chooses_workers "$@"; then
    parallel_args=(-n "${SOCIALWEB_TEST_WORKERS:-4}")
fi

REPORT_DIR="$(mktemp -d)"
trap 'rm -rf "$REPORT_DIR"' EXIT
started=$SECONDS

lint_targets=()
for dir in src tests bench; do
    [[ -d "$dir" ]] && lint_targets+=("$dir")
done
ruff_status=0
ruff check "${lint_targets[@]}" || ruff_status=$?

pytest_status=0
pytest --junitxml="$REPORT_DIR/junit.xml" --durations=15 "${parallel_args[@]}" "$@" || pytest_status=$?

pytest_word="exit $pytest_status"
if ((pytest_status == 5)); then
    if has_selection_filter "$@"; then
        echo "test.sh: no tests collected: the selection filter matched nothing (not an error)"
        pytest_word="exit 5 (no tests collected by the filter: ok)"
        pytest_status=0
    else
        echo "test.sh: no tests collected and no filter given: the suite is empty or broken" >&2
        pytest_word="exit 5 (no tests collected: FAILED)"
    fi
fi

counts="$(python - "$REPORT_DIR/junit.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("0 passed, 0 failed, 0 skipped")
    sys.exit()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
total = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
failed = total["failures"] + total["errors"]
passed = total["tests"] - failed - total["skipped"]
print(f"{passed} passed, {failed} failed, {total['skipped']} skipped")
PY
)"

ruff_word="ok"
((ruff_status == 0)) || ruff_word="FAILED (exit $ruff_status)"
echo "test.sh: ruff $ruff_word; pytest $pytest_word; $((SECONDS - started))s"
echo "summary: $counts"

if ((ruff_status != 0 || pytest_status != 0)); then
    exit 1
fi

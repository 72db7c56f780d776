#!/usr/bin/env bash
# The Python client's conformance suite against the real ringlockd.
# Env: RINGLOCKD (default: target/debug/ringlockd of the repo root),
# RINGLOCK_TEST_THREADS (--threads, default 1), PYTHON (default python3).
# Extra arguments name scenarios to run (default: all). Exits 0 only if
# every scenario passed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export RINGLOCKD="${RINGLOCKD:-$root/target/debug/ringlockd}"
if [[ ! -x "$RINGLOCKD" ]]; then
    echo "conformance python: no ringlockd at $RINGLOCKD (cargo build --bin ringlockd)" >&2
    exit 1
fi
python="${PYTHON:-python3}"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
    echo "conformance python: needs Python >= 3.9 ($python is $("$python" --version 2>&1))" >&2
    exit 1
}
# Install the package the way a user does, offline (--no-index: its build
# backend needs nothing from an index), and test that installed copy.
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
"$python" -m pip install --quiet --no-index --no-cache-dir --target "$site" "$here" >/dev/null || {
    echo "conformance python: pip install --no-index $here failed" >&2
    exit 1
}
export PYTHONPATH="$site"
# The unit tests first (the codec's, the fake servers', and test_tls.py:
# the real ringlockd --certs-dir with certificates of the real `ringlock
# cert`, the ringlock beside $RINGLOCKD unless RINGLOCK_CLI), then the
# scenarios.
(cd "$here/tests" && "$python" -m unittest discover -q -s . -p 'test_*.py')
"$python" "$here/tests/conformance.py" "$@"

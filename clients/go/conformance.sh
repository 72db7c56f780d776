#!/usr/bin/env bash
# The conformance scenarios of the Go client against the real ringlockd:
# prints `conformance go <name> ok` per scenario and exits 0 only if all
# passed. Env: RINGLOCKD (default target/debug/ringlockd of the repository),
# RINGLOCK_TEST_THREADS (--threads, default 1). Nothing is fetched: the
# module has no dependencies (GOPROXY=off, GOFLAGS=-mod=mod).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export RINGLOCKD="${RINGLOCKD:-$root/target/debug/ringlockd}"
[ -x "$RINGLOCKD" ] || { echo "conformance go: $RINGLOCKD missing (cargo build --bin ringlockd)" >&2; exit 1; }
export GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local
# Go keeps its build cache under $HOME; give it one where HOME is unset.
[ -n "${HOME:-}" ] || [ -n "${GOCACHE:-}" ] || export GOCACHE="${TMPDIR:-/tmp}/ringlock-go-cache"
command -v go >/dev/null || { echo "conformance go: no go on PATH (scripts/install-test-tools.sh installs golang-go)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$here"
go test -c -o "$tmp/conformance.test" ./conformance
# Run the binary itself (not `go test`) so each scenario's line appears as
# it passes; the keepalive_loss holder child is this binary re-executed.
# The package's other tests (client behaviour beyond the conformance scenarios)
# run too.
"$tmp/conformance.test" -test.timeout 600s "$@"

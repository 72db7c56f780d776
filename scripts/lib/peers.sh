# Shared by scripts/bench.sh and scripts/cluster-bench.sh (sourced, not
# run): the peers' own clients (etcd's native Go client, ZooKeeper's kazoo
# lock recipe), their Debian packages, and etcd's settings for a latency
# test. The sourcing script defines log() and ROOT first.
#
# etcd settings (ETCD_TUNING, ETCD_IONICE), from etcd's own guidance
# (etcd.io/docs/v3.4: tuning, op-guide/performance, op-guide/hardware),
# given explicitly so that the command line shows every choice:
#   --heartbeat-interval 100 --election-timeout 1000: the defaults. The
#       tuning guide sizes them to the members' round trip for stable
#       leadership (heartbeat ~ 0.5-1.5x RTT, election >= 10x RTT) and says
#       the defaults suit a low-latency local network. They do not pace
#       commits: in etcd 3.x a proposal goes to the followers at once and
#       the leader answers once a quorum has logged it. Lower values (loopback
#       RTT is ~50 us) would only add heartbeat work on the one CPU the three
#       members share, and risk elections when that CPU is busy.
#   --snapshot-count 100000: 3.4's default (the guide lowers it only to save
#       memory); a bench run writes far fewer entries, so no snapshot falls
#       inside a measured run (a snapshot is a latency spike on the leader).
#   --auto-compaction-retention 0 (off, the default): compaction is
#       housekeeping for long-lived clusters; every run here starts a fresh
#       cluster whose history stays small, and a compaction during the run
#       would be background work on the members' CPU.
#   --quota-backend-bytes 0 (= the 2 GiB default): far above what a run
#       writes.
#   ionice -c2 -n0 (ETCD_IONICE): the tuning guide's disk advice, the
#       highest best-effort I/O priority for etcd, so other processes' I/O
#       does not delay its WAL fsync. It acts under the BFQ/CFQ schedulers;
#       under mq-deadline or none (this machine's virtio disk) it changes
#       nothing, and it is kept so that a host with BFQ gets it too.
# Durability is untouched: every member fsyncs its WAL before it answers
# (etcd 3.4 has no switch to turn that off; none is used).
ETCD_TUNING=(--heartbeat-interval 100 --election-timeout 1000 --snapshot-count 100000
    --auto-compaction-retention 0 --quota-backend-bytes 0)
ETCD_IONICE="ionice -c2 -n0"

# Debian's etcd 3.4 client sources (golang-etcd-server-dev puts them, and
# grpc, protobuf, zap ... as its dependencies, under /usr/share/gocode).
ETCD_CONCURRENCY_SRC=/usr/share/gocode/src/go.etcd.io/etcd/clientv3/concurrency
ETCD_NATIVE="$ROOT/target/peers/etcd-native-loadgen"
KAZOO_LOADGEN="$ROOT/bench/peers/zookeeper/kazoo-loadgen.py"
# Debian's python3-kazoo installs for Debian's python3, which need not be the
# python3 first on PATH (a pyenv or venv one would not see it).
KAZOO_PYTHON=/usr/bin/python3

# The Debian packages a peer needs that are missing, one a line.
peer_packages() { # etcd-native|zookeeper
    case "$1" in
    etcd-native)
        command -v etcd >/dev/null || echo etcd-server
        command -v go >/dev/null || echo golang-go
        [ -d "$ETCD_CONCURRENCY_SRC" ] || echo golang-etcd-server-dev ;;
    zookeeper)
        # zookeeper brings libzookeeper-java and default-jre (java).
        { [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null; } || echo zookeeper
        [ -f /usr/share/java/slf4j-simple.jar ] || echo libslf4j-java
        "$KAZOO_PYTHON" -c 'import kazoo' >/dev/null 2>&1 || echo python3-kazoo ;;
    esac
}
# Installs what peer_packages names when installing is allowed; fails (never
# skips) when something is still missing.
need_peer() { # install(0|1) etcd-native|zookeeper
    local missing
    missing=$(peer_packages "$2" | tr '\n' ' ')
    if [ "$1" = 1 ] && [ -n "$missing" ]; then
        log "installing: $missing"
        apt-get update -qq
        # shellcheck disable=SC2086 # a list of package names
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
        missing=$(peer_packages "$2" | tr '\n' ' ')
    fi
    if [ -n "$missing" ]; then
        echo "$2 needs the Debian packages: $missing(run without --no-install, or apt-get install them)" >&2
        return 1
    fi
}

# Builds bench/peers/etcd-native (etcd's clientv3 + concurrency, Go) into
# $ETCD_NATIVE with Debian's Go in GOPATH mode: every import resolves under
# /usr/share/gocode, nothing is fetched (GOPROXY=off). The build cache stays
# in target/peers, so a rebuild takes seconds.
build_etcd_native() {
    local out="$ROOT/target/peers"
    mkdir -p "$out"
    if ! (cd "$ROOT/bench/peers/etcd-native" && GO111MODULE=off GOPATH=/usr/share/gocode \
            GOCACHE="$out/gocache" GOPROXY=off GOFLAGS= go build -o "$ETCD_NATIVE" .) >"$out/etcd-native-build.log" 2>&1; then
        echo "etcd-native-loadgen did not build: $(tail -c 600 "$out/etcd-native-build.log")" >&2
        return 1
    fi
}
# "etcd clientv3 3.4.23 (Debian golang-etcd-server-dev), go1.19.8": what the
# native client is built from, for the reports.
etcd_native_version() {
    echo "clientv3 from golang-etcd-server-dev $(dpkg-query -W -f '${Version}' golang-etcd-server-dev 2>/dev/null || echo '?'), $(go version 2>/dev/null | awk '{print $3}')"
}
kazoo_version() {
    echo "kazoo $("$KAZOO_PYTHON" -c 'import kazoo.version as v; print(v.__version__)' 2>/dev/null || echo '?') (python3-kazoo), $("$KAZOO_PYTHON" --version 2>&1)"
}

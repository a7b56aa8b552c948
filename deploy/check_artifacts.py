#!/usr/bin/env python3
"""Static checks of the deploy/ artifacts, run by deploy/check.sh.

Needs only Python 3.11+ and PyYAML: no Docker, no cluster, no network. Every
problem found is printed (all of them, not just the first) and the exit code
is 1 if there was any.

  - docker-compose.yml: the topology (6 Redis Cluster nodes with AOF, the
    one-shot cluster init, PostgreSQL 15, 2 shardstock replicas built from
    deploy/Dockerfile, the load balancer on :8080, Prometheus, Grafana), that
    every bind-mounted file exists and every dependency/volume is declared;
  - Dockerfile: the stages, user, ports and command the brief fixes;
  - k8s/*.yaml: every document has apiVersion, kind, metadata.name; the kinds
    expected are there and wired together (labels, ports, probes, Secret and
    ConfigMap references, kustomization resources);
  - the shardstock TOML configs (compose, ConfigMap) parse and use only keys
    src/config knows (the service refuses unknown keys), and turn the
    durability setting on (store.min_replicas ≥ 1: every master has a replica);
  - alerts.yml: one top-level comparison per expr, severity and summary;
  - grafana/shardstock.json and its provisioning: parse, datasource uid,
    `event` variable, every panel has queries;
  - every metric name used by alerts.yml and shardstock.json exists in
    src/metrics.rs (histogram suffixes _bucket/_sum/_count stripped).
"""
import importlib.util
import json
import re
import sys
import tomllib
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent
ERRORS = []


def err(where, msg):
    line = f"{where}: {msg}"
    if line not in ERRORS:  # one line per distinct problem
        ERRORS.append(line)


def rel(p):
    return str(Path(p).resolve().relative_to(REPO)) if Path(p).resolve().is_relative_to(REPO) else str(p)


def load_yaml_docs(path):
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        err(rel(path), f"invalid YAML: {e}")
        return []


# ---------------------------------------------------------------- metrics.rs
def metric_registry():
    text = (REPO / "src" / "metrics.rs").read_text()
    consts = re.findall(r'pub const (\w+): &str = "(shardstock_[a-z_]+)";', text)
    if not consts:
        err("src/metrics.rs", "no metric constants found")
    # Kind from the doc comment just above each constant ("/// histogram {…}").
    kinds = {}
    for m in re.finditer(r'///\s*(counter|gauge|histogram)\b[^\n]*\n\s*pub const \w+: &str = "(shardstock_[a-z_]+)";', text):
        kinds[m.group(2)] = m.group(1)
    names = {n for _, n in consts}
    return names, kinds


def check_metric_names(names, kinds):
    histos = {n for n, k in kinds.items() if k == "histogram"}
    used = {}
    sources = [DEPLOY / "prometheus" / "alerts.yml", DEPLOY / "grafana" / "shardstock.json"]
    for src in sources:
        for name in set(re.findall(r"shardstock_[a-z_]+", src.read_text())):
            base = name
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and name[: -len(suffix)] in histos:
                    base = name[: -len(suffix)]
            if base not in names:
                err(rel(src), f"metric {name} is not defined in src/metrics.rs")
            used.setdefault(base, set()).add(src.name)
    unused = sorted(names - set(used))
    if unused:
        print(f"  note: metrics not used by alerts or dashboard: {', '.join(unused)}")
    return used


# ---------------------------------------------------------------- config.rs / TOML
def config_schema():
    """{section: {keys}} and the event keys, read from src/config/*.rs."""
    text = "\n".join(f.read_text() for f in sorted((REPO / "src" / "config").glob("*.rs")))
    structs = {}
    for m in re.finditer(r"pub struct (\w+) \{(.*?)\n\}", text, re.S):
        structs[m.group(1)] = set(re.findall(r"^\s*pub (\w+):", m.group(2), re.M))
    top = {}
    for m in re.finditer(r"^\s*pub (\w+): (?:Vec<)?(\w+)>?,", re.search(r"pub struct Settings \{(.*?)\n\}", text, re.S).group(1), re.M):
        top[m.group(1)] = structs.get(m.group(2), set())
    return top


def check_toml(text, where, schema, events_expected=None):
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        err(where, f"invalid TOML: {e}")
        return None
    for section, value in cfg.items():
        if section not in schema:
            err(where, f"unknown section [{section}] (src/config refuses it)")
            continue
        items = value if isinstance(value, list) else [value]
        for item in items:
            for key in item:
                if key not in schema[section]:
                    err(where, f"unknown key {section}.{key} (src/config refuses it)")
    for i, ev in enumerate(cfg.get("events", [])):
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", str(ev.get("id", ""))):
            err(where, f"events[{i}].id {ev.get('id')!r} is not [A-Za-z0-9_.-]{{1,64}}")
        if not 1 <= int(ev.get("buckets", 0)) <= 1024:
            err(where, f"events[{i}].buckets must be 1..1024")
        if "stock" not in ev:
            err(where, f"events[{i}].stock is required")
    if events_expected is not None and len(cfg.get("events", [])) != events_expected:
        err(where, f"expected {events_expected} event(s), found {len(cfg.get('events', []))}")
    listen = cfg.get("server", {}).get("listen")
    if listen and not listen.startswith("0.0.0.0:"):
        err(where, f"server.listen {listen} is not reachable from outside a container (use 0.0.0.0:PORT)")
    url = cfg.get("store", {}).get("redis_url", "")
    if url and not url.startswith("redis-cluster://"):
        err(where, "store.redis_url should be the Redis Cluster (redis-cluster://…)")
    return cfg


# ---------------------------------------------------------------- compose
def compose_env(svc):
    env = svc.get("environment", {})
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return env


def check_compose(schema):
    path = DEPLOY / "docker-compose.yml"
    docs = load_yaml_docs(path)
    if not docs:
        return
    c = docs[0]
    where = rel(path)
    services = c.get("services") or {}
    if not services:
        err(where, "no services")
        return
    for name, s in services.items():
        if not s.get("image") and not s.get("build"):
            err(where, f"service {name} has neither image nor build")
        deps = s.get("depends_on", [])
        for d in deps if isinstance(deps, list) else deps.keys():
            if d not in services:
                err(where, f"service {name} depends on unknown service {d}")
        for v in s.get("volumes", []):
            src = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
            if src.startswith("."):
                if not (DEPLOY / src).exists():
                    err(where, f"service {name} mounts {src}, which does not exist next to the compose file")
            elif src and src not in (c.get("volumes") or {}):
                err(where, f"service {name} uses volume {src}, not declared under volumes:")

    def cmd_words(s):
        cmd = s.get("command", [])
        return cmd.split() if isinstance(cmd, str) else [str(x) for x in cmd]

    # Redis Cluster: 6 nodes, cluster mode, AOF fsync every second.
    nodes = [n for n, s in services.items()
             if str(s.get("image", "")).startswith("redis") and "--cluster-enabled" in cmd_words(s)]
    if len(nodes) != 6:
        err(where, f"expected 6 Redis Cluster nodes, found {len(nodes)}: {nodes}")
    for n in nodes:
        w = cmd_words(services[n])
        if not str(services[n].get("image", "")).startswith("redis:7"):
            err(where, f"{n}: image should be redis:7")
        for flag, val in (("--cluster-enabled", "yes"), ("--appendonly", "yes"), ("--appendfsync", "everysec")):
            if flag not in w or w[w.index(flag) + 1] != val:
                err(where, f"{n}: needs {flag} {val}")
    init = services.get("redis-cluster-init")
    if not init:
        err(where, "no redis-cluster-init service")
    else:
        text = " ".join(cmd_words(init) + [str(x) for x in init.get("entrypoint", [])])
        for v in init.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith(".") and (DEPLOY / src).is_file():
                text += (DEPLOY / src).read_text()
        for needle in ("--cluster create", "--cluster-replicas", "--cluster-yes"):
            if needle not in text:
                err(where, f"redis-cluster-init does not run `{needle}`")
        env = compose_env(init)
        if str(env.get("REPLICAS", "")) != "1":
            err(where, "redis-cluster-init: REPLICAS should be 1 (3 masters + 3 replicas)")
        listed = env.get("NODES", "").split()
        if sorted(h.split(":")[0] for h in listed) != sorted(nodes):
            err(where, f"redis-cluster-init NODES {listed} are not the 6 nodes {nodes}")
        if set(init.get("depends_on", {})) != set(nodes):
            err(where, "redis-cluster-init should depend on all 6 nodes")
        if init.get("restart", "no") != "no":
            err(where, "redis-cluster-init is one-shot: restart must be \"no\"")

    pg = [n for n, s in services.items() if str(s.get("image", "")).startswith("postgres")]
    if len(pg) != 1 or not str(services[pg[0]]["image"]).startswith("postgres:15"):
        err(where, f"expected one postgres:15 service, found {pg}")
    elif compose_env(services[pg[0]]).get("POSTGRES_DB") != "shardstock":
        err(where, "postgres: POSTGRES_DB should be shardstock")

    apps = [n for n, s in services.items() if isinstance(s.get("build"), dict)
            and s["build"].get("dockerfile") == "deploy/Dockerfile"]
    if len(apps) != 2:
        err(where, f"expected 2 shardstock replicas built from deploy/Dockerfile, found {apps}")
    for n in apps:
        s = services[n]
        if s["build"].get("context") != "..":
            err(where, f"{n}: build context must be the repo root (..)")
        env = compose_env(s)
        redis = env.get("SHARDSTOCK_REDIS", "")
        if not redis.startswith("redis-cluster://"):
            err(where, f"{n}: SHARDSTOCK_REDIS should be a redis-cluster:// URL")
        for host in re.findall(r"(?:redis-cluster://|node=)([\w.-]+):\d+", redis):
            if host not in nodes:
                err(where, f"{n}: SHARDSTOCK_REDIS names {host}, not a Redis node service")
        db = env.get("SHARDSTOCK_DATABASE_URL", "")
        m = re.match(r"postgres(?:ql)?://[^@]*@([\w.-]+):\d+/(\w+)", db)
        if not m or m.group(1) not in pg or m.group(2) != "shardstock":
            err(where, f"{n}: SHARDSTOCK_DATABASE_URL should point at the postgres service, db shardstock")
        deps = s.get("depends_on", {})
        if (deps.get("redis-cluster-init") or {}).get("condition") != "service_completed_successfully":
            err(where, f"{n}: should wait for redis-cluster-init to complete successfully")
        if pg and pg[0] not in deps:
            err(where, f"{n}: should depend on {pg[0]}")
        mounted = [v for v in s.get("volumes", []) if ":/etc/shardstock/shardstock.toml" in v]
        if not mounted:
            err(where, f"{n}: the compose config is not mounted at /etc/shardstock/shardstock.toml")

    lb = [n for n, s in services.items() if re.match(r"(haproxy|nginx)", str(s.get("image", "")))]
    if len(lb) != 1:
        err(where, f"expected one haproxy/nginx load balancer, found {lb}")
    else:
        s = services[lb[0]]
        if not any(str(p).split(":")[0] == "8080" for p in s.get("ports", [])):
            err(where, f"{lb[0]}: must publish host port 8080")
        cfgs = [DEPLOY / v.split(":")[0] for v in s.get("volumes", []) if v.startswith(".")]
        text = "".join(p.read_text() for p in cfgs if p.is_file())
        for a in apps:
            if f"{a}:8080" not in text:
                err(where, f"{lb[0]}: its config does not route to {a}:8080")

    prom = [n for n, s in services.items() if "prometheus" in str(s.get("image", ""))]
    if len(prom) != 1:
        err(where, f"expected one Prometheus service, found {prom}")
    else:
        pconf = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        targets = {t for sc in pconf.get("scrape_configs", []) if sc.get("job_name") == "shardstock"
                   for st in sc.get("static_configs", []) for t in st.get("targets", [])}
        if targets != {f"{a}:8080" for a in apps}:
            err("deploy/prometheus/prometheus.yml", f"job shardstock scrapes {sorted(targets)}, expected the replicas {apps}")
        if "alerts.yml" not in pconf.get("rule_files", []):
            err("deploy/prometheus/prometheus.yml", "does not load alerts.yml")
    graf = [n for n, s in services.items() if "grafana" in str(s.get("image", ""))]
    if len(graf) != 1:
        err(where, f"expected one Grafana service, found {graf}")
    else:
        vols = services[graf[0]].get("volumes", [])
        if not any(v.startswith("./grafana/provisioning:") for v in vols):
            err(where, "grafana: provisioning not mounted")
        dash_mount = [v.split(":")[1] for v in vols if v.startswith("./grafana/shardstock.json:")]
        if not dash_mount:
            err(where, "grafana: shardstock.json not mounted")
        else:
            prov = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/shardstock.yml").read_text())
            paths = [p["options"]["path"] for p in prov.get("providers", [])]
            if str(Path(dash_mount[0]).parent) not in paths:
                err("deploy/grafana/provisioning/dashboards/shardstock.yml",
                    f"provider paths {paths} do not include {Path(dash_mount[0]).parent}, where compose mounts the dashboard")

    toml_path = DEPLOY / "config" / "shardstock.compose.toml"
    check_durable(check_toml(toml_path.read_text(), rel(toml_path), schema), rel(toml_path))


def check_durable(cfg, where):
    """Every master has a replica in the deploy artifacts, and the service waits for it."""
    if cfg is None:
        return
    if int(cfg.get("store", {}).get("min_replicas", 0)) < 1:
        err(where, "store.min_replicas should be 1 (a purchase acknowledged only once a replica has it)")


# ---------------------------------------------------------------- Dockerfile
def check_dockerfile():
    path = DEPLOY / "Dockerfile"
    t = path.read_text()
    where = rel(path)
    want = [
        (r"^FROM rust:1\.95-bookworm AS builder$", "builder stage FROM rust:1.95-bookworm AS builder"),
        (r"^FROM debian:bookworm-slim$", "runtime stage FROM debian:bookworm-slim"),
        (r"cargo build --release --locked", "cargo build --release --locked"),
        (r"^USER 10001", "USER 10001 (non-root)"),
        (r"^EXPOSE 8080$", "EXPOSE 8080"),
        (r'^ENTRYPOINT \["shardstock"\]$', 'ENTRYPOINT ["shardstock"]'),
        (r'^CMD \["serve", ?"--config", ?"/etc/shardstock/shardstock.toml", ?"--listen", ?"0.0.0.0:8080"\]$',
         "CMD serve --config /etc/shardstock/shardstock.toml --listen 0.0.0.0:8080"),
        (r"/migrations", "copies migrations/"),
        (r"config/ /etc/shardstock/", "copies config/ to /etc/shardstock"),
        (r"ca-certificates", "installs ca-certificates"),
    ]
    for rx, what in want:
        if not re.search(rx, t, re.M):
            err(where, f"missing: {what}")


# ---------------------------------------------------------------- Kubernetes
def check_k8s(schema):
    kdir = DEPLOY / "k8s"
    objs = {}
    for path in sorted(kdir.glob("*.yaml")):
        for d in load_yaml_docs(path):
            where = rel(path)
            if not isinstance(d, dict):
                err(where, "a document is not a mapping")
                continue
            for f in ("apiVersion", "kind"):
                if not d.get(f):
                    err(where, f"a document has no {f}")
            if d.get("kind") != "Kustomization" and not (d.get("metadata") or {}).get("name"):
                err(where, f"{d.get('kind')} has no metadata.name")
            objs.setdefault(d.get("kind"), []).append((path.name, d))
    expected = {"Deployment": "apps/v1", "Service": "v1", "ConfigMap": "v1",
                "PodDisruptionBudget": "policy/v1", "HorizontalPodAutoscaler": "autoscaling/v2",
                "ServiceMonitor": "monitoring.coreos.com/v1", "Kustomization": "kustomize.config.k8s.io/v1beta1"}
    for kind, api in expected.items():
        if kind not in objs:
            err("deploy/k8s", f"no {kind}")
        elif objs[kind][0][1].get("apiVersion") != api:
            err("deploy/k8s", f"{kind} should be {api}, is {objs[kind][0][1].get('apiVersion')}")
    if any(k not in objs for k in expected):
        return
    def named(kind, name):
        """The `kind` named `name` (a file may add others: nats.yaml's Service)."""
        found = [d for _, d in objs[kind] if d["metadata"]["name"] == name]
        if not found:
            err("deploy/k8s", f"no {kind} named {name}")
        return found[0] if found else objs[kind][0][1]
    dep = named("Deployment", "shardstock")
    svc = named("Service", "shardstock")
    _, cm = objs["ConfigMap"][0]
    _, pdb = objs["PodDisruptionBudget"][0]
    _, hpa = objs["HorizontalPodAutoscaler"][0]
    _, sm = objs["ServiceMonitor"][0]
    _, kus = objs["Kustomization"][0]
    w = "deploy/k8s/deployment.yaml"
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    if spec.get("replicas") != 2:
        err(w, "replicas should be 2")
    if any(labels.get(k) != v for k, v in spec["selector"]["matchLabels"].items()):
        err(w, "selector does not match the pod labels")
    if pod.get("terminationGracePeriodSeconds") != 30:
        err(w, "terminationGracePeriodSeconds should be 30")
    if not (pod.get("securityContext") or {}).get("runAsNonRoot"):
        err(w, "pod securityContext.runAsNonRoot should be true")
    c = pod["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if ports.get("http") != 8080:
        err(w, "container port http: 8080 missing")
    if (c.get("readinessProbe") or {}).get("httpGet", {}).get("path") != "/readyz":
        err(w, "readinessProbe must GET /readyz")
    if (c.get("livenessProbe") or {}).get("httpGet", {}).get("path") != "/healthz":
        err(w, "livenessProbe must GET /healthz")
    if "preStop" not in (c.get("lifecycle") or {}):
        err(w, "no preStop hook (endpoints need a moment to drain)")
    res = c.get("resources") or {}
    if not res.get("requests", {}).get("cpu") or not res.get("limits", {}).get("memory"):
        err(w, "resources need requests.cpu (the HPA scales on it) and limits.memory")
    secret_keys = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c.get("env", [])
                   if "secretKeyRef" in (e.get("valueFrom") or {})}
    for var in ("SHARDSTOCK_ADMIN_TOKEN", "SHARDSTOCK_DATABASE_URL"):
        if var not in secret_keys:
            err(w, f"{var} should come from a Secret (secretKeyRef)")
    cm_vols = {v["name"]: v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
    cfg_mount = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/etc/shardstock"]
    if not cfg_mount or cm_vols.get(cfg_mount[0]["name"]) != cm["metadata"]["name"]:
        err(w, f"/etc/shardstock is not mounted from ConfigMap {cm['metadata']['name']}")
    if "/etc/shardstock/shardstock.toml" not in c.get("args", []):
        err(w, "args should pass --config /etc/shardstock/shardstock.toml")
    if "shardstock.toml" not in cm.get("data", {}):
        err("deploy/k8s/configmap.yaml", "no data key shardstock.toml")
    else:
        check_durable(check_toml(cm["data"]["shardstock.toml"], "deploy/k8s/configmap.yaml", schema, events_expected=1),
                      "deploy/k8s/configmap.yaml")
    example = [d for f, d in objs.get("Secret", []) if f == "secret.example.yaml"]
    if example:
        have = set((example[0].get("stringData") or {}) | (example[0].get("data") or {}))
        for var, ref in secret_keys.items():
            if ref["name"] != example[0]["metadata"]["name"] or ref["key"] not in have:
                err("deploy/k8s/secret.example.yaml", f"does not provide {ref['name']}/{ref['key']} for {var}")
    if any(labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
        err("deploy/k8s/service.yaml", "selector does not match the pod labels")
    svc_ports = {p.get("name"): p for p in svc["spec"]["ports"]}
    if "http" not in svc_ports or svc_ports["http"].get("targetPort") not in ("http", 8080):
        err("deploy/k8s/service.yaml", "needs a port named http targeting the container's http port")
    if pdb["spec"].get("minAvailable") != 1:
        err("deploy/k8s/pdb.yaml", "minAvailable should be 1")
    if any(labels.get(k) != v for k, v in pdb["spec"]["selector"]["matchLabels"].items()):
        err("deploy/k8s/pdb.yaml", "selector does not match the pod labels")
    ref = hpa["spec"]["scaleTargetRef"]
    if ref.get("kind") != "Deployment" or ref.get("name") != dep["metadata"]["name"]:
        err("deploy/k8s/hpa.yaml", "scaleTargetRef is not the Deployment")
    if not any(m.get("resource", {}).get("name") == "cpu" for m in hpa["spec"].get("metrics", [])):
        err("deploy/k8s/hpa.yaml", "should scale on CPU")
    eps = sm["spec"].get("endpoints", [])
    if not eps or eps[0].get("path") != "/metrics" or eps[0].get("port") not in svc_ports:
        err("deploy/k8s/servicemonitor.yaml", "endpoint should scrape /metrics on a named Service port")
    if any(svc["metadata"]["labels"].get(k) != v for k, v in sm["spec"]["selector"]["matchLabels"].items()):
        err("deploy/k8s/servicemonitor.yaml", "selector does not match the Service's labels")
    listed = set(kus.get("resources", []))
    for f in ("deployment.yaml", "service.yaml", "configmap.yaml", "pdb.yaml", "hpa.yaml", "servicemonitor.yaml"):
        if f not in listed:
            err("deploy/k8s/kustomization.yaml", f"does not list {f}")
    nats = [d for _, d in objs.get("StatefulSet", []) if d["metadata"]["name"] == "nats"]
    if "nats.yaml" in listed:
        if not nats:
            err("deploy/k8s/nats.yaml", "no StatefulSet named nats")
        elif "--jetstream" not in nats[0]["spec"]["template"]["spec"]["containers"][0].get("args", []):
            err("deploy/k8s/nats.yaml", "the NATS server must run with --jetstream")
        toml = cm.get("data", {}).get("shardstock.toml", "")
        if 'nats_url = "nats://nats:4222"' not in toml:
            err("deploy/k8s/configmap.yaml", "[outbox] nats_url should point at nats.yaml's Service (nats://nats:4222)")
    for f in listed:
        if not (kdir / f).is_file():
            err("deploy/k8s/kustomization.yaml", f"lists {f}, which does not exist")


# ---------------------------------------------------------------- alerts
def check_alerts():
    path = DEPLOY / "prometheus" / "alerts.yml"
    where = rel(path)
    spec = importlib.util.spec_from_file_location("query_check", DEPLOY / "local" / "query_check.py")
    qc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(qc)
    doc = yaml.safe_load(path.read_text())
    alerts = [r for g in doc.get("groups", []) for r in g.get("rules", []) if "alert" in r]
    names = {r["alert"] for r in alerts}
    for r in alerts:
        expr = r["expr"]
        try:
            left = qc.left_side(expr)
        except ValueError as e:
            err(where, f"{r['alert']}: {e}")
            continue
        rest = expr[len(left):].strip()
        if not re.fullmatch(r"(==|!=|>=|<=|>|<)\s*(bool\s+)?-?[0-9.e+]+", rest):
            err(where, f"{r['alert']}: expr must end in `<comparison> <number>`, ends in {rest!r}")
        if (r.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
            err(where, f"{r['alert']}: labels.severity should be critical, warning or info")
        if not (r.get("annotations") or {}).get("summary"):
            err(where, f"{r['alert']}: no annotations.summary")
    # The brief's list: audit, flush lag (high and sustained), skew, Redis errors, DB guard.
    for needle in ("shardstock_audit_balanced", "shardstock_flush_lag_orders", "shardstock_bucket_skew_ratio",
                   "shardstock_store_errors_total", "shardstock_db_guard_violations_total"):
        if not any(needle in r["expr"] for r in alerts):
            err(where, f"no alert on {needle}")
    if sum("shardstock_flush_lag_orders" in r["expr"] for r in alerts) < 2:
        err(where, "expected a flush-lag-high and a flush-lag-sustained alert")
    return names


# ---------------------------------------------------------------- Grafana
def check_grafana():
    ds_path = DEPLOY / "grafana/provisioning/datasources/prometheus.yml"
    ds = yaml.safe_load(ds_path.read_text())
    uids = {d.get("uid") for d in ds.get("datasources", [])}
    if "prometheus" not in uids:
        err(rel(ds_path), "no datasource with uid prometheus")
    prov_path = DEPLOY / "grafana/provisioning/dashboards/shardstock.yml"
    prov = yaml.safe_load(prov_path.read_text())
    if not prov.get("providers"):
        err(rel(prov_path), "no dashboard providers")
    path = DEPLOY / "grafana" / "shardstock.json"
    where = rel(path)
    try:
        dash = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        err(where, f"invalid JSON: {e}")
        return
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        err(where, "schemaVersion should be an integer >= 36")
    if "${DS_" in path.read_text():
        err(where, "uses an import-time ${DS_…} datasource; use the provisioned uid")
    vars_ = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ev = vars_.get("event")
    if not ev:
        err(where, "no `event` template variable")
    else:
        q = ev.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if q != "label_values(shardstock_event_stock, event)":
            err(where, f"event variable query is {q!r}")
    ids = set()

    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    n = 0
    for p in walk(dash.get("panels", [])):
        if p.get("id") in ids:
            err(where, f"duplicate panel id {p.get('id')}")
        ids.add(p.get("id"))
        if "gridPos" not in p:
            err(where, f"panel {p.get('title')!r} has no gridPos")
        if p.get("type") == "row":
            continue
        n += 1
        targets = p.get("targets") or []
        if not targets:
            err(where, f"panel {p.get('title')!r} has no queries")
        for t in targets + [p]:
            dsu = (t.get("datasource") or {}).get("uid")
            if dsu not in uids:
                err(where, f"panel {p.get('title')!r} uses datasource uid {dsu!r}, not a provisioned one")
        for t in targets:
            expr = t.get("expr", "")
            if not expr.strip():
                err(where, f"panel {p.get('title')!r} has an empty query")
            for var in re.findall(r"\$\{?(\w+)", expr):
                if var not in vars_:
                    err(where, f"panel {p.get('title')!r} uses ${var}, which is not a dashboard variable")
    text = path.read_text()
    for needle, what in (("shardstock_bucket_remaining", "per-bucket remaining"),
                         ("shardstock_bucket_skew_ratio", "skew ratio"),
                         ("shardstock_purchases_total", "purchases by outcome"),
                         ("shardstock_event_remaining{", "sell-through"),
                         ("shardstock_purchase_duration_seconds_bucket", "purchase latency"),
                         ("shardstock_http_request_duration_seconds_bucket", "HTTP latency"),
                         ("shardstock_probe_depth", "probe depth"),
                         ("shardstock_rebalance_moved_units_total", "rebalancer moved units"),
                         ("shardstock_fencing_rejections_total", "fencing rejections"),
                         ("shardstock_flush_lag_orders", "flush lag"),
                         ("shardstock_orders_flushed_total", "orders flushed"),
                         ("shardstock_db_guard_violations_total", "DB-guard alarms"),
                         ("shardstock_leader_changes_total", "leader changes")):
        if needle not in text:
            err(where, f"no panel for {what} ({needle})")
    print(f"  dashboard: {n} panels")


def main():
    names, kinds = metric_registry()
    schema = config_schema()
    steps = [("Dockerfile", check_dockerfile), ("docker-compose.yml", lambda: check_compose(schema)),
             ("k8s/", lambda: check_k8s(schema)), ("alerts.yml", check_alerts), ("grafana/", check_grafana),
             ("metric names", lambda: check_metric_names(names, kinds))]
    for title, fn in steps:
        before = len(ERRORS)
        try:
            fn()
        except Exception as e:  # a missing key in a manifest is a failure, not a crash
            err(title, f"check crashed: {type(e).__name__}: {e}")
        print(f"  {'ok  ' if len(ERRORS) == before else 'FAIL'} {title}")
    if ERRORS:
        print(f"\n{len(ERRORS)} problem(s):", file=sys.stderr)
        for e in ERRORS:
            print(f"  - {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

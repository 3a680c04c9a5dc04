#!/usr/bin/env python3
"""Offline checks of deploy/kubernetes/ that a schema validator cannot make.

kubernetes-validate checks each built-in object against the Kubernetes OpenAPI
schema, but it has no schema for the PodMonitor (a Prometheus Operator CRD) and it
sees each object alone. This script:

  * checks the PodMonitor's structure (the fields this example uses, their types,
    allowed values), and
  * checks the objects against each other and against tollgate's config: the
    PodMonitor selects the pods and names a port they declare, the scrape
    annotations name the admin port the ConfigMap's tollgate.toml listens on, the
    ConfigMap is mounted as a directory (no subPath, so hot reload works) where
    TOLLGATE_CONFIG points, the app's proxy variables point at the listener, the
    grace period outlasts the drain (and the preStop sleep), the probes, resources
    and securityContext are those the README promises, and a NetworkPolicy admits
    the admin port (which listens on the pod's interface) only from chosen peers;
    and the Service sends callers to tollgate's inbound port (its targetPort is the
    port of [inbound] addr, declared by the tollgate container), never to the app's
    own port, which listens on loopback, and a NetworkPolicy admits the inbound port;
    and a capture Deployment's `tollgate iptables` init container runs first, as root
    with NET_ADMIN only, names tollgate's UID and the config's ports, and its app has
    no proxy settings.

Usage: check_manifests.py DIR [--extract-config FILE] [--injected]
  --extract-config FILE  also write the ConfigMap's tollgate.toml to FILE, so that
                         tollgate itself can load it.
  --injected             DIR holds what `tollgate inject` wrote: every workload
                         (Deployment, StatefulSet, DaemonSet, ReplicaSet, Pod) is
                         checked as above, and its app's HTTP probes must ask the
                         admin port for a probe [admin] probes declares; the objects
                         inject does not write (PodMonitor, NetworkPolicy, Service)
                         are not required.
Exits 1 listing every problem found.
"""

import re
import sys
import tomllib
from pathlib import Path

import yaml

problems = []
INJECTED = "--injected" in sys.argv
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Pod")


def problem(where, what):
    problems.append(f"{where}: {what}")


def load_all(directory):
    objects = []
    for path in sorted(Path(directory).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                objects.append((path.name, doc))
    return objects


DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
RELABEL_KEYS = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
RELABEL_ACTIONS = {
    "replace", "keep", "drop", "keepequal", "dropequal", "hashmod", "labelmap",
    "labeldrop", "labelkeep", "lowercase", "uppercase",
}
ENDPOINT_KEYS = {
    "port", "portNumber", "targetPort", "path", "scheme", "params", "interval",
    "scrapeTimeout", "honorLabels", "honorTimestamps", "relabelings",
    "metricRelabelings", "filterRunning", "enableHttp2", "followRedirects",
}
SPEC_KEYS = {
    "selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel", "podTargetLabels",
    "sampleLimit", "targetLimit", "labelLimit", "attachMetadata",
}


def check_podmonitor(name, pm):
    where = f"{name} PodMonitor"
    if pm.get("apiVersion") != "monitoring.coreos.com/v1":
        problem(where, f"apiVersion must be monitoring.coreos.com/v1, not {pm.get('apiVersion')!r}")
    if not isinstance(pm.get("metadata", {}).get("name"), str):
        problem(where, "metadata.name is required")
    spec = pm.get("spec")
    if not isinstance(spec, dict):
        problem(where, "spec is required")
        return
    for key in set(spec) - SPEC_KEYS:
        problem(where, f"spec.{key}: unknown field")
    labels = spec.get("selector", {}).get("matchLabels")
    if not isinstance(labels, dict) or not labels or not all(isinstance(v, str) for v in labels.values()):
        problem(where, "spec.selector.matchLabels must be a non-empty map of strings")
    ns = spec.get("namespaceSelector", {})
    if set(ns) - {"any", "matchNames"} or ("any" in ns and not isinstance(ns["any"], bool)):
        problem(where, "spec.namespaceSelector takes any: bool or matchNames: [..]")
    endpoints = spec.get("podMetricsEndpoints")
    if not isinstance(endpoints, list) or not endpoints:
        problem(where, "spec.podMetricsEndpoints must be a non-empty list")
        return
    for i, ep in enumerate(endpoints):
        at = f"{where} spec.podMetricsEndpoints[{i}]"
        for key in set(ep) - ENDPOINT_KEYS:
            problem(at, f"{key}: unknown field")
        if not isinstance(ep.get("port"), str):
            problem(at, "port must be the name of a container port")
        if not str(ep.get("path", "/metrics")).startswith("/"):
            problem(at, "path must start with /")
        for key in ("interval", "scrapeTimeout"):
            if key in ep and not DURATION.match(str(ep[key])):
                problem(at, f"{key}: {ep[key]!r} is not a Prometheus duration")
        for j, r in enumerate(ep.get("relabelings", []) + ep.get("metricRelabelings", [])):
            for key in set(r) - RELABEL_KEYS:
                problem(at, f"relabelings[{j}].{key}: unknown field")
            if str(r.get("action", "replace")).lower() not in RELABEL_ACTIONS:
                problem(at, f"relabelings[{j}].action: {r.get('action')!r} is not a relabel action")
            if "sourceLabels" in r and not isinstance(r["sourceLabels"], list):
                problem(at, f"relabelings[{j}].sourceLabels must be a list")
        # The alerts on missing targets in deploy/prometheus/rules.yml select job="tollgate".
        if not any(r.get("targetLabel") == "job" and r.get("replacement") == "tollgate"
                   and "sourceLabels" not in r for r in ep.get("relabelings", [])):
            problem(at, 'relabelings must set job="tollgate" (the rules select on it)')


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def seconds(duration):
    m = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def check_admin_policy(where, labels, admin_port, ports, policies):
    """A NetworkPolicy selects the pods for Ingress and admits the admin port only
    from listed peers: `tollgate check` warns that 0.0.0.0 exposes /config and
    /metrics, and names this as the fix."""
    selecting = []
    for pol_name, pol in policies.items():
        spec = pol.get("spec", {})
        sel = spec.get("podSelector", {}).get("matchLabels", {})
        types = spec.get("policyTypes", ["Ingress"])
        if sel and all(labels.get(k) == v for k, v in sel.items()) and "Ingress" in types:
            selecting.append((pol_name, spec))
    if not selecting:
        problem(where, f"no NetworkPolicy selects the pods for Ingress: the admin port {admin_port} is open to the cluster")
        return
    admitted = False
    for pol_name, spec in selecting:
        for i, rule in enumerate(spec.get("ingress", [])):
            rule_ports = rule.get("ports")
            covers = rule_ports is None or any(
                ports.get(p.get("port"), p.get("port")) == admin_port for p in rule_ports
            )
            if not covers:
                continue
            peers = rule.get("from")
            if not peers:
                problem(where, f"NetworkPolicy {pol_name} ingress[{i}] admits the admin port {admin_port} from anywhere")
            elif any(not peer for peer in peers):
                problem(where, f"NetworkPolicy {pol_name} ingress[{i}] has an empty peer (anywhere)")
            else:
                admitted = True
    if not admitted:
        problem(where, f"no NetworkPolicy admits the admin port {admin_port}: Prometheus could not scrape it")


def check_inbound(where, labels, config, ports, services, policies):
    """The Service's targetPort is the inbound port, the app's port stays off it."""
    inbound = config.get("inbound")
    if inbound is None:
        problem(where, "the ConfigMap's tollgate.toml has no [inbound] section")
        return
    in_port, app_port = port_of(inbound["addr"]), port_of(inbound["app"])
    if not inbound["addr"].startswith("0.0.0.0:"):
        problem(where, f"inbound.addr {inbound['addr']} must listen on the pod IP (0.0.0.0) for the Service")
    if not inbound["app"].startswith("127.0.0.1:"):
        problem(where, f"inbound.app {inbound['app']} should be loopback: callers reach the app only through tollgate")
    if in_port not in ports.values():
        problem(where, f"tollgate does not declare containerPort {in_port} (inbound.addr)")
    selecting = [
        (n, svc) for n, svc in services.items()
        if svc.get("spec", {}).get("selector")
        and all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    ]
    if not selecting:
        problem(where, "no Service selects the pods: callers have no way to the inbound side")
    for svc_name, svc in selecting:
        for p in svc["spec"].get("ports", []):
            target = p.get("targetPort", p.get("port"))
            target = ports.get(target, target)
            if target == app_port:
                problem(where, f"Service {svc_name} port {p.get('port')} targets the app's own port {app_port}: callers would pass tollgate by")
            elif target != in_port:
                problem(where, f"Service {svc_name} port {p.get('port')} targets {target!r}, not the inbound port {in_port}")
    admitted = any(
        rule.get("ports") is None
        or any(ports.get(p.get("port"), p.get("port")) == in_port for p in rule["ports"])
        for pol in policies.values()
        if all(labels.get(k) == v for k, v in pol.get("spec", {}).get("podSelector", {}).get("matchLabels", {}).items())
        for rule in pol.get("spec", {}).get("ingress", [])
    )
    if policies and not admitted:
        problem(where, f"no NetworkPolicy admits the inbound port {in_port}: callers would be refused")


def iptables_args(container):
    """The flags of a `tollgate iptables` container, as {flag: value}; None if it is not one."""
    argv = list(container.get("command", [])) + list(container.get("args", []))
    if container.get("image", "").split(":")[0].rsplit("/", 1)[-1] != "tollgate-iptables" \
            and argv[:2] != ["tollgate", "iptables"]:
        return None
    flags = {}
    for a in argv:
        if a.startswith("--"):
            k, _, v = a[2:].partition("=")
            flags[k] = v
    return flags


def check_capture(where, inits, tg, config):
    """The capture init container, when there is one: it runs before tollgate with
    NET_ADMIN only, as root, and its flags name tollgate's UID and the config's ports.
    Returns whether the Deployment captures."""
    found = [(i, c, iptables_args(c)) for i, c in enumerate(inits) if iptables_args(c) is not None]
    if not found:
        return False
    if len(found) > 1:
        problem(where, "more than one tollgate iptables init container")
    i, c, flags = found[0]
    name = f"init container {c['name']}"
    if tg in inits and inits.index(tg) < i:
        problem(where, f"{name} must run before tollgate (and so before the app)")
    if "restartPolicy" in c:
        problem(where, f"{name} runs once: no restartPolicy")
    sc = c.get("securityContext", {})
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"] or caps.get("add") != ["NET_ADMIN"]:
        problem(where, f"{name}: capabilities must be drop [ALL], add [NET_ADMIN] only")
    if sc.get("runAsUser") != 0 or sc.get("runAsNonRoot") is not False:
        problem(where, f"{name}: iptables needs root in the pod's namespace (runAsUser 0, runAsNonRoot false)")
    if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is not False:
        problem(where, f"{name}: not privileged, allowPrivilegeEscalation false")
    uid = tg.get("securityContext", {}).get("runAsUser")
    if flags.get("uid") != str(uid):
        problem(where, f"{name}: --uid={flags.get('uid')} is not tollgate's runAsUser {uid}: its own traffic would be captured again")
    want = {
        "outbound-port": port_of(config["listener"]["addr"]),
        "admin-port": port_of(config["admin"]["addr"]),
    }
    if "inbound" in config:
        want["inbound-port"] = port_of(config["inbound"]["addr"])
    elif int(flags.get("inbound-port") or 15006) != 0:
        problem(where, f"{name}: the pod's callers are sent to --inbound-port={flags.get('inbound-port') or 15006}, "
                       "but the ConfigMap has no [inbound] listening there: use --inbound-port=0")
    defaults = {"outbound-port": 15001, "inbound-port": 15006, "admin-port": 15090}
    for flag, port in want.items():
        given = int(flags.get(flag) or defaults[flag])
        if given != port:
            problem(where, f"{name}: --{flag}={given} is not the ConfigMap's port {port}")
    return True


def check_app_probes(where, apps, config, admin_port):
    """The app's HTTP probes moved to the admin port ask it for a declared probe."""
    declared = [f"/probe/{p['port']}{p['path']}" for p in config["admin"].get("probes", [])]
    for app in apps:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = app.get(kind, {}).get("httpGet")
            if not get or not str(get.get("path", "")).startswith("/probe/"):
                continue
            if get.get("port") != admin_port:
                problem(where, f"{app['name']} {kind}: /probe/ is served on the admin port {admin_port}, not {get.get('port')}")
            if get["path"] not in declared:
                problem(where, f"{app['name']} {kind}: {get['path']} is not declared in [admin] probes {declared}")


def check_deployment(name, dep, configmaps, podmonitors, policies, services):
    where = f"{name} {dep['kind']}/{dep['metadata']['name']}"
    pod = dep if dep["kind"] == "Pod" else dep["spec"]["template"]
    spec = pod["spec"]
    labels = pod["metadata"].get("labels", {})
    annotations = pod["metadata"].get("annotations", {})

    sel = dep["spec"].get("selector", {}).get("matchLabels", {})
    if any(labels.get(k) != v for k, v in sel.items()):
        problem(where, "the selector does not match the pod template's labels")

    inits = spec.get("initContainers", [])
    tollgates = [c for c in inits + spec["containers"] if c["name"] == "tollgate"]
    if len(tollgates) != 1:
        problem(where, "expected exactly one container named tollgate")
        return
    tg = tollgates[0]
    native = tg in inits
    if native and tg.get("restartPolicy") != "Always":
        problem(where, "a tollgate init container must have restartPolicy: Always (native sidecar)")
    apps = [c for c in spec["containers"] if c["name"] != "tollgate"]
    if not apps:
        problem(where, "no app container")
    if not native and spec["containers"][0]["name"] != "tollgate":
        problem(where, "a plain sidecar must be the first container, so that it starts first")

    # Config: a directory mount of the ConfigMap where TOLLGATE_CONFIG points.
    cfg_path = env_of(tg).get("TOLLGATE_CONFIG")
    if not cfg_path:
        problem(where, "tollgate has no TOLLGATE_CONFIG")
        return
    cfg_dir, cfg_key = cfg_path.rsplit("/", 1)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    config = None
    for m in tg.get("volumeMounts", []):
        if "subPath" in m or "subPathExpr" in m:
            problem(where, f"volumeMount {m['name']} uses subPath: it would never see ConfigMap updates")
        if m["mountPath"].rstrip("/") == cfg_dir:
            cm_name = volumes.get(m["name"], {}).get("configMap", {}).get("name")
            if cm_name not in configmaps:
                problem(where, f"{cfg_dir} is not a mount of a ConfigMap in this directory")
            elif cfg_key not in configmaps[cm_name].get("data", {}):
                problem(where, f"ConfigMap {cm_name} has no key {cfg_key}")
            else:
                config = tomllib.loads(configmaps[cm_name]["data"][cfg_key])
            if not m.get("readOnly"):
                problem(where, "mount the config readOnly")
    if config is None:
        problem(where, f"nothing mounted at {cfg_dir} with {cfg_key}")
        return

    # Admin port: annotations, declared port, probes and PodMonitor agree with the config.
    admin = config["admin"]["addr"]
    admin_port = port_of(admin)
    if not admin.startswith("0.0.0.0:"):
        problem(where, f"admin.addr {admin} must listen on the pod IP (0.0.0.0) to be scraped and probed")
    if annotations.get("prometheus.io/scrape") != "true":
        problem(where, 'pod annotation prometheus.io/scrape must be "true"')
    if annotations.get("prometheus.io/port") != str(admin_port):
        problem(where, f"prometheus.io/port must be {admin_port}, the admin port")
    if annotations.get("prometheus.io/path") != "/metrics":
        problem(where, "prometheus.io/path must be /metrics")
    if labels.get("tollgate/sidecar") != "true":
        problem(where, 'pod label tollgate/sidecar must be "true": the tollgate-pods job keeps only those pods')
    ports = {p.get("name"): p["containerPort"] for p in tg.get("ports", [])}
    admin_names = [n for n, p in ports.items() if p == admin_port]
    if not admin_names:
        problem(where, f"tollgate does not declare containerPort {admin_port}")
    if not INJECTED:
        check_admin_policy(where, labels, admin_port, ports, policies)
        check_inbound(where, labels, config, ports, services, policies)
    check_app_probes(where, apps, config, admin_port)
    for pm_name, pm in podmonitors.items():
        pm_sel = pm["spec"]["selector"]["matchLabels"]
        if any(labels.get(k) != v for k, v in pm_sel.items()):
            problem(where, f"pod labels are not selected by PodMonitor {pm_name}")
        for ep in pm["spec"]["podMetricsEndpoints"]:
            if ports.get(ep.get("port")) != admin_port:
                problem(where, f"PodMonitor {pm_name} port {ep.get('port')!r} is not tollgate's admin port")

    probes = {
        "startupProbe": "/readyz",
        "readinessProbe": "/readyz",
        "livenessProbe": "/healthz",
    }
    for probe, path in probes.items():
        get = tg.get(probe, {}).get("httpGet", {})
        port = get.get("port")
        port = ports.get(port, port)
        if get.get("path") != path or port != admin_port:
            problem(where, f"{probe} must GET {path} on the admin port {admin_port}")

    # Listener: the app's proxy settings point at it.
    listener = config["listener"]["addr"]
    if not listener.startswith("127.0.0.1:"):
        problem(where, f"listener.addr {listener} should be loopback: only the pod's app calls it")
    capture = check_capture(where, inits, tg, config)
    tg_uid = tg.get("securityContext", {}).get("runAsUser")
    pod_uid = spec.get("securityContext", {}).get("runAsUser")
    for app in apps:
        env = env_of(app)
        uid = app.get("securityContext", {}).get("runAsUser", pod_uid)
        if capture and uid == tg_uid:
            problem(where, f"app container {app['name']} runs as tollgate's UID {uid}: capture spares it, so its calls are not captured")
        if capture:
            for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
                if var in env:
                    problem(where, f"app container {app['name']}: {var}: with capture the app needs no proxy settings")
            continue
        for var in ("HTTP_PROXY", "http_proxy"):
            if env.get(var) != f"http://{listener}":
                problem(where, f"app container {app['name']}: {var} must be http://{listener}")
        for var in ("NO_PROXY", "no_proxy"):
            if "127.0.0.1" not in (env.get(var) or ""):
                problem(where, f"app container {app['name']}: {var} must exempt 127.0.0.1")
        for var in ("HTTPS_PROXY", "https_proxy"):
            if var in env:
                problem(where, f"app container {app['name']}: {var}: tollgate refuses CONNECT to its upstreams (call them over http://)")

    # Shutdown: the grace period outlasts the app's stop and tollgate's drain.
    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain = seconds(config["listener"].get("drain_timeout", "20s"))
    pre_stop = 0
    cmd = tg.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if cmd[:1] == ["sleep"]:
        pre_stop = int(cmd[1])
    if not native and pre_stop <= 0:
        problem(where, "a plain sidecar needs a preStop sleep so it outlives the app's shutdown")
    if grace <= drain + pre_stop:
        problem(where, f"terminationGracePeriodSeconds {grace} must exceed preStop {pre_stop}s + drain_timeout {drain}s")

    # Resources and security.
    res = tg.get("resources", {})
    if res.get("requests", {}).get("cpu") != "100m" or res.get("requests", {}).get("memory") != "32Mi":
        problem(where, "tollgate requests must be cpu 100m, memory 32Mi")
    if res.get("limits", {}).get("memory") != "128Mi":
        problem(where, "tollgate memory limit must be 128Mi")
    sc = tg.get("securityContext", {})
    want = {
        "runAsNonRoot": True,
        # The sidecar's own UID, which capture spares: never an image default (65532 is
        # distroless's nonroot, which an app may run as).
        "runAsUser": 15000,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
    }
    for key, value in want.items():
        if sc.get(key) != value:
            problem(where, f"tollgate securityContext.{key} must be {value}")
    if sc.get("capabilities", {}).get("drop") != ["ALL"]:
        problem(where, "tollgate securityContext.capabilities.drop must be [ALL]")
    seccomp = sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile") or {}
    if seccomp.get("type") != "RuntimeDefault":
        problem(where, "seccompProfile must be RuntimeDefault")
    return config


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    directory = args[0]
    extract = args[args.index("--extract-config") + 1] if "--extract-config" in args else None

    objects = load_all(directory)
    configmaps = {o["metadata"]["name"]: o for _, o in objects if o.get("kind") == "ConfigMap"}
    podmonitors = {}
    for name, o in objects:
        if o.get("kind") == "PodMonitor":
            check_podmonitor(name, o)
            podmonitors[o["metadata"]["name"]] = o
    if not podmonitors and not INJECTED:
        problem(directory, "no PodMonitor")
    kinds = WORKLOADS if INJECTED else ("Deployment",)
    # webhook.yaml's Deployment runs `tollgate inject --serve`, not a pod with a sidecar.
    deployments = [(n, o) for n, o in objects if o.get("kind") in kinds and n != "webhook.yaml"]
    if not deployments:
        problem(directory, f"no {' or '.join(kinds)}")
    policies = {o["metadata"]["name"]: o for _, o in objects if o.get("kind") == "NetworkPolicy"}
    services = {o["metadata"]["name"]: o for _, o in objects if o.get("kind") == "Service"}
    for name, dep in deployments:
        check_deployment(name, dep, configmaps, podmonitors, policies, services)

    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    if extract:
        cm = next(iter(configmaps.values()))
        Path(extract).write_text(cm["data"]["tollgate.toml"])
    kinds = ", ".join(f"{o['kind']}/{o['metadata']['name']} ({n})" for n, o in objects)
    print(f"consistent: {kinds}")


if __name__ == "__main__":
    main()

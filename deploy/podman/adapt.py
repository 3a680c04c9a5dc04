#!/usr/bin/env python3
"""Turn Kubernetes manifests into what podman 4.3's `kube play` runs as Kubernetes would.

  adapt.py OUT FILE... [--host NAME=IP]... [--idle-app] [--pod NAME] [--pods-json FILE]

Keeps the ConfigMaps; plays each Deployment's pod template as a Pod, because podman
has no controller and is not Kubernetes in the ways this works around (and
deploy/README.md's table lists):

  * a native sidecar (an init container with restartPolicy: Always) is run once and
    waited for, so tollgate would hold the pod at its init stage forever: it becomes
    the first container, a plain sidecar;
  * a Deployment's restartPolicy (Always) also restarts podman's init containers after
    they exit, which breaks the pod's start: the Pod gets restartPolicy: OnFailure
    (Kubernetes runs init containers once either way);
  * there is no cluster DNS: --host NAME=IP adds hostAliases for NAME and, for a name
    without dots, its NAME.default[.svc[.cluster.local]] forms, standing in for a
    Service; a name with dots (`ledger.finance.svc`, kept by inject as the app wrote
    it) is aliased as written;
  * podman publishes every declared container port on the host (as if hostPort were
    its containerPort), so two pods declaring 15006 collide: each declared port is
    published on a free loopback port instead (hostIP 127.0.0.1);
  * podman 4.3 refuses an env var from the downward API's `status.podIP` (inject sets
    POD_IP so a probe can fall back to the pod's address): it is left out, and tollgate
    probes 127.0.0.1 only;
  * podman 4.3 fills a downward API env var only from the pod's name, uid, labels and
    annotations, and refuses the pod for any other field ("fieldPath
    metadata.namespace is either not valid or not supported"): POD_NAMESPACE, which
    inject sets from `metadata.namespace`, is set literally to "default", the
    namespace the hostAliases above stand for, so a dotless authority still matches
    its NAME.default forms;
  * podman refuses an annotation value longer than 63 characters (the limit of a
    label's value, not an annotation's): such an annotation (`tollgate/injected`, the
    record --uninject reads) is left out.

--pod NAME plays only the Deployment NAME of FILEs holding several (each pod is played
at an address of its own). --idle-app replaces the command of every container but tollgate with an idle loop,
for a stand-in app (a curl loop) whose calls the test makes itself. Services,
NetworkPolicies and PodMonitors are left out (podman has no use for them).
--pods-json writes, for deploy/prom_config.py, each Pod's name, labels, annotations
and declared container ports, as pod discovery would see them.
"""

import argparse
import json
import socket
import sys

import yaml

# The namespace the pods stand in for: hostAliases' NAME.default forms, POD_NAMESPACE.
NAMESPACE = "default"
IDLE = "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def field_path(env):
    return env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")


def literal_namespace(env):
    if field_path(env) == "metadata.namespace":
        return {"name": env["name"], "value": NAMESPACE}
    return env


def host_names(name):
    if "." in name:
        return [name]
    return [name] + [f"{name}.{NAMESPACE}{tail}" for tail in ("", ".svc", ".svc.cluster.local")]


def as_pod(dep, hosts, idle):
    template = dep["spec"]["template"]
    spec = dict(template["spec"])
    meta = {"name": dep["metadata"]["name"]}
    for key in ("labels", "annotations"):
        if template.get("metadata", {}).get(key):
            meta[key] = template["metadata"][key]
    if "annotations" in meta:
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if len(str(v)) <= 63}
    inits = []
    sidecars = []
    for c in spec.get("initContainers", []):
        if c.get("restartPolicy") == "Always":
            c = dict(c)
            del c["restartPolicy"]
            sidecars.append(c)
        else:
            inits.append(c)
    if inits:
        spec["initContainers"] = inits
    else:
        spec.pop("initContainers", None)
    containers = sidecars + list(spec["containers"])
    if idle:
        for c in containers:
            if c["name"] != "tollgate":
                c["command"] = ["/bin/sh", "-c", IDLE]
                c.pop("args", None)
    for c in containers + inits:
        if "env" in c:
            c["env"] = [literal_namespace(e) for e in c["env"] if field_path(e) != "status.podIP"]
    for c in containers:
        for port in c.get("ports", []):
            port["hostIP"] = "127.0.0.1"
            port["hostPort"] = free_port()
    spec["containers"] = containers
    spec["restartPolicy"] = "OnFailure"
    if hosts:
        spec["hostAliases"] = [{"ip": ip, "hostnames": host_names(name)} for name, ip in hosts]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--host", action="append", default=[])
    ap.add_argument("--idle-app", action="store_true")
    ap.add_argument("--pod")
    ap.add_argument("--pods-json")
    a = ap.parse_args()
    hosts = [h.split("=", 1) for h in a.host]
    out = []
    for path in a.files:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if not doc:
                    continue
                if doc["kind"] == "ConfigMap":
                    out.append(doc)
                elif doc["kind"] == "Deployment" and a.pod in (None, doc["metadata"]["name"]):
                    out.append(as_pod(doc, hosts, a.idle_app))
    pods = [d for d in out if d["kind"] == "Pod"]
    if not pods:
        sys.exit(f"adapt.py: no Deployment in {a.files}")
    with open(a.out, "w") as f:
        yaml.safe_dump_all(out, f, sort_keys=False)
    if a.pods_json:
        with open(a.pods_json, "w") as f:
            json.dump([{
                "name": p["metadata"]["name"],
                "labels": p["metadata"].get("labels", {}),
                "annotations": p["metadata"].get("annotations", {}),
                "ports": [port["containerPort"] for c in p["spec"]["containers"]
                          for port in c.get("ports", [])],
            } for p in pods], f)


if __name__ == "__main__":
    main()

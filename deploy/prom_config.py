#!/usr/bin/env python3
"""Derive test configs from deploy/prometheus/prometheus.yml.

Pod discovery needs a Kubernetes API server, and Debian's Prometheus build has no
kubernetes_sd at all. So that the relabelling of the `tollgate-pods` job is still
checked and exercised, its kubernetes_sd_configs is replaced by static_configs that
carry the same __meta_kubernetes_* labels pod discovery would produce: relabelling
runs on them exactly as on discovered targets.

  prom_config.py offline IN OUT
      IN with every kubernetes_sd_configs swapped for simulated pods, for
      `promtool check config` builds without kubernetes_sd.

  prom_config.py e2e IN OUT --rules FILE --admin HOST:PORT --app-port PORT
      A config for a local Prometheus: 1 s scrape and evaluation, rule_files FILE,
      and the tollgate-pods job (its relabel_configs unchanged) fed with four
      simulated pods: one annotated for scraping and labelled tollgate/sidecar=true
      whose annotation names tollgate's admin port (declared twice, as pod discovery
      lists every container port), one without the annotation, one without the
      tollgate label and one that has Succeeded; only the first must be scraped.

  prom_config.py pods IN OUT --rules FILE --pods JSON --pod-ip NAME=IP...
      As e2e, with the tollgate-pods job fed with real pods (deploy/podman/play.sh):
      each pod of JSON (deploy/podman/adapt.py --pods-json: name, labels, annotations,
      declared container ports) at its IP, with the __meta_kubernetes_* labels pod
      discovery would give it, one target per declared port, namespace "default".
"""

import argparse
import copy
import os

import yaml

NAMESPACE = "e2e"
APP = "e2e-app"


def pod(name, ports, *, scrape, admin_port, phase="Running", sidecar=True):
    labels = {
        "__meta_kubernetes_namespace": NAMESPACE,
        "__meta_kubernetes_pod_name": name,
        "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_ip": "127.0.0.1",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": APP,
        "__meta_kubernetes_pod_annotation_prometheus_io_port": str(admin_port),
        "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
    }
    if scrape:
        labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] = "true"
    if sidecar:
        labels["__meta_kubernetes_pod_label_tollgate_sidecar"] = "true"
    # Pod discovery: one target per declared container port, address podIP:port.
    return [{"targets": [f"127.0.0.1:{p}"], "labels": dict(labels)} for p in ports]


def label_name(key):
    """A label or annotation key as pod discovery names it."""
    return "".join(ch if ch.isalnum() else "_" for ch in key)


def real_pod(p, ip):
    labels = {
        "__meta_kubernetes_namespace": "default",
        "__meta_kubernetes_pod_name": p["name"],
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ip": ip,
    }
    for k, v in p["labels"].items():
        labels[f"__meta_kubernetes_pod_label_{label_name(k)}"] = str(v)
    for k, v in p["annotations"].items():
        labels[f"__meta_kubernetes_pod_annotation_{label_name(k)}"] = str(v)
    return [{"targets": [f"{ip}:{port}"], "labels": dict(labels)} for port in p["ports"]]


def swap_discovery(job, groups):
    job = copy.deepcopy(job)
    if "kubernetes_sd_configs" in job:
        del job["kubernetes_sd_configs"]
        job["static_configs"] = groups
    return job


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["offline", "e2e", "pods"])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--rules")
    ap.add_argument("--admin")
    ap.add_argument("--app-port", type=int)
    ap.add_argument("--pods")
    ap.add_argument("--pod-ip", action="append", default=[])
    a = ap.parse_args()

    with open(a.input) as f:
        cfg = yaml.safe_load(f)

    if a.mode == "offline":
        groups = pod("example", [8080, 15090], scrape=True, admin_port=15090)
        cfg["scrape_configs"] = [swap_discovery(j, groups) for j in cfg["scrape_configs"]]
        # rule_files are relative to the config's directory: keep them resolvable.
        base = os.path.dirname(os.path.abspath(a.input))
        cfg["rule_files"] = [os.path.join(base, r) for r in cfg.get("rule_files", [])]
    elif a.mode == "pods":
        import json
        with open(a.pods) as f:
            pods = json.load(f)
        ips = dict(x.split("=", 1) for x in a.pod_ip)
        pods_job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "tollgate-pods")
        groups = [g for p in pods for g in real_pod(p, ips[p["name"]])]
        job = swap_discovery(pods_job, groups)
        job["scrape_interval"] = "1s"
        job["scrape_timeout"] = "1s"
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [a.rules],
            "scrape_configs": [job],
        }
    else:
        admin_port = int(a.admin.rsplit(":", 1)[1])
        pods_job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "tollgate-pods")
        groups = (
            pod("e2e-scraped", [a.app_port, admin_port], scrape=True, admin_port=admin_port)
            + pod("e2e-not-annotated", [a.app_port], scrape=False, admin_port=admin_port)
            + pod("e2e-no-tollgate", [a.app_port], scrape=True, admin_port=admin_port, sidecar=False)
            + pod("e2e-succeeded", [a.app_port], scrape=True, admin_port=admin_port, phase="Succeeded")
        )
        job = swap_discovery(pods_job, groups)
        job["scrape_interval"] = "1s"
        job["scrape_timeout"] = "1s"
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [a.rules],
            "scrape_configs": [job],
        }

    with open(a.output, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks of deploy/prometheus/rules.yml that promtool does not make.

  * every alert has summary, description and runbook_url annotations, and no
    `runbook` annotation (the conventional name is runbook_url: Alertmanager
    templates and Grafana link it);
  * every runbook_url is FILE#ANCHOR with FILE a file of this repository (relative
    to its root) and ANCHOR the anchor of one of its headings, as a Markdown
    renderer makes it (lower case, punctuation dropped, spaces to hyphens);
  * every file the rules file mentions exists in the repository: paths
    (docs/..., deploy/...) from its root, bare file names (prometheus.yml) beside
    the rules file or at the root.

Usage: check_rules.py RULES_FILE REPOSITORY_ROOT
Exits 1 listing every problem found.
"""

import re
import sys
from pathlib import Path

import yaml

REQUIRED = ("summary", "description", "runbook_url")
PATH = re.compile(r"\b(?:docs|deploy|config|scripts|crates|src|tests)/[\w./-]*\w")
NAME = re.compile(r"(?<![\w./-])[\w-]+\.(?:md|ya?ml|toml|sh|py|rs)\b")


def anchors(markdown):
    """The anchors of a Markdown file's headings (outside code blocks)."""
    out, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"[`*_\[\]]|\(.*?\)", "", m.group(1)).strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rules_path, root = Path(sys.argv[1]), Path(sys.argv[2])
    text = rules_path.read_text()
    problems = []
    alerts = 0
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            alerts += 1
            name = rule["alert"]
            ann = rule.get("annotations", {})
            for key in REQUIRED:
                if not ann.get(key):
                    problems.append(f"{name}: no {key} annotation")
            if "runbook" in ann:
                problems.append(f"{name}: `runbook` annotation: call it runbook_url, and link the docs")
            url = ann.get("runbook_url", "")
            file, _, anchor = url.partition("#")
            target = root / file
            if not file or not anchor:
                problems.append(f"{name}: runbook_url {url!r} is not FILE#ANCHOR")
            elif not target.is_file():
                problems.append(f"{name}: runbook_url {url!r}: no file {file} in the repository")
            elif anchor not in anchors(target.read_text()):
                problems.append(f"{name}: runbook_url {url!r}: {file} has no heading with anchor #{anchor}")
    if alerts == 0:
        problems.append(f"{rules_path}: no alerts")
    for path in sorted(set(PATH.findall(text))):
        if not (root / path).exists():
            problems.append(f"{rules_path}: mentions {path}, which is not in the repository")
    for name in sorted(set(NAME.findall(text))):
        if not ((rules_path.parent / name).exists() or (root / name).exists()):
            problems.append(f"{rules_path}: mentions {name}, which is neither beside it nor at the repository's root")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    print(f"{alerts} alerts, each with summary, description and a runbook_url that resolves")


if __name__ == "__main__":
    main()

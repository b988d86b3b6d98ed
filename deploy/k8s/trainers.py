"""Write the per-policy files of the Kubernetes base from its run config.

Kustomize cannot repeat a resource per list item, so this writes, from
deploy/k8s/base/run.yaml's `trainer.policies`:

- base/trainers.yaml: trainer.template.yaml once per policy (a headless Service, the
  StatefulSet with its run volume, a PodDisruptionBudget), trainer-nodes.template.yaml for a
  policy across nodes (`nnodes` > 1: one pod per node, a run volume they share, the
  rendezvous at pod 0's name);
- base/policy-tokens.env: each policy's token under auth.env's secret (the trainers' Secret).

A run with other policies deploys by replacing run.yaml and running this again:

    python deploy/k8s/trainers.py            # rewrite both files
    python deploy/k8s/trainers.py --check    # exit 1 when either is out of date (CI)
"""

from __future__ import annotations

import argparse
import re
import string
import sys
from pathlib import Path

from mutualrl.common.auth import derive_token
from mutualrl.trainer.config.run import load_trainer_config

BASE = Path(__file__).resolve().parent / "base"
# Kubernetes object names are DNS-1123 labels: "trainer-<policy>" must be one.
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_MAX = 63 - len("trainer-")
GENERATED = "# Written by deploy/k8s/trainers.py from {source}; do not edit.\n"


def policies(run_yaml: Path) -> dict[str, int]:
    """The run's policy names, each usable in a Kubernetes object name, with their nodes."""
    nodes = {p.name: p.nnodes for p in load_trainer_config(run_yaml).policies}
    for i, name in enumerate(nodes):
        if not LABEL.fullmatch(name) or len(name) > LABEL_MAX:
            raise SystemExit(
                f"{run_yaml}: trainer.policies[{i}].name {name!r}: a Kubernetes deployment needs "
                f"lower-case letters, digits and '-' (at most {LABEL_MAX}, starting and ending "
                "alphanumeric)")
    return nodes


def _objects(template: str, name: str) -> string.Template:
    body = template.split("\napiVersion:", 1)  # the template's own header comment is dropped
    if len(body) != 2:
        raise SystemExit(f"{name}: no object after its header comment")
    return string.Template("apiVersion:" + body[1])


def trainers_yaml(nodes: dict[str, int], template: str, nodes_template: str) -> str:
    one, several = (_objects(template, "trainer.template.yaml"),
                    _objects(nodes_template, "trainer-nodes.template.yaml"))
    return GENERATED.format(source="run.yaml and trainer*.template.yaml") + "---\n".join(
        f"# ---- policy {name}" + (f" on {n} nodes" if n > 1 else "") + "\n"
        + (several if n > 1 else one).substitute(policy=name, nnodes=n)
        for name, n in nodes.items())


def tokens_env(names: list[str], auth_env: Path) -> str:
    secret = None
    for line in auth_env.read_text("utf-8").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "MUTUALRL_AUTH_TOKEN":
            secret = value.strip()
    if not secret:
        raise SystemExit(f"{auth_env}: no MUTUALRL_AUTH_TOKEN=<secret> line")
    lines = [f"{name}={derive_token(secret, 'policy:' + name)}" for name in names]
    return (GENERATED.format(source="run.yaml and auth.env")
            + "# DEV ONLY, like auth.env: each trainer's token, derived from its secret.\n"
            + "\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base", type=Path, default=BASE, help="The kustomization to write.")
    parser.add_argument("--check", action="store_true",
                        help="Write nothing; exit 1 when a file differs from what it would be.")
    args = parser.parse_args(argv)
    base: Path = args.base
    nodes = policies(base / "run.yaml")
    names = list(nodes)
    wanted = {
        base / "trainers.yaml": trainers_yaml(
            nodes, (base / "trainer.template.yaml").read_text("utf-8"),
            (base / "trainer-nodes.template.yaml").read_text("utf-8")),
        base / "policy-tokens.env": tokens_env(names, base / "auth.env"),
    }
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text("utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path}: out of date with run.yaml; run: python deploy/k8s/trainers.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path], encoding="utf-8")
        print(f"wrote {path} ({len(names)} policies: {', '.join(names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

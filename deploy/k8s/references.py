"""Cross-references of a rendered kustomization, which neither the schemas nor checkov follow.

    kubectl kustomize deploy/k8s/overlays/dev | python deploy/k8s/references.py dev -

Checks that a selector (workload, Service, PodDisruptionBudget) matches a pod template, that a
Secret, ConfigMap or PersistentVolumeClaim a pod uses is created by the same kustomization,
that a MUTUALRL_*_ADDR names a Service of it, that a trainer runs one rank per GPU, and that
a policy across nodes (a trainer with MUTUALRL_RDZV_ENDPOINT) is one set: its pods start
together, each knows its index, the endpoint is pod 0's name through a headless Service, and
a PodDisruptionBudget keeps every pod. Each problem is one `ERROR <where>: <what>` line; the
exit status is 1 when there is any.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")
POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"
ADDR = re.compile(r"MUTUALRL_[A-Z]+_ADDR")


def dig(obj: Any, *path: str) -> Any:
    """obj[path[0]][path[1]]..., None as soon as a step is missing."""
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def templates(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, workload, pod template) of every workload."""
    for obj in docs:
        if obj.get("kind") in WORKLOADS and isinstance(dig(obj, "spec", "template"), dict):
            where = f"{obj['kind'].lower()}/{dig(obj, 'metadata', 'name')}"
            yield where, obj, obj["spec"]["template"]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check(docs: list[dict[str, Any]]) -> list[str]:
    made = {(d.get("kind"), dig(d, "metadata", "name")) for d in docs}
    services = {name for kind, name in made if kind == "Service"}
    pod_labels = [dig(t, "metadata", "labels") or {} for _, _, t in templates(docs)]
    errors: list[str] = []
    for where, obj, template in templates(docs):
        selector = dig(obj, "spec", "selector", "matchLabels")
        labels = dig(template, "metadata", "labels") or {}
        if obj["kind"] != "Job" and not matches(selector, labels):
            errors.append(f"{where}: spec.selector.matchLabels does not match its pod labels")
        if obj["kind"] == "StatefulSet" and dig(obj, "spec", "serviceName") not in services:
            errors.append(f"{where}: spec.serviceName names no Service here")
        spec = template.get("spec") or {}
        for volume in spec.get("volumes") or []:
            for kind, name in (
                ("PersistentVolumeClaim", dig(volume, "persistentVolumeClaim", "claimName")),
                ("ConfigMap", dig(volume, "configMap", "name")),
                ("Secret", dig(volume, "secret", "secretName")),
            ):
                if name and (kind, name) not in made:
                    errors.append(f"{where}: volume {volume.get('name')} uses {kind} {name}, "
                                  "which this kustomization does not create")
        for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            at = f"{where} container {container.get('name')}"
            env = {str(e.get("name")): e for e in container.get("env") or []}
            for name, entry in env.items():
                for kind, ref in (("Secret", dig(entry, "valueFrom", "secretKeyRef")),
                                  ("ConfigMap", dig(entry, "valueFrom", "configMapKeyRef"))):
                    if ref and not ref.get("optional") and (kind, ref.get("name")) not in made:
                        errors.append(f"{at}: env {name} uses {kind} {ref.get('name')}, which "
                                      "this kustomization does not create")
                host = str(entry.get("value", "")).rsplit(":", 1)[0]
                if ADDR.fullmatch(name) and host and "." not in host and host not in services:
                    errors.append(f"{at}: env {name}={entry['value']} names no Service here")
            nproc, gpus = dig(env, "MUTUALRL_NPROC", "value"), dig(container, "resources", "limits",
                                                                    "nvidia.com/gpu")
            if nproc is not None and gpus is not None and str(nproc) != str(gpus):
                errors.append(f"{at}: MUTUALRL_NPROC={nproc} ranks on nvidia.com/gpu={gpus} GPUs "
                              "(NCCL runs one rank per GPU)")
            if "MUTUALRL_RDZV_ENDPOINT" in env:
                errors += [f"{at}: {e}" for e in node_set(docs, obj, env)]
    for obj in docs:
        where = f"{str(obj.get('kind')).lower()}/{dig(obj, 'metadata', 'name')}"
        selector = (dig(obj, "spec", "selector") if obj.get("kind") == "Service" else
                    dig(obj, "spec", "selector", "matchLabels")
                    if obj.get("kind") == "PodDisruptionBudget" else None)
        if selector and not any(matches(selector, labels) for labels in pod_labels):
            errors.append(f"{where}: selector {selector} matches no pod template")
    return errors


def node_set(docs: list[dict[str, Any]], workload: dict[str, Any],
             env: dict[str, Any]) -> list[str]:
    """What is wrong with a policy across nodes: `workload` (a StatefulSet of one pod per node)
    and the objects of `docs` it needs."""
    if workload["kind"] != "StatefulSet":
        return [f"a policy across nodes runs as a StatefulSet, not a {workload['kind']}"]
    name, spec = dig(workload, "metadata", "name"), workload["spec"]
    service = dig(spec, "serviceName")
    errors = []
    endpoint = str(dig(env, "MUTUALRL_RDZV_ENDPOINT", "value"))
    if endpoint.rsplit(":", 1)[0] != f"{name}-0.{service}":
        errors.append(f"MUTUALRL_RDZV_ENDPOINT={endpoint} is not pod 0's name "
                      f"({name}-0.{service}:<port>)")
    if dig(env, "MUTUALRL_NODE_RANK", "valueFrom", "fieldRef", "fieldPath") != POD_INDEX:
        errors.append(f"MUTUALRL_NODE_RANK is not the pod's index ({POD_INDEX})")
    if spec.get("podManagementPolicy") != "Parallel":
        errors.append("podManagementPolicy is not Parallel (the rendezvous waits for every pod)")
    headless = [d for d in docs if d.get("kind") == "Service" and
                dig(d, "metadata", "name") == service]
    if not headless or dig(headless[0], "spec", "clusterIP") != "None" or \
            not dig(headless[0], "spec", "publishNotReadyAddresses"):
        errors.append(f"Service {service} is not headless with publishNotReadyAddresses "
                      "(pod 0's name must resolve before the pods run)")
    labels = dig(spec, "template", "metadata", "labels") or {}
    budgets = [d for d in docs if d.get("kind") == "PodDisruptionBudget"
               and matches(dig(d, "spec", "selector", "matchLabels") or {}, labels)]
    if not any(dig(b, "spec", "minAvailable") == spec.get("replicas") for b in budgets):
        errors.append(f"no PodDisruptionBudget keeps all {spec.get('replicas')} pods "
                      "(minAvailable: replicas)")
    return errors


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    name, source = argv
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    errors = check([d for d in yaml.safe_load_all(text) if isinstance(d, dict)])
    for error in errors:
        print(f"ERROR {name}: {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

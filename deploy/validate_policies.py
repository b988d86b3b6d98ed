"""Checks the deployment files for what a schema cannot see (called by scripts/validate_deploy.sh).

A JSON schema validates each object alone; these checks follow references between objects
(a compose `depends_on` naming a service that does not exist, a Kubernetes Service whose
selector matches no pod) and hold the project's deployment rules (requests and limits on every
container, non-root pods, gRPC probes on the services). Each problem is printed as one
`ERROR <where>: <what>` line; the exit status is 1 when there is any.

    python deploy/validate_policies.py compose docker-compose.yml
    kubectl kustomize deploy/k8s/overlays/dev | python deploy/validate_policies.py k8s dev -
    python deploy/validate_policies.py deps pyproject.toml deploy/docker/requirements-service.txt
    python deploy/validate_policies.py same configs/demo.yaml deploy/k8s/base/run.yaml
    python deploy/validate_policies.py imports deploy/docker/requirements-service.txt
    python deploy/validate_policies.py cli docker-compose.yml rendered-overlay.yaml ...
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

# Workload kinds whose pod template the checks walk, and where that template sits.
POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
# gRPC ports of the MutualRL services; a container exposing one must probe it.
GRPC_PORTS = {50051, 50052, 50053}
# Packages the service image must not carry (they are trainer-only and heavy).
TRAINER_ONLY = {"torch", "matplotlib", "tensorboard"}
# Packages of the service image whose every module must import without TRAINER_ONLY.
SERVICE_PACKAGES = (
    "mutualrl.v1",
    "mutualrl.common",
    "mutualrl.see",
    "mutualrl.thl",
    "mutualrl.mwra",
)


def dig(obj: Any, *path: str) -> Any:
    """obj[path[0]][path[1]]..., None as soon as a step is missing."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


# ---- docker compose -----------------------------------------------------------------------------


def check_compose(path: Path) -> list[str]:
    """Cross-references and rules of a compose file (its schema is checked separately)."""
    where = str(path)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        return [f"{where}: no top-level 'services' mapping"]
    services: dict[str, Any] = doc["services"]
    declared_volumes = set((doc.get("volumes") or {}).keys())
    errors: list[str] = []
    for name, svc in services.items():
        at = f"{where}: services.{name}"
        if not isinstance(svc, dict):
            errors.append(f"{at}: not a mapping")
            continue
        depends = svc.get("depends_on") or {}
        items = depends.items() if isinstance(depends, dict) else ((d, {}) for d in depends)
        for dep, spec in items:
            if dep not in services:
                errors.append(f"{at}.depends_on: '{dep}' is not a service of this file")
                continue
            condition = (spec or {}).get("condition")
            if condition == "service_healthy" and not services[dep].get("healthcheck"):
                errors.append(
                    f"{at}.depends_on.{dep}: condition service_healthy but '{dep}' "
                    "has no healthcheck"
                )
            # A service without profiles starts on a plain `up`; it must not wait for one that
            # only starts under a profile.
            if not svc.get("profiles") and services[dep].get("profiles"):
                errors.append(
                    f"{at}.depends_on.{dep}: '{dep}' only runs under profiles "
                    f"{services[dep]['profiles']}, '{name}' under every profile"
                )
        for vol in svc.get("volumes") or []:
            source = vol.get("source") if isinstance(vol, dict) else str(vol).split(":")[0]
            kind = vol.get("type", "volume") if isinstance(vol, dict) else None
            is_named = source and not source.startswith(("/", ".", "~", "$"))
            if (kind == "volume" or kind is None) and is_named and source not in declared_volumes:
                errors.append(
                    f"{at}.volumes: named volume '{source}' is not declared under top-level "
                    "'volumes'"
                )
        if not svc.get("image") and not svc.get("build"):
            errors.append(f"{at}: neither 'image' nor 'build'")
        if not svc.get("restart"):
            errors.append(f"{at}: no restart policy")
        if not svc.get("profiles") and not svc.get("healthcheck"):
            errors.append(f"{at}: an always-on service needs a healthcheck")
    return errors


# ---- Kubernetes ---------------------------------------------------------------------------------


def pod_templates(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    path = POD_TEMPLATE_PATHS.get(obj.get("kind", ""))
    if path:
        template = dig(obj, *path)
        if isinstance(template, dict):
            yield template
    elif obj.get("kind") == "Pod":
        yield obj


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_container(at: str, container: dict[str, Any], pod_sc: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    cname = container.get("name", "?")
    cat = f"{at} container {cname}"
    resources = container.get("resources") or {}
    for section in ("requests", "limits"):
        for res in ("cpu", "memory"):
            if (resources.get(section) or {}).get(res) in (None, ""):
                errors.append(f"{cat}: resources.{section}.{res} is not set")
    csc = container.get("securityContext") or {}
    if not (csc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
        errors.append(f"{cat}: securityContext.runAsNonRoot is not true (pod or container)")
    if csc.get("allowPrivilegeEscalation") is not False:
        errors.append(f"{cat}: securityContext.allowPrivilegeEscalation is not false")
    ports = {p.get("containerPort") for p in container.get("ports") or []}
    for grpc_port in sorted(ports & GRPC_PORTS):
        for probe in ("readinessProbe", "livenessProbe"):
            if dig(container, probe, "grpc", "port") != grpc_port:
                errors.append(f"{cat}: {probe} is not a grpc probe on port {grpc_port}")
    return errors


def check_k8s(name: str, docs: list[dict[str, Any]]) -> list[str]:
    """Rules and cross-references over one rendered kustomization."""
    errors: list[str] = []
    pods: list[tuple[str, dict[str, str]]] = []  # (workload, pod labels)
    services: set[str] = set()
    config_names = {
        (d.get("kind"), dig(d, "metadata", "name"))
        for d in docs
        if d.get("kind") in ("ConfigMap", "Secret", "PersistentVolumeClaim")
    }
    for obj in docs:
        kind, oname = obj.get("kind"), dig(obj, "metadata", "name")
        at = f"{name}: {str(kind).lower()}/{oname}"
        if kind == "Service":
            services.add(str(oname))
        for template in pod_templates(obj):
            labels = dig(template, "metadata", "labels") or {}
            pods.append((f"{kind}/{oname}", labels))
            selector = dig(obj, "spec", "selector", "matchLabels")
            if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet") and not (
                selector and selector_matches(selector, labels)
            ):
                errors.append(f"{at}: spec.selector.matchLabels does not match the pod labels")
            spec = template.get("spec") or {}
            pod_sc = spec.get("securityContext") or {}
            for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
                errors += check_container(at, container, pod_sc)
                for env in container.get("env") or []:
                    for ref_kind, ref in (
                        ("Secret", dig(env, "valueFrom", "secretKeyRef")),
                        ("ConfigMap", dig(env, "valueFrom", "configMapKeyRef")),
                    ):
                        if (
                            ref
                            and not ref.get("optional")
                            and (ref_kind, ref.get("name")) not in config_names
                        ):
                            errors.append(
                                f"{at}: env {env.get('name')} refers to {ref_kind} "
                                f"'{ref.get('name')}', which this kustomization does not create"
                            )
            for volume in spec.get("volumes") or []:
                claim = dig(volume, "persistentVolumeClaim", "claimName")
                if claim and ("PersistentVolumeClaim", claim) not in config_names:
                    errors.append(
                        f"{at}: volume {volume.get('name')} uses missing PersistentVolumeClaim "
                        f"{claim}"
                    )
                cm = dig(volume, "configMap", "name")
                if cm and ("ConfigMap", cm) not in config_names:
                    errors.append(
                        f"{at}: volume {volume.get('name')} mounts missing ConfigMap {cm}"
                    )
    for obj in docs:
        kind, oname = obj.get("kind"), dig(obj, "metadata", "name")
        at = f"{name}: {str(kind).lower()}/{oname}"
        if kind == "Service":
            selector = dig(obj, "spec", "selector") or {}
            if selector and not any(selector_matches(selector, lb) for _, lb in pods):
                errors.append(f"{at}: selector {selector} matches no pod template")
        if kind == "PodDisruptionBudget":
            selector = dig(obj, "spec", "selector", "matchLabels") or {}
            if not any(selector_matches(selector, lb) for _, lb in pods):
                errors.append(f"{at}: selector {selector} matches no pod template")
        if kind == "StatefulSet":
            svc = dig(obj, "spec", "serviceName")
            if svc and svc not in services:
                errors.append(f"{at}: spec.serviceName '{svc}' is not a Service here")
        for template in pod_templates(obj):
            for container in dig(template, "spec", "containers") or []:
                for env in container.get("env") or []:
                    # host:port addresses of the services must name a Service of the same output.
                    if re.fullmatch(r"MUTUALRL_[A-Z]+_ADDR", str(env.get("name"))) and env.get(
                        "value"
                    ):
                        host = str(env["value"]).rsplit(":", 1)[0]
                        if "." not in host and host not in services:
                            errors.append(
                                f"{at}: env {env['name']}={env['value']} names no Service here"
                            )
    return errors


# ---- drift between copies -----------------------------------------------------------------------


def requirement_name(line: str) -> str:
    return re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0].strip().lower().replace("_", "-")


def check_deps(pyproject: Path, requirements: Path) -> list[str]:
    """Every service requirement appears verbatim in pyproject's dependencies; no trainer-only."""
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    by_name = {requirement_name(d): d for d in deps}
    errors: list[str] = []
    for raw in requirements.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name = requirement_name(line)
        if name in TRAINER_ONLY:
            errors.append(f"{requirements}: '{name}' does not belong in the service image")
        elif name not in by_name:
            errors.append(f"{requirements}: '{line}' is not a dependency in {pyproject}")
        elif by_name[name].replace(" ", "") != line.replace(" ", ""):
            errors.append(f"{requirements}: '{line}' differs from {pyproject}'s '{by_name[name]}'")
    return errors


def check_same(source: Path, copy: Path) -> list[str]:
    if not source.exists():
        return [f"{source}: missing (the Kubernetes run config {copy} is a copy of it)"]
    if source.read_bytes() != copy.read_bytes():
        return [f"{copy}: differs from {source}; refresh it with: cp {source} {copy}"]
    return []


# ---- the package as the images run it -----------------------------------------------------------


def service_closure(requirements: Path) -> tuple[set[str], list[str]]:
    """Distributions the service image holds: the requirements and what they require, as the
    installed metadata says (markers evaluated here), plus the venv's own pip and setuptools."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = [r.split("#", 1)[0].strip() for r in requirements.read_text("utf-8").splitlines()]
    stack = [Requirement(line) for line in lines if line]
    stack += [Requirement("pip"), Requirement("setuptools")]
    closure: set[str] = set()
    missing: list[str] = []
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        if name in closure:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            if req.name not in ("pip", "setuptools"):
                missing.append(req.name)
            continue
        closure.add(name)
        for raw in dist.requires or []:
            sub = Requirement(raw)
            extras = ("", *req.extras)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                stack.append(sub)
    return closure, missing


def block_outside(closure: set[str]) -> list[str]:
    """Make every installed top-level module outside `closure` fail to import (sys.modules None),
    as it would in the service image; returns the blocked names."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    blocked = []
    for module, dists in metadata.packages_distributions().items():
        names = {canonicalize_name(d) for d in dists}
        if (
            names & closure
            or "mutualrl" in names
            or module in sys.modules
            or module in sys.stdlib_module_names
        ):
            continue
        sys.modules[module] = None  # type: ignore[assignment]  # None: ImportError on import
        blocked.append(module)
    for module in TRAINER_ONLY:  # whatever the metadata says
        sys.modules.setdefault(module, None)  # type: ignore[arg-type]
    return blocked


def check_imports(requirements: Path) -> list[str]:
    """Every module of the service packages, and the CLI, import with only the service image's
    distributions (requirements-service.txt and their dependencies) importable."""
    closure, missing = service_closure(requirements)
    errors = [
        f"{requirements}: '{m}' is not installed here, so this check is incomplete" for m in missing
    ]
    blocked = block_outside(closure)

    def record(name: str, exc: BaseException) -> None:
        hint = ""
        if isinstance(exc, ImportError) and exc.name and exc.name.split(".")[0] in blocked:
            hint = f" ('{exc.name.split('.')[0]}' is not in the service image: {requirements})"
        errors.append(f"{name}: {type(exc).__name__}: {exc}{hint}")

    for package_name in SERVICE_PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except Exception as exc:
            record(package_name, exc)
            continue
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            try:
                importlib.import_module(info.name)
            except Exception as exc:
                record(info.name, exc)
    try:
        from mutualrl.cli import build_parser

        build_parser()
    except Exception as exc:
        record("mutualrl.cli.build_parser()", exc)
    return errors


def mutualrl_argvs(compose: Path, rendered: list[Path]) -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of every `mutualrl ...` invocation in the compose file and manifests."""
    doc = yaml.safe_load(compose.read_text(encoding="utf-8")) or {}
    for name, svc in (doc.get("services") or {}).items():
        image = str(svc.get("image", ""))
        dockerfile = str(dig(svc, "build", "dockerfile") or "")
        ours = "mutualrl" in image or "deploy/docker" in dockerfile
        if ours and isinstance(svc.get("command"), list):
            yield f"{compose}: services.{name}.command", [str(a) for a in svc["command"]]
        test = dig(svc, "healthcheck", "test")
        if isinstance(test, list) and len(test) > 1 and test[1] == "mutualrl":
            yield f"{compose}: services.{name}.healthcheck", [str(a) for a in test[2:]]
    for path in rendered:
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(obj, dict):
                continue
            for template in pod_templates(obj):
                for container in dig(template, "spec", "containers") or []:
                    image = str(container.get("image", "")).rsplit("/", 2)[-2:]
                    if image[0] != "mutualrl" or container.get("command"):
                        continue
                    where = (
                        f"{path.stem}: {str(obj.get('kind')).lower()}/"
                        f"{dig(obj, 'metadata', 'name')} container {container.get('name')}"
                    )
                    yield where, [str(a) for a in container.get("args") or []]


def check_cli(compose: Path, rendered: list[Path]) -> list[str]:
    """Each command the deployment runs parses with the installed `mutualrl` CLI."""
    for module in TRAINER_ONLY:  # parsing must not need them either
        sys.modules.setdefault(module, None)  # type: ignore[arg-type]
    try:
        from mutualrl.cli import build_parser

        parser = build_parser()
    except Exception as exc:
        return [f"mutualrl.cli.build_parser(): {type(exc).__name__}: {exc}"]
    failures: dict[tuple[str, ...], tuple[list[str], str]] = {}  # argv -> (wheres, message)
    for where, argv in mutualrl_argvs(compose, rendered):
        if tuple(argv) in failures:
            failures[tuple(argv)][0].append(where)
            continue
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code:
                lines = stderr.getvalue().strip().splitlines()
                failures[tuple(argv)] = ([where], lines[-1] if lines else str(exc.code))
    errors = []
    for argv, (wheres, message) in failures.items():
        more = f" (also {len(wheres) - 1} more place(s))" if len(wheres) > 1 else ""
        errors.append(f"{wheres[0]}{more}: `mutualrl {' '.join(argv)}` does not parse: {message}")
    return errors


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command = argv[0]
    try:
        if command == "compose" and len(argv) == 2:
            errors = check_compose(Path(argv[1]))
        elif command == "k8s" and len(argv) == 3:
            text = sys.stdin.read() if argv[2] == "-" else Path(argv[2]).read_text("utf-8")
            docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
            errors = check_k8s(argv[1], docs)
        elif command == "deps" and len(argv) == 3:
            errors = check_deps(Path(argv[1]), Path(argv[2]))
        elif command == "same" and len(argv) == 3:
            errors = check_same(Path(argv[1]), Path(argv[2]))
        elif command == "imports" and len(argv) == 2:
            errors = check_imports(Path(argv[1]))
        elif command == "cli" and len(argv) >= 2:
            errors = check_cli(Path(argv[1]), [Path(a) for a in argv[2:]])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (OSError, yaml.YAMLError, tomllib.TOMLDecodeError, KeyError) as exc:
        errors = [f"{command} {' '.join(argv[1:])}: {type(exc).__name__}: {exc}"]
    for error in errors:
        print(f"ERROR {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

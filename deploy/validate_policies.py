"""Checks the deployment files for what a schema cannot see (called by scripts/validate_deploy.sh).

A JSON schema validates each object alone; these checks follow references between objects
(a compose `depends_on` naming a service that does not exist, a Kubernetes Service whose
selector matches no pod), hold the project's deployment rules (requests and limits on every
container, non-root pods, gRPC probes on the services), and read the Dockerfiles without a Docker
engine (images.py): what enters each build, that every pip install takes the workspace packages
from their directories under the constraints file, and each image's dependency closure.
Each problem is printed as one `ERROR <where>: <what>` line (notes as `NOTE ...`); the exit
status is 1 when there is any error.

    python deploy/validate_policies.py compose docker-compose.yml
    kubectl kustomize deploy/k8s/overlays/dev | python deploy/validate_policies.py k8s dev -
    python deploy/validate_policies.py same configs/demo.yaml deploy/k8s/base/run.yaml
    python deploy/validate_policies.py tokens deploy/k8s/base/auth.env \
        deploy/k8s/base/policy-tokens.env
    python deploy/validate_policies.py constraints . constraints.txt \
        deploy/docker/constraints-gpu.txt
    python deploy/validate_policies.py context . deploy/docker/Dockerfile.service
    python deploy/validate_policies.py pips . deploy/docker/Dockerfile.service
    python deploy/validate_policies.py closure . deploy/docker/Dockerfile.service
    python deploy/validate_policies.py imports . deploy/docker/Dockerfile.service
    python deploy/validate_policies.py cli . deploy/docker docker-compose.yml \
        rendered-overlay.yaml ...

The first argument of the image checks is the build context (the repository root).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import importlib
import io
import pkgutil
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from dockerfile import parse
from images import (
    FORBIDDEN,
    Image,
    check_closure,
    check_context,
    check_pips,
    leaf_images,
    read_constraints,
    shown,
    workspace,
)
from packaging.utils import canonicalize_name

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
                errors += check_nproc(at, container)
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


def check_nproc(at: str, container: dict[str, Any]) -> list[str]:
    """A trainer's MUTUALRL_NPROC (data-parallel ranks) is a positive integer and, where the
    container takes GPUs, equals their number: NCCL runs one rank per GPU."""
    env = {str(e.get("name")): e.get("value") for e in container.get("env") or []}
    if "MUTUALRL_NPROC" not in env:
        return []
    where = f"{at} container {container.get('name')}: env MUTUALRL_NPROC={env['MUTUALRL_NPROC']}"
    try:
        nproc = int(str(env["MUTUALRL_NPROC"]))
    except ValueError:
        return [f"{where} is not an integer"]
    if nproc < 1:
        return [f"{where} must be at least 1"]
    gpus = dig(container, "resources", "limits", "nvidia.com/gpu")
    if gpus is not None and int(gpus) != nproc:
        return [f"{where} differs from resources.limits nvidia.com/gpu={gpus} (one rank per GPU)"]
    return []


# ---- drift between copies -----------------------------------------------------------------------


def check_same(source: Path, copy: Path) -> list[str]:
    if not source.exists():
        return [f"{source}: missing (the Kubernetes run config {copy} is a copy of it)"]
    if source.read_bytes() != copy.read_bytes():
        return [f"{copy}: differs from {source}; refresh it with: cp {source} {copy}"]
    return []


def _env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text("utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def check_policy_tokens(auth_env: Path, tokens_env: Path) -> list[str]:
    """Every `policy=token` of `tokens_env` is that policy's token under the secret of
    `auth_env` (HMAC-SHA256(secret, "policy:<name>"), as `mutualrl token policy NAME` prints)."""
    secret = _env_file(auth_env).get("MUTUALRL_AUTH_TOKEN")
    if not secret:
        return [f"{auth_env}: no MUTUALRL_AUTH_TOKEN"]
    errors = []
    for policy, token in _env_file(tokens_env).items():
        mac = hmac.new(secret.encode(), f"policy:{policy}".encode(), hashlib.sha256).hexdigest()
        if token != f"policy.{policy}.{mac}":
            errors.append(f"{tokens_env}: {policy} is not the token of policy {policy} under "
                          f"{auth_env}'s secret; refresh it with: MUTUALRL_AUTH_TOKEN=<secret> "
                          f"mutualrl token policy {policy}")
    return errors


# ---- the packages as the images run them -------------------------------------------------------


def image_entry_points(image: Image) -> Callable[..., list[EntryPoint]]:
    """importlib.metadata.entry_points, limited to the distributions the image installs."""
    names = image.workspace_names | set(image.closure)

    def limited(*, group: str) -> list[EntryPoint]:
        return [ep for ep in entry_points(group=group)
                if ep.dist is not None and canonicalize_name(ep.dist.name) in names]

    return limited


@contextlib.contextmanager
def image_cli(image: Image) -> Iterator[Any]:
    """`mutualrl.cli` with only the commands of the image's packages registered."""
    import mutualrl.cli as cli

    if not hasattr(cli, "entry_points"):  # the registry moved: this check must follow it
        raise RuntimeError("mutualrl.cli no longer calls importlib.metadata.entry_points; "
                           "update deploy/validate_policies.py image_cli")
    with mock.patch.object(cli, "entry_points", image_entry_points(image)):
        yield cli


def block_outside(image: Image, context: Path) -> list[str]:
    """Make every installed module the image lacks fail to import (sys.modules None), as it
    would in the image; returns the blocked names."""
    from importlib import metadata

    keep = image.workspace_names | set(image.closure) | {"pip", "setuptools"}
    blocked = []
    for module, dists in metadata.packages_distributions().items():
        names = {canonicalize_name(d) for d in dists}
        if (
            module == "mutualrl"  # the namespace: its packages are blocked one by one below
            or names & keep
            or module in sys.modules
            or module in sys.stdlib_module_names
        ):
            continue
        sys.modules[module] = None  # type: ignore[assignment]  # None: ImportError on import
        blocked.append(module)
    for name, package in workspace(context).items():
        if name not in image.workspace_names:
            for module in package.subpackages(context):
                sys.modules[module] = None  # type: ignore[assignment]
                blocked.append(module)
    for module in FORBIDDEN.get(image.dockerfile.path.name, ()):  # whatever the metadata says
        sys.modules.setdefault(module, None)  # type: ignore[arg-type]
        blocked.append(module)
    return blocked


def check_imports(context: Path, path: Path) -> tuple[list[str], list[str]]:
    """Every module of an image's workspace packages, and its CLI, import with only the image's
    distributions importable (one image per run: the blocking lasts for the process).
    With several targets, the first whose closure could be followed completely is checked."""
    images = leaf_images(parse(path, context), workspace(context))
    complete = [i for i in images if not i.unfollowed]
    notes = [f"{i.where}: not import-checked ({len(i.unfollowed)} distribution(s) not followed)"
             for i in images if i.unfollowed]
    if not complete:
        return [], notes
    image = complete[0]
    notes += [f"{i.where}: same packages as {image.where}, not import-checked again"
              for i in complete[1:]]
    blocked = set(block_outside(image, context))
    blocked_roots = {b.split(".")[0] for b in blocked} | blocked
    errors: list[str] = []

    def record(name: str, exc: BaseException) -> None:
        hint = ""
        missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        if missing and (missing in blocked_roots or missing.split(".")[0] in blocked_roots):
            hint = f" ('{missing}' is not in {image.where})"
        errors.append(f"{image.where}: {name}: {type(exc).__name__}: {exc}{hint}")

    for install in sorted(image.installs.values(), key=lambda i: i.package.directory):
        for package_name in install.package.subpackages(context):
            try:
                package = importlib.import_module(package_name)
            except Exception as exc:
                record(package_name, exc)
                continue
            for info in pkgutil.walk_packages(getattr(package, "__path__", []),
                                              prefix=f"{package_name}."):
                if info.name.endswith(".__main__"):  # runs the program on import
                    continue
                try:
                    importlib.import_module(info.name)
                except Exception as exc:
                    record(info.name, exc)
    try:
        with image_cli(image) as cli:
            cli.build_parser()
    except Exception as exc:
        record("mutualrl.cli.build_parser()", exc)
    return errors, notes


# Where a command runs: ("dockerfile", path relative to the build context, target or "") for a
# compose service that builds, ("image", "<repository>") for an image reference.
ImageRef = tuple[str, str, str]


def mutualrl_argvs(
    compose: Path, rendered: list[Path]
) -> Iterator[tuple[str, list[str], ImageRef]]:
    """(where, argv, image) of every `mutualrl ...` invocation in the compose file and manifests."""
    doc = yaml.safe_load(compose.read_text(encoding="utf-8")) or {}
    for name, svc in (doc.get("services") or {}).items():
        image = str(svc.get("image", ""))
        dockerfile = str(dig(svc, "build", "dockerfile") or "")
        ref: ImageRef = (
            ("dockerfile", dockerfile, str(dig(svc, "build", "target") or ""))
            if dockerfile
            else ("image", image.split(":", 1)[0], "")
        )
        ours = "mutualrl" in image or "deploy/docker" in dockerfile
        if ours and isinstance(svc.get("command"), list):
            yield f"{compose}: services.{name}.command", [str(a) for a in svc["command"]], ref
        test = dig(svc, "healthcheck", "test")
        if isinstance(test, list) and len(test) > 1 and test[1] == "mutualrl":
            yield f"{compose}: services.{name}.healthcheck", [str(a) for a in test[2:]], ref
    for path in rendered:
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(obj, dict):
                continue
            for template in pod_templates(obj):
                for container in dig(template, "spec", "containers") or []:
                    reference = str(container.get("image", "")).split("@", 1)[0]
                    repository = reference.rsplit(":", 1)[0] if ":" in reference.rsplit(
                        "/", 1)[-1] else reference
                    owner_name = repository.rsplit("/", 2)[-2:]
                    if owner_name[0] != "mutualrl" or container.get("command"):
                        continue
                    where = (
                        f"{path.stem}: {str(obj.get('kind')).lower()}/"
                        f"{dig(obj, 'metadata', 'name')} container {container.get('name')}"
                    )
                    yield (where, [str(a) for a in container.get("args") or []],
                           ("image", "/".join(owner_name), ""))


def images_of(ref: ImageRef, context: Path, docker_dir: Path,
              cache: dict[ImageRef, list[Image] | str]) -> list[Image] | str:
    """The images a reference runs in (each target of mutualrl/<name>'s Dockerfile.<name>), or
    why none can be found."""
    if ref not in cache:
        kind, name, target = ref
        path = (context / name) if kind == "dockerfile" else (
            docker_dir / f"Dockerfile.{name.rsplit('/', 1)[-1]}")
        if not path.is_file():
            cache[ref] = f"image {name}: no Dockerfile {shown(path, context)}"
        else:
            dockerfile = parse(path, context)
            images = leaf_images(dockerfile, workspace(context))
            if target:
                images = [i for i in images if i.target.name == target]
            cache[ref] = images or f"{shown(path, context)}: no target '{target}'"
    return cache[ref]


def check_cli(context: Path, docker_dir: Path, compose: Path, rendered: list[Path]) -> list[str]:
    """Each command the deployment runs parses with the `mutualrl` CLI of the image it runs in:
    only the commands of that image's packages registered."""
    cache: dict[ImageRef, list[Image] | str] = {}
    parsers: dict[str, argparse.ArgumentParser | str] = {}
    failures: dict[tuple[str, ...], tuple[list[str], str]] = {}  # (image, argv) -> wheres, msg
    for where, argv, ref in mutualrl_argvs(compose, rendered):
        images = images_of(ref, context, docker_dir, cache)
        if isinstance(images, str):
            failures.setdefault((images,), ([], images))[0].append(where)
            continue
        for image in images:
            key = (image.where, *argv)
            if key in failures:
                failures[key][0].append(where)
                continue
            if image.where not in parsers:
                try:
                    with image_cli(image) as cli:
                        parsers[image.where] = cli.build_parser()
                except Exception as exc:
                    parsers[image.where] = f"{type(exc).__name__}: {exc}"
            parser = parsers[image.where]
            if isinstance(parser, str):
                failures[key] = ([where], f"the CLI of {image.where} does not build: {parser}")
                continue
            stderr = io.StringIO()
            try:
                with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                    parser.parse_args(argv)
            except SystemExit as exc:
                if exc.code:
                    lines = stderr.getvalue().strip().splitlines()
                    message = lines[-1] if lines else str(exc.code)
                    failures[key] = ([where], f"`mutualrl {' '.join(argv)}` does not parse in "
                                              f"{image.where}: {message}")
    errors = []
    for wheres, message in failures.values():
        more = f" (also {len(wheres) - 1} more place(s))" if len(wheres) > 1 else ""
        errors.append(f"{wheres[0]}{more}: {message}")
    return errors


def check_constraints(context: Path, paths: list[Path]) -> list[str]:
    errors: list[str] = []
    for path in paths:
        if not path.is_file():
            errors.append(f"{shown(path, context)}: missing")
            continue
        errors += read_constraints(path, shown(path, context))[1]
    return errors


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    paths = [Path(a) for a in args]
    notes: list[str] = []
    try:
        if command == "compose" and len(args) == 1:
            errors = check_compose(paths[0])
        elif command == "k8s" and len(args) == 2:
            text = sys.stdin.read() if args[1] == "-" else paths[1].read_text("utf-8")
            docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
            errors = check_k8s(args[0], docs)
        elif command == "same" and len(args) == 2:
            errors = check_same(paths[0], paths[1])
        elif command == "tokens" and len(args) == 2:
            errors = check_policy_tokens(paths[0], paths[1])
        elif command == "constraints" and len(args) >= 2:
            errors = check_constraints(paths[0], paths[1:])
        elif command == "context" and len(args) == 2:
            errors = check_context(paths[1], paths[0])
        elif command == "pips" and len(args) == 2:
            errors = check_pips(paths[1], paths[0])
        elif command == "closure" and len(args) == 2:
            errors, notes = check_closure(paths[1], paths[0])
        elif command == "imports" and len(args) == 2:
            errors, notes = check_imports(paths[0], paths[1])
        elif command == "cli" and len(args) >= 3:
            errors = check_cli(paths[0], paths[1], paths[2], paths[3:])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (OSError, yaml.YAMLError, tomllib.TOMLDecodeError, KeyError) as exc:
        errors = [f"{command} {' '.join(args)}: {type(exc).__name__}: {exc}"]
    for note in notes:
        print(f"NOTE  {note}")
    for error in errors:
        print(f"ERROR {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

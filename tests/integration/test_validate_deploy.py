"""scripts/validate_deploy.sh passes on the repository's deployment files and names planted errors.

Each planted error is made in a temporary copy of the files (the script takes the compose file
and the Kubernetes folder as arguments), and each test asserts which check failed and that the
message names the offending key or file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "validate_deploy.sh"
TARGETS = sorted(["base", "overlays/dev", "overlays/gpu", "overlays/gpu-managed-redis"])

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None and shutil.which("kustomize") is None,
    reason="needs kubectl (or kustomize) to render the kustomizations",
)


def run_validate(*args: Path, package: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the script; package=False skips the checks of the installed package (step 4)."""
    env = {
        **os.environ,
        "VENV": str(REPO / ".venv"),
        "VALIDATE_DEPLOY_PACKAGE": "1" if package else "0",
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )


def failed_checks(output: str) -> list[str]:
    return re.findall(r"^FAIL  (.+)$", output, flags=re.MULTILINE)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the deployment files in which the run-config copy matches by construction."""
    shutil.copy2(REPO / "docker-compose.yml", tmp_path / "docker-compose.yml")
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        REPO / "deploy", tmp_path / "deploy", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "configs").mkdir()
    shutil.copy2(tmp_path / "deploy/k8s/base/run.yaml", tmp_path / "configs/demo.yaml")
    return tmp_path


def validate_tree(tree: Path, package: bool = False) -> subprocess.CompletedProcess[str]:
    # The package checks see the installed package, not the copy: only the repository test and
    # the CLI test below need them.
    return run_validate(tree / "docker-compose.yml", tree / "deploy" / "k8s", package=package)


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) >= 1, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_repository_files_pass() -> None:
    result = run_validate()
    assert result.returncode == 0, result.stdout + result.stderr
    assert failed_checks(result.stdout) == []
    assert "validate-deploy: OK" in result.stdout
    assert "ok    package: compose and Kubernetes commands parse with the mutualrl CLI" in (
        result.stdout
    )
    # The base and each overlay, each rendered, schema-checked and rule-checked.
    for target in TARGETS:
        assert f"ok    kubernetes {target}: schema (kubernetes-validate --strict)" in result.stdout


def test_compose_key_typo_and_dangling_depends_on_fail(tree: Path) -> None:
    # Two independent plants, each caught by its own check (schema; cross-references).
    compose = tree / "docker-compose.yml"
    replace_once(compose, '    command: ["redis-server"', '    comand: ["redis-server"')
    replace_once(compose, "    see:\n      condition:", "    sea:\n      condition:")
    result = validate_tree(tree)
    assert result.returncode == 1
    assert failed_checks(result.stdout) == [
        "compose: Compose specification schema",
        "compose: references and rules",
    ]
    assert "$.services.redis: Unevaluated properties are not allowed ('comand' was unexpected)" in (
        result.stdout
    )
    assert "'sea' is not a service of this file" in result.stdout


def test_deployment_invalid_field_fails(tree: Path) -> None:
    replace_once(
        tree / "deploy/k8s/base/see.yaml",
        "          image: mutualrl/service\n",
        "          image: mutualrl/service\n          imagePullPolice: Always\n",
    )
    result = validate_tree(tree)
    assert result.returncode == 1
    # The base and every overlay built on it carry the bad Deployment.
    assert sorted(failed_checks(result.stdout)) == sorted(
        f"kubernetes {t}: schema (kubernetes-validate --strict)" for t in TARGETS
    )
    assert "deployment/see" in result.stdout
    assert "'imagePullPolice' was unexpected" in result.stdout


def test_unknown_kind_fails(tree: Path) -> None:
    # kubernetes-validate only warns about a kind it has no schema for; the script fails on it.
    replace_once(tree / "deploy/k8s/base/mwra.yaml", "kind: Deployment", "kind: Deploymnt")
    result = validate_tree(tree)
    assert result.returncode == 1
    assert "kubernetes base: schema (kubernetes-validate --strict)" in failed_checks(result.stdout)
    assert "Couldn't find schema for kind Deploymnt" in result.stdout


def test_broken_kustomization_fails(tree: Path) -> None:
    replace_once(
        tree / "deploy/k8s/base/kustomization.yaml",
        "  - mwra.yaml\n",
        "  - mwra.yaml\n  - missing-service.yaml\n",
    )
    result = validate_tree(tree)
    assert result.returncode == 1
    assert sorted(failed_checks(result.stdout)) == sorted(
        f"kubernetes {t}: kustomize build" for t in TARGETS
    )
    assert "missing-service.yaml" in result.stdout


def test_container_without_limits_fails(tree: Path) -> None:
    replace_once(
        tree / "deploy/k8s/base/thl.yaml",
        '            limits:\n              cpu: "2"\n              memory: 2Gi\n',
        "",
    )
    result = validate_tree(tree)
    assert result.returncode == 1
    assert "kubernetes base: references and rules" in failed_checks(result.stdout)
    assert "deployment/thl container server: resources.limits.memory is not set" in result.stdout


def test_drifted_copies_fail(tree: Path) -> None:
    requirements = tree / "deploy/docker/requirements-service.txt"
    requirements.write_text(requirements.read_text() + "torch>=2.5,<3\n")
    (tree / "configs/demo.yaml").write_text("# edited after the copy was made\n")
    result = validate_tree(tree)
    assert result.returncode == 1
    assert failed_checks(result.stdout) == [
        "copies: service image requirements match pyproject.toml",
        "copies: deploy/k8s/base/run.yaml is configs/demo.yaml",
    ]
    assert "'torch' does not belong in the service image" in result.stdout
    assert "refresh it with: cp " in result.stdout


def test_healthcheck_that_does_not_parse_fails(tree: Path) -> None:
    replace_once(
        tree / "docker-compose.yml",
        '"mutualrl", "health", "--addr", "127.0.0.1:50052"',
        '"mutualrl", "health", "--adr", "127.0.0.1:50052"',
    )
    result = validate_tree(tree, package=True)
    assert result.returncode == 1
    assert "package: compose and Kubernetes commands parse with the mutualrl CLI" in (
        failed_checks(result.stdout)
    )
    assert "services.thl.healthcheck" in result.stdout
    assert "`mutualrl health --adr 127.0.0.1:50052` does not parse" in result.stdout

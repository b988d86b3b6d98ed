"""scripts/validate_deploy.sh passes on the repository's deployment files and names planted errors.

Each planted error is made in a temporary copy of the files (the script takes the compose file
and the Kubernetes folder as arguments; the compose file's folder is the images' build context,
so the copy holds constraints.txt and the package directories too), and each test asserts which
checks failed and that the message names the offending file, line or key.
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
TARGETS = sorted(["base", "overlays/dev", "overlays/dev-redis-cluster", "overlays/gpu",
                  "overlays/gpu-managed-redis"])
PACKAGE_DIRS = ("proto", "services", "clients", "launcher")
SERVICE = "deploy/docker/Dockerfile.service"
TRAINER = "deploy/docker/Dockerfile.trainer"
CONTEXT_CHECK = "image Dockerfile.{}: build context (COPY sources, ignore-file allow-list)"
PIPS_CHECK = "image Dockerfile.{}: pip installs (package directories, -c constraints)"
CLOSURE_CHECK = "image Dockerfile.{}: dependency closure (pinned, nothing that does not belong)"

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None and shutil.which("kustomize") is None,
    reason="needs kubectl (or kustomize) to render the kustomizations",
)


def run_validate(*args: Path, sections: str = "") -> subprocess.CompletedProcess[str]:
    """Run the script; `sections` limits it to some steps (default: every step)."""
    env = {**os.environ, "VENV": str(REPO / ".venv"), "VALIDATE_DEPLOY_SECTIONS": sections}
    if not sections:
        env.pop("VALIDATE_DEPLOY_SECTIONS")
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
    """A copy of the deployment files and the build context (constraints, package directories)
    in which the run-config copy matches by construction."""
    for name in ("docker-compose.yml", "pyproject.toml", "constraints.txt"):
        shutil.copy2(REPO / name, tmp_path / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("deploy", *PACKAGE_DIRS):
        shutil.copytree(REPO / name, tmp_path / name, ignore=ignore)
    (tmp_path / "configs").mkdir()
    shutil.copy2(tmp_path / "deploy/k8s/base/run.yaml", tmp_path / "configs/demo.yaml")
    return tmp_path


def validate_tree(tree: Path, sections: str) -> subprocess.CompletedProcess[str]:
    """Run the steps that read the kind of file a test plants an error in (the package checks
    read the installed packages, not the copy: only the CLI test needs them)."""
    return run_validate(tree / "docker-compose.yml", tree / "deploy" / "k8s", sections=sections)


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) >= 1, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def line_of(path: Path, text: str) -> int:
    """1-based number of the first line of `path` containing `text`."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def test_repository_files_pass() -> None:
    result = run_validate()
    assert result.returncode == 0, result.stdout + result.stderr
    assert failed_checks(result.stdout) == []
    assert "validate-deploy: OK" in result.stdout
    ok = set(re.findall(r"^ok    (.+)$", result.stdout, flags=re.MULTILINE))
    # The base and each overlay, each rendered, schema-checked and rule-checked.
    for target in TARGETS:
        assert f"kubernetes {target}: schema (kubernetes-validate --strict)" in ok
    # Each image read from its Dockerfile, and run as the images run it.
    for image in ("service", "trainer"):
        for check in (CONTEXT_CHECK, PIPS_CHECK, CLOSURE_CHECK):
            assert check.format(image) in ok
        imports = f"package: Dockerfile.{image} modules import with only that image's distributions"
        assert imports in ok
    assert "constraints: only name==version pins" in ok
    assert "copies: deploy/docker/constraints-gpu.txt follows constraints.txt" in ok
    assert "copies: deploy/k8s/base/policy-tokens.env follows auth.env's secret" in ok
    assert "package: compose and Kubernetes commands parse with their image's mutualrl CLI" in ok
    # The GPU target's sglang is not installed here: said, not hidden.
    assert "(target gpu): not followed further" in result.stdout
    assert "sglang: not installed here" in result.stdout


def test_compose_key_typo_and_dangling_depends_on_fail(tree: Path) -> None:
    # Two independent plants, each caught by its own check (schema; cross-references).
    compose = tree / "docker-compose.yml"
    replace_once(compose, '    command: ["redis-server"', '    comand: ["redis-server"')
    replace_once(compose, "    see:\n      condition:", "    sea:\n      condition:")
    result = validate_tree(tree, "compose")
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
    result = validate_tree(tree, "kubernetes")
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
    result = validate_tree(tree, "kubernetes")
    assert result.returncode == 1
    assert "kubernetes base: schema (kubernetes-validate --strict)" in failed_checks(result.stdout)
    assert "Couldn't find schema for kind Deploymnt" in result.stdout


def test_broken_kustomization_fails(tree: Path) -> None:
    replace_once(
        tree / "deploy/k8s/base/kustomization.yaml",
        "  - mwra.yaml\n",
        "  - mwra.yaml\n  - missing-service.yaml\n",
    )
    result = validate_tree(tree, "kubernetes")
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
    result = validate_tree(tree, "kubernetes")
    assert result.returncode == 1
    assert "kubernetes base: references and rules" in failed_checks(result.stdout)
    assert "deployment/thl container server: resources.limits.memory is not set" in result.stdout


def test_drifted_copies_fail(tree: Path) -> None:
    replace_once(tree / "deploy/docker/constraints-gpu.txt", "sglang==0.5.23", "sglang==0.5.22")
    (tree / "configs/demo.yaml").write_text("# edited after the copy was made\n")
    # A new secret whose trainer tokens were not derived again.
    replace_once(tree / "deploy/k8s/base/auth.env", "=dev-only-change-me", "=a-new-secret")
    result = validate_tree(tree, "copies")
    assert result.returncode == 1
    assert failed_checks(result.stdout) == [
        "copies: deploy/docker/constraints-gpu.txt follows constraints.txt",
        "copies: deploy/k8s/base/run.yaml is configs/demo.yaml",
        "copies: deploy/k8s/base/policy-tokens.env follows auth.env's secret",
    ]
    assert "constraints-gpu.txt: does not follow" in result.stdout
    assert "refresh it with: cp " in result.stdout
    assert "mutualrl token policy gpt2-bpe" in result.stdout


def test_pip_install_without_constraints_fails(tree: Path) -> None:
    dockerfile = tree / SERVICE
    line = line_of(dockerfile, "pip install -c constraints.txt")
    replace_once(dockerfile, "pip install -c constraints.txt", "pip install")
    result = validate_tree(tree, "images copies")
    assert result.returncode == 1
    assert failed_checks(result.stdout) == [PIPS_CHECK.format("service")]
    assert f"{SERVICE}:{line - 1}: pip install (stage builder): no -c constraints.txt" in (
        result.stdout
    )


def test_service_image_that_would_pull_torch_fails(tree: Path) -> None:
    # The trainer planted cleanly (copied, admitted, under the constraints): only the closure
    # check can see what it drags in.
    dockerfile = tree / SERVICE
    replace_once(dockerfile, "COPY services/mwra ./services/mwra\n",
                 "COPY services/mwra ./services/mwra\nCOPY services/trainer ./services/trainer\n")
    replace_once(dockerfile, "./services/mwra \\\n", "./services/mwra ./services/trainer \\\n")
    ignore = tree / f"{SERVICE}.dockerignore"
    replace_once(ignore, "!services/mwra\n", "!services/mwra\n!services/trainer\n")
    result = validate_tree(tree, "images copies")
    assert result.returncode == 1
    assert failed_checks(result.stdout) == [CLOSURE_CHECK.format("service")]
    install = line_of(dockerfile, "RUN --mount=type=cache")
    for name in ("torch", "tensorboard"):
        assert (
            f"{SERVICE} (target runtime): {name} does not belong in this image; it comes in "
            f"through {SERVICE}:{install}: mutualrl-trainer -> {name}"
        ) in result.stdout


def test_constraints_line_that_is_not_a_pin_fails(tree: Path) -> None:
    constraints = tree / "constraints.txt"
    first = len(constraints.read_text().splitlines()) + 1
    with constraints.open("a") as out:
        out.write("--index-url https://mirror.example/simple\nnumpy>=1.26\n"
                  "./vendor/thing-1.0-py3-none-any.whl\n-e services/see\n"
                  "--find-links /wheels\n")
    result = validate_tree(tree, "images copies")
    assert result.returncode == 1
    assert failed_checks(result.stdout) == ["constraints: only name==version pins"]
    for offset, why in enumerate(
        ("an index URL", "not an exact pin", "a local path", "an editable install",
         "--find-links")
    ):
        assert f"constraints.txt:{first + offset}: " in result.stdout
        assert why in result.stdout


def test_dependency_missing_from_constraints_fails(tree: Path) -> None:
    constraints = tree / "constraints.txt"
    text = constraints.read_text()
    pin = next(line for line in text.splitlines() if line.startswith("fastapi=="))
    constraints.write_text(text.replace(pin + "\n", ""))
    result = validate_tree(tree, "images copies")
    assert result.returncode == 1
    # fastapi is SEE's: the service image's closure lacks its pin (the GPU copy is stale too).
    assert failed_checks(result.stdout) == [
        CLOSURE_CHECK.format("service"),
        "copies: deploy/docker/constraints-gpu.txt follows constraints.txt",
    ]
    assert "mutualrl-see -> fastapi: fastapi is not pinned in -c /src/constraints.txt" in (
        result.stdout
    )


def test_package_directory_not_copied_fails(tree: Path) -> None:
    dockerfile = tree / SERVICE
    install = line_of(dockerfile, "RUN --mount=type=cache")
    replace_once(dockerfile, "COPY services/mwra ./services/mwra\n", "")
    result = validate_tree(tree, "images copies")
    assert result.returncode == 1
    # The install names a directory nothing copied; the allow-list admits one nothing uses.
    assert failed_checks(result.stdout) == [
        CONTEXT_CHECK.format("service"),
        PIPS_CHECK.format("service"),
    ]
    assert (
        f"{SERVICE}:{install - 1}: pip install (stage builder): ./services/mwra is "
        "/src/services/mwra, which no COPY from the build context puts into stage builder"
    ) in result.stdout
    assert "admits services/mwra, which no COPY of deploy/docker/Dockerfile.service uses" in (
        result.stdout
    )


def test_package_directory_that_is_not_a_package_fails(tree: Path) -> None:
    shutil.rmtree(tree / "services/mwra")
    (tree / "services/mwra").mkdir()
    (tree / "services/mwra/README.md").write_text("moved\n")
    result = validate_tree(tree, "images copies")
    assert result.returncode == 1
    assert PIPS_CHECK.format("service") in failed_checks(result.stdout)
    assert "./services/mwra is the build context's services/mwra, which is not a package " in (
        result.stdout
    )


def test_ignore_files_that_keep_out_a_package_or_let_in_secrets_fail(tree: Path) -> None:
    replace_once(tree / f"{SERVICE}.dockerignore", "!services/see\n", "")
    with (tree / f"{TRAINER}.dockerignore").open("a") as out:
        out.write("!.env\n")
    (tree / ".env").write_text("MUTUALRL_AUTH_TOKEN=secret\n")
    result = validate_tree(tree, "images copies")
    assert result.returncode == 1
    assert failed_checks(result.stdout) == [
        CONTEXT_CHECK.format("service"),
        CONTEXT_CHECK.format("trainer"),
    ]
    assert "Dockerfile.service.dockerignore: keeps out services/see/pyproject.toml" in (
        result.stdout
    )
    assert "Dockerfile.trainer.dockerignore: admits .env, which no COPY" in result.stdout


def test_requirements_file_and_uncopied_constraints_fail(tree: Path) -> None:
    dockerfile = tree / TRAINER
    replace_once(dockerfile, "COPY constraints.txt ./\n", "")
    replace_once(dockerfile, "pip install -c constraints.txt \\\n",
                 "pip install -r requirements.txt -c constraints.txt \\\n")
    result = validate_tree(tree, "images copies")
    assert result.returncode == 1
    assert CONTEXT_CHECK.format("trainer") in failed_checks(result.stdout)  # admits it unused
    assert PIPS_CHECK.format("trainer") in failed_checks(result.stdout)
    assert "installs a requirements file (-r requirements.txt)" in result.stdout
    assert ("-c /src/constraints.txt: no COPY from the build context puts it into stage "
            "cpu-builder") in result.stdout


def test_commands_that_do_not_parse_in_their_image_fail(tree: Path) -> None:
    compose = tree / "docker-compose.yml"
    replace_once(
        compose,
        '"mutualrl", "health", "--addr", "127.0.0.1:50052"',
        '"mutualrl", "health", "--adr", "127.0.0.1:50052"',
    )
    # `train` exists, but in the trainer image: the service image's CLI does not have it.
    replace_once(
        compose,
        'command: ["see", "serve", "--config", "/etc/mutualrl/run.yaml", "--host", "0.0.0.0"]',
        'command: ["train", "-c", "/etc/mutualrl/run.yaml", "--policy", "gpt2-bpe"]',
    )
    result = validate_tree(tree, "compose packages")
    assert result.returncode == 1
    assert failed_checks(result.stdout) == [
        "package: compose and Kubernetes commands parse with their image's mutualrl CLI"
    ]
    assert "services.thl.healthcheck" in result.stdout
    assert "`mutualrl health --adr 127.0.0.1:50052` does not parse in " in result.stdout
    assert "services.see.command" in result.stdout
    assert (
        "`mutualrl train -c /etc/mutualrl/run.yaml --policy gpt2-bpe` does not parse in "
        f"{SERVICE} (target runtime)"
    ) in result.stdout


def test_trainer_ranks_that_differ_from_its_gpus_fail(tree: Path) -> None:
    # One NCCL rank per GPU: a pod with 1 GPU cannot run 2 ranks of its policy.
    replace_once(tree / "deploy/k8s/overlays/gpu/gpu-trainers.yaml",
                 '- name: MUTUALRL_NPROC\n              value: "1"',
                 '- name: MUTUALRL_NPROC\n              value: "2"')
    result = validate_tree(tree, "kubernetes")
    assert result.returncode == 1
    assert "kubernetes overlays/gpu: references and rules" in failed_checks(result.stdout)
    assert ("statefulset/trainer-llama-char container trainer: env MUTUALRL_NPROC=2 differs "
            "from resources.limits nvidia.com/gpu=1 (one rank per GPU)") in result.stdout

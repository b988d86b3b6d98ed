"""scripts/validate_deploy.sh names each kind of planted error, and deploy/k8s/trainers.py
deploys any number of policies from the run config, a policy across nodes as one set of pods.

The repository's own files passing is `make validate-deploy` (which `make test` runs); here every
error is planted in a temporary copy of the deployment files at once, and one run of the script
must name exactly the checks that read them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "validate_deploy.sh"
TRAINERS = REPO / "deploy" / "k8s" / "trainers.py"
OVERLAYS = ["dev", "dev-redis-cluster", "gpu", "gpu-managed-redis"]

pytestmark = [
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize)"),
    pytest.mark.skipif(not (REPO / ".venv-deploy" / "bin" / "checkov").exists(),
                       reason="needs the deployment tools (make deploy-tools)"),
]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the script reads."""
    for name in ("docker-compose.yml", "constraints.txt", "constraints-vllm.txt"):
        shutil.copy2(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "deploy", tmp_path / "deploy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "configs").mkdir()
    for name in ("demo.yaml", "demo-nodes.yaml"):
        shutil.copy2(REPO / "configs" / name, tmp_path / "configs" / name)
    return tmp_path


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def with_policies(run_yaml: Path, names: list[str]) -> None:
    cfg = yaml.safe_load(run_yaml.read_text(encoding="utf-8"))
    presets = ["gpt2-bpe", "llama-char"]
    cfg["trainer"]["policies"] = [{"name": n, "preset": presets[i % 2]}
                                  for i, n in enumerate(names)]
    run_yaml.write_text(yaml.safe_dump(cfg), encoding="utf-8")


def generate(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TRAINERS), "--base", str(base), *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_each_planted_error_fails_its_check(tree: Path) -> None:
    replace_once(tree / "docker-compose.yml", "  see:\n    <<: *service\n",
                 "  see:\n    <<: *service\n    restrat: always\n")
    replace_once(tree / "deploy/k8s/base/see.yaml", "  replicas:", "  replica: 1\n  replicas:")
    replace_once(tree / "deploy/k8s/base/thl.yaml", "selector:\n    app.kubernetes.io/name: thl",
                 "selector:\n    app.kubernetes.io/name: thl-typo")
    mwra = tree / "deploy/k8s/base/mwra.yaml"
    mwra.write_text(re.sub(r"\n            limits:\n(              .*\n)+", "\n",
                           mwra.read_text(encoding="utf-8"), count=1), encoding="utf-8")
    replace_once(tree / "deploy/docker/Dockerfile.service", "WORKDIR /src\n",
                 "WORKDIR /src\nRUN cd /tmp && pip install --no-cache-dir requests\n")
    # A third policy in the run config (and its copy) without regenerating the trainers.
    for path in (tree / "configs/demo.yaml", tree / "deploy/k8s/base/run.yaml"):
        with_policies(path, ["gpt2-bpe", "llama-char", "qwen-extra"])

    result = subprocess.run(["bash", str(SCRIPT), str(tree)], capture_output=True, text=True,
                            timeout=600, check=False,
                            env={**os.environ, "VENV": str(REPO / ".venv")})
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    failed = set(re.findall(r"^FAIL  (.+)$", out, flags=re.MULTILINE))
    # Every overlay is also rendered for a run with a policy across two nodes.
    targets = [f"{t}{suffix}" for t in ["base"] + [f"overlays/{o}" for o in OVERLAYS]
               for suffix in ("", " (two-node policy)")]
    assert failed == {
        "compose: Compose specification schema",
        *(f"kubernetes {t}: schemas (kubernetes-validate --strict)" for t in targets),
        *(f"kubernetes {t}: references" for t in targets),
        "kubernetes overlays: security settings (checkov)",
        "docker Dockerfile.service: hadolint",
        "generated: deploy/k8s/base trainers and tokens follow run.yaml",
    }, out
    assert "restrat" in out
    assert "replica" in out
    assert "service/thl: selector {'app.kubernetes.io/name': 'thl-typo'} matches no pod" in out
    assert re.search(r"CKV_K8S_1[13].*\n.*Deployment\.mutualrl(-dev)?\.mwra", out), out
    assert "DL3003" in out
    assert "trainers.yaml: out of date with run.yaml" in out


def test_n_policies_deploy_from_the_run_config(tree: Path) -> None:
    base = tree / "deploy/k8s/base"
    names = ["gpt2-bpe", "llama-char", "qwen-3", "gpt2-b"]
    with_policies(base / "run.yaml", names)
    assert generate(base, "--check").returncode == 1
    wrote = generate(base)
    assert wrote.returncode == 0, wrote.stderr
    assert generate(base, "--check").returncode == 0

    for overlay in OVERLAYS:
        rendered = subprocess.run(["kubectl", "kustomize", str(tree / "deploy/k8s/overlays" /
                                                               overlay)],
                                  capture_output=True, text=True, timeout=120, check=True).stdout
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        trainers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"
                    and d["metadata"]["labels"].get("app.kubernetes.io/component") == "trainer"}
        assert sorted(trainers) == sorted(f"trainer-{n}" for n in names), overlay
        for name in names:
            container = trainers[f"trainer-{name}"]["spec"]["template"]["spec"]["containers"][0]
            assert container["args"][container["args"].index("--policy") + 1] == name
            token_ref = next(e for e in container["env"] if e["name"] == "MUTUALRL_AUTH_TOKEN")
            assert token_ref["valueFrom"]["secretKeyRef"]["key"] == name
        refs = subprocess.run([sys.executable, str(REPO / "deploy/k8s/references.py"), overlay,
                               "-"], input=rendered, capture_output=True, text=True, timeout=60,
                              check=False)
        assert refs.returncode == 0, refs.stdout

    tokens = dict(line.split("=", 1) for line in (base / "policy-tokens.env").read_text()
                  .splitlines() if line and not line.startswith("#"))
    derived = subprocess.run([str(REPO / ".venv/bin/mutualrl"), "token", "policy", "qwen-3"],
                             capture_output=True, text=True, timeout=60, check=True,
                             env={**os.environ, "MUTUALRL_AUTH_TOKEN": "dev-only-change-me"})
    assert tokens == {n: tokens[n] for n in names}
    assert tokens["qwen-3"] == derived.stdout.strip()


def test_a_policy_name_kubernetes_cannot_use_is_named(tree: Path) -> None:
    base = tree / "deploy/k8s/base"
    with_policies(base / "run.yaml", ["gpt2-bpe", "Llama_Char"])
    result = generate(base)
    assert result.returncode != 0
    assert "trainer.policies[1].name 'Llama_Char'" in result.stderr
    assert not (base / "trainers.yaml").read_text().count("Llama_Char")


def _render(tree: Path, overlay: str) -> list[dict[str, Any]]:
    rendered = subprocess.run(["kubectl", "kustomize", str(tree / "deploy/k8s/overlays" /
                                                           overlay)],
                              capture_output=True, text=True, timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def _references(docs: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "deploy/k8s/references.py"), "x", "-"],
                          input=yaml.safe_dump_all(docs), capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_policy_across_nodes_deploys_as_one_set_of_pods(tree: Path) -> None:
    base = tree / "deploy/k8s/base"
    shutil.copy2(tree / "configs/demo-nodes.yaml", base / "run.yaml")
    assert generate(base).returncode == 0
    docs = _render(tree, "gpu")
    objs = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    sts = objs[("StatefulSet", "trainer-llama-char")]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert objs[("StatefulSet", "trainer-gpt2-bpe")]["spec"]["replicas"] == 1
    service = objs[("Service", "trainer-llama-char")]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert objs[("PodDisruptionBudget", "trainer-llama-char")]["spec"]["minAvailable"] == 2
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["MUTUALRL_RDZV_ENDPOINT"]["value"] == \
        "trainer-llama-char-0.trainer-llama-char:29400"
    assert env["MUTUALRL_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    # One GPU set per pod: each pod's ranks, one per GPU it holds.
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env["MUTUALRL_NPROC"]["value"] == "1"
    # The pods share one run volume (each rank writes its shards of a checkpoint there).
    claim = next(v for v in pod["volumes"] if v["name"] == "run-dir")
    pvc = objs[("PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert "volumeClaimTemplates" not in sts["spec"]
    assert _references(docs).returncode == 0

    # What references.py holds a set to, each broken once.
    sts["spec"]["podManagementPolicy"] = "OrderedReady"
    env["MUTUALRL_RDZV_ENDPOINT"]["value"] = "trainer-llama-char:29400"
    objs[("PodDisruptionBudget", "trainer-llama-char")]["spec"]["minAvailable"] = 1
    del service["publishNotReadyAddresses"]
    out = _references(docs).stdout
    for problem in ("podManagementPolicy is not Parallel",
                    "MUTUALRL_RDZV_ENDPOINT=trainer-llama-char:29400 is not pod 0's name",
                    "no PodDisruptionBudget keeps all 2 pods",
                    "Service trainer-llama-char is not headless with publishNotReadyAddresses"):
        assert problem in out, out

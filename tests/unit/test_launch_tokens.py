"""Which token each process `mutualrl up` starts gets (#14 item 13): the services the run's
secret, each trainer its policy's token, a warm start none; the effective run YAML, which
every trainer reads, holds no secret, also when the user's YAML wrote one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mutualrl.common.auth import derive_token
from mutualrl.launch.up import make_launch_plan

SECRET = "launch-secret-3e"


def _write(tmp_path: Path, services: dict) -> Path:
    cfg = {"trainer": {"run_id": "tok", "output_dir": str(tmp_path / "runs"),
                       "services": {"token": "written-in-trainer"},
                       "policies": [{"name": "a", "preset": "gpt2-bpe"},
                                    {"name": "b", "preset": "llama-char"}]},
           "up": {"warm_start": {"b": {"preset": "llama-char"}}}, **services}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("where", ["env", "yaml"])
def test_each_process_gets_its_token_and_the_yaml_no_secret(tmp_path: Path, where: str) -> None:
    services = {"see": {"auth_token": SECRET}, "thl": {"auth_token": SECRET}} \
        if where == "yaml" else {}
    plan, _ = make_launch_plan(_write(tmp_path, services), "redis://127.0.0.1:6379/0",
                               SECRET if where == "env" else None)
    tokens = {s.name: s.env.get("MUTUALRL_AUTH_TOKEN") for s in plan.specs + plan.warm_start}
    assert tokens == {"see": SECRET, "thl": SECRET, "mwra": SECRET,
                      "trainer-a": derive_token(SECRET, "policy:a"),
                      "trainer-b": derive_token(SECRET, "policy:b"), "sft-b": ""}
    assert plan.secret == SECRET
    text = plan.config_path.read_text()
    assert SECRET not in text and "written-in-trainer" not in text


def test_services_with_different_secrets_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, {"see": {"auth_token": "one"}, "mwra": {"auth_token": "two"}})
    with pytest.raises(ValueError, match="auth_token differs"):
        make_launch_plan(path, "redis://127.0.0.1:6379/0", None)


def test_without_a_secret_nobody_gets_a_token(tmp_path: Path) -> None:
    plan, _ = make_launch_plan(_write(tmp_path, {}), "redis://127.0.0.1:6379/0", None)
    assert all("MUTUALRL_AUTH_TOKEN" not in s.env for s in plan.specs + plan.warm_start)
    assert plan.secret is None

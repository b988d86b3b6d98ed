"""What every rollout engine is: the `RolloutEngine` protocol the loop samples through, the
`Sample` it returns, and the helpers the engines share (prompt encoding, completion offsets,
sampling-knob checks, the tensors a serving engine loads, per-prompt seeds).

Conventions every engine keeps:

- The prompt and the completion are tokenized separately: the prompt is encoded on its own
  (with the tokenizer's default special tokens) and the completion is whatever tokens were
  sampled after it, so a BPE merge never crosses the prompt/completion boundary (`=`).
- `Sample.logprobs[t]` is `log_softmax(logits_t / T)[token_t]`: the temperature-scaled
  distribution *before* top-k / top-p / min-p truncation. With none of them (the default) this
  is exactly the sampling distribution; it is also what a trainer computes from a teacher-forced
  forward pass at the same temperature, so the two agree to float precision (with truncation,
  docs/algorithms.md says what the ratio and PRP's weights then miss). `temperature=0` means greedy
  decoding, with log-probs of the untempered (T=1) distribution.
- `Sample.text` is the decoded completion without special tokens and *includes* the stop
  string that ended it (the tokens that produced it were sampled and are trained on); if the
  token that completed a stop string carries more characters, they are kept too.
- `finish_reason` is "stop" when a stop string or the EOS token ended the completion, and
  "length" when the token budget ran out first (verifiers never credit "length").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the protocol needs no torch to be read (data imports Sample)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

ENGINES: tuple[str, ...] = ("hf", "sglang", "vllm")


@dataclass
class Sample:
    """One sampled completion of one prompt."""

    prompt_index: int
    """Index of the prompt in the `generate` call's list."""
    token_ids: list[int]
    """Completion tokens only (no prompt), including a final EOS when one was sampled."""
    text: str
    """Decoded completion (special tokens skipped), stop string included."""
    offsets: list[tuple[int, int]]
    """(start, end) character span in `text` of each completion token; zero-width for
    special tokens and for bytes that only complete a character in a later token."""
    logprobs: list[float]
    """Behaviour log-prob of each token: log_softmax(logits / T) before top-k / top-p / min-p
    truncation."""
    finish_reason: str
    """"stop" (stop string or EOS) or "length" (token budget exhausted)."""
    prompt_token_ids: list[int] = field(default_factory=list)
    """The prompt as the engine tokenized it (what a trainer must condition on)."""


class RolloutEngine(Protocol):
    """What the training loop needs from a sampler."""

    def generate(self, prompts: Sequence[str | Sequence[int]], n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None, seeds: list[int] | None = None, top_k: int = 0,
                 min_p: float = 0.0) -> list[list[Sample]]:
        """`n` samples for each prompt: result[i] holds prompt i's samples, in order. A prompt
        is the policy's rendering as token ids (mutualrl.trainer.data.chat), or a text to tokenize.

        `top_k` (0: off), `top_p` (1: off) and `min_p` (0: off) truncate the
        temperature-scaled distribution, in that order, before each draw; the samples'
        `logprobs` stay those of the untruncated one. `seeds` (one per prompt) makes each
        prompt's samples depend on its own seed only, not on which other prompts share the call
        (data-parallel ranks split a round's prompts); it replaces `seed`."""
        ...

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Make the engine sample from `model`'s current parameters (and hold its memory again
        after `release_memory`)."""
        ...

    def release_memory(self) -> None:
        """Free what the engine holds on the trainer's device until the next `sync_weights`
        (a no-op for an engine that shares the trainer's module)."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters of the engine's own work so far (the round's metrics carry them as
        `rollout/<name>`); empty where there are none."""
        ...


def prompt_seed(seed: int, round_k: int, index: int) -> int:
    """The sampling seed of prompt `index` of round `round_k`: a prompt's samples do not depend
    on which rank draws them, nor on the other prompts of the call."""
    return ((seed * 1_000_003 + round_k) * 1_000_003 + index) & (2**63 - 1)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | Sequence[int]) -> list[int]:
    """The prompt's token ids exactly as the engines encode them (trainers must match): a
    rendered prompt's ids (mutualrl.trainer.data.chat) as they are, a text through the tokenizer."""
    if not isinstance(prompt, str):
        return list(prompt)
    return list(tokenizer(prompt)["input_ids"])


def completion_offsets(tokenizer: PreTrainedTokenizerFast, token_ids: list[int]
                       ) -> tuple[str, list[tuple[int, int]]]:
    """Decoded text of `token_ids` and each token's character span in it.

    Each token spans from the end of the previous prefix's decoding to the end of its own, so
    the spans tile the text in order. A prefix that ends inside a multi-byte character decodes
    to a replacement char; such a token gets a zero-width span and the character is credited to
    the token that completes it.
    """
    if not token_ids:
        return "", []
    backend = tokenizer.backend_tokenizer
    prefixes = backend.decode_batch([token_ids[: j + 1] for j in range(len(token_ids))],
                                    skip_special_tokens=True)
    text = prefixes[-1]
    offsets: list[tuple[int, int]] = []
    start = 0
    for p in prefixes:
        if not text.startswith(p):
            p = p.rstrip("\ufffd")
            end = len(p) if text.startswith(p) else start
        else:
            end = len(p)
        end = max(start, min(end, len(text)))
        offsets.append((start, end))
        start = end
    return text, offsets


def check_request(prompts: Sequence[object], n: int, max_new_tokens: int,
                  seeds: Sequence[int] | None, top_p: float, top_k: int, min_p: float) -> None:
    """ValueError naming the first argument of a `generate` call out of range."""
    if n < 1 or max_new_tokens < 1:
        raise ValueError("n and max_new_tokens must be >= 1")
    check_truncation(top_p, top_k, min_p)
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError("seeds: one per prompt")


def check_truncation(top_p: float, top_k: int, min_p: float) -> None:
    """ValueError naming the first sampling truncation knob out of range."""
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: off), got {top_k}")
    if not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0: off), got {min_p}")



"""The `sft:` section of `mutualrl sft -c FILE`: one warm start (mutualrl.trainer.runtime.sft
runs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from mutualrl.common.config import Config
from mutualrl.trainer.config.run import PromptFormat
from mutualrl.trainer.config.task import TaskConfig


class SFTConfig(Config):
    """One warm-start run (`mutualrl sft`)."""

    preset: str | None = "gpt2-bpe"
    """Tiny built-in preset to start from (built offline on first use); or give `model_path`."""
    model_path: Path | None = None
    """A local Hugging Face model directory to start from instead of a preset."""
    cache_dir: Path = Path("runs/presets")
    """Where presets are built (the RL trainer uses <output_dir>/presets, `runs/presets`)."""
    task: TaskConfig = Field(default_factory=TaskConfig)
    """Task regime, skills (all skills evaluated) and digit counts."""
    strong_skills: list[str] = Field(default_factory=lambda: ["add", "rev"])
    """Skills trained on fresh problems; every other task skill is weak."""
    weak_pool: int = Field(4, ge=0)
    """Size of the fixed pool of weak-skill examples (docs/science-notes.md: 8 in the short regime;
    4 in the worked regime, where 32 leaked a weak skill through a similar format)."""
    weak_share: float = Field(0.03, ge=0, le=1)
    """Probability that a training example comes from the weak pool (docs/science-notes.md: 4%
    short, 3% worked)."""
    steps: int = Field(1500, ge=1)
    """Optimizer steps."""
    lr: float = Field(1e-3, gt=0)
    """AdamW peak learning rate (docs/science-notes.md: 1e-3 for warm start)."""
    warmup: int = Field(100, ge=0)
    """Steps of linear warm-up to `lr`; constant afterwards."""
    batch: int = Field(64, ge=1)
    """Examples per optimizer step."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global gradient norm."""
    seed: int = 0
    """Seeds the preset's initial weights, the data order and the weak pool."""
    threads: int = Field(1, ge=1)
    """torch intra-op threads (docs/science-notes.md timings are one thread per policy)."""
    dtype: str = "float32"
    """Training dtype: float32, bfloat16 or float16."""
    device: str = "cpu"
    """torch device."""
    out_dir: Path | None = None
    """Checkpoint directory; default runs/sft/<preset>-<regime>-s<seed>."""
    eval_per_skill: int = Field(250, ge=1)
    """Held-out problems per skill in the final evaluation (greedy decoding)."""
    eval_every: int = Field(0, ge=0)
    """Also evaluate every this many steps (on `eval_every_per_skill` problems); 0: only at the
    end. The curve goes into the eval json (useful to choose `steps`)."""
    eval_every_per_skill: int = Field(100, ge=1)
    """Held-out problems per skill in periodic evaluations."""
    progress: bool = True
    """Show a progress bar."""
    prompt_format: PromptFormat = "auto"
    """How prompts are rendered, as the RL policy's `prompt_format` (the warm start must see
    the prompts RL will give it)."""
    chat_template: Path | None = None
    """A Jinja chat template file replacing the tokenizer's, as the policy's."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra template variables, as the policy's."""

    @model_validator(mode="after")
    def _check(self) -> SFTConfig:
        if (self.preset is None) == (self.model_path is None):
            raise ValueError("give exactly one of preset, model_path")
        unknown = set(self.strong_skills) - set(self.task.skills)
        if unknown:
            raise ValueError(f"strong_skills {sorted(unknown)} are not task skills")
        if not self.strong_skills:
            raise ValueError("strong_skills must not be empty")
        return self

    @property
    def weak_skills(self) -> list[str]:
        """Task skills that are not strong."""
        return [s for s in self.task.skills if s not in self.strong_skills]

    def resolved_out_dir(self) -> Path:
        """`out_dir`, or the default name built from the start model and regime."""
        if self.out_dir is not None:
            return self.out_dir
        start = self.preset or Path(str(self.model_path)).name
        return Path("runs/sft") / f"{start}-{self.task.regime}-s{self.seed}"

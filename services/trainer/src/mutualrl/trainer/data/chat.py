"""Each policy's rendering of a problem: its own chat template, or plain text.

A problem crosses between policies as text (and chat messages), never as one policy's tokens:
every policy turns it into its own prompt tokens here, with its tokenizer's
`apply_chat_template(..., add_generation_prompt=True)` (or a template file of the policy's
config, with the policy's template arguments such as Qwen3's `enable_thinking`), or in `text`
mode by tokenizing the problem text as it is. The rollouts, the loss, SGT demonstrations and PRP
rows all condition on these tokens, and SFT warm starts render through the same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from mutualrl.trainer.config.run import PolicySettings, PromptFormat
from mutualrl.trainer.data.tasks import Prompt


class ChatTemplateError(ValueError):
    """A policy's chat template is missing or does not render a problem."""


class ContextLengthError(ValueError):
    """A policy's rendered prompt plus its completion budget exceeds its model's context."""


def messages_of(prompt: Prompt) -> list[dict[str, str]]:
    """The problem as chat messages (one user turn of its text when it has none)."""
    if prompt.messages:
        return [{"role": role, "content": content} for role, content in prompt.messages]
    return [{"role": "user", "content": prompt.text}]


class PromptRenderer:
    """One policy's prompts: problem -> the token ids its rollouts and loss condition on."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, policy: str,
                 prompt_format: PromptFormat = "auto",
                 chat_template: Path | str | None = None,
                 template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.template: str | None = None
        self.template_source = _tokenizer_template_file(tokenizer)
        """Where the template comes from, for messages: the file it was read from."""
        if chat_template is not None:
            path = Path(chat_template)
            if not path.is_file():
                raise ChatTemplateError(
                    f"policies[{policy}].chat_template: {path} is not a file (a Jinja template)")
            self.template = path.read_text(encoding="utf-8")
            self.template_source = f"policies[{policy}].chat_template {path}"
        has_template = self.template is not None or bool(getattr(tokenizer, "chat_template",
                                                                 None))
        if prompt_format == "chat" and not has_template:
            raise ChatTemplateError(
                f"policies[{policy}].prompt_format: chat, but the tokenizer has no "
                "chat_template and the policy gives no chat_template file")
        self.chat = prompt_format == "chat" or (prompt_format == "auto" and has_template)
        self.kwargs = dict(template_kwargs or {})

    def text(self, prompt: Prompt) -> str:
        """The rendered prompt as text (chat mode: the template's output)."""
        if not self.chat:
            return prompt.text
        try:
            out = self.tokenizer.apply_chat_template(
                messages_of(prompt), chat_template=self.template, add_generation_prompt=True,
                tokenize=False, **self.kwargs)
        except Exception as err:  # jinja2 errors, template raise_exception(), bad kwargs
            line = getattr(err, "lineno", None)
            where = f" (line {line})" if isinstance(line, int) else ""
            raise ChatTemplateError(
                f"policies[{self.policy}]: the chat template ({self.template_source}) does not "
                f"render problem {prompt.id!r}: {type(err).__name__}{where}: {err}") from err
        if not isinstance(out, str) or not out:
            raise ChatTemplateError(
                f"policies[{self.policy}]: the chat template ({self.template_source}) rendered "
                f"problem {prompt.id!r} to nothing")
        return out

    def ids(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids. A chat rendering already holds the template's special tokens
        (BOS included where the template writes it), so it is tokenized without adding any, as
        `apply_chat_template(tokenize=True)` does; plain text gets the tokenizer's usual
        special tokens."""
        if not self.chat:
            return list(self.tokenizer(prompt.text)["input_ids"])
        return list(self.tokenizer(self.text(prompt), add_special_tokens=False)["input_ids"])

    def many(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        return [self.ids(p) for p in prompts]

    def lengths(self, prompts: Sequence[Prompt], batch: int = 1024) -> list[int]:
        """Each prompt's length in tokens (as `ids` counts it), tokenized in batches."""
        out: list[int] = []
        for i in range(0, len(prompts), batch):
            part = prompts[i:i + batch]
            if self.chat:
                enc = self.tokenizer([self.text(p) for p in part], add_special_tokens=False)
            else:
                enc = self.tokenizer([p.text for p in part])
            out += [len(ids) for ids in enc["input_ids"]]
        return out


def _tokenizer_template_file(tokenizer: Any) -> str:
    """The file a tokenizer's own chat template was read from, as well as it can be told."""
    where = getattr(tokenizer, "name_or_path", "") or ""
    root = Path(where) if where else None
    if root is not None and root.is_dir():
        for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
            if (root / name).is_file():
                return f"the tokenizer's chat_template in {root / name}"
    return f"the chat_template of tokenizer {where or type(tokenizer).__name__}"


def renderer_for(tokenizer: PreTrainedTokenizerBase, policy: PolicySettings) -> PromptRenderer:
    """The renderer of a policy's config."""
    return PromptRenderer(tokenizer, policy.name, policy.prompt_format, policy.chat_template,
                          policy.chat_template_kwargs)

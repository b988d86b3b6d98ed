"""Each policy renders a problem with its own chat template (or as plain text), token for token
as `apply_chat_template(..., add_generation_prompt=True)` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chat_policies import chat_policy

from mutualrl.trainer.data.chat import ChatTemplateError, PromptRenderer
from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.runtime.presets import load_policy

PROBLEM = Prompt(id="p", skill="add", text="add:3+4=", answer="7",
                 messages=(("system", "sum it"), ("user", "add:3+4=")))


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("chat")
    return {name: load_policy(chat_policy(name, root / "presets", root / name))[1]
            for name in ("gpt2-bpe", "llama-char")}


def test_each_policy_renders_with_its_own_template(tokenizers: dict[str, Any]) -> None:
    msgs = [{"role": r, "content": c} for r, c in PROBLEM.messages]
    ids = {}
    for name, tok in tokenizers.items():
        r = PromptRenderer(tok, name)
        assert r.chat
        want = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                       return_dict=False)
        ids[name] = r.ids(PROBLEM)
        assert ids[name] == list(want)
    a, b = tokenizers["gpt2-bpe"], tokenizers["llama-char"]
    assert a.decode(ids["gpt2-bpe"]).endswith("<|im_start|>assistant\n")
    # The template writes BOS; tokenizing the rendering must not add a second one.
    assert ids["llama-char"][:2] != [b.bos_token_id] * 2
    assert ids["llama-char"][0] == b.bos_token_id


def test_text_mode_tokenizes_the_problem_as_it_is(tokenizers: dict[str, Any]) -> None:
    tok = tokenizers["gpt2-bpe"]
    r = PromptRenderer(tok, "a", prompt_format="text")
    assert r.ids(PROBLEM) == list(tok("add:3+4=")["input_ids"])


def test_template_file_and_kwargs(tokenizers: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
                    "{% if not enable_thinking %}<no-think>{% endif %}")
    r = PromptRenderer(tokenizers["gpt2-bpe"], "a", chat_template=path,
                       template_kwargs={"enable_thinking": False})
    assert r.text(PROBLEM) == "[sum it][add:3+4=]<no-think>"


def test_a_template_that_does_not_render_names_the_policy(tokenizers: dict[str, Any],
                                                          tmp_path: Path) -> None:
    path = tmp_path / "bad.jinja"
    path.write_text("{{ raise_exception('system turns are not supported') }}")
    r = PromptRenderer(tokenizers["gpt2-bpe"], "qwen", chat_template=path)
    with pytest.raises(ChatTemplateError, match=r"policies\[qwen\].*does not render"):
        r.ids(PROBLEM)
    with pytest.raises(ChatTemplateError, match=r"policies\[qwen\].chat_template"):
        PromptRenderer(tokenizers["gpt2-bpe"], "qwen", chat_template=tmp_path / "missing")
    tok = tokenizers["llama-char"]
    saved, tok.chat_template = tok.chat_template, None
    try:
        with pytest.raises(ChatTemplateError, match=r"policies\[llama\].prompt_format"):
            PromptRenderer(tok, "llama", prompt_format="chat")
        assert not PromptRenderer(tok, "llama").chat  # auto: plain text without a template
    finally:
        tok.chat_template = saved


def test_engines_sample_from_the_rendering_they_are_given(tokenizers: dict[str, Any],
                                                          tmp_path: Path) -> None:
    from mutualrl.trainer.engines.hf import HFEngine
    from mutualrl.trainer.runtime.presets import ensure_preset

    model, tok = load_policy(ensure_preset("llama-char", tmp_path))
    tok.chat_template = tokenizers["llama-char"].chat_template
    ids = PromptRenderer(tok, "b").ids(PROBLEM)
    text = PromptRenderer(tok, "b", prompt_format="text")
    engine = HFEngine(model, tok)
    by_ids, by_text = engine.generate([ids, "add:3+4="], n=2, max_new_tokens=3, seed=1)
    assert all(y.prompt_token_ids == ids for y in by_ids)  # the rendering, as it is
    # A text is tokenized as text mode renders it.
    assert all(y.prompt_token_ids == text.ids(PROBLEM) for y in by_text)

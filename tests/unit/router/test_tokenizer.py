"""The torch-free tokenizer agrees with transformers, chat template included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.tokenizer import ChatTemplateError, FinalMessageError, ModelTokenizer, SpecialTokens

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Hi 😀"},
        {"role": "assistant", "content": "Hello! 世界"},
        {"role": "user", "content": "Tell me a joke.\nA short one."},
    ],
]


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tokenizer, hf_tokenizer, messages, add_generation_prompt) -> None:
    expected_text = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tokenizer.apply_chat_template(messages, add_generation_prompt) == expected_text
    expected_ids = hf_tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    if isinstance(expected_ids, dict):  # transformers versions differ in what tokenize=True returns
        expected_ids = expected_ids["input_ids"]
    assert tokenizer.encode_chat(messages, add_generation_prompt) == list(expected_ids)


OPEN_ENDED = [
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  Well, \n"}],  # stripped by some
]


@pytest.mark.parametrize("messages", OPEN_ENDED)
def test_continue_final_message_matches_transformers(tokenizer, hf_tokenizer, messages) -> None:
    expected = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False, continue_final_message=True
    )
    assert tokenizer.apply_chat_template(messages, False, continue_final_message=True) == expected
    assert not expected.endswith(tokenizer.special.eos_token or "<none>")


def test_template_variables_match_transformers(tokenizer, hf_tokenizer) -> None:
    """Extra variables reach the template as transformers passes them (a request's chat_template_kwargs)."""
    template = "{% if shout %}{{ messages[0].content | upper }}{% else %}{{ messages[0].content }}{% endif %}"
    messages = [{"role": "user", "content": "quiet"}]
    for shout in (True, False):
        expected = hf_tokenizer.apply_chat_template(
            messages, tokenize=False, chat_template=template, shout=shout
        )
        assert _tiny(template).apply_chat_template(messages, shout=shout) == expected


def test_continue_final_message_refusals() -> None:
    tok = _tiny("{% for m in messages %}[{{ m.content | trim }}]{% endfor %}")
    with pytest.raises(FinalMessageError, match="last message with text"):
        tok.apply_chat_template([{"role": "assistant", "content": "  "}], False, continue_final_message=True)
    assert tok.apply_chat_template([{"role": "assistant", "content": " go "}], False, True) == "[go"
    hiding = _tiny("{% for m in messages %}[hidden]{% endfor %}")
    with pytest.raises(FinalMessageError, match="does not render"):
        hiding.apply_chat_template(
            [{"role": "assistant", "content": "go"}], False, continue_final_message=True
        )


@pytest.mark.parametrize("text", ["Hello world", "  spaces  ", "世界 😀", "<|im_start|>user\nhi<|im_end|>"])
def test_encode_decode_match_transformers(tokenizer, hf_tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text)
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert tokenizer.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids)


def test_special_tokens_and_eos(tokenizer) -> None:
    assert tokenizer.special.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_ids == (2,)
    assert tokenizer.vocab_size == 49152
    assert tokenizer.token_text(2) == "<|im_end|>"


def _tiny(template: str) -> ModelTokenizer:
    from tokenizers import Tokenizer, models

    return ModelTokenizer(
        Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), SpecialTokens(), template
    )


def test_hf_template_features() -> None:
    template = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "{% generation %}{{ m.content | tojson }}{% endgeneration %}{% if loop.index > 1 %}{% break %}"
        "{% endif %}{% endfor %}{{ strftime_now('%Y')[:2] }}"
    )
    tok = _tiny(template)
    assert tok.apply_chat_template([{"role": "user", "content": "é"}, {"role": "user", "content": "x"}]) == (
        '"é""x"20'
    )
    with pytest.raises(ChatTemplateError, match="no tools"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_template_sandbox_and_errors() -> None:
    with pytest.raises(ChatTemplateError, match="compile"):
        _tiny("{% for %}").apply_chat_template([])
    with pytest.raises(ChatTemplateError):
        _tiny("{{ messages.__class__.__mro__ }}").apply_chat_template([])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ModelTokenizer(_tiny("").backend, SpecialTokens(), None).apply_chat_template([])


def test_template_sources(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    config = {"eos_token": {"content": "<|im_end|>"}, "chat_template": [{"name": "default", "template": "D"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = ModelTokenizer.from_dir(tmp_path)
    assert tok.chat_template == "D" and tok.special.eos_token == "<|im_end|>" and tok.eos_token_ids == (0, 2)
    (tmp_path / "chat_template.jinja").write_text("J")
    assert ModelTokenizer.from_dir(tmp_path).chat_template == "J"


def test_missing_tokenizer_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        ModelTokenizer.from_dir(tmp_path)

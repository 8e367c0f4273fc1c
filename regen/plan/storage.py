"""The disk that offline hidden states need, from a model's ``config.json`` and a token count.

Offline hidden states (``hidden_state_storage``), what a drafter (EAGLE-3, DFlash) trains on when
they are extracted ahead of training rather than online::

    bytes = tokens x hidden_size x (aux_layers + 1) x bytes_per_value

``hidden_size`` and the dtype come from the model's ``config.json`` (``text_config`` for a
multimodal model such as Qwen3.5/3.6; ``read_model_config``); ``aux_layers`` is 3 by default
(EAGLE-3 as SpecForge and speculators capture it: three auxiliary layers plus the final hidden
state). The tokens are those of the whole training set (``training_set_tokens``), because
training stores a hidden state for every token of every sample.
The seed: 914,000 x 2,500 tokens x 5,120 (Qwen3.6-27B) x 4 x 2 bytes (bf16) = 93.6 TB (85.1 TiB),
the "~90 TB" that forced online training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dqa.errors import InputError, UsageError
from dqa.regen.config import DEFAULT_AUX_LAYERS

# Bytes per value of a hidden state by config dtype; FP8/INT checkpoints still compute (and so
# store) activations in their compute dtype, named by torch_dtype/dtype (bfloat16 for them all).
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What ``config.json`` says about the hidden states: width, depth and dtype."""

    config: str
    hidden_size: int
    num_hidden_layers: int | None
    dtype: str
    dtype_from_config: bool
    bytes_per_value: int


def read_model_config(path: str | Path) -> ModelShape:
    """Read ``hidden_size``, ``num_hidden_layers`` and ``torch_dtype``/``dtype`` from a model's
    ``config.json`` (``path``: the model folder or the file). A multimodal config (Qwen3.5/3.6,
    ``*ForConditionalGeneration``) keeps them in ``text_config``, which wins over the top level.
    A config without a dtype is taken as bfloat16 (said in ``dtype_from_config``).

    Raises ``InputError`` naming the file and the missing or bad field.
    """
    import json

    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"{file}: no config.json (--model takes the model folder or its config.json)")
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{file}: not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{file}: expected a JSON object (a transformers config.json)")
    scopes = [cfg[k] for k in ("text_config", "llm_config", "language_config") if isinstance(cfg.get(k), dict)] + [cfg]

    def first(*keys: str) -> tuple[Any, str | None]:
        for scope in scopes:
            for k in keys:
                if scope.get(k) is not None:
                    return scope[k], k
        return None, None

    hidden, _ = first("hidden_size", "n_embd", "d_model")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
        raise InputError(f"{file}: no positive integer hidden_size (top level or text_config); got {hidden!r}")
    layers, _ = first("num_hidden_layers", "n_layer", "num_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        layers = None
    dtype, _ = first("torch_dtype", "dtype")
    from_config = isinstance(dtype, str) and bool(dtype)
    name = str(dtype).removeprefix("torch.").lower() if from_config else "bfloat16"
    if name not in DTYPE_BYTES:
        raise InputError(f"{file}: dtype {dtype!r} is not a float type dqa knows ({', '.join(sorted(set(DTYPE_BYTES)))})")
    return ModelShape(str(file), hidden, layers, name, from_config, DTYPE_BYTES[name])


@dataclass(frozen=True)
class HiddenStateStorage:
    """The disk an offline hidden-state extraction needs: ``tokens x hidden_size x layers x
    bytes_per_value`` bytes, ``layers = aux_layers + 1`` (the final hidden state too).
    ``tokens_basis`` says which tokens were counted."""

    tokens: float
    tokens_basis: str
    hidden_size: int
    num_hidden_layers: int | None
    aux_layers: int
    layers: int
    dtype: str
    dtype_from_config: bool
    bytes_per_value: int
    bytes: float
    terabytes: float
    tebibytes: float
    config: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def summary(self) -> str:
        """One line for people."""
        dtype = self.dtype if self.dtype_from_config else f"{self.dtype}, assumed: config.json names no dtype"
        return (
            f"offline hidden states for drafter training: {human_bytes(self.bytes)} = {self.tokens:,.0f} tokens x "
            f"hidden {self.hidden_size:,} x ({self.aux_layers} aux layers + 1) x {self.bytes_per_value} bytes ({dtype}); "
            f"tokens: {self.tokens_basis}"
        )


def human_bytes(n: float) -> str:
    """Decimal and binary units side by side: ``93.6 TB (85.1 TiB)``."""
    dec = next(((n / 10**e, u) for e, u in ((15, "PB"), (12, "TB"), (9, "GB"), (6, "MB"), (3, "kB")) if n >= 10**e), (n, "B"))
    binary = next(((n / 2**e, u) for e, u in ((50, "PiB"), (40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")) if n >= 2**e), (n, "B"))
    return f"{dec[0]:,.1f} {dec[1]} ({binary[0]:,.1f} {binary[1]})"


def hidden_state_storage(shape: ModelShape, tokens: float, tokens_basis: str, aux_layers: int = DEFAULT_AUX_LAYERS) -> HiddenStateStorage:
    """``tokens x hidden_size x (aux_layers + 1) x bytes_per_value`` for ``shape``'s model.

    Raises ``UsageError`` for negative tokens or aux layers, or more aux layers than the model has.
    """
    if aux_layers < 0:
        raise UsageError(f"--aux-layers {aux_layers}: must be >= 0 (0: the final hidden state only)")
    if shape.num_hidden_layers is not None and aux_layers > shape.num_hidden_layers:
        raise UsageError(f"--aux-layers {aux_layers}: the model has only {shape.num_hidden_layers} layers ({shape.config})")
    if tokens < 0:
        raise UsageError(f"--storage-tokens {tokens:,.0f}: must be >= 0")
    layers = aux_layers + 1
    total = float(tokens) * shape.hidden_size * layers * shape.bytes_per_value
    return HiddenStateStorage(
        tokens=float(tokens), tokens_basis=tokens_basis, hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers, aux_layers=aux_layers, layers=layers, dtype=shape.dtype,
        dtype_from_config=shape.dtype_from_config, bytes_per_value=shape.bytes_per_value, bytes=total,
        terabytes=total / 1e12, tebibytes=total / 2**40, config=shape.config,
    )  # fmt: skip


def training_set_tokens(scan: tuple[int, int] | None, samples: int, avg_output_tokens: float) -> tuple[float, str]:
    """The tokens of the training set after regeneration, and how they were counted.

    With a scan (``scan_tokens``): scanned - replaced outputs + samples x avg output tokens (the new
    outputs). Without one: samples x avg output tokens only (the regenerated outputs; prompts and
    the samples kept as they are not counted), the seed's own arithmetic.
    """
    new = samples * float(avg_output_tokens)
    if scan is None:
        return new, (
            f"regenerated outputs only, {samples:,} samples x {avg_output_tokens:,.0f} avg output tokens (no scan: prompts "
            "and kept samples not counted; give --findings DIR or --storage-tokens for the whole training set)"
        )
    scanned, replaced = scan
    return max(0.0, scanned - replaced + new), (
        f"the training set after regeneration (estimate): {scanned:,} scanned - {replaced:,} replaced outputs "
        f"+ {samples:,} x {avg_output_tokens:,.0f} regenerated"
    )


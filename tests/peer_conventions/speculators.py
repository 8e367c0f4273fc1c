"""speculators' rule: ``_render_boundary_rows`` (vllm-project/speculators,
``src/speculators/data_generation/preprocessing.py``).

One row per assistant turn ``j``: the ids of ``render(conv[:j+1])``, masked from the boundary,
the length of the ids of ``render(conv[:j], add_generation_prompt=True)`` when those are a
prefix, else their common prefix with the full render (a pre-filled ``<think>`` scaffold), to
the end.
"""

from __future__ import annotations

from .models import Model


def speculators(model: Model, messages: list[dict], max_length: int = 100_000) -> list[tuple[list[int], list[int]]]:
    """speculators' rule (see the module docstring): one row per assistant turn, masked from the render boundary."""
    rows = []
    for j, turn in enumerate(messages):
        if turn["role"] != "assistant" or j == 0:
            continue
        prompt = model.encode(model.render(messages[:j], add_generation_prompt=True))
        full = model.encode(model.render(messages[: j + 1]))
        if full[: len(prompt)] == prompt:
            boundary = len(prompt)
        else:
            boundary = next((k for k, (x, y) in enumerate(zip(prompt, full)) if x != y), min(len(prompt), len(full)))
        mask = [0] * boundary + [1] * (len(full) - boundary)
        rows.append((full[:max_length], mask[:max_length]))
    return rows

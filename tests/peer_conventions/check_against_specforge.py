"""Check ``specforge.py``'s GLM and MiniMax rules token for token against SpecForge's own parser.

Not part of the test suite (it needs a SpecForge checkout, torch and pydantic):

    python tests/peer_conventions/check_against_specforge.py /path/to/SpecForge

Loads ``specforge/data/template.py`` and ``parse.py`` from the checkout as a standalone package
(SpecForge's ``__init__`` imports its training stack), builds the fixture conversations of
``tests/test_glm_minimax.py`` and parses each with SpecForge's ``GLMParser`` (its ``glm-5.2``
registry entry) and ``GeneralParser`` (MiniMax: pull request #534's ``minimax-m2.7`` strings, from
``SPECFORGE``/``SYSTEM_PROMPT``), and compares ``input_ids`` and ``loss_mask`` with this package's
``specforge``. Prints the number of identical rows; exits 1 at the first difference.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import types
import warnings
from pathlib import Path


def load_specforge_data(checkout: Path):
    """SpecForge's ``specforge.data.parse`` and ``specforge.data.template`` modules, loaded without its ``__init__``."""
    pkg = types.ModuleType("sfdata")
    pkg.__path__ = [str(checkout / "specforge" / "data")]
    sys.modules["sfdata"] = pkg
    mods = {}
    for name in ("template", "parse"):
        spec = importlib.util.spec_from_file_location(f"sfdata.{name}", checkout / "specforge" / "data" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"sfdata.{name}"] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods["parse"], mods["template"]


def main(checkout: Path) -> int:
    tests = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(tests))
    warnings.filterwarnings("ignore")
    parse, template = load_specforge_data(checkout)
    from peer_conventions import SPECFORGE, load_model, specforge, tokenizer_folder
    from peer_conventions.specforge import SYSTEM_PROMPT
    from test_glm_minimax import planted

    header, eot, _ = SPECFORGE["minimax-m3"]
    minimax = template.ChatTemplate(assistant_header=header, user_header="]~b]user\n", system_prompt=SYSTEM_PROMPT["minimax-m3"],
                                    end_of_turn_token=eot)
    n = 0
    with tempfile.TemporaryDirectory() as root:
        for name, parser_cls, tmpl in (("glm-5.2", parse.GLMParser, template.TEMPLATE_REGISTRY.get("glm-5.2")),
                                       ("minimax-m3", parse.GeneralParser, minimax)):
            model = load_model(name, str(tokenizer_folder(name, Path(root))))
            parser = parser_cls(model.hf, tmpl)
            for msgs, max_length, _ in planted(name, model):
                ids, mask = parser.parse(msgs, max_length=max_length)
                mine = specforge(model, msgs, max_length=max_length)
                if ids.tolist() != mine[0] or mask.tolist() != mine[1]:
                    print(f"{name}: row {n} differs from SpecForge's parser")
                    return 1
                n += 1
    print(f"{n} rows identical to SpecForge's parsers")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

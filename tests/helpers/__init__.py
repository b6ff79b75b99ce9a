"""What the tests share, in one importable place: `from tests.helpers import tiny`.

(pyproject.toml's `[tool.pytest.ini_options] pythonpath` puts the repository root on
sys.path, so these import the same way from every test folder.)

- `tiny`: tiny random-weight checkpoint folders (Hugging Face layout, byte-level
  tokenizer, written directly) and routing programs over them; `make_pair` builds the
  session-wide `pair` fixture (tests/conftest.py). Also the tuner tests' one-model builder.
- `checkpoints`: tiny random models of each family as `transformers` builds them, their
  configs, a tiny BPE vocabulary, writers of checkpoint folders and of GGUF files laid out
  as llama.cpp's converter lays them out, and a slow reference BPE encoder (loader tests).
- `hf_parity`: float64 `transformers` models for the engine's logit-parity tests.
- `serving`: the real HTTP server in a thread of the test process, and clients for it;
  `tokenrouter serve` as a subprocess (its command, waiting for it, stopping it).
- `ports`: a free loopback port.
- `fitting`: programs, prompt files and learnable pairs for the fit tests.
- `intx`: the integer kernels' activation quantisation, reproduced in torch.
- `cdp`: headless Chromium over the DevTools protocol (the eval report's browser test).

`REPO` is the repository's root (for `examples/`, `data/`, and a subprocess's working folder),
wherever the test that needs it sits.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

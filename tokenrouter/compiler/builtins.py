"""Names the language knows without a declaration: built-in models and feature functions.

`BUILTIN_MODELS` is the one list of built-in model names the checker accepts (the loader in
`tokenrouter.runtime.loader.builtin.registry` knows how to make each); any other model path must
look like a path.
"""

from __future__ import annotations

from tokenrouter import engines
from tokenrouter.compiler.features import called

LANGUAGE_VERSION = 1

BUILTIN_MODELS: tuple[str, ...] = ("smollm2-135m", "smollm2-135m-small", "bench-small", "bench-large",
                                   "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")
# The weight format a built-in model gets where neither the program (`quant = ...`) nor the
# command line (`--quant`) says: a quantised file runs on its own blocks, never as a float copy.
DEFAULT_QUANT: dict[str, str] = {"qwen2.5-coder-0.5b-instruct": "native", "qwen2.5-coder-1.5b-instruct": "native"}

ROLES = ("small", "large", "member")
DTYPES = ("float32", "float64", "bfloat16", "float16")
QUANTS = ("none", "native", "int4", "int8")  # weight formats (runtime/kernels/quant.py)
ACTIVATIONS = ("relu", "gelu", "silu", "tanh")
ROUTER_ARCHS = ("mlp", "citer", "r2r")  # router networks' tensor layouts: compiler/weights/nets.py
ENSEMBLE_MODES = ("average", "mixture")

# The step features a file writes as functions (declared in features/catalog.py), with
# their signatures as users write them. Scalars are usable in a condition, vectors only as
# a router network's inputs; `bernoulli` is a function of the request, not of a step.
SCALAR_FEATURES = {f.name: f.signature() for f in called() if f.scalar}
VECTOR_FEATURES = {f.name: f.signature() for f in called() if not f.scalar}
FUNCTIONS = {**SCALAR_FEATURES, "bernoulli": "bernoulli(P, SEED)", **VECTOR_FEATURES}

# Router inputs, written inside `router NAME on MODEL = "file" { inputs = [...] }`: vectors, then scalars.
ROUTER_INPUTS = {f.name: f.input_signature() for f in sorted(called(), key=lambda f: f.scalar)}

VISIT_TOKENS = "visit_tokens"

# serving keys: key -> takes a model target ("model") or applies to the whole program ("global")
SERVE_KEYS = {
    "batch": "model",
    "max_wait": "model",
    "place": "model",
    "threads": "model",
    "graph_batch_sizes": "global",
    "graph_tokens": "global",
}


def default_quant(model_path: str, engine: str = engines.DEFAULT) -> str:
    """The weight format of a model whose format nobody chose: `DEFAULT_QUANT` where the
    model's engine runs that format, none otherwise (the checkpoint's own weights)."""
    quant = DEFAULT_QUANT.get(model_path, "none")
    return quant if quant in engines.capabilities(engine).quants else "none"


def looks_like_path(text: str) -> bool:
    """A model reference that is meant as a file or folder, not a built-in name."""
    return ("/" in text or "\\" in text or text.startswith((".", "~"))
            or text.lower().endswith((".gguf", ".safetensors")))

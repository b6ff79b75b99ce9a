"""Router networks and head rows: safetensors only, shapes checked against the declared layout."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch
from safetensors.torch import save_file

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.compiled import load_routers
from tokenrouter.compiler.weights.nets import RouterWeightsError, load_head, load_router_net

LAYOUT = (ir.InputHidden(-1, 6), ir.InputTokenEmbedding(6), ir.InputTopkLogits(3))  # width 15


def _router(path, **kw) -> ir.RouterNet:
    return ir.RouterNet("r", "slm", str(path), inputs=kw.pop("inputs", LAYOUT), **kw)


def _mlp(path, sizes, **extra):
    t = {}
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        t[f"layers.{i}.weight"] = torch.randn(b, a)
        t[f"layers.{i}.bias"] = torch.randn(b)
    t.update(extra)
    save_file(t, str(path))


def test_loads_and_computes_the_declared_mlp(tmp_path):
    """Against the formula written out by hand, for each activation and both output kinds."""
    path = tmp_path / "r.safetensors"
    x = torch.randn(5, 15, dtype=torch.float64)
    for act, fn in [("relu", torch.relu), ("tanh", torch.tanh), ("silu", lambda z: z * torch.sigmoid(z)),
                    ("gelu", lambda z: 0.5 * z * (1 + torch.erf(z / math.sqrt(2))))]:
        for out, index in [(1, 0), (3, 2)]:
            _mlp(path, [15, 7, out])
            from safetensors.torch import load_file
            w = {k: v.double() for k, v in load_file(str(path)).items()}
            h = fn(x @ w["layers.0.weight"].T + w["layers.0.bias"])
            z = h @ w["layers.1.weight"].T + w["layers.1.bias"]
            expected = torch.sigmoid(z[:, 0]) if out == 1 else torch.softmax(z, -1)[:, index]
            net = load_router_net(_router(path, activation=act, output_index=index), dtype=torch.float64)
            torch.testing.assert_close(net(x), expected)
    x[1, 4] = float("nan")
    x[2, 0] = float("inf")
    got = net(x)
    assert torch.isnan(got[1]) and torch.isnan(got[2]) and not torch.isnan(got[0])


@pytest.mark.parametrize("sizes, extra, message", [
    ([14, 7, 1], {}, "tensor 'layers.0.weight' has shape [7, 14], expected [7, 15]"),
    ([15, 7, 1], {"layers.1.bias": torch.zeros(2)}, "tensor 'layers.1.bias' has shape [2], expected [1]"),
    ([15, 7, 1], {"norm.weight": torch.zeros(2)}, "unexpected tensor 'norm.weight'"),
    ([15, 7, 1], {"layers.3.weight": torch.zeros(1, 1)}, "layers must be numbered 0..n-1, found [0, 1, 3]"),
    ([15, 7, 4], {}, "output_index 5 is out of range for 4 outputs"),
])
def test_shape_mismatch_names_file_tensor_and_shapes(tmp_path, sizes, extra, message):
    path = tmp_path / "r.safetensors"
    _mlp(path, sizes, **extra)
    with pytest.raises(RouterWeightsError) as err:
        load_router_net(_router(path, output_index=5 if sizes[-1] == 4 else 0))
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_missing_bias_and_missing_file(tmp_path):
    path = tmp_path / "r.safetensors"
    save_file({"layers.0.weight": torch.zeros(1, 15)}, str(path))
    with pytest.raises(RouterWeightsError, match="tensor 'layers.0.bias' is missing"):
        load_router_net(_router(path))
    with pytest.raises(RouterWeightsError, match="no such weights file"):
        load_router_net(_router(tmp_path / "nope.safetensors"))


def test_unknown_widths_are_refused(tmp_path):
    path = tmp_path / "r.safetensors"
    _mlp(path, [15, 1])
    with pytest.raises(RouterWeightsError, match="input widths of model 'slm' are unknown"):
        load_router_net(_router(path, inputs=(ir.InputHidden(-1, 0),)))


class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_is_never_loaded(tmp_path):
    """A pickle (torch.save) posing as weights is refused without being unpickled."""
    marker = tmp_path / "unpickled"
    path = tmp_path / "r.safetensors"
    with open(path, "wb") as f:
        pickle.dump({"layers.0.weight": _Boom(str(marker))}, f)
    with pytest.raises(RouterWeightsError, match="not a readable safetensors file"):
        load_router_net(_router(path))
    torch.save({"layers.0.weight": torch.zeros(1, 15)}, str(tmp_path / "t.pt"))
    with pytest.raises(RouterWeightsError, match="not a readable safetensors file"):
        load_router_net(_router(tmp_path / "t.pt"))
    assert not marker.exists()


def test_head_rows(tmp_path):
    path = tmp_path / "h.safetensors"
    head = ir.HeadLogit("slm", str(path), sigmoid=True)
    save_file({"weight": torch.ones(1, 8), "bias": torch.tensor([0.5])}, str(path))
    w, b = load_head(head, hidden_size=8)
    assert w.shape == (8,) and float(b) == 0.5
    with pytest.raises(RouterWeightsError, match=r"tensor 'weight' has shape \[1, 8\], expected \[16\] or \[1, 16\]"):
        load_head(head, hidden_size=16)
    save_file({"weight": torch.ones(8), "bias": torch.zeros(2)}, str(path))
    with pytest.raises(RouterWeightsError, match=r"tensor 'bias' has shape \[2\], expected \[1\]"):
        load_head(head)


def test_load_routers_checks_weights_before_serving(tmp_path):
    """The error surfaces at load_routers, naming the file, before any step runs."""
    path = tmp_path / "r.safetensors"
    _mlp(path, [16, 1])
    program = ir.Program(source="x.route", language_version=1, models=(ir.Model("slm", "a"), ir.Model("llm", "b")),
                         start="slm", routers=(_router(path),),
                         transitions=(ir.Transition("slm", "llm", ir.Compare(">", ir.RouterProb("r"), ir.Const(0.5)),
                                                    "rewrite"),))
    with pytest.raises(RouterWeightsError, match=r"r.safetensors: tensor 'layers.0.weight' has shape \[1, 16\], "
                                                 r"expected \[1, 15\]"):
        load_routers(program)
    _mlp(path, [15, 1])
    routers = load_routers(program)
    from tokenrouter.protocol.step import StepTensors
    b = 2
    step = StepTensors(logits=torch.randn(b, 8), sampled=torch.zeros(b, dtype=torch.int64),
                       visit_tokens=torch.ones(b, dtype=torch.int64), position=torch.zeros(b, dtype=torch.int64),
                       request_seed=torch.zeros(b, dtype=torch.int64), hidden={-1: torch.randn(b, 7)},
                       token_embedding=torch.randn(b, 6))
    with pytest.raises(ValueError, match="router input has width 16, its declared layout 15"):
        routers["slm"].route(step)


# ------------------------------------------------------------ the papers' network kinds

from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from safetensors import safe_open  # noqa: E402

from tests.compiler.conftest import (S, SETTINGS, check_coverage, check_route_batch, make_batch,  # noqa: E402
                                    write_random_weights)
from tokenrouter.compiler.weights import nets as rn  # noqa: E402
from tokenrouter.compiler.backend.interpreter import Interpreter  # noqa: E402
from tokenrouter.runtime.loader import model_facts


def _kind_program(arch: str) -> ir.Program:
    f = f"{arch}.route"
    models = (ir.Model("slm", "tiny-small", role="small", span=S(f, 2)),
              ir.Model("llm", "tiny-large", role="large", span=S(f, 3)))
    if arch == "co_llm":
        head = ir.HeadLogit("slm", "weights/defer.safetensors", sigmoid=True, span=S(f, 5))
        when = ir.Compare(">", head, ir.Const(0.5))
        routers = ()
    else:
        inputs = {"r2r": (ir.InputHidden(-1, 16), ir.InputTokenEmbedding(16), ir.InputTopkLogits(5),
                          ir.InputScalar(ir.Entropy("slm", True))),
                  "citer": (ir.InputHidden(-1, 12),)}[arch]
        routers = (ir.RouterNet(arch, "slm", f"weights/{arch}.safetensors", inputs,
                                "gelu" if arch == "r2r" else "relu", span=S(f, 4), arch=arch),)
        when = ir.Compare(">=" if arch == "r2r" else "<", ir.RouterProb(arch), ir.Const(0.5))
    return ir.Program(source=f, language_version=1, models=models, start="slm", routers=routers,
                      transitions=(ir.Transition("slm", "llm", when, "rewrite", S(f, 7)),),
                      bounds=(ir.VisitBound("llm", 1, 1, "slm", S(f, 8)),))


@pytest.mark.parametrize("arch", ["r2r", "citer", "co_llm"])
def test_each_kind_generated_route_matches_interpreter(arch, tmp_path):
    """Hypothesis: the compiled, batched route of each network kind against the reference
    interpreter's per-request formula (float64, on float32-valued random batches)."""
    program = _kind_program(arch)
    write_random_weights(program, tmp_path)
    interp = Interpreter(program, base_dir=str(tmp_path))
    routers = load_routers(program, dtype=torch.float64, base_dir=str(tmp_path))
    seen: Counter = Counter()
    total = [0, 0]

    @settings(max_examples=150, **SETTINGS)
    @given(w=st.integers(0, 1), b=st.integers(1, 48), seed=st.integers(0, 2**32 - 1))
    def run(w, b, seed):
        writer = program.writers()[w]
        step, rows = make_batch(program, writer, routers[writer].needs, np.random.default_rng(seed), b)
        total[0] += check_route_batch(program, interp, routers, writer, step, rows, torch.float64, 1e-9, seen)
        total[1] += b

    run()
    assert total[0] <= 0.001 * total[1]
    check_coverage(program, seen)


def test_r2r_net_against_the_formula(tmp_path):
    """The r2r module: per-input projection, concat, linear, pre-norm residual blocks, norm, logit."""
    router = _kind_program("r2r").routers[0]
    t = rn.random_tensors(router, torch.Generator().manual_seed(1))
    path = tmp_path / "r.safetensors"
    save_file(t, str(path), metadata=rn.arch_metadata(router))
    net = load_router_net(router.__class__(**{**router.__dict__, "file": str(path)}), dtype=torch.float64)
    t = {k: v.double() for k, v in t.items()}
    x = torch.randn(7, 38, dtype=torch.float64)
    ln = lambda v, w, b: torch.nn.functional.layer_norm(v, (v.shape[-1],), w, b, 1e-5)  # noqa: E731
    gelu = torch.nn.functional.gelu
    parts = [x[:, :16], x[:, 16:32], x[:, 32:37] @ t["inputs.2.weight"].T + t["inputs.2.bias"], x[:, 37:]]
    h = torch.cat(parts, -1) @ t["proj.weight"].T + t["proj.bias"]
    for i in range(2):
        u = gelu(ln(h, t[f"blocks.{i}.norm.weight"], t[f"blocks.{i}.norm.bias"]) @ t[f"blocks.{i}.up.weight"].T
                 + t[f"blocks.{i}.up.bias"])
        h = h + u @ t[f"blocks.{i}.down.weight"].T + t[f"blocks.{i}.down.bias"]
    z = ln(h, t["norm.weight"], t["norm.bias"]) @ t["out.weight"].T + t["out.bias"]
    torch.testing.assert_close(net(x), torch.sigmoid(z[:, 0]))


def test_fold_batchnorm_is_exact():
    """CITER trains with BatchNorm; the folded linear layer equals linear + BN in eval mode."""
    torch.manual_seed(0)
    lin, bn = torch.nn.Linear(6, 12).double(), torch.nn.BatchNorm1d(12).double()
    bn.train()
    for _ in range(5):
        bn(lin(torch.randn(32, 6, dtype=torch.float64) * 3 + 1))
    bn.eval()
    w, b = rn.fold_batchnorm(lin, bn)
    x = torch.randn(9, 6, dtype=torch.float64)
    torch.testing.assert_close(x @ w.T + b, bn(lin(x)))


@pytest.mark.parametrize("arch, edit, message", [
    ("r2r", lambda t, m: m.update({rn.META_ARCH: "citer"}), "the file holds a 'citer' network, the declaration says arch = r2r"),
    ("r2r", lambda t, m: m.pop(rn.META_ARCH), "the file does not name its architecture"),
    ("r2r", lambda t, m: m.update({rn.META_INPUTS: "hidden(-1):16,top_prob:1"}),
     "the network was fitted on inputs [hidden(-1), top_prob], the declaration reads [hidden(-1), token_embedding"),
    ("r2r", lambda t, m: m.update({rn.META_INPUTS: "hidden(-1):32,token_embedding:32,topk_logits(5):5,entropy(normalized):1"}),
     "input hidden(-1) has width 16 here, the network was fitted on width 32"),
    ("r2r", lambda t, m: t.update({"proj.weight": torch.zeros(8, 40)}), "tensor 'proj.weight' has shape [8, 40], expected [8, 49]"),
    ("r2r", lambda t, m: t.pop("blocks.1.down.bias"), "tensor 'blocks.1.down.bias' is missing"),
    ("r2r", lambda t, m: t.update({"blocks.3.up.weight": torch.zeros(1)}), "blocks must be numbered 0..n-1, found [0, 1, 3]"),
    ("r2r", lambda t, m: t.update({"inputs.2.weight": torch.zeros(16, 4)}), "tensor 'inputs.2.weight' has shape [16, 4], expected [16, 5]"),
    ("citer", lambda t, m: t.update({"layers.1.weight": torch.zeros(6, 24), "layers.1.bias": torch.zeros(6),
                                     "layers.2.weight": torch.zeros(1, 6)}),
     "a CITER classifier is h -> 2h -> h -> 1"),
])
def test_kind_files_that_do_not_fit(tmp_path, arch, edit, message):
    router = _kind_program(arch).routers[0]
    path = tmp_path / "r.safetensors"
    router = ir.RouterNet(**{**router.__dict__, "file": str(path)})
    t, m = rn.random_tensors(router, torch.Generator().manual_seed(0)), rn.arch_metadata(router)
    edit(t, m)
    save_file(t, str(path), metadata=m)
    with pytest.raises(RouterWeightsError) as err:
        load_router_net(router)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def _tiny_folder(path, hidden, seed):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(f'{{"hidden_size": {hidden}, "num_hidden_layers": 2}}')
    save_file({"w": torch.randn(4, 4, generator=torch.Generator().manual_seed(seed))}, str(path / "model.safetensors"))
    return path


def test_check_reports_a_misfit_file_and_fingerprints(tmp_path):
    """`tokenrouter check`: E310 at the declaration's line:col, W004 when the file was fitted
    for other models, nothing once the fingerprints match."""
    from tokenrouter.compiler.pipeline import check_file
    small, large = _tiny_folder(tmp_path / "small", 8, 0), _tiny_folder(tmp_path / "large", 8, 1)
    src = tmp_path / "p.route"
    src.write_text(f'tokenrouter 1\nmodel slm = "{small}"\nmodel llm = "{large}"\n'
                   'router r on slm = "r.safetensors" {\n  inputs = [hidden(-1), topk_logits(3)]\n  arch = r2r\n}\n'
                   'head defer on slm = "h.safetensors"\n'
                   'route {\n  start slm\n  slm -> llm when r >= 0.5 and defer > 0.5 rewrite\n  visit llm max 1 then slm\n}\n')
    router = ir.RouterNet("r", "slm", "r.safetensors", (ir.InputHidden(-1, 8), ir.InputTopkLogits(3)), arch="r2r")
    t = rn.random_tensors(router, torch.Generator().manual_seed(0))
    prints = {"reads": {"name": "small", "fingerprint": rn.folder_fingerprint(str(small))},
              "large": {"name": "other", "fingerprint": "0123456789abcdef"}}
    meta = {**rn.arch_metadata(router), rn.META_MODELS: json.dumps(prints)}
    save_file(t, str(tmp_path / "r.safetensors"), metadata=meta)
    save_file({"weight": torch.zeros(9)}, str(tmp_path / "h.safetensors"), metadata={rn.META_ARCH: "co_llm"})
    program, diags = check_file(src, model_facts=model_facts)
    got = sorted((d.code, d.span.line, d.span.col) for d in diags)
    assert got == [("E310", 11, 32), ("W004", 4, 1)], [str(d.message) for d in diags]
    w004 = next(d for d in diags if d.code == "W004")
    assert "the large model 'other'" in w004.message and "0123456789abcdef" in w004.message
    e310 = next(d for d in diags if d.code == "E310")
    assert "tensor 'weight' has shape [9], expected [8] or [1, 8]" in e310.message
    prints["large"]["fingerprint"] = rn.folder_fingerprint(str(large))
    save_file(t, str(tmp_path / "r.safetensors"), metadata={**meta, rn.META_MODELS: json.dumps(prints)})
    save_file({"weight": torch.zeros(8)}, str(tmp_path / "h.safetensors"), metadata={rn.META_ARCH: "co_llm"})
    program, diags = check_file(src, model_facts=model_facts)
    assert program is not None and diags == []


def test_a_derived_model_is_fingerprinted_by_its_recipe_not_its_host_dependent_bytes(tmp_path):
    """Two hosts derive the small model with low-bit differences (its lens is fitted on
    hidden states computed with each host's float kernels); a router fitted on one host's
    build must check clean against the other's, and a different recipe must not."""
    a, b = _tiny_folder(tmp_path / "a", 8, 0), _tiny_folder(tmp_path / "b", 8, 1)
    assert rn.folder_fingerprint(str(a)) != rn.folder_fingerprint(str(b))  # bytes differ
    identity = {"from": "35e6a85d67b68466", "recipe": {"keep_layers": [0, 1], "ridge": 0.05}, "prompts": "x"}
    for folder in (a, b):
        (folder / rn.DERIVED_IDENTITY).write_text(json.dumps(identity))
    assert rn.folder_fingerprint(str(a)) == rn.folder_fingerprint(str(b))
    (b / rn.DERIVED_IDENTITY).write_text(json.dumps({**identity, "recipe": {"keep_layers": [0], "ridge": 0.05}}))
    assert rn.folder_fingerprint(str(a)) != rn.folder_fingerprint(str(b))

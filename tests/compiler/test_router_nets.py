"""Router networks and head rows: safetensors only, shapes checked against the declared layout."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from safetensors.torch import save_file

from tokenrouter.compiler import ir
from tokenrouter.compiler.compiled import load_routers
from tokenrouter.compiler.router_nets import RouterWeightsError, load_head, load_router_net

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
    from tokenrouter.compiler.abi import StepTensors
    b = 2
    step = StepTensors(logits=torch.randn(b, 8), sampled=torch.zeros(b, dtype=torch.int64),
                       visit_tokens=torch.ones(b, dtype=torch.int64), position=torch.zeros(b, dtype=torch.int64),
                       request_seed=torch.zeros(b, dtype=torch.int64), hidden={-1: torch.randn(b, 7)},
                       token_embedding=torch.randn(b, 6))
    with pytest.raises(ValueError, match="router input has width 16, its declared layout 15"):
        routers["slm"].route(step)

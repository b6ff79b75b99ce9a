"""`tokenrouter explain`: the program in words, and a drawing whose content is checked
from the SVG itself (element ids and text) and from the layout data, not just that a file
appeared."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest

from tests.compiler.conftest import REPO
from tokenrouter.cli import main
from tokenrouter.compiler.explain.draw import draw, layout
from tokenrouter.compiler.pipeline import check_file
from tokenrouter.runtime.loader import model_facts

EXAMPLES = REPO / "examples"
SVG = "{http://www.w3.org/2000/svg}"


def svg_content(path):
    """(ids of the SVG's groups, {group id: the text inside it}, every text line)."""
    root = ET.parse(path).getroot()
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    texts = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("id", "").startswith("label-"):
            texts[g.get("id")] = [t.text for t in g.iter(f"{SVG}text")]
    lines = [t.text for t in root.iter(f"{SVG}text") if t.text]
    return ids, texts, lines


def test_rstitch_drawing_has_both_writers_and_both_handoffs(tmp_path):
    program, _ = check_file(EXAMPLES / "rstitch.route", model_facts=model_facts)
    out = tmp_path / "rstitch.svg"
    lay = draw(program, str(out))
    ids, labels, lines = svg_content(out)
    assert {"node-slm", "node-llm", "edge-0-rule-slm-to-llm", "edge-1-rule-llm-to-slm"} <= ids
    assert not any(i.startswith("edge-2") for i in ids)  # nothing else
    assert {"slm", "llm", "start", "rstitch.route"} <= set(lines)
    up = " ".join(labels["label-0"])
    back = " ".join(labels["label-1"])
    assert "entropy(slm, normalized) >" in up and "tau=0.02" in up and up.endswith("rewrite")
    assert "entropy(llm, normalized) <=" in back and "tau=0.02" in back and back.endswith("keep")
    assert any("tau = 0.02" in line and "default" in line for line in lines)
    # the layout data says the same, and places the start writer left, the two arrows apart
    assert [(n.name, n.start) for n in lay.nodes] == [("slm", True), ("llm", False)]
    assert lay.node("slm").x < lay.node("llm").x
    (e1, e2) = lay.edges
    assert (e1.source, e1.dest, e2.source, e2.dest) == ("slm", "llm", "llm", "slm")
    assert e1.rad > 0 and e2.rad > 0 and (e1.y - 0) * (e2.y - 0) < 0  # one label below, one above


def test_png_is_drawn(tmp_path):
    program, _ = check_file(EXAMPLES / "rstitch.route", model_facts=model_facts)
    out = tmp_path / "rstitch.png"
    draw(program, str(out))
    from PIL import Image

    img = Image.open(out).convert("RGB")
    assert img.size[0] > 400 and img.size[1] > 200
    colors = img.getcolors(maxcolors=1 << 20)
    edge_red = sum(n for n, (r, g, b) in colors if r > 150 and g < 110 and b < 60)  # the handoff arrows
    assert edge_red > 500


def test_bounds_ensembles_and_set_values():
    program, _ = check_file(EXAMPLES / "ensemble.route", params={"tau": "0.45"}, model_facts=model_facts)
    lay = layout(program)
    assert [n.name for n in lay.nodes] == ["slm", "duo"]  # members do not write on their own
    assert "ensemble (average of llm 0.8, aux 0.2" in lay.node("duo").subtitle
    kinds = [(e.source, e.dest, e.kind) for e in lay.edges]
    assert kinds == [("slm", "duo", "rule"), ("duo", "slm", "max")]
    assert "tau=0.45" in lay.edges[0].label and "after 1 token" in lay.edges[1].label
    assert any("set by --set tau=0.45" in line for line in lay.footer)


def test_explain_command_words_and_picture(tmp_path, capsys):
    out = tmp_path / "r2r.svg"
    assert main(["explain", str(EXAMPLES / "r2r.route"), "-o", str(out), "--set", "threshold=0.6"]) == 0
    captured = capsys.readouterr()
    words = captured.out
    for expected in ["slm  model smollm2-135m-small (small, float32)  <- start",
                     "1. slm -> llm when r2r >= threshold=0.6",
                     "r2r on slm: r2r network, weights ", "inputs: hidden(-1)",
                     "rewrite: the token slm just wrote is dropped and llm writes that position",
                     "llm: writes at most 1 token, then hands over to slm (keep)",
                     "batch threshold: slm 1, llm auto", "max wait: slm 20ms, llm 20ms",
                     "threshold = 0.6  (float in [0, 1]; set by --set threshold=0.6)"]:
        assert expected in words, expected
    ids, labels, _ = svg_content(out)
    assert {"node-slm", "node-llm", "edge-0-rule-slm-to-llm", "edge-1-max-llm-to-slm"} <= ids
    assert "r2r >= threshold=0.6" in " ".join(labels["label-0"])


def test_explain_says_each_writers_format_engine_and_kernel_plan_and_numbers_every_handoff(tmp_path, capsys,
                                                                                           monkeypatch):
    monkeypatch.setenv("TOKENROUTER_CACHE", str(tmp_path / "empty-cache"))
    assert main(["explain", str(EXAMPLES / "demo.route")]) == 0
    words = capsys.readouterr().out
    for expected in ["slm  model smollm2-135m (small, float32, quant native)  <- start",
                     "weights: the GGUF file's own blocks (Q4_0/Q4_1/Q4_K as 4-bit codes, Q8_0 as int8)",
                     "llm  model smollm2-135m (large, float32)", "weights: float32",
                     "engine: tokenrouter's own, on cpu",
                     "not measured on this host yet; the first load measures it",
                     "measured at the first load, once the weights are converted into the cache",
                     "1. slm -> llm when entropy(slm, normalized) > tau=0.3",
                     "2. llm -> slm when entropy(llm, normalized) <= tau=0.3"]:
        assert expected in words, expected
    assert not (tmp_path / "empty-cache").exists()  # nothing converted or measured to say so


def test_explain_names_a_routers_weights_file_and_inputs_and_a_measured_plan(tmp_path, pair, capsys, monkeypatch):
    import json

    from tests.helpers.fitting import write_program
    from tokenrouter.commands.explain import kernel_plan_notes
    from tokenrouter.compiler.pipeline import load_program
    from tokenrouter.runtime.launch import LaunchOptions, plan
    from tokenrouter.runtime.loader import load_model

    monkeypatch.setenv("TOKENROUTER_CACHE", str(tmp_path / "cache"))

    route = write_program(str(tmp_path), pair, "r2r")
    assert main(["explain", route]) == 0
    words = capsys.readouterr().out
    assert "routers:\n  r2r on slm: r2r network, weights " in words and "w/r2r.safetensors" in words
    assert "inputs: hidden(-1) (32 wide), token_embedding (32 wide), topk_logits(8) (8 wide)" in words
    # a plan measured where `serve` would cache it is read back, shape by shape
    program = load_program(route, model_facts=model_facts)
    threads = plan(program, LaunchOptions(mode="thread"))["slm"].threads
    where = load_model(pair["slm"]).engine_options(threads=threads).plan_cache
    os.makedirs(os.path.dirname(where), exist_ok=True)
    with open(where, "w") as f:
        json.dump({"plans": {"64x32:f32": [[2, "linear"], [64, "onednn"]]}, "measured_at": "2026-12-02T00:00:00Z"}, f)
    notes = kernel_plan_notes(program)["slm"]
    assert notes[0].endswith("measured on this host 2026-12-02T00:00:00Z):")
    assert notes[1] == "  64x32:f32: linear to 2 rows, onednn above"


@pytest.mark.parametrize("argv, status, msg", [
    (["explain", str(EXAMPLES / "rstitch.route"), "-o", "x.pdf"], 2, "-o takes a file ending in .svg or .png"),
    (["explain", "/nonexistent.route"], 2, "cannot read"),
    (["explain", str(EXAMPLES / "rstitch.route"), "--set", "tau=abc"], 1, "error[E702]"),
])
def test_explain_errors(argv, status, msg, capsys):
    assert main(argv) == status
    assert msg in capsys.readouterr().err

"""`quant` as a model attribute in .route files and `--quant` on the commands."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.checkpoints import hf_config, transformers_model, write_gguf
from tokenrouter.cli import main
from tokenrouter.commands._args import with_quant
from tokenrouter.compiler import ir
from tokenrouter.compiler.pipeline import check_source
from tokenrouter.runtime.loader import model_facts

SRC = """tokenrouter 1

model slm = "smollm2-135m" {
  quant = %s
}
model llm = "smollm2-135m"

route {
  start slm
  slm -> llm when entropy(slm, normalized) > 0.5 rewrite
  llm -> slm when entropy(llm, normalized) <= 0.5 keep
}
"""


def test_quant_attribute_reaches_the_ir_and_survives_json():
    program, diags = check_source(SRC % "native", base_dir=".", model_facts=model_facts)
    assert program is not None, [d.message for d in diags]
    assert {m.name: m.quant for m in program.models} == {"slm": "native", "llm": "none"}
    again = ir.Program.from_json(program.to_json())
    assert again.model("slm").quant == "native"


def test_a_bad_quant_value_is_a_checker_error():
    program, diags = check_source(SRC % "int3", base_dir=".", model_facts=model_facts)
    assert program is None
    assert any("'int3' is not a valid quant" in d.message for d in diags)


def test_quant_flag_overrides_all_or_one_model():
    program, _ = check_source(SRC % "native", base_dir=".", model_facts=model_facts)
    assert [m.quant for m in with_quant(program, ["int8"]).models] == ["int8", "int8"]
    assert [m.quant for m in with_quant(program, ["llm=int4"]).models] == ["native", "int4"]
    with pytest.raises(ValueError, match="'xyz' is not a model"):
        with_quant(program, ["xyz=int4"])
    with pytest.raises(ValueError, match="--quant takes"):
        with_quant(program, ["int5"])


@pytest.mark.slow
@pytest.mark.real_weights
def test_generate_native_says_paris():
    out = subprocess.run([sys.executable, "-m", "tokenrouter.cli", "generate", "--model", "smollm2-135m", "--quant",
                          "native", "--max-tokens", "8", "--threads", "2", "The capital of France is"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_models_measure_kernels_rewrites_the_cached_plan(tmp_path, tmp_cache, capsys):
    config = hf_config("llama", vocab=272)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, transformers_model(config, seed=2), config, qtype="Q4_1")
    assert main(["models", "--measure-kernels", path, "--quant", "native"]) == 0
    out = capsys.readouterr().out
    assert "128x64:q4g32" in out and "cached in " + str(tmp_cache) in out
    assert main(["models", "--measure-kernels", str(tmp_path), "--quant", "native"]) == 1

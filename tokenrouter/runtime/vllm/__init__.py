"""A writer served by vLLM (`model llm = "PATH" { engine = vllm  tensor_parallel = N }`):
the implementation `tokenrouter/engines.py` registers for `engine = vllm`, beside
tokenrouter's own (`runtime/native/`).

The subserver stays ours (wire, scheduler, delayed batching, liveness, metrics); its
`WriterEngine` is a `VllmWriter` (`writer.py`) that steps a `vllm` `LLMEngine` from the
subserver's decoding loop, its engine core in the subserver's process:

    feed     a new or returning request is one resumable vLLM request; each visit adds
             the chunk vLLM has not seen, `tokens[fed:]` (the prompt, or the token this
             writer kept at its handoff plus the peers' suffix), and only it is computed
    step     one `engine_core` step: vLLM's forward, then our logits processor
             (`processor.py`), which samples and runs the compiled `route` on the batch's
             [B, V] logits (`subserver/step.py: sample_and_route`, the same function our
             engine calls) and forces the token to continue with, or the park token to
             end the chunk; the decision comes back in-band as that logit's value
             (`codes.py`)
    park     a chunk that ends (a handoff, or the request's end) leaves the request
             waiting in vLLM with its KV blocks
    release  an abort frees them

`engine.py` starts the engine (options, environment); `logits.py` gives the
single-request reference a vLLM model's logits by a fresh prefill; `steps.py` the tuner's
steps. vLLM is the optional extra `vllm` (`tokenrouter/extras.py`), checked (one line
naming it) before anything here imports it; vLLM itself is imported where it is used.
"""

from __future__ import annotations

from tokenrouter.runtime.vllm.logits import reference_model
from tokenrouter.runtime.vllm.steps import profile_steps
from tokenrouter.runtime.vllm.writer import load_vllm_writer as load_writer

__all__ = ["load_writer", "profile_steps", "reference_model"]

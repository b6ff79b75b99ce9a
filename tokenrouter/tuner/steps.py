"""What the profile times: a model's steps on the engine that serves it.

`measure.py`'s timing loop needs three operations of a model, one implementation per
engine (`open_steps` asks the model's engine for them: its `profile_steps`,
`tokenrouter/engines.py`):

    step(batch)    one step feeding each sequence of `batch` its tokens: [(seq, tokens)]
    free(seq)      forget a sequence and its KV
    seq_len(seq)   tokens of the sequence in the model's KV

tokenrouter's `Engine` has them itself (`runtime/native/steps.py`: the model as its
subserver holds it). A writer served by vLLM is stepped as its subserver steps it
(`runtime/vllm/steps.py`): a `StepRunner` over its `VllmWriter`, so a step is vLLM's
engine-core step with our logits processor sampling and routing in it.
"""

from __future__ import annotations

from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.runtime.memory import bound_heap_growth


def open_steps(program: ir.Program, model: ir.Model, threads: int, max_len: int, max_batch: int):
    """(steps, vocabulary size) of `model` on its engine, with `threads` torch threads, in a
    process with a subserver's allocator setting (a step's activations come and go as they
    do in serving: `runtime/memory.py`)."""
    bound_heap_growth()
    return engines.implementation(model.engine).profile_steps(program, model, threads, max_len, max_batch)

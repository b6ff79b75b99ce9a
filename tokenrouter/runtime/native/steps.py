"""What the tuner times of a model on tokenrouter's engine (`tuner/steps.py`): the `Engine`
itself, which has the three operations the timing loop needs (step, free, seq_len), built
as the model's subserver holds it."""

from __future__ import annotations

import torch

from tokenrouter.compiler import ir
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.loader import load_model, quant_options


def served_engine(path: str, dtype_name: str, threads: int, max_len: int, quant: str = "none"):
    """The model as its subserver holds it: its dtype and its weight format (`quant`, with the
    kernel plan cached for it), so the profile times the steps serving will run."""
    if threads > 0:
        torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    m = load_model(path, dtype=dtype, quant=quant)
    return (Engine(m.config, m.weights, quant_options(m, quant, dtype=dtype, max_model_len=max_len, num_blocks=None)),
            m.config.vocab_size)


def profile_steps(program: ir.Program, model: ir.Model, threads: int, max_len: int, max_batch: int):
    """(steps, vocabulary size) of `model` with `threads` torch threads."""
    return served_engine(model.path, model.dtype, threads, max_len, model.quant)

"""What the tests of a writer served by vLLM share: whether vLLM is here, a tiny model vLLM
runs, and a program's model moved onto vLLM.

vLLM is an optional extra (`pip install "tokenrouter[vllm]"`, which scripts/setup.sh and
so the CI install); the tests that start a vLLM engine skip, saying so, only where it is
not installed. They run against a real engine, never a stand-in.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest

from tests.helpers import tiny
from tokenrouter.compiler import ir

MISSING = importlib.util.find_spec("vllm") is None
needs_vllm = pytest.mark.skipif(MISSING, reason='vLLM is not installed here: pip install "tokenrouter[vllm]" '
                                                '(scripts/setup.sh installs it)')


def write_model(folder: str, seed: int, layers: int = 2) -> str:
    """A tiny random Llama vLLM's CPU attention runs (head size 32), with the tiny
    vocabulary the `pair` fixture's models share."""
    return tiny.write_model(folder, layers=layers, hidden=128, heads=4, kv_heads=2, seed=seed)


def on_vllm(program: ir.Program, model: str, tensor_parallel: int = 1) -> ir.Program:
    """`program` with `model` served by vLLM in float32."""
    models = tuple(dataclasses.replace(m, engine="vllm", dtype="float32", tensor_parallel=tensor_parallel)
                   if m.name == model else m for m in program.models)
    return dataclasses.replace(program, models=models)


def folder_of(program: ir.Program, model: str) -> str:
    return os.path.abspath(program.model(model).path)

"""CUDA graphs replay the eager forward exactly.

The capture itself runs only where CUDA is available. The padded static-shape steps the
graphs replay (batch and context buckets, scratch block, head-expanded masks) are checked
everywhere with `cuda_graphs="eager"`, which runs them without capturing."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions

CUDA = [pytest.param("cuda", True, marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                              reason="CUDA graphs need a GPU")])]


@pytest.mark.parametrize("device,mode", CUDA + [("cpu", "eager")], ids=["cuda-graphs", "cpu-static-eager"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_graph_steps_equal_eager_steps(tiny, family, device, mode):
    _, cfg, sd = tiny(family)
    sd32 = {k: v.float() for k, v in sd.items()}
    kw = dict(device=device, dtype=torch.float32, block_size=4, num_blocks=256, max_model_len=256)
    g = Engine(cfg, sd32, EngineOptions(cuda_graphs=mode, **kw))
    e = Engine(cfg, sd32, EngineOptions(cuda_graphs=False, **kw))
    assert g.graphs is not None and e.graphs is None
    needs = FeatureNeeds(hidden_layers=(0, 1, -1))
    prompts = {i: list(range(1 + i, 9 + 3 * i)) for i in range(5)}
    for eng in (g, e):
        eng.step(list(prompts.items()))
    live = list(prompts)
    for step in range(12):
        if step == 6:
            live = live[:3]  # a smaller batch: another bucket, padded
        q = 2 if step % 4 == 3 else 1  # short extends too
        batch = [(i, [(7 * i + step + j) % cfg.vocab_size for j in range(q)]) for i in live]
        og, oe = g.step(batch, needs), e.step(batch, needs)
        torch.testing.assert_close(og.logits, oe.logits, rtol=0, atol=1e-5)
        for k in needs.hidden_layers:
            torch.testing.assert_close(og.hidden[k], oe.hidden[k], rtol=0, atol=1e-5)
    assert g.graphs.graphs  # something was captured
    for i in prompts:
        g.free(i)
    assert g.blocks_used == 0

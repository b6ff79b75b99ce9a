"""A vLLM model's next-token logits by a fresh prefill: how the single-request reference
(`runtime/reference.py`) runs a writer served by vLLM.

It shares nothing with `VllmWriter` but vLLM's forward: every call is a new plain request
(no resumption, no logits processor, prefix caching off) of all the tokens, one token
long, whose raw logits vLLM returns in full (`logprobs=-1` with the engine's
`logprobs_mode="raw_logits"`: every token's value with its id), and which ends by itself. Its worker runs in a worker
process (`engine.py`), so a process may start and drop several of these.
"""

from __future__ import annotations

import itertools

import torch

from tokenrouter.runtime.loader import checkpoint_folder
from tokenrouter.runtime.vllm.engine import EngineConfig, start_engine


class VllmLogits:
    def __init__(self, folder: str, dtype: str = "float32", tensor_parallel: int = 1,
                 max_model_len: int | None = None):
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs.engine import tokens_input

        self.engine = start_engine(EngineConfig(folder, dtype, tensor_parallel, max_model_len, max_num_seqs=4,
                                                in_process=False))
        self.core = self.engine.engine_core
        self.tasks = self.engine.get_supported_tasks()
        self.tokens_input = tokens_input
        self.params = VllmSampling(temperature=0.0, max_tokens=1, logprobs=-1, ignore_eos=True, detokenize=False)
        self.max_model_len = self.engine.model_config.max_model_len
        self.vocab_size = self.engine.model_config.get_vocab_size()
        self.ids = (f"ref-{i}" for i in itertools.count())

    def close(self) -> None:
        """Stop the engine and its worker process."""
        self.core.shutdown()

    def logits(self, tokens: list[int]) -> torch.Tensor:
        """The float32 logits [V] after `tokens`."""
        rid = next(self.ids)
        req = self.engine.input_processor.process_inputs(rid, self.tokens_input(list(tokens)), self.params,
                                                         supported_tasks=self.tasks)
        self.core.add_request(req)
        while True:
            for o in self.core.get_output().outputs:
                if o.request_id == rid and o.new_token_ids:
                    lp = o.new_logprobs  # every token's logit, the sampled one first, with their ids
                    out = torch.full((self.vocab_size,), float("nan"), dtype=torch.float32)
                    out[torch.as_tensor(lp.logprob_token_ids[0], dtype=torch.int64)] = torch.as_tensor(
                        lp.logprobs[0], dtype=torch.float32)
                    if out.isnan().any():
                        raise RuntimeError("vLLM returned logits for part of the vocabulary only")
                    return out

    def forward(self, tokens: list[int], needs=None):
        """The reference's forward: the logits [V] after `tokens`, and no hidden states
        (vLLM hands out none)."""
        return self.logits(tokens), {}


def reference_model(model, *, models=None, max_model_len: int | None = None, block_size: int = 16) -> VllmLogits:
    """The single-request reference's forward of `model` (an `ir.Model` served by vLLM);
    `models` and `block_size` are tokenrouter's engine's, unused here."""
    return VllmLogits(checkpoint_folder(model.path)[1], model.dtype, model.tensor_parallel, max_model_len)

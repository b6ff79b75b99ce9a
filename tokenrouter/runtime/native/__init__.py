"""tokenrouter's own engine as a writer engine (`engine = native`, the default): the
implementation `tokenrouter/engines.py` registers for it, beside vLLM's (`runtime/vllm/`).

    load_writer       the subserver's `NativeWriter` over one `Engine` per model it steps
                      (`writer.py`)
    reference_model   the single-request reference's fresh-prefill forward (`reference.py`)
    profile_steps     the tuner's steps: the `Engine` as the subserver holds it (`steps.py`)

The engine itself (models, paged KV cache, kernels, sampler) is `runtime/engine/`; this
package adapts it to the subserver's `WriterEngine` interface (`subserver/step.py`).
"""

from __future__ import annotations

from tokenrouter.runtime.native.reference import NativeReference, reference_model
from tokenrouter.runtime.native.steps import profile_steps, served_engine
from tokenrouter.runtime.native.writer import NativeWriter, load_writer

__all__ = ["NativeReference", "NativeWriter", "load_writer", "profile_steps", "reference_model", "served_engine"]

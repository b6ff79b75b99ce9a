"""The engine: model forward (Llama, Qwen2, Qwen3), weights in their formats, paged KV cache,
batched steps, sampling; its options (`options.py`).

Import the parts directly (`from tokenrouter.runtime.engine.engine import Engine`); this
package imports nothing so that `config` stays importable without torch.
"""

"""The engine: model forward (Llama, Qwen2, Qwen3), paged KV cache, batched steps, sampling.

Import the parts directly (`from tokenrouter.runtime.engine.engine import Engine`); this
package imports nothing so that `config` stays importable without torch.
"""

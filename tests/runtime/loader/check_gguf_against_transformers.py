"""One-off check (not a test: ~30 s): our GGUF conversion of the embedded SmolLM2 file against
transformers' own GGUF loader, an independent implementation of the dequantisation and of the
q/k row un-permutation. Compares every weight and the logits of a short prompt.

    python tests/runtime/loader/check_gguf_against_transformers.py
"""

import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from tokenrouter.runtime.loader import load_model
from tokenrouter.runtime.loader.builtin.registry import embedded_gguf

path = embedded_gguf()
ours = load_model("smollm2-135m")
t0 = time.time()
ref = AutoModelForCausalLM.from_pretrained(path.rsplit("/", 1)[0], gguf_file=path.rsplit("/", 1)[1],
                                           dtype=torch.float32).eval()
print(f"transformers GGUF load: {time.time() - t0:.1f} s")
ref_sd = ref.state_dict()
worst = max((ours.weights[n] - ref_sd[n]).abs().max().item() for n in ours.weights)
print("weights compared:", len(ours.weights), "max abs diff:", worst)

model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in ours.raw_config.items() if k != "architectures"})).eval()
model.load_state_dict(ours.weights, strict=False)
model.tie_weights()
ids = torch.tensor([ours.tokenizer.encode("The capital of France is Paris. The capital of Italy is")])
with torch.no_grad():
    a, b = model(ids).logits, ref(ids).logits
print("logits max abs diff:", (a - b).abs().max().item(), "argmax equal:", bool((a.argmax(-1) == b.argmax(-1)).all()))

ref_tok = AutoTokenizer.from_pretrained(path.rsplit("/", 1)[0], gguf_file=path.rsplit("/", 1)[1])
for s in ["Hello world", "  two  spaces", "unicode: café, 日本語, emoji 🙂", "<|im_start|>user\nhi<|im_end|>"]:
    print(repr(s), ours.tokenizer.encode(s) == ref_tok.encode(s, add_special_tokens=False))

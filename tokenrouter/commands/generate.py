"""`tokenrouter generate`: one model, one prompt, the completion printed as it is produced.

Single-model use without a server: load (a folder, a .gguf file or a built-in name), prefill the
prompt, then decode one token per step with the engine's sampler until a stop token or
--max-tokens. Greedy unless --temperature is set.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Iterator

from tokenrouter.commands._args import QUANT_HELP

log = logging.getLogger(__name__)

HELP = "generate a completion with one model (greedy by default)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt text (with --chat: the user's message)")
    parser.add_argument("--model", "-m", default="smollm2-135m",
                        help="checkpoint folder, .gguf file or built-in name (see `tokenrouter models`); "
                             "default: smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = no limit")
    parser.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--system", default=None, help="system message for --chat")
    parser.add_argument("--dtype", choices=("float32", "float64", "bfloat16", "float16"), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quant", choices=("none", "native", "int4", "int8"), default=None, help=QUANT_HELP)


def stream_tokens(engine, prompt_ids: list[int], params, stop_ids, seq_id: object = 0) -> Iterator[int]:
    """Yield the tokens one request generates on `engine` (sampler from the engine package)."""
    from tokenrouter.runtime.engine.sampler import sample
    stops = set(stop_ids) | set(params.stop_token_ids)
    new = list(prompt_ids)
    try:
        for position in range(params.max_tokens):
            logits = engine.step([(seq_id, new)]).logits
            token = int(sample(logits, [params], [position])[0])
            if token in stops:
                return
            yield token
            new = [token]
    finally:
        engine.free(seq_id)


def _prompt_ids(tokenizer, args) -> list[int]:
    if not args.chat:
        return tokenizer.encode(args.prompt)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True),
                            add_special_tokens=False)


def run(args: argparse.Namespace) -> int:
    import torch
    from pydantic import ValidationError

    from tokenrouter.protocol.sampling import SamplingParams, invalid_because
    from tokenrouter.runtime.engine.engine import BadBatch, Engine
    from tokenrouter.runtime.frontend.text import Detokenizer
    from tokenrouter.runtime.loader import LoadError, load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                seed=args.seed, max_tokens=args.max_tokens)
        dtype = getattr(torch, args.dtype)
        t0 = time.monotonic()
        model = load_model(args.model, dtype=dtype, quant=args.quant)
        tok = model.tokenizer
        prompt = _prompt_ids(tok, args)
        if not prompt:
            raise LoadError("the prompt is empty")
        max_len = min(model.config.max_position_embeddings, len(prompt) + args.max_tokens)
        if len(prompt) >= model.config.max_position_embeddings:
            raise LoadError(f"the prompt has {len(prompt)} tokens; the model takes at most "
                            f"{model.config.max_position_embeddings - 1}")
        engine = Engine(model.config, model.weights, model.engine_options(
            dtype=dtype, max_model_len=max_len, num_blocks=-(-max_len // 16), block_size=16))
        log.info("%s loaded in %.1f s; generating", args.model, time.monotonic() - t0)
        detok = Detokenizer(tok)
        for token in stream_tokens(engine, prompt, params, tok.eos_token_ids):
            sys.stdout.write(detok.push([token]))  # nothing until a multi-byte character is whole
            sys.stdout.flush()
        sys.stdout.write(detok.finish() + "\n")
        return 0
    except ValidationError as exc:  # the sampling parameters
        print(f"tokenrouter generate: error: invalid sampling parameters: {invalid_because(exc)[1]}",
              file=sys.stderr)
        return 1
    except (LoadError, BadBatch, ValueError) as exc:
        print(f"tokenrouter generate: error: {exc}", file=sys.stderr)
        return 1

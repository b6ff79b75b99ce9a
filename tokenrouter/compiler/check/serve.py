"""The serve block, checked by `serve_block` on the checker's `CheckState`: its keys, whom
each applies to (every model, or one), and their values, into the IR's `ir.Schedule`."""

from __future__ import annotations

from typing import Any

from tokenrouter.compiler import ir
from tokenrouter.compiler.builtins import SERVE_KEYS
from tokenrouter.compiler.check.symbols import CheckState, as_int, as_word
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Note, did_you_mean, words


def serve_block(state: CheckState, block: ast.ServeBlock) -> None:
    """The (substituted) serve block into `state.out.schedule`."""
    seen: dict[tuple[str, str | None], ast.ServeEntry] = {}
    sched: dict[str, Any] = {"batch": {}, "max_wait": {}, "place": {}, "threads": {}}
    globals_: dict[str, tuple[int, ...]] = {}
    model_names = [m.name for m in state.out.models]
    for entry in block.entries:
        key = entry.key.text
        if key not in SERVE_KEYS:
            guess = did_you_mean(key, SERVE_KEYS)
            state.err("E601", f"unknown serving key '{key}'", entry.key.span,
                      hint=f"did you mean '{guess}'?" if guess else f"expected one of {words(SERVE_KEYS)}")
            continue
        scope = SERVE_KEYS[key]
        target = None
        if entry.target is not None:
            if scope == "global":
                state.err("E602", f"'{key}' applies to every model, not to one", entry.target.span,
                          hint=f"write: {key} = ...")
                continue
            tsym = state.lookup(entry.target, ("model",), f"the model '{key}' applies to")
            if tsym is None:
                continue
            target = tsym.name
        ident = (key, target)
        if ident in seen:
            state.err("E603", f"'{key}{' ' + target if target else ''}' is set twice", entry.key.span,
                      notes=[Note("first set here", seen[ident].key.span)])
            continue
        seen[ident] = entry
        if not state.value_ok(entry.value, ("auto",)):
            continue
        value = _value(state, key, entry.value)
        if value is None:
            continue
        if scope == "global":
            globals_[key] = value
        else:
            sched[key][target] = value
    state.out.schedule = ir.Schedule(
        batch=_per_model(sched["batch"], model_names), max_wait_ms=_per_model(sched["max_wait"], model_names),
        graph_batch_sizes=globals_.get("graph_batch_sizes", ()), graph_tokens=globals_.get("graph_tokens", ()),
        placement=_per_model(sched["place"], model_names), threads=_per_model(sched["threads"], model_names),
        span=block.span)


def _per_model(table: dict, model_names: list[str]) -> tuple:
    """(model, value) for each model, in declaration order: its own setting, or the one
    for every model (key None), or none."""
    out = []
    for name in model_names:
        if name in table:
            out.append((name, table[name]))
        elif None in table:
            out.append((name, table[None]))
    return tuple(out)


def _value(state: CheckState, key: str, node):
    """The value of one key, or None (reported) when it is not one."""
    if key == "batch":
        if as_word(node) == "auto":
            return "auto"
        n = as_int(node, 1)
        if n is None:
            state.err("E602", "batch is a whole number >= 1 or `auto`", node.span,
                      hint="`auto` lets the tuner choose the delayed-batching threshold")
        return n
    if key == "max_wait":
        if isinstance(node, ast.Duration) and node.ms >= 0:
            return float(node.ms)
        state.err("E602", "max_wait is a duration", node.span, hint="write it with a unit: 20ms, 1s, 500us")
        return None
    if key == "threads":
        n = as_int(node, 0)
        if n is None:
            state.err("E602", "threads is a whole number >= 0 (0 = torch's default)", node.span)
        return n
    if key == "place":
        text = node.value if isinstance(node, ast.Str) else None
        if text is not None and _valid_place(text):
            return text
        state.err("E602", "place is a device or an address", node.span,
                  hint='expected "cpu", "cuda", "cuda:N" or "host:port"')
        return None
    # graph buckets
    if isinstance(node, ast.ListLit) and node.items:
        values = [as_int(v, 1) for v in node.items]
        if all(v is not None for v in values) and all(a < b for a, b in zip(values, values[1:])):
            return tuple(values)
    state.err("E602", f"{key} is a list of whole numbers >= 1 in increasing order", node.span,
              hint="e.g. [1, 2, 4, 8]")
    return None


def _valid_place(text: str) -> bool:
    if text in ("cpu", "cuda", "mps"):
        return True
    if text.startswith("cuda:") and text[5:].isdigit():
        return True
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536

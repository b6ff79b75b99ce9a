"""The routers' and heads' declarations, each a function of the checker's `CheckState`:
the model each reads, its weights file (a string or a `path` parameter), its attributes,
and a router's inputs as IR (`ir.RouterNet`, into `state.out`).

What the weights file holds is checked later, against the model's facts, by
`weights/check.py`; here only the declaration is.
"""

from __future__ import annotations

from tokenrouter.compiler import ir
from tokenrouter.compiler.builtins import ACTIVATIONS, ROUTER_ARCHS, ROUTER_INPUTS
from tokenrouter.compiler.check.symbols import KIND_WORDS, CheckState, Symbol, as_int, resolve_path
from tokenrouter.compiler.features import FEATURES
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Note, did_you_mean, words


def router(state: CheckState, item: ast.RouterDecl) -> None:
    """A router network: the model it reads, its file, attributes and inputs."""
    sym = _reader(state, item, "router")
    attrs = state.attrs(item.attrs, {"inputs": "", "activation": "", "output": "", "arch": ""},
                        f"router '{item.name.text}'")
    if sym is None:
        return
    activation = state.choice(attrs["activation"], ACTIVATIONS, "activation") if "activation" in attrs else "relu"
    arch = state.choice(attrs["arch"], ROUTER_ARCHS, "router architecture") if "arch" in attrs else "mlp"
    if arch == "citer" and activation not in (None, "relu"):
        state.err("E203", "CITER's classifier uses relu", attrs["activation"].value.span,
                  hint="drop the activation, or declare arch = mlp")
        activation = None
    if arch in ("citer", "r2r") and "output" in attrs:
        state.err("E203", f"an {arch} router has one output; 'output' applies to arch = mlp",
                  attrs["output"].key.span)
        arch = None
    output = 0
    if "output" in attrs:
        output = as_int(attrs["output"].value, 0)
        if output is None:
            state.err("E203", "output is the index of the router's output to read, a whole number >= 0",
                      attrs["output"].value.span)
    if "inputs" not in attrs:
        state.err("E204", f"router '{item.name.text}' does not declare its inputs", item.name.span,
                  hint="add: { inputs = [hidden(-1), token_embedding, topk_logits(100)] }")
        sym.ok = False
        return
    inputs = _router_inputs(state, attrs["inputs"].value, sym.model)
    if inputs is None or activation is None or output is None or arch is None:
        sym.ok = False
        return
    state.out.routers.append(ir.RouterNet(sym.name, sym.model, sym.file, tuple(inputs), activation,
                                          output, item.span, arch))


def head(state: CheckState, item: ast.HeadDecl) -> None:
    """A head row: the model it reads, its file, and whether a sigmoid applies."""
    sym = _reader(state, item, "head")
    attrs = state.attrs(item.attrs, {"sigmoid": ""}, f"head '{item.name.text}'")
    if sym is None:
        return
    if "sigmoid" in attrs:
        choice = state.choice(attrs["sigmoid"], ("true", "false"), "value for sigmoid")
        if choice is None:
            sym.ok = False
            return
        sym.sigmoid = choice == "true"


def _reader(state: CheckState, item, what: str) -> Symbol | None:
    """The symbol of a router or head with its model and weights file, or None (and the
    symbol not ok) when either is wrong."""
    if not state.is_first(item):
        return None
    sym = state.symbols[item.name.text]
    target = state.lookup(item.model, ("model",), f"the model a {what} reads")
    if target is None:
        sym.ok = False
        return None
    sym.model = item.model.text
    if isinstance(item.path, ast.Ref):
        sym.file = _file_param(state, item.path, what)
        if sym.file is None:
            sym.ok = False
            return None
        return sym
    if not item.path.value.strip():
        state.err("E203", f"the {what}'s weights file is empty", item.path.span,
                  hint='name a safetensors file, e.g. "weights/router.safetensors"')
        sym.ok = False
        return None
    sym.file = resolve_path(item.path.value, state.base_dir)
    return sym


def _file_param(state: CheckState, ref: ast.Ref, what: str) -> str | None:
    """A weights file given by a `path` parameter: its bound (absolute) path."""
    name = ref.name.text
    sym = state.symbols.get(name)
    if sym is None:
        guess = did_you_mean(name, [n for n, b in state.bound.items() if b.type == "path"])
        state.err("E102", f"undefined parameter '{name}'", ref.span,
                  hint=f"did you mean '{guess}'?" if guess else
                  f'the {what}\'s weights file is a string ("weights/x.safetensors") or a path parameter: '
                  f'param {name}: path = "..."')
        return None
    state.used.add(name)
    if sym.kind != "param":
        state.err("E103", f"the {what}'s weights file must be a string or a path parameter, but '{name}' is "
                  f"{KIND_WORDS[sym.kind]}", ref.span, notes=[Note("declared here", sym.span)])
        return None
    b = state.bound[name]
    if not b.ok:
        return None
    if b.type != "path":
        state.err("E304", f"the {what}'s weights file must be a path parameter, but '{name}' is a {b.type}",
                  ref.span, notes=[Note("declared here", b.decl.span)])
        return None
    return b.value


def _router_inputs(state: CheckState, value, model: str) -> list | None:
    """The declared inputs as IR, or None when any is wrong (each is reported)."""
    if not isinstance(value, ast.ListLit) or not value.items:
        state.err("E306", "inputs is a non-empty list of router inputs", value.span,
                  hint=f"expected a list of {words(ROUTER_INPUTS.values())}")
        return None
    out, ok = [], True
    for node in value.items:
        inp = _router_input(state, node, model)
        ok = ok and inp is not None
        out.append(inp)
    return out if ok else None


def _router_input(state: CheckState, node, model: str):
    """One input as IR (`ir.InputHidden`, ...), or None."""
    if isinstance(node, ast.Ref):
        name, args = node.name.text, ()
    elif isinstance(node, ast.Call):
        name, args = node.func.text, node.args
    else:
        state.err("E306", "not a router input", node.span,
                  hint=f"expected one of {words(ROUTER_INPUTS.values())}")
        return None
    if name not in ROUTER_INPUTS:
        guess = did_you_mean(name, ROUTER_INPUTS)
        state.err("E306", f"unknown router input '{name}'", node.span,
                  hint=f"did you mean '{ROUTER_INPUTS[guess]}'?" if guess else
                  f"expected one of {words(ROUTER_INPUTS.values())}")
        return None
    decl = FEATURES[name]
    want = len(decl.args)
    if len(args) != want or any(a.label is not None for a in args):
        state.err("E302", f"router input {name} takes {want} argument{'s' if want != 1 else ''}, got {len(args)}",
                  node.span, hint=f"write {ROUTER_INPUTS[name]} (the router's model is implied)")
        return None
    values = {}
    for arg, given in zip(decl.args, args):
        value = arg.parse(given.value)
        if value is None:
            state.err("E306", f"{ROUTER_INPUTS[name]} takes {arg.what}", given.value.span, hint=arg.hint)
            return None
        values[arg.field] = value
    if decl.scalar:
        return ir.InputScalar(decl.node(model=model, **values, span=node.span))
    return decl.node(**values)

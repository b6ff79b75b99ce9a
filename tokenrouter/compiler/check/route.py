"""The route block and the whole-program analysis of its rules, as functions of the
checker's `CheckState`.

`route_block` checks the start writer, each transition (its writers, and its condition
typed by `expr.py` in the context of the source writer) and each visit bound, into
`state.out`, and returns the `Rules` the analysis reads. `analyse` then looks at the rules
as a whole: reachability from the start, rules shadowed by an earlier one out of the same
writer, and ping-pong (two writers handing back and forth on overlapping ranges of the
same feature).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenrouter.compiler import ir
from tokenrouter.compiler.check.expr import ExprChecker, Val
from tokenrouter.compiler.check.symbols import CheckState, Symbol, as_int, head_span
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, Note


@dataclass
class Rules:
    """The route block as the analysis reads it: its statements as written, and each
    transition with its IR (None when it failed) and its typed condition."""

    stmts: tuple = ()
    checked: list[tuple[ast.Transition, ir.Transition | None, Val]] = field(default_factory=list)


def route_block(state: CheckState, block: ast.RouteBlock) -> Rules:
    """The start, the transitions and the visit bounds of the (substituted) route block."""
    exprs = ExprChecker(state.symbols, state.err, state.used, state.reported_undefined)
    starts = [s for s in block.stmts if isinstance(s, ast.Start)]
    if not starts:
        state.err("E401", "the route block does not say which writer starts", head_span(block, "route"),
                  hint="add: start MODEL")
    for dup in starts[1:]:
        state.err("E402", "a second 'start'", dup.span, hint="a program has one start writer",
                  notes=[Note("first start here", starts[0].span)])
    if starts:
        sym = _writer(state, starts[0].writer, "the start writer")
        if sym is not None and sym.ok:
            state.out.start = sym.name
    rules = Rules(block.stmts)
    visits: dict[str, ast.Visit] = {}
    for stmt in block.stmts:
        if isinstance(stmt, ast.Transition):
            _transition(state, stmt, exprs, rules)
        elif isinstance(stmt, ast.Visit):
            _visit(state, stmt, visits)
    return rules


def analyse(state: CheckState, rules: Rules) -> None:
    """The rules as a whole (after the models are in `state.out`)."""
    start = state.out.start
    if start is not None and not any(d.code in ("E102", "E103") for d in state.diags):
        _reachability(state, start, rules.stmts)
    _shadowing(state, rules.checked)
    _ping_pong(state, rules.checked)


def _writer(state: CheckState, name: ast.Name, role: str, avoid: str = "") -> Symbol | None:
    """A model or ensemble named in the route block."""
    return state.lookup(name, ("model", "ensemble"), role, avoid)


def _running(sym: Symbol) -> tuple[str, ...]:
    """The models whose step a rule out of this writer reads: the writer and its members."""
    return (sym.name,) + tuple(sym.members) if sym.kind == "ensemble" else (sym.name,)


def _written(value, n) -> str:
    """A visit bound's number as the file writes it: a parameter's name, else the number."""
    return value.param if getattr(value, "param", None) else str(n)


def _described(value, n) -> str:
    """A visit bound's number for a message: `burst (= 4)` where a parameter gave it."""
    return f"{value.param} (= {n})" if getattr(value, "param", None) else str(n)


def _names(e) -> set[str]:
    """The names a condition mentions (a call's arguments, not the function it calls)."""
    if isinstance(e, ast.Ref):
        return {e.name.text}
    if isinstance(e, ast.Call):
        return set().union(*(_names(a.value) for a in e.args))
    if isinstance(e, ast.Unary):
        return _names(e.operand)
    if isinstance(e, ast.Binary):
        return _names(e.left) | _names(e.right)
    return set()


def _transition(state: CheckState, stmt: ast.Transition, exprs: ExprChecker, rules: Rules) -> None:
    """A transition's writers and condition; kept in `rules` even when it failed."""
    src = _writer(state, stmt.source, "the source of a rule")
    dst = _writer(state, stmt.dest, "the destination of a rule", avoid=stmt.source.text)
    if src is not None and dst is not None and src.name == dst.name:
        state.err("E404", f"rule hands '{src.name}' off to itself", stmt.dest.span,
                  hint="a rule moves the request to another writer; to keep writing, just leave it out")
        return
    if src is None or not src.ok:
        state.used |= _names(stmt.when)  # not checked, but what it names is used: no W002 for it
        return
    val = exprs.condition(stmt.when, _running(src), src.name)
    if dst is None or not dst.ok or val.type == "bad":
        rules.checked.append((stmt, None, val))
        return
    tr = ir.Transition(src.name, dst.name, val.ir, stmt.action.text, stmt.span)
    rules.checked.append((stmt, tr, val))
    state.out.transitions.append(tr)


def _visit(state: CheckState, stmt: ast.Visit, visits: dict) -> None:
    """A visit bound: min, max and the writer after max, once each and consistent."""
    sym = _writer(state, stmt.writer, "a visit bound's writer")
    if sym is None:
        return
    if sym.name in visits:
        state.err("E406", f"'{sym.name}' has two visit bounds", stmt.writer.span,
                  hint="put min, max and then in one statement",
                  notes=[Note("first bound here", visits[sym.name].span)])
        return
    visits[sym.name] = stmt
    found: dict[str, ast.VisitClause] = {}
    ok = True
    for clause in stmt.clauses:
        key = clause.key.text
        if key in found:
            state.err("E406", f"'{key}' is given twice", clause.key.span,
                      notes=[Note("first given here", found[key].key.span)])
            ok = False
            continue
        found[key] = clause
    lo, hi, then = 1, None, None
    if "min" in found:
        lo = as_int(found["min"].value, 1)
        if lo is None:
            if state.value_ok(found["min"].value):
                state.err("E406", "min is a whole number of tokens >= 1", found["min"].value.span)
            ok = False
    if "max" in found:
        hi = as_int(found["max"].value, 1)
        if hi is None:
            if state.value_ok(found["max"].value):
                state.err("E406", "max is a whole number of tokens >= 1", found["max"].value.span)
            ok = False
    if "then" in found:
        tsym = _writer(state, found["then"].value, "the writer after 'max'")
        if tsym is None:
            ok = False
        elif tsym.name == sym.name:
            state.err("E406", f"'then' names '{sym.name}' itself", found["then"].value.span,
                      hint="after its max a writer hands over to another writer")
            ok = False
        else:
            then = tsym.name
    if ok and lo is not None and hi is not None and lo > hi:
        state.err("E406", f"min {_described(found['min'].value, lo)} is larger than max "
                  f"{_described(found['max'].value, hi)}", found["min"].span)
        ok = False
    if ok and "max" in found and "then" not in found:
        state.err("E406", f"after max {_described(found['max'].value, hi)} tokens, '{sym.name}' needs a writer "
                  "to go to", found["max"].span,
                  hint=f"add: then WRITER, e.g. visit {sym.name} max {_written(found['max'].value, hi)} then OTHER")
        ok = False
    if ok and "then" in found and "max" not in found:
        state.err("E406", "'then' needs a 'max'", found["then"].span,
                  hint=f"e.g. visit {sym.name} max 1 then {then}")
        ok = False
    if ok and sym.ok:
        state.out.bounds.append(ir.VisitBound(sym.name, lo or 1, hi, then, stmt.span))


def _reachability(state: CheckState, start: str, stmts: tuple) -> None:
    """Edges come from every rule and bound as written, valid or not, so a mistake in
    one rule does not make others look unreachable."""
    edges: dict[str, set[str]] = {}
    writers = {n for n, s in state.symbols.items() if s.kind in ("model", "ensemble")}
    for stmt in stmts:
        if isinstance(stmt, ast.Transition):
            src, dst = stmt.source.text, stmt.dest.text
        elif isinstance(stmt, ast.Visit):
            then = [c.value for c in stmt.clauses if c.key.text == "then" and isinstance(c.value, ast.Name)]
            src, dst = stmt.writer.text, (then[0].text if then else None)
        else:
            continue
        if src in writers and dst in writers:
            edges.setdefault(src, set()).add(dst)
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    for stmt in stmts:
        if isinstance(stmt, ast.Transition) and stmt.source.text in writers and stmt.source.text not in seen:
            state.err("E405", f"unreachable rule: no rule leads from start '{start}' to '{stmt.source.text}'",
                      stmt.source.span, hint=f"add a rule into '{stmt.source.text}', or remove this one")
        elif isinstance(stmt, ast.Visit) and stmt.writer.text in writers and stmt.writer.text not in seen:
            state.err("E405", f"unreachable visit bound: no rule leads from start '{start}' to "
                      f"'{stmt.writer.text}'", stmt.writer.span)


def _shadowing(state: CheckState, rules: list) -> None:
    """A rule an earlier rule out of the same writer always catches first."""
    earlier: dict[str, list] = {}
    for stmt, tr, val in rules:
        if tr is None:
            continue
        for prev_stmt, prev_val in earlier.get(tr.source, []):
            same = prev_stmt.when == stmt.when
            covered = (prev_val.simple is not None and val.simple is not None
                       and prev_val.simple[0] == val.simple[0]
                       and prev_val.simple[1].contains(val.simple[1]))
            if same or covered:
                why = ("it has the same condition as" if same else
                       "whenever it holds, so does")
                state.err("E405", f"unreachable rule: {why} an earlier rule out of '{tr.source}', "
                          "which is tried first", stmt.span,
                          hint="rules are tried in order and the first that holds wins; reorder or remove",
                          notes=[Note("the earlier rule", prev_stmt.span)])
                break
        earlier.setdefault(tr.source, []).append((stmt, val))


def _ping_pong(state: CheckState, rules: list) -> None:
    """Two writers handing a request back and forth on overlapping ranges of one feature."""
    simple = [(stmt, tr, val) for stmt, tr, val in rules if tr is not None and val.simple is not None
              and val.simple[0].comparable and val.simple[0].model == tr.source]
    by_pair: dict[tuple[str, str], list] = {}
    for item in simple:
        by_pair.setdefault((item[1].source, item[1].dest), []).append(item)
    for (a, b), ups in by_pair.items():
        for stmt_back, tr_back, val_back in by_pair.get((b, a), []):
            for stmt_up, tr_up, val_up in ups:
                if stmt_up.span.line > stmt_back.span.line or (
                        stmt_up.span.line == stmt_back.span.line and stmt_up.span.col > stmt_back.span.col):
                    continue  # report each pair once, at the later rule
                f_up, i_up = val_up.simple
                f_back, i_back = val_back.simple
                if f_up.kind != f_back.kind or not i_up.intersects(i_back):
                    continue
                state.diags.append(Diagnostic(
                    "W001", f"ping-pong: '{a}' hands off to '{b}' when its {f_up.words} is in "
                    f"{i_up.show()}, and '{b}' hands back when its own is in {i_back.show()}; "
                    "the ranges overlap", stmt_back.span,
                    hint="make the switch-back range disjoint from the switch-up range "
                         "(e.g. up when > tau, back when <= tau)",
                    notes=(Note("the switch-up rule", stmt_up.span),)))


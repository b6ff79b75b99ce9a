"""The state machine of a program, drawn (`tokenrouter explain FILE -o out.svg|out.png`).

Writers are boxes (the start writer marked by an incoming `start` arrow), handoffs are
arrows labelled with their order, condition and action, and a visit bound's `then` is a
dashed arrow labelled with its token count. `layout` computes where everything goes and
returns it as data (the test reads it, and the SVG's text, which is kept as text);
`draw` renders that layout with matplotlib (a dependency already, no system package).
"""

from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass, field

from tokenrouter.compiler import ir
from tokenrouter.compiler.explain.describe import edges, param_line, reachable, writer_line

BOX_W, BOX_H = 2.8, 1.1
WRAP = 34
LINE_H = 0.27  # height of a label line, in layout units


@dataclass
class Node:
    name: str
    x: float
    y: float
    subtitle: str
    start: bool = False


@dataclass
class DrawnEdge:
    source: str
    dest: str
    kind: str  # rule | max
    label: str  # as drawn (may span lines)
    rad: float  # curvature (matplotlib arc3)
    x: float  # where the label sits
    y: float


@dataclass
class Layout:
    title: str
    nodes: list[Node] = field(default_factory=list)
    edges: list[DrawnEdge] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)


def _positions(names: list[str]) -> dict[str, tuple[float, float]]:
    n = len(names)
    if n == 1:
        return {names[0]: (0.0, 0.0)}
    if n == 2:
        return {names[0]: (-4.0, 0.0), names[1]: (4.0, 0.0)}
    r = max(4.5, 1.8 * n)
    return {w: (r * math.cos(math.pi - 2 * math.pi * i / n), r * math.sin(math.pi - 2 * math.pi * i / n))
            for i, w in enumerate(names)}


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, WRAP, break_long_words=False, break_on_hyphens=False)) or text


def layout(program: ir.Program) -> Layout:
    live = reachable(program)
    names = [program.start] + [w for w in live if w != program.start]
    pos = _positions(names)
    out = Layout(os.path.basename(str(program.source)))
    for w in names:
        sub = writer_line(program, w)
        out.nodes.append(Node(w, *pos[w], sub, w == program.start))
    es = [e for e in edges(program) if e.source in pos]
    pairs: dict[frozenset, int] = {}
    for e in es:
        key = frozenset((e.source, e.dest))
        pairs[key] = pairs.get(key, 0) + 1
    seen: dict[tuple[str, str], int] = {}
    for e in es:
        k = seen.get((e.source, e.dest), 0)
        seen[(e.source, e.dest)] = k + 1
        rad = 0.0 if pairs[frozenset((e.source, e.dest))] == 1 else 0.35 + 0.3 * k
        if e.kind == "rule":
            label = f"{e.order}. when {e.condition}\n{e.action}"
        else:
            label = f"{e.condition}\n(visit max) keep"
        label = "\n".join(_wrap(line) for line in label.split("\n"))
        (x1, y1), (x2, y2) = pos[e.source], pos[e.dest]
        dx, dy = x2 - x1, y2 - y1
        d = math.hypot(dx, dy) or 1.0
        ux, uy = dy / d, -dx / d  # the side arc3 bends to
        # the middle of matplotlib's arc3 curve is halfway to its control point; the label
        # sits just outside it, so the arrow stays visible
        off = 0.5 * rad * d + LINE_H * (label.count("\n") + 1) / 2 + 0.25
        out.edges.append(DrawnEdge(e.source, e.dest, e.kind, label, rad,
                                   (x1 + x2) / 2 + ux * off, (y1 + y2) / 2 + uy * off))
    out.footer = ["parameters:"] + [f"  {param_line(p)}" for p in program.params] if program.params else []
    return out


def draw(program: ir.Program, path: str) -> Layout:
    """Draw the program to `path` (.svg or .png, by its extension); returns the layout."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    ext = os.path.splitext(path)[1].lower()
    if ext not in (".svg", ".png"):
        raise ValueError(f"the picture's file name must end in .svg or .png, not {ext or 'nothing'!r}")
    lay = layout(program)
    xs = [n.x for n in lay.nodes] + [e.x for e in lay.edges]
    ys = [n.y for n in lay.nodes] + [e.y for e in lay.edges]
    x0, x1 = min(xs) - BOX_W - 1.6, max(xs) + BOX_W
    y0, y1 = min(ys) - 2.2 - 0.35 * len(lay.footer), max(ys) + 2.0
    scale = 0.62
    with matplotlib.rc_context({"svg.fonttype": "none", "font.family": "DejaVu Sans"}):
        fig, ax = plt.subplots(figsize=((x1 - x0) * scale, (y1 - y0) * scale))
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        ax.set_aspect("equal")
        ax.axis("off")
        boxes = {}
        for n in lay.nodes:
            box = FancyBboxPatch((n.x - BOX_W / 2, n.y - BOX_H / 2), BOX_W, BOX_H,
                                 boxstyle="round,pad=0.08,rounding_size=0.25", linewidth=2 if n.start else 1.2,
                                 facecolor="#e8f0fb" if n.start else "#f4f4f4", edgecolor="#30507a", zorder=3)
            box.set_gid(f"node-{n.name}")  # an id in the SVG, so tools (and the test) find it
            ax.add_patch(box)
            boxes[n.name] = box
            ax.text(n.x, n.y + 0.17, n.name, ha="center", va="center", fontsize=13, fontweight="bold", zorder=4)
            ax.text(n.x, n.y - 0.25, "\n".join(textwrap.wrap(n.subtitle, 30)), ha="center", va="center",
                    fontsize=6.5, color="#444444", zorder=4)
            if n.start:
                sx = n.x - BOX_W / 2 - 1.3
                ax.add_patch(FancyArrowPatch((sx, n.y), (n.x - BOX_W / 2 - 0.1, n.y), arrowstyle="-|>",
                                             mutation_scale=14, linewidth=1.5, color="#30507a", zorder=2))
                ax.text(sx - 0.1, n.y, "start", ha="right", va="center", fontsize=10, color="#30507a")
        for i, e in enumerate(lay.edges):
            rule = e.kind == "rule"
            color = "#b04a1c" if rule else "#5a7a30"
            arrow = ax.add_patch(FancyArrowPatch(
                (lay.node(e.source).x, lay.node(e.source).y), (lay.node(e.dest).x, lay.node(e.dest).y),
                patchA=boxes[e.source], patchB=boxes[e.dest], connectionstyle=f"arc3,rad={e.rad}",
                arrowstyle="-|>", mutation_scale=16, linewidth=1.6, linestyle="-" if rule else "--",
                color=color, shrinkA=4, shrinkB=4, zorder=2))
            arrow.set_gid(f"edge-{i}-{e.kind}-{e.source}-to-{e.dest}")
            ax.text(e.x, e.y, e.label, ha="center", va="center", fontsize=8, color=color, zorder=5,
                    bbox=dict(boxstyle="round,pad=0.25", facecolor="white", edgecolor=color, alpha=0.92),
                    gid=f"label-{i}")
        ax.set_title(lay.title, fontsize=12)
        for i, line in enumerate(lay.footer):
            ax.text(x0 + 0.3, y0 + 0.3 + 0.38 * (len(lay.footer) - 1 - i), line, ha="left", va="bottom",
                    fontsize=8, family="monospace")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=150, bbox_inches="tight")
        plt.close(fig)
    return lay

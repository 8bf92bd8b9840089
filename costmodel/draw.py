"""A placement drawn on its graph: groups of ops as boxes coloured by device, transfers as
thick arrows labelled with the bytes they move.

Ops are collapsed before drawing (:func:`collapse`), so a graph of thousands of ops stays
readable: by the layer tags of the graph (the model's layers, as the importer tagged them),
by name scope, by colocation group, or not at all for small graphs. One box stands for
the ops of one unit placed on one device, so a layer split across devices shows as one
box per device. Arrows between boxes on different devices are transfers (each tensor
counted once per destination box, as the simulator sends it once per device); arrows
within a device are thin data dependencies.

Two renderers: Graphviz ``dot`` (SVG/PNG/PDF; any size) and pure matplotlib (a lane per
device, boxes in topological order; for a few hundred boxes at most).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError, atomic_write

BY = ("auto", "layer", "scope", "group", "op")
MATPLOTLIB_MAX_NODES = 300
DOT_TIMEOUT_S = 300
MAX_ARROWS = 150  # transfer arrows drawn (the heaviest); beyond that no layout stays readable
MATPLOTLIB_LABELS = 60  # byte labels tried, heaviest first (each where it fits clear of boxes and labels)


@dataclass
class Collapsed:
    """Boxes (unit x device) and the arrows between them."""

    labels: list[str]           # one per box
    device: np.ndarray          # device index per box
    n_ops: np.ndarray           # ops per box
    flops: np.ndarray           # FLOPs per box
    rank: np.ndarray            # mean topological rank of the box's ops (for layout)
    edges: list[tuple[int, int, int, bool]]  # (src box, dst box, bytes, is a transfer)
    by: str
    unit_of_op: np.ndarray      # unit index per op
    box_of_op: np.ndarray       # box index per op

    @property
    def n_boxes(self) -> int:
        return len(self.labels)


def _scope(name: str, depth: int) -> str:
    if name.startswith("gradient_tape/"):  # gradients go with the forward ops they differentiate
        name = name[len("gradient_tape/"):]
    parts = name.split("/")[:-1] or [name]
    return "/".join(re.sub(r"_\d+$", "", p) if i == 0 else p for i, p in enumerate(parts[:depth]))


def _layer_names(graph, layer) -> dict[int, str]:
    """A readable name per layer tag: its most common name scopes below the model scope."""
    seen: dict[int, Counter] = {}
    for nm, l in zip(graph.names, layer.tolist()):
        s = nm[len("gradient_tape/"):] if nm.startswith("gradient_tape/") else nm
        parts = s.split("/")
        if len(parts) > 2:
            seen.setdefault(l, Counter())[re.sub(r"_\d+$", "", parts[1])] += 1
    out = {}
    for l, c in seen.items():
        top = [k for k, _ in c.most_common(2)]
        out[l] = ", ".join(top)
    return out


def collapse(graph, placement, by: str = "auto", depth: int = 2, max_units: int = 60) -> Collapsed:
    """Collapse ``graph``'s ops into units (``by``) and units x devices into boxes.

    ``auto``: every op for graphs of at most 40 ops, else layer tags where the graph has
    two or more, else name scopes of ``depth`` levels. Consecutive layer tags are merged
    into ranges so that there are at most ``max_units`` units.
    """
    if by not in BY:
        raise UserError(f"--by {by!r}: expected one of {', '.join(BY)}")
    p = np.asarray(placement, np.int64)
    n = graph.n_ops
    layer = np.asarray(graph.layer, np.int64)
    if by == "auto":
        by = "op" if n <= 40 else "layer" if len(np.unique(layer[layer >= 0])) >= 2 else "scope"
    if by == "layer":
        tags = np.unique(layer)
        if len(tags) > max_units:  # merge consecutive tags into ranges
            bins = np.array_split(tags, max_units)
            where = np.searchsorted(tags, layer)
            start = np.cumsum([0] + [len(b) for b in bins[:-1]])
            unit = np.searchsorted(start, where, side="right") - 1
            names = [f"layers {b[0]}–{b[-1]}" if len(b) > 1 else f"layer {b[0]}" for b in bins]
        else:
            unit = np.searchsorted(tags, layer)
            lname = _layer_names(graph, layer)
            names = [("untagged" if t < 0 else f"layer {t}") + (f": {lname[t]}" if t in lname else "")
                     for t in tags.tolist()]
    elif by == "scope":
        keys = [_scope(nm, depth) for nm in graph.names]
        order = {}
        for k in keys:
            order.setdefault(k, len(order))
        unit = np.array([order[k] for k in keys], np.int64)
        names = list(order)
    elif by == "group":
        unit = np.asarray(graph.group, np.int64)
        names = [f"group {k}: {graph.names[int(ops[0])]}" for k, ops in enumerate(graph.group_ops)]
    else:
        unit = np.arange(n)
        names = [f"{nm}\n{t}" for nm, t in zip(graph.names, graph.op_types)]
    D = int(p.max()) + 1 if n else 1
    key = unit * D + p
    uniq, box = np.unique(key, return_inverse=True)
    box = box.reshape(-1)
    nb = len(uniq)
    n_ops = np.bincount(box, minlength=nb)
    flops = np.bincount(box, weights=graph.flops, minlength=nb)
    rank = np.bincount(box, weights=graph.topo_rank.astype(np.float64), minlength=nb) / np.maximum(n_ops, 1)
    device = (uniq % D).astype(np.int64)
    labels = [names[int(u // D)] for u in uniq]
    # arrows: data edges between boxes; a tensor crosses to a box on another device once
    et = np.asarray(graph.edge_tensor)
    data = et >= 0
    sb, db = box[graph.edge_src[data]], box[graph.edge_dst[data]]
    t = et[data].astype(np.int64)
    keep = sb != db
    sb, db, t = sb[keep], db[keep], t[keep]
    cross = device[sb] != device[db]
    edges = []
    if len(sb):
        trip = np.unique(np.stack([sb, db, t, cross.astype(np.int64)]), axis=1)
        pair = trip[0] * nb + trip[1]
        byts = graph.tensor_bytes[trip[2]].astype(np.int64) * trip[3]
        pk, inv = np.unique(pair, return_inverse=True)
        total = np.bincount(inv.reshape(-1), weights=byts, minlength=len(pk)).astype(np.int64)
        xfer = np.zeros(len(pk), bool)
        np.logical_or.at(xfer, inv.reshape(-1), trip[3] > 0)
        edges = [(int(k // nb), int(k % nb), int(b), bool(x)) for k, b, x in zip(pk, total, xfer)]
    return Collapsed(labels, device, n_ops, flops, rank, edges, by, unit, box)


# ------------------------------------------------------------------ colours and text
def device_colours(n_devices: int) -> list[str]:
    """One hex colour per device (tab10, then tab20's lighter halves)."""
    import matplotlib

    base = [matplotlib.colors.to_hex(matplotlib.colormaps["tab10"](i)) for i in range(10)]
    extra = [matplotlib.colors.to_hex(matplotlib.colormaps["tab20"](2 * i + 1)) for i in range(10)]
    pal = base + extra
    return [pal[i % len(pal)] for i in range(n_devices)]


def _text_colour(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "#ffffff"


def human_bytes(b: float) -> str:
    for unit, s in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= s:
            return f"{b / s:.1f} {unit}"
    return f"{int(b)} B"


def _box_text(c: Collapsed, i: int) -> str:
    f = c.flops[i]
    fl = f"{f / 1e9:.1f} GFLOP" if f >= 1e8 else f"{f / 1e6:.1f} MFLOP" if f >= 1e5 else ""
    extra = f"{c.n_ops[i]} ops" + (f", {fl}" if fl else "")
    return f"{c.labels[i]}\n{extra}" if c.by != "op" else c.labels[i]


def _unit_rows(c: Collapsed) -> list[np.ndarray]:
    """The boxes of each unit (layer, scope, group) in model order, each in device order."""
    unit_of_box = np.zeros(c.n_boxes, np.int64)
    unit_of_box[c.box_of_op] = c.unit_of_op
    units = np.unique(unit_of_box)
    if c.by != "layer":  # scopes and groups: order by where their ops sit in the graph
        mean = np.array([c.rank[unit_of_box == u].mean() for u in units])
        units = units[np.argsort(mean, kind="stable")]
    out = []
    for u in units.tolist():
        boxes = np.flatnonzero(unit_of_box == u)
        out.append(boxes[np.argsort(c.device[boxes], kind="stable")])
    return out


def _rows(c: Collapsed) -> list[str]:
    """One row per unit in model order, its boxes side by side in device order: the drawing
    reads top to bottom like the model, whatever arrows are drawn."""
    out, firsts = [], []
    for boxes in _unit_rows(c):
        names = [f"n{b}" for b in boxes.tolist()]
        out.append("  { rank=same; " + "; ".join(names) + "; }")
        if len(names) > 1:
            out.append("  " + " -> ".join(names) + " [style=invis];")
        firsts.append(names[0])
    for a, b in zip(firsts, firsts[1:]):
        out.append(f"  {a} -> {b} [style=invis, weight=10];")
    return out


def drawn_edges(c: Collapsed) -> list[tuple[int, int, int, bool]]:
    """The arrows worth drawing: the ``MAX_ARROWS`` heaviest transfers, and dependencies
    within a device only while the drawing is small (they would hide the transfers)."""
    xfers = sorted((e for e in c.edges if e[3]), key=lambda e: -e[2])[:MAX_ARROWS]
    deps = [e for e in c.edges if not e[3]] if c.n_boxes <= 60 and len(c.edges) <= MAX_ARROWS else []
    return deps + xfers


def hidden_note(c: Collapsed) -> str:
    n_x = sum(1 for e in c.edges if e[3])
    return f"\n{n_x - MAX_ARROWS} lighter transfer arrows not drawn" if n_x > MAX_ARROWS else ""


def _edge_width(b: int, peak: int) -> float:
    return 1.5 + 6.5 * np.sqrt(b / peak) if peak else 1.5


# ------------------------------------------------------------------ Graphviz
def to_dot(c: Collapsed, cluster, title: str = "") -> str:
    """The collapsed placement as Graphviz DOT source."""
    col = device_colours(cluster.n_devices)

    def q(s):
        return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    big = c.n_boxes > 60
    lines = ["digraph placement {", "  graph [rankdir=TB, fontname=Helvetica, fontsize=12, labelloc=t, "
             f"label={q(title + hidden_note(c))}, nodesep=0.25, ranksep=0.45, size=\"24,36\""
             # crossing minimisation and network simplex dominate dot's time on big drawings: cap them
             + (", mclimit=0.3, nslimit=1, nslimit1=1, splines=line" if big else "") + "];",
             "  node [shape=box, style=\"rounded,filled\", fontname=Helvetica, fontsize=10, penwidth=0];",
             "  edge [fontname=Helvetica, fontsize=9, arrowsize=0.6];"]
    for i in range(c.n_boxes):
        fill = col[c.device[i]]
        lines.append(f"  n{i} [label={q(_box_text(c, i))}, fillcolor={q(fill)}, fontcolor={q(_text_colour(fill))}, "
                     f"tooltip={q(cluster.names[c.device[i]])}];")
    peak = max((b for _, _, b, x in c.edges if x), default=0)
    for s, d, b, x in drawn_edges(c):
        if x:
            lines.append(f"  n{s} -> n{d} [penwidth={_edge_width(b, peak):.2f}, color=\"#333333\", "
                         f"label={q(human_bytes(b))}];")
        else:
            lines.append(f"  n{s} -> n{d} [penwidth=0.6, color=\"#aaaaaa\", arrowsize=0.4];")
    if c.by != "op":
        lines += _rows(c)
    used = sorted(set(c.device.tolist()))
    cells = "".join(f'<TD BGCOLOR="{col[d]}"><FONT COLOR="{_text_colour(col[d])}">&nbsp;{_html(cluster.names[d])}'
                    '&nbsp;</FONT></TD>' for d in used)
    lines.append(f'  legend [shape=plaintext, style="", label=<<TABLE BORDER="0" CELLSPACING="4" CELLPADDING="4">'
                 f'<TR><TD>devices</TD>{cells}</TR></TABLE>>];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _html(s: str) -> str:
    import html

    return html.escape(str(s))


def dot_available() -> bool:
    return shutil.which("dot") is not None


def render_dot(source: str, fmt: str, dpi: int = 150) -> bytes:
    """Run Graphviz ``dot``; a missing ``dot`` is a one-line UserError saying how to get it."""
    exe = shutil.which("dot")
    if exe is None:
        raise UserError("Graphviz 'dot' is not on PATH: install it (Debian/Ubuntu: apt-get install graphviz; "
                        "macOS: brew install graphviz) or use --engine matplotlib")
    args = [exe, f"-T{fmt}"] + ([f"-Gdpi={dpi}"] if fmt == "png" else [])

    def run(extra):
        try:
            return subprocess.run(args + extra, input=source.encode(), capture_output=True, timeout=DOT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise UserError(f"dot did not lay the drawing out within {DOT_TIMEOUT_S} s: use fewer boxes "
                            "(--max-layers, --by scope --depth 1) or --engine matplotlib") from None

    r = run([])
    if r.returncode != 0 and b"spline" in r.stderr:
        # dot's spline router gives up on some layouts (Graphviz 2.43: an edge between two
        # boxes of one rank, "lost ... edge"); straight edges always route
        r = run(["-Gsplines=line"])
    if r.returncode != 0:
        msg = r.stderr.decode(errors="replace").strip().splitlines()
        errors = [m for m in msg if m.startswith("Error")]
        raise UserError(f"dot failed: {(errors or msg or ['exit ' + str(r.returncode)])[0]}")
    return r.stdout


# ------------------------------------------------------------------ matplotlib
_LANE, _ROW = 3.6, 1.6          # lane and row pitch (data units)
_W, _H = 2.1, 0.6               # box width and height
_FAN = 0.3                      # distance between parallel arrows of one pair of boxes
_LABEL_T = (0.5, 0.42, 0.58, 0.34, 0.66, 0.26, 0.74, 0.18, 0.82, 0.12, 0.88)  # label spots along an arrow


def _bezier(p0, c, p2, t: float) -> np.ndarray:
    return (1 - t) ** 2 * p0 + 2 * t * (1 - t) * c + t ** 2 * p2


def _routes(c: Collapsed, edges, xs: np.ndarray, ys: np.ndarray, lane_of_box: np.ndarray) -> list:
    """A quadratic Bézier (start, control, end) per arrow, in data units. Arrows between the
    same two boxes are fanned out side by side; arrows along a row that would cross the
    boxes between their ends arch over the row (rightwards) or under it (leftwards)."""
    pairs: dict[tuple[int, int], list[int]] = {}
    for k, (s, d, _, _) in enumerate(edges):
        pairs.setdefault((min(s, d), max(s, d)), []).append(k)
    gap = _ROW - _H
    out = [None] * len(edges)
    for (a, b), ks in pairs.items():
        for j, k in enumerate(ks):
            s, d = edges[k][:2]
            fan = (j - (len(ks) - 1) / 2) * _FAN
            if ys[s] == ys[d] and abs(lane_of_box[s] - lane_of_box[d]) > 1:
                # along a row past other boxes: over the row rightwards, under it leftwards
                up = 1 if xs[d] > xs[s] else -1
                side = np.sign(xs[d] - xs[s])
                span = abs(lane_of_box[s] - lane_of_box[d])  # wider arches higher, so they do not overlap
                inset = _W * min(0.1 + 0.12 * (span - 2), 0.4)
                p0 = np.array([xs[s] + side * inset, ys[s] + up * _H / 2])
                p2 = np.array([xs[d] - side * inset, ys[d] + up * _H / 2])
                ctrl = (p0 + p2) / 2 + [0, up * gap * min(0.6 + 0.4 * (span - 2), 1.5)]
                out[k] = (p0, ctrl, p2)
                continue
            # the route of a -> b; b -> a runs on the parallel route beside it, reversed
            if xs[a] == xs[b]:  # same lane: bottom of one box to the top of the other, bowed out
                down = -1 if ys[b] < ys[a] else 1
                p0 = np.array([xs[a] + _W / 4, ys[a] + down * _H / 2])
                p2 = np.array([xs[b] + _W / 4, ys[b] - down * _H / 2])
                ctrl = (p0 + p2) / 2 + [0.45 * abs(ys[b] - ys[a]), 0]
            else:  # across lanes: between the facing sides, leaving towards the other box's row
                side = 1 if xs[b] > xs[a] else -1
                vy = np.sign(ys[b] - ys[a]) * _H / 4
                p0 = np.array([xs[a] + side * _W / 2, ys[a] + vy])
                p2 = np.array([xs[b] - side * _W / 2, ys[b] - vy])
                ctrl = (p0 + p2) / 2
            v = p2 - p0
            n = np.array([-v[1], v[0]]) / (np.hypot(*v) or 1.0)
            p0, ctrl, p2 = p0 + fan * n, ctrl + fan * n, p2 + fan * n
            out[k] = (p0, ctrl, p2) if s == a else (p2, ctrl, p0)
    return out


def _place_labels(fig, ax, labels, routes, obstacles) -> int:
    """Put each byte label (heaviest first) at the first spot along its arrow where its
    box overlaps no node box, heading or label placed before; a label with no free spot is
    removed. Returns how many were removed."""
    renderer = fig.canvas.get_renderer()
    taken = list(obstacles)
    inside = fig.bbox
    dropped = 0
    for text, (p0, ctrl, p2) in zip(labels, routes):
        for t in _LABEL_T:
            text.set_position(_bezier(p0, ctrl, p2, t))
            bb = text.get_window_extent(renderer).padded(2.0)
            if (inside.x0 <= bb.x0 and bb.x1 <= inside.x1 and inside.y0 <= bb.y0 and bb.y1 <= inside.y1
                    and not any(bb.overlaps(o) for o in taken)):
                taken.append(bb)
                break
        else:
            text.remove()
            dropped += 1
    return dropped


def figure_matplotlib(c: Collapsed, cluster, title: str = ""):
    """The matplotlib drawing as a figure: a lane per device, boxes top to bottom in model
    order, transfers as thick arrows labelled with their bytes where a label fits clear of
    the boxes and of the other labels."""
    from .trace import _plt

    if c.n_boxes > MATPLOTLIB_MAX_NODES:
        raise UserError(f"{c.n_boxes} boxes are too many for the matplotlib drawing (at most "
                        f"{MATPLOTLIB_MAX_NODES}): use --by layer or scope, or --engine dot")
    plt = _plt()
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    from matplotlib.path import Path as MplPath

    col = device_colours(cluster.n_devices)
    used = sorted(set(c.device.tolist()))
    lane = {d: i for i, d in enumerate(used)}
    row = np.empty(c.n_boxes)
    if c.by == "op":  # each box its own row, in topological order
        row[np.argsort(c.rank, kind="stable")] = np.arange(c.n_boxes)
    else:  # a row per unit in model order, as in the Graphviz drawing: a unit has one box per lane
        for r, boxes in enumerate(_unit_rows(c)):
            row[boxes] = r
    lane_of_box = np.array([lane[d] for d in c.device.tolist()], np.int64)
    xs = lane_of_box * _LANE
    ys = -row * _ROW
    n_rows = row.max() + 1 if c.n_boxes else 1
    gap = _ROW - _H
    fig, ax = plt.subplots(figsize=(max(5.0, 2.9 * len(used) + 0.8), max(2.5, n_rows * 0.86 + 1.6)))
    peak = max((b for _, _, b, x in c.edges if x), default=0)
    edges = [e for e in drawn_edges(c) if e[0] != e[1]]
    routes = _routes(c, edges, xs, ys, lane_of_box)
    for (s, d, b, x), (p0, ctrl, p2) in zip(edges, routes):
        path = MplPath([p0, ctrl, p2], [MplPath.MOVETO, MplPath.CURVE3, MplPath.CURVE3])
        a = FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=12 if x else 7,
                            lw=_edge_width(b, peak) if x else 0.5, color="#333333" if x else "#b0b0b0",
                            zorder=1.5 if x else 1, alpha=0.7 if x else 0.9)
        a.set_gid(f"edge-{s}-{d}")
        ax.add_patch(a)
    obstacles = []
    for i in range(c.n_boxes):
        fill = col[c.device[i]]
        box = FancyBboxPatch((xs[i] - _W / 2, ys[i] - _H / 2), _W, _H, boxstyle="round,pad=0.02,rounding_size=0.08",
                             fc=fill, ec="none", zorder=2)
        box.set_gid(f"box-{i}")
        ax.add_patch(box)
        obstacles.append(box)
        ax.text(xs[i], ys[i], _box_text(c, i), ha="center", va="center", fontsize=7, color=_text_colour(fill),
                zorder=5)
    for d in used:
        obstacles.append(ax.text(lane[d] * _LANE, _H / 2 + gap, cluster.names[d], ha="center", va="bottom",
                                 fontsize=10, weight="bold", color=col[d], zorder=5))
    ax.set_xlim(-_LANE / 2 + 0.1, _LANE * (len(used) - 1) + _LANE / 2 - 0.1)
    ax.set_ylim((ys.min() if c.n_boxes else 0) - _H / 2 - 0.8 * gap, _H / 2 + gap + 0.4)
    ax.axis("off")
    if title:
        ax.set_title(title + hidden_note(c), fontsize=10)
    fig.tight_layout()
    # labels last, on the final layout: where a label fits is measured in display units
    order = sorted(range(len(edges)), key=lambda k: -edges[k][2])
    order = [k for k in order if edges[k][3]][:MATPLOTLIB_LABELS]
    labels = []
    for k in order:
        t = ax.text(0, 0, human_bytes(edges[k][2]), fontsize=7, ha="center", va="center", zorder=3,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
        t.set_gid(f"label-{edges[k][0]}-{edges[k][1]}")
        labels.append(t)
    renderer = fig.canvas.get_renderer()
    dropped = _place_labels(fig, ax, labels, [routes[k] for k in order],
                            [o.get_window_extent(renderer).padded(1.0) for o in obstacles])
    n_x = sum(1 for e in edges if e[3])
    if title and (dropped or n_x > len(order)):
        ax.set_title(ax.get_title() + f"; {n_x - len(order) + dropped} byte labels left out (no room)", fontsize=10)
    return fig


def draw_matplotlib(c: Collapsed, cluster, path, fmt: str, dpi: int = 150, title: str = "") -> None:
    """:func:`figure_matplotlib` written to ``path``."""
    from .trace import save_figure

    save_figure(figure_matplotlib(c, cluster, title), path, fmt, dpi)


# ------------------------------------------------------------------ entry point
def draw_placement(graph, cluster, placement, path, by: str = "auto", depth: int = 2, engine: str = "auto",
                   fmt: str | None = None, dpi: int = 150, title: str | None = None, max_units: int = 60) -> dict:
    """Draw ``placement`` (per-op device indices) on ``graph`` into ``path`` (SVG, PNG or PDF).

    ``engine``: ``dot`` (Graphviz), ``matplotlib``, or ``auto`` (dot when installed, else
    matplotlib). Returns what was drawn: boxes, transfer arrows and bytes, engine used.
    """
    from .trace import figure_format

    fmt = figure_format(path, fmt)
    if engine not in ("auto", "dot", "matplotlib"):
        raise UserError(f"--engine {engine!r}: expected auto, dot or matplotlib")
    c = collapse(graph, placement, by=by, depth=depth, max_units=max_units)
    title = title if title is not None else f"{graph.name} on {cluster.name} ({graph.n_ops} ops, by {c.by})"
    if engine == "auto":
        engine = "dot" if dot_available() else "matplotlib"
    if engine == "dot":
        atomic_write(Path(path), render_dot(to_dot(c, cluster, title), fmt, dpi))
    else:
        draw_matplotlib(c, cluster, path, fmt, dpi, title)
    xfer = [e for e in c.edges if e[3]]
    return {"boxes": c.n_boxes, "by": c.by, "engine": engine, "transfer_arrows": len(xfer),
            "transfer_bytes": int(sum(e[2] for e in xfer))}

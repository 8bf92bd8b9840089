"""Reports over a sweep's results store: tables (markdown, CSV, LaTeX), figures (PNG, PDF
or SVG), one HTML page.

Cells aggregate the ``ok`` runs of one (method, graph, cluster) over seeds as mean ± std
(sample std, n-1). Ratios are taken per seed and then averaged: step / lower bound
(1.00 is the bound, so it says how much is left), and step / expert (below 1 is faster
than the expert placement) where the store holds ``expert`` runs of the same graph,
cluster and budget. Infeasible results (the best placement found is out of memory) are
counted, not averaged.
"""

from __future__ import annotations

import base64
import html as _html
import io
import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from placetool.costmodel.errors import UserError, atomic_write

from placetool.costmodel.trace import _fmt

from .store import ResultStore

EXPERT = "expert"


# ------------------------------------------------------------------ numbers
def mean_std(xs) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    xs = np.asarray(list(xs), dtype=float)
    if xs.size == 0:
        return math.nan, math.nan
    return float(xs.mean()), float(xs.std(ddof=1)) if xs.size > 1 else 0.0


def _method_label(row, many_budgets: bool) -> str:
    label = row["method"]
    opts = row["options"] or {}
    if opts:
        label += "{" + ", ".join(f"{k}={v}" for k, v in sorted(opts.items())) + "}"
    if many_budgets:
        label += f" [{row['budget']}]"
    return label


def summarize(rows: list[dict]) -> dict:
    """Aggregate store rows into cells keyed by (method label, (graph, cluster)).

    Returns {"methods", "columns", "cells", "has_expert", "failed"}; a cell holds n_ok,
    n_failed, n_infeasible, step (mean, std), lb_ratio (mean, std), expert_ratio
    (mean, std) or None, lower_bound_us, and the per-seed rows.
    """
    many_budgets = len({r["budget"] for r in rows}) > 1
    expert_step: dict = defaultdict(list)  # (graph, cluster, budget) -> feasible expert step times
    for r in rows:
        if r["method"] == EXPERT and r["status"] == "ok" and r["feasible"] and not r["options"]:
            expert_step[r["graph"], r["cluster"], r["budget"]].append(r["step_time_us"])
    groups: dict = defaultdict(list)
    methods, columns = [], []
    for r in rows:
        m, col = _method_label(r, many_budgets), (r["graph"], r["cluster"])
        if m not in methods:
            methods.append(m)
        if col not in columns:
            columns.append(col)
        groups[m, col].append(r)
    cells = {}
    for (m, col), rs in groups.items():
        good = [r for r in rs if r["status"] == "ok" and r["feasible"]]
        cell = {
            "n_ok": sum(r["status"] == "ok" for r in rs),
            "n_failed": sum(r["status"] == "failed" for r in rs),
            "n_infeasible": sum(r["status"] == "ok" and not r["feasible"] for r in rs),
            "step": mean_std(r["step_time_us"] for r in good),
            "lb_ratio": mean_std(r["step_time_us"] / r["lower_bound_us"] for r in good if r["lower_bound_us"]),
            "lower_bound_us": good[0]["lower_bound_us"] if good else None,
            "expert_ratio": None,
            "rows": rs,
        }
        ref = [expert_step.get((col[0], col[1], r["budget"])) for r in good]
        if good and all(ref):
            cell["expert_ratio"] = mean_std(r["step_time_us"] / float(np.mean(e)) for r, e in zip(good, ref))
        cells[m, col] = cell
    size: dict = defaultdict(int)
    for r in rows:
        size[r["graph"], r["cluster"]] = max(size[r["graph"], r["cluster"]], r["n_ops"] or 0)
    columns.sort(key=lambda col: (size[col], col))  # graphs small to large
    first_seen = {m: i for i, m in enumerate(methods)}
    methods.sort(key=lambda m: (m.split("{")[0].split(" [")[0] != EXPERT, first_seen[m]))
    return {"methods": methods, "columns": columns, "cells": cells, "has_expert": bool(expert_step),
            "failed": [r for r in rows if r["status"] == "failed"]}


def _unit(us: float) -> tuple[float, str]:
    return (1, "µs") if not us >= 1e4 else (1e3, "ms") if us < 1e7 else (1e6, "s")


def _fmt_time_pm(mean: float, std: float, ref: float | None = None) -> str:
    """mean ± std in the unit that suits ``ref`` (a column's typical value) or the mean; no
    "± 0" for results that did not vary."""
    scale, unit = _unit(mean if ref is None else ref)
    nd = 1 if scale == 1 else 2
    pm = f" ± {std / scale:,.{nd}f}" if std == std and round(std / scale, nd) != 0 else ""
    return f"{mean / scale:,.{nd}f}{pm} {unit}"


def _typical_n(summary: dict) -> int:
    """The number of good runs most cells have (said once in the note, not in every cell)."""
    ns = [c["n_ok"] - c["n_infeasible"] for c in summary["cells"].values()]
    return max(set(ns), key=ns.count) if ns else 0


def _cell_text(cell, what: str, ref: float | None = None, n_typical: int | None = None) -> str:
    if cell is None:
        return "—"
    good = cell["n_ok"] - cell["n_infeasible"]
    notes = []
    if cell["n_failed"]:
        notes.append(f"{cell['n_failed']} failed")
    if cell["n_infeasible"]:
        notes.append(f"{cell['n_infeasible']} infeasible")
    if good == 0:
        return ", ".join(notes) or "—"
    if what == "step":
        text = _fmt_time_pm(*cell["step"], ref=ref)
    else:
        v = cell[what]
        if v is None:
            return "—"
        text = f"{v[0]:.3f}" + (f" ± {v[1]:.3f}" if round(v[1], 3) != 0 else "")
    n = f" (n={good})" if good != n_typical else ""
    return text + n + (f"; {', '.join(notes)}" if notes else "")


def best_methods(summary: dict, what: str) -> dict:
    """{column: [methods]} with the lowest mean of ``what`` (step, lb_ratio, expert_ratio) per
    column; ties (e.g. a search seeded from the method it could not beat) are all best."""
    out = {}
    for c in summary["columns"]:
        vals = []
        for m in summary["methods"]:
            cell = summary["cells"].get((m, c))
            v = cell and cell.get(what)
            if v and v[0] == v[0] and cell["n_ok"] > cell["n_infeasible"]:
                vals.append((v[0], m))
        if vals:
            lo = min(v for v, _ in vals)
            out[c] = [m for v, m in vals if v <= lo * (1 + 1e-12)]
    return out


def _col_label(col, columns) -> str:
    clusters = {c for _, c in columns}
    return col[0] if len(clusters) == 1 else f"{col[0]} @ {col[1]}"


def _specs(summary: dict) -> list[tuple[str, str, str]]:
    n = _typical_n(summary)
    over = f"over {n} seed{'s' if n != 1 else ''}" if n else "over seeds"
    specs = [("Step time", f"mean ± std {over} of the best simulated step time; best per column in bold", "step"),
             ("Step time / lower bound", "1.000 is the lower bound; lower is better", "lb_ratio")]
    if summary["has_expert"]:
        specs.append(("Step time / expert", "below 1.000 is faster than the expert placement", "expert_ratio"))
    return specs


def tables(summary: dict) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """(title, note, header, rows) of each table in the report."""
    return [t[:4] for t in _tables(summary)]


def _tables(summary: dict):
    """As :func:`tables`, plus the set of (row, column) cells that are best in their column."""
    cols, methods, cells = summary["columns"], summary["methods"], summary["cells"]
    header = ["method"] + [_col_label(c, cols) for c in cols]
    out = []
    # one unit per column of step times: the unit of the column's median
    ref = {c: float(np.nanmedian([cells[m, c]["step"][0] for m in methods if (m, c) in cells] or [np.nan]))
           for c in cols}
    n_typ = _typical_n(summary)
    for title, note, what in _specs(summary):
        rows = [[m] + [_cell_text(cells.get((m, c)), what, ref[c], n_typ) for c in cols] for m in methods]
        best = best_methods(summary, what)
        bold = {(methods.index(m), 1 + cols.index(c)) for c, ms in best.items() for m in ms}
        out.append((title, note, header, rows, bold))
    if summary["failed"]:
        rows = [[r["graph"], r["cluster"], r["method"], str(r["seed"]), (r["error"] or "").splitlines()[0][:200]]
                for r in summary["failed"]]
        out.append(("Failed runs", "the error each raised", ["graph", "cluster", "method", "seed", "error"], rows,
                    set()))
    return out


def csv_table(summary: dict) -> str:
    """Every cell as numbers, one row per (method, graph, cluster): for pandas, R or a spreadsheet."""
    import csv

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["method", "graph", "cluster", "n_ok", "n_failed", "n_infeasible", "step_time_us_mean",
                "step_time_us_std", "lower_bound_us", "lb_ratio_mean", "lb_ratio_std", "expert_ratio_mean",
                "expert_ratio_std", "best_step_time"])
    best = best_methods(summary, "step")

    def num(x):
        return "" if x is None or x != x else repr(float(x))

    for m in summary["methods"]:
        for c in summary["columns"]:
            cell = summary["cells"].get((m, c))
            if cell is None:
                continue
            er = cell["expert_ratio"] or (None, None)
            w.writerow([m, c[0], c[1], cell["n_ok"], cell["n_failed"], cell["n_infeasible"],
                        num(cell["step"][0]), num(cell["step"][1]), num(cell["lower_bound_us"]),
                        num(cell["lb_ratio"][0]), num(cell["lb_ratio"][1]), num(er[0]), num(er[1]),
                        int(m in best.get(c, ()))])
    return buf.getvalue()


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(s: str) -> str:
    s = "".join(_TEX.get(ch, ch) for ch in s)
    return s.replace("±", r"$\pm$").replace("µs", r"\textmu s").replace("—", "--")


def latex_tables(summary: dict, caption_prefix: str = "") -> str:
    """The report's tables as LaTeX (booktabs; best per column in bold), ready to \\input."""
    parts = ["% placetool sweep report tables; needs \\usepackage{booktabs}"]
    for title, note, header, rows, bold in _tables(summary):
        if title == "Failed runs":
            continue
        parts += [r"\begin{table}[t]", r"\centering", r"\small",
                  r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}", r"\toprule",
                  " & ".join(_tex(h) for h in header) + r" \\", r"\midrule"]
        for i, row in enumerate(rows):
            cells = [_tex(x) if (i, j) not in bold else r"\textbf{" + _tex(x) + "}" for j, x in enumerate(row)]
            parts.append(" & ".join(cells) + r" \\")
        parts += [r"\bottomrule", r"\end{tabular}",
                  r"\caption{" + _tex(caption_prefix + title) + ". " + _tex(note) + ".}", r"\end{table}", ""]
    return "\n".join(parts) + "\n"


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def markdown(summary: dict, title: str, meta: list[str], images: list[tuple[str, str]]) -> str:
    lines = [f"# {title}", ""] + [f"- {m}" for m in meta] + [""]
    for t, note, header, rows, bold in _tables(summary):
        lines += [f"## {t}", "", f"_{note}_", "", "| " + " | ".join(map(_md_escape, header)) + " |",
                  "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        lines += ["| " + " | ".join(f"**{_md_escape(x)}**" if (i, j) in bold else _md_escape(x)
                                    for j, x in enumerate(row)) + " |" for i, row in enumerate(rows)]
        lines.append("")
    if images:
        lines += ["## Plots", ""]
        lines += [f"![{cap}]({name})\n" for name, cap in images]
    return "\n".join(lines) + "\n"


def html_page(summary: dict, title: str, meta: list[str], images: list[tuple[str, bytes, str]]) -> str:
    """One self-contained page: tables (best per column in bold), the plots inlined (PNG or SVG)."""
    e = _html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>",
             "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}",
             "table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:4px 8px}",
             "td{text-align:right}td:first-child{text-align:left}th{background:#f3f3f3}",
             "img{max-width:100%;border:1px solid #eee;margin:.5em 0}.note{color:#666;font-style:italic}",
             "td.best{font-weight:bold;background:#e8f4e8}figure img{max-width:960px}",
             "</style></head><body>", f"<h1>{e(title)}</h1><ul>"]
    parts += [f"<li>{e(m)}</li>" for m in meta]
    parts.append("</ul>")
    for t, note, header, rows, bold in _tables(summary):
        parts.append(f"<h2>{e(t)}</h2><p class='note'>{e(note)}</p><table><tr>")
        parts += [f"<th>{e(h)}</th>" for h in header]
        parts.append("</tr>")
        for i, row in enumerate(rows):
            parts.append("<tr>" + "".join(f"<td class='best'>{e(x)}</td>" if (i, j) in bold else f"<td>{e(x)}</td>"
                                          for j, x in enumerate(row)) + "</tr>")
        parts.append("</table>")
    if images:
        parts.append("<h2>Plots</h2>")
    for name, data, cap in images:
        b64 = base64.b64encode(data).decode("ascii")
        mime = "image/svg+xml" if name.endswith(".svg") else "image/png"
        parts.append(f"<figure><img alt='{e(cap)}' src='data:{mime};base64,{b64}'>"
                     f"<figcaption>{e(cap)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------ plots
def _plt():
    from placetool.costmodel.trace import _plt as plt

    return plt()


def _render(fig, fmts, dpi: int = 200) -> dict[str, bytes]:
    """{format: bytes} of a figure in each of ``fmts``; closes it."""
    out = {}
    try:
        for fmt in fmts:
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=dpi)
            out[fmt] = buf.getvalue()
    finally:
        _plt().close(fig)
    return out


def _colours(methods):
    cmap = _plt().get_cmap("tab10")
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def plot_methods(summary: dict):
    """Grouped bars: step / lower bound per method, one group per graph (± std over seeds)."""
    plt = _plt()
    cols, methods, cells = summary["columns"], summary["methods"], summary["cells"]
    if not any(c["lb_ratio"][0] == c["lb_ratio"][0] for c in cells.values()):
        return None
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6.5, 1.2 + len(cols) * (0.5 + 0.35 * len(methods))), 4.6))
    colour = _colours(methods)
    for i, m in enumerate(methods):
        xs, ys, es = [], [], []
        for j, c in enumerate(cols):
            cell = cells.get((m, c))
            if cell and cell["lb_ratio"][0] == cell["lb_ratio"][0]:
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(cell["lb_ratio"][0])
                es.append(cell["lb_ratio"][1])
        bars = ax.bar(xs, ys, width * 0.92, label=m, color=colour[m])
        nz = [i for i, e in enumerate(es) if e > 0]  # no whiskers for results that did not vary
        if nz:
            ax.errorbar([xs[i] for i in nz], [ys[i] for i in nz], yerr=[es[i] for i in nz], fmt="none",
                        ecolor="k", capsize=3, lw=1)
        if len(methods) * len(cols) <= 40:
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    ax.axhline(1.0, color="k", ls="--", lw=1, label="lower bound")
    ax.set_xticks(range(len(cols)), [_col_label(c, cols) for c in cols], rotation=15 if len(cols) > 4 else 0)
    ax.set_ylabel("step time / lower bound (lower is better)")
    ax.set_title("Method comparison (mean ± std over seeds)")
    ax.set_ylim(0, None)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=min(4, len(methods) + 1), loc="upper left", bbox_to_anchor=(0, -0.12 if len(cols) <= 4 else -0.2))
    fig.tight_layout()
    return fig


def plot_convergence(summary: dict, x: str = "evaluations"):
    """Best-so-far step time against evaluations (or wall-clock ``seconds``), one panel per
    graph, a line per run; a figure, or None without histories."""
    if x not in ("evaluations", "seconds"):
        raise ValueError(f"x must be evaluations or seconds, got {x!r}")
    xi = 0 if x == "evaluations" else 1
    plt = _plt()
    cols, methods, cells = summary["columns"], summary["methods"], summary["cells"]
    if not any(r.get("history") for c in cells.values() for r in c["rows"]):
        return None
    n = len(cols)
    ncol = min(3, n)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.8 * nrow), squeeze=False)
    colour = _colours(methods)
    handles = {}
    for k, c in enumerate(cols):
        ax = axes[k // ncol][k % ncol]
        lb = None
        peak = max((p[2] for m in methods if (m, c) in cells for r in cells[m, c]["rows"]
                    for p in (r.get("history") or []) if np.isfinite(p[2])), default=1.0)
        scale, unit = _unit(peak)
        for m in methods:
            cell = cells.get((m, c))
            if not cell:
                continue
            for r in cell["rows"]:
                h = r.get("history") or []
                if r["status"] != "ok" or not h:
                    continue
                lb = r["lower_bound_us"]
                end = r["evaluations"] if xi == 0 else (r.get("seconds") or h[-1][1])
                # the first evaluation may take 0 s on the clock: keep it on a log axis
                xs = [max(p[xi], 1e-3 if xi else 1) for p in h] + [max(end, h[-1][xi], 1e-3 if xi else 1)]
                y = [p[2] / scale for p in h] + [h[-1][2] / scale]
                (line,) = ax.step(xs, y, where="post", color=colour[m], lw=1.4, alpha=0.8)
                ax.plot(xs[-1], y[-1], "o", color=colour[m], ms=4)
                handles.setdefault(m, line)
        if lb:
            handles["lower bound"] = ax.axhline(lb / scale, color="k", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_ylim(0, None)
        ax.set_title(_col_label(c, cols), fontsize=10)
        ax.set_xlabel(("evaluations" if xi == 0 else "wall-clock seconds") + " (log scale; a dot ends each run)")
        ax.set_ylabel(f"best step time ({unit})")
        ax.grid(alpha=0.3)
    for k in range(n, nrow * ncol):
        axes[k // ncol][k % ncol].set_visible(False)
    fig.suptitle("Convergence: best-so-far step time " + ("per evaluation" if xi == 0 else "against wall-clock time")
                 + ", one line per seed")
    order = [m for m in methods if m in handles] + (["lower bound"] if "lower bound" in handles else [])
    fig.legend([handles[m] for m in order], order, loc="lower center", ncol=min(len(order), 7), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.1 if nrow == 1 else 0.05, 1, 1))
    return fig


def plot_best_gantt(summary: dict, col, fmts=("png",), dpi: int = 200) -> tuple[dict, str] | None:
    """The Gantt timeline of the fastest feasible placement found for one (graph, cluster)."""
    best = None
    for (m, c), cell in summary["cells"].items():
        if c != col:
            continue
        for r in cell["rows"]:
            if (r["status"] == "ok" and r["feasible"] and r.get("placement_path")
                    and Path(r["placement_path"]).is_file()
                    and (best is None or r["step_time_us"] < best["step_time_us"])):
                best = r
    if best is None:
        return None
    from placetool.costmodel import CostModel, presets

    g = presets.load_graph(best.get("graph_source") or best["graph"])
    cl = presets.load_cluster(best.get("cluster_source") or best["cluster"])
    cm = CostModel(g, cl)
    res = cm.simulate(cm.load_placement(best["placement_path"]), trace=True)
    if res.trace is None:
        return None
    caption = (f"{best['graph']} on {best['cluster']}: best placement, {best['method']} seed {best['seed']}, "
               f"step {_fmt(res.step_time_us)} (lower bound {_fmt(best['lower_bound_us'])})")
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for fmt in fmts:
            p = Path(d) / f"gantt.{fmt}"
            res.trace.plot(g, cl, p, title=caption, lower_bound_us=cm.lower_bound_us(), fmt=fmt, dpi=dpi)
            out[fmt] = p.read_bytes()
    return out, caption


# ------------------------------------------------------------------ driver
def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(s).name.removesuffix(".npz").removesuffix(".toml"))


def _gantt_names(columns) -> dict:
    """A distinct file stem per (graph, cluster): graphs v1/model.npz and v2/model.npz
    share a slug, so colliding names get a short hash of the full path."""
    import hashlib

    base = {col: f"gantt_{_slug(col[0])}_{_slug(col[1])}" for col in columns}
    counts: dict = {}
    for b in base.values():
        counts[b] = counts.get(b, 0) + 1
    return {col: (b if counts[b] == 1 else f"{b}_{hashlib.sha1(repr(col).encode()).hexdigest()[:6]}")
            for col, b in base.items()}


def build_report(results, out_dir, html: bool = False, gantt: bool = True, fmt: str = "png",
                 dpi: int = 200) -> dict:
    """Write report.md (+ report.html), tables.csv, tables.tex and the figures (methods,
    convergence per evaluation and per wall-clock second, gantt_*) as ``fmt`` (png, pdf or
    svg) into ``out_dir``; returns {"files": [...], "runs", "ok", "failed"}."""
    if fmt not in ("png", "pdf", "svg"):
        raise UserError(f"--format {fmt!r}: expected png, pdf or svg")
    out = Path(out_dir)
    with ResultStore(results, create=False) as store:
        rows = store.rows()
    if not rows:
        raise UserError(f"{results}: holds no runs yet")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    # the page shows PNG or SVG; a PDF report gets PNG copies for its page
    page_fmt = "svg" if fmt == "svg" else "png"
    fmts = [fmt] + ([page_fmt] if html and page_fmt != fmt else [])
    figures: list[tuple[str, dict, str]] = []
    fig = plot_methods(summary)
    if fig is not None:
        figures.append(("methods", _render(fig, fmts, dpi), "Method comparison: step time relative to the lower bound"))
    fig = plot_convergence(summary)
    if fig is not None:
        figures.append(("convergence", _render(fig, fmts, dpi),
                        "Convergence: best-so-far step time against evaluations"))
    fig = plot_convergence(summary, x="seconds")
    if fig is not None:
        figures.append(("convergence_time", _render(fig, fmts, dpi),
                        "Convergence: best-so-far step time against wall-clock seconds"))
    if gantt:
        names = _gantt_names(summary["columns"])
        for col in summary["columns"]:
            got = plot_best_gantt(summary, col, fmts, dpi)
            if got:
                figures.append((names[col], got[0], got[1]))
    n_ok = sum(r["status"] == "ok" for r in rows)
    budgets = sorted({r["budget"] for r in rows})
    clusters = list(dict.fromkeys(c for _, c in summary["columns"]))
    graphs = list(dict.fromkeys(g for g, _ in summary["columns"]))
    meta = [f"results: {Path(results).name}", f"cluster{'s' if len(clusters) > 1 else ''}: {', '.join(clusters)}",
            f"graphs: {', '.join(graphs)}",
            f"runs: {len(rows)} ({n_ok} ok, {len(rows) - n_ok} failed)",
            f"budget: {', '.join(budgets)}",
            f"seeds: {', '.join(map(str, sorted({r['seed'] for r in rows})))}",
            f"last run finished: {max((r['timestamp'] or '') for r in rows)}"]
    title = f"placetool sweep report: {', '.join(clusters)}"
    files = []
    for name, data, _ in figures:
        atomic_write(out / f"{name}.{fmt}", data[fmt])
        files.append(str(out / f"{name}.{fmt}"))
    atomic_write(out / "report.md", markdown(summary, title, meta, [(f"{n}.{fmt}", c) for n, _, c in figures]))
    atomic_write(out / "tables.csv", csv_table(summary))
    atomic_write(out / "tables.tex", latex_tables(summary, caption_prefix=f"{', '.join(clusters)}: "))
    files += [str(out / "report.md"), str(out / "tables.csv"), str(out / "tables.tex")]
    if html:
        page_images = [(f"{n}.{page_fmt}", d[page_fmt], c) for n, d, c in figures]
        atomic_write(out / "report.html", html_page(summary, title, meta, page_images))
        files.append(str(out / "report.html"))
    return {"files": files, "runs": len(rows), "ok": n_ok, "failed": len(rows) - n_ok,
            "summary": summary}


__all__ = ["build_report", "summarize", "tables", "markdown", "html_page", "mean_std", "csv_table",
           "latex_tables", "best_methods", "plot_methods", "plot_convergence"]

"""placetool report: tables as CSV and LaTeX, best entries marked, figures in png/pdf/svg."""

from __future__ import annotations

import csv
import io
import xml.etree.ElementTree as ET

import pytest

from placetool.search.sweeps.report import best_methods, build_report, csv_table, latex_tables, markdown, summarize
from placetool.search.sweeps.store import ResultStore


def _store(path):
    st = ResultStore(path)
    base = dict(cluster="lab_4", budget="evals=8", options="{}", status="ok", feasible=1, lower_bound_us=50.0,
                n_ops=10)
    runs = {  # (method, graph): step per seed
        ("fast", "g_a"): (60.0, 80.0), ("slow", "g_a"): (200.0, 200.0),
        ("fast", "g_b"): (3000.0, 3000.0), ("slow", "g_b"): (2500.0,),
    }
    for (m, g), steps in runs.items():
        for seed, step in enumerate(steps):
            hist = [[1, 0.0, 4 * step], [3, 0.5 + seed, 2 * step], [8, 2.0 + seed, step]]
            st.put({**base, "graph": g, "method": m, "seed": seed, "step_time_us": step, "history": hist,
                    "evaluations": 8, "seconds": 2.5 + seed})
    st.close()
    return summarize(ResultStore(path, create=False).rows())


def test_best_per_column_and_no_zero_spread_clutter(tmp_path):
    s = _store(tmp_path / "r.db")
    assert best_methods(s, "step") == {("g_a", "lab_4"): ["fast"], ("g_b", "lab_4"): ["slow"]}
    md = markdown(s, "t", [], [])
    assert "| fast | **70.0 ± 14.1 µs** | 3,000.0 µs |" in md       # slow on g_b had one seed only:
    assert "| slow | 200.0 µs | **2,500.0 µs (n=1)** |" in md        # its n is said, 2 is in the note
    assert "± 0.0 " not in md and "± 0.000" not in md and "over 2 seeds" in md


def test_csv_holds_the_numbers(tmp_path):
    s = _store(tmp_path / "r.db")
    rows = list(csv.DictReader(io.StringIO(csv_table(s))))
    assert len(rows) == 4
    r = next(r for r in rows if (r["method"], r["graph"]) == ("fast", "g_a"))
    assert float(r["step_time_us_mean"]) == 70.0 and float(r["step_time_us_std"]) == pytest.approx(14.142135623)
    assert float(r["lb_ratio_mean"]) == pytest.approx(1.4) and r["best_step_time"] == "1"
    assert r["expert_ratio_mean"] == "" and r["cluster"] == "lab_4"


def test_latex_escapes_and_bolds_the_best(tmp_path):
    s = _store(tmp_path / "r.db")
    tex = latex_tables(s, caption_prefix="lab_4: ")
    assert r"method & g\_a & g\_b \\" in tex
    assert r"fast & \textbf{70.0 $\pm$ 14.1 \textmu s} & 3,000.0 \textmu s \\" in tex
    assert r"\caption{lab\_4: Step time." in tex
    assert tex.count(r"\begin{table}") == tex.count(r"\end{table}") == 2  # step and step / lower bound


@pytest.mark.parametrize("fmt", ["svg", "pdf"])
def test_report_figures_in_each_format_and_the_page(tmp_path, fmt):
    _store(tmp_path / "r.db")
    out = tmp_path / "rep"
    r = build_report(tmp_path / "r.db", out, html=True, gantt=False, fmt=fmt, dpi=80)
    names = sorted(p.rsplit("/", 1)[1] for p in r["files"])
    assert names == sorted([f"methods.{fmt}", f"convergence.{fmt}", f"convergence_time.{fmt}", "report.md",
                            "tables.csv", "tables.tex", "report.html"])
    for n in ("methods", "convergence", "convergence_time"):
        data = (out / f"{n}.{fmt}").read_bytes()
        if fmt == "svg":
            ET.fromstring(data)
        else:
            assert data[:5] == b"%PDF-"
    page = (out / "report.html").read_text()
    assert "<h1>placetool sweep report: lab_4</h1>" in page and "<td class='best'>" in page
    assert page.count("data:image/svg+xml;base64," if fmt == "svg" else "data:image/png;base64,") == 3
    if fmt == "svg":
        text = (out / "convergence_time.svg").read_text()
        assert "wall-clock seconds" in text and "lower bound" in text


def test_report_cli_format_option(tmp_path):
    from click.testing import CliRunner

    from placetool.cli.main import cli

    _store(tmp_path / "r.db")
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "r.db"), "-o", str(tmp_path / "o"), "--format", "pdf",
                                 "--no-gantt", "--dpi", "60", "--json"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "o" / "methods.pdf").read_bytes()[:5] == b"%PDF-"
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "r.db"), "--format", "jpg"])
    assert r.exit_code == 2 and "jpg" in r.output

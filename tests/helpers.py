"""Small graphs and clusters shared by the tests."""

from __future__ import annotations

import os

import networkx as nx
import numpy as np

from placetool.costmodel import Cluster, CostModel, OpGraph
from placetool.search import Problem


def cluster(n_devices=2, latency=1.0, bandwidth=10.0, memory=1 << 40, kinds=None, name="test", link_queue="fifo",
            link_send="eager", **transfer_costs):
    """A cluster with uniform links (``link_queue``: do transfers on a link wait for
    each other; ``link_send``: does a tensor leave only once its device is idle); device
    0 is a CPU unless kinds say otherwise.

    ``transfer_costs``: send_us, send_us_per_byte, recv_us, recv_us_per_byte, each one
    number for every device or a list with one per device.
    """
    kinds = kinds or (["cpu"] + ["gpu"] * (n_devices - 1))
    mem = memory if isinstance(memory, (list, tuple)) else [memory] * n_devices
    costs = [{} for _ in range(n_devices)]
    for key, v in transfer_costs.items():
        for i in range(n_devices):
            costs[i][key] = v[i] if isinstance(v, (list, tuple)) else v
    return Cluster.from_dict({
        "name": name,
        "devices": [{"name": f"d{i}", "kind": k, "memory_bytes": m, **costs[i]}
                    for i, (k, m) in enumerate(zip(kinds, mem))],
        "links": {"default": {"latency_us": latency, "bandwidth_bytes_per_us": bandwidth}, "queue": link_queue,
                  "send": link_send},
    })


def nxgraph(nodes, edges, name="g"):
    """nodes: {name: out_bytes or dict of attributes}; edges: (u, v) or (u, v, attrs)."""
    g = nx.DiGraph(name=name)
    for v, a in nodes.items():
        attrs = {"op_type": "Op", "out_bytes": a} if isinstance(a, int) else {"op_type": "Op", **a}
        g.add_node(v, **attrs)
    for e in edges:
        g.add_edge(e[0], e[1], **(e[2] if len(e) > 2 else {}))
    return g


def random_problem(n: int, devices: int, seed: int, latency=5.0, bandwidth=20.0, hetero=False) -> Problem:
    """A random DAG of ``n`` ops (each its own group; 1-3 inputs from the previous
    ops), integer op times 5..40 µs (device-dependent with ``hetero``), tensors of
    100..2000 bytes, uniform links."""
    rng = np.random.default_rng(seed)
    g = nx.DiGraph()
    for v in range(n):
        g.add_node(f"op{v}", op_type="Op", out_bytes=int(rng.integers(100, 2000)))
    for v in range(1, n):
        for u in rng.choice(v, size=min(v, int(rng.integers(1, 4))), replace=False):
            g.add_edge(f"op{u}", f"op{v}", bytes=g.nodes[f"op{u}"]["out_bytes"])
    base = rng.integers(5, 41, size=(n, 1)).astype(float)
    T = base * (rng.uniform(0.5, 2.0, size=(n, devices)) if hetero else np.ones((1, devices)))
    cl = cluster(devices, latency=latency, bandwidth=bandwidth, kinds=["gpu"] * devices)
    return Problem(CostModel(OpGraph.from_networkx(g, f"rand{n}-{seed}"), cl, op_times=np.round(T)))


def cost_models(min_ops=1, max_ops=24, min_devices=1, max_devices=4, max_param=50, memories=(10_000,)):
    """Hypothesis strategy: a CostModel of a random DAG (multi-output ops, control edges,
    groups) on a random all-GPU cluster. Op times, link figures and the devices' send and
    receive costs are small integers (per-byte costs small powers of two; about half
    the clusters have no device-side transfer cost at all), so simultaneous events and
    zero-length ops are common."""
    import numpy as np
    from hypothesis import strategies as st

    from placetool.costmodel import CostModel, OpGraph

    @st.composite
    def draw_model(draw):
        n = draw(st.integers(min_ops, max_ops))
        D = draw(st.integers(min_devices, max_devices))
        n_out = [draw(st.integers(1, 2)) for _ in range(n)]
        g = nx.DiGraph()
        out_bytes = [draw(st.integers(0, 1000)) for _ in range(n)]
        for v in range(n):
            group = draw(st.integers(0, n - 1)) if draw(st.booleans()) else None
            g.add_node(f"op{v}", op_type="Op", out_bytes=out_bytes[v], param_bytes=draw(st.integers(0, max_param)),
                       group=None if group is None else f"g{group}")
        for v in range(1, n):
            for u in draw(st.lists(st.integers(0, v - 1), max_size=3, unique=True)):
                if draw(st.booleans()) and draw(st.booleans()):
                    g.add_edge(f"op{u}", f"op{v}", control=True)
                else:
                    k = draw(st.integers(0, n_out[u] - 1))
                    g.add_edge(f"op{u}", f"op{v}", output=k, bytes=(out_bytes[u] + 7 * k) // (k + 1))
        T = np.array([[draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0])) for _ in range(D)] for _ in range(n)])
        costs = {}
        if draw(st.booleans()):
            for key, values in (("send_us", [0.0, 1.0, 2.0]), ("send_us_per_byte", [0.0, 2.0**-7, 2.0**-5]),
                                ("recv_us", [0.0, 1.0, 3.0]), ("recv_us_per_byte", [0.0, 2.0**-6])):
                costs[key] = [draw(st.sampled_from(values)) for _ in range(D)]
        c = cluster(D, kinds=["gpu"] * D, memory=draw(st.sampled_from(memories)), name="h",
                    link_queue=draw(st.sampled_from(["fifo", "none"])),
                    link_send=draw(st.sampled_from(["eager", "idle", "aside"])), **costs)
        c.latency_us[:] = [[draw(st.sampled_from([0.0, 1.0, 2.0])) for _ in range(D)] for _ in range(D)]
        c.bandwidth_bytes_per_us[:] = [[draw(st.sampled_from([1.0, 10.0, 100.0])) for _ in range(D)]
                                       for _ in range(D)]
        np.fill_diagonal(c.latency_us, 0.0)
        np.fill_diagonal(c.bandwidth_bytes_per_us, np.inf)
        return CostModel(OpGraph.from_networkx(g), c, op_times=T)

    return draw_model()


def brute_force(p) -> float:
    """The fastest feasible step time of a Problem ``p``, over every assignment of its
    groups to devices they may use (small problems only: devices ** groups of them)."""
    import itertools

    import numpy as np

    A = np.array(list(itertools.product(*[np.flatnonzero(p.allowed[k]) for k in range(p.n_groups)])), np.int32)
    r = p.cost_model.simulate_batch(A)
    return float(np.where(r.feasible, r.step_time_us, np.inf).min())


def assignments(cm):
    """Hypothesis strategy: a group assignment for ``cm``."""
    from hypothesis import strategies as st

    return st.lists(st.integers(0, cm.n_devices - 1), min_size=cm.graph.n_groups, max_size=cm.graph.n_groups)


# The placetool CLI as a terminal's foreground process runs it: SIGINT raises
# KeyboardInterrupt. A shell starts background jobs with SIGINT ignored, and Python keeps
# an inherited SIG_IGN, so when the caller itself runs as such a job (`make test &`) a
# child started plainly would never see the Ctrl-C it is sent.
# (faulthandler: should the process crash, its stack lands in its terminal output)
FOREGROUND = ("import faulthandler, signal, sys; faulthandler.enable(); "
              "signal.signal(signal.SIGINT, signal.default_int_handler); "
              "sys.argv[0] = 'placetool'; from placetool.cli.main import main; main()")


class ForegroundRun:
    """``placetool ARGS`` run as a terminal's foreground process: stderr on a
    pseudo-terminal (so the progress bar shows), read as it comes into ``seen``; stdout
    piped (``proc``). On leaving the ``with`` block the process is killed if still
    running and the terminal closed, once its output has been read to the end."""

    def __init__(self, args, cwd):
        import pty
        import subprocess
        import sys
        import threading

        self._master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-c", FOREGROUND, *args], cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=slave, text=True, start_new_session=True)
        os.close(slave)
        self.seen = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        while True:
            try:
                chunk = os.read(self._master, 4096)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            self.seen.extend(chunk)

    def lines(self) -> list[str]:
        """The terminal's lines so far, each in its last state (progress bars redraw with \\r)."""
        return [line.rsplit("\r", 1)[-1] for line in bytes(self.seen).decode(errors="replace").split("\n")]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is not None:
            self._reader.join(5)
        else:
            self.proc.kill()
            self.proc.communicate()
        os.close(self._master)


def compiling(seconds: float) -> None:
    """Hold numba's compile event open for ``seconds``, as a long compile (a machine's
    first run) does."""
    import time

    from numba.core import event

    with event.trigger_event("numba:compile", data={}):
        time.sleep(seconds)

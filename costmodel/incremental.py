"""Incremental (delta) simulation of group moves.

:class:`IncrementalSimulator` simulates a *base* group assignment once, saving the
simulator's state at checkpoints along the way. To score a move (some groups to other
devices) it finds the first instant the move can change anything — the earliest end of
a producer (data or control) of a moved op; time 0 if a moved op has no inputs —
restores the last checkpoint at or before that instant under the new placement and
simulates on. While it runs it compares its state with the base run's later
checkpoints: once the two agree in everything that shapes the future (moved ops done
and released, same pending events, ready-op and send/receive task heaps, link queues,
counters and live memory), the rest of the step is the base run's, and it stops there.
Both runs are the one engine of :mod:`placetool.costmodel.engine`.

The answer equals :meth:`CostModel.simulate` of the moved placement exactly: step time,
per-device peak memory and feasibility (busy times are not reported).
:meth:`IncrementalSimulator.evaluate_many` scores several moves of one base at once, on
as many cores as numba may use: the runs share the read-only checkpoints, each thread
has its own workspace, and the compiled runs release the GIL.

>>> from placetool.costmodel import CostModel, presets
>>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2"))
>>> import numpy as np
>>> a = np.full(cm.graph.n_groups, 1, np.int32); a[cm.group_device_ok[:, 1] == False] = 0
>>> inc = IncrementalSimulator(cm, a)
>>> r = inc.evaluate_move(5, 2)
>>> b = a.copy(); b[5] = 2
>>> r.step_time_us == cm.simulate(b).step_time_us
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from . import engine as K
from .errors import UserError
from .procs import run_shares


@dataclass
class MoveResult:
    """The simulated outcome of one move (same numbers as a full simulation)."""

    step_time_us: float
    feasible: bool
    peak_memory_bytes: np.ndarray
    restored_at_us: float  # time of the checkpoint the run restarted from (0: from scratch)
    converged: bool  # stopped early: the run re-joined the base run


class IncrementalSimulator:
    """A base assignment, simulated with checkpoints, that scores moves incrementally.

    ``assignment`` is a group assignment (one device per group). ``checkpoints`` bounds
    how many states are kept (memory grows with it: about 40 bytes per op and 16 per
    data edge each); ``converge=False`` disables the early stop; ``threads`` caps the
    threads :meth:`evaluate_many` uses (default: numba's thread count). Runs on the same
    engine as :meth:`CostModel.simulate` (:mod:`placetool.costmodel.engine`).
    """

    def __init__(self, cost_model, assignment, checkpoints: int | None = None, converge: bool = True,
                 threads: int | None = None):
        cm = self.cm = cost_model
        g, cl = cm.graph, cm.cluster
        if cm.workers:
            raise ValueError(f"cluster {cl.name!r} has links.send 'workers': the incremental engine runs the "
                             "simulator's own rules; score with CostModel.simulate_batch")
        self.n, self.D = g.n_ops, cl.n_devices
        self.converge = converge
        self.net = cm.net
        self.group = g.group
        self.group_ops = g.group_ops
        n, D = self.n, self.D
        n_data = int(g.csr.tensor_cons.shape[0])
        L = D * D
        self.param_bytes = np.ascontiguousarray(g.param_bytes, np.int64)
        # first instant a move of each op can change: the earliest end of its producers
        self._pred_src = np.ascontiguousarray(g.edge_src, np.int64)
        self._pred_dst = np.ascontiguousarray(g.edge_dst, np.int64)
        self._no_inputs = g.csr.n_inputs == 0
        self.w = K.work_for(self.net)  # own workspace: the cost model may simulate in between
        self.threads = max(1, int(threads if threads is not None else numba.get_num_threads()))
        self._more_w = []  # workspaces of evaluate_many's other threads, made on first use

        # checkpoints: enough to keep ~1/C of the events per restart, within ~256 MB
        per = 40 * n + 16 * n_data + 64 * (D + L)
        C = checkpoints if checkpoints is not None else int(np.clip((256 << 20) // max(per, 1), 8, 64))
        C = max(1, int(C))
        # queued send/receive tasks saved across all checkpoints; a checkpoint whose
        # tasks do not fit is skipped (slower, same answers)
        pool = 2 * n_data + 64 * C if self.net.has_tasks else 0
        self.ck = K.make_checkpoints(C, n, n_data, D, pool)
        self.ck_suffix = np.zeros((C, D), np.int64)
        self.n_ck = 0
        self.every = max(1, (n + n_data // 2) // C)
        self.base_run = K.make_base(g.n_tensors, n_data, D)
        self.b_op_end = np.zeros(n)
        self._no_moved = np.zeros(0, np.intp)
        self.set_base(assignment)

    def __getstate__(self):  # the copy makes its own workspaces for evaluate_many
        d = self.__dict__.copy()
        d["_more_w"] = []
        return d

    # ------------------------------------------------------------------ base
    def set_base(self, assignment) -> None:
        """Simulate ``assignment`` from scratch, with checkpoints; it becomes the base."""
        a = self._check(assignment)
        self.assignment = a.copy()
        self.placement = np.ascontiguousarray(a[self.group], np.int32)
        self._run_base(-1)

    def commit(self, assignment) -> None:
        """Make ``assignment`` the base, re-simulating (with checkpoints) only from the
        first instant where it differs from the current base."""
        a = self._check(assignment)
        changed = np.flatnonzero(a != self.assignment)
        if changed.size == 0:
            return
        j = self._restart_index(self._ops_of(changed))
        self.assignment = a.copy()
        self.placement = np.ascontiguousarray(a[self.group], np.int32)
        self._run_base(j)

    def _run_base(self, j) -> None:
        p, w, b = self.placement, self.w, self.base_run
        self._start(w, p, j)
        # ops that ended before checkpoint j end as in the old base: keep their ends
        w.op_end[: self.n] = self.b_op_end
        K.run_incremental(self.net, w, self.ck, b, p, self._no_moved, j, self.n_ck, True, self.every, False)
        self.b_op_end[:] = w.op_end[: self.n]
        n_x = int(w.sc[K.SC_N_X])
        self.n_ck = int(w.sc[K.SC_N_CK])
        b.x_tensor[:n_x] = w.x_tensor[:n_x]
        b.x_src[:n_x] = w.x_src[:n_x]
        b.x_dst[:n_x] = w.x_dst[:n_x]
        b.copy_of[:] = -1
        b.copy_of[b.x_tensor[:n_x] * self.D + b.x_dst[:n_x]] = np.arange(n_x)
        self.base_step_us = float(w.sf[K.SF_MAKESPAN])
        self.base_livepeak = w.livepeak.copy()
        self.params = np.bincount(p, weights=self.param_bytes, minlength=self.D).astype(np.int64)
        # live peak after each checkpoint, to finish a converged run without simulating
        seg = self.ck.seg[: self.n_ck]
        self.ck_suffix[: self.n_ck] = np.maximum.accumulate(seg[::-1], axis=0)[::-1]
        first = np.full(self.n, np.inf)
        np.minimum.at(first, self._pred_dst, self.b_op_end[self._pred_src])
        first[self._no_inputs] = -np.inf
        self.first_touch = first
        peak = self.params + self.base_livepeak
        self.base = MoveResult(self.base_step_us, bool(np.all(peak <= self.cm.capacity)), peak, 0.0, False)

    # ----------------------------------------------------------------- moves
    def evaluate_move(self, group: int, device: int) -> MoveResult:
        """Score moving one group to ``device`` (the base is unchanged)."""
        return self._score(self._move_job(group, device))

    def evaluate(self, assignment) -> MoveResult:
        """Score an assignment that differs from the base in a few groups."""
        return self._score(self._assignment_job(assignment))

    def evaluate_many(self, moves) -> list[MoveResult]:
        """Score several moves of the base, each a ``(group, device)`` pair or a whole
        assignment, in parallel; the same answers as one call per move."""
        jobs = [self._assignment_job(m) if isinstance(m, np.ndarray) else self._move_job(*m) for m in moves]
        todo = [i for i, j in enumerate(jobs) if not isinstance(j, MoveResult)]
        k = max(1, min(self.threads, len(todo)))
        while len(self._more_w) < k - 1:
            self._more_w.append(K.work_for(self.net))

        def share(t):
            w = self.w if t == 0 else self._more_w[t - 1]
            return {i: self._run_job(w, jobs[i]) for i in todo[t::k]}

        runs = {}
        for r in run_shares(k, share):
            runs.update(r)
        return [self._result(j, runs[i]) if i in runs else j for i, j in enumerate(jobs)]

    def _score(self, job) -> MoveResult:
        """One job on this thread (a job that is already a result is the base's)."""
        return job if isinstance(job, MoveResult) else self._result(job, self._run_job(self.w, job))

    def _move_job(self, group, device):
        """(ops, devices, checkpoint) of moving one group, or the base's result if it stays."""
        group, device = int(group), int(device)
        G = self.assignment.size
        if not 0 <= group < G:
            raise ValueError(f"group index {group} out of range: valid groups are 0..{G - 1}")
        if not 0 <= device < self.D:
            raise ValueError(f"device index {device} out of range: valid devices are 0..{self.D - 1}")
        if not self.cm.group_device_ok[group, device]:
            a = self.assignment.copy()
            a[group] = device
            self._check(a)  # raises with the op and device named
        if device == self.assignment[group]:
            return self.base
        ops = self.group_ops[group]
        return ops, np.full(ops.size, device, np.int32), self._restart_index(ops)

    def _assignment_job(self, assignment):
        a = self._check(assignment)
        changed = np.flatnonzero(a != self.assignment)
        if changed.size == 0:
            return self.base
        ops = self._ops_of(changed)
        return ops, a[self.group[ops]], self._restart_index(ops)

    def _run_job(self, w, job):
        """Simulate one move in workspace ``w``: (makespan, live peak, matched checkpoint)."""
        ops, devices, j = job
        p = self.placement.copy()
        p[ops] = devices
        w.moved[ops] = True
        try:
            self._start(w, p, j)
            matched = K.run_incremental(self.net, w, self.ck, self.base_run, p, ops.astype(np.intp), j, self.n_ck,
                                        False, self.every, self.converge)
        finally:
            w.moved[ops] = False
        return float(w.sf[K.SF_MAKESPAN]), w.livepeak.copy(), matched

    def _result(self, job, run) -> MoveResult:
        ops, devices, j = job
        ms, livepeak, matched = run
        if matched >= 0:
            if self.base_step_us > self.ck.f[matched, K.CKF_MAKESPAN]:
                ms = max(ms, self.base_step_us)
            livepeak = np.maximum(livepeak, self.ck_suffix[matched])
        params = self.params.copy()
        if devices.size and devices.min() == devices.max() and self.placement[ops].min() == self.placement[ops].max():
            moved = self.param_bytes[ops].sum()  # one group (or groups alike): one device to another
            params[devices[0]] += moved
            params[self.placement[ops[0]]] -= moved
        else:
            np.add.at(params, devices, self.param_bytes[ops])
            np.subtract.at(params, self.placement[ops], self.param_bytes[ops])
        peak = params + livepeak
        feasible = bool(np.isfinite(ms) and np.all(peak <= self.cm.capacity))
        t0 = float(self.ck.f[j, K.CKF_NEXT_T]) if j >= 0 else 0.0
        return MoveResult(ms, feasible, peak, t0, matched >= 0)

    # --------------------------------------------------------------- helpers
    def _check(self, assignment) -> np.ndarray:
        a = np.ascontiguousarray(assignment, np.int32)
        ok = self.cm.group_device_ok
        if a.shape != (ok.shape[0],):
            raise UserError(f"assignment has shape {a.shape}, expected ({ok.shape[0]},) (one device per group)")
        if a.size and (a.min() < 0 or a.max() >= self.D or not np.all(ok[np.arange(a.size), a])):
            bad = np.flatnonzero((a < 0) | (a >= self.D))
            bad = bad if bad.size else np.flatnonzero(~ok[np.arange(a.size), np.clip(a, 0, self.D - 1)])
            op = self.cm.graph.names[self.group_ops[int(bad[0])][0]]
            raise UserError(f"group of op {op!r} cannot run on device index {int(a[bad[0]])}")
        return a

    def _ops_of(self, changed) -> np.ndarray:
        if changed.size == 1:
            return self.group_ops[int(changed[0])]
        return np.concatenate([self.group_ops[int(k)] for k in changed])

    def _restart_index(self, ops) -> int:
        """Checkpoint to restart from when ``ops`` change device (-1: from scratch)."""
        t = self.first_touch[ops].min()
        if t < 0:
            return -1
        # the last checkpoint before any event at time t was handled: zero-time ops and
        # transfers give several checkpoints one time; only a "clean" one (taken before
        # any event of its instant) may share t
        j = int(np.searchsorted(self.ck.f[: self.n_ck, K.CKF_NEXT_T], t, side="right")) - 1
        while j >= 0 and self.ck.f[j, K.CKF_NEXT_T] == t and not self.ck.i[j, K.CKI_CLEAN]:
            j -= 1
        return j

    def _start(self, w, p, j) -> None:
        if j < 0:
            K.init_fresh(self.net, w, p)
        else:
            K.restore(self.net, w, self.ck, self.base_run, j, p)

"""Incremental (delta) simulation of group moves.

:class:`IncrementalSimulator` simulates a *base* group assignment once, saving the
simulator's state at checkpoints along the way. To score a move (some groups to other
devices) it finds the first instant the move can change anything — the earliest end of
a producer (data or control) of a moved op; time 0 if a moved op has no inputs —
restores the last checkpoint at or before that instant under the new placement and
simulates on. While it runs it compares its state with the base run's later
checkpoints: once the two agree in everything that shapes the future (moved ops done
and released, same pending events, ready heaps, link queues, counters and live
memory), the rest of the step is the base run's, and it stops there.

The answer equals :meth:`CostModel.simulate` of the moved placement exactly: step time,
per-device peak memory and feasibility (busy times are not reported).

>>> from costmodel import CostModel, presets
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

import numpy as np

from . import incremental_kernels as K
from .errors import UserError


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
    how many states are kept (memory grows with it: about 20 bytes per op and 8 per data
    edge each); ``converge=False`` disables the early stop.
    """

    def __init__(self, cost_model, assignment, checkpoints: int | None = None, converge: bool = True):
        cm = self.cm = cost_model
        g, cl = cm.graph, cm.cluster
        self.n, self.D = g.n_ops, cl.n_devices
        self.converge = converge
        # The checkpointed loop does not model send/receive tasks yet: such clusters are
        # scored by full simulation (same answers, no speed-up).
        self._full = bool(np.any(cl.transfer_costs() != 0))
        c = g.csr
        self.group = g.group
        self.group_ops = g.group_ops
        n, D = self.n, self.D
        n_data = max(int(c.tensor_cons.shape[0]), 1)
        nt = max(g.n_tensors, 1)
        L = D * D
        self._C = (
            cm.T, np.ascontiguousarray(g.topo_rank, np.int32), np.ascontiguousarray(g.topo_order, np.int64),
            g.out_bytes, g.tensor_op, g.tensor_bytes,
            c.op_tensor_ptr, c.tensor_ptr, c.tensor_cons, c.ctrl_ptr, c.ctrl_dst, c.in_ptr, c.in_tensor,
            c.n_inputs, cl.latency_us, cl.bandwidth_bytes_per_us,
        )
        self.param_bytes = g.param_bytes
        # first instant a move of each op can change: the earliest end of its producers
        self._pred_src = np.ascontiguousarray(g.edge_src, np.int64)
        self._pred_dst = np.ascontiguousarray(g.edge_dst, np.int64)
        self._no_inputs = c.n_inputs == 0

        # work state
        self.live = np.zeros(D, np.int64)
        self.livepeak = np.zeros(D, np.int64)
        self.seg = np.zeros(D, np.int64)
        self.busy = np.zeros(D)
        self.running = np.zeros(D, np.bool_)
        self.rq = np.zeros(max(n, 1), np.int64)
        self.rq_size = np.zeros(D, np.int64)
        self.missing = np.zeros(n, np.int32)
        self.out_refs = np.zeros(n, np.int32)
        self.x_tensor = np.zeros(n_data, np.int64)
        self.x_src = np.zeros(n_data, np.int64)
        self.x_dst = np.zeros(n_data, np.int64)
        self.x_refs = np.zeros(n_data, np.int32)
        self.x_next = np.zeros(n_data, np.int32)
        self.copy_of = np.full(nt * D, -1, np.int64)
        self.link_head = np.full(L, -1, np.int64)
        self.link_tail = np.full(L, -1, np.int64)
        self.link_busy = np.zeros(L, np.bool_)
        cap = n + n_data + 1
        self.ev_t, self.ev_k, self.ev_id = np.zeros(cap), np.zeros(cap, np.int64), np.zeros(cap, np.int64)
        self.epoch_time = np.zeros(cap + 1)  # time of each distinct event instant
        self.op_end_scratch = np.zeros(n)
        self.moved = np.zeros(n, np.bool_)
        self.mark = np.zeros(n, np.int32)
        self.sc = np.zeros(4, np.int64)

        # checkpoints: enough to keep ~1/C of the events per restart, within ~256 MB
        per = 20 * n + 8 * n_data + 64 * (D + L)
        C = checkpoints if checkpoints is not None else int(np.clip((256 << 20) // max(per, 1), 8, 64))
        C = max(1, int(C))
        E = D + L  # at most one op per device and one transfer per link in flight
        self.ck_f = np.zeros((C, 3))
        self.ck_i = np.zeros((C, 6), np.int64)  # n_x, n_ev, epoch, clean, 2 checksums
        self.ck_busy = np.zeros((C, D))
        self.ck_live = np.zeros((C, D), np.int64)
        self.ck_livepeak = np.zeros((C, D), np.int64)
        self.ck_running = np.zeros((C, D), np.bool_)
        self.ck_rqsize = np.zeros((C, D), np.int64)
        self.ck_link = np.zeros((C, 3, L), np.int64)
        self.ck_ev_t, self.ck_ev_k, self.ck_ev_id = np.zeros((C, E)), np.zeros((C, E), np.int64), np.zeros((C, E), np.int64)
        self.ck_op = np.zeros((C, 2, n), np.int32)
        self.ck_rq = np.zeros((C, max(n, 1)), np.int64)
        self.ck_rqready = np.zeros((C, max(n, 1)))
        self.ck_x = np.zeros((C, 2, n_data), np.int32)
        self.ck_seg = np.zeros((C, D), np.int64)
        self.ck_alive = np.zeros(C, np.int64)
        self.ck_suffix = np.zeros((C, D), np.int64)
        self.n_ck = 0
        self.every = max(1, (n + n_data // 2) // C)

        # base run
        self.b_x_tensor = np.zeros(n_data, np.int64)
        self.b_x_src = np.zeros(n_data, np.int64)
        self.b_x_dst = np.zeros(n_data, np.int64)
        self.b_copy_of = np.full(nt * D, -1, np.int64)
        self.b_op_end = np.zeros(n)
        self._no_moved = np.zeros(0, np.int64)
        self.set_base(assignment)

    # ------------------------------------------------------------------ base
    def set_base(self, assignment) -> None:
        """Simulate ``assignment`` from scratch, with checkpoints; it becomes the base."""
        a = self._check(assignment)
        self.assignment = a.copy()
        self.placement = np.ascontiguousarray(a[self.group], np.int32)
        if self._full:
            self.base = self._full_result(a)
            return
        self._run_base(-1)

    def commit(self, assignment) -> None:
        """Make ``assignment`` the base, re-simulating (with checkpoints) only from the
        first instant where it differs from the current base."""
        a = self._check(assignment)
        changed = np.flatnonzero(a != self.assignment)
        if changed.size == 0:
            return
        if self._full:
            self.set_base(a)
            return
        j = self._restart_index(self._ops_of(changed))
        self.assignment = a.copy()
        self.placement = np.ascontiguousarray(a[self.group], np.int32)
        self._run_base(j)

    def _run_base(self, j) -> None:
        p = self.placement
        self._start(p, j)
        ms, _ = K.run(p, *self._C, *self._W(self.b_op_end), *self._K(), *self._B(), self._no_moved,
                      self.sc, self._ms0, self._now0, j, self.n_ck, True, self.every, False)
        n_x = int(self.sc[1])
        self.n_ck = int(self.sc[2])
        self.b_x_tensor[:n_x] = self.x_tensor[:n_x]
        self.b_x_src[:n_x] = self.x_src[:n_x]
        self.b_x_dst[:n_x] = self.x_dst[:n_x]
        self.b_copy_of[:] = -1
        self.b_copy_of[self.b_x_tensor[:n_x] * self.D + self.b_x_dst[:n_x]] = np.arange(n_x)
        self.base_step_us = float(ms)
        self.base_livepeak = self.livepeak.copy()
        self.params = np.bincount(p, weights=self.param_bytes, minlength=self.D).astype(np.int64)
        # live peak after each checkpoint, to finish a converged run without simulating
        self.ck_suffix[: self.n_ck] = np.maximum.accumulate(self.ck_seg[: self.n_ck][::-1], axis=0)[::-1]
        first = np.full(self.n, np.inf)
        np.minimum.at(first, self._pred_dst, self.b_op_end[self._pred_src])
        first[self._no_inputs] = -np.inf
        self.first_touch = first
        peak = self.params + self.base_livepeak
        self.base = MoveResult(self.base_step_us, bool(np.all(peak <= self.cm.capacity)), peak, 0.0, False)

    # ----------------------------------------------------------------- moves
    def evaluate_move(self, group: int, device: int) -> MoveResult:
        """Score moving one group to ``device`` (the base is unchanged)."""
        group, device = int(group), int(device)
        if not (0 <= group < self.assignment.size and 0 <= device < self.D) or not self.cm.group_device_ok[group, device]:
            a = self.assignment.copy()
            a[min(max(group, 0), a.size - 1)] = device
            self._check(a)  # raises with the op and device named
        if device == self.assignment[group]:
            return self.base
        ops = self.group_ops[group]
        return self._evaluate(ops, np.full(ops.size, device, np.int32), self._restart_index(ops))

    def evaluate(self, assignment) -> MoveResult:
        """Score an assignment that differs from the base in a few groups."""
        a = self._check(assignment)
        changed = np.flatnonzero(a != self.assignment)
        if changed.size == 0:
            return self.base
        ops = self._ops_of(changed)
        return self._evaluate(ops, a[self.group[ops]], self._restart_index(ops))

    def _full_result(self, assignment) -> MoveResult:
        r = self.cm.simulate(assignment)
        return MoveResult(r.step_time_us, r.feasible, r.peak_memory_bytes, 0.0, False)

    def _evaluate(self, ops, devices, j) -> MoveResult:
        p = self.placement.copy()
        p[ops] = devices
        if self._full:
            a = self.assignment.copy()
            a[self.group[ops]] = devices
            return self._full_result(a)
        self.moved[ops] = True
        try:
            self._start(p, j)
            ms, matched = K.run(p, *self._C, *self._W(self.op_end_scratch), *self._K(), *self._B(),
                                ops.astype(np.int64), self.sc, self._ms0, self._now0, j, self.n_ck, False, self.every,
                                self.converge)
        finally:
            self.moved[ops] = False
        livepeak = self.livepeak.copy()
        if matched >= 0:
            if self.base_step_us > self.ck_f[matched, 1]:
                ms = max(ms, self.base_step_us)
            livepeak = np.maximum(livepeak, self.ck_suffix[matched])
        params = self.params.copy()
        np.add.at(params, devices, self.param_bytes[ops])
        np.subtract.at(params, self.placement[ops], self.param_bytes[ops])
        peak = params + livepeak
        feasible = bool(np.isfinite(ms) and np.all(peak <= self.cm.capacity))
        t0 = float(self.ck_f[j, 0]) if j >= 0 else 0.0
        return MoveResult(float(ms), feasible, peak, t0, matched >= 0)

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
        if self._full:
            return -1
        t = self.first_touch[ops].min()
        if t < 0:
            return -1
        # the last checkpoint before any event at time t was handled: zero-time ops and
        # transfers give several checkpoints one time; only a "clean" one (taken before
        # any event of its instant) may share t
        j = int(np.searchsorted(self.ck_f[: self.n_ck, 0], t, side="right")) - 1
        while j >= 0 and self.ck_f[j, 0] == t and not self.ck_i[j, 3]:
            j -= 1
        return j

    def _start(self, p, j) -> None:
        if j < 0:
            K.init_fresh(p, self._C[13], self._C[1], self.live, self.livepeak, self.seg, self.busy, self.running,
                         self.rq, self.rq_size, self.epoch_time, self.missing, self.out_refs, self.link_head,
                         self.link_tail, self.link_busy, self.sc)
            self._ms0, self._now0 = 0.0, 0.0
        else:
            self._ms0, self._now0 = K.restore(
                j, p, self.D, self.live, self.livepeak, self.seg, self.busy, self.running, self.rq, self.rq_size,
                self.epoch_time, self.missing, self.out_refs, self.x_tensor, self.x_src, self.x_dst, self.x_refs,
                self.x_next, self.copy_of, self.link_head, self.link_tail, self.link_busy,
                self.ev_t, self.ev_k, self.ev_id, self.sc, *self._K()[:-2], self.b_x_tensor, self.b_x_src,
                self.b_x_dst)

    def _W(self, op_end):
        return (self.live, self.livepeak, self.seg, self.busy, self.running, self.rq, self.rq_size, self.epoch_time,
                self.missing, self.out_refs, self.x_tensor, self.x_src, self.x_dst, self.x_refs, self.x_next,
                self.copy_of, self.link_head, self.link_tail, self.link_busy, self.ev_t, self.ev_k, self.ev_id,
                op_end, self.moved, self.mark)

    def _K(self):
        return (self.ck_f, self.ck_i, self.ck_busy, self.ck_live, self.ck_livepeak, self.ck_running, self.ck_rqsize,
                self.ck_link, self.ck_ev_t, self.ck_ev_k, self.ck_ev_id, self.ck_op, self.ck_rq, self.ck_rqready,
                self.ck_x, self.ck_seg, self.ck_alive)

    def _B(self):
        return (self.b_x_tensor, self.b_x_src, self.b_x_dst, self.b_copy_of)

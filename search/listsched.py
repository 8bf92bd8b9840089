"""List schedulers: ``heft``, ``critical-path`` (CPOP), ``m-topo``, ``m-etf``, ``m-sct``.

They schedule *ops* (the group graph of a TF graph has cycles: a variable's group holds
its read and its update) under one rule: when the first op of a group is placed, the
whole group is fixed to that device and charged its memory (parameters plus its ops'
outputs, see :func:`placetool.search.problem.group_memory_bytes`); later ops of the group
follow it. A device whose charged memory would exceed its capacity is not a candidate;
if no device has room the op goes where the overflow is least (counted in the metadata
as ``memory_fallbacks``). Every method scores its placement through the tracker.

All five are memory-constrained by the simulator's account, which the estimate cannot
see (outputs are freed once consumed, received copies are held): a schedule whose
simulated peak exceeds a device's capacity is run again with the capacities the
estimate is held to retargeted from the simulated peaks (up to ``MEMORY_ROUNDS``
times), the fastest rounds still over are repaired with
:func:`placetool.search.memory.fit_memory`, and where none fits m-TOPO's placement is
returned, so a result fits whenever m-TOPO's does (given the budget to get there).
``metadata["memory"]`` is ``"constrained"``; ``memory_fit`` says how the result fits
(``schedule``, ``fit_memory``, ``m-topo (...)`` or ``none``), ``memory_rounds`` how many
schedules were run.

- ``heft`` (Topcuoglu et al. 2002): ops by upward rank (mean compute + mean
  communication to the exit), each to the device of earliest finish time, inserting
  into idle gaps; communication = link latency + bytes / bandwidth.
- ``critical-path`` (CPOP, same paper): priority upward + downward rank; the ops on the
  critical path all go to the one device that runs them fastest, the rest by EFT.
- ``m-topo`` (Baechi): ops in topological order fill one GPU after another, moving on
  when a GPU holds its share of the compute or its memory is full.
- ``m-etf`` (Baechi): earliest task first: repeatedly start the (ready op, device) pair
  that can start earliest.
- ``m-sct`` (Baechi): ETF where each op's "favourite child" (from the small-communication
  -time LP relaxation of Hanen & Munier, solved with SciPy/HiGHS) goes to its parent's
  device.

The schedules here follow the simulator's rules for transfers (``links="queued"``, the
default: a tensor goes to a device once, transfers queue on their directed link,
devices pay their send/receive costs, and in m-ETF/m-SCT a device runs its ready ops in
the simulator's order; HEFT and CPOP, which insert ops into idle gaps, insert transfers
into the idle gaps of their link, while m-ETF and m-SCT, which book in time order,
queue them first come first served as the simulator does), so the makespan a scheduler plans
(``metadata["planned_us"]``) is closer to what the simulator says of its placement
(``metadata["simulated_us"]``, the step time reported) than the papers' model's.
``links="ideal"`` (``--option links=ideal``) gives the papers' variants: every edge
costs latency + bytes / bandwidth and nothing queues. Each scheduler runs twice where
the cluster has a host besides its GPUs (all devices, and GPUs only for every group
that may use one) and the
tracker keeps the faster; ``metadata["devices"]`` says which won.
"""

from __future__ import annotations

import numpy as np

from placetool.costmodel.jitclock import work_clock

from .errors import SearchError
from .listsched_kernels import eft_schedule, etf_schedule
from .ranks import downward_rank, upward_rank
from .rule_kernels import N_RULE
from .problem import accelerators, fallback_device, gpu_group_time, group_memory_bytes
from .registry import Positive, register
from .tracker import BudgetExhausted, score


#: how list schedulers model transfers: ``queued`` as the simulator does (a tensor sent
#: once per device, one FIFO per directed link, the devices' send/receive costs);
#: ``ideal`` as the papers do (every edge costs latency + bytes / bandwidth, nothing queues)
LINKS = ("queued", "ideal")


# ------------------------------------------------------------ problem data
class _Data:
    """Op-level arrays every list scheduler reads (built once per problem).

    ``deadline``: the :func:`work_clock` reading its schedules stop at (a tracker's
    :meth:`~placetool.search.tracker.Tracker.deadline`: the end of a search's seeding share;
    inf for a method run on its own, which always answers); one cut short raises
    :class:`~placetool.search.tracker.BudgetExhausted`. At a thousand devices one schedule
    of a 10k-op graph takes seconds, more than a seeding share of a short budget."""

    deadline = np.inf

    def __init__(self, problem, gpu_only: bool = False, links: str = "queued"):
        g, cl, cm = problem.graph, problem.cluster, problem.cost_model
        if links not in LINKS:
            raise SearchError(f"links must be one of {', '.join(LINKS)}, got {links!r}")
        self.problem = problem
        # 0: the papers' links (nothing queues); 1 and 2: the simulator's rules, on links
        # that queue (links.queue "fifo") or not ("none")
        self.queued = 0 if links == "ideal" else 1 if cl.fifo_links else 2
        n, D = g.n_ops, cl.n_devices
        allowed = problem.allowed
        if gpu_only:  # groups that may use an accelerator use only accelerators
            acc = np.zeros(D, bool)
            acc[accelerators(problem)] = True
            on_acc = (allowed & acc[None, :]).any(axis=1)
            allowed = np.where(on_acc[:, None], allowed & acc[None, :], allowed)
        ok = allowed[g.group]
        self.T = np.ascontiguousarray(np.where(ok, cm.T, np.inf))
        # merge parallel edges: one (src, dst) pair, bytes summed over its data edges
        eb = g.edge_bytes.astype(np.float64)
        isdata = (g.edge_tensor >= 0).astype(np.int64)
        key = g.edge_src.astype(np.int64) * n + g.edge_dst
        uk, inv = np.unique(key, return_inverse=True)
        src, dst = (uk // n).astype(np.int64), (uk % n).astype(np.int64)
        nbytes = np.bincount(inv, weights=eb, minlength=len(uk))
        ctrl = np.bincount(inv, weights=isdata, minlength=len(uk)) == 0
        self.src, self.dst, self.bytes, self.ctrl = src, dst, nbytes, ctrl
        o = np.argsort(dst, kind="stable")
        self.pred_ptr = np.searchsorted(dst[o], np.arange(n + 1)).astype(np.int64)
        self.pred_src = np.ascontiguousarray(src[o])
        self.pred_bytes = np.ascontiguousarray(nbytes[o])
        self.pred_ctrl = np.ascontiguousarray(ctrl[o])
        # uk is sorted by src already
        self.succ_ptr = np.searchsorted(src, np.arange(n + 1)).astype(np.int64)
        self.succ_dst = np.ascontiguousarray(dst)
        self.succ_bytes = np.ascontiguousarray(nbytes)
        self.succ_ctrl = np.ascontiguousarray(ctrl)
        # tensor-level inputs (each tensor once per consumer) and control predecessors,
        # for the timeline that sends a tensor once per device and queues links
        c = g.csr
        op_of_in = np.repeat(np.arange(n, dtype=np.int64), np.diff(c.in_ptr))
        ik = np.unique(op_of_in * max(g.n_tensors, 1) + c.in_tensor.astype(np.int64))
        self.in_tensor = np.ascontiguousarray(ik % max(g.n_tensors, 1))
        self.in_ptr = np.searchsorted(ik // max(g.n_tensors, 1), np.arange(n + 1)).astype(np.int64)
        self.tensor_op = np.ascontiguousarray(g.tensor_op, np.int64)
        self.op_tensor_ptr = np.ascontiguousarray(c.op_tensor_ptr, np.int64)
        self.tensor_ptr = np.ascontiguousarray(c.tensor_ptr, np.int64)
        self.tensor_cons = np.ascontiguousarray(c.tensor_cons, np.int64)
        self.tensor_bytes = np.ascontiguousarray(g.tensor_bytes, np.float64)
        ce = np.flatnonzero(g.edge_tensor < 0)
        co = ce[np.argsort(g.edge_dst[ce], kind="stable")]
        self.cpred_src = np.ascontiguousarray(g.edge_src[co], np.int64)
        self.cpred_ptr = np.searchsorted(g.edge_dst[co], np.arange(n + 1)).astype(np.int64)
        self.xc = cl.transfer_costs()
        self.group = np.ascontiguousarray(g.group, np.int64)
        self.gmem = group_memory_bytes(problem).astype(np.float64)
        self.cap = cm.capacity.astype(np.float64)
        self.lat = np.ascontiguousarray(cl.latency_us, np.float64)
        self.bw = np.ascontiguousarray(cl.bandwidth_bytes_per_us, np.float64)
        self.order = np.ascontiguousarray(g.topo_order, np.int64)
        self.rank = np.ascontiguousarray(g.topo_rank, np.int64)
        Tf = np.where(np.isfinite(self.T), self.T, np.nan)
        self.wbar = np.nanmean(Tf, axis=1)
        if D > 1:
            off = ~np.eye(D, dtype=bool)
            self.mean_lat = float(self.lat[off].mean())
            self.mean_inv_bw = float((1.0 / self.bw[off]).mean())
        else:
            self.mean_lat = self.mean_inv_bw = 0.0
        self._rank_u = self._rule_cache = None  # computed on first use

    def rank_u(self):
        """HEFT's upward ranks, computed once: every memory round and every rule of a
        portfolio schedules in the same order (callers read the array, never write it)."""
        if self._rank_u is None:
            self._rank_u = upward_rank(self.order, self.wbar, self.succ_ptr, self.succ_dst, self.succ_bytes,
                                       self.succ_ctrl, self.mean_lat, self.mean_inv_bw)
        return self._rank_u

    def rank_d(self):
        return downward_rank(self.order, self.wbar, self.pred_ptr, self.pred_src, self.pred_bytes,
                             self.pred_ctrl, self.mean_lat, self.mean_inv_bw)

    def fresh_gdev(self):
        return np.full(self.problem.n_groups, -1, np.int64)

    def eft(self, prio, forced=None, insertion=True, rule=None):
        """Earliest-finish-time schedule in order of ``prio``; ``rule`` (N_RULE weights,
        default all 0) adds a learnt dispatching rule's terms to the device choice."""
        n = len(prio)
        forced = np.full(n, -1, np.int64) if forced is None else forced
        gdev = self.fresh_gdev()
        rule = np.zeros(N_RULE) if rule is None else np.ascontiguousarray(rule, np.float64)
        if rule.shape != (N_RULE,):
            raise ValueError(f"a dispatching rule has {N_RULE} weights, got shape {rule.shape}")
        crit, gtime, scale = self._rule_inputs() if rule.any() else (np.zeros(n), np.zeros((1, 1)), 0.0)
        out = eft_schedule(prio, self.rank, self.T, self.pred_ptr, self.pred_src, self.pred_bytes,
                           self.pred_ctrl, self.succ_ptr, self.succ_dst, self.group, gdev, self.gmem,
                           self.cap, self.lat, self.bw, forced, insertion, *self._timeline(), self.deadline,
                           rule, crit, gtime, scale, self.mean_inv_bw)
        return self._check(gdev, out[0]), out

    def _rule_inputs(self):
        """What a learnt rule's terms read: each op's upward rank over the largest, the
        groups' work per device (0 where a group may not go) and the memory term's scale,
        the largest upward rank (a step time's order of magnitude)."""
        if self._rule_cache is None:
            ru = self.rank_u()
            top = float(ru.max()) if len(ru) else 0.0
            crit = ru / top if top > 0 else np.zeros_like(ru)
            gt = self.problem.group_time
            self._rule_cache = (crit, np.ascontiguousarray(np.where(np.isfinite(gt), gt, 0.0)), top)
        return self._rule_cache

    def _timeline(self):
        return (self.in_ptr, self.in_tensor, self.tensor_op, self.tensor_bytes, self.cpred_ptr, self.cpred_src,
                self.xc, self.queued)

    def etf(self, prio, fav_parent=None, gdev=None):
        """ETF schedule; ``gdev`` (per group, -1 = free) fixes groups beforehand."""
        n = len(prio)
        fav_parent = np.full(n, -1, np.int64) if fav_parent is None else fav_parent
        gdev = self.fresh_gdev() if gdev is None else np.array(gdev, np.int64)
        # ties between equal starts: higher priority first, then topological rank; with
        # queued links a device's ready ops go in the simulator's order (topological rank)
        tie = np.empty(n, np.int64)
        if self.queued:
            tie[:] = self.rank
        else:
            tie[np.lexsort((self.rank, -prio))] = np.arange(n)
        out = etf_schedule(tie, self.T, self.pred_ptr, self.pred_src, self.pred_bytes,
                           self.pred_ctrl, self.succ_ptr, self.succ_dst, self.group, gdev, self.gmem,
                           self.cap, self.lat, self.bw, fav_parent, *self._timeline(),
                           self.op_tensor_ptr, self.tensor_ptr, self.tensor_cons, self.deadline)
        return self._check(gdev, out[0]), out

    def _check(self, gdev, place):
        if np.any(place < 0) and work_clock() >= self.deadline:
            raise BudgetExhausted  # cut short: no placement
        if np.any(gdev < 0):  # a scheduler bug, never a user error
            raise RuntimeError(f"list scheduler left {int((gdev < 0).sum())} groups unplaced")
        return gdev


def _variants(problem) -> list[bool]:
    """Device sets a scheduler tries: every device, and (when the cluster has a host
    besides its GPUs) GPUs only for the groups that may use one. List schedulers trust
    their own cost model; the simulator, which also queues transfers on links, picks."""
    return [False, True] if len(accelerators(problem)) < problem.n_devices else [False]


#: rounds a list scheduler runs against the simulator's memory account before its
#: placement is repaired instead (see :func:`_memory_rounds`)
MEMORY_ROUNDS = 8
#: how far below its capacity a retargeted device aims, as a share of the capacity
MEMORY_MARGIN = 0.05


def _retarget(acct, cap, charged, peak, margin: float = MEMORY_MARGIN) -> np.ndarray:
    """The capacities the group-memory estimate is held to in the next round.

    The estimate charges a group its parameters and every output of its ops, as if all
    lived at once; the simulator frees outputs once consumed but also holds the copies a
    device receives. How the two compare depends on the device's part of the schedule,
    so the last round's ``charged / peak`` converts a capacity into the estimate's units.
    A device over capacity gets its converted capacity (less ``margin``) where that is
    lower than now; a device with room where it is higher, so it can take what the
    others shed."""
    with np.errstate(divide="ignore", invalid="ignore"):
        target = np.where((charged > 0) & (peak > 0), charged * cap / peak * (1.0 - margin), acct)
    return np.where(peak > cap, np.minimum(acct, target), np.maximum(acct, target))


class _Rounds:
    """One schedule on one device set, run round by round against the simulator's memory
    account: ``attempt(capacities) -> (group assignment, payload)`` is scored, and while
    its placement does not fit the capacities the estimate is held to are retargeted
    (:func:`_retarget`), at most ``rounds`` times. ``runs``: [(assignment, payload,
    EvalResult)]; ``done`` once a round fits or the rounds are used up."""

    def __init__(self, problem, attempt, rounds: int = MEMORY_ROUNDS):
        self.n_devices = problem.n_devices
        self.cap = problem.cost_model.capacity.astype(np.float64)
        self.gmem = group_memory_bytes(problem).astype(np.float64)
        self.acct = self.cap.copy()
        self.attempt = attempt
        self.rounds = max(int(rounds), 1)
        self.runs: list = []
        self.done = False

    def step(self, tracker) -> None:
        gdev, payload = self.attempt(self.acct.copy())
        a = np.asarray(gdev, np.int32)
        r = score(tracker, a)
        self.runs.append((a, payload, r))
        if r.feasible[0] or len(self.runs) >= self.rounds:
            self.done = True
            return
        charged = np.bincount(a, weights=self.gmem, minlength=self.n_devices)
        self.acct = _retarget(self.acct, self.cap, charged, r.peak_memory_bytes[0].astype(np.float64))


def _memory_rounds(problem, tracker, attempt, rounds: int = MEMORY_ROUNDS) -> list:
    """Run ``attempt(capacities) -> (group assignment, payload)`` and score its placement
    until the simulator says it fits, retargeting the capacities after each round that
    does not (:class:`_Rounds`), at most ``rounds`` times.

    The first round is scored even past a seconds budget (a one-shot method always
    answers), later ones only within it. Returns [(assignment, payload, EvalResult)]."""
    rr = _Rounds(problem, attempt, rounds)
    _breadth_first([(0, rr)], tracker)
    return rr.runs


def _best(runs):
    """Index of the run the tracker ranks first: feasible, then fastest."""
    key = [(not r.feasible[0], float(r.step_time_us[0])) for _, _, r in runs]
    return min(range(len(runs)), key=key.__getitem__)


#: how many of the rounds that do not fit, fastest first, are repaired by the simulator's account
FIT_TRIES = 3


def _fit_memory(problem, tracker, runs, tries: int = FIT_TRIES):
    """:func:`placetool.search.memory.fit_memory` from the runs out of memory that are
    faster than every one that fits, fastest first, at most ``tries`` of them within
    the budget: a fast schedule a little over capacity often fits after moving a few
    groups, faster than the rounds' best. Returns the fastest (assignment, EvalResult)
    that fits, or None."""
    from .memory import fit_memory

    ref = min((float(r.step_time_us[0]) for _, _, r in runs if r.feasible[0]), default=np.inf)
    order = sorted((float(r.step_time_us[0]), i) for i, (_, _, r) in enumerate(runs)
                   if not r.feasible[0] and float(r.step_time_us[0]) < ref)
    best, seen = None, set()
    for _, i in order:
        a0 = runs[i][0]
        if len(seen) >= tries or tracker.done():
            break
        if a0.tobytes() in seen:
            continue
        seen.add(a0.tobytes())
        a, r = fit_memory(problem, a0, tracker)
        if r is not None and r.feasible[0] and (best is None or r.step_time_us[0] < best[1].step_time_us[0]):
            best = (a, r)
    return best


def _planned(problem, a, links: str) -> float:
    """The makespan of assignment ``a`` on the m-ETF timeline (the plan of a placement
    no schedule of this run produced: m-TOPO's, or a repaired one)."""
    data = _Data(problem, links=links)
    _, (_, _, finish, _) = data.etf(data.rank_u(), gdev=np.asarray(a, np.int64))
    return float(finish.max()) if len(finish) else 0.0


def _schedule_variants(problem, tracker, schedule, links: str = "queued", datas: dict | None = None) -> dict:
    """Run ``schedule(data) -> (gdev, out, extra)`` per device set, each until its
    placement fits in memory by the simulator (:class:`_Rounds`), and describe
    the run the tracker found best: the makespan its schedule planned (``planned_us``)
    beside the simulator's (``simulated_us``).

    Memory-constrained by the simulator's account, not the estimate's: where no round
    fits, the placement least over capacity is repaired (:func:`_fit_memory`), and
    failing that m-TOPO's is taken (:func:`_topo_fitted`), so the result fits whenever
    m-TOPO's does (budget permitting). ``memory_fit`` says which it was. ``datas`` (a
    dict kept by the caller, or None) holds each device set's :class:`_Data` from one
    call to the next, for callers that schedule one problem several ways."""
    return _schedule_portfolio(problem, tracker, [schedule], links, datas)[0][1]


def _schedule_portfolio(problem, tracker, schedules, links: str = "queued", datas: dict | None = None) -> list:
    """:func:`_schedule_variants` for several schedules of one problem, breadth first:
    the first memory round of every schedule and device set, then the second round of
    those that do not fit yet, and so on. Under a seconds budget a schedule that fits in
    two rounds is then not left waiting behind one that needs eight (on gnmt8/k40x8 the
    best learnt rule fits in its second round, 4.6 s into the search one schedule at a
    time, 2.2 s breadth first); with the budget to finish, every schedule gets the rounds it
    would get alone, so the placements are the same.

    A device set's first round always runs for the first schedule; a later schedule's
    first round only with at least as many seconds left as the last round took. Returns
    [(schedule index, meta, assignment)] for the schedules that ran."""
    datas = {} if datas is None else datas
    cands = []  # (schedule index, _Rounds)
    for i, schedule in enumerate(schedules):
        for gpu_only in _variants(problem):
            data = datas.get(gpu_only)
            if data is None:
                data = datas[gpu_only] = _Data(problem, gpu_only, links)

            def attempt(cap, data=data, gpu_only=gpu_only, schedule=schedule):
                data.cap = cap
                data.deadline = tracker.deadline()
                gdev, out, extra = schedule(data)
                return gdev, (gpu_only, out, extra)

            cands.append((i, _Rounds(problem, attempt)))
    _breadth_first(cands, tracker)
    # once the budget is spent and a schedule fits, the others are not repaired with
    # m-TOPO's placement: that cost dispatch 1.4 s past its seeding share on gnmt8/k40x8
    # for three placements slower than the one that fits
    topo = not (tracker.done() and any(r.feasible[0] for _, rr in cands for _, _, r in rr.runs))
    out = []
    for i in range(len(schedules)):
        runs = [run for j, rr in cands if j == i for run in rr.runs]
        if runs:
            out.append((i, *_describe(problem, tracker, runs, links, topo)))
    if not out:  # no evaluation left at all
        raise BudgetExhausted
    return out


def _breadth_first(cands, tracker) -> None:
    """Step each of ``cands`` ((schedule index, :class:`_Rounds`)) one round at a time,
    round after round, until all are done or the budget is (see
    :func:`_schedule_portfolio` for when a first round runs)."""
    took = 0.0
    for k in range(max((rr.rounds for _, rr in cands), default=0)):
        for i, rr in cands:
            if tracker.remaining_evals() <= 0 or (k > 0 and tracker.done()):
                return
            if rr.done or (k == 0 and i > 0 and tracker.seconds_left() < took):
                continue
            t = work_clock()
            rr.step(tracker)
            took = work_clock() - t


def _describe(problem, tracker, runs, links: str, topo: bool = True):
    """(meta, assignment) of one schedule's best run, repaired to fit where it does not
    (see :func:`_schedule_variants`; with m-TOPO's placement only if ``topo``)."""
    i = _best(runs)
    a, (gpu_only, (place, start, finish, fallbacks), extra), r = runs[i]
    meta = {"devices": "gpus" if gpu_only else "all", "links": links, "memory": "constrained",
            "memory_rounds": len(runs), "memory_fit": "schedule" if r.feasible[0] else "none",
            "planned_us": float(finish.max()) if len(finish) else 0.0, "simulated_us": float(r.step_time_us[0]),
            "memory_fallbacks": int(fallbacks)}
    meta.update(extra or {})
    fitted = _fit_memory(problem, tracker, runs)
    if fitted is not None:  # faster than any round that fits, or the only one
        a, r = fitted
        meta["memory_fit"] = "fit_memory"
    elif not r.feasible[0] and topo:
        got = _topo_fitted(problem, tracker)
        if got is not None and got[2].feasible[0]:
            a, fit, r = got[0], got[1], got[2]
            meta.update(memory_fit=f"m-topo ({fit})", devices="all", memory_fallbacks=got[3])
    if meta["memory_fit"] not in ("schedule", "none"):  # the plan of the placement returned
        meta.update(planned_us=_planned(problem, a, links), simulated_us=float(r.step_time_us[0]))
    return meta, a


# ------------------------------------------------------------------ methods
@register("heft", seed_rank=4, summary="HEFT: upward-rank order, earliest-finish-time device, insertion into idle "
                                  "gaps; memory-constrained")
def heft(problem, budget, seed, tracker, insertion: bool = True, links: str = "queued"):
    """HEFT: upward-rank order, earliest-finish-time device, insertion into idle gaps."""

    def schedule(data):
        gdev, out = data.eft(data.rank_u(), insertion=bool(insertion))
        return gdev, out, None

    return _schedule_variants(problem, tracker, schedule, links)


@register("critical-path", seed_rank=5, summary="CPOP: critical-path ops on the device that runs the whole path "
                                           "fastest, the rest by earliest finish time; memory-constrained")
def critical_path(problem, budget, seed, tracker, links: str = "queued"):
    """CPOP: critical-path ops on the device that runs the whole path fastest, the rest
    by earliest finish time, in order of upward + downward rank."""

    def schedule(data):
        prio = data.rank_u() + data.rank_d()
        cp_len = float(prio.max()) if len(prio) else 0.0
        cp_ops = np.flatnonzero(prio >= cp_len * (1 - 1e-9))
        # the device that can run most of the path (pinned ops may not), then fastest
        Tc = data.T[cp_ops]
        fin = np.isfinite(Tc)
        cost = np.where(fin, Tc, 0.0).sum(axis=0)
        runnable = fin.sum(axis=0)
        cp_dev = int(np.lexsort((cost, -runnable))[0]) if fin.any() else -1
        forced = np.full(len(prio), -1, np.int64)
        if cp_dev >= 0:
            forced[cp_ops] = cp_dev
        gdev, out = data.eft(prio, forced=forced)
        return gdev, out, {"critical_path_ops": int(len(cp_ops)),
                           "critical_path_device": problem.cluster.names[cp_dev] if cp_dev >= 0 else None}

    return _schedule_variants(problem, tracker, schedule, links)


def _topo_assign(problem, cap):
    """m-TOPO's group assignment with device capacities ``cap`` (bytes of the estimate);
    returns (assignment, memory fallbacks, compute share per GPU in µs)."""
    g = problem.graph
    acc = accelerators(problem)
    gmem = group_memory_bytes(problem).astype(np.float64)
    gt = gpu_group_time(problem)
    on_acc = problem.allowed[:, acc].any(axis=1)
    share = gt[on_acc].sum() / len(acc)
    fb = fallback_device(problem)
    used = np.zeros(problem.n_devices)
    gdev = np.full(problem.n_groups, -1, np.int64)
    c, load, fallbacks = 0, 0.0, 0
    for op in g.topo_order.tolist():
        k = int(g.group[op])
        if gdev[k] >= 0:
            continue
        if not on_acc[k]:
            gdev[k] = fb[k]
            used[fb[k]] += gmem[k]
            continue
        while c < len(acc) - 1 and (load >= share or used[acc[c]] + gmem[k] > cap[acc[c]]):
            c, load = c + 1, 0.0
        d = int(acc[c])
        if not problem.allowed[k, d] or used[d] + gmem[k] > cap[d]:
            room = np.where(problem.allowed[k], cap - used, -np.inf)
            d = int(np.argmax(room))
            fallbacks += int(room[d] < gmem[k])
        gdev[k] = d
        used[d] += gmem[k]
        if d == acc[c]:
            load += gt[k]
    return gdev, fallbacks, float(share)


def _topo_fitted(problem, tracker):
    """m-TOPO under the simulator's memory account: rounds of :func:`_topo_assign`
    (:func:`_memory_rounds`), then :func:`_fit_memory` if none fits. Returns
    (assignment, how it fits, EvalResult, memory fallbacks, share) of the best, or None
    when no evaluation was left."""
    def attempt(cap):
        gdev, fallbacks, share = _topo_assign(problem, cap)
        return gdev, (fallbacks, share)

    runs = _memory_rounds(problem, tracker, attempt)
    if not runs:
        return None
    a, (fallbacks, share), r = runs[_best(runs)]
    if r.feasible[0]:
        return a, "schedule", r, int(fallbacks), share
    fitted = _fit_memory(problem, tracker, runs)
    if fitted is not None:
        return fitted[0], "fit_memory", fitted[1], int(fallbacks), share
    return a, "none", r, int(fallbacks), share


@register("m-topo", seed_rank=6, summary="m-TOPO: in topological order, fill one GPU after another with about 1/n "
                                    "of the compute each; memory-constrained")
def m_topo(problem, budget, seed, tracker, links: str = "queued"):
    """m-TOPO: in topological order, fill one GPU after another with about 1/n of the
    compute each, moving on early when a GPU's memory is full."""
    topo = _topo_fitted(problem, tracker)
    if topo is None:
        raise BudgetExhausted
    a, fit, r, fallbacks, share = topo
    # its plan: the placement, ops started earliest first on the same timeline as m-ETF
    return {"share_us": share, "memory_fallbacks": fallbacks, "links": links, "memory": "constrained",
            "memory_fit": fit, "planned_us": _planned(problem, a, links), "simulated_us": float(r.step_time_us[0])}


@register("m-etf", seed_rank=3, summary="m-ETF: earliest task first under device memory; memory-constrained")
def m_etf(problem, budget, seed, tracker, links: str = "queued"):
    """m-ETF: earliest task first under device memory."""

    def schedule(data):
        gdev, out = data.etf(data.rank_u())
        return gdev, out, None

    return _schedule_variants(problem, tracker, schedule, links)


def _sct_lp(p, src, dst, nbytes, ctrl, mean_lat, mean_inv_bw, time_limit):
    """Solve the SCT LP on one (sub)graph of len(p) ops; returns (fav_parent, message)."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    n, E = len(p), len(src)
    data_e = np.flatnonzero(~ctrl)
    m = len(data_e)
    c = mean_lat + nbytes[data_e] * mean_inv_bw
    nv = n + m + 1
    wcol = n + m
    ar = np.arange(E)
    xcol = n + np.arange(m)
    # precedence: s_i - s_j + c_ij x_ij <= -p_i
    rows = [ar, ar, data_e]
    cols = [src, dst, xcol]
    vals = [np.ones(E), -np.ones(E), c]
    b = [-p[src]]
    r = E
    # makespan: s_i - w <= -p_i (sinks only)
    sinks = np.setdiff1d(np.arange(n), src)
    rr = r + np.arange(len(sinks))
    rows += [rr, rr]
    cols += [sinks, np.full(len(sinks), wcol)]
    vals += [np.ones(len(sinks)), -np.ones(len(sinks))]
    b.append(-p[sinks])
    r += len(sinks)
    # at most one favourite child per op and one favourite parent: -sum x <= -(deg - 1)
    for ends in (src[data_e], dst[data_e]):
        deg = np.bincount(ends, minlength=n)
        who = np.flatnonzero(deg > 1)
        rid = np.full(n, -1, np.int64)
        rid[who] = r + np.arange(len(who))
        sel = np.flatnonzero(rid[ends] >= 0)
        rows.append(rid[ends][sel])
        cols.append(n + sel)
        vals.append(-np.ones(len(sel)))
        b.append(-(deg[who] - 1).astype(np.float64))
        r += len(who)
    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nv))
    obj = np.zeros(nv)
    obj[wcol] = 1.0
    bounds = np.zeros((nv, 2))
    bounds[:, 1] = np.inf
    bounds[n:n + m, 1] = 1.0
    res = linprog(obj, A_ub=A, b_ub=np.concatenate(b), bounds=bounds, method="highs",
                  options={"time_limit": float(time_limit)})
    fav_parent = np.full(n, -1, np.int64)
    if res.x is None:
        return fav_parent, str(res.message)
    x = res.x[n:n + m]
    es, ed = src[data_e], dst[data_e]
    chosen = np.flatnonzero(x < 0.5)
    # by construction at most one per parent and per child; keep the smallest x if the
    # solver's tolerance lets two through
    chosen = chosen[np.argsort(x[chosen], kind="stable")]
    seen_p = np.zeros(n, bool)
    for e in chosen.tolist():
        i, j = es[e], ed[e]
        if not seen_p[i] and fav_parent[j] < 0:
            fav_parent[j] = i
            seen_p[i] = True
    return fav_parent, str(res.message)


def sct_favourite_children(data, time_limit: float = 60.0, window: int = 2500):
    """Favourite child of each op from the SCT LP relaxation (Hanen & Munier 1995).

    Variables: start s_i, x_ij in [0, 1] per data edge (0 = child co-located), makespan w.
    minimise w  s.t.  s_i + p_i + c_ij x_ij <= s_j;  s_i + p_i <= w;
    sum_j x_ij >= outdeg(i) - 1;  sum_i x_ij >= indeg(j) - 1.
    An op's favourite child is its data successor with x_ij < 1/2 (at most one exists).
    p_i is the op's time on the fastest GPU (the theory assumes identical processors),
    c_ij the mean link time of the edge's bytes.

    HiGHS time grows faster than linearly with the graph, so graphs larger than
    ``window`` ops are solved as consecutive windows of the topological order (edges
    crossing windows get no favourite); each window gets ``time_limit`` / windows.
    Returns (fav_parent per op, -1 for none; LP status text of the last window).
    """
    n = len(data.wbar)
    acc = accelerators(data.problem)
    pa = data.T[:, acc].min(axis=1) if len(acc) else np.full(n, np.inf)
    p = np.where(np.isfinite(pa), pa, np.where(np.isfinite(data.wbar), data.wbar, 0.0))
    fav = np.full(n, -1, np.int64)
    n_win = max(1, -(-n // window))
    bounds = np.linspace(0, n, n_win + 1).astype(np.int64)
    win_of = np.empty(n, np.int64)
    win_of[data.order] = np.searchsorted(bounds, np.arange(n), side="right") - 1
    message = "empty graph"
    for w in range(n_win):
        ops = data.order[bounds[w]:bounds[w + 1]]
        local = np.full(n, -1, np.int64)
        local[ops] = np.arange(len(ops))
        sel = (win_of[data.src] == w) & (win_of[data.dst] == w)
        f, message = _sct_lp(p[ops], local[data.src[sel]], local[data.dst[sel]], data.bytes[sel],
                             data.ctrl[sel], data.mean_lat, data.mean_inv_bw, time_limit / n_win)
        has = f >= 0
        fav[ops[has]] = ops[f[has]]
    return fav, message


@register("m-sct", seed_rank=8, summary="m-SCT: m-ETF with favourite children (SCT LP, SciPy/HiGHS) on their "
                                   "parent's device; memory-constrained")
def m_sct(problem, budget, seed, tracker, lp_seconds: Positive | None = None, links: str = "queued"):
    """m-SCT: ETF under memory, favourite children (SCT LP, SciPy/HiGHS) on their
    parent's device."""
    limit = float(lp_seconds) if lp_seconds else min(60.0, (budget.seconds or 120.0) / 2)
    lp = {}

    def schedule(data):
        if not lp:  # the LP does not depend on the device set: solve it once
            lp["fav"], lp["status"] = sct_favourite_children(data, limit)
        gdev, out = data.etf(data.rank_u(), lp["fav"])
        return gdev, out, {"favourite_children": int((lp["fav"] >= 0).sum()), "lp_status": lp["status"]}

    return _schedule_variants(problem, tracker, schedule, links)

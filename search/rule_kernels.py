"""The terms of a learnt dispatching rule (:mod:`placetool.search.dispatch`), which
:func:`placetool.search.listsched_kernels.eft_schedule` weighs into HEFT's device choice."""

from __future__ import annotations

import numpy as np
from numba import njit

#: how many terms a learnt dispatching rule weighs (:func:`_rule_terms`)
N_RULE = 6


@njit(cache=True)
def _rule_terms(op, g, cand, T, gdev, gmem, used, cap, avail, committed, crit, gtime, mem_scale,
                pred_ptr, pred_src, pred_bytes, pred_ctrl, place, inv_bw, rule, extra):
    """Set ``extra[d]`` to the sum of ``rule``'s weights times these terms for each
    candidate device d of op, each term in µs and relative to the
    other candidates, so that a rule learnt on one graph and cluster means the same on
    another (device slots are interchangeable; only these relations carry over):

    0. memory: the fraction of d's capacity held once op's group is on it, x ``mem_scale``;
    1. backlog: d's work booked beyond the least booked candidate's;
    2. slowness where it hurts: op's time on d above its fastest, x ``crit[op]`` (its
       upward rank over the largest, 1 on the critical path);
    3. traffic: bytes op receives from other devices if it runs on d, at the mean bandwidth;
    4. the group's work: what the rest of op's group costs on d above its cheapest
       candidate (0 once the group is fixed), which earliest finish alone never sees;
    5. commitments: work of fixed groups' ops still to come on d, above the least.
    """
    D = T.shape[1]
    amin, tmin, gmin, cmin = np.inf, np.inf, np.inf, np.inf
    free = gdev[g] < 0
    for d in range(D):
        if cand[d]:
            amin = min(amin, avail[d])
            tmin = min(tmin, T[op, d])
            cmin = min(cmin, committed[d])
            if free:
                gmin = min(gmin, gtime[g, d] - T[op, d])
    for d in range(D):
        if not cand[d]:
            continue
        held = used[d] + (gmem[g] if free else 0.0)
        x = 0.0
        for k in range(pred_ptr[op], pred_ptr[op + 1]):
            if not pred_ctrl[k] and place[pred_src[k]] != d:
                x += pred_bytes[k]
        extra[d] = (rule[0] * (mem_scale * held / cap[d] if cap[d] > 0 else 0.0)
                    + rule[1] * (avail[d] - amin)
                    + rule[2] * (T[op, d] - tmin) * crit[op]
                    + rule[3] * x * inv_bw
                    + rule[4] * ((gtime[g, d] - T[op, d] - gmin) if free else 0.0)
                    + rule[5] * (committed[d] - cmin))

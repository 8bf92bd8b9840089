"""The compiled simulation engine: one event loop for full and incremental runs.

Same rules as :mod:`placetool.costmodel.reference`, bit for bit. To follow one rule from
the reference to the engine: each handler of ``reference.simulate`` (``dispatch``,
``op_done``, ``send_done``, ``xfer_done``, ``recv_done``) has one block in
:func:`loop._run <placetool.costmodel.engine.loop._run>` that names it; the tests that
hold the two together are in ``tests/test_simulator.py`` (and ``tests/test_incremental.py``
for the checkpoints). The modules:

- :mod:`.state`: the arrays (:class:`Net`, :class:`Work`, :class:`Checkpoints`,
  :class:`Base`), the named slots of their scalar arrays, and the set-up of a run;
- :mod:`.queues`: the event queue and the per-device ready and task queues;
- :mod:`.loop`: the event loop;
- :mod:`.checkpoints`: save, restore and converged, for the incremental simulator;
- :mod:`.entry`: the entry points (a full run, a batch's rows, an incremental run) and the
  small kernels around them.
"""

from .checkpoints import converged, restore, save
from .entry import critical_path, device_peak, placement_violation, run_incremental, simulate_full, simulate_rows
from .loop import OP_DONE, RECV_DONE, SEND_DONE, XFER_DONE, _run
from .queues import READY_SCAN, SORT_BLOCK, evq_push, readyq_push, readyq_sort, taskq_push, time_bits
from .state import (CKF_MAKESPAN, CKF_NEXT_T, CKI_CLEAN, LOW, SC_N_CK, SC_N_X, SF_MAKESPAN, U64, Base,
                    Checkpoints, Net, Work, init_fresh, make_base, make_checkpoints, make_net, make_work, set_bases,
                    work_for)

__all__ = [
    "CKF_MAKESPAN", "CKF_NEXT_T", "CKI_CLEAN", "SC_N_CK", "SC_N_X", "SF_MAKESPAN",
    "Base", "Checkpoints", "LOW", "Net", "OP_DONE", "READY_SCAN", "RECV_DONE", "SEND_DONE", "SORT_BLOCK", "U64",
    "Work", "XFER_DONE", "_run", "converged", "critical_path", "device_peak", "evq_push", "init_fresh", "make_base",
    "make_checkpoints", "make_net", "make_work", "placement_violation", "readyq_push", "readyq_sort", "restore",
    "run_incremental", "save", "set_bases", "simulate_full", "simulate_rows", "taskq_push", "time_bits", "work_for",
]

"""Do a GPU's host<->device copies overlap compute and each other?

The simulator charges a GPU no send/receive cost (its copy engines overlap compute) and
queues transfers one FIFO per directed link. This measures both assumptions on a lent GPU
with PyTorch (TensorFlow is not installed there): copies alone, a matmul loop alone, and
pairs of them on separate CUDA streams at once. A pair that takes the sum of its parts
ran serialised; one that takes the larger part overlapped.

Run: python3 benchmarks/gpu_copy_engines.py [--mb 256] [--rounds 7]
Prints one table: median and spread (min-max) of each case over interleaved rounds, in µs.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="bytes per copy, in MiB")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    dev = torch.device("cuda")
    n = a.mb * 2**20
    h1 = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    h2 = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    d1 = torch.empty(n, dtype=torch.uint8, device=dev)
    d2 = torch.empty(n, dtype=torch.uint8, device=dev)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    streams = [torch.cuda.Stream() for _ in range(2)]

    def h2d(buf_d, buf_h):
        return lambda: buf_d.copy_(buf_h, non_blocking=True)

    def d2h(buf_h, buf_d):
        return lambda: buf_h.copy_(buf_d, non_blocking=True)

    def mm():
        for _ in range(5):
            torch.mm(x, x)

    cases = {
        "h2d": [h2d(d1, h1)],
        "d2h": [d2h(h1, d1)],
        "matmul": [mm],
        "h2d + h2d": [h2d(d1, h1), h2d(d2, h2)],
        "d2h + d2h": [d2h(h1, d1), d2h(h2, d2)],
        "h2d + d2h": [h2d(d1, h1), d2h(h2, d2)],
        "h2d + matmul": [h2d(d1, h1), mm],
        "d2h + matmul": [d2h(h1, d1), mm],
    }

    def run(fns):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s, f in zip(streams, fns):
            with torch.cuda.stream(s):
                f()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6

    for fns in cases.values():  # warm-up
        run(fns)
    times = {k: [] for k in cases}
    for _ in range(a.rounds):  # interleaved rounds, so a slow episode hits every case
        for k, fns in cases.items():
            times[k].append(run(fns))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{torch.cuda.get_device_name()}, {a.mb} MiB per copy, {a.rounds} interleaved rounds")
    print(f"{'case':<14}{'median µs':>12}{'min':>10}{'max':>10}{'vs sum':>9}{'vs max':>9}")
    for k, v in times.items():
        parts = k.split(" + ")
        extra = ""
        if len(parts) == 2:
            s = med[parts[0]] + med[parts[1]]
            m = max(med[parts[0]], med[parts[1]])
            extra = f"{med[k] / s:>9.2f}{med[k] / m:>9.2f}"
        print(f"{k:<14}{med[k]:>12.0f}{min(v):>10.0f}{max(v):>10.0f}{extra}")
    print("vs sum near 1: the pair ran one after the other; vs max near 1: it overlapped")


if __name__ == "__main__":
    main()

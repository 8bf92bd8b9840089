"""Damaged graph files: every corruption is a GraphError naming the file, never a
traceback from zipfile, zlib, numpy or pickle — random byte flips and truncations of a
bundled graph, and well-formed zips whose arrays or meta.json are wrong."""

import io
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from placetool.costmodel import CostModel, presets
from placetool.costmodel.graph import GraphError, load

SOURCE = presets.data_dir() / "graphs" / "rnnlm.npz"


def check(path):
    """Load ``path``: a graph that loads must simulate; anything else is a GraphError
    whose one-line message starts with the file's path."""
    try:
        g = load(path)
    except GraphError as e:
        msg = str(e)
        assert msg.startswith(str(path)) and "\n" not in msg, msg
        return "refused"
    cm = CostModel(g, presets.load_cluster("k80x2"))
    r = cm.simulate(cm.single_device(1))
    assert r.step_time_us > 0
    return "loaded"


def test_random_flips_and_truncations(tmp_path):
    data = SOURCE.read_bytes()
    rng = np.random.default_rng(13)
    outcome = {"refused": 0, "loaded": 0}
    for case in range(300):
        b = bytearray(data)
        kind = case % 3
        if kind == 0:  # a few random bytes flipped anywhere
            for i in rng.integers(0, len(b), size=rng.integers(1, 8)):
                b[i] ^= int(rng.integers(1, 256))
        elif kind == 1:  # cut short
            b = b[: int(rng.integers(0, len(b)))]
        else:  # a run of garbage over the zip's directory at the end (headers, sizes, offsets)
            i = int(rng.integers(max(0, len(b) - 2000), len(b)))
            b[i:i + 16] = rng.integers(0, 256, size=len(b[i:i + 16]), dtype=np.uint8).tobytes()
        p = tmp_path / f"c{case}.npz"
        p.write_bytes(bytes(b))
        outcome[check(p)] += 1
    assert outcome["refused"] > 200  # most damage is caught (CRC, headers), the rest is harmless


def _rezip(tmp_path, name, change):
    """A well-formed zip (good CRCs) with one member replaced by ``change(members)``."""
    with zipfile.ZipFile(SOURCE) as z:
        members = {n: z.read(n) for n in z.namelist()}
    change(members)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    p = tmp_path / f"{name}.npz"
    p.write_bytes(buf.getvalue())
    return p


def _npy(a):
    b = io.BytesIO()
    np.save(b, a, allow_pickle=True)
    return b.getvalue()


def _meta(**kw):
    def change(m):
        d = json.loads(m["meta.json"])
        d.update(kw)
        m["meta.json"] = json.dumps(d).encode()
    return change


CASES = {
    "pickled-object-array": lambda m: m.update({"out_bytes.npy": _npy(np.array([{"a": 1}] * 3, dtype=object))}),
    "garbage-npy": lambda m: m.update({"edge_src.npy": b"\x93NUMPY\x01\x00garbage"}),
    "npy-wrong-magic": lambda m: m.update({"edge_dst.npy": b"not an array at all"}),
    "float-edges": lambda m: m.update({"edge_src.npy": _npy(np.load(io.BytesIO(m["edge_src.npy"])).astype(float) + 0.5)}),
    "2d-array": lambda m: m.update({"flops.npy": _npy(np.zeros((2, 2)))}),
    "short-array": lambda m: m.update({"param_bytes.npy": _npy(np.zeros(3, np.int64))}),
    "type-code-out-of-range": lambda m: m.update({"op_type_code.npy": _npy(np.full(
        len(np.load(io.BytesIO(m["op_type_code.npy"]))), 10**6, np.int32))}),
    "names-not-utf8": lambda m: m.update({"names.npy": _npy(np.frombuffer(b"\xff\xfe\xfd" * 50, np.uint8))}),
    "names-too-few": lambda m: m.update({"names.npy": _npy(np.frombuffer(b"a\nb", np.uint8))}),
    "missing-array": lambda m: m.pop("edge_dst.npy"),
    "missing-meta": lambda m: m.pop("meta.json"),
    "meta-not-json": lambda m: m.update({"meta.json": b"{nope"}),
    "meta-not-object": lambda m: m.update({"meta.json": b"[1, 2]"}),
    "meta-version": _meta(version=99),
    "meta-name-not-string": _meta(name=["x"]),
    "meta-meta-not-object": _meta(meta=5),
    "huge-edge-index": lambda m: m.update({"edge_src.npy": _npy(np.full(
        len(np.load(io.BytesIO(m["edge_src.npy"]))), 2**40, np.int64))}),
    "no-ops": lambda m: m.update({k: _npy(np.zeros(0, np.load(io.BytesIO(v)).dtype)) for k, v in m.items()
                                  if k.endswith(".npy")}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_structural_damage(tmp_path, name):
    p = _rezip(tmp_path, name, CASES[name])
    assert check(p) == "refused"


def test_damaged_file_on_the_command_line(tmp_path):
    p = tmp_path / "bad.npz"
    p.write_bytes(SOURCE.read_bytes()[:5000])
    for args in (["info", "-g", p], ["simulate", "-g", p], ["search", "-g", p, "-m", "single"]):
        r = subprocess.run([sys.executable, "-m", "placetool.cli.main", *map(str, args)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and str(p) in r.stderr

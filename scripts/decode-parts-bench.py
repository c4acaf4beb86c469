#!/usr/bin/env python
"""Time the decode step's two streaming pieces on a CUDA GPU: attention over the K/V cache and the GEMVs.

    PYTHONPATH=<a tkx tree> python scripts/decode-parts-bench.py --out OUT [--only attention,gemv] [--tag NAME]
    PYTHONPATH=<a tkx tree> python scripts/decode-parts-bench.py --prepare gemv-int8   # compile only

The tkx imported is the one on ``PYTHONPATH`` (the script adds nothing to ``sys.path``), so one run can time
two trees with the same script. Each piece is one tkx kernel whose work is several independent copies of
the piece in one stage (so the grid streams many bytes and the launch is a small part), verified against a
float32 torch reference, then timed (µs per launch: median of 9 CUDA-event samples of CUDA-graph replays):

* ``attention``: 4 layers' attention of the ``decode`` configuration (batch 4 x 8 heads, one query each, a
  bf16 cache of 1024 x 64 per head), written as the decode step writes it (scores, a ``<= pos`` mask,
  softmax in fp32, ``@ v``), at ``pos = 1023`` (the whole cache) and ``pos = 255``;
* ``gemv-<fmt>``: 8 independent ``F.linear`` of 4 bf16 rows by ``[N, K]`` weights (bf16, or int8 / int4 with
  scales per 128 columns dequantised as the decode step writes it), for the decode layer's shapes;
* ``empty``: a kernel of one tiny pointwise op (the launch's own cost).

GB/s = bytes the piece must read (weights + scales, or the K/V cache up to ``pos``) / µs. Writes
``OUT/decode-parts[-TAG].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import tkx
from tkx.bench.timing import time_steps
from tkx.examples import decode as D

DEV = torch.device("cuda")
BF16 = torch.bfloat16
SHAPES = ((512, 512), (1536, 512), (512, 1536))
COPIES = 8
LAYERS, B, H, S, HD = 4, 4, 8, 1024, 64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def attention_piece():
    g = gen(1)
    qs = [torch.randn(B, H, HD, generator=g).to(BF16) for _ in range(LAYERS)]
    ks = [torch.randn(B, H, S, HD, generator=g).to(BF16) for _ in range(LAYERS)]
    vs = [torch.randn(B, H, S, HD, generator=g).to(BF16) for _ in range(LAYERS)]

    def step(qs, ks, vs, pos):
        keep = torch.arange(S, device=pos.device) <= pos
        outs = []
        for q, k, v in zip(qs, ks, vs):
            scores = (q.unsqueeze(2) @ k.transpose(-2, -1)).float() / math.sqrt(HD)
            scores = torch.where(keep, scores, float("-inf"))
            outs.append((scores.softmax(-1).to(BF16) @ v).squeeze(2))
        return tuple(outs)

    def reference(qs, ks, vs, pos):
        outs = []
        for q, k, v in zip(qs, ks, vs):
            s = torch.einsum("bhd,bhkd->bhk", q.float(), k[:, :, :pos + 1].float()) / math.sqrt(HD)
            outs.append(torch.einsum("bhk,bhkd->bhd", s.softmax(-1), v[:, :, :pos + 1].float()))
        return outs

    def nbytes(pos: int) -> int:
        return LAYERS * 2 * B * H * (pos + 1) * HD * 2

    return step, (tuple(qs), tuple(ks), tuple(vs)), reference, nbytes


def gemv_piece(quant: str, n: int, k: int):
    g = gen(n * 7 + k)
    x = torch.randn(4, k, generator=g).to(BF16)
    ws = [torch.randn(n, k, generator=g) / math.sqrt(k) for _ in range(COPIES)]
    if quant == "bf16":
        params = tuple(w.to(BF16) for w in ws)

        def step(x, params):
            return tuple(F.linear(x, w) for w in params)

        def reference(x, params):
            return [x.float() @ w.float().t() for w in params]
        nbytes = COPIES * n * k * 2
    else:
        quantize = D.quantize_int8 if quant == "int8" else D.quantize_int4
        params = tuple(quantize(w, 128) for w in ws)

        def step(x, params):
            return tuple(F.linear(x, D.dequantize(q, s, quant, 128)) for q, s in params)

        def reference(x, params):
            return [x.float() @ D.dequantize(q, s, quant, 128).float().t() for q, s in params]
        nbytes = COPIES * (n * k // (1 if quant == "int8" else 2) + 2 * n * (k // 128))  # the rows and their scales
    return step, (x, params), reference, nbytes


def to_dev(x):
    if isinstance(x, torch.Tensor):
        return x.to(DEV)
    return type(x)(to_dev(y) for y in x)


def time_runner(runner, args) -> float:
    g = runner.capture_graph(*args)
    samples, _ = time_steps([g.graph.replay], DEV, repeats=9, warmup=3, queue_ahead=True)
    g.check_status()
    return sorted(samples)[len(samples) // 2]


def worst_error(got, want) -> float:
    err = 0.0
    for a, b in zip(got, want):
        b = b.to(a.device)
        err = max(err, float((a.float() - b).abs().max() / b.abs().max().clamp_min(1e-6)))
    return err


def pieces(only: set[str]):
    if "attention" in only:
        yield "attention", attention_piece
    for quant in ("bf16", "int8", "int4"):
        if f"gemv-{quant}" in only or "gemv" in only:
            for n, k in SHAPES:
                yield f"gemv-{quant} {n}x{k}", (lambda q=quant, n=n, k=k: gemv_piece(q, n, k))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("decode-parts-out"))
    ap.add_argument("--only", default="empty,attention,gemv")
    ap.add_argument("--tag", default="")
    ap.add_argument("--prepare", metavar="PIECES", help="only compile these pieces (comma list, as --only)")
    a = ap.parse_args(argv)
    only = set((a.prepare or a.only).split(","))
    results: dict = {"gpu": torch.cuda.get_device_name(DEV), "torch": torch.__version__, "tkx": tkx.__file__,
                     "peak_bytes_per_s": 4.8e12, "pieces": {}}
    if "empty" in only and not a.prepare:
        tiny = torch.zeros(4, device=DEV)
        runner = tkx.runtime.build(lambda x: x + 1.0, (tiny,))
        results["pieces"]["empty"] = {"us": time_runner(runner, (tiny,))}
        print(f"empty kernel: {results['pieces']['empty']['us']:.2f} µs", flush=True)
    for name, make in pieces(only):
        step, args, reference, nbytes = make()
        args = to_dev(args)
        extra = (torch.tensor(S - 1, device=DEV),) if name == "attention" else ()
        t0 = time.perf_counter()
        runner = tkx.runtime.build(step, (*args, *extra))
        build_s = time.perf_counter() - t0
        print(f"{name}: built in {build_s:.1f} s", flush=True)
        if a.prepare:
            continue
        notes = {gid: dict(v) for gid, v in runner.source.notes.items() if isinstance(v, dict)} \
            if hasattr(runner, "source") else {}
        for pos in ((S - 1, 255) if name == "attention" else (None,)):
            call = (*args, torch.tensor(pos, device=DEV)) if pos is not None else args
            got = runner(*call)
            got = got if isinstance(got, (tuple, list)) else (got,)
            err = worst_error(got, reference(*call))
            us = time_runner(runner, call)
            b = nbytes(pos) if pos is not None else nbytes
            key = f"{name} pos {pos}" if pos is not None else name
            results["pieces"][key] = {"us": us, "bytes": b, "GB_per_s": b / us / 1e3, "max_rel_error": err,
                                      "ok": err < 2e-2, "build_s": build_s,
                                      "variants": sorted({str(v.get("variant", "")) for v in notes.values()} - {""})}
            print(f"{key}: {us:.2f} µs, {b / us / 1e3:.0f} GB/s, max rel error {err:.2e}", flush=True)
    if a.prepare:
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "decode-parts" + (f"-{a.tag}" if a.tag else "")
    (a.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    lines = [f"Decode pieces on {results['gpu']} (torch {results['torch']}), tkx from `{results['tkx']}`", "",
             "| piece | µs | bytes read | GB/s | max rel error |", "|---|---|---|---|---|"]
    for key, r in results["pieces"].items():
        if "bytes" in r:
            lines.append(f"| {key} | {r['us']:.2f} | {r['bytes']} | {r['GB_per_s']:.0f} | {r['max_rel_error']:.1e} |")
        else:
            lines.append(f"| {key} | {r['us']:.2f} | | | |")
    (a.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

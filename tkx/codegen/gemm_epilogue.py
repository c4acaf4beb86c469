"""The wgmma tile epilogue: accumulators to a padded (optionally swizzled) fp32 C tile in shared memory,
then the epilogue per element in batches (:func:`_batched_epilogue`), in 16-byte vectors
(:class:`_VectorTile`, :mod:`tkx.codegen.epilogue_vector`), with optional L2 prefetches of its reads."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..target import GemmProblem, ceil_div
from . import epilogue_vector as ev
from .gemm_tile import Epilogue, _epilogue_block
from .text import block, indent

#: Elements per thread and pass of the wgmma tile epilogue (their loads in flight together). A 128x256
#: tile of an SGD update took 16 passes of 8 (the target's :data:`~tkx.target.EPILOGUE_BATCH`) on 256
#: threads, each waiting one memory latency (on the H200 its items ran 15 µs in medium's step against
#: about 7 µs with a store-only epilogue); 16 halves the passes. Registers (sm_90a, NVRTC, no spills):
#: small 116 -> 134, medium 155 -> 154, mixed_precision 154 -> 178 (32: 168 / 189 / 246). With
#: ``WgmmaKnobs.epilogue_vector`` this is the scalar path: the fallback for misaligned pointers and
#: epilogues without a point access.
WGMMA_EPILOGUE_BATCH = 16




#: Register estimate of one vectorized pass (:meth:`~tkx.codegen.epilogue_vector.VectorAccesses.registers_per_element`
#: x elements): an SGD update (2 per element) takes 64 elements per pass, a 64x128 tile on 256 threads its
#: 32 in one pass.
WGMMA_EPILOGUE_VECTOR_REGS = 128


#: A vectorized tile epilogue of one pass whose point-read vectors take at most this many registers per
#: thread (64x128 tile, one bf16 read: 16) issues those loads at the start of the work item, before the
#: k-loop, so their latency hides behind the operand copies (not with split-K). 0: never. Measured on the
#: H200 (item medians): small's 2.30 -> 2.18 µs and 1.60 -> 1.47 µs, medium's 6.37 -> 6.18 µs against the
#: vector epilogue without them.
WGMMA_EPILOGUE_EARLY_REGS = 16


_DECL = re.compile(r"^\s*(?:const\s+)?(?:float|double|int|unsigned|bool|long long|unsigned long long)\s+(\w+)\s*=.*;")


_STORE = re.compile(r"^\s*tkx_st_\w+\(.*\);")


def _batch_coords(batch: int, threads: int, tn: int, acc: Callable[[str], str], *, m_guard: bool = False,
                  n_guard: bool = False) -> list[str]:
    """Per element ``u`` of a thread's batch (names prefixed ``tkxE{u}_``, see :func:`_batched_epilogue`):
    its position ``e`` in the C tile, its row and column, then ``acc(prefix)``: the statement(s) leaving
    its accumulator in ``{prefix}acc``. With a guard (a tile that may cross the edge of C), ``{prefix}in``
    says whether the element is inside C and its row/column are clamped to the last one inside: every
    load of the element's epilogue then reads a valid address (the value of an element inside C), and
    the caller stores only where ``{prefix}in`` holds (``_batched_epilogue(..., guarded=True)``)."""
    lines = []
    for u in range(batch):
        x = f"tkxE{u}_"
        lines.append(f"const int {x}e = e + {u * threads};")
        if m_guard or n_guard:
            r, c = f"row0 + {x}e / {tn}", f"col0 + {x}e % {tn}"
            conds = " && ".join(t for t, on in ((f"{r} < M", m_guard), (f"{c} < N", n_guard)) if on)
            lines += [f"const bool {x}in = {conds};  // inside C: stored",
                      f"const int {x}row = {f'min({r}, M - 1)' if m_guard else r}, "
                      f"{x}col = {f'min({c}, N - 1)' if n_guard else c};  // clamped: loads stay inside"]
        else:
            lines.append(f"const int {x}row = row0 + {x}e / {tn}, {x}col = col0 + {x}e % {tn};")
        lines.append(acc(x))
    return lines


def _batched_epilogue(epilogue: Epilogue, batch: int, *, batch_index: bool = False,
                      guarded: bool = False) -> tuple[list[str], list[str]] | None:
    """The epilogue of ``batch`` elements as (computations, stores): element ``u``'s statements
    with its names prefixed ``tkxE<u>_`` (``row col acc`` and every value it declares), every
    computation (and so every global load) before any store, so one thread has ``batch``
    independent loads in flight instead of one (the rolled per-element loop waited a full memory
    latency per element: 16-25 µs per 128x128 tile of an SGD update on the H200).

    Elements of one tile are distinct output positions and threads already run them in any order,
    so moving a load of element u' before the store of element u changes nothing the rolled loop
    guarantees. ``None`` when a statement is not a plain declaration or a store (then the caller
    keeps the rolled loop). ``batch_index``: each element has its own ``bat`` too (else the
    elements share the caller's ``bat``: one tile). ``guarded``: element u's stores run only where
    ``tkxE<u>_in`` holds (:func:`_batch_coords` with a guard declares it)."""
    lines = [ln for ln in epilogue("bat", "row", "col", "acc").splitlines() if ln.strip()]
    names = ["row", "col", "acc"] + (["bat"] if batch_index else [])
    comp, stores = [], []
    for ln in lines:
        code, _, note = ln.partition("//")
        code = code.strip()
        if not code:
            continue
        m = _DECL.match(code)
        if m:
            names.append(m.group(1))
            comp.append((code, note.strip()))
        elif _STORE.match(code):
            stores.append((code, note.strip()))
        else:
            return None
    if not stores:
        return None
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True)) + r")\b")
    out_c, out_s = [], []
    for u in range(batch):
        def ren(line: tuple[str, str], u: int = u) -> str:
            text = pattern.sub(lambda mm: f"tkxE{u}_{mm.group(1)}", line[0])
            return f"{text}  // {line[1]}" if u == 0 and line[1] else text  # element 0 keeps the op's comment
        out_c += [ren(x) for x in comp]
        out_s += [f"if (tkxE{u}_in) {ren(x)}" if guarded else ren(x) for x in stores]
    return out_c, out_s


def _epilogue_prefetch(reads: tuple[tuple[str, int], ...], p: GemmProblem, tm: int, tn: int, threads: int,
                       guarded: bool) -> list[str]:
    """L2 prefetches (``WgmmaKnobs.epilogue_prefetch``) of this tile's rows of each ``(pointer, element
    bytes)`` in ``reads`` (element (row, col) at ``pointer + row * N + col``); empty for a guarded tile."""
    if not reads or guarded or p.batch > 1:
        return []
    lines = []
    for ptr, esize in reads:
        span = tn * esize
        per_row = ceil_div(span, 128) + 1  # the row's bytes may start inside a line
        lines += [
            f"for (int q = threadIdx.x; q < {tm * per_row}; q += {threads}) {{  // L2 prefetch: the epilogue "
            f"reads this tile of {ptr}",
            f"    const char* line = reinterpret_cast<const char*>({ptr}) + ((long long)(row0 + q / {per_row}) * N "
            f"+ col0) * {esize} + min((q % {per_row}) * 128, {span - 1});",
            '    asm volatile("prefetch.global.L2 [%0];" :: "l"(line));',
            "}"]
    return ["// the epilogue's reads of this tile into L2 while the k-loop runs (epilogue_prefetch)",
            *lines]


def _cs_swizzle(tn: int, vector: bool = True) -> bool:
    """With the vectorized epilogue (``vector``, ``WgmmaKnobs.epilogue_vector``), a C tile of at least 64
    columns has column bit 2 XORed with bit 5
    (16-byte chunk k at chunk ``k ^ ((k >> 3) & 1)``): the vectorized epilogue's float4 reads of 8-column
    runs (8 threads at 32-byte steps of one row) then hit 32 distinct banks instead of 16; the float2
    accumulator writes and the scalar reads stay conflict-free (a permutation inside 8 columns)."""
    return vector and tn >= 64


def _cs_at(r: str, c: str, ldc: int, swz: bool) -> str:
    """Index of C tile element (r, c) in ``Cs`` (rows of ``ldc`` floats, :func:`_cs_swizzle`)."""
    return f"{r} * {ldc} + (({c}) ^ (((({c}) >> 5) & 1) << 2))" if swz else f"{r} * {ldc} + {c}"


def _cs_of(e: str, tn: int, ldc: int, swz: bool) -> str:
    """``Cs[...]`` of C tile element number ``e`` (row-major, ``tn`` columns)."""
    if not swz:
        return f"Cs[({e} / {tn}) * {ldc} + {e} % {tn}]"
    return f"Cs[{_cs_at(f'({e} / {tn})', f'{e} % {tn}', ldc, True)}]"


@dataclass(frozen=True)
class _VectorTile:
    """A vectorized tile epilogue (``WgmmaKnobs.epilogue_vector``): ``per_pass`` elements per thread and
    pass in runs of ``acc.width``; ``early``: one pass whose point reads are issued before the k-loop."""

    acc: ev.VectorAccesses
    per_pass: int
    early: bool
    tm: int
    tn: int
    threads: int
    ldc: int
    swz: bool

    @property
    def runs(self) -> int:
        return self.per_pass // self.acc.width

    def params(self) -> dict:
        return {"epilogue_vector": self.acc.width, "epilogue_per_pass": self.per_pass,
                "epilogue_passes": self.tm * self.tn // (self.threads * self.per_pass),
                "early_loads": self.early}

    def run_coords(self, start: str) -> list[str]:
        """Run j of this thread's pass (``start``: its first run's number in the tile): its tile row and
        column ``tkxR<j>_r/_c``, matrix coordinates ``tkxR<j>_row/_col`` and linear index ``tkxR<j>_e``."""
        v, per_row = self.acc.width, self.tn // self.acc.width
        lines = []
        for j in range(self.runs):
            x = f"tkxR{j}_"
            lines += [f"const int {x}q = {start} + {j * self.threads};",
                      f"const int {x}r = {x}q / {per_row}, {x}c = ({x}q % {per_row}) * {v};",
                      f"const int {x}row = row0 + {x}r, {x}col = col0 + {x}c;",
                      ev.run_index(self.acc, j, False)]
        return lines

    def early_lines(self) -> list[str]:
        """With ``early``: the alignment test, the run coordinates and the point-read vectors, placed before
        the k-loop. Sound because a point-read buffer is either written by no group of this stage (the
        schedule's hazard rules, :func:`tkx.schedule.check.check_hazards`: its writer ran in an earlier
        stage (RAW), an input overwritten in place is overwritten in a later stage than every other reader
        (WAR), and no arena slot sharing its bytes is live in this stage) or it is this group's own output
        updated in place, whose elements of this tile only this thread writes, after the read."""
        if not self.early:
            return []
        return ["// the epilogue's point reads of this tile, before the k-loop (gemm.WGMMA_EPILOGUE_EARLY_REGS):",
                "// the same elements this thread updates after it; no group of the stage writes them",
                f"const bool tkx_vec = {ev.aligned_test(self.acc)};  // 16-byte aligned: vector epilogue",
                *self.run_coords("threadIdx.x"), *ev.vector_loads(self.acc, self.runs, "tkx_vec")]

    def body(self, epilogue: Epilogue) -> list[str] | None:
        """The vector pass(es) (inside ``if (tkx_vec)``), or ``None`` when the epilogue does not batch."""
        batched = _batched_epilogue(epilogue, self.per_pass)
        if batched is None:
            return None
        v = self.acc.width
        comp, stores = ev.vectorize(self.acc, *batched, self.runs)
        per = []
        for j in range(self.runs):
            x = f"tkxR{j}_"
            for h in range(v // 4):
                at = _cs_at(f"{x}r", f"{x}c + {4 * h}" if h else f"{x}c", self.ldc, self.swz)
                per.append(f"const float4 tkxC{j}_{h} = *reinterpret_cast<const float4*>(&Cs[{at}]);")
            for i in range(v):
                u = j * v + i
                per += [f"const int tkxE{u}_row = {x}row, tkxE{u}_col = {x}col + {i};",
                        f"const float tkxE{u}_acc = tkxC{j}_{i // 4}.{'xyzw'[i % 4]};"]
        if self.early:
            return [*per, *comp, *stores]
        total_runs = self.tm * self.tn // v
        note = (f"{self.per_pass} elements per thread and pass in runs of {v} columns: 16-byte point reads "
                "and stores")
        return [f"#pragma unroll 1  // {note}",
                f"for (int e = threadIdx.x; e < {total_runs}; e += {self.threads * self.runs}) {{",
                indent(block(*self.run_coords("e"), *ev.vector_loads(self.acc, self.runs), *per, *comp, *stores)),
                "}"]


def _vector_tile(epilogue: Epilogue, tm: int, tn: int, threads: int, ldc: int, m_guard: bool, n_guard: bool,
                 allow_early: bool, vector: bool = True) -> _VectorTile | None:
    """The vectorized epilogue of a guard-free tile, or ``None`` (switch off, no point access, a tile
    that does not split into runs)."""
    if not vector or m_guard or n_guard:
        return None
    acc = ev.vector_accesses(epilogue("bat", "row", "col", "acc"))
    if acc is None or tn % acc.width or (tm * tn) % (threads * acc.width):
        return None
    per_thread = tm * tn // threads
    per_pass = ev.elements_per_pass(acc, per_thread, WGMMA_EPILOGUE_VECTOR_REGS)
    if not per_pass:
        return None
    early = (allow_early and per_pass == per_thread and bool(acc.reads)
             and acc.read_registers(per_pass) <= WGMMA_EPILOGUE_EARLY_REGS)
    return _VectorTile(acc, per_pass, early, tm, tn, threads, ldc, _cs_swizzle(tn, vector))


def _wgmma_store_c(base: str, acc_regs: int, wn: int, ldc: int, tm: int, tn: int, threads: int,
                   epilogue: Epilogue, m_guard: bool, n_guard: bool, after: list[str] | None = None,
                   vec: _VectorTile | None = None, *, vector: bool = True) -> str:
    """The wgmma epilogue: each warpgroup's accumulator fragment of m64nN (register j of lane l in
    warp w is row 16 w + l / 4 + 8 ((j / 2) % 2), column 8 (j / 4) + 2 (l % 4) + j % 2) is written
    to an fp32 C tile in shared memory at ``base``, then the block applies the epilogue per element:
    :data:`WGMMA_EPILOGUE_BATCH` elements per thread and pass (halved until the tile holds a whole pass;
    :func:`_batched_epilogue`); a tile crossing the edge of C clamps the coordinates of the elements
    outside (their loads stay inside C) and stores only the elements inside
    (tiles that do not split into whole passes keep one element per iteration). With ``vec`` (:func:`_vector_tile`,
    tiles inside C): the vector passes of :class:`_VectorTile` when every pointer is 16-byte aligned
    (runtime test), the scalar batched passes otherwise."""
    swz = _cs_swizzle(tn, vector)
    head = [
        f"float* Cs = reinterpret_cast<float*>({base});  // the C tile, fp32, rows padded"
        + (", column bit 2 ^= bit 5" if swz else ""),
        "#pragma unroll",
        f"for (int j = 0; j < {acc_regs}; j += 2) {{  // registers j, j + 1: adjacent columns of one row",
        "    const int r = wr * 64 + (warp % 4) * 16 + lane / 4 + 8 * ((j / 2) % 2);",
        f"    const int c = wc * {wn} + 8 * (j / 4) + 2 * (lane % 4);",
        f"    *reinterpret_cast<float2*>(&Cs[{_cs_at('r', 'c', ldc, swz)}]) = make_float2(d[j], d[j + 1]);",
        "}",
        "__syncthreads();",
    ]
    ub = WGMMA_EPILOGUE_BATCH
    while ub > 1 and (tm * tn) % (threads * ub):  # a small tile: fewer per pass, still batched
        ub //= 2
    # A tile that crosses the edge of C (M or N not a multiple of the tile) batches its epilogue too: the
    # elements outside C get clamped coordinates (their loads read an element inside C) and are not stored.
    # The rolled loop (one element per iteration, each waiting a memory latency) made mixed_precision's
    # step 1.9x slower than torch.compile on the H200 (32-row GEMMs on 64-row tiles with an SGD update:
    # 16 serial iterations of ~0.7 µs per work item); it stays for tiles that do not split into passes.
    guarded = m_guard or n_guard
    batched = None if (tm * tn) % (threads * ub) else \
        _batched_epilogue(epilogue, ub, guarded=guarded)
    if batched is not None:
        comp, stores = batched
        coords = _batch_coords(ub, threads, tn,
                               lambda x: f"const float {x}acc = {_cs_of(f'{x}e', tn, ldc, swz)};",
                               m_guard=m_guard, n_guard=n_guard)
        loop = [
            f"#pragma unroll 1  // {ub} elements per thread and pass: their loads in flight together, then the stores",
            f"for (int e = threadIdx.x; e < {tm * tn}; e += {threads * ub}) {{",
            indent(block(*coords, *comp, *stores)),
            "}",
        ]
        vbody = vec.body(epilogue) if vec is not None else None
        if vbody is not None:
            test = [] if vec.early else [f"const bool tkx_vec = {ev.aligned_test(vec.acc)};  // 16-byte aligned "
                                         "pointers: vector epilogue, else the scalar one"]
            loop = [*test, "if (tkx_vec) {  // block-uniform", indent(block(*vbody)),
                    "} else {", indent(block(*loop)), "}"]
    else:
        loop = [
            "#pragma unroll 1  // kept rolled: the epilogue's code appears once",
            f"for (int e = threadIdx.x; e < {tm * tn}; e += {threads}) {{",
            f"    const int row = row0 + e / {tn}, col = col0 + e % {tn};",
            indent(_epilogue_block(epilogue, _cs_of("e", tn, ldc, swz), m_guard, n_guard)),
            "}",
        ]
    return block(*head, *loop, *(after or ()),
                 "__syncthreads();  // Cs is read before the next work item reuses the workspace")

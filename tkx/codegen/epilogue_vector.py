"""16-byte vectors in a batched GEMM epilogue (:func:`tkx.codegen.gemm._batched_epilogue`).

A batched epilogue gives every element ``u`` of a thread's pass its own statements (names prefixed
``tkxE<u>_``); a buffer the epilogue reads at the output element's own linear index ``tkx_e`` (a
*point read*: an SGD update's weight, a ReLU mask) is one scalar 2-byte load per element, and each
output stored at ``tkx_e`` one scalar store. With the elements of a pass taken in **runs** of ``V``
column-adjacent elements (``V`` = 8 when a point access is 2 bytes wide, 4 when all are 4 bytes),
each run's point reads become one 16-byte load per buffer (``uint4`` of 8 bf16/fp16 bits, ``float4``
of 4 fp32; an fp32 buffer of an 8-wide run takes two) and its stores at ``tkx_e`` one 16-byte store
per output. The per-element statements are unchanged (the same arithmetic, the same bits); they read
their point values out of the vectors.

The vectors need 16-byte aligned addresses: every run starts on a multiple of ``V`` of the linear
index (the caller checks the row length), and each pointer's own alignment is a block-uniform
runtime test (:func:`aligned_test`: user tensors may be views at odd offsets) whose false branch is
the scalar code.

Run ``j`` of a pass is described by the caller with C variables ``tkxR<j>_row``, ``tkxR<j>_col``
(and ``tkxR<j>_bat`` with a per-element batch) of its first element, and ``tkxR<j>_e``, its linear
index; element ``u = j * V + i`` is (row, col + i).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Point accesses that go into vectors: tkx_ld_/tkx_st_ suffix -> (bytes per element, C vector type).
_VECTOR_TYPES = {"bf16": (2, "uint4"), "f16": (2, "uint4"), "f32": (4, "float4")}
_PTR = r"((?:[^(),]|\((?:[^()]|\([^()]*\))*\))+)"
_TEMPLATE_LOAD = re.compile(r"tkx_ld_(\w+)\(" + _PTR + r", tkx_e\)")
_TEMPLATE_STORE = re.compile(r"^\s*tkx_st_(\w+)\(" + _PTR + r", tkx_e, .*\);")
_LIN = re.compile(r"^\s*const long long tkx_e = (.+);")
_LANES = "xyzw"


@dataclass(frozen=True)
class VectorAccesses:
    """The point accesses of one epilogue (its statements for output element (bat, row, col)).

    ``reads``/``stores``: ``(C pointer, tkx_ld_/tkx_st_ suffix)`` in first-use order; ``width``: the
    run length V (elements per 16 bytes of the narrowest access); ``lin``: the C expression of
    ``tkx_e`` in the names ``bat row col``."""

    reads: tuple[tuple[str, str], ...]
    stores: tuple[tuple[str, str], ...]
    width: int
    lin: str

    @property
    def pointers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for p, _ in self.reads + self.stores))

    def registers_per_element(self) -> float:
        """32-bit registers one element of a pass holds while its loads are in flight: its fp32
        accumulator plus its share of every point read and of every vector store."""
        return 1 + sum(_VECTOR_TYPES[s][0] for _, s in self.reads + self.stores) / 4

    def read_registers(self, elements: int) -> int:
        """Registers the point-read vectors of ``elements`` elements take (a multiple of V)."""
        return elements * sum(_VECTOR_TYPES[s][0] for _, s in self.reads) // 4


def vector_accesses(template: str) -> VectorAccesses | None:
    """The point reads and stores of ``template`` (an epilogue's statements in the names
    ``bat row col acc``, its first one ``const long long tkx_e = ...;``) that 16-byte vectors can
    carry; ``None`` when there are none or ``tkx_e`` is not declared first."""
    lines = [ln.partition("//")[0] for ln in template.splitlines() if ln.strip()]
    m = _LIN.match(lines[0]) if lines else None
    if m is None:
        return None
    reads: dict[str, str] = {}
    stores: dict[str, str] = {}
    for ln in lines[1:]:
        for suffix, ptr in _TEMPLATE_LOAD.findall(ln):
            if suffix in _VECTOR_TYPES:
                reads.setdefault(ptr.strip(), suffix)
        s = _TEMPLATE_STORE.match(ln)
        if s and s.group(1) in _VECTOR_TYPES:
            stores.setdefault(s.group(2).strip(), s.group(1))
    if not reads and not stores:
        return None
    narrowest = min(_VECTOR_TYPES[s][0] for s in list(reads.values()) + list(stores.values()))
    return VectorAccesses(tuple(reads.items()), tuple(stores.items()), 16 // narrowest, m.group(1).strip())


def elements_per_pass(acc: VectorAccesses, per_thread: int, register_budget: int) -> int:
    """Elements per thread and pass: the largest power-of-two multiple of V dividing ``per_thread``
    whose registers (:meth:`VectorAccesses.registers_per_element`) fit ``register_budget``; 0 when
    not even one run of V fits the thread's share."""
    v = acc.width
    if per_thread % v:
        return 0
    best = v
    n = v
    while per_thread % (2 * n) == 0 and 2 * n * acc.registers_per_element() <= register_budget:
        n *= 2
        best = n
    return best


def aligned_test(acc: VectorAccesses, extra: tuple[str, ...] = ()) -> str:
    """A C expression, true when every pointer of ``acc`` (and of ``extra``) is 16-byte aligned
    (block-uniform)."""
    ors = " | ".join(f"(unsigned long long)({p})" for p in acc.pointers + extra)
    return f"((({ors}) & 15ULL) == 0ULL)"


def run_index(acc: VectorAccesses, j: int, batch_index: bool) -> str:
    """``const long long tkxR<j>_e = ...;``: run j's linear index from its coordinates."""
    names = {"row": f"tkxR{j}_row", "col": f"tkxR{j}_col", "bat": f"tkxR{j}_bat" if batch_index else "bat"}
    lin = re.sub(r"\b(row|col|bat)\b", lambda mm: names[mm.group(1)], acc.lin)
    return f"const long long tkxR{j}_e = {lin};"


def _chunks(suffix: str, v: int) -> int:
    return v * _VECTOR_TYPES[suffix][0] // 16


def vector_loads(acc: VectorAccesses, runs: int, guard: str | None = None) -> list[str]:
    """Run j's point reads as 16-byte loads into ``tkxL<k>_<j>_<h>`` (pointer k of ``acc.reads``, chunk h);
    with ``guard`` (a C condition) the loads happen only where it holds (zeros otherwise)."""
    out = []
    for j in range(runs):
        for k, (ptr, suffix) in enumerate(acc.reads):
            esize, vtype = _VECTOR_TYPES[suffix]
            scalar = "unsigned short" if esize == 2 else "float"
            per = 16 // esize
            for h in range(_chunks(suffix, acc.width)):
                src = f"*reinterpret_cast<const {vtype}*>((const {scalar}*)({ptr}) + tkxR{j}_e + {h * per})"
                if guard:
                    zero = "make_uint4(0u, 0u, 0u, 0u)" if vtype == "uint4" else "make_float4(0.f, 0.f, 0.f, 0.f)"
                    src = f"{guard} ? {src} : {zero}"
                out.append(f"const {vtype} tkxL{k}_{j}_{h} = {src};")
    return out


def _lane(suffix: str, k: int, j: int, i: int) -> str:
    """Element i of run j's vector(s) of read k, as the float ``tkx_ld_<suffix>`` returns."""
    if suffix == "f32":
        return f"tkxL{k}_{j}_{i // 4}.{_LANES[i % 4]}"
    word = f"tkxL{k}_{j}_{i // 8}.{_LANES[(i % 8) // 2]}"
    bits = f"(unsigned short)({word} >> 16)" if i % 2 else f"(unsigned short)({word} & 0xFFFFu)"
    return f"tkx_{'bf16' if suffix == 'bf16' else 'f16'}_to_float({bits})"


def _pack(suffix: str, values: list[str]) -> str:
    if suffix == "f32":
        return f"make_float4({', '.join(values)})"
    cvt = "tkx_float_to_bf16" if suffix == "bf16" else "tkx_float_to_f16"
    words = [f"(unsigned){cvt}({values[2 * w]}) | ((unsigned){cvt}({values[2 * w + 1]}) << 16)" for w in range(4)]
    return f"make_uint4({', '.join(words)})"


def vectorize(acc: VectorAccesses, comp: list[str], stores: list[str], runs: int) -> tuple[list[str], list[str]]:
    """``comp``/``stores`` of a batched epilogue of ``runs * V`` elements (element ``u = j * V + i`` the
    i-th of run j) rewritten: point reads taken from the vectors of :func:`vector_loads`, the stores
    at ``tkx_e`` packed into 16-byte stores at ``tkxR<j>_e`` (other stores kept, after them)."""
    v = acc.width
    read_k = {ptr: k for k, (ptr, _) in enumerate(acc.reads)}
    load_re = re.compile(r"tkx_ld_(\w+)\(" + _PTR + r", tkxE(\d+)_tkx_e\)")

    def feed(mm: re.Match) -> str:
        suffix, ptr, u = mm.group(1), mm.group(2).strip(), int(mm.group(3))
        if suffix not in _VECTOR_TYPES or ptr not in read_k:
            return mm.group(0)
        return _lane(suffix, read_k[ptr], u // v, u % v)

    out_c = [load_re.sub(feed, ln) for ln in comp]
    store_re = re.compile(r"^\s*tkx_st_(\w+)\(" + _PTR + r", tkxE(\d+)_tkx_e, (.*)\);\s*$")
    packed: dict[tuple[str, str, int], list[str | None]] = {}
    notes: dict[tuple[str, str], str] = {}
    rest = []
    for ln in stores:
        code, _, comment = ln.partition("  //")
        mm = store_re.match(code)
        if mm is None or mm.group(1) not in _VECTOR_TYPES or mm.group(2).strip() not in dict(acc.stores):
            rest.append(ln)
            continue
        suffix, ptr, u, value = mm.group(1), mm.group(2).strip(), int(mm.group(3)), mm.group(4)
        slot = packed.setdefault((ptr, suffix, u // v), [None] * v)
        if slot[u % v] is not None:  # the same output twice for one element: keep the scalar order
            return comp, stores
        slot[u % v] = value
        if comment:
            notes.setdefault((ptr, suffix), "// " + comment.strip())
    out_s = []
    for (ptr, suffix, j), values in packed.items():
        if any(x is None for x in values):
            return comp, stores
        esize = _VECTOR_TYPES[suffix][0]
        scalar, vtype, per = ("unsigned short", "uint4", 8) if esize == 2 else ("float", "float4", 4)
        for h in range(_chunks(suffix, v)):
            part = [x for x in values[h * per:(h + 1) * per] if x is not None]
            note = notes.get((ptr, suffix)) if j == 0 and h == 0 else None
            out_s.append(f"*reinterpret_cast<{vtype}*>(({scalar}*)({ptr}) + tkxR{j}_e + {h * per}) = "
                         f"{_pack(suffix, part)};" + (f"  {note} (16-byte vector)" if note else ""))
    return out_c, out_s + rest


def element_coords(prefix: str, e: str, m: int, n: int) -> str:
    """C declaration of ``<prefix>bat``, ``<prefix>row``, ``<prefix>col``: the matrix, row and column of the
    linear output index ``e`` of a ``[batch, m, n]`` result."""
    return (f"const int {prefix}bat = (int)({e} / {m * n}), {prefix}row = (int)(({e} / {n}) % {m}), "
            f"{prefix}col = (int)({e} % {n});")


def split_final_pass(acc: VectorAccesses, comp: list[str], stores: list[str], *, runs: int, threads: int,
                     split: int, scratch: str, total: int, m: int, n: int) -> list[str]:
    """The vector form of split-K's final phase for one work item (``runs * V`` elements per thread,
    item ``item`` covering ``threads * runs * V`` consecutive outputs of the ``total``): each run's
    slices read as float4 (``split`` per 4 elements), added in slice order per element
    (``((0 + s0) + s1) + ...``, the scalar loop's bits), then ``comp``/``stores`` of
    :func:`tkx.codegen.gemm._batched_epilogue` with ``batch_index`` through :func:`vectorize`.
    The caller checks ``n % V == 0`` (a run stays in one row) and the pointers' alignment."""
    v = acc.width
    lines = [f"const long long tkx_e0 = (long long)item * {threads * runs * v} + (long long)threadIdx.x * {v};"]
    for j in range(runs):
        x = f"tkxR{j}_"
        lines += [f"const long long {x}e0 = tkx_e0 + {j * threads * v};", element_coords(x, f"{x}e0", m, n),
                  run_index(acc, j, True)]
        for h in range(v // 4):
            for sl in range(split):
                lines.append(f"const float4 tkxS{j}_{h}_{sl} = *reinterpret_cast<const float4*>({scratch} + "
                             f"{sl * total}LL + {x}e0 + {4 * h});")
    lines += vector_loads(acc, runs)
    for j in range(runs):
        x = f"tkxR{j}_"
        for i in range(v):
            u = j * v + i
            terms = "0.0f"
            for sl in range(split):
                terms = f"({terms} + tkxS{j}_{i // 4}_{sl}.{_LANES[i % 4]})"
            lines += [f"const int tkxE{u}_bat = {x}bat, tkxE{u}_row = {x}row, tkxE{u}_col = {x}col + {i};",
                      f"const float tkxE{u}_acc = {terms};" + ("  // slices in slice order" if u == 0 else "")]
    comp, stores = vectorize(acc, comp, stores, runs)
    return lines + comp + stores

"""The views of :class:`~tkx.codegen.source.CudaSource`: launch summary, NVRTC report, group
index and the highlighted source, one element per line carrying its ops, groups and arena slots."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from .. import display
from ..codegen.source import CudaSource
from .base import attrs, esc
from .stage_common import _kib, _view

#: Highlighting the kernel text takes a fraction of a second for ~1000 lines; an NVRTC check ~1 s
#: per architecture. Reports are cached by (source hash, arch, exact) so a re-display is instant.
_COMPILE_CACHE: dict[tuple[str, str, bool], Any] = {}
#: The keys of :data:`_COMPILE_CACHE` whose report the on-disk compile cache served: NVRTC did not run
#: now, and the report's ``compile_seconds`` is the time of the compile that made the entry.
_FROM_DISK: set[tuple[str, str, bool]] = set()

def highlight_lines(text: str) -> list[str]:
    """The source as HTML, one string per line (one pygments pass, inline styles)."""
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import CudaLexer
    except ImportError:  # pragma: no cover
        return [esc(x) for x in text.split("\n")]
    out = highlight(text, CudaLexer(), HtmlFormatter(noclasses=True, nowrap=True, style="default"))
    lines = out.split("\n")
    n = text.count("\n") + 1
    if len(lines) > n:
        lines = lines[:n]
    lines += [""] * (n - len(lines))
    return lines


#: Source lines the CUDA view renders at once (a huge kernel is shown in pages; see
#: :meth:`tkx.codegen.CudaSource.page`). Above it the view also checks one architecture only.
CUDA_VIEW_LINES = 2000


def compile_reports(c: Any, arches: Sequence[str] = ("sm_90", "sm_80"), *,
                    whole: bool = False) -> tuple[str, list[Any]]:
    """``(note, reports)``: NVRTC reports for ``arches`` (cached by source hash), or a note why not.
    A report that failed is the :class:`~tkx.codegen.nvrtc.CudaCompileError` itself.

    Kernels longer than :data:`CUDA_VIEW_LINES` are checked for the first architecture only, and
    through the on-disk compile cache (:func:`tkx.runtime.kernel.compile_cubin`), so a kernel the
    runtime has compiled, or an earlier render, is never compiled again just to be shown.
    ``whole=True`` (the exported report, the command line) checks every architecture of every kernel."""
    from ..codegen.nvrtc import nvrtc_available

    ok, why = nvrtc_available()
    if not ok:
        return f"no NVRTC check: {why}", []
    exact = bool(getattr(c.options, "exact", False))
    digest = hashlib.sha256(c.text.encode()).hexdigest()
    reports = []
    from ..codegen.nvrtc import remembered_report

    for arch in arches:  # reports CudaSource.check() made already
        known = remembered_report(c.text, arch, exact)
        if known is not None:
            _COMPILE_CACHE.setdefault((digest, arch, exact), known)
    if c.num_lines > CUDA_VIEW_LINES and not whole:
        arch = arches[0]
        key = (digest, arch, exact)
        if key not in _COMPILE_CACHE:
            cached = _disk_cached_report(c, arch, exact)
            if cached is None:  # a long kernel takes a while in NVRTC: never compile just to render
                return (f"not compiled for the view: a kernel of {c.num_lines} lines; cuda.check('{arch}') "
                        f"(or running it) compiles it, and the view then shows the report"), []
            _COMPILE_CACHE[key] = cached
            _FROM_DISK.add(key)
        return f"{why}; {arch}, from the compile cache", [_COMPILE_CACHE[key]]
    for arch in arches:
        key = (digest, arch, exact)
        if key not in _COMPILE_CACHE:
            try:
                if whole:
                    _COMPILE_CACHE[key], hit = _compile_through_disk_cache(c, arch)
                    if hit:
                        _FROM_DISK.add(key)
                else:
                    _COMPILE_CACHE[key] = c.check(arch)
            except Exception as exc:
                _COMPILE_CACHE[key] = exc
        reports.append(_COMPILE_CACHE[key])
    return why, reports


def _compile_through_disk_cache(c: Any, arch: str) -> tuple[Any, bool]:
    """``(report, cache_hit)``: the NVRTC report of ``c`` for ``arch``, compiled once through the on-disk
    compile cache (a long kernel takes NVRTC tens of seconds; the next report or run reuses the entry),
    and whether the entry served it."""
    from ..runtime.kernel import compile_cubin
    binary = compile_cubin(c, arch)
    return binary.report, binary.cache_hit


def compile_time(report: Any) -> str:
    """The "compile" cell of a report: ``"12.34 s"`` for a compile NVRTC ran in this process, or
    ``"cached (12.34 s when compiled)"`` when the on-disk compile cache served the report (the seconds
    are those of the compile that made the entry, not of now)."""
    cached = any(_COMPILE_CACHE.get(k) is report for k in _FROM_DISK)
    seconds = f"{report.compile_seconds:.2f} s"
    return f"cached ({seconds} when compiled)" if cached else seconds


def _disk_cached_report(c: Any, arch: str, exact: bool) -> Any:
    """The NVRTC report of ``c`` for ``arch`` from the on-disk compile cache, or ``None``."""
    try:
        from ..runtime import cache as disk
        from ..runtime.kernel import _report_from_json, nvrtc_cache_key

        key, _ = nvrtc_cache_key(c.text, arch, exact=exact)
        hit = disk.load_entry(key)
        return _report_from_json(hit[1]["report"], hit[0]) if hit is not None else None
    except Exception:  # a damaged entry or no NVRTC: nothing cached to show
        return None


def _report_table(note: str, reports: list[Any]) -> str:
    if not reports:
        return f'<div class="tkx-dim">{esc(note)}</div>'
    rows = ['<tr><th>arch</th><th style="text-align:right">registers</th><th style="text-align:right">spills</th>'
            '<th style="text-align:right">shared</th><th style="text-align:right">stack</th>'
            '<th style="text-align:right">compile</th></tr>']
    errors = []
    for r in reports:
        if isinstance(r, Exception):
            arch = getattr(r, "arch", "?")
            rows.append(f'<tr><td>{esc(arch)}</td><td colspan="5" class="tkx-no">failed to compile</td></tr>')
            errors.append(f"<pre>{esc(r)}</pre>")
            continue
        spill = f'<span class="tkx-no">{r.spill_bytes} B</span>' if r.spill_bytes else "0 B"
        rows.append(f'<tr><td>{esc(r.arch)}</td><td style="text-align:right">{r.registers}</td>'
                    f'<td style="text-align:right">{spill}</td><td style="text-align:right">{r.shared_bytes} B</td>'
                    f'<td style="text-align:right">{r.stack_bytes} B</td><td style="text-align:right">'
                    f'<span class="tkx-volatile">{r.compile_seconds:.2f} s</span></td></tr>')
    return (f'<div class="tkx-sub">NVRTC check <span class="tkx-dim">({esc(note)}; ptxas report, no GPU '
            f'needed)</span></div><table>{"".join(rows)}</table>' + "".join(errors))


@display.register(CudaSource, "html")
def cuda_html(c: Any, check: bool = True, start: int = 1, limit: int | None = None, *, whole: bool = False) -> str:
    """The kernel as HTML: launch summary, NVRTC report, group and module index, highlighted source
    with one element per line carrying its ops and groups; the prelude folded in ``<details>``.

    At most ``limit`` (default :data:`CUDA_VIEW_LINES`) source lines after the prelude are
    rendered, from line ``start``; a longer kernel ends with a "show more" note naming the
    call that renders the next piece (``c.page(n)``), so the view stays small and fast.
    ``whole=True`` (what the exported report uses) renders every line in one scrolled box with a
    line index and jump links to every group and module, and runs the NVRTC check of every
    architecture whatever the kernel's length."""
    if whole:
        start, limit = 1, c.num_lines + 1
    limit = CUDA_VIEW_LINES if limit is None else int(limit)
    all_text = c.text.split("\n")
    n_lines = len(all_text)
    prelude_end = 0
    for i, line in enumerate(all_text, start=1):
        if line.startswith("#define TKX_POINTERS"):
            prelude_end = i - 1
            break
    first = max(int(start), prelude_end + 1)
    last = min(n_lines, first + limit - 1)
    if first == prelude_end + 1 and last == n_lines:
        lines = highlight_lines(c.text)
    else:  # highlight only what is shown: the prelude and this piece
        shown = highlight_lines("\n".join(all_text[:prelude_end])) if prelude_end else []
        lines = shown + [""] * (first - 1 - len(shown)) + highlight_lines("\n".join(all_text[first - 1:last]))
    ops_at: dict[int, list[str]] = {}
    for op, nums in c.op_lines.items():
        for k in nums:
            ops_at.setdefault(k, []).append(op)
    grp_at: dict[int, list[str]] = {}
    first_of: dict[int, str] = {}
    for gid, (a, b) in c.group_lines.items():
        for k in range(a, b + 1):
            grp_at.setdefault(k, []).append(gid)
        first_of.setdefault(a, gid)
    slot_at: dict[int, list[str]] = {}
    for buf, nums in c.arena_lines.items():
        for k in nums:
            slot_at.setdefault(k, []).append(buf)
    vid = "tkx-cu-" + hashlib.sha256(c.text.encode()).hexdigest()[:10]  # anchors unique per kernel on a page
    modules = _module_spans(c)
    mods_at: dict[int, list[str]] = {}
    for m in modules:
        for k in c.module_lines[m]:
            mods_at.setdefault(k, []).append(m)
    index_step = _index_step(last - first + 1)
    targets = ({a for a, _ in c.group_lines.values()} | {a for a, _, _ in modules.values()}
               | set(_index_lines(first, last, index_step)))

    def row(k: int) -> str:
        code = lines[k - 1]
        ids = ([f"op:{o}" for o in sorted(ops_at.get(k, ()))] + [f"grp:{g}" for g in grp_at.get(k, ())]
               + [f"buf:{b}" for b in sorted(slot_at.get(k, ()))] + [f"mod:{m}" for m in mods_at.get(k, ())])
        gut = first_of.get(k)
        gutter = (f'<span class="tkx-gut" {attrs(f"grp:{gut}")}>{esc(gut)}</span>' if gut else
                  f'<span class="tkx-gut">{"│" if k in grp_at else ""}</span>')
        cls = ' class="tkx-opl"' if k in ops_at else ""
        anchor = f' id="{vid}-L{k}"' if k in targets else ""
        return (f'<div{anchor}{cls} {attrs(f"line:{k}", ids)}><span class="tkx-ln">{k}</span>{gutter}'
                f'{code}</div>')

    pre = "".join(row(k) for k in range(1, prelude_end + 1))
    main = "".join(row(k) for k in range(first, last + 1))
    if first > prelude_end + 1 or last < n_lines:
        page = (first - prelude_end - 1) // max(limit, 1) + 1
        pages = -(-(n_lines - prelude_end) // max(limit, 1))
        more = (f"; the next piece: <code>cuda.page({page + 1})</code>" if last < n_lines else "")
        main += (f'<div class="tkx-dim tkx-more">showing lines {first}–{last} of {n_lines} (page {page} of '
                 f'{pages}){more}; every line at once: the Explorer\'s linked views tab, or with a line, group '
                 f'and module index the exported report (<code>tkx.report(...)</code>, <code>tkx report</code>)'
                 f'</div>')
    if check:
        note, reports = compile_reports(c, whole=whole)
        report = _report_table(note, reports)
    else:
        report = ""
    mode = "one block, __syncthreads" if c.mode == "block" else "cooperative grid, grid barriers"
    head = (
        '<table class="tkx-kv">'
        f'<tr><td>kernel</td><td><b>{esc(c.kernel_name)}</b>, {c.num_lines} lines</td></tr>'
        f'<tr><td>launch</td><td>{c.blocks} block{"s" if c.blocks != 1 else ""} × {c.threads} threads '
        f'({esc(mode)})</td></tr>'
        f'<tr><td>memory</td><td>shared {esc(_kib(c.shared_bytes))} per block, arena {esc(_kib(c.arena_bytes))}'
        f'</td></tr>'
        f'<tr><td>GEMMs</td><td>{"tensor cores (WMMA)" if c.tensor_cores else "SIMT / GEMV"}</td></tr></table>')
    sched = c.schedule
    order = [g for st in sched.stages for g in st] if sched is not None else list(c.group_lines)
    chips = []
    for gid in order:
        if gid not in c.group_lines:
            continue
        a, b = c.group_lines[gid]
        g = sched.groups[gid] if sched is not None else None
        label = f"{gid} {g.kind} {g.anchor}" if g is not None else gid
        jump = f' <a class="tkx-jump" href="#{vid}-L{a}">{a}–{b}</a>' if first <= a <= last else \
            f' <span class="tkx-dim">{a}–{b}</span>'
        chips.append(f'<span class="tkx-chip" {attrs(f"grp:{gid}")}>{esc(label)}</span>{jump}')
    index = ('<div class="tkx-sub">Groups → lines <span class="tkx-dim">(click a group to highlight it, its '
             'line numbers to jump there)</span></div>'
             f'<div style="white-space:normal">{" &nbsp; ".join(chips)}</div>') if chips else ""
    index += _module_index(modules, vid, first, last)
    index += _line_index(vid, first, last, index_step)
    prelude = (f'<details><summary>prelude: lines 1–{prelude_end} (types, math helpers, barrier; same for every '
               f'kernel)</summary><div class="tkx-src">{pre}</div></details>') if prelude_end else ""
    src = (f'<div class="tkx-sub">Source <span class="tkx-dim">(grey background: a line that computes or stores '
           f'an IR op; left gutter: the schedule group)</span></div>{prelude}'
           f'<div class="tkx-src tkx-scroll">{main}</div>')
    plain = repr(c)
    return _view("cuda", f"CudaSource {c.kernel_name}", head + report + index + src, plain)




def _module_spans(c: Any) -> dict[str, tuple[int, int, int]]:
    """``nn.Module`` path -> (first line, last line, lines) of the kernel lines computing its ops, in
    order of the first line (:attr:`CudaSource.module_lines`)."""
    try:
        spans = {m: (v[0], v[-1], len(v)) for m, v in c.module_lines.items() if v}
    except Exception:  # a source without a program (hand-built in a test): no modules
        return {}
    return dict(sorted(spans.items(), key=lambda kv: kv[1][0]))


def _module_index(modules: dict[str, tuple[int, int, int]], vid: str, first: int, last: int) -> str:
    if not modules:
        return ""
    chips = []
    for m, (a, b, n) in modules.items():
        where = (f'<a class="tkx-jump" href="#{vid}-L{a}">{a}–{b}</a>' if first <= a <= last
                 else f'<span class="tkx-dim">{a}–{b}</span>')
        chips.append(f'<span class="tkx-chip" {attrs(f"mod:{m}")}>{esc(m or "(root module)")}</span> {where} '
                     f'<span class="tkx-dim">({n} lines)</span>')
    return ('<div class="tkx-sub">Modules → lines <span class="tkx-dim">(the nn.Module each op came from; click a '
            'module to highlight its lines, its line numbers to jump to the first)</span></div>'
            f'<div style="white-space:normal">{" &nbsp; ".join(chips)}</div>')


def _index_step(n: int) -> int:
    """Spacing of the line index: about 20 entries, on round numbers."""
    for step in (50, 100, 200, 250, 500, 1000, 2000, 5000, 10000):
        if n <= 20 * step:
            return step
    return -(-n // 20)


def _index_lines(first: int, last: int, step: int) -> list[int]:
    """The lines the index links to: the first shown, then every multiple of ``step``."""
    return [first] + list(range((first // step + 1) * step, last + 1, step))


def _line_index(vid: str, first: int, last: int, step: int) -> str:
    if last - first < 2 * step:
        return ""
    links = " ".join(f'<a class="tkx-jump" href="#{vid}-L{k}">{k}</a>' for k in _index_lines(first, last, step))
    return f'<div class="tkx-sub">Line index <span class="tkx-dim">(jump to a line)</span></div><div>{links}</div>'


def compile_table(c: Any, arches: Sequence[str] = ("sm_80", "sm_90")) -> Any:
    """The NVRTC compile report of ``c`` for every architecture as a ``rich`` table (registers, spills,
    shared memory, stack per architecture; a failed compile is a row saying so), or a one-line
    ``rich`` text saying why there is none (no NVRTC on the machine)."""
    from rich.table import Table
    from rich.text import Text

    note, reports = compile_reports(c, arches, whole=True)
    if not reports:
        return Text(f"NVRTC compile table: {note}", style="yellow")
    t = Table(title=f"NVRTC compile report of {c.kernel_name} ({c.num_lines} lines; ptxas, no GPU needed)",
              title_justify="left")
    for col in ("arch", "registers", "spills", "shared", "stack", "compile"):
        t.add_column(col, justify="left" if col == "arch" else "right")
    for r in reports:
        if isinstance(r, Exception):
            t.add_row(str(getattr(r, "arch", "?")), Text("failed to compile", style="red"), "", "", "", "")
            continue
        spills = Text(f"{r.spill_bytes} B", style="red" if r.spill_bytes else "")
        t.add_row(r.arch, str(r.registers), spills, f"{r.shared_bytes} B", f"{r.stack_bytes} B",
                  compile_time(r))
    return t


@display.register(CudaSource, "rich")
def cuda_rich(c: CudaSource) -> Any:
    from rich.syntax import Syntax
    return Syntax(c.text, "cuda", line_numbers=True, word_wrap=False)

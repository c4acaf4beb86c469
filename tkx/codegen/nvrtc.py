"""Compile CUDA C++ to a cubin with NVIDIA's NVRTC and read ptxas's resource report.

NVRTC is a library, not a tool chain: it runs on machines without a GPU or a driver, in a
fraction of a second for a small kernel, which is why tkx uses it instead of a torch C++
extension build. CI compiles every generated kernel for ``sm_80`` and ``sm_90`` and checks
registers and spills through :class:`CompileReport`.

Two back ends, same flags and same report:

* ``"core"``: NVIDIA's ``cuda.core`` :class:`~cuda.core.Program` (preferred);
* ``"bindings"``: the raw ``cuda.bindings.nvrtc`` calls, used when ``cuda.core`` is missing.

Headers: a kernel that includes ``cuda_bf16.h``, ``cuda_fp16.h`` or ``mma.h`` needs the CUDA
runtime headers. :func:`include_dirs` finds them in the pip wheels ``nvidia-cuda-runtime``
(``cuda_bf16.h``, ``cuda_fp16.h``, ``mma.h``) plus ``nvidia-cuda-crt`` (``crt/mma.h``), in
``$CUDA_HOME``/``$CUDA_PATH`` or in ``/usr/local/cuda*/include``, preferring the folder whose
``CUDART_VERSION`` equals the loaded NVRTC's version (:func:`header_set` says which was taken
and whether it matches; a compile error names NVRTC's version, the header folder and its
version, and quotes the line of the file, kernel or header, that the error is in). NVRTC
supplies ``<nv/target>`` itself, so the CCCL headers are not needed. tkx's own prelude needs
no header at all.
"""

from __future__ import annotations

import functools
import glob
import io
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import TkxError

#: The architectures CI compiles every kernel for.
ARCHES = ("sm_80", "sm_90")

#: Pip packages that provide the headers :func:`include_dirs` looks for.
HEADER_PACKAGES = ("nvidia-cuda-runtime", "nvidia-cuda-crt")

#: The file name NVRTC reports errors against.
SOURCE_NAME = "tkx_kernel.cu"


class CudaCompileError(TkxError):
    """NVRTC rejected a kernel. ``log`` is NVRTC's full log; the message quotes the source lines."""

    def __init__(self, message: str, *, log: str = "", arch: str = "", options: tuple[str, ...] = ()) -> None:
        self.log = log
        self.arch = arch
        self.options = options
        super().__init__(message)


class NvrtcUnavailableError(TkxError):
    """Neither ``cuda.core`` nor ``cuda.bindings`` could load NVRTC on this machine."""


# --------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelResources:
    """What ptxas reported for one ``__global__`` function.

    ``shared_bytes`` counts static shared memory only (``extern __shared__`` is sized at launch);
    ``stack_bytes`` is the per-thread stack frame (local memory); ``cmem_bytes`` the constant
    bank 0 (kernel parameters); ``barriers`` the named barriers used.
    """

    name: str
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    cmem_bytes: int = 0
    barriers: int = 0

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


@dataclass(frozen=True)
class CompileReport:
    """The result of one NVRTC compile: the cubin and ptxas's resource report.

    The scalar fields describe the kernel (the largest over the entry functions if the source
    holds several; :attr:`kernels` has each). ``cubin`` and ``log`` are left out of ``repr``.
    """

    arch: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    shared_bytes: int
    stack_bytes: int
    cmem_bytes: int
    compile_seconds: float
    kernels: tuple[KernelResources, ...] = ()
    options: tuple[str, ...] = field(default=(), repr=False)
    backend: str = "core"
    log: str = field(default="", repr=False)
    cubin: bytes = field(default=b"", repr=False)

    @property
    def spill_bytes(self) -> int:
        """Spill stores plus spill loads (0 for a healthy kernel)."""
        return self.spill_store_bytes + self.spill_load_bytes

    def kernel(self, name: str) -> KernelResources:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    def summary(self) -> str:
        """One line: ``sm_90: 64 regs, 0 B spills, 16384 B smem, 0 B stack, 0.12 s``."""
        return (f"{self.arch}: {self.registers} regs, {self.spill_bytes} B spills, "
                f"{self.shared_bytes} B smem, {self.stack_bytes} B stack, {self.compile_seconds:.2f} s")


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_FIELDS = {
    "barriers": re.compile(r"used (\d+) barriers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "cmem_bytes": re.compile(r"(\d+) bytes cmem\[0\]"),
    "stack_bytes": re.compile(r"(\d+) bytes lmem"),
}


def parse_ptxas_log(log: str) -> tuple[KernelResources, ...]:
    """Read ptxas's ``-v`` report (as NVRTC puts it in the program log), one entry per kernel.

    ptxas prints, per entry function, a ``Compiling entry function`` line, a ``Function
    properties`` block (stack frame and spills) and a ``Used N registers, ... smem, ... cmem``
    line. Only entry functions are returned; the spills of non-inlined device functions count
    as their callers' (every entry takes the largest).
    """
    entries: dict[str, dict[str, int]] = {}
    props: dict[str, dict[str, int]] = {}
    current_entry: str | None = None
    current_props: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current_entry = m.group(1)
            entries.setdefault(current_entry, {})
            continue
        if m := _PROPS.search(line):
            current_props = m.group(1)
            continue
        if (m := _FRAME.search(line)) and current_props is not None:
            props[current_props] = {"stack_bytes": int(m.group(1)), "spill_store_bytes": int(m.group(2)),
                                    "spill_load_bytes": int(m.group(3))}
            continue
        if (m := _USED.search(line)) and current_entry is not None:
            info = entries[current_entry]
            info["registers"] = int(m.group(1))
            for key, rx in _FIELDS.items():
                if fm := rx.search(line):
                    info[key] = int(fm.group(1))
    # A non-inlined device function's spills happen inside the kernel that calls it: each entry reports the
    # most any of them spills (its stack frame is the ABI's call frame, not counted).
    called = [p for name, p in props.items() if name not in entries]
    out = []
    for name, info in entries.items():
        merged = {**info}
        for key, value in props.get(name, {}).items():
            merged[key] = max(value, merged.get(key, 0))
        for key in ("spill_store_bytes", "spill_load_bytes"):
            merged[key] = max([merged.get(key, 0)] + [p[key] for p in called])
        out.append(KernelResources(name=name, **merged))
    return tuple(out)


# --------------------------------------------------------------------------------------
# Finding NVRTC and the headers
# --------------------------------------------------------------------------------------
def _has_headers(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "cuda_bf16.h"))


def _has_mma(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "crt", "mma.h"))


def _header_candidates() -> list[str]:
    found: list[str] = []
    try:  # NVIDIA's own finder: pip wheels, conda, CUDA_HOME, system installs
        from cuda.pathfinder import locate_nvidia_header_directory

        located = locate_nvidia_header_directory("cudart")
        if located is not None and located.abs_path:
            found.append(located.abs_path)
    except Exception:  # pragma: no cover - depends on the installed cuda-pathfinder
        pass
    import site
    import sys

    roots = [p for p in sys.path if p.endswith("site-packages")]
    try:
        roots += site.getsitepackages()
    except AttributeError:  # pragma: no cover - virtualenv without site.getsitepackages
        pass
    for root in dict.fromkeys(roots):
        found += sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "include")), reverse=True)
        found += [os.path.join(root, "nvidia", sub, "include") for sub in ("cuda_runtime", "cuda_nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            found.append(os.path.join(os.environ[var], "include"))
    found.append("/usr/local/cuda/include")
    found += sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)
    return [f for f in dict.fromkeys(found) if os.path.isdir(f)]


_VERSION_RX = re.compile(r"#define\s+CUDART_VERSION\s+(\d+)")


def header_version(folder: str) -> tuple[int, int] | None:
    """The CUDA version of a header folder, from ``CUDART_VERSION`` in ``cuda_runtime_api.h``
    (``13000`` -> ``(13, 0)``); ``None`` when the folder does not say."""
    for name in ("cuda_runtime_api.h", "cuda.h"):
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                text = f.read(200_000)
        except OSError:
            continue
        m = _VERSION_RX.search(text) or re.search(r"#define\s+CUDA_VERSION\s+(\d+)", text)
        if m:
            v = int(m.group(1))
            return v // 1000, (v % 1000) // 10
    return None


@dataclass(frozen=True)
class HeaderSet:
    """The CUDA headers NVRTC compiles with: ``folders`` (``-I``), their CUDA ``version``,
    the loaded ``nvrtc`` version and whether the two agree; :meth:`describe` says it in words."""

    folders: tuple[str, ...]
    version: tuple[int, int] | None
    nvrtc: tuple[int, int] | None
    candidates: tuple[tuple[str, tuple[int, int] | None], ...] = ()

    @property
    def matches(self) -> bool:
        return self.version is not None and self.version == self.nvrtc

    def describe(self) -> str:
        nv = "NVRTC ?" if self.nvrtc is None else f"NVRTC {self.nvrtc[0]}.{self.nvrtc[1]}"
        if not self.folders:
            return f"{nv}, no CUDA headers found ({headers_hint()})"
        ver = "version unknown" if self.version is None else f"CUDA {self.version[0]}.{self.version[1]}"
        text = f"{nv}, headers {', '.join(self.folders)} ({ver})"
        if self.nvrtc is not None and self.version is not None and self.version != self.nvrtc:
            text += (f": they do not match NVRTC; install headers of the same version "
                     f"(pip install 'nvidia-cuda-runtime=={self.nvrtc[0]}.{self.nvrtc[1]}.*' "
                     f"'nvidia-cuda-crt=={self.nvrtc[0]}.{self.nvrtc[1]}.*', or point CUDA_HOME at that toolkit)")
        return text


def _nvrtc_or_none() -> tuple[int, int] | None:
    try:
        return nvrtc_version()
    except NvrtcUnavailableError:
        return None


def choose_headers(candidates: list[tuple[str, tuple[int, int] | None]],
                   nvrtc: tuple[int, int] | None) -> tuple[str, tuple[int, int] | None] | None:
    """The header folder to use among ``(folder, version)`` candidates (each holding
    ``cuda_bf16.h``): the one whose version equals NVRTC's, else the newest of NVRTC's major
    version not newer than NVRTC, else the newest of NVRTC's major, else the first."""
    if not candidates:
        return None
    if nvrtc is not None:
        exact = [c for c in candidates if c[1] == nvrtc]
        if exact:
            return exact[0]
        same = [c for c in candidates if c[1] is not None and c[1][0] == nvrtc[0]]
        older = [c for c in same if c[1] <= nvrtc]
        if older:
            return max(older, key=lambda c: c[1])
        if same:
            return min(same, key=lambda c: c[1])
    return candidates[0]


@functools.lru_cache(maxsize=1)
def header_set() -> HeaderSet:
    """The :class:`HeaderSet` tkx compiles with (found once per process)."""
    found = _header_candidates()
    with_headers = [(c, header_version(c)) for c in found if _has_headers(c)]
    nv = _nvrtc_or_none()
    chosen = choose_headers(with_headers, nv)
    if chosen is None:
        return HeaderSet((), None, nv, tuple(with_headers))
    main, version = chosen
    if _has_mma(main):
        folders = (main,)
    else:
        crt = [c for c in found if _has_mma(c)]
        same = [c for c in crt if header_version(c) in (version, None)]
        folders = (main, (same or crt)[0]) if crt else (main,)
    return HeaderSet(folders, version, nv, tuple(with_headers))


def include_dirs() -> tuple[str, ...]:
    """Folders to pass as ``-I`` so that ``cuda_bf16.h``, ``cuda_fp16.h`` and ``mma.h`` resolve:
    those of :func:`header_set` (the headers matching the loaded NVRTC where installed).

    Returns ``()`` when no CUDA headers are installed (header-free kernels still compile).
    """
    return header_set().folders


#: The headers whose contents key the compile cache (what generated kernels include).
FINGERPRINT_HEADERS = ("cuda_bf16.h", "cuda_bf16.hpp", "cuda_fp16.h", "cuda_fp16.hpp", "mma.h",
                       "crt/mma.h", "crt/mma.hpp", "cuda_runtime_api.h")


@functools.lru_cache(maxsize=8)
def _fingerprint(folders: tuple[str, ...], stamp: tuple) -> str:
    import hashlib
    h = hashlib.sha256()
    for name in FINGERPRINT_HEADERS:
        for folder in folders:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                h.update(name.encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read())
                break
    return h.hexdigest()[:16]


def headers_fingerprint(folders: tuple[str, ...] | None = None) -> str:
    """A hash of the contents of the CUDA headers generated kernels include (not their
    path): replaced headers change it, the same headers in another folder keep it."""
    folders = include_dirs() if folders is None else tuple(folders)
    stamp = []
    for name in FINGERPRINT_HEADERS:
        for folder in folders:
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            stamp.append((folder, name, st.st_mtime_ns, st.st_size))
            break
    return _fingerprint(folders, tuple(stamp))


def headers_hint() -> str:
    """What to install when the CUDA headers are missing."""
    return (f"install the pip packages {' and '.join(HEADER_PACKAGES)} (or a CUDA toolkit and set CUDA_HOME) "
            "so that cuda_bf16.h and mma.h can be found")


def _backend(requested: str) -> str:
    if requested not in ("auto", "core", "bindings"):
        raise ValueError(f"unknown NVRTC backend {requested!r}")
    if requested in ("auto", "core"):
        try:
            import cuda.core  # noqa: F401

            return "core"
        except ImportError:
            if requested == "core":
                raise NvrtcUnavailableError("cuda.core is not installed (pip install cuda-core)") from None
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError as exc:
        raise NvrtcUnavailableError(
            "NVRTC is not available: pip install cuda-core cuda-bindings nvidia-cuda-nvrtc") from exc
    return "bindings"


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor) version; raises :class:`NvrtcUnavailableError` if it cannot load."""
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:
        raise NvrtcUnavailableError(f"NVRTC could not be loaded: {exc}") from exc
    if int(err) != 0:
        raise NvrtcUnavailableError(f"nvrtcVersion failed: {err}")
    return int(major), int(minor)


class NvrtcStatus(NamedTuple):
    """Whether NVRTC can compile here: unpacks as ``ok, detail`` and is truthy only when ``ok``,
    so both ``ok, why = nvrtc_available()`` and ``if nvrtc_available():`` read right."""

    ok: bool
    detail: str  #: ``"NVRTC 13.0"`` when available, else why not

    def __bool__(self) -> bool:
        return self.ok


def nvrtc_available() -> NvrtcStatus:
    """``NvrtcStatus(True, "NVRTC 13.0")`` or ``NvrtcStatus(False, why not)``; never raises."""
    try:
        major, minor = nvrtc_version()
        _backend("auto")
    except NvrtcUnavailableError as exc:
        return NvrtcStatus(False, str(exc))
    return NvrtcStatus(True, f"NVRTC {major}.{minor}")


# --------------------------------------------------------------------------------------
# Compiling
# --------------------------------------------------------------------------------------
def nvrtc_flags(arch: str, *, exact: bool = False, includes: tuple[str, ...] = (),
                max_registers: int | None = None, lineinfo: bool = False) -> tuple[str, ...]:
    """The NVRTC command line tkx uses (NVRTC optimises by default and rejects ``-O3``)."""
    flags = [f"--gpu-architecture={arch}", "--std=c++17", "-default-device", "--ptxas-options=-v"]
    if exact:
        flags.append("--fmad=false")  # no a*b+c contraction: every operation rounds like eager
    if max_registers:
        flags.append(f"--maxrregcount={max_registers}")
    if lineinfo:
        flags.append("-lineinfo")
    flags += [f"-I{d}" for d in includes]
    return tuple(flags)


def _compile_core(source: str, name: str, arch: str, exact: bool, includes: tuple[str, ...],
                  max_registers: int | None, lineinfo: bool) -> tuple[bytes, str, tuple[str, ...]]:
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(
        name=name, arch=arch, std="c++17", device_as_default_execution_space=True,
        ptxas_options=["-v"], fma=False if exact else None, include_path=list(includes) or None,
        max_register_count=max_registers, lineinfo=lineinfo or None)
    flags = tuple(b.decode() for b in options.as_bytes("nvrtc"))
    log = io.StringIO()
    try:
        program = Program(source, "c++", options=options)
        code = program.compile("cubin", logs=log)
    except Exception as exc:
        text = str(exc)
        if "compilation log:" in text:
            text = text.split("compilation log:", 1)[1]
        raise _Failure(text.strip("\n\x00 "), flags) from exc
    return bytes(code.code), log.getvalue().strip("\x00"), flags


def _compile_bindings(source: str, name: str, arch: str, exact: bool, includes: tuple[str, ...],
                      max_registers: int | None, lineinfo: bool,
                      ptx: bool = False) -> tuple[bytes, str, tuple[str, ...]]:
    """(cubin, log, flags) through the NVRTC bindings; ``ptx``: NVVM's PTX instead of the cubin (without
    ptxas's flags)."""
    from cuda.bindings import nvrtc

    flags = nvrtc_flags(arch, exact=exact, includes=includes, max_registers=max_registers, lineinfo=lineinfo)
    if ptx:
        flags = tuple(f for f in flags if not f.startswith("--ptxas"))

    def check(result: tuple, what: str) -> tuple:
        if int(result[0]) != 0:
            raise _Failure(f"{what} failed: {result[0]}", flags)
        return result[1:]

    (prog,) = check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        err = nvrtc.nvrtcCompileProgram(prog, len(flags), [f.encode() for f in flags])[0]
        (size,) = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.decode(errors="replace").strip("\x00")
        if int(err) != 0:
            raise _Failure(log, flags)
        if ptx:
            (size,) = check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            cubin = b" " * size
            check(nvrtc.nvrtcGetPTX(prog, cubin), "nvrtcGetPTX")
        else:
            (size,) = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            cubin = b" " * size
            check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return cubin, log, flags


class _Failure(Exception):
    def __init__(self, log: str, flags: tuple[str, ...]) -> None:
        self.log = log
        self.flags = flags
        super().__init__(log)


_LOCATION = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?P<kind>error|catastrophic error|warning)")


def _file_lines(file: str, source_lines: list[str], name: str, includes: tuple[str, ...]) -> list[str] | None:
    """The lines of the file an NVRTC error names: the kernel's own source for ``name``, a
    header read from disk (as given, or relative to an include folder), ``None`` if unknown."""
    if os.path.basename(file) == os.path.basename(name) and not os.path.isabs(file):
        return source_lines
    for path in [file] + [os.path.join(d, file) for d in includes]:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read().splitlines()
    return None


def quote_errors(log: str, source: str, *, context: int = 1, limit: int = 8, name: str = SOURCE_NAME,
                 includes: tuple[str, ...] = ()) -> str:
    """The error lines of an NVRTC log, each followed by the lines of the file it points at:
    the kernel's source for errors in ``name``, the header itself for errors in a header."""
    source_lines = source.splitlines()
    out: list[str] = []
    shown = 0
    for entry in log.splitlines():
        m = _LOCATION.match(entry)
        if not m or "error" not in m.group("kind"):
            continue
        out.append(entry)
        lineno = int(m.group("line"))
        lines = _file_lines(m.group("file"), source_lines, name, includes)
        if lines is None:
            out.append(f"  (could not open {m.group('file')} to quote line {lineno})")
            continue
        for i in range(max(1, lineno - context), min(len(lines), lineno + context) + 1):
            mark = ">" if i == lineno else " "
            out.append(f"  {mark}{i:5d} | {lines[i - 1]}")
        shown += 1
        if shown >= limit:
            out.append("  ... (more errors in the full log)")
            break
    return "\n".join(out)


#: The oldest architecture tkx's kernels are written for (cp.async, bf16 arithmetic).
OLDEST_ARCH = 80
_ARCH = re.compile(r"^sm_(\d{2,3})([af]?)$")


def supported_archs() -> tuple[int, ...]:
    """The compute capabilities this NVRTC compiles for (``nvrtcGetSupportedArchs``: 75, 80, ... ); empty
    when the bindings cannot say."""
    try:
        from cuda.bindings import nvrtc

        err, archs = nvrtc.nvrtcGetSupportedArchs()
        return tuple(int(a) for a in archs) if int(err) == 0 else ()
    except Exception:
        return ()


def check_arch(arch: str) -> None:
    """Raise :class:`CudaCompileError` when ``arch`` is not ``sm_NN`` (``a``/``f`` suffix allowed) for a
    GPU of compute capability 8.0 or newer that this NVRTC supports."""
    m = _ARCH.match(arch) if isinstance(arch, str) else None
    supported = supported_archs()
    listing = ", ".join(f"sm_{a}" for a in supported if a >= OLDEST_ARCH) or "sm_80, sm_90, sm_90a, ..."
    if m is None:
        raise CudaCompileError(f"{arch!r} is not a GPU architecture: write it as sm_NN (e.g. sm_80, sm_90, "
                               f"sm_90a for Hopper's wgmma); this NVRTC compiles for {listing}", arch=str(arch))
    number = int(m.group(1))
    if number < OLDEST_ARCH:
        raise CudaCompileError(f"{arch}: tkx's kernels need compute capability 8.0 or newer (cp.async, bf16); "
                               f"pick one of {listing}", arch=arch)
    if supported and number not in supported:
        raise CudaCompileError(f"{arch}: this NVRTC ({'.'.join(map(str, nvrtc_version()))}) does not compile for "
                               f"it; it compiles for {listing}", arch=arch)


def _compile_error(failure: _Failure, source: str, name: str, arch: str,
                   includes: tuple[str, ...]) -> CudaCompileError:
    """The :class:`CudaCompileError` of a failed compile: its log with the offending source lines quoted."""
    quoted = quote_errors(failure.log, source, name=name, includes=includes)
    message = (f"NVRTC could not compile the kernel for {arch} ({header_set().describe()}):\n"
               f"{quoted or failure.log}")
    if "could not open source file" in failure.log:
        message += f"\nhint: {headers_hint()}"
    return CudaCompileError(message, log=failure.log, arch=arch, options=failure.flags)


def compile_cuda(source: str, arch: str = "sm_90", *, exact: bool = False, name: str = SOURCE_NAME,
                 max_registers: int | None = None, lineinfo: bool = False,
                 backend: str = "auto") -> CompileReport:
    """Compile ``source`` for ``arch`` (``"sm_80"``, ``"sm_90"``, ...) to a cubin.

    ``exact`` passes ``--fmad=false`` (no multiply-add contraction). The CUDA header folders
    from :func:`include_dirs` are always on the include path. Raises
    :class:`CudaCompileError` for an ``arch`` tkx or this NVRTC cannot target (:func:`check_arch`), and
    with the log and the offending source lines quoted on failure,
    :class:`NvrtcUnavailableError` when NVRTC cannot be loaded.
    """
    check_arch(arch)
    chosen = _backend(backend)
    includes = include_dirs()
    run = _compile_core if chosen == "core" else _compile_bindings
    start = time.perf_counter()
    try:
        cubin, log, flags = run(source, name, arch, exact, includes, max_registers, lineinfo)
    except _Failure as failure:
        raise _compile_error(failure, source, name, arch, includes) from None
    kernels = parse_ptxas_log(log)
    if not kernels and "__global__" in source:
        # A repeated compile of the same program can be answered from a cache whose log has no
        # ptxas report (seen on the H200 machine with cuda-core 1.2.0 and NVRTC 13: 0.05 s, no
        # "Used N registers" line; compiling again through the NVRTC bindings got the same answer,
        # and so did a text that differed only by a comment: the cache sits below cuda-core and
        # may key on the generated code). The report is what tkx's disk cache, the views and the
        # spill checks read, so the program is compiled once more through the bindings with a
        # 4-byte __device__ variable of a unique name, which makes its PTX new as well; the kernel
        # itself is the same (the variable is never read).
        nonce = f"{os.getpid()}_{time.perf_counter_ns()}"
        fresh = f"{source}\n__device__ int tkx_report_nonce_{nonce};  // tkx: compiled again for its ptxas report\n"
        try:
            cubin, log, flags = _compile_bindings(fresh, name, arch, exact, includes, max_registers, lineinfo)
            kernels, chosen = parse_ptxas_log(log), "bindings"
        except (_Failure, ImportError):
            pass
    seconds = time.perf_counter() - start

    def biggest(attr: str) -> int:
        return max((getattr(k, attr) for k in kernels), default=0)

    return CompileReport(
        arch=arch, registers=biggest("registers"), spill_store_bytes=biggest("spill_store_bytes"),
        spill_load_bytes=biggest("spill_load_bytes"), shared_bytes=biggest("shared_bytes"),
        stack_bytes=biggest("stack_bytes"), cmem_bytes=biggest("cmem_bytes"), compile_seconds=seconds,
        kernels=kernels, options=flags, backend=chosen, log=log, cubin=cubin)


#: NVRTC reports already made in this process, by (source hash, arch, exact): the CUDA view shows
#: them instead of compiling again (see :func:`remember_report`).
_REPORTS: dict[tuple[str, str, bool], Any] = {}


def remember_report(text: str, arch: str, exact: bool, report: Any) -> None:
    """Keep the report of a compile (:meth:`tkx.codegen.CudaSource.check` calls it)."""
    import hashlib
    _REPORTS[(hashlib.sha256(text.encode()).hexdigest(), arch, bool(exact))] = report


def remembered_report(text: str, arch: str, exact: bool) -> Any:
    """The report :func:`remember_report` kept for this source, or ``None``."""
    import hashlib
    return _REPORTS.get((hashlib.sha256(text.encode()).hexdigest(), arch, bool(exact)))


def compile_ptx(source: str, arch: str = "sm_90", *, exact: bool = False, name: str = SOURCE_NAME) -> str:
    """The PTX NVRTC makes of ``source`` for ``arch`` (NVVM's output, before ptxas): what to read for the
    instructions a load became (``ld.global.nc`` for a read-only input, say). Same flags as
    :func:`compile_cuda` less ptxas's; raises :class:`CudaCompileError` with the log on failure,
    :class:`NvrtcUnavailableError` when NVRTC cannot be loaded."""
    check_arch(arch)
    includes = include_dirs()
    try:
        ptx, _, _ = _compile_bindings(source, name, arch, exact, includes, None, False, ptx=True)
    except ImportError:
        raise NvrtcUnavailableError("cuda.bindings is not installed (pip install cuda-bindings)") from None
    except _Failure as failure:
        raise _compile_error(failure, source, name, arch, includes) from None
    return ptx.decode(errors="replace").rstrip("\x00")

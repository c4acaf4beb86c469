"""The on-disk cache of compiled kernels, keyed by content.

A cubin is stored under :func:`cache_dir` as two files named by the SHA-256 :func:`cache_key`
of everything that decides its bytes (source text, architecture, compile flags, the tkx and
NVRTC versions, the back end, and a hash of the *contents* of the CUDA headers kernels include,
not the folder they are in):

* ``<dir>/nvrtc/<key>.cubin`` - the binary;
* ``<dir>/nvrtc/<key>.json``  - ptxas's report, the cold compile seconds and the cubin's SHA-256.

Both are written to a temporary file in the same folder and moved into place with
:func:`os.replace` (atomic on POSIX), the JSON last: a reader sees either a complete entry or
none, and two processes (two notebooks) compiling the same kernel at once both succeed.
An entry whose cubin does not match the recorded hash, or whose report fields are not what they
should be (counts, seconds, the architecture), is ignored and recompiled.

Location: ``$TKX_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/tkx``, else ``~/.cache/tkx``.
Failing to write the cache (read-only home, full disk) is not an error: the kernel is used
uncached and a warning is issued.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Bumped when the layout of a cache entry changes (old entries are then never read).
CACHE_FORMAT = 1


def cache_dir() -> Path:
    """The folder tkx caches compiled kernels in (not created by this call)."""
    explicit = os.environ.get("TKX_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tkx"


def cache_key(source: str, arch: str, flags: Sequence[str], *, tkx_version: str, compiler_version: str,
              backend: str = "nvrtc") -> str:
    """SHA-256 (hex, 64 characters) of everything that determines a compiled binary.

    ``flags`` are the compiler's command-line flags (their order matters), ``compiler_version``
    e.g. ``"nvrtc 13.0"``. Any change to any argument gives a different key.
    """
    payload = json.dumps({
        "format": CACHE_FORMAT, "backend": backend, "arch": arch, "flags": list(flags),
        "tkx": tkx_version, "compiler": compiler_version, "source": source,
    }, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, then
    :func:`os.replace`. Concurrent writers of the same path leave one complete file; the
    folder is created if needed. Raises :class:`OSError` if the folder is not writable."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _entry_paths(key: str, kind: str = "nvrtc") -> tuple[Path, Path]:
    folder = cache_dir() / kind
    return folder / f"{key}.cubin", folder / f"{key}.json"


def load_entry(key: str, kind: str = "nvrtc") -> tuple[bytes, dict[str, Any]] | None:
    """``(cubin bytes, metadata)`` of a complete, intact entry, or ``None``."""
    binary_path, meta_path = _entry_paths(key, kind)
    try:
        meta = json.loads(meta_path.read_text())
        binary = binary_path.read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(binary).hexdigest():
        return None
    return binary, meta


def store_entry(key: str, binary: bytes, meta: Mapping[str, Any], kind: str = "nvrtc") -> bool:
    """Store an entry (binary first, metadata last); ``False`` (with a warning) if it could not."""
    binary_path, meta_path = _entry_paths(key, kind)
    record = dict(meta, sha256=hashlib.sha256(binary).hexdigest(), key=key, format=CACHE_FORMAT)
    try:
        atomic_write(binary_path, binary)
        atomic_write(meta_path, json.dumps(record, indent=1, sort_keys=True).encode())
    except OSError as exc:
        warnings.warn(f"tkx: could not write the kernel cache in {binary_path.parent}: {exc}", stacklevel=3)
        return False
    return True


def clear_cache() -> int:
    """Delete every cached kernel (the whole :func:`cache_dir`); returns the number of files removed."""
    root = cache_dir()
    if not root.exists():
        return 0
    count = sum(1 for p in root.rglob("*") if p.is_file())
    shutil.rmtree(root, ignore_errors=True)
    return count


def cache_entries(kind: str = "nvrtc") -> list[Path]:
    """The metadata files of the cached kernels of ``kind`` (sorted)."""
    folder = cache_dir() / kind
    return sorted(folder.glob("*.json")) if folder.exists() else []

"""Small helpers for writing tidy C code from Python.

Emitters build code as lists of lines and join them with :func:`block`; nested pieces are
re-indented with :func:`indent`, so the generated kernel reads like hand-written CUDA.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

#: One level of indentation in generated code.
INDENT = "    "


def indent(code: str, levels: int = 1) -> str:
    """Indent every non-empty line of ``code`` by ``levels`` levels."""
    pad = INDENT * levels
    return "\n".join(pad + line if line.strip() else "" for line in code.splitlines())


def block(*parts: str | Iterable[str] | None) -> str:
    """Join code fragments (strings or iterables of lines) into one newline-separated text.

    ``None`` and empty strings are skipped, so optional pieces can be passed inline.
    """
    lines: list[str] = []
    for part in parts:
        if part is None:
            continue
        if isinstance(part, str):
            if part:
                lines.append(part)
        else:
            lines.extend(p for p in part if p is not None)
    return "\n".join(lines)


def dedent(code: str) -> str:
    """``textwrap.dedent`` plus stripping the leading newline of a triple-quoted string."""
    return textwrap.dedent(code).strip("\n")


def braces(header: str, body: str) -> str:
    """``header {`` + indented ``body`` + ``}``."""
    return f"{header} {{\n{indent(body)}\n}}"


def comment(text: str) -> str:
    """A ``//`` comment, one per line of ``text``."""
    return "\n".join(f"// {line}".rstrip() for line in text.splitlines())

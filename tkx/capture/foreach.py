"""``torch._foreach_*`` ops as lists of their single-tensor ops.

``torch.optim``'s optimizers and ``clip_grad_norm_`` take the foreach path by default on a GPU:
``torch._foreach_add_(params, grads, alpha=-lr)`` updates a whole list of tensors with one call.
After functionalization every such call is a functional ``aten._foreach_<op>.<overload>``;
each decomposes here into ``aten.<op>`` applied element by element, so tkx needs no IR op of
its own for them (the scheduler fuses the per-tensor pointwise ops as usual).

How each argument is spread over the list, read from the overload's schema:

* ``Tensor[]`` arguments are zipped (``_foreach_add.List``, ``_foreach_addcdiv``'s operands);
* ``Scalar[]`` arguments give one scalar per element (``.ScalarList``);
* a single ``Tensor`` is shared by every element (``_foreach_mul.Tensor``: one 0-d learning
  rate or clip coefficient), except the ``scalars`` tensor of ``_foreach_addcdiv.Tensor`` /
  ``_foreach_addcmul.Tensor``, which holds one scalar per element;
* everything else (a ``Scalar``, ``alpha``) is passed as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

#: Foreach ops with a decomposition of their own elsewhere (``_foreach_norm`` in the main table).
_OWN = ("_foreach_norm",)


def _spreader(schema: torch._C.FunctionSchema, base: str, overload: str) -> list[str]:
    """How each argument of ``schema`` is spread: ``zip``, ``each`` (one scalar per element),
    ``index`` (a tensor holding one scalar per element) or ``same``."""
    how = []
    for arg in schema.arguments:
        t = str(arg.type)
        if t.startswith("List[Tensor]") or t == "Tensor[]":
            how.append("zip")
        elif t in ("List[number]", "List[Scalar]", "Scalar[]", "number[]"):
            how.append("each")
        elif t == "Tensor" and overload == "Tensor" and base in ("addcdiv", "addcmul") and arg.name == "scalars":
            how.append("index")
        else:
            how.append("same")
    return how


def _make(packet: Any, base: str, schema: torch._C.FunctionSchema, how: list[str]) -> Callable:
    names = [a.name for a in schema.arguments]
    # addcdiv/addcmul take their scalar as the keyword-only ``value``; the foreach overloads positionally
    as_value = base in ("addcdiv", "addcmul")

    def decomposed(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        bound = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
        lists = [v for v, h in zip(bound, how) if h == "zip"]
        out = []
        for i in range(len(lists[0]) if lists else 0):
            pos, kw = [], {}
            for k, (v, h) in enumerate(zip(bound, how)):
                value = v[i] if h in ("zip", "each", "index") else v
                if h == "index":  # a 0-d tensor scalar: written out, ``value=`` takes only numbers
                    pos.append(value)
                elif as_value and k == 3 or k >= len(args) and names[k] in kwargs:
                    kw["value" if as_value and k == 3 else names[k]] = value
                else:
                    pos.append(value)
            if as_value and len(pos) == 4:
                a, t1, t2, scale = pos
                out.append(a + scale * (t1 / t2 if base == "addcdiv" else t1 * t2))
            else:
                out.append(packet(*pos, **kw))
        return out

    return decomposed


def foreach_decompositions() -> dict[torch._ops.OpOverload, Callable]:
    """A decomposition for every functional ``aten._foreach_<op>`` overload whose single-tensor
    ``aten.<op>`` exists (the in-place ``_foreach_<op>_`` variants become these functional ones
    under functionalization)."""
    table: dict[torch._ops.OpOverload, Callable] = {}
    names = {n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("aten::_foreach_")}
    for name in sorted(names):
        if name.endswith("_") or name in _OWN:
            continue
        base = name[len("_foreach_"):]
        packet = getattr(aten, base, None)
        if packet is None:
            continue
        foreach = getattr(aten, name)
        for overload in foreach.overloads():
            op = getattr(foreach, overload)
            schema = op._schema
            if schema.is_mutable or not schema.returns or str(schema.returns[0].type) not in ("List[Tensor]",
                                                                                             "Tensor[]"):
                continue
            table[op] = _make(packet, base, schema, _spreader(schema, base, overload))
    return table

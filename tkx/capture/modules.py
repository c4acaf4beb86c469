"""Which ``nn.Module`` every FX node came from.

Two sources, in this order:

* **Module calls.** While the step is traced, global forward hooks
  (:func:`torch.nn.modules.module.register_module_forward_pre_hook`) keep the stack of modules being
  called, also through ``torch.func.functional_call``. Paths are those of
  ``root.named_modules()`` for the first module called from outside any module (``"blocks.1.attn"``;
  ``""`` is that root itself); another module called from outside is named after the variable that
  holds it in the calling frame (``"loss_fn"``), else after its class.
* **Parameter names**, for steps written over dicts of tensors: an input named
  ``params['blocks.1.attn.qkv.weight']`` belongs to module ``"blocks.1.attn"``; a forward op reading it
  (through views) belongs there too, and a forward op reading no parameter takes the module of its
  latest producer that has one.

Backward ops take the module of the forward call they differentiate (the capture's source tags link
them); optimizer ops the module of the parameter they update (the input they write in place or the
output named after it), else of the parameter they read. Ops outside every module keep ``None``.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import torch

#: (dotted path, class name) of a module; the class is ``None`` for a module known only from
#: parameter names.
ModuleRef = tuple[str, str | None]

_KEY = re.compile(r"\['((?:[^'\\]|\\.)*)'\]|\[\"((?:[^\"\\]|\\.)*)\"\]")


def module_of_name(name: str) -> str | None:
    """The module path in a parameter's pytree name: ``params['blocks.1.attn.qkv.weight']`` ->
    ``"blocks.1.attn"``, ``params['fc.bias']`` -> ``"fc"``; ``None`` when the last string key has no dot
    (``params['w1']``). The names of a step captured with ``state=`` are ``state_dict`` names:
    ``fc1.weight``, ``fc1.weight.grad`` and ``opt.state[fc1.weight].exp_avg`` -> ``"fc1"``."""
    keys = [a or b for a, b in _KEY.findall(name)]
    if not keys:
        lifted = _LIFTED.fullmatch(name)
        param = lifted and (lifted.group(1) or lifted.group(2))
        if not param or "." not in param:
            return None
        return param.rsplit(".", 1)[0]
    if "." not in keys[-1]:
        return None
    return keys[-1].rsplit(".", 1)[0]


#: A lifted tensor's name (:mod:`tkx.capture.stateful`): the parameter's, its gradient's, or its optimizer
#: state's ``OPT.state[PARAM].KEY``.
_LIFTED = re.compile(r"\w+\.state\[([\w.]+)\]\.\w+|([\w.]+?)(?:\.grad)?")


class ModuleStack:
    """The stack of ``nn.Module`` calls while a step is traced (a context manager).

    ``current`` is the innermost module's :data:`ModuleRef` (``None`` outside every module);
    ``seen`` maps every called module's path to its class name, in call order.
    """

    def __init__(self) -> None:
        self.stack: list[ModuleRef] = []
        self.seen: dict[str, str] = {}
        self._paths: dict[torch.nn.Module, str] = {}
        self._handles: list[Any] = []

    @property
    def current(self) -> ModuleRef | None:
        return self.stack[-1] if self.stack else None

    def _root_name(self, module: torch.nn.Module) -> str:
        if not self._paths:
            return ""
        frame = sys._getframe(3)  # above the hook and Module._call_impl: the caller of module(...)
        while frame is not None and frame.f_code.co_filename.startswith(torch.__path__[0]):
            frame = frame.f_back
        if frame is not None:
            for var, value in frame.f_locals.items():
                if value is module:
                    return var
        return type(module).__name__.lower()

    def _path(self, module: torch.nn.Module) -> str:
        path = self._paths.get(module)
        if path is None:  # a module called from outside every known module: a new root
            root = self._root_name(module)
            for sub, m in module.named_modules(remove_duplicate=False):
                self._paths.setdefault(m, f"{root}.{sub}".strip(".") if sub else root)
            path = self._paths[module]
        return path

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        ref = (self._path(module), type(module).__name__)
        self.seen.setdefault(*ref)
        self.stack.append(ref)

    def _post(self, module: torch.nn.Module, args: Any, result: Any) -> None:
        if self.stack:
            self.stack.pop()

    def __enter__(self) -> ModuleStack:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stack.clear()


def attribute(gm: torch.fx.GraphModule, regions: dict[str, str], input_names: list[str],
              output_names: list[str], tags: dict[str, dict[str, Any]]) -> dict[str, ModuleRef]:
    """The module of every FX node that has one, by node name (see the module docstring for the rules).

    ``tags`` are the nodes' capture tags (``module``: the :data:`ModuleRef` seen while tracing,
    ``call``: the forward call that made a node, ``differentiates_call``: the forward call a backward
    node differentiates).
    """
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    param_module = {p: module_of_name(input_names[i]) for i, p in enumerate(placeholders) if i < len(input_names)}
    types: dict[str, str] = {}
    out: dict[str, ModuleRef] = {}
    for n in nodes:
        ref = tags.get(n.name, {}).get("module")
        if ref is not None and n.op == "call_function":
            out[n.name] = tuple(ref)
            types.setdefault(*ref)
    called = bool(out)

    def from_param(path: str | None) -> ModuleRef | None:
        return None if path is None else (path, types.get(path))

    def reads_param(n: torch.fx.Node) -> ModuleRef | None:
        for x in n.all_input_nodes:
            if x.op == "placeholder" and param_module.get(x):
                return from_param(param_module[x])
        return None

    def latest_producer(n: torch.fx.Node) -> ModuleRef | None:
        known = [x for x in n.all_input_nodes if x.name in out]
        return out[max(known, key=order.__getitem__).name] if known else None

    calls: dict[int, ModuleRef] = {}
    for n in nodes:  # forward: parameter names, then the latest producer
        if n.op != "call_function" or regions.get(n.name) != "forward":
            continue
        if n.name not in out and not called:
            ref = reads_param(n) or latest_producer(n)
            if ref is not None:
                out[n.name] = ref
        call = tags.get(n.name, {}).get("call")
        if call is not None and n.name in out:
            calls.setdefault(call, out[n.name])
    for n in nodes:  # backward: the forward call differentiated, else the latest producer
        if n.op != "call_function" or regions.get(n.name) != "backward" or n.name in out:
            continue
        ref = calls.get(tags.get(n.name, {}).get("differentiates_call"))
        ref = ref or latest_producer(n)
        if ref is not None:
            out[n.name] = ref
    _attribute_optimizer(nodes, regions, placeholders, param_module, output_names, out, from_param)
    return out


def _attribute_optimizer(nodes: list[torch.fx.Node], regions: dict[str, str], placeholders: list[torch.fx.Node],
                         param_module: dict[torch.fx.Node, str | None], output_names: list[str],
                         out: dict[str, ModuleRef], from_param: Any) -> None:
    """Optimizer nodes: the parameter they update (an in-place copy into it or an output named after it),
    else the parameter they read."""
    opt = [n for n in nodes if n.op == "call_function" and regions.get(n.name) == "optimizer" and n.name not in out]
    if not opt:
        return
    target: dict[torch.fx.Node, ModuleRef] = {}
    output = next((n for n in nodes if n.op == "output"), None)
    if output is not None:
        flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        for i, a in enumerate(flat):
            ref = from_param(module_of_name(output_names[i])) if i < len(output_names) else None
            if isinstance(a, torch.fx.Node) and ref is not None:
                target.setdefault(a, ref)
    for n in nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and n.args[0] in param_module:
            ref = from_param(param_module[n.args[0]])
            if ref is not None:
                target.setdefault(n, ref)
                if isinstance(n.args[1], torch.fx.Node):
                    target.setdefault(n.args[1], ref)
    for n in reversed(nodes):  # the update a value flows into
        if n in target:
            continue
        refs = [target[u] for u in n.users if u in target]
        if refs and regions.get(n.name) == "optimizer":
            target[n] = refs[0]
    for n in opt:
        ref = target.get(n)
        if ref is None:
            ref = next((from_param(param_module[x]) for x in n.all_input_nodes
                        if x.op == "placeholder" and param_module.get(x)), None)
        if ref is not None:
            out[n.name] = ref

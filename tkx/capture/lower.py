"""Lowering an FX graph (aten ops on fake tensors) to a :class:`tkx.ir.Program`.

Rules:

* every value-producing aten op becomes one IR op whose output is a new dense root buffer;
* view ops (transpose, permute, expand, view/reshape, squeeze/unsqueeze, slice, select,
  alias, detach) become :class:`TensorSpec` metadata, computed by applying the very same
  aten view op to a ``meta`` tensor laid out like our value (so torch decides strides);
  a view that our layout cannot express gets an explicit copy first;
* broadcasting is made explicit: every tensor operand of a pointwise op is a stride-0
  view with the output's shape;
* ``copy_`` into a placeholder (what functionalization leaves for ``p.sub_(...)``)
  becomes a :class:`StateUpdate`.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

import torch

from .. import ops
from ..dtypes import INT_DTYPES
from ..errors import SourceLine, UnsupportedError
from ..ir import (
    DTYPE_BYTES,
    InputSpec,
    Op,
    Operand,
    OutputSpec,
    Program,
    StateUpdate,
    TensorSpec,
    contiguous_strides,
)
from . import lowerings
from .trace import node_tag

aten = torch.ops.aten

TORCH_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                torch.int64: "int64", torch.int32: "int32", torch.bool: "bool",
                torch.int8: "int8", torch.uint8: "uint8"}
IR_TO_TORCH = {v: k for k, v in TORCH_DTYPES.items()}

VIEW_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.expand.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.slice.Tensor,
    aten.select.int, aten.alias.default, aten.detach.default, aten.as_strided.default,
    aten.diagonal.default, aten.expand_as.default, aten.view_as.default, aten.narrow.default,
    aten.unflatten.int, aten.flatten.using_ints, aten.movedim.int,
}

RANDOM_OPS = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli",
              "normal", "normal_functional", "uniform", "native_dropout", "dropout", "multinomial", "randperm",
              "exponential", "geometric", "cauchy", "log_normal", "poisson", "rrelu_with_noise"}

#: torch functions whose internals fail lowering, with what to tell the user instead.
FAMILY_MESSAGES = {
    "instance_norm": ("instance_norm (aten.native_batch_norm over each sample) is not supported yet",
                      "normalise with x.mean/x.var over the spatial dims yourself"),
}

#: aten overload ("exp.default") or packet ("mul": every overload) name -> IR kind, from the op
#: table's ``aten`` column.
ONE_TO_ONE = ops.lowerings()


def _overload_name(target: Any) -> str:
    """``aten.exp.default`` -> ``"exp.default"`` (``""`` for a non-aten target)."""
    packet = getattr(target, "_overloadpacket", None)
    if packet is None:
        return ""
    return f"{packet.__name__}.{getattr(target, '_overloadname', 'default')}"


FILL_LIKE = {aten.zeros_like.default: 0, aten.ones_like.default: 1, aten.zeros.default: 0,
             aten.ones.default: 1, aten.new_zeros.default: 0, aten.new_ones.default: 1}
REDUCTIONS = {
    aten.sum.dim_IntList: "sum", aten.sum.default: "sum", aten.mean.dim: "mean",
    aten.mean.default: "mean", aten.amax.default: "amax", aten.amin.default: "amin",
}


def ir_dtype(dtype: torch.dtype, *, what: str, node: torch.fx.Node | None = None,
             source: SourceLine | None = None) -> str:
    if dtype not in TORCH_DTYPES:
        raise UnsupportedError(
            "unsupported-dtype", f"{what} has dtype {dtype}", node=node.name if node else None,
            op=str(node.target) if node is not None and node.op == "call_function" else None,
            source=source,
            hint="use float32, bfloat16 or float16 for values (int64/int32/bool for indices and masks)")
    return TORCH_DTYPES[dtype]


class Lowering:
    """One FX graph -> one Program. See the module docstring for the rules."""

    def __init__(self, gm: torch.fx.GraphModule, input_names: list[str], output_names: list[str],
                 regions: dict[str, str], name: str,
                 modules: dict[str, tuple[str, str | None]] | None = None) -> None:
        self.gm = gm
        self.modules = modules or {}
        self.input_names = input_names
        self.output_names = output_names
        self.regions = regions
        self.name = name
        self.values: dict[torch.fx.Node, Any] = {}
        self.ops: list[Op] = []
        self.ids: set[str] = set()
        self.node: torch.fx.Node | None = None

    # -- helpers ------------------------------------------------------------------
    @property
    def source(self) -> SourceLine | None:
        return node_tag(self.node).get("source") if self.node is not None else None

    @property
    def module(self) -> tuple[str, str | None] | None:
        """(path, class) of the ``nn.Module`` the current node came from (see :mod:`tkx.capture.modules`)."""
        return self.modules.get(self.node.name) if self.node is not None else None

    def fail(self, kind: str, what: str, hint: str) -> UnsupportedError:
        node = self.node
        return UnsupportedError(kind, what, op=str(node.target) if node is not None else None,
                                node=node.name if node is not None else None,
                                source=self.source, hint=hint)

    def explain(self, e: UnsupportedError) -> UnsupportedError:
        """``e`` said in terms of what the user wrote: the torch function or transform behind an
        internal op (BatchNorm's buffers, forward-mode AD, vmap's batching rules)."""
        tag = node_tag(self.node) if self.node is not None else {}
        fn = tag.get("torch_fn", "")
        code = self.source.code if self.source is not None else ""
        family = FAMILY_MESSAGES.get(fn)
        if family is not None:
            what, hint = family
            return UnsupportedError("unsupported-op", what, op=e.op, node=e.node, source=e.source, hint=hint)
        transform = re.search(r"\b(jvp|jacfwd|hessian|jacrev|vmap|linearize)\s*\(", code)
        if transform is not None and transform.group(1) in ("jvp", "jacfwd", "hessian", "linearize"):
            name = transform.group(1)
            return UnsupportedError(
                e.kind, f"{e.what} (made by torch.func.{name}'s forward-mode rule for an op on this line, "
                "not written by you)", op=e.op, node=e.node, source=e.source,
                hint=f"{e.hint}; or take the derivative in reverse mode (torch.func.grad / vjp: a Hessian-vector "
                     "product is grad of (grad(f)(w) * v).sum())")
        if transform is not None and transform.group(1) in ("vmap", "jacrev"):
            name = transform.group(1)
            return UnsupportedError(
                e.kind, f"{e.what} (made by torch.func.{name}'s batching rule for an op on this line, "
                "not written by you)", op=e.op, node=e.node, source=e.source,
                hint=f"{e.hint}; or compute the batch without {name} (most per-example steps have a batched form)")
        return e

    def scalar_literal(self, node: torch.fx.Node) -> TensorSpec | None:
        """A ``fill`` for a 0-d constant that tracing made from a Python number (``y[:, 0] = 1.0``,
        ``torch.tensor(2.0)``: read only through ``lift_fresh_copy``); ``None`` for any other constant."""
        value = getattr(self.gm, str(node.target), None)
        if not (isinstance(value, torch.Tensor) and value.dim() == 0 and node.users
                and all(u.target is aten.lift_fresh_copy.default for u in node.users)):
            return None
        dtype = ir_dtype(value.dtype, what=f"the constant {node.target}", node=node, source=self.source)
        number = value.item()
        return self.emit("fill", (), (), dtype, {"value": number})

    def fresh_id(self, base: str) -> str:
        candidate, i = base, 1
        while candidate in self.ids:
            candidate = f"{base}_{i}"
            i += 1
        self.ids.add(candidate)
        return candidate

    def meta_dtype(self, node: torch.fx.Node) -> str:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise self.fail("unsupported-op", f"{node.name} does not produce a single tensor",
                            "only ops producing one tensor are supported")
        return ir_dtype(val.dtype, what=f"the result of {node.target}", node=node, source=self.source)

    def meta_shape(self, node: torch.fx.Node) -> tuple[int, ...]:
        val = node.meta["val"]
        shape = []
        for d in val.shape:
            if not isinstance(d, int):
                raise self.fail("dynamic-shape", f"{node.name} has a symbolic size {d}",
                                "tkx compiles static shapes only; make the size a constant")
            shape.append(int(d))
        return tuple(shape)

    def emit(self, kind: str, inputs: tuple[Operand, ...], shape: tuple[int, ...], dtype: str,
             attrs: dict[str, Any] | None = None, base: str | None = None) -> TensorSpec:
        assert self.node is not None
        r = ops.row(kind)
        if dtype in INT_DTYPES and not r.int_exact:
            raise self.fail("integer-arithmetic", f"{kind} on {dtype} values",
                            f"compute it in float32 (e.g. x.float()); {kind} is not exact on integers in tkx")
        op_id = self.fresh_id(base or self.node.name)
        out = TensorSpec.dense(op_id, shape, dtype)
        module, module_type = self.module or (None, None)
        self.ops.append(Op(op_id, kind, tuple(inputs), out, dict(attrs or {}),
                           region=self.regions.get(self.node.name, "optimizer"),
                           source=self.source, fx_node=self.node.name, module=module, module_type=module_type))
        return out

    def tensor(self, arg: Any) -> TensorSpec:
        value = self.values[arg] if isinstance(arg, torch.fx.Node) else None
        if not isinstance(value, TensorSpec):
            raise self.fail("unsupported-op", f"expected a tensor operand, got {arg!r}",
                            "pass tensors, not Python containers, to this op")
        return value

    def operand(self, arg: Any) -> Operand:
        if isinstance(arg, TensorSpec):
            return arg
        if isinstance(arg, torch.fx.Node):
            return self.tensor(arg)
        if isinstance(arg, (bool, int, float)):
            return arg
        raise self.fail("unsupported-op", f"operand {arg!r} of type {type(arg).__name__}",
                        "operands must be tensors or Python numbers")

    # -- views ----------------------------------------------------------------------
    def apply_view(self, spec: TensorSpec, target: Callable, args: tuple, kwargs: dict) -> TensorSpec:
        extent = max(spec.extent, 1)
        meta = torch.empty(extent, dtype=IR_TO_TORCH[spec.dtype], device="meta")
        meta = meta.as_strided(spec.shape, spec.strides, spec.offset)
        result = target(meta, *args, **kwargs)
        if result.dtype != meta.dtype:
            raise self.fail("unsupported-op", "a view that reinterprets the dtype",
                            "use .to(dtype) instead of .view(dtype)")
        return TensorSpec(tuple(result.shape), spec.dtype, tuple(result.stride()), spec.buffer,
                          int(result.storage_offset()))

    def lower_view(self, node: torch.fx.Node) -> TensorSpec:
        spec = self.tensor(node.args[0])
        rest = tuple(node.args[1:])
        try:
            return self.apply_view(spec, node.target, rest, dict(node.kwargs))
        except RuntimeError:
            # Our layout of the base differs from eager's and the view needs a copy.
            dense = self.emit("cast", (spec,), spec.shape, spec.dtype, base=f"{node.name}_contig")
            return self.apply_view(dense, node.target, rest, dict(node.kwargs))

    def broadcast(self, x: Operand, shape: tuple[int, ...]) -> Operand:
        """Make broadcasting explicit: a stride-0 view of ``x`` with ``shape``."""
        if not isinstance(x, TensorSpec) or x.shape == shape:
            return x
        if len(x.shape) > len(shape):
            raise self.fail("unsupported-op", f"cannot broadcast {list(x.shape)} to {list(shape)}",
                            "check the operand shapes")
        pad = len(shape) - len(x.shape)
        strides = []
        for i, n in enumerate(shape):
            j = i - pad
            if j < 0:
                strides.append(0)
            elif x.shape[j] == n:
                strides.append(x.strides[j] if n != 1 else 0)
            elif x.shape[j] == 1:
                strides.append(0)
            else:
                raise self.fail("unsupported-op", f"cannot broadcast {list(x.shape)} to {list(shape)}",
                                "check the operand shapes")
        return TensorSpec(shape, x.dtype, tuple(strides), x.buffer, x.offset)

    def pointwise(self, kind: str, operands: list[Any], attrs: dict | None = None) -> TensorSpec:
        assert self.node is not None
        shape, dtype = self.meta_shape(self.node), self.meta_dtype(self.node)
        ins = tuple(self.broadcast(self.operand(a), shape) for a in operands)
        return self.emit(kind, ins, shape, dtype, attrs)

    # -- main loop -----------------------------------------------------------------
    def run(self) -> Program:
        inputs: list[InputSpec] = []
        updates: dict[int, TensorSpec] = {}
        placeholder_index: dict[torch.fx.Node, int] = {}
        outputs: list[OutputSpec] = []
        for node in self.gm.graph.nodes:  # random ops first: their decompositions hide them
            packet = getattr(node.target, "_overloadpacket", None)
            if node.op == "call_function" and packet is not None and packet.__name__ in RANDOM_OPS:
                self.node = node
                raise self.fail("random-op", f"random-number op {packet.__name__}, which tkx's Philox generator "
                                "does not draw", "tkx draws F.dropout, torch.rand/randn/rand_like/randn_like, "
                                "torch.bernoulli and SDPA's dropout inside the step (see tkx.random); make "
                                f"{packet.__name__}'s numbers from those, or draw them outside the step and pass "
                                "them in as inputs")
        for node in self.gm.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                i = len(inputs)
                val = node.meta["val"]
                dtype = ir_dtype(val.dtype, what=f"input {self.input_names[i]}")
                buf = f"in{i}"
                self.ids.add(buf)
                spec = TensorSpec(tuple(int(d) for d in val.shape), dtype,
                                  tuple(int(s) for s in val.stride()), buf, 0)
                self.values[node] = spec
                placeholder_index[node] = i
                inputs.append(InputSpec(self.input_names[i], spec))
            elif node.op == "get_attr" and (literal := self.scalar_literal(node)) is not None:
                self.values[node] = literal  # y[:, 0] = 1.0 and torch.tensor(1.0): a number written in the step
            elif node.op == "get_attr":
                user = next(iter(node.users), None)
                self.node = user
                raise self.fail(
                    "closed-over-tensor",
                    f"the step reads a tensor it did not receive as an input ({node.target})",
                    "pass every tensor as an argument of the step (closed-over tensors and "
                    "torch.tensor(...) constants are baked in by tracing); Python floats are fine")
            elif node.op == "call_function":
                if node.target is aten.copy_.default and node.args[0] in placeholder_index:
                    i = placeholder_index[node.args[0]]
                    target = inputs[i].value
                    value = self.tensor(node.args[1])
                    if value.shape != target.shape or value.dtype != target.dtype or not value.is_dense:
                        value = self.emit("cast", (self.broadcast(value, target.shape),), target.shape,
                                          target.dtype, base=f"{node.name}_value")
                    updates[i] = value
                    inputs[i] = InputSpec(inputs[i].name, target, mutated=True)
                    self.values[node] = target
                    continue
                try:
                    self.values[node] = self.lower_call(node)
                except UnsupportedError as e:
                    raise self.explain(e) from None
            elif node.op == "output":
                flat = node.args[0]
                flat = list(flat) if isinstance(flat, (list, tuple)) else [flat]
                for name, arg in zip(self.output_names, flat):
                    if not isinstance(arg, torch.fx.Node):
                        raise UnsupportedError("bad-input", f"output {name} is not a tensor ({arg!r})",
                                               hint="return only tensors (pytrees of tensors) from the step")
                    outputs.append(OutputSpec(name, self.tensor(arg)))
        # An output that reads a mutated input must see the updated value (as eager does).
        final_outputs = []
        for o in outputs:
            owner = next((i for i, inp in enumerate(inputs) if inp.value.buffer == o.value.buffer), None)
            if owner is not None and owner in updates:
                upd = updates[owner]
                o = OutputSpec(o.name, TensorSpec(o.value.shape, o.value.dtype, o.value.strides,
                                                  upd.buffer, o.value.offset)
                               if upd.is_dense else upd)
            final_outputs.append(o)
        program = Program(tuple(inputs), tuple(self.ops), tuple(final_outputs),
                          tuple(StateUpdate(i, v) for i, v in sorted(updates.items())), name=self.name)
        return program

    def lower_call(self, node: torch.fx.Node) -> Any:
        target = node.target
        if target is operator.getitem:
            return self.values[node.args[0]][node.args[1]]
        name = getattr(target, "__name__", str(target)).split(".")[0]
        packet = getattr(target, "_overloadpacket", None)
        short = packet.__name__ if packet is not None else name
        if short in RANDOM_OPS:
            raise self.fail("random-op", f"random-number op {short}",
                            "generate random tensors outside the step and pass them in as inputs")
        if target in VIEW_OPS:
            return self.lower_view(node)
        val = node.meta.get("val")
        if (short in ("empty", "new_empty") and isinstance(val, torch.Tensor) and val.numel() == 0
                and not node.users):
            return None  # an unused empty buffer (BatchNorm's uint8 reserve space): nothing to compute
        custom = lowerings.find(target)
        if custom is not None:
            return custom(self, node)
        args, kwargs = node.args, node.kwargs
        name = _overload_name(target)
        kind = ONE_TO_ONE.get(name) or ONE_TO_ONE.get(name.split(".")[0])
        if kind is not None:
            return self.pointwise(kind, list(args))
        if short in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"):
            if self.meta_dtype(node) != "bool":
                raise self.fail("unsupported-op", f"{short} on integers (bit operations)",
                                "tkx has bitwise ops on booleans only (&, |, ^, ~ of masks); for integer bit fields "
                                "use // and % by powers of two, e.g. an int4 unpack (p >> 4) & 15 as (p // 16) % 16 "
                                "(compiled to shifts and masks)")
            return self.pointwise("logical_" + short.split("_")[1], list(args))
        if short == "relu":
            return self.pointwise("maximum", [args[0], 0.0])
        if short == "masked_fill":
            value = args[2]
            if isinstance(value, torch.fx.Node):
                return self.pointwise("where", [args[1], value, args[0]])
            return self.pointwise("where", [args[1], float(value), args[0]])
        if short == "zero":
            return self.emit("fill", (), self.meta_shape(node), self.meta_dtype(node), {"value": 0})
        if short in ("add", "sub"):
            alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
            other = args[1]
            if alpha != 1:
                if isinstance(other, torch.fx.Node):
                    other_spec = self.tensor(other)
                    dtype = self.meta_dtype(node)
                    other = self.emit("mul", (other_spec, alpha), other_spec.shape, dtype,
                                      base=f"{node.name}_alpha")
                    return self.pointwise(short, [args[0], other])
                other = other * alpha
            return self.pointwise(short, [args[0], other])
        if short == "div":
            mode = kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
            if mode == "floor":
                return self.pointwise("floor_divide", [args[0], args[1]])
            if mode == "trunc":
                shape, dtype = self.meta_shape(node), self.meta_dtype(node)
                if dtype in INT_DTYPES:
                    raise self.fail("unsupported-op", "integer division rounding toward zero",
                                    "use // (floor division) or true division")
                q = self.emit("div", tuple(self.broadcast(self.operand(a), shape) for a in args[:2]), shape, dtype,
                              base=f"{node.name}_q")
                return self.emit("trunc", (q,), shape, dtype)
            return self.pointwise("div", [args[0], args[1]])
        if short == "pow":  # tensor ** scalar, scalar ** tensor (Adam's 1 - beta ** t) and tensor ** tensor
            return self.pointwise("pow", [args[0], args[1]])
        if short == "where":
            return self.pointwise("where", [args[0], args[1], args[2]])
        if short == "clamp":
            lo = kwargs.get("min", args[1] if len(args) > 1 else None)
            hi = kwargs.get("max", args[2] if len(args) > 2 else None)
            if isinstance(lo, torch.fx.Node) or isinstance(hi, torch.fx.Node):
                raise self.fail("unsupported-op", "clamp with tensor bounds",
                                "use torch.maximum/torch.minimum with tensors")
            return self.pointwise("clamp", [args[0]], {"min": lo, "max": hi})
        if short in ("_to_copy", "clone", "lift_fresh_copy", "contiguous"):
            if kwargs.get("device") is not None and args and isinstance(args[0], torch.fx.Node):
                src = args[0].meta["val"].device
                if torch.device(kwargs["device"]) != src:
                    raise self.fail("device-mismatch", f"a copy from {src} to {kwargs['device']}",
                                    "move tensors to one device before calling the step")
            return self.pointwise("cast", [args[0]])
        if short == "copy":
            return self.pointwise("cast", [args[1]])
        if target in FILL_LIKE:
            return self.emit("fill", (), self.meta_shape(node), self.meta_dtype(node),
                             {"value": FILL_LIKE[target]})
        if short in ("full", "full_like", "new_full", "fill", "scalar_tensor"):
            value = {"full": args[1] if len(args) > 1 else None, "full_like": args[1] if len(args) > 1 else None,
                     "new_full": args[2] if len(args) > 2 else None,
                     "fill": args[1] if len(args) > 1 else None,
                     "scalar_tensor": args[0] if args else None}[short]
            if isinstance(value, torch.fx.Node):
                return self.pointwise("cast", [value])
            return self.emit("fill", (), self.meta_shape(node), self.meta_dtype(node), {"value": value})
        if short == "arange":
            shape = self.meta_shape(node)
            nums = [a for a in args if isinstance(a, (int, float))]
            start, step = 0, 1
            if target in (aten.arange.start, aten.arange.start_step):
                start = nums[0]
                step = nums[2] if len(nums) > 2 else 1
            return self.emit("iota", (), shape, self.meta_dtype(node), {"start": start, "step": step, "dim": 0})
        if target in REDUCTIONS:
            return self.lower_reduction(node, REDUCTIONS[target])
        if short == "mm":
            return self.emit("mm", (self.tensor(args[0]), self.tensor(args[1])),
                             self.meta_shape(node), self.meta_dtype(node))
        if short == "bmm":
            return self.emit("bmm", (self.tensor(args[0]), self.tensor(args[1])),
                             self.meta_shape(node), self.meta_dtype(node))
        if short == "addmm":
            shape = self.meta_shape(node)
            bias = self.broadcast(self.tensor(args[0]), shape)
            beta = kwargs.get("beta", 1)
            alpha = kwargs.get("alpha", 1)
            return self.emit("addmm", (bias, self.tensor(args[1]), self.tensor(args[2])), shape,
                             self.meta_dtype(node), {"alpha": alpha, "beta": beta})
        if short in ("empty", "empty_like", "new_empty", "empty_strided"):
            # Functionalized graphs only use an empty tensor as the destination of a functional
            # copy/fill, which lowers to a fresh value: its contents are never read. Poison it
            # with NaN so a read would show, and let dead-code elimination drop it.
            dtype = self.meta_dtype(node)
            poison = float("nan") if dtype in ("float32", "bfloat16", "float16") else 0
            return self.emit("fill", (), self.meta_shape(node), dtype, {"value": poison})
        if short in ("_local_scalar_dense", "item"):
            raise self.fail("data-dependent-control-flow", "reading a tensor's value as a Python number",
                            "keep values as tensors (use torch.where instead of if/else on data)")
        if short in ("nonzero", "masked_select", "unique", "index", "_unique2"):
            raise self.fail("dynamic-shape", f"{short} has a data-dependent output shape",
                            "use a mask with torch.where so shapes stay static")
        if short.endswith("_scatter"):
            raise self.fail("unsupported-op", f"an in-place write into a view ({short})",
                            "update whole tensors (e.g. torch.where(mask, new, old)) instead of slices")
        raise self.fail("unsupported-op", f"the op {short} is not supported by tkx",
                        "rewrite it with supported primitives (pointwise, sum/mean/amax/amin, mm/bmm) "
                        "or add a decomposition to tkx.capture.decompositions")

    def lower_reduction(self, node: torch.fx.Node, kind: str) -> TensorSpec:
        args, kwargs = node.args, node.kwargs
        x = self.tensor(args[0])
        dims = args[1] if len(args) > 1 else kwargs.get("dim", None)
        keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(x.ndim))
        if isinstance(dims, int):
            dims = [dims]
        dims = tuple(sorted({int(d) % max(x.ndim, 1) for d in dims})) if x.ndim else ()
        if kwargs.get("dtype") is not None and kind in ("amax", "amin"):
            raise self.fail("unsupported-op", "amax/amin with a dtype", "cast before reducing")
        return self.emit(kind, (x,), self.meta_shape(node), self.meta_dtype(node),
                         {"dims": dims, "keepdim": keepdim})


__all__ = ["Lowering", "TORCH_DTYPES", "IR_TO_TORCH", "ir_dtype", "DTYPE_BYTES", "contiguous_strides"]

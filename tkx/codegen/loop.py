"""A training loop in one launch: the step kernel's body run K times inside one cooperative kernel.

``generate(schedule, arena, loop=LoopSpec(...))`` (:func:`tkx.codegen.generate`) wraps the stages of
one step in ``for (k = 0; k < steps; ++k)``; this module writes the pieces that differ from a
one-step kernel:

* **batches**: an input fed from a dataset tensor ``[N, *batch shape]`` is a kernel parameter
  ``tkx_arg_in{i}`` holding the whole dataset; step ``k`` reads row ``(first + k) % N`` (or
  ``order[(first + k) % len(order)]`` with a permutation), through a local ``in{i}`` pointing at that row;
* **carried state** (a functional step that returns its new state): input ``i`` and output ``j``
  swap buffers every step (even steps read the user's tensor and write the output buffer, odd
  steps the other way round); after an odd number of steps the kernel copies the state back,
  so the user's tensors always end up holding it;
* **losses**: the loss output of step ``k`` is element ``k`` of the ``tkx_losses`` vector;
* **a step boundary**: one barrier after every step (the next step reads the state this one wrote);
  before it block 0 polls the host's stop flag, after it block 0 publishes the step count and
  the latest loss to mapped host memory (both at most every ``publish_ns``, and always at the end).
  A stop request seen before the barrier ending step k is written as "stop after step k + 2"; every
  block reads that word after the same barrier and acts on it at the next boundary, so all blocks
  leave the loop after the same step without waiting on the word's load.

Words of ``tkx_loop`` (device memory, ``unsigned long long``, :data:`LOOP_WORDS`): ``[0]`` the steps
to run, ``[1]`` the cycle length (dataset rows or the permutation's length), ``[2]`` steps completed
by earlier launches (the dataset position, advanced at the end of each launch: CUDA-graph replays
continue through the data), ``[3]`` the step count after which to stop (written once by block 0, read by
every block after each step's barrier), ``[4]`` the steps the last launch ran.

Words of ``tkx_live`` (pinned host memory mapped into the device, ``unsigned int``,
:data:`LIVE_WORDS`): ``[0]`` steps completed in this launch (stored with ``st.release.sys`` after
``[1]``), ``[1]`` the latest loss (float32 bits), ``[2]`` the stop request (the host writes nonzero),
``[3]`` 1 once the launch has finished its steps (0 while it runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UnsupportedError
from ..ir import contiguous_strides
from . import abi
from .cuda_prelude import SUFFIX, barrier
from .text import block, dedent, indent

#: Words of the device loop-control buffer and of the mapped host buffer (see the module docstring).
LOOP_WORDS = 8
LIVE_WORDS = 16
#: Word indices.
LOOP_STEPS, LOOP_CYCLE, LOOP_FIRST, LOOP_STOP_AT, LOOP_RAN = 0, 1, 2, 3, 4
LIVE_DONE, LIVE_LOSS, LIVE_STOP, LIVE_FINISHED = 0, 1, 2, 3

#: Parameter roles a loop kernel adds after the one-step kernel's (:data:`tkx.codegen.abi.ROLES`).
LOOP_ROLES = ("losses", "loop", "live", "order")


@dataclass(frozen=True)
class LoopSpec:
    """How a step becomes the body of a K-step loop.

    * ``batches``: ``(program input index, row stride in elements)`` of every input read from a
      dataset tensor (row ``r`` of the dataset starts ``r * stride`` elements into it);
    * ``carry``: ``(input index, output index)`` pairs: the output of step k is the input of step k+1;
    * ``loss_output``: the output holding the loss (one element), written to ``losses[k]``;
    * ``publish_ns``: the shortest time between two publications of the progress (and polls of the
      stop flag) by block 0, in ns of ``%globaltimer``.
    """

    batches: tuple[tuple[int, int], ...]
    carry: tuple[tuple[int, int], ...]
    loss_output: int
    publish_ns: int = 200_000

    def batch_inputs(self) -> dict[int, int]:
        return dict(self.batches)


LOOP_PRELUDE = dedent(r"""
    // ---------------------------------------------------------------------------------
    // Training loop helpers: the progress block 0 publishes to pinned host memory mapped into
    // the device (system scope), and the host's stop request it polls.
    // ---------------------------------------------------------------------------------
    __device__ __forceinline__ unsigned long long tkx_clock() {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        return t;
    }
    __device__ __forceinline__ unsigned int tkx_ld_sys(const unsigned int* p) {
        unsigned int v;
        asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
        return v;
    }
    __device__ __forceinline__ void tkx_st_sys(unsigned int* p, unsigned int v) {
        asm volatile("st.relaxed.sys.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
    }
    __device__ __forceinline__ void tkx_st_release_sys(unsigned int* p, unsigned int v) {
        asm volatile("st.release.sys.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
    }
    // Publish: the loss first, then the step count with a system-scope release, so a host that
    // reads the count sees a loss at least that recent.
    __device__ __forceinline__ void tkx_publish(unsigned int* live, unsigned long long done, float loss) {
        tkx_st_sys(live + 1, __float_as_uint(loss));
        tkx_st_release_sys(live, (unsigned int)done);
    }
    __device__ __forceinline__ unsigned long long tkx_ld_volatile_u64(const unsigned long long* p) {
        return *(const volatile unsigned long long*)p;
    }
    """)


def check_spec(program, spec: LoopSpec, tensor_maps: Sequence[abi.TensorMapSpec] = ()) -> None:
    """Refuse a loop the kernel would get wrong (:class:`tkx.UnsupportedError` naming the input)."""
    n_in, n_out = len(program.inputs), len(program.outputs)
    batch = spec.batch_inputs()
    for i, stride in spec.batches:
        if not 0 <= i < n_in or stride <= 0:
            raise UnsupportedError("training-loop", f"batch input {i} (row stride {stride}) is not an input "
                                   f"of {program.name}", hint="pass one dataset tensor per batch argument")
        if program.inputs[i].mutated:
            raise UnsupportedError("training-loop", f"input {program.inputs[i].name} is read from the dataset "
                                   "but the step writes it in place",
                                   hint="a batch argument must be read-only in the step")
    if not 0 <= spec.loss_output < n_out or program.outputs[spec.loss_output].value.numel != 1:
        raise UnsupportedError("training-loop", f"output {spec.loss_output} of {program.name} is not a "
                               "one-element loss", hint="return the loss as a 0-d tensor (or pass loss=INDEX)")
    for i, j in spec.carry:
        inp, out = program.inputs[i], program.outputs[j]
        if i in batch or j == spec.loss_output or inp.mutated:
            raise UnsupportedError("training-loop", f"input {inp.name} cannot carry output {out.name} from one "
                                   "step to the next", hint="carry only state the step returns and does not "
                                   "write in place (carry=False for a step that updates its state in place)")
        if inp.value.strides != contiguous_strides(inp.value.shape) or inp.value.offset:
            raise UnsupportedError("training-loop", f"input {inp.name} carries state but is not a dense tensor "
                                   f"(strides {list(inp.value.strides)})", hint="pass contiguous state tensors")
        if (inp.value.shape, inp.value.dtype) != (out.value.shape, out.value.dtype):
            raise UnsupportedError("training-loop", f"output {out.name} {list(out.value.shape)} "
                                   f"{out.value.dtype} cannot become input {inp.name} {list(inp.value.shape)} "
                                   f"{inp.value.dtype} of the next step",
                                   hint="return the new state in the order, shapes and dtypes of the arguments")
    carried_in = {i for i, _ in spec.carry}
    carried_out = {j for _, j in spec.carry}
    for m in tensor_maps:
        if (m.role == "input" and (m.index in batch or m.index in carried_in)) or \
                (m.role == "output" and (m.index in carried_out or m.index == spec.loss_output)):
            raise UnsupportedError("training-loop", f"a TMA tensor map reads {m.role} {m.index}, whose address "
                                   "changes from step to step", hint="use Options(gemm_copy='cp.async')")
    if program.rng_input is not None:
        raise UnsupportedError("training-loop", f"{program.name} draws random numbers (a Philox state input)",
                               hint="a training loop in one launch runs steps without random numbers; "
                                    "call the compiled step once per step instead")


def loop_params(params: Sequence[abi.Param], program, spec: LoopSpec) -> list[abi.Param]:
    """The loop kernel's parameters: the one-step kernel's, with the inputs and outputs whose address
    changes per step renamed (``tkx_arg_in{i}``/``tkx_arg_out{k}``: the step declares ``in{i}``/``out{k}``),
    the loss output replaced by the ``losses`` vector, and the loop's own pointers last."""
    batch = spec.batch_inputs()
    carried_in = {i for i, _ in spec.carry}
    carried_out = {j for _, j in spec.carry}
    out = []
    for p in params:
        if p.role == "input" and (p.index in batch or p.index in carried_in):
            t = abi.C_TYPES[program.inputs[p.index].value.dtype]
            ctype = f"const {t}* __restrict__" if p.index in batch else f"{t}*"
            out.append(abi.Param(f"tkx_arg_in{p.index}", ctype, "input", p.index))
        elif p.role == "output" and p.index == spec.loss_output:
            continue
        elif p.role == "output" and p.index in carried_out:
            t = abi.C_TYPES[program.outputs[p.index].value.dtype]
            out.append(abi.Param(f"tkx_arg_out{p.index}", f"{t}*", "output", p.index))
        else:
            out.append(p)
    loss_t = abi.C_TYPES[program.outputs[spec.loss_output].value.dtype]
    out += [abi.Param("tkx_losses", f"{loss_t}* __restrict__", "losses"),
            abi.Param("tkx_loop", "unsigned long long*", "loop"),
            abi.Param("tkx_live", "unsigned int*", "live"),
            abi.Param("tkx_order", "const long long* __restrict__", "order")]
    return out


def loop_head() -> list[str]:
    """Statements before the loop: the loop words every block reads, block 0's reset of the stop word."""
    return [
        "// ---- training loop: steps, dataset cycle and position from the loop words",
        f"const unsigned long long tkx_steps = tkx_ld_volatile_u64(tkx_loop + {LOOP_STEPS});",
        f"const unsigned long long tkx_cycle = tkx_ld_volatile_u64(tkx_loop + {LOOP_CYCLE});",
        f"const unsigned long long tkx_first = tkx_ld_volatile_u64(tkx_loop + {LOOP_FIRST});",
        "const bool tkx_publisher = blockIdx.x == 0 && threadIdx.x == 0;  // publishes and polls the stop flag",
        "unsigned long long tkx_tick = 0, tkx_done = 0;",
        "unsigned long long tkx_stop_seen = ~0ULL;  // the stop word as read after the previous step's barrier",
        "unsigned long long tkx_pos = tkx_first % tkx_cycle;  // this step's dataset position (advanced per step)",
        "unsigned long long tkx_row = tkx_order ? (unsigned long long)tkx_order[tkx_pos] : tkx_pos;  // its row",
        "bool tkx_stop_asked = false;  // block 0: the stop word is written once",
        "if (tkx_publisher) {  // read by the other blocks only after the first step's barrier",
        f"    *(volatile unsigned long long*)(tkx_loop + {LOOP_STOP_AT}) = ~0ULL;",
        f"    tkx_st_sys(tkx_live + {LIVE_FINISHED}, 0u);",
        "    tkx_tick = tkx_clock();",
        "}",
    ]


def step_pointers(program, spec: LoopSpec) -> list[str]:
    """Declarations at the top of each step: the dataset row, the carried buffers and the loss slot."""
    lines = ["const unsigned long long tkx_next_pos = tkx_pos + 1 == tkx_cycle ? 0 : tkx_pos + 1;",
             "const unsigned long long tkx_next_row = tkx_order ? (unsigned long long)tkx_order[tkx_next_pos] : "
             "tkx_next_pos;  // loaded a step ahead"]
    for i, stride in spec.batches:
        t = abi.C_TYPES[program.inputs[i].value.dtype]
        lines.append(f"const {t}* __restrict__ in{i} = tkx_arg_in{i} + tkx_row * {stride}ULL;  "
                     f"// {program.inputs[i].name}: this step's batch")
    if spec.carry:
        lines.append("const bool tkx_odd = (tkx_k & 1ULL) != 0;  // carried state swaps buffers every step")
    for i, j in spec.carry:
        t = abi.C_TYPES[program.inputs[i].value.dtype]
        lines.append(f"const {t}* __restrict__ in{i} = tkx_odd ? tkx_arg_out{j} : tkx_arg_in{i};  "
                     f"// {program.inputs[i].name}")
        lines.append(f"{t}* __restrict__ out{j} = tkx_odd ? tkx_arg_in{i} : tkx_arg_out{j};  "
                     f"// {program.outputs[j].name}")
    loss_t = abi.C_TYPES[program.outputs[spec.loss_output].value.dtype]
    lines.append(f"{loss_t}* __restrict__ out{spec.loss_output} = tkx_losses + tkx_k;  // this step's loss")
    return lines


def step_end(program, spec: LoopSpec, mode: str, stages: int, spin: int, blocks: int, choice: str) -> list[str]:
    """The step boundary: poll the stop flag, a barrier (the next step reads this one's state),
    publish the progress, and leave the loop when a stop was requested."""
    load = f"tkx_ld_{SUFFIX[program.outputs[spec.loss_output].value.dtype]}"
    return [
        f"// ---- end of step: block 0 polls the stop flag (at most every {spec.publish_ns} ns), then a barrier",
        "bool tkx_due = false;",
        "if (tkx_publisher) {",
        "    const unsigned long long tkx_now_ns = tkx_clock();",
        f"    if (tkx_now_ns - tkx_tick >= {spec.publish_ns}ULL) {{",
        "        tkx_tick = tkx_now_ns;",
        "        tkx_due = true;",
        f"        if (!tkx_stop_asked && tkx_ld_sys(tkx_live + {LIVE_STOP}) != 0u) {{",
        "            tkx_stop_asked = true;  // stop after the next step: every block reads this after this barrier",
        f"            *(volatile unsigned long long*)(tkx_loop + {LOOP_STOP_AT}) = tkx_k + 2;",
        "        }",
        "    }",
        "}",
        barrier(mode, stages, spin_limit=f"{spin}ULL", blocks=blocks, choice=choice)
        + "  (the step boundary)",
        "tkx_done = tkx_k + 1;",
        "const bool tkx_stop = tkx_stop_seen <= tkx_done;  // read after the previous barrier: all blocks agree",
        f"tkx_stop_seen = tkx_ld_volatile_u64(tkx_loop + {LOOP_STOP_AT});  // used at the next boundary (the load "
        "overlaps the next step)",
        "if (tkx_publisher && (tkx_due || tkx_stop || tkx_done == tkx_steps))",
        f"    tkx_publish(tkx_live, tkx_done, {load}(tkx_losses, tkx_k));",
        "if (tkx_stop) break;",
        "tkx_pos = tkx_next_pos;",
        "tkx_row = tkx_next_row;",
    ]


def loop_tail(program, spec: LoopSpec) -> list[str]:
    """After the loop: carried state back into the user's tensors after an odd number of steps (every
    block, grid-stride; the last step's barrier ordered it), then block 0 records the steps run."""
    lines = ["// ---- after the loop"]
    if spec.carry:
        lines.append("if (tkx_done & 1ULL) {  // odd: the state is in the output buffers, copy it back")
        for i, j in spec.carry:
            n = program.inputs[i].value.numel
            lines.append(indent(f"for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < {n}LL; "
                                f"e += (long long)gridDim.x * blockDim.x) tkx_arg_in{i}[e] = tkx_arg_out{j}[e];"))
        lines.append("}")
    lines += [
        "if (tkx_publisher) {",
        f"    tkx_loop[{LOOP_FIRST}] = tkx_first + tkx_done;  // the dataset position for the next launch",
        f"    tkx_loop[{LOOP_RAN}] = tkx_done;",
        f"    tkx_st_release_sys(tkx_live + {LIVE_FINISHED}, 1u);",
        "}",
    ]
    return lines


def loop_kernel_body(head: Sequence[str], stages: Sequence[str], program, spec: LoopSpec, mode: str,
                     n_stages: int, spin: int, blocks: int, choice: str) -> list[str]:
    """The kernel body of a loop: ``head`` (launch check, barrier state, shared memory), the loop
    words, then ``for`` each step its pointers, ``stages`` and the step boundary, then the tail."""
    step = block(step_pointers(program, spec), list(stages), step_end(program, spec, mode, n_stages, spin, blocks,
                                                                      choice))
    return [*head, *loop_head(),
            block("for (unsigned long long tkx_k = 0; tkx_k < tkx_steps; ++tkx_k) {", indent(step), "}"),
            *loop_tail(program, spec)]


"""The fixed device code every generated kernel starts with, and the Python helpers that call it.

The prelude is plain CUDA C++ that needs no header (so kernels without tensor cores compile
in a few hundredths of a second with NVRTC). It holds:

* **dtype helpers**: storage types (``tkx_bf16`` and ``tkx_f16`` are 2-byte structs holding
  the raw bits, so a kernel parameter says what it points at), ``tkx_ld_<dtype>`` loads that
  widen to ``float``, ``tkx_st_<dtype>`` stores that round to the storage type, and
  ``tkx_round_<dtype>`` that rounds a float to the nearest value of a dtype and back. Every
  value is computed in fp32 registers and rounded to its IR dtype after each op, as eager
  PyTorch rounds each op's output;
* **NaN-propagating min/max** (``tkx_max``/``tkx_min``) as ``torch.maximum``/``amax`` behave;
* **barriers**: two grid barriers with a spin limit that record an error in ``status``
  instead of hanging (``Options.grid_barrier`` picks one: a monotonic arrival count, the default
  for grids of up to :data:`COUNTER_BARRIER_MAX_BLOCKS` blocks, or a generation counter) - and
  a block-mode twin with the same signature (``__syncthreads`` only);
* **warp and block reductions** (sum/max/min) through warp shuffles and shared memory.

Contracts a kernel must keep (the code generator's side):

* ``blockDim.x`` is a multiple of 32 and every thread of a block calls a barrier or a block
  reduction (no thread may have returned early);
* a grid barrier needs every block of the grid resident at once: the runtime sizes the grid
  from the occupancy calculator and launches cooperatively;
* buffers written by the kernel are never read through ``__ldg`` or ``const __restrict__``
  (the read-only cache is not coherent across a grid barrier);
* ``sync`` (2 words, 8-byte aligned) is zeroed once when allocated - the barrier leaves it ready
  for the next launch of the same grid size - and ``status`` (4 ints: code, stage, block, spare)
  is zeroed before a launch and read after it. After a barrier error ``sync`` must be zeroed again.
"""

from __future__ import annotations

# The error codes and the C storage types live in one table each, in the ABI module.
from .abi import (  # noqa: F401 - the prelude's names for them
    C_TYPES,
    ERR_BAD_LAUNCH,
    ERR_BARRIER_TIMEOUT,
    ERR_INDEX,
    ERROR_CODES,
    STATIC_SHARED_LIMIT,
)
from .text import dedent

#: Suffix of the ``tkx_ld_*``/``tkx_st_*``/``tkx_round_*`` helpers of each dtype.
SUFFIX = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64", "int32": "i32",
          "bool": "bool", "int8": "i8", "uint8": "u8"}


DTYPES = dedent(r"""
    // ---------------------------------------------------------------------------------
    // dtypes: floats and bools live in float registers (loads widen, stores round), integers
    // in long long registers (exact).
    // ---------------------------------------------------------------------------------
    #define TKX_INF __int_as_float(0x7f800000)
    #define TKX_NAN __int_as_float(0x7fffffff)

    struct __align__(2) tkx_bf16 { unsigned short bits; };  // bfloat16, raw bits
    struct __align__(2) tkx_f16 { unsigned short bits; };   // IEEE half, raw bits

    __device__ __forceinline__ float tkx_bf16_to_float(unsigned short bits) {
        return __uint_as_float((unsigned int)bits << 16);   // bf16 is the top half of a float
    }
    __device__ __forceinline__ unsigned short tkx_float_to_bf16(float x) {
        unsigned short bits;                                  // round to nearest even (sm_80+)
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
        return bits;
    }
    __device__ __forceinline__ float tkx_f16_to_float(unsigned short bits) {
        float x;
        asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(bits));
        return x;
    }
    __device__ __forceinline__ unsigned short tkx_float_to_f16(float x) {
        unsigned short bits;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(x));
        return bits;
    }

    // Loads: element i of a buffer, as float.
    #define TKX_INLINE __device__ __forceinline__
    TKX_INLINE float tkx_ld_f32(const float* p, long long i) { return p[i]; }
    // (16-bit floats are read as raw bits, so any 2-byte type works: tkx_bf16, __nv_bfloat16 ...)
    TKX_INLINE float tkx_ld_bf16(const void* p, long long i) {
        return tkx_bf16_to_float(static_cast<const unsigned short*>(p)[i]);
    }
    TKX_INLINE float tkx_ld_f16(const void* p, long long i) {
        return tkx_f16_to_float(static_cast<const unsigned short*>(p)[i]);
    }
    // Integers load into long long registers (exact); a float context converts them.
    TKX_INLINE long long tkx_ld_i64(const long long* p, long long i) { return p[i]; }
    TKX_INLINE long long tkx_ld_i32(const int* p, long long i) { return (long long)p[i]; }
    TKX_INLINE long long tkx_ld_i8(const signed char* p, long long i) { return (long long)p[i]; }
    TKX_INLINE long long tkx_ld_u8(const unsigned char* p, long long i) { return (long long)p[i]; }
    TKX_INLINE float tkx_ld_bool(const bool* p, long long i) { return p[i] ? 1.0f : 0.0f; }

    // Stores: round a float to the buffer's dtype (integers truncate toward zero, like .to()).
    TKX_INLINE void tkx_st_f32(float* p, long long i, float x) { p[i] = x; }
    TKX_INLINE void tkx_st_bf16(void* p, long long i, float x) {
        static_cast<unsigned short*>(p)[i] = tkx_float_to_bf16(x);
    }
    TKX_INLINE void tkx_st_f16(void* p, long long i, float x) {
        static_cast<unsigned short*>(p)[i] = tkx_float_to_f16(x);
    }
    TKX_INLINE void tkx_st_i64(long long* p, long long i, long long x) { p[i] = x; }
    TKX_INLINE void tkx_st_i32(int* p, long long i, long long x) { p[i] = (int)x; }
    TKX_INLINE void tkx_st_i8(signed char* p, long long i, long long x) { p[i] = (signed char)x; }
    TKX_INLINE void tkx_st_u8(unsigned char* p, long long i, long long x) { p[i] = (unsigned char)x; }
    TKX_INLINE void tkx_st_bool(bool* p, long long i, float x) { p[i] = x != 0.0f; }

    // Round a float to the nearest value of a dtype, kept as float (what a store then a load gives).
    TKX_INLINE float tkx_round_f32(float x) { return x; }
    TKX_INLINE float tkx_round_bf16(float x) { return tkx_bf16_to_float(tkx_float_to_bf16(x)); }
    TKX_INLINE float tkx_round_f16(float x) { return tkx_f16_to_float(tkx_float_to_f16(x)); }
    TKX_INLINE float tkx_round_bool(float x) { return x != 0.0f ? 1.0f : 0.0f; }

    // NaN-propagating max/min (torch.maximum, torch.amax): a NaN on either side wins.
    TKX_INLINE float tkx_max(float a, float b) { return (a != a || a >= b) ? a : b; }
    TKX_INLINE float tkx_min(float a, float b) { return (a != a || a <= b) ? a : b; }

    // Integer arithmetic in long long registers (exact), with Python's floor semantics where torch has them.
    #define TKX_INT64_MIN (-9223372036854775807LL - 1LL)
    #define TKX_INT64_MAX 9223372036854775807LL
    TKX_INLINE long long tkx_max(long long a, long long b) { return a >= b ? a : b; }
    TKX_INLINE long long tkx_min(long long a, long long b) { return a <= b ? a : b; }
    TKX_INLINE long long tkx_imax(long long a, long long b) { return a >= b ? a : b; }
    TKX_INLINE long long tkx_imin(long long a, long long b) { return a <= b ? a : b; }
    TKX_INLINE long long tkx_iabs(long long a) { return a < 0 ? -a : a; }
    TKX_INLINE long long tkx_ifloordiv(long long a, long long b) {
        long long q = a / b;
        return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
    }
    // torch.floor_divide on floats (ATen's div_floor): through fmod, so inf // y is nan and the
    // quotient is corrected where floor(a / b) would round across an integer.
    TKX_INLINE float tkx_floordivf(float a, float b) {
        if (b == 0.0f) return a / b;
        const float mod = fmodf(a, b);
        float div = (a - mod) / b;
        if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) div -= 1.0f;
        if (div == 0.0f) return copysignf(0.0f, a / b);
        float q = floorf(div);
        if (div - q > 0.5f) q += 1.0f;
        return q;
    }
    TKX_INLINE long long tkx_iremainder(long long a, long long b) {
        long long r = a % b;
        return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
    }
    // torch.remainder on floats: the result takes the sign of the divisor.
    TKX_INLINE float tkx_remainder(float a, float b) {
        float r = fmodf(a, b);
        return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
    }
    // An int64 ordering floats as torch.max does (the order_key op): -0.0 equals +0.0, NaN is above
    // +inf; argmax/max.dim/max_pool2d pack it with the position and take one exact integer max.
    TKX_INLINE long long tkx_order_key(float x) {
        if (x != x) return 2147483647LL;
        const int b = __float_as_int(x == 0.0f ? 0.0f : x);
        return (long long)(b >= 0 ? b : b ^ 0x7fffffff);
    }
    // torch.xlogy: 0 where x == 0 (unless y is NaN), else x * log(y).
    TKX_INLINE float tkx_xlogy(float x, float y) {
        if (y != y) return TKX_NAN;
        return x == 0.0f ? 0.0f : x * logf(y);
    }
""")


def _give_up(pad: int) -> str:
    """The check inside a grid barrier's poll loop, indented by ``pad`` spaces: every 64 polls, give up after
    ``spin_limit`` polls or once another block has failed, recording the stage (``ok = 0``, leave the loop)."""
    return "\n".join(" " * pad + line for line in (
        "if ((++polls & 63) == 0 && (polls > spin_limit || tkx_ld_volatile(status) != 0)) {",
        "    tkx_fail(status, TKX_ERR_BARRIER_TIMEOUT, stage);",
        "    ok = 0;",
        "    break;",
        "}"))


BARRIERS = dedent(r"""
    // ---------------------------------------------------------------------------------
    // Barriers between stages. Both return false when the kernel must stop (an error
    // was recorded in status[0], the failing stage in status[1]); every thread of the
    // block gets the same answer, so `if (!barrier(...)) return;` exits the block whole.
    // ---------------------------------------------------------------------------------
    #define TKX_ERR_BARRIER_TIMEOUT 1
    #define TKX_ERR_BAD_LAUNCH 2

    // Memory operations with explicit ordering (PTX memory model, GPU scope).
    __device__ __forceinline__ unsigned int tkx_ld_acquire(const unsigned int* p) {
        unsigned int v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
        return v;
    }
    __device__ __forceinline__ unsigned int tkx_atom_add_acq_rel(unsigned int* p, unsigned int v) {
        unsigned int old;
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
        return old;
    }
    __device__ __forceinline__ void tkx_st_relaxed(unsigned int* p, unsigned int v) {
        asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
    }
    __device__ __forceinline__ void tkx_red_add_release(unsigned int* p, unsigned int v) {
        asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
    }
    __device__ __forceinline__ int tkx_ld_volatile(const int* p) { return *(const volatile int*)p; }

    // Record an error (the first one wins): status[0] the code, status[1] the stage,
    // status[2] the block that saw it.
    __device__ __forceinline__ void tkx_fail(int* status, int code, int stage) {
        if (atomicCAS(status, 0, code) == 0) {
            atomicExch(status + 1, stage);
            atomicExch(status + 2, (int)blockIdx.x);
        }
    }

    // Generation grid barrier (grid_barrier="generation"). sync[0] counts the blocks that arrived,
    // sync[1] is the generation.
    // The last block to arrive resets the count and bumps the generation, which releases
    // the others; so the pair needs zeroing only once and serves every later barrier and
    // launch. Each block counts the generations itself (`gen`, read once at kernel entry by
    // tkx_barrier_init and incremented by the caller), so arriving costs one atomic, no read.
    // A waiting block gives up after spin_limit polls (or when another block has already
    // failed) and reports the stage instead of hanging the GPU.
    // Ordering: the arrival is a release (this block's writes, made visible to thread 0 by
    // __syncthreads, are published) and an acquire (the last block sees everyone's writes);
    // the generation bump is a release and the waiters' polls are acquires.
    __device__ __forceinline__ unsigned int tkx_barrier_init(const unsigned int* sync) {
        return tkx_ld_acquire(sync + 1);  // no barrier of this launch can have opened yet
    }

    __device__ __forceinline__ bool tkx_grid_barrier_generation(unsigned int* sync, unsigned int gen, int* status,
                                                             int stage, unsigned long long spin_limit) {
        __shared__ int ok;
        __syncthreads();                                       // this block has finished the stage
        if (threadIdx.x == 0) {
            ok = 1;
            unsigned int* count = sync;
            unsigned int* generation = sync + 1;
            if (tkx_atom_add_acq_rel(count, 1u) == gridDim.x - 1) {
                tkx_st_relaxed(count, 0u);                     // last one in: re-arm ...
                tkx_red_add_release(generation, 1u);           // ... and open the barrier
            } else {
                unsigned long long polls = 0;
                while (tkx_ld_acquire(generation) == gen) {
""" + _give_up(20) + r"""
                }
            }
        }
        __syncthreads();
        return ok != 0;
    }

    // Arrival-counter grid barrier (grid_barrier="counter"). sync[0..1] is one 64-bit count of
    // arrivals that only grows: each block adds 1 per barrier with a release reduction (no value
    // comes back, so arriving is no round trip) and polls with acquires until the count reaches
    // its target, base + (barriers passed + 1) x gridDim.x. The base is read at kernel entry and
    // rounded down to a multiple of gridDim.x: the count is a multiple of the grid at every launch
    // start (each launch adds barriers x gridDim.x), and a block reading it late sees at most
    // gridDim.x - 1 arrivals of this launch (the first barrier cannot open before it arrives).
    // So the words serve every later launch and graph replay of the same grid without a reset;
    // after an error (a block that never arrived) the runtime zeroes them, as for the generation
    // barrier. The critical path is the last arrival's one-way reduction and a poll's round trip.
    __device__ __forceinline__ unsigned long long tkx_ld_acquire_u64(const unsigned long long* p) {
        unsigned long long v;
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        return v;
    }
    __device__ __forceinline__ void tkx_red_add_release_u64(unsigned long long* p, unsigned long long v) {
        asm volatile("red.release.gpu.global.add.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
    }
    __device__ __forceinline__ unsigned long long tkx_arrivals_base(const unsigned int* sync) {
        const unsigned long long v = tkx_ld_acquire_u64((const unsigned long long*)sync);
        return v - v % gridDim.x;
    }

    __device__ __forceinline__ bool tkx_grid_barrier(unsigned int* sync, unsigned long long target,
                                                  int* status, int stage, unsigned long long spin_limit) {
        __shared__ int ok;
        __syncthreads();                                       // this block has finished the stage
        if (threadIdx.x == 0) {
            ok = 1;
            unsigned long long* arrivals = (unsigned long long*)sync;
            tkx_red_add_release_u64(arrivals, 1ull);           // arrive: publishes this block's writes
            unsigned long long polls = 0;
            while (tkx_ld_acquire_u64(arrivals) < target) {    // ... and sees everyone's once it opens
""" + _give_up(16) + r"""
            }
        }
        __syncthreads();
        return ok != 0;
    }

    // Block mode (a one-block grid): the same call, only __syncthreads.
    __device__ __forceinline__ bool tkx_block_barrier(unsigned int* sync, unsigned int gen, int* status,
                                                      int stage, unsigned long long spin_limit) {
        __syncthreads();
        return true;
    }

    // Checked once at kernel entry: the code assumes this many threads per block.
    __device__ __forceinline__ bool tkx_check_launch(int* status, unsigned int threads) {
        if (blockDim.x == threads && blockDim.y == 1 && blockDim.z == 1) return true;
        if (threadIdx.x == 0) tkx_fail(status, TKX_ERR_BAD_LAUNCH, -1);
        return false;
    }
""")


REDUCTIONS = dedent(r"""
    // ---------------------------------------------------------------------------------
    // Reductions across a warp and across a block (blockDim.x a multiple of 32; every
    // thread of the warp/block must call them). The block versions return the result
    // to every thread.
    // ---------------------------------------------------------------------------------
    // Each op works on float and on long long (integer reductions are exact).
    struct tkx_sum_op {
        template <class T> static __device__ __forceinline__ T identity() { return T(0); }
        template <class T> static __device__ __forceinline__ T apply(T a, T b) { return a + b; }
    };
    struct tkx_max_op {
        template <class T> static __device__ __forceinline__ T identity();
        template <class T> static __device__ __forceinline__ T apply(T a, T b) { return tkx_max(a, b); }
    };
    template <> __device__ __forceinline__ float tkx_max_op::identity<float>() { return -TKX_INF; }
    template <> __device__ __forceinline__ long long tkx_max_op::identity<long long>() { return TKX_INT64_MIN; }
    struct tkx_min_op {
        template <class T> static __device__ __forceinline__ T identity();
        template <class T> static __device__ __forceinline__ T apply(T a, T b) { return tkx_min(a, b); }
    };
    template <> __device__ __forceinline__ float tkx_min_op::identity<float>() { return TKX_INF; }
    template <> __device__ __forceinline__ long long tkx_min_op::identity<long long>() { return TKX_INT64_MAX; }

    template <class Op, class T>
    __device__ __forceinline__ T tkx_warp_reduce(T v) {
        #pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1)      // butterfly: all lanes get the result
            v = Op::template apply<T>(v, __shfl_xor_sync(0xffffffffu, v, offset));
        return v;
    }

    template <class Op, class T>
    __device__ __forceinline__ T tkx_block_reduce(T v) {
        __shared__ T partial[32];                            // one slot per warp
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        const int warps = (blockDim.x + 31) >> 5;
        v = tkx_warp_reduce<Op, T>(v);
        __syncthreads();                                     // a previous call may still read partial[]
        if (lane == 0) partial[warp] = v;
        __syncthreads();
        v = lane < warps ? partial[lane] : Op::template identity<T>();   // every warp folds the partials
        return tkx_warp_reduce<Op, T>(v);
    }

    template <class T> __device__ __forceinline__ T tkx_warp_sum(T v) { return tkx_warp_reduce<tkx_sum_op, T>(v); }
    template <class T> __device__ __forceinline__ T tkx_warp_max(T v) { return tkx_warp_reduce<tkx_max_op, T>(v); }
    template <class T> __device__ __forceinline__ T tkx_warp_min(T v) { return tkx_warp_reduce<tkx_min_op, T>(v); }
    template <class T> __device__ __forceinline__ T tkx_block_sum(T v) { return tkx_block_reduce<tkx_sum_op, T>(v); }
    template <class T> __device__ __forceinline__ T tkx_block_max(T v) { return tkx_block_reduce<tkx_max_op, T>(v); }
    template <class T> __device__ __forceinline__ T tkx_block_min(T v) { return tkx_block_reduce<tkx_min_op, T>(v); }

    // An index out of range: record it (the first error wins) with the op's number in
    // status[1], so the runtime can name the op and the user's line.
    #define TKX_ERR_INDEX 3
    __device__ __forceinline__ long long tkx_check_index(int* status, long long j, long long n, int op) {
        if (j < 0 || j >= n) {
            tkx_fail(status, TKX_ERR_INDEX, op);
            return 0;                                        // a safe address; the result is discarded
        }
        return j;
    }
""")

#: Philox-4x32-10 (tkx.ops.philox_uniform is the same algorithm in torch): one 4-word block per call.
RANDOM = dedent(r"""
    TKX_INLINE float tkx_philox_uniform(long long seed, long long offset, long long counter, int word) {
        unsigned int c0 = (unsigned int)counter, c1 = (unsigned int)((unsigned long long)counter >> 32);
        unsigned int c2 = (unsigned int)offset, c3 = (unsigned int)((unsigned long long)offset >> 32);
        unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)((unsigned long long)seed >> 32);
        #pragma unroll
        for (int r = 0; r < 10; ++r) {
            if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
            unsigned long long p0 = (unsigned long long)0xD2511F53u * c0;
            unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c2;
            unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0, n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
            c1 = (unsigned int)p1; c3 = (unsigned int)p0; c0 = n0; c2 = n2;
        }
        unsigned int w = word == 0 ? c0 : word == 1 ? c1 : word == 2 ? c2 : c3;
        return (float)(w >> 8) * 5.9604644775390625e-08f;  /* 2^-24: exact */
    }
""")

#: Headers a kernel with tensor-core GEMMs includes (``nvcuda::wmma``, ``__nv_bfloat16``, ``__half``).
TENSOR_CORE_INCLUDES = dedent("""
    #include <mma.h>
    #include <cuda_bf16.h>
    #include <cuda_fp16.h>
""")

#: The prelude of a kernel without tensor cores (no header needed).
PRELUDE = "\n\n".join(["// ===== tkx prelude (fixed device code) =====", DTYPES, BARRIERS, REDUCTIONS, RANDOM,
                       "// ===== end of tkx prelude ====="])


#: Words of ``sync`` before the counters: barrier (0, 1), epoch (2), exit count (3), status (4..7),
#: a timed-out wait's counter value and threshold (8, 9), spare (10, 11).
COUNTER_BASE = 12
ERR_WAIT_TIMEOUT = 4

COUNTERS = dedent(r"""
    // ---------------------------------------------------------------------------------
    // Dataflow counters (sync="counters"). Counter k (sync[12 + k]) is bumped once by each
    // task of the group that owns it, after the task's tile is written (a release); a task
    // that depends on that group waits (an acquire) until the counter has risen by the
    // group's task count in this launch. Counters are never reset: the epoch (sync[2], the
    // number of launches completed) gives this launch's base, epoch * threshold, compared
    // with 32-bit wrap-around; the last block to leave bumps the epoch (sync[3] counts the
    // blocks that left). So CUDA-graph replays and repeated launches need no reset kernel.
    // A wait gives up after spin_limit polls (or when another block failed): status[0] = 4,
    // status[1] = the waiting task's item, status[2] = its block, status[3] = (position of
    // its group << 16) | counter, sync[8] = the counter's value in this launch, sync[9] = the
    // threshold.
    // ---------------------------------------------------------------------------------
    #define TKX_ERR_WAIT_TIMEOUT 4

    __device__ __forceinline__ unsigned int tkx_counters_init(const unsigned int* sync) {
        return tkx_ld_acquire(sync + 2);  // changes only after every block of this launch has left
    }

    __device__ __forceinline__ bool tkx_wait(unsigned int* sync, unsigned int epoch, int* status, int counter,
                                             unsigned int threshold, int group, int item,
                                             unsigned long long spin_limit) {
        __shared__ int ok;
        if (threadIdx.x == 0) {
            ok = 1;
            const unsigned int* c = sync + 12 + counter;
            const unsigned int base = epoch * threshold;
            unsigned long long polls = 0;
            while ((int)(tkx_ld_acquire(c) - base) < (int)threshold) {
                if ((++polls & 63) == 0 && (polls > spin_limit || tkx_ld_volatile(status) != 0)) {
                    if (atomicCAS(status, 0, TKX_ERR_WAIT_TIMEOUT) == 0) {
                        atomicExch(sync + 8, tkx_ld_acquire(c) - base);
                        atomicExch(sync + 9, threshold);
                        atomicExch(status + 1, item);
                        atomicExch(status + 2, (int)blockIdx.x);
                        atomicExch(status + 3, (group << 16) | counter);
                    }
                    ok = 0;
                    break;
                }
            }
            __threadfence();
        }
        __syncthreads();
        return ok != 0;
    }

    // After a task: every thread's writes are done (__syncthreads), then publish them.
    __device__ __forceinline__ void tkx_task_done(unsigned int* sync, int counter) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            tkx_red_add_release(sync + 12 + counter, 1u);
        }
    }

    // At kernel exit: the last block to leave advances the epoch for the next launch.
    __device__ __forceinline__ void tkx_counters_exit(unsigned int* sync) {
        __syncthreads();
        if (threadIdx.x == 0 && tkx_atom_add_acq_rel(sync + 3, 1u) == gridDim.x - 1) {
            tkx_st_relaxed(sync + 3, 0u);
            tkx_red_add_release(sync + 2, 1u);
        }
    }
""")

#: The protocol audit (``generate(..., audit=True)``): what the counters protocol executed, logged in ``sync``
#: words past the counters for a post-run check (:mod:`tkx.dataflow.audit`), and the broken variants of its
#: steps that a planted fault selects (:attr:`tkx.dataflow.TaskDAG.unfenced`, ``epoch_step``).
AUDIT = dedent(r"""
    // ---------------------------------------------------------------------------------
    // Protocol audit. After each wait that passed, its task counts the pass in log[0] and records
    // (counter << 16) | threshold in log[1]; after each fenced publish its task counts it in the
    // counter's publish word. A post-run check compares them with the task DAG: every wait passed by
    // every task with the DAG's counter and threshold, every bump fenced, the epoch advanced once per
    // launch. The unfenced publish and the frozen exit are planted faults, never emitted otherwise.
    // ---------------------------------------------------------------------------------
    __device__ __forceinline__ void tkx_audit_wait(unsigned int* log, int counter, unsigned int threshold) {
        if (threadIdx.x == 0) {
            atomicAdd(log, 1u);
            atomicExch(log + 1, ((unsigned int)counter << 16) | threshold);
        }
    }
    __device__ __forceinline__ void tkx_audit_publish(unsigned int* word) {
        if (threadIdx.x == 0) atomicAdd(word, 1u);
    }
    // Planted fault: the bump without a release fence (relaxed: may become visible before the tile).
    __device__ __forceinline__ void tkx_task_done_unfenced(unsigned int* sync, int counter) {
        __syncthreads();
        if (threadIdx.x == 0) {
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" :: "l"(sync + 12 + counter), "r"(1u) : "memory");
        }
    }
    // Planted fault: the last block out resets the exit count but leaves the epoch where it was.
    __device__ __forceinline__ void tkx_counters_exit_frozen(unsigned int* sync) {
        __syncthreads();
        if (threadIdx.x == 0 && tkx_atom_add_acq_rel(sync + 3, 1u) == gridDim.x - 1) {
            tkx_st_relaxed(sync + 3, 0u);
        }
    }
""")

TIMELINE = dedent(r"""
    // ---------------------------------------------------------------------------------
    // Per-task timeline (Options(timeline=True)): task t writes timeline[4t..4t+3] =
    // (block << 32 | t, start ns, end ns, ns spent waiting before start), from %globaltimer.
    // ---------------------------------------------------------------------------------
    __device__ __forceinline__ unsigned long long tkx_now() {
        unsigned long long t;
        asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
        return t;
    }
    __device__ __forceinline__ void tkx_record(unsigned long long* timeline, int task, unsigned long long ready,
                                               unsigned long long start) {
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long* r = timeline + 4 * (long long)task;
            r[0] = ((unsigned long long)blockIdx.x << 32) | (unsigned int)task;
            r[1] = start;
            r[2] = tkx_now();
            r[3] = start - ready;
        }
    }
""")


#: Bulk tensor copies (TMA, sm_90) completing on shared-memory mbarriers, for the wgmma GEMMs.
TMA = r"""// ---- bulk tensor copies (TMA) and mbarriers (sm_90) ----
// One 2-D box of the tensor map at `map` (a global address) at element coordinates (x inner, y outer)
// -> shared address `dst` (1024-byte aligned for the 128-byte swizzle); completes on mbarrier `bar`.
TKX_INLINE void tkx_tma2d(unsigned dst, unsigned long long map, int x, int y, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" :: "r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar) : "memory");
}
// Wait until the phase of mbarrier `bar` with parity `parity` has completed.
TKX_INLINE void tkx_mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}"""


def prelude(*, tensor_cores: bool = False, counters: bool = False, timeline: bool = False, tma: bool = False,
            audit: bool = False) -> str:
    """The device code to put at the top of a kernel (``tensor_cores`` adds the WMMA headers,
    ``counters`` the dataflow counters, ``timeline`` the per-task timer, ``tma`` the bulk tensor
    copy and mbarrier helpers, ``audit`` with ``counters`` the protocol audit, :data:`AUDIT`)."""
    text = PRELUDE
    extra = ([COUNTERS] if counters else []) + ([AUDIT] if counters and audit else []) + \
        ([TIMELINE] if timeline else []) + ([TMA] if tma else [])
    if extra:
        text = PRELUDE.replace("// ===== end of tkx prelude =====", "\n\n".join(extra) + "\n\n"
                               "// ===== end of tkx prelude =====")
    return (TENSOR_CORE_INCLUDES + "\n\n" + text) if tensor_cores else text


# --------------------------------------------------------------------------------------
# Python helpers that write calls into the prelude
# --------------------------------------------------------------------------------------
def c_type(dtype: str) -> str:
    """The C storage type of an IR dtype (``bfloat16`` -> ``tkx_bf16``)."""
    return C_TYPES[dtype]


def load(dtype: str, pointer: str, index: str) -> str:
    """C expression: element ``index`` of ``pointer`` (a buffer of ``dtype``) as float."""
    return f"tkx_ld_{SUFFIX[dtype]}({pointer}, {index})"


def store(dtype: str, pointer: str, index: str, value: str) -> str:
    """C statement: round ``value`` to ``dtype`` and write it to element ``index``."""
    return f"tkx_st_{SUFFIX[dtype]}({pointer}, {index}, {value});"


def round_to(dtype: str, expr: str) -> str:
    """C expression: ``expr`` rounded to ``dtype`` and kept in its register type.

    Floats stay ``float`` (identity for float32, the nearest bf16/f16 value otherwise), bools
    become ``0.0f``/``1.0f``; integers are ``long long`` expressions already (int32 wraps to
    32 bits, as a store and a load would)."""
    if dtype in ("float32", "int64"):
        return expr
    if dtype == "int32":
        return f"(long long)(int)({expr})"
    if dtype in ("int8", "uint8"):
        return f"(long long)({'signed' if dtype == 'int8' else 'unsigned'} char)({expr})"
    return f"tkx_round_{SUFFIX[dtype]}({expr})"


#: The grid barriers (``Options.grid_barrier``). ``"counter"``: every block adds 1 to a monotonic 64-bit
#: arrival count (``red.release``, no value returned) and polls it with acquires until it reaches this
#: barrier's target (the base is read at kernel entry): one one-way reduction and one poll round trip on the
#: critical path. ``"generation"``: the block whose acquire-release atomic returns ``gridDim.x - 1`` re-arms
#: the count and bumps a generation the others poll: three dependent trips to L2. ``"auto"`` (the default):
#: ``"counter"`` for grids of at most :data:`COUNTER_BARRIER_MAX_BLOCKS` blocks, else ``"generation"``.
#: Both use ``sync`` words 0..1, need zeroing only after an error, and report a timeout with the stage.
#: Measured on the H200 (CUDA-graph replays): the barrier alone over 132 / 264 / 396 / 528 / 1056 blocks
#: 1.01 / 1.30 / 1.63 / 1.84 / 3.13 µs (counter) against 1.51 / 1.63 / 1.79 / 1.94 / 2.76 µs (generation:
#: at 1056 blocks the pollers of the address the arrivals add to slow the counter one); in ``small``'s step
#: the gaps between stages 1.15-1.44 -> 0.74-0.93 µs. Steps: small 24.96 -> 21.79 µs, medium 69.15 ->
#: 65.73, cnn_digits 156.2 -> 146.2, gpt_block 114.5 -> 100.6.
GRID_BARRIERS = ("counter", "generation")
#: Largest grid (blocks) for which ``grid_barrier="auto"`` takes the counter barrier (the largest
#: measured size where it was the quicker one; 4 blocks per SM of the H200).
COUNTER_BARRIER_MAX_BLOCKS = 528


def grid_barrier_kind(blocks: int | None = None, choice: str = "auto") -> str:
    """The grid barrier (one of :data:`GRID_BARRIERS`) for a grid of at most ``blocks`` blocks
    (``None``: unknown, taken as small) under ``choice`` (``Options.grid_barrier``: ``"auto"`` or one of
    :data:`GRID_BARRIERS`); raises ``ValueError`` for any other choice."""
    if choice == "auto":
        return "counter" if blocks is None or blocks <= COUNTER_BARRIER_MAX_BLOCKS else "generation"
    if choice not in GRID_BARRIERS:
        raise ValueError(f"grid_barrier must be 'auto' or one of {GRID_BARRIERS}, not {choice!r}")
    return choice


def barrier_setup(mode: str, blocks: int | None = None, choice: str = "auto") -> str:
    """C statement at kernel entry (before any early return): the barrier's per-block state
    (``blocks``, ``choice``: the most blocks the grid will have and ``Options.grid_barrier``, see
    :func:`grid_barrier_kind`)."""
    if mode == "grid":
        if grid_barrier_kind(blocks, choice) == "counter":
            return ("unsigned long long tkx_gen = tkx_arrivals_base(sync);  // arrivals before this launch "
                    "(the next barrier opens at tkx_gen + gridDim.x)")
        return "unsigned int tkx_gen = tkx_barrier_init(sync);  // the generation the next barrier ends"
    return "unsigned int tkx_gen = 0;  // unused in block mode"


def barrier(mode: str, stage: int | str, *, spin_limit: str = "spin_limit", blocks: int | None = None,
            choice: str = "auto") -> str:
    """C statement ending stage ``stage - 1``: a grid or block barrier that exits the kernel on error.

    ``stage`` (a number or a C expression) is what ``status[1]`` records if the barrier fails.
    Expects ``sync``, ``status`` and ``tkx_gen`` (from :func:`barrier_setup`) in scope, and
    ``spin_limit`` (a kernel parameter or a constant; pass its C text). ``blocks`` and ``choice``: as
    for :func:`barrier_setup` (pass the same values to both).
    """
    fn = {"grid": "tkx_grid_barrier_generation", "block": "tkx_block_barrier"}[mode]
    if mode == "grid" and grid_barrier_kind(blocks, choice) == "counter":
        return (f"if (!tkx_grid_barrier(sync, tkx_gen += gridDim.x, status, {stage}, {spin_limit})) return;"
                f"  // before stage {stage}")
    return f"if (!{fn}(sync, tkx_gen++, status, {stage}, {spin_limit})) return;  // before stage {stage}"


def shared_workspace(nbytes: int, name: str = "tkx_smem") -> str:
    """Declaration of the block's one shared-memory workspace, which every emitter carves up.

    Emitters never declare their own big ``__shared__`` arrays: they take a pointer to this
    workspace and report how many bytes they need, and the kernel declares it once with the
    largest need over all its groups (groups of different stages reuse the same bytes, which
    the barrier between stages makes safe). Up to 48 KiB it is a static array (so ptxas reports
    it); above that it is ``extern __shared__`` and the launch passes the size (the runtime
    must raise ``cudaFuncAttributeMaxDynamicSharedMemorySize``).
    """
    nbytes = max(16, (nbytes + 15) // 16 * 16)
    if nbytes <= STATIC_SHARED_LIMIT:
        return f"__shared__ __align__(128) unsigned char {name}[{nbytes}];  // shared workspace, all groups"
    return (f"extern __shared__ __align__(128) unsigned char {name}[];  "
            f"// shared workspace: {nbytes} bytes, sized at launch")

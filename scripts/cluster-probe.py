#!/usr/bin/env python3
"""cluster-probe.py [--out FILE.json] [--shared-kib 0,100,200,227]

Device probe for 2-CTA thread-block clusters in tkx's persistent (grid-barrier) kernels: does the
driver take a cooperative launch together with a cluster dimension (``cuLaunchKernelEx`` with both
``CU_LAUNCH_ATTRIBUTE_COOPERATIVE`` and ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``, through
``cuda.core``'s ``LaunchConfig(cluster=2, is_cooperative=True)``); how many 2-block clusters are
co-resident at a given dynamic shared memory per block (``cuOccupancyMaxActiveClusters``) against
blocks/SM x SMs; and whether a software grid barrier across every block (atomics on a global word,
as tkx's) and a remote mbarrier arrival in the partner CTA (``mapa`` + ``mbarrier.arrive.shared::cluster``)
work in such a launch. Also tries the non-cooperative cluster launch and a cooperative cluster
launch larger than the co-resident maximum (expected to be refused). Needs a Hopper GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(256, 1) probe(unsigned* sync, unsigned* out, int rounds,
                                                        unsigned spin_limit) {
    extern __shared__ __align__(1024) unsigned char dyn[];
    __shared__ __align__(8) unsigned long long bar;
    unsigned rank, cid, smid, nrank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(nrank));
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        if (spin_limit == 0) dyn[0] = 1;  // (never: keeps the dynamic shared array in the kernel)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    unsigned remote_ok = 0;
    if (threadIdx.x == 0 && nrank == 2) {  // arrive on the partner's mbarrier, then wait for its arrival on ours
        unsigned rb;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(b), "r"(rank ^ 1u));
        asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(rb) : "memory");
        unsigned done = 0, spins = 0;
        while (!done && spins < spin_limit) {
            asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
                         "selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(b) : "memory");
            ++spins;
        }
        remote_ok = done;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    // software grid barrier: `rounds` times every block bumps sync[0] and waits for the round's total;
    // after each, block 0.. checks the slot the previous block wrote in that round
    unsigned bad = 0, timeout = 0;
    for (int r = 0; r < rounds; ++r) {
        if (threadIdx.x == 0) {
            out[gridDim.x * 8 + (r & 1) * gridDim.x + blockIdx.x] = r + blockIdx.x;
            __threadfence();
            atomicAdd(sync, 1u);
            const unsigned want = (unsigned)(r + 1) * gridDim.x;
            unsigned spins = 0;
            while (*(volatile unsigned*)sync < want) {
                if (++spins > spin_limit) { timeout = 1; break; }
            }
            __threadfence();
            const unsigned prev = (blockIdx.x + gridDim.x - 1) % gridDim.x;
            if (!timeout && *(volatile unsigned*)&out[gridDim.x * 8 + (r & 1) * gridDim.x + prev] != r + prev) ++bad;
        }
        __syncthreads();
        if (timeout) break;
    }
    if (threadIdx.x == 0) {
        unsigned* o = out + blockIdx.x * 8;
        o[0] = rank; o[1] = cid; o[2] = smid; o[3] = nrank | (gridDim.x << 8);
        o[4] = remote_ok; o[5] = bad; o[6] = timeout; o[7] = 0xC0FFEEu;
    }
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shared-kib", default="0,100,200,227")
    args = ap.parse_args()
    import cuda.core as core
    from cuda.bindings import driver
    from cuda.core import LaunchConfig

    from tkx.codegen import nvrtc
    from tkx.runtime.device import make_current

    dev = torch.device("cuda", 0)
    torch.cuda.init()
    make_current(dev)
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    report = nvrtc.compile_cuda(KERNEL, "sm_90a")
    obj = core.ObjectCode.from_cubin(report.cubin)
    kern = obj.get_kernel("probe")
    result = {"device": torch.cuda.get_device_name(dev), "sms": sms, "cuda_core": getattr(core, "__version__", "?"),
              "driver": driver.cuDriverGetVersion()[1], "cases": []}
    print(f"device {result['device']}, {sms} SMs, cuda.core {result['cuda_core']}, driver {result['driver']}")
    handle = kern.handle
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    stream = core.Stream.from_handle(int(torch.cuda.current_stream(dev).cuda_stream))

    def set_shared(nbytes: int) -> None:
        if isinstance(handle, driver.CUkernel):
            (err,) = driver.cuKernelSetAttribute(attr, nbytes, handle, driver.CUdevice(0))
        else:
            (err,) = driver.cuFuncSetAttribute(driver.CUfunction(int(handle)), attr, nbytes)
        assert int(err) == 0, err

    def run(grid_blocks: int, shmem: int, cluster: int | None, cooperative: bool) -> dict:
        sync = torch.zeros(4, dtype=torch.int32, device=dev)
        out = torch.zeros(grid_blocks * 10 + 16, dtype=torch.int32, device=dev)
        case = {"blocks": grid_blocks, "shared": shmem, "cluster": cluster, "cooperative": cooperative}
        try:
            from tkx.runtime.kernel import _cluster_grid_arg  # the runtime's LaunchConfig.grid for clusters

            grid = _cluster_grid_arg(core, grid_blocks, cluster) if cluster else grid_blocks
            cfg = (LaunchConfig(grid=grid, cluster=cluster, block=256, shmem_size=shmem, is_cooperative=cooperative)
                   if cluster else LaunchConfig(grid=grid, block=256, shmem_size=shmem, is_cooperative=cooperative))
            import ctypes
            t0 = time.perf_counter()
            core.launch(stream, cfg, kern, ctypes.c_uint64(sync.data_ptr()), ctypes.c_uint64(out.data_ptr()),
                        ctypes.c_int32(20), ctypes.c_uint32(2_000_000))
            torch.cuda.synchronize(dev)
            case["seconds"] = round(time.perf_counter() - t0, 4)
        except Exception as e:  # the refusal is the finding
            case["refused"] = f"{type(e).__name__}: {e}"[:300]
            try:
                torch.cuda.synchronize(dev)
            except Exception as e2:
                case["sticky"] = str(e2)[:200]
            return case
        o = out[: grid_blocks * 8].view(grid_blocks, 8).cpu().tolist()
        case["all_ran"] = all(r[7] == 0xC0FFEE for r in o)
        case["gridDim_x"] = sorted({r[3] >> 8 for r in o})  # what the kernel saw: blocks, not clusters
        case["cluster_size_seen"] = sorted({r[3] & 255 for r in o})
        case["remote_arrive_ok"] = all(r[4] == 1 for r in o) if cluster else None
        case["barrier_timeouts"] = sum(r[6] for r in o)
        case["barrier_bad"] = sum(r[5] for r in o)
        case["rank_is_block_parity"] = all(r[0] == i % (cluster or 1) for i, r in enumerate(o)) if cluster else None
        case["clusterid_is_block_half"] = all(r[1] == i // (cluster or 1) for i, r in enumerate(o)) if cluster else None
        case["distinct_sms"] = len({r[2] for r in o})
        pairs = [(o[i][2], o[i + 1][2]) for i in range(0, grid_blocks - 1, 2)] if cluster else []
        case["pair_sm_sample"] = pairs[:6]
        return case

    for kib in [int(x) for x in args.shared_kib.split(",")]:
        shmem = min(kib * 1024, int(props.shared_memory_per_block_optin) - 1024) if kib else 0
        if shmem:
            set_shared(shmem)
        occ = kern.occupancy.max_active_blocks_per_multiprocessor(256, shmem)
        info = {"shared": shmem, "blocks_per_sm": occ, "co_resident_blocks": occ * sms}
        for coop in (False, True):
            try:
                cfg = LaunchConfig(grid=1, cluster=2, block=256, shmem_size=shmem, is_cooperative=coop)
                info[f"max_active_clusters{'_coop' if coop else ''}"] = kern.occupancy.max_active_clusters(
                    cfg, stream=stream)
            except Exception as e:
                info[f"max_active_clusters{'_coop' if coop else ''}"] = f"{type(e).__name__}: {e}"[:200]
        print("occupancy", json.dumps(info))
        result.setdefault("occupancy", []).append(info)
        most = info.get("max_active_clusters")
        most = most if isinstance(most, int) else occ * sms // 2
        tries = [(2 * most, 2, True), (2 * most, 2, False), (occ * sms, None, True)]
        tries.append((2 * most + 2, 2, True))  # one cluster more than co-resident, cooperative: expected refusal
        if 2 * most < occ * sms:
            tries.append((occ * sms, 2, True))   # more than co-resident: expected refusal
            tries.append((occ * sms, 2, False))  # non-cooperative, grid larger than co-resident: may hang -> spin cap
        for blocks, cl, coop in tries:
            c = run(blocks, shmem, cl, coop)
            print("launch", json.dumps(c))
            result["cases"].append(c)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

// What a launcher asks about the device before it sizes a persistent grid
// or a shared-memory ring (defined in device.cu, cached per device and per
// kernel configuration, so a launch pays for the queries once).
#pragma once

#include "gemsops/status.h"

namespace gemsops {

// Devices the caches below hold facts of (ordinals 0 to kMaxDevices - 1).
constexpr int kMaxDevices = 64;

// Facts about a device, read once and cached.
struct device_facts {
    int sm_count;
    int cc_major, cc_minor;
    int smem_per_block_optin; // bytes of shared memory one CTA may ask for
    int smem_per_sm; // bytes of shared memory of one SM
    int l2_bytes; // L2 cache size
};
int get_device_facts(int device, device_facts *out, gemsops_status *st);
// The wgmma kernels run here: this build holds sm_90a code and the GPU is
// an sm_90.
inline bool wgmma_runs(const device_facts &f)
{
#ifdef GEMSOPS_HAVE_SM90A
    return f.cc_major == 9 && f.cc_minor == 0;
#else
    (void)f;
    return false;
#endif
}

// CTAs of `kernel` (launched with `block` threads and `smem` bytes of
// dynamic shared memory) that fit on the whole device at once, from the
// occupancy calculator; cached per (kernel, device, block, smem). It first
// raises the kernel's dynamic shared-memory limit to `smem` (needed once
// static plus dynamic exceed 48 KB). The caller must have made `device`
// current.
int resident_ctas(const void *kernel, int device, int block, int smem,
                  int *out, gemsops_status *st);

// Clusters of `cluster` CTAs of `kernel` along x that fit on the device at
// once (0: the kernel cannot run so); cached and limit-raising likewise.
int resident_clusters(const void *kernel, int device, int block, int smem,
                      int cluster, int *out, gemsops_status *st);

} // namespace gemsops

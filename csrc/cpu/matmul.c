/* Stream-K matmul on the CPU: the CUDA kernel's schedule and fix-up, with
 * OpenMP threads standing in for CTAs, so that CI runs the decomposition.
 *
 * Each "CTA" c walks its Stream-K share piece by piece (streamk.h), then
 * its data-parallel tiles. A piece that stops short of its tile's last
 * k-iteration is a peer's: its fp32 partial goes to the CTA's slot, then
 * the CTA's flag is raised (release). The piece holding a split tile's
 * last k-iteration is its owner's: it waits for each peer's flag in
 * decreasing CTA order (acquire) and adds the partials in that order. CTAs
 * are handed out in increasing number (dynamic schedule): every peer
 * (lower number) has started before its owner can wait for it, so any
 * thread count finishes.
 *
 * Tile math: A and B panels are widened to fp32 once per k-step; each
 * k-step's rank-BK update is summed in a BM x BN fp32 buffer of its own
 * and then added to the tile's accumulator, so that an element's rounding
 * error grows with BK + K / BK additions rather than K (a single running
 * sum over K = 16384 came out 2-3x further from a float64 product than
 * torch's CPU BLAS). C is rounded once, after the epilogue
 * (alpha * acc + beta * bias) in fp32. A's row sums, when asked, are a
 * loop of their own. */
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "gemsops/matmul.h"
#include "parallel.h"

enum { CPU_BM = 64, CPU_BN = 64, CPU_BK = 32, CPU_GROUP_M = 8 };

struct cta_buffers {
    float acc[CPU_BM * CPU_BN];
    float step[CPU_BM * CPU_BN]; /* one k-step's rank-BK update */
    float a[CPU_BM * CPU_BK];
    float b[CPU_BK * CPU_BN];
};

/* acc = sum over k-iterations [k0, k1) of the tile's A panel x B panel */
static void
tile_mac(const struct gemsops_matmul_params *p,
         const struct gemsops_sk_schedule *s, int64_t tile, int64_t k0,
         int64_t k1, struct cta_buffers *w)
{
    int64_t bt, tm, tn;
    gemsops_sk_tile_coords(s, tile, &bt, &tm, &tn);
    const int64_t r0 = tm * CPU_BM, c0 = tn * CPU_BN;
    const int64_t rows = p->m - r0 < CPU_BM ? p->m - r0 : CPU_BM;
    const int64_t cols = p->n - c0 < CPU_BN ? p->n - c0 : CPU_BN;
    memset(w->acc, 0, sizeof w->acc);
    for (int64_t kt = k0; kt < k1; kt++) {
        const int64_t kb = kt * CPU_BK;
        const int64_t kk = p->k - kb < CPU_BK ? p->k - kb : CPU_BK;
        for (int64_t i = 0; i < rows; i++) {
            for (int64_t q = 0; q < kk; q++) {
                w->a[i * CPU_BK + q] =
                    (float)gemsops_load_f64(p->a, p->dtype,
                                            bt * p->a_bs + (r0 + i) * p->a_rs +
                                                (kb + q) * p->a_cs);
            }
        }
        for (int64_t q = 0; q < kk; q++) {
            for (int64_t j = 0; j < cols; j++) {
                w->b[q * CPU_BN + j] =
                    (float)gemsops_load_f64(p->b, p->dtype,
                                            bt * p->b_bs + (kb + q) * p->b_rs +
                                                (c0 + j) * p->b_cs);
            }
        }
        for (int64_t i = 0; i < rows; i++) {
            float *step = w->step + i * CPU_BN;
            float *acc = w->acc + i * CPU_BN;
            memset(step, 0, cols * sizeof *step);
            for (int64_t q = 0; q < kk; q++) {
                const float a = w->a[i * CPU_BK + q];
                const float *b = w->b + q * CPU_BN;
                for (int64_t j = 0; j < cols; j++) {
                    step[j] += a * b[j];
                }
            }
            for (int64_t j = 0; j < cols; j++) {
                acc[j] += step[j];
            }
        }
    }
}

static void
tile_store(const struct gemsops_matmul_params *p,
           const struct gemsops_sk_schedule *s, int64_t tile, const float *acc)
{
    int64_t bt, tm, tn;
    gemsops_sk_tile_coords(s, tile, &bt, &tm, &tn);
    const int64_t r0 = tm * CPU_BM, c0 = tn * CPU_BN;
    for (int64_t i = 0; i < CPU_BM && r0 + i < p->m; i++) {
        for (int64_t j = 0; j < CPU_BN && c0 + j < p->n; j++) {
            float v = p->alpha * acc[i * CPU_BN + j];
            if (p->bias != NULL) {
                v += p->beta *
                     (float)gemsops_load_f64(p->bias, p->dtype,
                                             bt * p->bias_bs +
                                                 (r0 + i) * p->bias_rs +
                                                 (c0 + j) * p->bias_cs);
            }
            gemsops_store_f64(p->c, p->dtype,
                              (bt * p->m + r0 + i) * p->n + c0 + j, v);
        }
    }
}

/* One CTA's work. Returns 0, or -1 when a wait passed spin_limit. */
static int
run_cta(const struct gemsops_matmul_params *p,
        const struct gemsops_sk_schedule *s, int64_t c, float *partials,
        unsigned *flags, struct cta_buffers *w)
{
    const size_t tile_floats = CPU_BM * CPU_BN;
    struct gemsops_sk_walk walk;
    int64_t tile, k0, k1;
    gemsops_sk_walk_start(s, c, &walk);
    while (gemsops_sk_walk_next(s, &walk, &tile, &k0, &k1)) {
        tile_mac(p, s, tile, k0, k1, w);
        if (gemsops_sk_is_peer(s, k1)) { /* hand the partial to the owner */
            memcpy(partials + c * tile_floats, w->acc,
                   tile_floats * sizeof(float));
            __atomic_store_n(&flags[c], p->epoch, __ATOMIC_RELEASE);
            continue;
        }
        for (int64_t q = gemsops_sk_next_peer(s, tile, c); q >= 0;
             q = gemsops_sk_next_peer(s, tile, q)) {
            int64_t spins = 0;
            while (__atomic_load_n(&flags[q], __ATOMIC_ACQUIRE) != p->epoch) {
                if (p->spin_limit > 0 && ++spins > p->spin_limit) {
                    return -1;
                }
            }
            const float *part = partials + q * tile_floats;
            for (size_t e = 0; e < tile_floats; e++) {
                w->acc[e] += part[e];
            }
        }
        tile_store(p, s, tile, w->acc);
    }
    return 0;
}

int
gemsops_matmul_plan_cpu(const struct gemsops_matmul_params *p,
                        struct gemsops_sk_schedule *s, gemsops_status *st)
{
    (void)st;
    const int64_t ctas =
        p->ctas_override > 0 ? p->ctas_override : 2 * gemsops_thread_count();
    gemsops_sk_plan(s, p->m, p->n, p->k, p->batch, CPU_BM, CPU_BN, CPU_BK,
                    CPU_GROUP_M, ctas, p->mode, p->two_tiles);
    s->split = 0; /* split-k's pieces: fixed up by their owners here */
    return GEMSOPS_OK;
}

/* row_sums[i] = the sum over k of a[i, k] (batch 1), fp32 in k order,
 * rounded once */
static void
row_sums(const struct gemsops_matmul_params *p)
{
#pragma omp parallel for num_threads(gemsops_thread_count())
    for (int64_t i = 0; i < p->m; i++) {
        float sum = 0.f;
        for (int64_t j = 0; j < p->k; j++) {
            sum += (float)gemsops_load_f64(p->a, p->dtype,
                                           i * p->a_rs + j * p->a_cs);
        }
        gemsops_store_f64(p->row_sums, p->dtype, i, sum);
    }
}

int
gemsops_matmul_cpu(const struct gemsops_matmul_params *p, gemsops_status *st)
{
    struct gemsops_sk_schedule s;
    gemsops_matmul_plan_cpu(p, &s, st);
    if (p->row_sums != NULL) {
        row_sums(p);
    }
    if (s.tiles == 0) {
        return GEMSOPS_OK;
    }
    const int nt = gemsops_thread_count();
    float *partials = NULL;
    unsigned *flags = calloc(s.ctas, sizeof *flags);
    struct cta_buffers *bufs = malloc(nt * sizeof *bufs);
    if (s.sk_tiles > 0) {
        partials = malloc(s.ctas * CPU_BM * CPU_BN * sizeof *partials);
    }
    if (flags == NULL || bufs == NULL ||
        (s.sk_tiles > 0 && partials == NULL)) {
        free(flags);
        free(bufs);
        free(partials);
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "matmul: out of host memory");
    }
    struct gemsops_matmul_params q = *p;
    q.epoch = 1; /* flags are fresh from calloc */
    int failed = 0;
    /* dynamic hands out iterations in increasing order: every peer (a
     * lower number) starts before its owner waits */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) \
    reduction(| : failed)
    for (int64_t i = 0; i < s.ctas; i++) {
        struct cta_buffers *w = bufs + gemsops_thread_index();
        if (run_cta(&q, &s, i, partials, flags, w) != 0) {
            failed = 1;
        }
    }
    free(bufs);
    free(flags);
    free(partials);
    if (failed) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "matmul: a Stream-K wait passed spin_limit=%lld "
                            "polls (a peer never published its partial)",
                            (long long)p->spin_limit);
    }
    return GEMSOPS_OK;
}

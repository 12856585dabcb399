/* OpenMP team facts for the CPU backend, with serial fallbacks when the
 * compiler has no OpenMP. */
#pragma once

#ifdef _OPENMP
#include <omp.h>
#endif

static inline int
gemsops_thread_count(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static inline int
gemsops_thread_index(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static inline int
gemsops_team_size(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* Validation shared by the csrc/py_*.c files. Each check sets a Python
 * exception that names the function, the argument and the offending value,
 * and returns -1; 0 when the tensor passes. */
#pragma once

#include "boundary.h"

void gemsops_format_shape(const int64_t *sizes, int ndim, char *buf,
                          size_t len);
/* CPU or CUDA, and CUDA only when the extension has kernels */
int gemsops_check_backend(const struct gemsops_tensor *t, const char *fn,
                          const char *arg);
int gemsops_check_device(const struct gemsops_tensor *t,
                         const struct gemsops_tensor *ref, const char *fn,
                         const char *arg, const char *ref_arg);
int gemsops_check_contiguous(const struct gemsops_tensor *t, const char *fn,
                             const char *arg);
int gemsops_check_dtype(const struct gemsops_tensor *t, gemsops_dtype want,
                        const char *fn, const char *arg);
/* An output or a companion of the input: on ref's device, contiguous and
 * aligned (the three checks above, in that order) */
int gemsops_check_dense_beside(const struct gemsops_tensor *t,
                               const struct gemsops_tensor *ref,
                               const char *fn, const char *arg);
/* data pointer a multiple of the element size */
int gemsops_check_aligned(const struct gemsops_tensor *t, const char *fn,
                          const char *arg);
int gemsops_check_same_shape(const struct gemsops_tensor *t,
                             const struct gemsops_tensor *ref, const char *fn,
                             const char *arg, const char *ref_arg);
/* contiguous uint8 on ref's device, 16-byte aligned */
int gemsops_check_workspace(const struct gemsops_tensor *ws,
                            const struct gemsops_tensor *ref, const char *fn);
/* No written tensor may share memory with another written or read one.
 * NULL entries are skipped. */
int gemsops_check_no_overlap(const struct gemsops_tensor *const *written,
                             const char *const *wnames, int nw,
                             const struct gemsops_tensor *const *read,
                             const char *const *rnames, int nr,
                             const char *fn);

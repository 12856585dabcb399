/* Helpers for the csrc/py_*.c files: the only code that sees PyObjects. */
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gemsops/status.h"
#include "gemsops/tensor.h"

/* Fills *t with a borrowed view of `obj` (torch tensor, NumPy array, any
 * DLPack producer). The view is valid while `obj` is alive. Refuses views
 * DLPack cannot describe faithfully (torch's lazy negation bit) and
 * negative strides. On failure sets
 * a Python exception naming fn and arg, and returns -1. If `stream` is not
 * NULL and obj is a CUDA tensor whose type offers the DLPack C exchange API,
 * *stream receives the producer's current stream for its device. */
int gemsops_tensor_from_object(PyObject *obj, const char *fn, const char *arg,
                               struct gemsops_tensor *t, void **stream);

/* Like gemsops_tensor_from_object, but Py_None gives *present = 0. */
int gemsops_optional_tensor(PyObject *obj, const char *fn, const char *arg,
                            struct gemsops_tensor *t, int *present);

/* For tensors gemsops writes (outputs, workspaces): also refuses memory
 * its producer marked read-only (DLPack's read-only flag: read-only NumPy
 * arrays, memory maps opened for reading, arrays over bytes). */
int gemsops_output_from_object(PyObject *obj, const char *fn, const char *arg,
                               struct gemsops_tensor *t);
int gemsops_optional_output(PyObject *obj, const char *fn, const char *arg,
                            struct gemsops_tensor *t, int *present);

/* Sets the Python exception that st describes; returns NULL. */
PyObject *gemsops_raise(const gemsops_status *st);

/* The name of obj's type as a str, a new reference (NULL with an error
 * set): the limited API this module builds against has no tp_name. */
PyObject *gemsops_type_name(PyObject *obj);

/* 1 when the extension was built with CUDA kernels. */
int gemsops_built_with_cuda(void);
int gemsops_cuda_device_count(int *count);
/* 1 when `stream` is being captured into a CUDA graph (or its state cannot
 * be read): a buffer a captured launch uses is the graph's, not one to keep
 * a record of. */
int gemsops_stream_capturing(void *stream);

/* Bytes spanned by t's elements, from its lowest to its highest address. */
void gemsops_tensor_extent(const struct gemsops_tensor *t, char **lo,
                           char **hi);
/* 1 when the address ranges of a and b intersect. */
int gemsops_tensors_overlap(const struct gemsops_tensor *a,
                            const struct gemsops_tensor *b);

/* Buffers kept by the caller across launches (csrc/kept.c): 1 when obj
 * is the buffer a launch on `stream` left in a known state, recorded with
 * gemsops_kept_store and not written through torch since (*tag: what was
 * stored with it); 0 when the launch must prepare it again; -1 on error. */
int gemsops_kept_lookup(PyObject *obj, const struct gemsops_tensor *t,
                        void *stream, unsigned long long *tag);
int gemsops_kept_store(PyObject *obj, const struct gemsops_tensor *t,
                       void *stream, unsigned long long tag);
void gemsops_kept_forget(const struct gemsops_tensor *t, void *stream);
/* A launch outside the protocol wrote t's bytes (a workspace passed with no
 * stream to keep it for): no record that overlaps them vouches any more. */
void gemsops_kept_overwritten(const struct gemsops_tensor *t);

extern PyMethodDef gemsops_layer_norm_methods[];
extern PyMethodDef gemsops_norm_variant_methods[];
extern PyMethodDef gemsops_prod_methods[];
extern PyMethodDef gemsops_matmul_methods[];

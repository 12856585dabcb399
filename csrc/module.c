/* gemsops._C: module definition (multi-phase init) and method table. */
#include "boundary.h"
#include "gemsops/matmul.h"

PyDoc_STRVAR(
    cuda_available_doc,
    "cuda_available() -> bool\n\n"
    "True when the extension was built with CUDA kernels and a CUDA device is "
    "visible.");

static PyObject *
cuda_available(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    int count = 0;
    if (gemsops_built_with_cuda()) {
        gemsops_cuda_device_count(&count);
    }
    return PyBool_FromLong(count > 0);
}

PyDoc_STRVAR(built_with_cuda_doc,
             "built_with_cuda() -> bool\n\n"
             "True when nvcc compiled the CUDA kernels into this extension.");

static PyObject *
built_with_cuda(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(gemsops_built_with_cuda());
}

PyDoc_STRVAR(
    tensor_info_doc,
    "tensor_info(t) -> (dtype, device_type, device_id, shape, strides,\n"
    "                   address)\n\n"
    "What the DLPack boundary sees of `t` (any DLPack producer). For tests.");

static PyObject *
tensor_info(PyObject *module, PyObject *obj)
{
    (void)module;
    struct gemsops_tensor t;
    if (gemsops_tensor_from_object(obj, "tensor_info", "t", &t, NULL)) {
        return NULL;
    }
    PyObject *shape = PyTuple_New(t.ndim), *strides = PyTuple_New(t.ndim);
    if (shape == NULL || strides == NULL) {
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        return NULL;
    }
    for (int i = 0; i < t.ndim; i++) {
        if (PyTuple_SetItem(shape, i, PyLong_FromLongLong(t.sizes[i])) ||
            PyTuple_SetItem(strides, i, PyLong_FromLongLong(t.strides[i]))) {
            Py_DECREF(shape);
            Py_DECREF(strides);
            return NULL;
        }
    }
    return Py_BuildValue("(siiNNK)", gemsops_dtype_name(t.dtype),
                         t.device_type, t.device_id, shape, strides,
                         (unsigned long long)(uintptr_t)t.data);
}

PyDoc_STRVAR(
    fallback_counts_doc,
    "fallback_counts() -> dict\n\n"
    "How often this process took a documented fallback instead of failing:\n"
    "tma_refused, matmul launches whose operands the driver would not "
    "describe\n"
    "for TMA (they ran the mma mainloop).");

static PyObject *
fallback_counts(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue("{s:L}", "tma_refused", gemsops_tma_refusals());
}

static PyMethodDef module_methods[] = {
    {"fallback_counts", fallback_counts, METH_NOARGS, fallback_counts_doc},
    {"cuda_available", cuda_available, METH_NOARGS, cuda_available_doc},
    {"built_with_cuda", built_with_cuda, METH_NOARGS, built_with_cuda_doc},
    {"tensor_info", tensor_info, METH_O, tensor_info_doc},
    {NULL, NULL, 0, NULL},
};

static int
module_exec(PyObject *module)
{
    if (PyModule_AddFunctions(module, gemsops_layer_norm_methods) < 0 ||
        PyModule_AddFunctions(module, gemsops_norm_variant_methods) < 0) {
        return -1;
    }
    if (PyModule_AddFunctions(module, gemsops_prod_methods) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, gemsops_matmul_methods);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

PyDoc_STRVAR(module_doc, "gemsops._C: LayerNorm, prod and matmul kernels "
                         "behind a DLPack boundary.\n"
                         "Outputs and workspaces are allocated by the caller; "
                         "CUDA work runs on the\n"
                         "caller's current stream.");

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,       .m_name = "gemsops._C",
    .m_doc = module_doc,         .m_size = 0,
    .m_methods = module_methods, .m_slots = module_slots,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&module_def);
}

/* Status codes become Python exceptions here, and only here. */
#include "boundary.h" /* Python.h first: it sets feature macros */

#include <stdarg.h>
#include <stdio.h>

int
gemsops_fail(gemsops_status *st, gemsops_status_code code, const char *fmt,
             ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, ap);
    va_end(ap);
    st->code = code;
    return code;
}

PyObject *
gemsops_raise(const gemsops_status *st)
{
    PyObject *type;
    switch (st->code) {
    case GEMSOPS_ERR_TYPE: type = PyExc_TypeError; break;
    case GEMSOPS_ERR_VALUE: type = PyExc_ValueError; break;
    case GEMSOPS_ERR_INDEX: type = PyExc_IndexError; break;
    default: type = PyExc_RuntimeError; break;
    }
    PyErr_SetString(type, st->message);
    return NULL;
}

PyObject *
gemsops_type_name(PyObject *obj)
{
    return PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
}

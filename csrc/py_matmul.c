/* Python boundary of the Stream-K matmul: parse, validate, dispatch. The
 * Python layer (gemsops/ops/matmul.py) applies torch.matmul's rules, brings
 * A and B to [m, k] / [k, n] or [batch, m, k] / [batch, k, n] views (no
 * copy), allocates C and, for Stream-K launches, the workspace and the
 * persistent flags of the stream (with their epoch). */
#include "boundary.h" /* Python.h first: it sets feature macros */
#include "checks.h"
#include "gemsops/matmul.h"

#include <string.h>

/* 2-D or 3-D, on a backend gemsops runs, aligned (out: the dtype is
 * checked against a's below). */
static int
check_layout(const struct gemsops_tensor *t, const char *fn, const char *arg)
{
    if (t->ndim != 2 && t->ndim != 3) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): argument '%s' must be 2-D "
                     "[rows, cols] or 3-D [batch, rows, cols], got %d dims",
                     fn, arg, t->ndim);
        return -1;
    }
    return gemsops_check_backend(t, fn, arg) ||
           gemsops_check_aligned(t, fn, arg);
}

static int
check_operand(const struct gemsops_tensor *t, const char *fn, const char *arg)
{
    if (t->dtype != GEMSOPS_FLOAT16 && t->dtype != GEMSOPS_BFLOAT16 &&
        t->dtype != GEMSOPS_FLOAT32) {
        PyErr_Format(PyExc_NotImplementedError,
                     "%s(): argument '%s' has dtype %s; "
                     "gemsops matmul takes float16, bfloat16 and float32",
                     fn, arg, gemsops_dtype_name(t->dtype));
        return -1;
    }
    return check_layout(t, fn, arg);
}

static int
parse_ll(PyObject *o, const char *fn, const char *arg, long long lo,
         long long hi, long long *v)
{
    *v = PyLong_AsLongLong(o);
    if (*v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Format(PyExc_ValueError,
                         "%s(): argument '%s'=%R is out "
                         "of range [%lld, %lld]",
                         fn, arg, o, lo, hi);
        }
        return -1;
    }
    if (*v < lo || *v > hi) {
        PyErr_Format(PyExc_ValueError,
                     "%s(): argument '%s'=%lld is out of "
                     "range [%lld, %lld]",
                     fn, arg, *v, lo, hi);
        return -1;
    }
    return 0;
}

/* A 2-D operand as the one matrix of a batch of 1. */
static void
lift3(const struct gemsops_tensor *t, int64_t sizes[3], int64_t strides[3])
{
    const int lead = t->ndim == 3;
    sizes[0] = lead ? t->sizes[0] : 1;
    strides[0] = lead ? t->strides[0] : 0;
    for (int d = 1; d < 3; d++) {
        sizes[d] = t->sizes[d - 1 + lead];
        strides[d] = t->strides[d - 1 + lead];
    }
}

/* How a product's three tensors are seen. matmul() takes them as they
 * are; nn.Linear's products take the tensors as the layer holds them (an
 * input [*, in], the weight [out, in], a gradient [*, out]) and view them
 * here, where a view costs no torch object: leading dims fold into rows, a
 * weight or gradient is read transposed. */
enum operand_view {
    AS_GIVEN,
    ROWS, /* [*, c] -> [rows, c] (a 1-D [c] is one row) */
    ROWS_T, /* [*, c] -> [c, rows] */
    T, /* [r, c] -> [c, r] */
};

struct product_form {
    const char *fn;
    const char *names[3]; /* a, b and out as the caller calls them */
    enum operand_view views[3];
};

static const struct product_form matmul_form = {"matmul",
                                                {"a", "b", "out"},
                                                {AS_GIVEN, AS_GIVEN,
                                                 AS_GIVEN}};
static const struct product_form matmul_plan_form = {"matmul_plan",
                                                     {"a", "b", "out"},
                                                     {AS_GIVEN, AS_GIVEN,
                                                      AS_GIVEN}};
/* out[*, out] = input[*, in] @ weight[out, in]^T */
static const struct product_form linear_form = {"linear",
                                                {"input", "weight", "out"},
                                                {ROWS, T, ROWS}};
/* out[*, in] = grad[*, out] @ weight[out, in] */
static const struct product_form linear_grad_input_form =
    {"linear_grad_input", {"grad", "weight", "out"}, {ROWS, AS_GIVEN, ROWS}};
/* out[out, in] = grad[*, out]^T @ input[*, in] */
static const struct product_form linear_grad_weight_form =
    {"linear_grad_weight", {"grad", "input", "out"}, {ROWS_T, ROWS, AS_GIVEN}};

/* t viewed as `view` says; -1 (RuntimeError) where its leading dims do not
 * fold into rows of one stride. */
static int
view_operand(struct gemsops_tensor *t, enum operand_view view, const char *fn,
             const char *arg)
{
    if (view == AS_GIVEN) {
        return 0;
    }
    if (view == T) {
        if (t->ndim != 2) {
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): argument '%s' must be 2-D, got %d dims", fn,
                         arg, t->ndim);
            return -1;
        }
    }
    else {
        if (t->ndim < 1) {
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): argument '%s' must have at least 1 dim, "
                         "got 0",
                         fn, arg);
            return -1;
        }
        const int last = t->ndim - 1;
        int64_t rows = 1, rs = t->sizes[last] * t->strides[last], outer = -1;
        int fold = 1;
        for (int d = last - 1; d >= 0; d--) {
            rows *= t->sizes[d];
            if (t->sizes[d] == 1) {
                continue; /* a size-1 dim's stride places nothing */
            }
            if (outer < 0) {
                rs = t->strides[d]; /* the innermost dim that counts */
            }
            else if (t->strides[d] != outer) {
                fold = 0;
            }
            outer = t->strides[d] * t->sizes[d];
        }
        if (!fold && rows > 0 && t->sizes[last] > 0) {
            char sh[96];
            gemsops_format_shape(t->sizes, t->ndim, sh, sizeof sh);
            PyErr_Format(PyExc_RuntimeError,
                         "%s(): argument '%s' of shape %s: its leading "
                         "dims do not fold into rows of one stride",
                         fn, arg, sh);
            return -1;
        }
        const int64_t cols = t->sizes[last], cs = t->strides[last];
        t->sizes[0] = rows;
        t->strides[0] = rs;
        t->sizes[1] = cols;
        t->strides[1] = cs;
        t->ndim = 2;
        if (view == ROWS) {
            return 0;
        }
    }
    int64_t s = t->sizes[0], st = t->strides[0];
    t->sizes[0] = t->sizes[1];
    t->strides[0] = t->strides[1];
    t->sizes[1] = s;
    t->strides[1] = st;
    return 0;
}

/* (a, b, c, mode, two_tiles, ctas, mainloop) -> params; all checked. */
static int
parse_problem(PyObject *const *args, const struct product_form *form,
              struct gemsops_matmul_params *p, struct gemsops_tensor *a,
              struct gemsops_tensor *b, struct gemsops_tensor *c)
{
    const char *fn = form->fn;
    const char *an = form->names[0], *bn = form->names[1];
    const char *cn = form->names[2];
    long long mode, two, ctas, mainloop;
    memset(p, 0, sizeof *p);
    p->alpha = 1.0f; /* no epilogue unless matmul()'s extras ask */
    p->beta = 1.0f;
    if (gemsops_tensor_from_object(args[0], fn, an, a, &p->stream) ||
        view_operand(a, form->views[0], fn, an) || check_operand(a, fn, an) ||
        gemsops_tensor_from_object(args[1], fn, bn, b, NULL) ||
        view_operand(b, form->views[1], fn, bn) || check_operand(b, fn, bn) ||
        gemsops_output_from_object(args[2], fn, cn, c) ||
        view_operand(c, form->views[2], fn, cn) || check_layout(c, fn, cn) ||
        parse_ll(args[3], fn, "schedule", 0, 4, &mode) ||
        parse_ll(args[4], fn, "two_tiles", 0, 1, &two) ||
        parse_ll(args[5], fn, "ctas", 0, 1LL << 20, &ctas) ||
        parse_ll(args[6], fn, "mainloop", GEMSOPS_MAINLOOP_AUTO,
                 GEMSOPS_MAINLOOP_WGMMA_96X64, &mainloop)) {
        return -1;
    }
    if (b->dtype != a->dtype || c->dtype != a->dtype) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): expected %s, %s and %s to have "
                     "the same dtype, got %s, %s and %s",
                     fn, an, bn, cn, gemsops_dtype_name(a->dtype),
                     gemsops_dtype_name(b->dtype),
                     gemsops_dtype_name(c->dtype));
        return -1;
    }
    int64_t as[3], bs[3], cs[3], ast[3], bst[3], cst[3];
    lift3(a, as, ast);
    lift3(b, bs, bst);
    lift3(c, cs, cst);
    if (b->ndim != a->ndim || c->ndim != a->ndim || as[0] != bs[0] ||
        as[2] != bs[1] || cs[0] != as[0] || cs[1] != as[1] || cs[2] != bs[2]) {
        char sa[96], sb[96], sc[96];
        gemsops_format_shape(a->sizes, a->ndim, sa, sizeof sa);
        gemsops_format_shape(b->sizes, b->ndim, sb, sizeof sb);
        gemsops_format_shape(c->sizes, c->ndim, sc, sizeof sc);
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): shapes do not chain: %s %s, %s "
                     "%s, %s %s as seen (want [B, m, k] x [B, k, n] -> "
                     "[B, m, n], or the same without B)",
                     fn, an, sa, bn, sb, cn, sc);
        return -1;
    }
    const struct gemsops_tensor *w[] = {c};
    const struct gemsops_tensor *r[] = {a, b};
    const char *wn[] = {cn}, *rn[] = {an, bn};
    if (gemsops_check_device(b, a, fn, bn, an) ||
        gemsops_check_device(c, a, fn, cn, an) ||
        gemsops_check_contiguous(c, fn, cn) ||
        gemsops_check_no_overlap(w, wn, 1, r, rn, 2, fn)) {
        return -1;
    }
    p->a = a->data;
    p->b = b->data;
    p->c = c->data;
    p->batch = as[0];
    p->m = as[1];
    p->k = as[2];
    p->n = bs[2];
    p->a_bs = ast[0];
    p->a_rs = ast[1];
    p->a_cs = ast[2];
    p->b_bs = bst[0];
    p->b_rs = bst[1];
    p->b_cs = bst[2];
    p->dtype = a->dtype;
    p->mode = (gemsops_sk_mode)mode;
    p->two_tiles = (int)two;
    p->ctas_override = ctas;
    p->mainloop = (gemsops_mainloop)mainloop;
    /* fp32 under a cap that admits wgmma runs as TF32: the Python layer
     * caps fp32 at ffma unless torch allows TF32 */
    p->allow_tf32 = mainloop == GEMSOPS_MAINLOOP_AUTO ||
                    mainloop >= GEMSOPS_MAINLOOP_WGMMA_128;
    p->device_id = a->device_id;
    return 0;
}

static const char *const mainloop_names[] =
    {"auto",          "ffma",           "mma",
     "wgmma-128",     "wgmma-256",      "wgmma-64",
     "wgmma-192",     "skinny",         "wgmma-64x64",
     "wgmma-192x192", "wgmma-pingpong", "wgmma-80x128",
     "wgmma-96x128",  "wgmma-160x128",  "wgmma-80x64",
     "wgmma-96x64"};

static PyObject *
schedule_tuple(const struct gemsops_sk_schedule *s, const char *mainloop,
               const char *staged)
{
    return Py_BuildValue("{s:s,s:s,s:L,s:L,s:i,s:i,s:i,s:L,s:L,s:L,s:L,s:L,"
                         "s:L,s:L,s:L}",
                         "mainloop", mainloop, "staged", staged, "ctas",
                         (long long)s->ctas, "sk_ctas", (long long)s->sk_ctas,
                         "bm", s->bm, "bn", s->bn, "bk", s->bk, "tiles",
                         (long long)s->tiles, "iters", (long long)s->iters,
                         "sk_tiles", (long long)s->sk_tiles, "dp_tiles",
                         (long long)s->dp_tiles, "tiles_m",
                         (long long)s->tiles_m, "tiles_n",
                         (long long)s->tiles_n, "group_m",
                         (long long)s->group_m, "split", (long long)s->split);
}

PyDoc_STRVAR(
    matmul_plan_doc,
    "matmul_plan(a, b, out, schedule, two_tiles, ctas, mainloop) -> dict\n\n"
    "The Stream-K schedule a matmul launch with these arguments uses: the\n"
    "mainloop ('ffma', 'mma', 'wgmma-128', 'wgmma-256', 'wgmma-64',\n"
    "'wgmma-192', 'wgmma-64x64', 'wgmma-192x192', 'wgmma-pingpong',\n"
    "'wgmma-80x128', 'wgmma-96x128', 'wgmma-160x128', 'wgmma-80x64',\n"
    "'wgmma-96x64': C^T = b^T a^T, the\n"
    "schedule that product's, 'skinny': at most 16 "
    "rows against a "
    "row-major b, a tile a\n"
    "strip of C's columns; 'cpu'),\n"
    "staged\n"
    "('', 'a', 'b' or 'ab': operands TMA cannot describe, copied into the\n"
    "workspace first), ctas, tile shape (bm, bn, bk), tiles, iters,\n"
    "sk_tiles, dp_tiles, split (the pieces a tile when each sums a band of\n"
    "it, else 0), ... The workspace a CUDA launch needs is the\n"
    "staged copies plus ctas * bm * bn * 4 bytes when sk_tiles > 0.");

static PyObject *
matmul_plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError,
                     "matmul_plan() takes 7 arguments (%zd "
                     "given)",
                     nargs);
        return NULL;
    }
    struct gemsops_matmul_params p;
    struct gemsops_tensor a, b, c;
    if (parse_problem(args, &matmul_plan_form, &p, &a, &b, &c)) {
        return NULL;
    }
    struct gemsops_sk_schedule s;
    gemsops_status st = {GEMSOPS_OK, ""};
    gemsops_mainloop used = GEMSOPS_MAINLOOP_AUTO;
    int staged = 0;
    const int cuda = a.device_type == GEMSOPS_CUDA;
    const int rc = cuda ? gemsops_matmul_plan_cuda(&p, &s, &used, &staged, &st)
                        : gemsops_matmul_plan_cpu(&p, &s, &st);
    if (rc != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    static const char *const staged_names[] = {"", "a", "b", "ab"};
    return schedule_tuple(&s, cuda ? mainloop_names[used] : "cpu",
                          staged_names[staged & 3]);
}

PyDoc_STRVAR(
    matmul_doc,
    "matmul(a, b, out, schedule, two_tiles, ctas, mainloop, workspace, "
    "flags,\n"
    "       epoch, spin_limit, error) -> None or (bytes, flags, stream)\n\n"
    "out[i] = a[i] @ b[i] for 3-D a [B, m, k], b [B, k, n] (any strides),\n"
    "out [B, m, n] contiguous, or the same without B; fp32 accumulation.\n"
    "schedule: 0 auto, 1 data-parallel, 2 stream-k, 3 hybrid, 4 split-k;\n"
    "ctas: 0 = from\n"
    "the device; mainloop (CUDA): 0 auto, 1 ffma, 2 mma, 3 wgmma-128, 4\n"
    "wgmma-256, 5 wgmma-64, 6 wgmma-192, 7 skinny (at most 16 rows against\n"
    "a row-major b, whatever their size), 8 wgmma-64x64, 9 wgmma-192x192, "
    "10 wgmma-pingpong (128 x 128 tiles whole, a warpgroup each; halves), "
    "11-15 wgmma-80x128, -96x128, -160x128, -80x64, -96x64 (C^T = b^T a^T:\n"
    "halves, a\n"
    "K-contiguous, b N-contiguous, no epilogue; else wgmma-128), "
    "the most capable "
    "allowed (operands "
    "it cannot take "
    "go lower;\n"
    "fp32 under auto or wgmma-* runs as TF32 where the GPU has wgmma, under\n"
    "ffma or mma exactly; at most 16 rows against an N-contiguous b under\n"
    "auto take the skinny kernels, fp32 exactly).\n"
    "CUDA, Stream-K and staging launches only: workspace (uint8), flags\n"
    "(int32, zeroed\n"
    "once and kept per stream), epoch (this call's flag value, never reused\n"
    "with those flags; 0: flags for this call alone, which it zeroes and\n"
    "does not keep: a CUDA graph's memory). With flags None, or a workspace "
    "or flags smaller\n"
    "than the launch needs, it does not happen: the call returns (workspace\n"
    "bytes, flag count, stream handle) so the caller can supply the\n"
    "stream's buffers and call again; otherwise it returns None. spin_limit "
    "(0: wait; else fail after that many polls)\n"
    "and error (int32 [1], needed when spin_limit > 0: set to 1 when a wait\n"
    "gave up). Optional trailing (bias, alpha, beta): out = alpha * a @ b +\n"
    "beta * bias in fp32 before the rounding (bias None or broadcasting to\n"
    "out, out's dtype); then row_sums (None, or [m] of out's dtype, no\n"
    "batch): row_sums[i] = sum over k of a[i, k], fp32, rounded once\n"
    "(nn.Linear's bias gradient beside its weight gradient).");

/* (workspace, flags, epoch, spin_limit, error): spin_limit for both
 * backends, the rest checked and used on CUDA only. */
static int
parse_cuda_extras(PyObject *const *args, const struct product_form *form,
                  const struct gemsops_tensor *a,
                  const struct gemsops_tensor *b,
                  const struct gemsops_tensor *c,
                  struct gemsops_matmul_params *p)
{
    const char *fn = form->fn;
    struct gemsops_tensor ws, fl, er;
    int has_ws = 0, has_fl = 0, has_er = 0;
    long long epoch, spin;
    if (parse_ll(args[9], fn, "epoch", 0, 0xffffffffLL, &epoch) ||
        parse_ll(args[10], fn, "spin_limit", 0, 1LL << 62, &spin)) {
        return -1;
    }
    p->spin_limit = spin;
    if (a->device_type != GEMSOPS_CUDA) {
        return 0; /* the CPU executor keeps its own workspace and flags */
    }
    if (gemsops_optional_output(args[7], fn, "workspace", &ws, &has_ws) ||
        (has_ws && gemsops_check_workspace(&ws, a, fn)) ||
        gemsops_optional_output(args[8], fn, "flags", &fl, &has_fl) ||
        gemsops_optional_output(args[11], fn, "error", &er, &has_er)) {
        return -1;
    }
    if ((has_fl && fl.dtype != GEMSOPS_INT32) ||
        (has_er && er.dtype != GEMSOPS_INT32)) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): 'flags' and 'error' must be "
                     "int32 tensors",
                     fn);
        return -1;
    }
    if (spin > 0 && !has_er) {
        PyErr_Format(PyExc_ValueError,
                     "%s(): spin_limit=%lld needs an "
                     "'error' tensor",
                     fn, spin);
        return -1;
    }
    const char *an = form->names[0];
    if ((has_fl && (gemsops_check_device(&fl, a, fn, "flags", an) ||
                    gemsops_check_contiguous(&fl, fn, "flags") ||
                    gemsops_check_aligned(&fl, fn, "flags"))) ||
        (has_er && (gemsops_check_device(&er, a, fn, "error", an) ||
                    gemsops_check_aligned(&er, fn, "error")))) {
        return -1;
    }
    if (has_er && gemsops_tensor_numel(&er) < 1) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): 'error' must have at least "
                     "one element, got 0",
                     fn);
        return -1;
    }
    const struct gemsops_tensor *w[] = {c, has_ws ? &ws : NULL,
                                        has_fl ? &fl : NULL,
                                        has_er ? &er : NULL};
    const struct gemsops_tensor *r[] = {a, b};
    const char *wn[] = {form->names[2], "workspace", "flags", "error"};
    const char *rn[] = {an, form->names[1]};
    if (gemsops_check_no_overlap(w, wn, 4, r, rn, 2, fn)) {
        return -1;
    }
    p->workspace = has_ws ? ws.data : NULL;
    p->workspace_bytes = has_ws ? gemsops_tensor_numel(&ws) : 0;
    p->flags = has_fl ? (unsigned *)fl.data : NULL;
    p->flag_count = has_fl ? gemsops_tensor_numel(&fl) : 0;
    p->error = has_er ? (int *)er.data : NULL;
    p->epoch = (unsigned)epoch;
    return 0;
}

/* (bias, alpha, beta): the epilogue out = alpha * a @ b + beta * bias.
 * bias: None or a tensor of out's dtype and device that broadcasts to
 * out's shape (its broadcast dims read with stride 0). */
static int
parse_epilogue(PyObject *const *args, const char *fn,
               const struct gemsops_tensor *c, struct gemsops_matmul_params *p,
               struct gemsops_tensor *bias)
{
    double alpha = PyFloat_AsDouble(args[1]);
    double beta =
        alpha == -1.0 && PyErr_Occurred() ? 0.0 : PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) {
        return -1;
    }
    p->alpha = (float)alpha;
    p->beta = (float)beta;
    if (args[0] == Py_None) {
        return 0;
    }
    struct gemsops_tensor t;
    if (gemsops_tensor_from_object(args[0], fn, "bias", &t, NULL) ||
        gemsops_check_device(&t, c, fn, "bias", "out")) {
        return -1;
    }
    if (t.dtype != c->dtype) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): bias has dtype %s; expected %s (out's)", fn,
                     gemsops_dtype_name(t.dtype),
                     gemsops_dtype_name(c->dtype));
        return -1;
    }
    /* right-aligned broadcast onto out's [batch,] m, n */
    int64_t st[3] = {0, 0, 0};
    int ok = t.ndim <= c->ndim;
    for (int i = 1; ok && i <= t.ndim; i++) {
        const int64_t ts = t.sizes[t.ndim - i], cs = c->sizes[c->ndim - i];
        ok = ts == cs || ts == 1;
        st[3 - i] = ts == 1 ? 0 : t.strides[t.ndim - i];
    }
    if (!ok) {
        char sb[96], sc[96];
        gemsops_format_shape(t.sizes, t.ndim, sb, sizeof sb);
        gemsops_format_shape(c->sizes, c->ndim, sc, sizeof sc);
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): bias of shape %s does not broadcast to out's "
                     "shape %s",
                     fn, sb, sc);
        return -1;
    }
    const struct gemsops_tensor *w[] = {c};
    const struct gemsops_tensor *r[] = {&t};
    const char *wn[] = {"out"};
    const char *rn[] = {"bias"};
    if (gemsops_check_no_overlap(w, wn, 1, r, rn, 1, fn)) {
        return -1;
    }
    p->bias = t.data;
    *bias = t;
    p->bias_bs = st[0];
    p->bias_rs = st[1];
    p->bias_cs = st[2];
    return 0;
}

/* row_sums: None, or out's dtype and device, [m] contiguous, for a
 * product without a batch (a 2-D a, or a batch of one). */
static int
parse_row_sums(PyObject *arg, const struct product_form *form,
               const struct gemsops_tensor *a, const struct gemsops_tensor *b,
               const struct gemsops_tensor *c,
               const struct gemsops_tensor *bias,
               struct gemsops_matmul_params *p)
{
    const char *fn = form->fn;
    if (arg == Py_None) {
        return 0;
    }
    struct gemsops_tensor t;
    if (gemsops_tensor_from_object(arg, fn, "row_sums", &t, NULL) ||
        gemsops_check_device(&t, c, fn, "row_sums", form->names[2]) ||
        gemsops_check_contiguous(&t, fn, "row_sums") ||
        gemsops_check_aligned(&t, fn, "row_sums")) {
        return -1;
    }
    if (t.dtype != c->dtype || t.ndim != 1 || t.sizes[0] != p->m ||
        p->batch != 1) {
        char sr[96];
        gemsops_format_shape(t.sizes, t.ndim, sr, sizeof sr);
        PyErr_Format(PyExc_RuntimeError,
                     "%s(): row_sums must be a %s tensor of shape [%lld] "
                     "for a product without a batch, got %s of shape %s "
                     "(batch %lld)",
                     fn, gemsops_dtype_name(c->dtype), (long long)p->m,
                     gemsops_dtype_name(t.dtype), sr, (long long)p->batch);
        return -1;
    }
    /* the sums are stored before the epilogue reads the bias */
    const struct gemsops_tensor *w[] = {c, &t};
    const struct gemsops_tensor *r[] = {a, b, bias};
    const char *wn[] = {form->names[2], "row_sums"};
    const char *rn[] = {form->names[0], form->names[1], "bias"};
    if (gemsops_check_no_overlap(w, wn, 2, r, rn, p->bias ? 3 : 2, fn)) {
        return -1;
    }
    p->row_sums = t.data;
    return 0;
}

/* matmul() and nn.Linear's products: one launch, the tensors seen as
 * `form` says. */
static PyObject *
run_product(PyObject *const *args, Py_ssize_t nargs,
            const struct product_form *form)
{
    const char *fn = form->fn;
    if (nargs != 12 && nargs != 15 && nargs != 16) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes 12, 15 or 16 arguments (%zd "
                     "given)",
                     fn, nargs);
        return NULL;
    }
    struct gemsops_matmul_params p;
    struct gemsops_tensor a, b, c, bias;
    if (parse_problem(args, form, &p, &a, &b, &c) ||
        parse_cuda_extras(args, form, &a, &b, &c, &p) ||
        (nargs >= 15 && parse_epilogue(args + 12, fn, &c, &p, &bias)) ||
        (nargs == 16 &&
         parse_row_sums(args[15], form, &a, &b, &c, &bias, &p))) {
        return NULL;
    }
    const int cuda = a.device_type == GEMSOPS_CUDA;
    struct gemsops_tensor fl;
    unsigned long long last_epoch = 0;
    /* flags a captured launch uses belong to the graph: no record of them
     * (it would pin the graph's memory), and the launch zeroes them. So
     * do flags passed with epoch 0: the caller's for this launch alone
     * (a CUDA graph trees warm-up allocates from the graph's pool without
     * capturing), run at epoch 1 */
    const int scratch_flags = p.epoch == 0;
    if (scratch_flags) {
        p.epoch = 1;
    }
    const int keep_flags = cuda && p.flags != NULL && !scratch_flags &&
                           !gemsops_stream_capturing(p.stream);
    if (keep_flags) {
        /* flags seen before hold only epochs up to the last one stored */
        int has_fl;
        if (gemsops_optional_output(args[8], fn, "flags", &fl, &has_fl)) {
            return NULL;
        }
        const int known =
            gemsops_kept_lookup(args[8], &fl, p.stream, &last_epoch);
        if (known < 0) {
            return NULL;
        }
        p.flags_known = known && p.epoch > last_epoch;
    }
    struct gemsops_matmul_need need = {0, 0};
    gemsops_status st = {GEMSOPS_OK, ""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cuda ? gemsops_matmul_cuda(&p, &need, &st)
              : gemsops_matmul_cpu(&p, &st);
    Py_END_ALLOW_THREADS
    if (keep_flags) {
        if (rc != GEMSOPS_OK) {
            gemsops_kept_forget(&fl, p.stream);
        }
        else if (gemsops_kept_store(args[8], &fl, p.stream, p.epoch) < 0) {
            return NULL;
        }
    }
    if (rc != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    if (need.flags > 0) {
        return Py_BuildValue("(LLK)", (long long)need.workspace_bytes,
                             (long long)need.flags,
                             (unsigned long long)(uintptr_t)p.stream);
    }
    Py_RETURN_NONE;
}

static PyObject *
matmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return run_product(args, nargs, &matmul_form);
}

PyDoc_STRVAR(
    linear_doc,
    "linear(input, weight, out, ...) -> as matmul()\n\n"
    "nn.Linear's forward product out[*, n] = input[*, k] @ weight[n, k]^T,\n"
    "the tensors as the layer holds them: input's and out's leading dims\n"
    "fold into rows (they must fold into one stride), the weight is read\n"
    "transposed. The other arguments, the epilogue and the answer are\n"
    "matmul()'s.");

static PyObject *
linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return run_product(args, nargs, &linear_form);
}

PyDoc_STRVAR(
    linear_grad_input_doc,
    "linear_grad_input(grad, weight, out, ...) -> as matmul()\n\n"
    "nn.Linear's input gradient out[*, k] = grad[*, n] @ weight[n, k], the\n"
    "leading dims of grad and out folded into rows; otherwise matmul().");

static PyObject *
linear_grad_input(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return run_product(args, nargs, &linear_grad_input_form);
}

PyDoc_STRVAR(
    linear_grad_weight_doc,
    "linear_grad_weight(grad, input, out, ...) -> as matmul()\n\n"
    "nn.Linear's weight gradient out[n, k] = grad[*, n]^T @ input[*, k], the\n"
    "leading dims of grad and input folded into rows (the product's k);\n"
    "row_sums, where given, receives grad's column sums (the bias's\n"
    "gradient); otherwise matmul().");

static PyObject *
linear_grad_weight(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return run_product(args, nargs, &linear_grad_weight_form);
}

PyDoc_STRVAR(
    streamk_check_doc,
    "streamk_check(m, n, k, batch, bm, bn, bk, group_m, ctas, schedule,\n"
    "              two_tiles) -> dict\n\n"
    "Plans the Stream-K schedule for these sizes and `ctas` resident CTAs "
    "and\n"
    "verifies it by brute force (every (tile, k-iteration) exactly once, the\n"
    "grouped order a bijection, owners and peers consistent); returns the\n"
    "schedule, or raises ValueError naming the first violation.");

static PyObject *
streamk_check(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const char *fn = "streamk_check";
    static const char *names[] = {"m",    "n",        "k",        "batch",
                                  "bm",   "bn",       "bk",       "group_m",
                                  "ctas", "schedule", "two_tiles"};
    static const long long lo[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    static const long long hi[] = {1LL << 40, 1LL << 40, 1LL << 40, 1LL << 30,
                                   1024,      1024,      1024,      1024,
                                   1LL << 20, 4,         1};
    long long v[11];
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError,
                     "streamk_check() takes 11 arguments "
                     "(%zd given)",
                     nargs);
        return NULL;
    }
    for (int i = 0; i < 11; i++) {
        if (parse_ll(args[i], fn, names[i], lo[i], hi[i], &v[i])) {
            return NULL;
        }
    }
    /* the check counts every (tile, k-step) cell: a bound on them keeps
     * its products in 64 bits and its table in memory */
    int64_t cells = (v[0] + v[4] - 1) / v[4], cells_bound = (int64_t)1 << 28;
    if (__builtin_mul_overflow(cells, (v[1] + v[5] - 1) / v[5], &cells) ||
        __builtin_mul_overflow(cells, v[3], &cells) ||
        __builtin_mul_overflow(cells, (v[2] + v[6] - 1) / v[6], &cells) ||
        cells > cells_bound) {
        PyErr_Format(PyExc_ValueError,
                     "streamk_check(): the problem has more than %lld (tile, "
                     "k-step) cells to check",
                     (long long)cells_bound);
        return NULL;
    }
    struct gemsops_sk_schedule s;
    gemsops_sk_plan(&s, v[0], v[1], v[2], v[3], (int)v[4], (int)v[5],
                    (int)v[6], (int)v[7], v[8], (gemsops_sk_mode)v[9],
                    (int)v[10]);
    gemsops_status st = {GEMSOPS_OK, ""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gemsops_sk_check(&s, &st);
    Py_END_ALLOW_THREADS
    if (rc != GEMSOPS_OK) {
        return gemsops_raise(&st);
    }
    return schedule_tuple(&s, NULL, ""); /* no kernel: mainloop None */
}

PyMethodDef gemsops_matmul_methods[] = {
    {"matmul", (PyCFunction)(void (*)(void))matmul, METH_FASTCALL, matmul_doc},
    {"linear", (PyCFunction)(void (*)(void))linear, METH_FASTCALL, linear_doc},
    {"linear_grad_input", (PyCFunction)(void (*)(void))linear_grad_input,
     METH_FASTCALL, linear_grad_input_doc},
    {"linear_grad_weight", (PyCFunction)(void (*)(void))linear_grad_weight,
     METH_FASTCALL, linear_grad_weight_doc},
    {"matmul_plan", (PyCFunction)(void (*)(void))matmul_plan, METH_FASTCALL,
     matmul_plan_doc},
    {"streamk_check", (PyCFunction)(void (*)(void))streamk_check,
     METH_FASTCALL, streamk_check_doc},
    {NULL, NULL, 0, NULL},
};

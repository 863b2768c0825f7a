/* hk_portable's compiled launcher: the per-call host work of a kernel launch in C (runtime/clauncher.py
 * builds and loads it; the ctypes path is the fallback).
 *
 *   Launcher(...)(args, grid, stream[, tail]) -> status
 *       packs each argument into the kernel parameter buffer (the hk::gl ABI of codegen/abi.py: data
 *       pointer, int32 shape, int64 strides; int32 and float32 scalars) and calls the launch function
 *       (cuLaunchKernel or hipModuleLaunchKernel, by address: this file includes no CUDA or HIP header and
 *       links no driver) with the buffer as `extra` (BUFFER_POINTER/BUFFER_SIZE) or as kernelParams.
 *       status: 0 launched; > 0 the launch function's error code; LAUNCH_REFUSED (-1) an argument does
 *       not fit (wrong count, device, rank, int32 range, an output whose elements share memory: Python
 *       explains which); STREAM_NOT_A_HANDLE (-3) the stream is neither None nor an int (Python resolves it and calls again with the handle);
 *       GRID_REFUSED (-4) grid axis 1 or 2 too large. With on_status set, the call returns None when it
 *       launched and on_status(status, args, grid, stream) otherwise.
 *   Launcher.pack(args) -> bytes | status: the parameter buffer alone (tests).
 *   signature(args) -> tuple: the flat argument-kind key of Kernel.__call__'s fast path.
 *
 * Everything here holds the GIL except the launch call itself. The buffer lives on this call's stack, so
 * concurrent launching threads never share one. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the kernel parameter buffer is little-endian; this launcher packs in host order"
#endif

#define HK_LAUNCHER_ABI 3
#define LAUNCH_REFUSED (-1)
#define PY_ERROR (-2)              /* internal: a Python exception is set (never a status) */
#define STREAM_NOT_A_HANDLE (-3)
#define GRID_REFUSED (-4)
#define STACK_BYTES 4096
#define STACK_PTRS 256
#define ABSENT(o) ((o) == NULL || (o) == Py_None)   /* an optional callable: None, or cleared by the GC */

typedef int (*hk_launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shared, void *stream, void **params, void **extra);
/* cuTensorMapEncodeTiled, by address (the enums are ints) */
typedef int (*hk_encode_fn)(void *tmap, int dtype, unsigned rank, void *addr, const uint64_t *dims,
                            const uint64_t *strides, const uint32_t *box, const uint32_t *element_strides,
                            int interleave, int swizzle, int l2_promotion, int oob_fill);
#define TMAP_BYTES 128
#define TMAP_MAX_RANK 5
#define TMA_LOADS_OK 1

enum { KIND_GL = 0, KIND_I32 = 1, KIND_F32 = 2 };

typedef struct {
    int kind, rank, stored;     /* stored: a gl the kernel stores to, whose elements must not share memory */
    Py_ssize_t off, shape_off, stride_off;
} Param;

/* One TMA tensor map of the tail (backends/cuda/tma.py's spec): the gl parameter it describes, its element type
 * (CUtensorMapDataType) and bytes, the box, the flag bit it sets where the kernel writes through it (0: read), and
 * whether it describes the tensor the parameter is a transposed view of (its last two dimensions swapped back). */
typedef struct {
    Py_ssize_t param;
    int dtype, esize, bit, transpose;
    unsigned box_cols, box_rows;
} TMap;

static PyObject *s_data_ptr, *s_get_device, *s_stride, *s_shape, *s_dtype, *s_ndim, *s_device;
static PyObject *tensor_type;   /* torch.Tensor, set by set_tensor_type() */

/* ------------------------------------------------------------------------------------------ helpers */
/* An exception that means "this argument does not fit" (the Python packer catches the same ones). */
static int refusable(void) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError) || PyErr_ExceptionMatches(PyExc_TypeError) ||
        PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* a Python int as long long; 0 ok, -1 refused (not an int, or out of range), PY_ERROR another exception */
static int as_ll(PyObject *o, long long *out) {
    long long v;
    if (PyLong_Check(o)) {
        int overflow;
        v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow) return -1;
        if (v == -1 && PyErr_Occurred()) return refusable() ? -1 : PY_ERROR;
    } else {
        PyObject *i = PyNumber_Index(o);         /* as struct's integer codes take __index__ */
        if (i == NULL) return refusable() ? -1 : PY_ERROR;
        int overflow;
        v = PyLong_AsLongLongAndOverflow(i, &overflow);
        Py_DECREF(i);
        if (overflow) return -1;
        if (v == -1 && PyErr_Occurred()) return refusable() ? -1 : PY_ERROR;
    }
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------------------------------ Launcher */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    void *func;
    hk_launch_fn launch;
    unsigned threads, shared, max_gy, max_gz;
    long device;
    PyObject *device_obj;        /* device as a Python int (the stream function's argument) */
    PyObject *stream_fn;         /* device index -> raw stream handle, or None */
    PyObject *tail_fn;           /* args -> bytes written at tail_off after packing, or None */
    PyObject *on_status;         /* (status, args, grid, stream) -> result, for every status but 0, or None */
    unsigned char *tail_key;     /* the packed parameters the cached tail was made for (tail_off bytes) */
    PyObject *tail_cache;        /* the last tail_fn result: a function of the packed parameters alone */
    int use_params;              /* 1: kernelParams (pointers into the buffer), 0: `extra` */
    void *tags[3];               /* the `extra` markers: BUFFER_POINTER, BUFFER_SIZE, END */
    Py_ssize_t size, nparams, nptrs, tail_off;
    Py_ssize_t grid_off;         /* >= 0: a persistent kernel; the logical grid (3 ints) is written there */
    unsigned max_blocks;         /* ... and the launch runs min(its tiles, max_blocks) blocks */
    Param *params;
    Py_ssize_t *ptr_offsets;
    TMap *tmaps;                 /* with encode: the tail's maps encoded here on a miss, not by tail_fn */
    Py_ssize_t ntmaps;
    hk_encode_fn encode;
} Launcher;

static int pack_tuple(Launcher *L, PyObject *args, unsigned char *buf);
static int init_tmaps(Launcher *L, PyObject *tmaps, PyObject *encode);
static void *as_ptr(PyObject *o);

/* Packs args (a tuple or a list) into buf (size bytes, zeroed here). 0, LAUNCH_REFUSED, or PY_ERROR with
 * an exception set. */
static int pack_args(Launcher *L, PyObject *args, unsigned char *buf) {
    if (PyTuple_Check(args)) return pack_tuple(L, args, buf);
    if (!PyList_Check(args)) return LAUNCH_REFUSED;
    PyObject *t = PyList_AsTuple(args);      /* a list could change while a tensor method runs Python code */
    if (t == NULL) return PY_ERROR;
    int rc = pack_tuple(L, t, buf);
    Py_DECREF(t);
    return rc;
}

/* Whether every element of the gl packed at p has its own memory (interface/kernel.py's _elements_distinct):
 * with the dims of size > 1 taken by increasing stride, each stride exceeds the span of the smaller ones. A zero
 * stride (an expanded view) or overlapping strides would let two blocks write one element. */
static int elements_distinct(const Param *p, const unsigned char *buf) {
    long long st[TMAP_MAX_RANK * 2], sz[TMAP_MAX_RANK * 2];
    int n = 0;
    if (p->rank > TMAP_MAX_RANK * 2) return 0;
    for (int d = 0; d < p->rank; d++) {
        int32_t size;
        int64_t stride;
        memcpy(&size, buf + p->shape_off + 4 * d, 4);
        memcpy(&stride, buf + p->stride_off + 8 * d, 8);
        if (size <= 1) continue;
        int k = n++;
        for (; k > 0 && st[k - 1] > stride; k--) {      /* insertion by stride */
            st[k] = st[k - 1];
            sz[k] = sz[k - 1];
        }
        st[k] = stride;
        sz[k] = size;
    }
    long long span = 0;
    for (int k = 0; k < n; k++) {
        if (st[k] <= span) return 0;
        span += (sz[k] - 1) * st[k];
    }
    return 1;
}

static int pack_tuple(Launcher *L, PyObject *args, unsigned char *buf) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n != L->nparams) return LAUNCH_REFUSED;
    memset(buf, 0, (size_t)L->size);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Param *p = &L->params[i];
        PyObject *a = PyTuple_GET_ITEM(args, i);
        Py_INCREF(a);
        int rc = 0;
        if (p->kind == KIND_GL) {
            PyObject *dev = NULL, *ptr = NULL, *shape = NULL, *stride = NULL;
            long long v;
            const Param *same = NULL;       /* the same tensor passed before (x as the residual, w as the bias) */
            for (Py_ssize_t j = 0; j < i && same == NULL; j++)
                if (PyTuple_GET_ITEM(args, j) == a && L->params[j].kind == KIND_GL && L->params[j].rank == p->rank)
                    same = &L->params[j];
            if (same != NULL) {             /* its words again: no method calls (each ~0.3-0.5 us) */
                memcpy(buf + p->off, buf + same->off, 8);
                memcpy(buf + p->shape_off, buf + same->shape_off, 4 * (size_t)p->rank);
                memcpy(buf + p->stride_off, buf + same->stride_off, 8 * (size_t)p->rank);
                goto gl_done;
            }
            dev = PyObject_CallMethodNoArgs(a, s_get_device);
            if (dev == NULL) { rc = refusable() ? LAUNCH_REFUSED : PY_ERROR; goto gl_done; }
            if ((rc = as_ll(dev, &v)) != 0) goto gl_done;
            if (v != L->device) { rc = LAUNCH_REFUSED; goto gl_done; }
            ptr = PyObject_CallMethodNoArgs(a, s_data_ptr);
            if (ptr == NULL) { rc = refusable() ? LAUNCH_REFUSED : PY_ERROR; goto gl_done; }
            if (!PyLong_Check(ptr)) { rc = LAUNCH_REFUSED; goto gl_done; }
            {
                unsigned long long u = PyLong_AsUnsignedLongLong(ptr);
                if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                    rc = refusable() ? LAUNCH_REFUSED : PY_ERROR;
                    goto gl_done;
                }
                memcpy(buf + p->off, &u, 8);
            }
            shape = PyObject_GetAttr(a, s_shape);
            if (shape == NULL) { rc = refusable() ? LAUNCH_REFUSED : PY_ERROR; goto gl_done; }
            if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != p->rank) { rc = LAUNCH_REFUSED; goto gl_done; }
            for (int d = 0; d < p->rank; d++) {
                if ((rc = as_ll(PyTuple_GET_ITEM(shape, d), &v)) != 0) goto gl_done;
                if (v < INT32_MIN || v > INT32_MAX) { rc = LAUNCH_REFUSED; goto gl_done; }
                int32_t s32 = (int32_t)v;
                memcpy(buf + p->shape_off + 4 * d, &s32, 4);
            }
            stride = PyObject_CallMethodNoArgs(a, s_stride);
            if (stride == NULL) { rc = refusable() ? LAUNCH_REFUSED : PY_ERROR; goto gl_done; }
            if (!PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != p->rank) { rc = LAUNCH_REFUSED; goto gl_done; }
            for (int d = 0; d < p->rank; d++) {
                if ((rc = as_ll(PyTuple_GET_ITEM(stride, d), &v)) != 0) goto gl_done;
                int64_t s64 = (int64_t)v;
                memcpy(buf + p->stride_off + 8 * d, &s64, 8);
            }
        gl_done:
            Py_XDECREF(dev);
            Py_XDECREF(ptr);
            Py_XDECREF(shape);
            Py_XDECREF(stride);
        } else if (p->kind == KIND_I32) {
            long long v;
            rc = as_ll(a, &v);
            if (rc == 0) {
                if (v < INT32_MIN || v > INT32_MAX) {
                    rc = LAUNCH_REFUSED;
                } else {
                    int32_t s32 = (int32_t)v;
                    memcpy(buf + p->off, &s32, 4);
                }
            }
        } else {
            double x = PyFloat_CheckExact(a) ? PyFloat_AS_DOUBLE(a) : PyFloat_AsDouble(a);
            if (x == -1.0 && PyErr_Occurred()) {
                rc = refusable() ? LAUNCH_REFUSED : PY_ERROR;
            } else if (PyFloat_Pack4(x, (char *)buf + p->off, 1) < 0) {   /* as struct's '<f': overflow refused */
                rc = refusable() ? LAUNCH_REFUSED : PY_ERROR;
            }
        }
        Py_DECREF(a);
        if (rc) return rc;
    }
    for (Py_ssize_t i = 0; i < n; i++)      /* an output whose elements share memory: Python explains it */
        if (L->params[i].stored && !elements_distinct(&L->params[i], buf)) return LAUNCH_REFUSED;
    return 0;
}

/* One map of `m` for the gl parameter packed in buf, as tma.describe/encode do it: 0 encoded into `out` (64-byte
 * aligned), -1 when TMA cannot describe the tensor or the driver refuses it. */
static int encode_map(const Launcher *L, const TMap *m, const unsigned char *buf, unsigned char *out) {
    const Param *p = &L->params[m->param];
    const int rank = p->rank;
    uint64_t ptr, dims[TMAP_MAX_RANK], strides[TMAP_MAX_RANK];
    uint32_t box[TMAP_MAX_RANK], ones[TMAP_MAX_RANK];
    int shape[TMAP_MAX_RANK];
    long long stride[TMAP_MAX_RANK];
    memcpy(&ptr, buf + p->off, 8);
    memcpy(shape, buf + p->shape_off, 4 * (size_t)rank);
    memcpy(stride, buf + p->stride_off, 8 * (size_t)rank);
    if (m->transpose) {
        int s = shape[rank - 1];
        long long t = stride[rank - 1];
        shape[rank - 1] = shape[rank - 2], stride[rank - 1] = stride[rank - 2];
        shape[rank - 2] = s, stride[rank - 2] = t;
    }
    if (stride[rank - 1] != 1 || ptr % 16) return -1;
    for (int k = 0; k < rank; k++) {
        if (shape[rank - 1 - k] <= 0) return -1;
        dims[k] = (uint64_t)shape[rank - 1 - k];
        box[k] = k == 0 ? m->box_cols : k == 1 ? m->box_rows : 1;
        ones[k] = 1;
    }
    for (int k = 0; k + 1 < rank; k++) {
        long long b = stride[rank - 2 - k] * m->esize;
        if (b <= 0 || b % 16 || b >= (1LL << 40)) return -1;
        strides[k] = (uint64_t)b;
    }
    /* interleave none, 128-byte swizzle, 256-byte L2 promotion, OOB fill none: tma.py's constants */
    return L->encode(out, m->dtype, (unsigned)rank, (void *)(uintptr_t)ptr, dims, strides, box, ones, 0, 3, 3, 0)
           == 0 ? 0 : -1;
}

/* The tail tma.TensorMaps.tail gives, from the packed parameters alone, written to `t` (TMAP_BYTES * ntmaps + 4
 * bytes): every map, then the flag. A read map TMA cannot describe zeroes the whole tail (flag 0: the kernel's cp.async
 * path); a written one, its map and its own flag bit clear (plain stores or atomics). Touches no Python object (replay runs it
 * without the GIL). */
static void encode_tail_into(const Launcher *L, const unsigned char *buf, unsigned char *t) {
    const size_t len = (size_t)(TMAP_BYTES * L->ntmaps + 4);
    memset(t, 0, len);
    uint32_t flag = TMA_LOADS_OK;
    for (Py_ssize_t i = 0; i < L->ntmaps; i++) flag |= (uint32_t)L->tmaps[i].bit;
    _Alignas(64) unsigned char map[TMAP_BYTES];
    for (Py_ssize_t i = 0; i < L->ntmaps; i++) {
        if (encode_map(L, &L->tmaps[i], buf, map) == 0) {
            memcpy(t + TMAP_BYTES * i, map, TMAP_BYTES);
        } else if (!L->tmaps[i].bit) {
            memset(t, 0, len);
            return;
        } else {
            flag &= ~(uint32_t)L->tmaps[i].bit;
        }
    }
    memcpy(t + TMAP_BYTES * L->ntmaps, &flag, 4);
}

static PyObject *encoded_tail(const Launcher *L, const unsigned char *buf) {
    PyObject *tail = PyBytes_FromStringAndSize(NULL, TMAP_BYTES * L->ntmaps + 4);
    if (tail == NULL) return NULL;
    encode_tail_into(L, buf, (unsigned char *)PyBytes_AS_STRING(tail));
    return tail;
}

/* The tail (tensor maps and their flag) after the packed parameters: encoded here (encoded_tail) where the
 * Launcher has tmaps and an encoder, else tail_fn(args) -> bytes; either depends only on what the packed
 * parameters hold (pointers, shapes, strides), so the last one is reused while they are the same bytes. */
static int write_tail(Launcher *L, PyObject *args, unsigned char *buf) {
    if (L->tail_cache != NULL && L->tail_key != NULL && memcmp(L->tail_key, buf, (size_t)L->tail_off) == 0) {
        memcpy(buf + L->tail_off, PyBytes_AS_STRING(L->tail_cache), (size_t)PyBytes_GET_SIZE(L->tail_cache));
        return 0;
    }
    PyObject *tail = L->encode != NULL ? encoded_tail(L, buf) : PyObject_CallOneArg(L->tail_fn, args);
    if (tail == NULL) return PY_ERROR;
    if (!PyBytes_Check(tail) || PyBytes_GET_SIZE(tail) > L->size - L->tail_off) {
        PyErr_Format(PyExc_ValueError, "launcher: the tail must be at most %zd bytes", L->size - L->tail_off);
        Py_DECREF(tail);
        return PY_ERROR;
    }
    memcpy(buf + L->tail_off, PyBytes_AS_STRING(tail), (size_t)PyBytes_GET_SIZE(tail));
    if (L->tail_key == NULL) L->tail_key = PyMem_Malloc((size_t)(L->tail_off ? L->tail_off : 1));
    if (L->tail_key != NULL) {
        memcpy(L->tail_key, buf, (size_t)L->tail_off);
        Py_XSETREF(L->tail_cache, tail);
    } else {
        Py_DECREF(tail);
    }
    return 0;
}

static PyObject *status(int rc) {
    return rc == PY_ERROR ? NULL : PyLong_FromLong(rc);
}

static int grid_axis(PyObject *g, unsigned *out) {
    unsigned long v = PyLong_AsUnsignedLong(g);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_OverflowError, "launcher: grid dimension out of range");
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

/* A persistent kernel: the logical grid g goes into the parameters and g becomes the launch's grid, one
 * block per SM at most (each walks tiles blockIdx.x, + gridDim.x, ... of the logical grid). */
static int persistent_grid(Launcher *L, unsigned char *buf, unsigned g[3]) {
    if (g[0] > INT_MAX || g[1] > INT_MAX || g[2] > INT_MAX) return GRID_REFUSED;
    const int logical[3] = {(int)g[0], (int)g[1], (int)g[2]};
    memcpy(buf + L->grid_off, logical, sizeof logical);
    const unsigned long long tiles = (unsigned long long)g[0] * g[1] * g[2];
    g[0] = (unsigned)(tiles < L->max_blocks ? tiles : L->max_blocks);
    g[1] = g[2] = 1;
    return 0;
}

/* The launch of a packed buffer (parameters, tail and persistent grid written) on `handle`: 0 or the launch
 * function's status. With release_gil the launch call runs without the GIL, which the caller holds; without, the
 * caller holds no Python state at all (op replay, runtime/opfast.cpp). PY_ERROR only when memory runs out. */
static int launch_packed(Launcher *L, unsigned char *buf, const unsigned g[3], void *handle, int release_gil) {
    void *stack_ptrs[STACK_PTRS];
    void **ptrs = stack_ptrs;
    void *extra[5];
    size_t size = (size_t)L->size;
    void **params = NULL, **extra_p = NULL;
    int rc;
    if (L->use_params) {
        if (L->nptrs > STACK_PTRS) {
            ptrs = malloc(sizeof(void *) * (size_t)L->nptrs);
            if (ptrs == NULL) {
                if (release_gil) PyErr_NoMemory();
                return PY_ERROR;
            }
        }
        for (Py_ssize_t i = 0; i < L->nptrs; i++) ptrs[i] = buf + L->ptr_offsets[i];
        params = ptrs;
    } else {
        extra[0] = L->tags[0];
        extra[1] = buf;
        extra[2] = L->tags[1];
        extra[3] = &size;
        extra[4] = L->tags[2];
        extra_p = extra;
    }
    if (release_gil) {
        Py_BEGIN_ALLOW_THREADS
        rc = L->launch(L->func, g[0], g[1], g[2], L->threads, 1, 1, L->shared, handle, params, extra_p);
        Py_END_ALLOW_THREADS
    } else {
        rc = L->launch(L->func, g[0], g[1], g[2], L->threads, 1, 1, L->shared, handle, params, extra_p);
    }
    if (ptrs != stack_ptrs) free(ptrs);
    return rc;
}

/* Recording (runtime/opfast.py): while this thread's list is set, each launch appends (launcher, the packed
 * buffer, the grid launched, the stream handle) to it. */
static _Thread_local PyObject *record_list = NULL;

static int record_launch(Launcher *L, const unsigned char *buf, const unsigned g[3], void *handle) {
    if (record_list == NULL) return 0;
    PyObject *item = Py_BuildValue("(Oy#(III)K)", (PyObject *)L, (const char *)buf, L->size, g[0], g[1], g[2],
                                   (unsigned long long)(uintptr_t)handle);
    if (item == NULL) return PY_ERROR;
    int rc = PyList_Append(record_list, item);
    Py_DECREF(item);
    return rc < 0 ? PY_ERROR : 0;
}

/* The launch: 0, a status (> 0 the launch function's, < 0 ours), or PY_ERROR with an exception set. */
static int launch_impl(Launcher *L, PyObject *args, PyObject *grid, PyObject *stream) {
    unsigned g[3];
    PyObject *gseq = PySequence_Fast(grid, "launcher: grid must be a sequence of 3 ints");
    if (gseq == NULL) return PY_ERROR;
    if (PySequence_Fast_GET_SIZE(gseq) != 3) {
        Py_DECREF(gseq);
        PyErr_SetString(PyExc_TypeError, "launcher: grid must be a sequence of 3 ints");
        return PY_ERROR;
    }
    for (int k = 0; k < 3; k++) {
        if (grid_axis(PySequence_Fast_GET_ITEM(gseq, k), &g[k]) < 0) {
            Py_DECREF(gseq);
            return PY_ERROR;
        }
    }
    Py_DECREF(gseq);
    if (g[1] > L->max_gy || g[2] > L->max_gz) return GRID_REFUSED;

    void *handle;
    if (stream == Py_None) {
        if (ABSENT(L->stream_fn)) return STREAM_NOT_A_HANDLE;
        PyObject *h = PyObject_CallOneArg(L->stream_fn, L->device_obj);
        if (h == NULL) return PY_ERROR;
        handle = PyLong_AsVoidPtr(h);
        Py_DECREF(h);
        if (handle == NULL && PyErr_Occurred()) return PY_ERROR;
    } else if (PyLong_Check(stream)) {
        handle = PyLong_AsVoidPtr(stream);
        if (handle == NULL && PyErr_Occurred()) return PY_ERROR;
    } else {
        return STREAM_NOT_A_HANDLE;
    }

    _Alignas(64) unsigned char stack_buf[STACK_BYTES];
    unsigned char *buf = stack_buf;
    if (L->size > STACK_BYTES) {
        buf = PyMem_Malloc((size_t)L->size);
        if (buf == NULL) {
            PyErr_NoMemory();
            return PY_ERROR;
        }
    }
    int rc = pack_args(L, args, buf);
    if (rc == 0 && !ABSENT(L->tail_fn)) rc = write_tail(L, args, buf);
    if (rc == 0 && L->grid_off >= 0) rc = persistent_grid(L, buf, g);
    if (rc != 0) {
        if (buf != stack_buf) PyMem_Free(buf);
        return rc;
    }
    rc = launch_packed(L, buf, g, handle, 1);
    if (rc == 0) rc = record_launch(L, buf, g, handle);
    if (buf != stack_buf) PyMem_Free(buf);
    return rc;
}

/* launcher(args, grid, stream) -> None when launched; otherwise on_status(status, args, grid, stream)'s
 * result (it raises, or resolves the stream and launches), or the status itself without on_status */
static PyObject *Launcher_call(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    Launcher *L = (Launcher *)self;
    if (PyVectorcall_NARGS(nargsf) != 3 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "Launcher(args, grid, stream) takes 3 positional arguments");
        return NULL;
    }
    int rc = launch_impl(L, argv[0], argv[1], argv[2]);
    if (rc == 0) Py_RETURN_NONE;
    if (rc == PY_ERROR) return NULL;
    PyObject *st = PyLong_FromLong(rc);
    if (st == NULL || ABSENT(L->on_status)) return st;
    PyObject *call[4] = {st, argv[0], argv[1], argv[2]};
    PyObject *out = PyObject_Vectorcall(L->on_status, call, 4, NULL);
    Py_DECREF(st);
    return out;
}

/* pack(args) -> bytes, or an int status when the arguments are refused */
static PyObject *Launcher_pack(PyObject *self, PyObject *args) {
    Launcher *L = (Launcher *)self;
    PyObject *out = PyBytes_FromStringAndSize(NULL, L->size);
    if (out == NULL) return NULL;
    int rc = pack_args(L, args, (unsigned char *)PyBytes_AS_STRING(out));
    if (rc == 0 && !ABSENT(L->tail_fn)) rc = write_tail(L, args, (unsigned char *)PyBytes_AS_STRING(out));
    if (rc != 0) {
        Py_DECREF(out);
        return status(rc);
    }
    return out;
}

static void *as_ptr(PyObject *o) {
    if (o == Py_None) return NULL;
    return PyLong_AsVoidPtr(o);
}

/* Launcher(func, launch, threads, shared, params, size, device=-1, *, use_params=False,
 *          ptr_offsets=(), tags=(1, 2, 0), max_gy=65535, max_gz=65535, stream_fn=None,
 *          tail_fn=None, tail_offset=0, on_status=None, grid_offset=-1, max_blocks=0, tmaps=(), encode=None)
 * params: per parameter (kind, offset, rank, shape_offset, stride_offset[, stored]), kind 0 gl, 1 i32, 2 f32;
 * stored 1: a gl the kernel stores to, refused (LAUNCH_REFUSED) when its elements share memory
 * tmaps: per tensor map of the tail (param index, CUtensorMapDataType, element bytes, box_cols, box_rows, bit, transpose);
 * with encode (cuTensorMapEncodeTiled's address) the tail is encoded here, tail_fn being the ctypes path's */
static int Launcher_init(PyObject *self, PyObject *args, PyObject *kw) {
    Launcher *L = (Launcher *)self;
    static char *names[] = {"func", "launch", "threads", "shared", "params", "size", "device", "use_params",
                            "ptr_offsets", "tags", "max_gy", "max_gz", "stream_fn", "tail_fn", "tail_offset",
                            "on_status", "grid_offset", "max_blocks", "tmaps", "encode", NULL};
    PyObject *func, *launch, *params, *ptr_offsets = NULL, *tags = NULL, *stream_fn = Py_None, *tail_fn = Py_None,
             *on_status = Py_None, *tmaps = NULL, *encode = Py_None;
    unsigned threads, shared, max_gy = 65535, max_gz = 65535;
    Py_ssize_t size, tail_off = 0, grid_off = -1;
    unsigned max_blocks = 0;
    long device = -1;
    int use_params = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOIIOn|l$pOOIIOOnOnIOO", names, &func, &launch, &threads, &shared,
                                     &params, &size, &device, &use_params, &ptr_offsets, &tags, &max_gy, &max_gz,
                                     &stream_fn, &tail_fn, &tail_off, &on_status, &grid_off, &max_blocks, &tmaps,
                                     &encode))
        return -1;
    if (L->params != NULL) {
        PyErr_SetString(PyExc_TypeError, "Launcher is initialised once");
        return -1;
    }
    L->func = as_ptr(func);
    if (PyErr_Occurred()) return -1;
    L->launch = (hk_launch_fn)as_ptr(launch);
    if (PyErr_Occurred()) return -1;
    L->threads = threads;
    L->shared = shared;
    L->max_gy = max_gy;
    L->max_gz = max_gz;
    L->device = device;
    L->use_params = use_params;
    if (size < 0 || tail_off < 0 || tail_off > size) {
        PyErr_SetString(PyExc_ValueError, "Launcher: bad size or tail_offset");
        return -1;
    }
    if (grid_off >= 0 && (grid_off > size - 12 || max_blocks == 0)) {
        PyErr_SetString(PyExc_ValueError, "Launcher: a persistent grid needs grid_offset + 12 <= size and max_blocks > 0");
        return -1;
    }
    L->size = size;
    L->tail_off = tail_off;
    L->grid_off = grid_off;
    L->max_blocks = max_blocks;
    PyObject *dev = PyLong_FromLong(device);
    if (dev == NULL) return -1;
    Py_XSETREF(L->device_obj, dev);
    Py_INCREF(stream_fn);
    Py_XSETREF(L->stream_fn, stream_fn);
    Py_INCREF(tail_fn);
    Py_XSETREF(L->tail_fn, tail_fn);
    Py_INCREF(on_status);
    Py_XSETREF(L->on_status, on_status);
    L->tags[0] = (void *)1;
    L->tags[1] = (void *)2;
    L->tags[2] = (void *)0;
    if (tags != NULL && tags != Py_None) {
        if (!PyTuple_Check(tags) || PyTuple_GET_SIZE(tags) != 3) {
            PyErr_SetString(PyExc_TypeError, "Launcher: tags must be (BUFFER_POINTER, BUFFER_SIZE, END)");
            return -1;
        }
        for (int k = 0; k < 3; k++) {
            L->tags[k] = as_ptr(PyTuple_GET_ITEM(tags, k));
            if (PyErr_Occurred()) return -1;
        }
    }
    PyObject *seq = PySequence_Fast(params, "Launcher: params must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    L->params = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Param));
    if (L->params == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    L->nparams = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        Param *p = &L->params[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ininn|i;Launcher: a param is (kind, offset, rank, "
                              "shape_offset, stride_offset[, stored])", &p->kind, &p->off, &p->rank, &p->shape_off,
                              &p->stride_off, &p->stored)) {
            Py_DECREF(seq);
            return -1;
        }
        Py_ssize_t end = p->kind == KIND_GL ? p->stride_off + 8 * (Py_ssize_t)p->rank : p->off + 4;
        if (p->kind < KIND_GL || p->kind > KIND_F32 || p->rank < 0 || p->off < 0 || end > size ||
            (p->kind == KIND_GL && (p->off + 8 > size || p->shape_off < p->off + 8 ||
                                    p->shape_off + 4 * (Py_ssize_t)p->rank > p->stride_off))) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "Launcher: param %zd does not fit the %zd-byte buffer", i, size);
            return -1;
        }
    }
    Py_DECREF(seq);
    if (ptr_offsets != NULL && ptr_offsets != Py_None) {
        seq = PySequence_Fast(ptr_offsets, "Launcher: ptr_offsets must be a sequence");
        if (seq == NULL) return -1;
        n = PySequence_Fast_GET_SIZE(seq);
        L->ptr_offsets = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
        if (L->ptr_offsets == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        L->nptrs = n;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t o = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
            if (o == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            if (o < 0 || o >= (size ? size : 1)) {
                Py_DECREF(seq);
                PyErr_Format(PyExc_ValueError, "Launcher: pointer offset %zd is outside the buffer", o);
                return -1;
            }
            L->ptr_offsets[i] = o;
        }
        Py_DECREF(seq);
    }
    if (init_tmaps(L, tmaps, encode) < 0) return -1;
    if (L->use_params && L->nptrs == 0 && L->nparams > 0) {
        PyErr_SetString(PyExc_ValueError, "Launcher: use_params needs ptr_offsets");
        return -1;
    }
    if (L->launch == NULL) {
        PyErr_SetString(PyExc_ValueError, "Launcher: the launch function address is null");
        return -1;
    }
    L->vectorcall = Launcher_call;
    return 0;
}

/* tmaps and encode (Launcher_init's): each map on a gl parameter of rank 2..TMAP_MAX_RANK, the tail long enough */
static int init_tmaps(Launcher *L, PyObject *tmaps, PyObject *encode) {
    if (tmaps == NULL || tmaps == Py_None || encode == Py_None) return 0;
    PyObject *seq = PySequence_Fast(tmaps, "Launcher: tmaps must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    L->tmaps = PyMem_Calloc((size_t)(n ? n : 1), sizeof(TMap));
    if (L->tmaps == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    L->ntmaps = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        TMap *m = &L->tmaps[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "niiIIip;Launcher: a tmap is (param, dtype, esize, "
                              "box_cols, box_rows, bit, transpose)", &m->param, &m->dtype, &m->esize, &m->box_cols,
                              &m->box_rows, &m->bit, &m->transpose)) {
            Py_DECREF(seq);
            return -1;
        }
        const Param *p = m->param >= 0 && m->param < L->nparams ? &L->params[m->param] : NULL;
        if (p == NULL || p->kind != KIND_GL || p->rank < 2 || p->rank > TMAP_MAX_RANK || m->esize <= 0) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "Launcher: tmap %zd is not on a gl parameter of rank 2..%d", i,
                         TMAP_MAX_RANK);
            return -1;
        }
    }
    Py_DECREF(seq);
    if (L->tail_off + TMAP_BYTES * n + 4 > L->size) {
        PyErr_SetString(PyExc_ValueError, "Launcher: the tensor maps and their flag do not fit after tail_offset");
        return -1;
    }
    L->encode = (hk_encode_fn)as_ptr(encode);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *Launcher_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Launcher *L = (Launcher *)type->tp_alloc(type, 0);
    if (L == NULL) return NULL;
    L->vectorcall = NULL;
    return (PyObject *)L;
}

static PyObject *Launcher_tp_call(PyObject *self, PyObject *args, PyObject *kw) {
    Launcher *L = (Launcher *)self;
    if (L->vectorcall == NULL) {
        PyErr_SetString(PyExc_TypeError, "Launcher is not initialised");
        return NULL;
    }
    return PyVectorcall_Call(self, args, kw);
}

static int Launcher_traverse(PyObject *self, visitproc visit, void *arg) {
    Launcher *L = (Launcher *)self;
    Py_VISIT(L->stream_fn);
    Py_VISIT(L->tail_fn);
    Py_VISIT(L->on_status);     /* a plan's bound method: plan -> launcher -> plan */
    return 0;
}

static int Launcher_clear(PyObject *self) {
    Launcher *L = (Launcher *)self;
    Py_CLEAR(L->stream_fn);
    Py_CLEAR(L->tail_fn);
    Py_CLEAR(L->on_status);
    return 0;
}

static void Launcher_dealloc(PyObject *self) {
    Launcher *L = (Launcher *)self;
    PyObject_GC_UnTrack(self);
    Launcher_clear(self);
    Py_XDECREF(L->tail_cache);
    PyMem_Free(L->tail_key);
    PyMem_Free(L->params);
    PyMem_Free(L->ptr_offsets);
    PyMem_Free(L->tmaps);
    Py_XDECREF(L->device_obj);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *Launcher_get_size(PyObject *self, void *closure) {
    return PyLong_FromSsize_t(((Launcher *)self)->size);
}

/* where each gl parameter's data pointer lies in the buffer (op recording resolves them to tensors) */
static PyObject *Launcher_get_data_offsets(PyObject *self, void *closure) {
    Launcher *L = (Launcher *)self;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < L->nparams; i++) {
        if (L->params[i].kind != KIND_GL) continue;
        PyObject *o = PyLong_FromSsize_t(L->params[i].off);
        if (o == NULL || PyList_Append(out, o) < 0) {
            Py_XDECREF(o);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(o);
    }
    Py_SETREF(out, PyList_AsTuple(out));
    return out;
}

/* whether a recorded launch can be replayed without Python: its tail, if any, is encoded here */
static PyObject *Launcher_get_replayable(PyObject *self, void *closure) {
    Launcher *L = (Launcher *)self;
    return PyBool_FromLong(ABSENT(L->tail_fn) || L->encode != NULL);
}

static PyMethodDef Launcher_methods[] = {
    {"pack", Launcher_pack, METH_O, "pack(args) -> the parameter buffer as bytes, or an int status"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Launcher_getset[] = {
    {"size", Launcher_get_size, NULL, "bytes of the parameter buffer", NULL},
    {"data_offsets", Launcher_get_data_offsets, NULL, "offsets of the gl parameters' data pointers", NULL},
    {"replayable", Launcher_get_replayable, NULL, "whether op replay can launch it without Python", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hk_portable._hk_launcher.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_dealloc = Launcher_dealloc,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_call = Launcher_tp_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A kernel's packer and launch call (see the module docstring).",
    .tp_traverse = Launcher_traverse,
    .tp_clear = Launcher_clear,
    .tp_methods = Launcher_methods,
    .tp_getset = Launcher_getset,
    .tp_init = Launcher_init,
    .tp_new = Launcher_new,
};

/* ----------------------------------------------------------------------------------------- ByDevice */
/* ByDevice(device_fn, table, fallback)(args, grid, stream): table[device_fn()](args, grid, stream), or
 * fallback(args, grid, stream) when the current device has no launcher yet (the backend's launch, which
 * loads the kernel there and adds one). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *device_fn, *table, *fallback;
} ByDevice;

static PyObject *ByDevice_call(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    ByDevice *B = (ByDevice *)self;
    PyObject *dev = PyObject_CallNoArgs(B->device_fn);
    if (dev == NULL) return NULL;
    PyObject *target = PyDict_GetItemWithError(B->table, dev);
    Py_DECREF(dev);
    if (target == NULL) {
        if (PyErr_Occurred()) return NULL;
        target = B->fallback;
    }
    Py_INCREF(target);
    PyObject *out = PyObject_Vectorcall(target, argv, nargsf, kwnames);
    Py_DECREF(target);
    return out;
}

static int ByDevice_init(PyObject *self, PyObject *args, PyObject *kw) {
    ByDevice *B = (ByDevice *)self;
    static char *names[] = {"device_fn", "table", "fallback", NULL};
    PyObject *device_fn, *table, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!O", names, &device_fn, &PyDict_Type, &table, &fallback))
        return -1;
    Py_INCREF(device_fn);
    Py_XSETREF(B->device_fn, device_fn);
    Py_INCREF(table);
    Py_XSETREF(B->table, table);
    Py_INCREF(fallback);
    Py_XSETREF(B->fallback, fallback);
    B->vectorcall = ByDevice_call;
    return 0;
}

static PyObject *ByDevice_tp_call(PyObject *self, PyObject *args, PyObject *kw) {
    if (((ByDevice *)self)->vectorcall == NULL) {
        PyErr_SetString(PyExc_TypeError, "ByDevice is not initialised");
        return NULL;
    }
    return PyVectorcall_Call(self, args, kw);
}

static int ByDevice_traverse(PyObject *self, visitproc visit, void *arg) {
    ByDevice *B = (ByDevice *)self;
    Py_VISIT(B->device_fn);
    Py_VISIT(B->table);
    Py_VISIT(B->fallback);
    return 0;
}

static int ByDevice_clear(PyObject *self) {
    ByDevice *B = (ByDevice *)self;
    Py_CLEAR(B->device_fn);
    Py_CLEAR(B->table);
    Py_CLEAR(B->fallback);
    return 0;
}

static void ByDevice_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    ByDevice_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject ByDeviceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hk_portable._hk_launcher.ByDevice",
    .tp_basicsize = sizeof(ByDevice),
    .tp_dealloc = ByDevice_dealloc,
    .tp_vectorcall_offset = offsetof(ByDevice, vectorcall),
    .tp_call = ByDevice_tp_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The current device's launcher of one kernel (see ByDevice_call).",
    .tp_traverse = ByDevice_traverse,
    .tp_clear = ByDevice_clear,
    .tp_init = ByDevice_init,
    .tp_new = PyType_GenericNew,
};

/* --------------------------------------------------------------------------------------------- grid3 */
/* grid3(grid) -> (gx, gy, gz) for an int or a tuple of 1 to 3 ints in [0, 2**31) (bools are not ints
 * here), else None: the caller's Python check then raises its message. */
static int grid_int(PyObject *o) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    return !overflow && v >= 0 && v < 2147483648LL;
}

static PyObject *grid3(PyObject *mod, PyObject *grid) {
    PyObject *one = NULL, *out;
    if (PyLong_CheckExact(grid)) {
        if (!grid_int(grid)) Py_RETURN_NONE;
        if ((one = PyLong_FromLong(1)) == NULL) return NULL;
        out = PyTuple_Pack(3, grid, one, one);
        Py_DECREF(one);
        return out;
    }
    if (!PyTuple_CheckExact(grid)) Py_RETURN_NONE;
    Py_ssize_t n = PyTuple_GET_SIZE(grid);
    if (n < 1 || n > 3) Py_RETURN_NONE;
    for (Py_ssize_t k = 0; k < n; k++)
        if (!grid_int(PyTuple_GET_ITEM(grid, k))) Py_RETURN_NONE;
    if (n == 3) {
        Py_INCREF(grid);
        return grid;
    }
    if ((one = PyLong_FromLong(1)) == NULL) return NULL;
    out = n == 1 ? PyTuple_Pack(3, PyTuple_GET_ITEM(grid, 0), one, one)
                 : PyTuple_Pack(3, PyTuple_GET_ITEM(grid, 0), PyTuple_GET_ITEM(grid, 1), one);
    Py_DECREF(one);
    return out;
}

/* ----------------------------------------------------------------------------------------- signature */
/* signature(args) -> flat tuple: per tensor its dtype, ndim and device, per other value its type.
 * Unambiguous: a tensor's run starts with a torch.dtype, which is never a type. */
static PyObject *signature_tuple(PyObject *args);

static PyObject *signature(PyObject *mod, PyObject *args) {
    if (tensor_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "signature: set_tensor_type(torch.Tensor) was not called");
        return NULL;
    }
    if (PyTuple_Check(args)) return signature_tuple(args);
    PyObject *t = PySequence_Tuple(args);
    if (t == NULL) return NULL;
    PyObject *out = signature_tuple(t);
    Py_DECREF(t);
    return out;
}

static PyObject *signature_tuple(PyObject *args) {
    Py_ssize_t n = PyTuple_GET_SIZE(args), len = 0;
    int is_tensor[64];
    int *flags = n <= 64 ? is_tensor : PyMem_Malloc(sizeof(int) * (size_t)n);
    if (flags == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        int t = Py_TYPE(a) == (PyTypeObject *)tensor_type ? 1 : PyObject_IsInstance(a, tensor_type);
        if (t < 0) goto fail;
        flags[i] = t;
        len += t ? 3 : 1;
    }
    PyObject *out = PyTuple_New(len);
    if (out == NULL) goto fail;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        if (!flags[i]) {
            Py_INCREF(Py_TYPE(a));
            PyTuple_SET_ITEM(out, k++, (PyObject *)Py_TYPE(a));
            continue;
        }
        PyObject *v;
        Py_ssize_t prev = -1, at = 0;       /* the same tensor earlier in the call: its three items again */
        for (Py_ssize_t j = 0; j < i && prev < 0; j++) {
            if (flags[j] && PyTuple_GET_ITEM(args, j) == a) prev = at;
            at += flags[j] ? 3 : 1;
        }
        if (prev >= 0) {
            for (int m = 0; m < 3; m++) {
                v = PyTuple_GET_ITEM(out, prev + m);
                Py_INCREF(v);
                PyTuple_SET_ITEM(out, k++, v);
            }
            continue;
        }
        if ((v = PyObject_GetAttr(a, s_dtype)) == NULL) goto fail_out;
        PyTuple_SET_ITEM(out, k++, v);
        if ((v = PyObject_GetAttr(a, s_ndim)) == NULL) goto fail_out;
        PyTuple_SET_ITEM(out, k++, v);
        if ((v = PyObject_GetAttr(a, s_device)) == NULL) goto fail_out;
        PyTuple_SET_ITEM(out, k++, v);
        continue;
    fail_out:
        Py_DECREF(out);     /* unset slots are NULL: tuple dealloc skips them */
        goto fail;
    }
    if (flags != is_tensor) PyMem_Free(flags);
    return out;
fail:
    if (flags != is_tensor) PyMem_Free(flags);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ fastcall */
/* fastcall(table, nargs, args, kwargs, backend, target, stream, grid): Kernel.__call__'s fast path.
 * The key is the one runtime/launch.py's _fast_key builds (signature, kwargs items, backend or its id,
 * target, the use_backend context, HK_BACKEND as stored); `table` maps keys to (backend, artifact,
 * fast_launch). Returns None when fast_launch launched; the hit when Python must finish the call (no
 * fast_launch, or a grid that is not a plain non-empty one); [key] on a miss; False when the call does
 * not qualify (wrong argument count, an unhashable const). */
static PyObject *ctx_var, *env_store, *env_key, *env_fn, *empty_tuple;

static PyObject *call_key(PyObject *args, PyObject *kwargs, PyObject *backend, PyObject *target) {
    PyObject *sig = NULL, *kw = NULL, *be = NULL, *ctx = NULL, *env = NULL, *key = NULL;
    if ((sig = signature_tuple(args)) == NULL) goto done;
    if (kwargs == Py_None || PyDict_GET_SIZE(kwargs) == 0) {
        kw = Py_NewRef(empty_tuple);
    } else {
        PyObject *items = PyDict_Items(kwargs);
        if (items == NULL) goto done;
        kw = PyList_AsTuple(items);
        Py_DECREF(items);
        if (kw == NULL) goto done;
    }
    be = (backend == Py_None || PyUnicode_CheckExact(backend)) ? Py_NewRef(backend) : PyLong_FromVoidPtr(backend);
    if (be == NULL) goto done;
    if (ctx_var != NULL) {
        if (PyContextVar_Get(ctx_var, Py_None, &ctx) < 0) goto done;
    } else {
        ctx = Py_NewRef(Py_None);
    }
    if (env_store != NULL) {
        env = PyDict_GetItemWithError(env_store, env_key);
        if (env == NULL && PyErr_Occurred()) goto done;
        env = Py_NewRef(env ? env : Py_None);
    } else if (env_fn != NULL) {
        if ((env = PyObject_CallNoArgs(env_fn)) == NULL) goto done;
    } else {
        env = Py_NewRef(Py_None);
    }
    key = PyTuple_Pack(6, sig, kw, be, target, ctx, env);
done:
    Py_XDECREF(sig);
    Py_XDECREF(kw);
    Py_XDECREF(be);
    Py_XDECREF(ctx);
    Py_XDECREF(env);
    return key;
}

static PyObject *fastcall(PyObject *mod, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 8 || !PyDict_Check(argv[0]) || !PyTuple_Check(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "fastcall(table, nargs, args: tuple, kwargs, backend, target, stream, grid)");
        return NULL;
    }
    if (tensor_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "fastcall: set_tensor_type(torch.Tensor) was not called");
        return NULL;
    }
    PyObject *table = argv[0], *args = argv[2], *grid = argv[7];
    Py_ssize_t want = PyLong_AsSsize_t(argv[1]);
    if (want == -1 && PyErr_Occurred()) return NULL;
    if (PyTuple_GET_SIZE(args) != want) Py_RETURN_FALSE;
    PyObject *key = call_key(args, argv[3], argv[4], argv[5]);
    if (key == NULL) return NULL;
    PyObject *hit = PyDict_GetItemWithError(table, key);
    if (hit == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
            PyErr_Clear();                           /* an unhashable const: the slow path reports it */
            Py_RETURN_FALSE;
        }
        PyObject *out = PyList_New(1);
        if (out == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyList_SET_ITEM(out, 0, key);
        return out;
    }
    Py_INCREF(hit);
    Py_DECREF(key);
    if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 3 || PyTuple_GET_ITEM(hit, 2) == Py_None) return hit;
    PyObject *g3 = grid3(NULL, grid);
    if (g3 == NULL) {
        Py_DECREF(hit);
        return NULL;
    }
    int plain = g3 != Py_None;
    for (int k = 0; plain && k < 3; k++)             /* grid3's axes are exact ints */
        plain = PyLong_AsLong(PyTuple_GET_ITEM(g3, k)) != 0;
    if (!plain) {                                    /* empty or not plain: Python checks it, in order */
        Py_DECREF(g3);
        return hit;
    }
    PyObject *launch = PyTuple_GET_ITEM(hit, 2);
    Py_INCREF(launch);
    Py_DECREF(hit);
    PyObject *call[3] = {args, g3, argv[6]};
    PyObject *res = PyObject_Vectorcall(launch, call, 3, NULL);
    Py_DECREF(launch);
    Py_DECREF(g3);
    if (res == NULL) return NULL;
    Py_DECREF(res);
    Py_RETURN_NONE;
}

/* configure(context_var, env_store, env_key, env_fn): where fastcall reads the use_backend context and
 * HK_BACKEND (runtime/selection.py); env_store None: it calls env_fn() instead. */
static PyObject *configure(PyObject *mod, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "configure(context_var, env_store, env_key, env_fn)");
        return NULL;
    }
    if (!PyContextVar_CheckExact(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "configure: context_var must be a contextvars.ContextVar");
        return NULL;
    }
    if (argv[1] != Py_None && !PyDict_Check(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "configure: env_store must be a dict or None");
        return NULL;
    }
    Py_XSETREF(ctx_var, Py_NewRef(argv[0]));
    Py_XSETREF(env_store, argv[1] == Py_None ? NULL : Py_NewRef(argv[1]));
    Py_XSETREF(env_key, Py_NewRef(argv[2]));
    Py_XSETREF(env_fn, argv[3] == Py_None ? NULL : Py_NewRef(argv[3]));
    Py_RETURN_NONE;
}

static PyObject *set_tensor_type(PyObject *mod, PyObject *t) {
    if (!PyType_Check(t)) {
        PyErr_SetString(PyExc_TypeError, "set_tensor_type: a type is needed");
        return NULL;
    }
    Py_INCREF(t);
    Py_XSETREF(tensor_type, t);
    Py_RETURN_NONE;
}

/* record_into(list | None): this thread's launches are appended to the list until it is None again */
static PyObject *record_into(PyObject *mod, PyObject *lst) {
    if (lst != Py_None && !PyList_Check(lst)) {
        PyErr_SetString(PyExc_TypeError, "record_into: a list or None");
        return NULL;
    }
    Py_XSETREF(record_list, lst == Py_None ? NULL : Py_NewRef(lst));
    Py_RETURN_NONE;
}

/* ----------------------------------------------------------------------------- the C API (op replay)
 * runtime/opfast.cpp replays recorded launches through these, without the GIL and without Python objects:
 * the Launchers it holds are kept alive by its plans. Layout fixed by HK_LAUNCHER_ABI. */
typedef struct {
    int abi;
    Py_ssize_t (*size)(PyObject *launcher);                   /* bytes of the buffer */
    Py_ssize_t (*tail_offset)(PyObject *launcher);            /* where the tensor maps start; -1: none */
    void (*encode_tail)(PyObject *launcher, unsigned char *buf);  /* the maps again from the packed pointers */
    int (*launch)(PyObject *launcher, unsigned char *buf, const unsigned g[3], void *stream);
} hk_launcher_api;

static Py_ssize_t api_size(PyObject *o) { return ((Launcher *)o)->size; }
static Py_ssize_t api_tail_offset(PyObject *o) {
    Launcher *L = (Launcher *)o;
    return L->encode != NULL && L->ntmaps > 0 ? L->tail_off : -1;
}
static void api_encode_tail(PyObject *o, unsigned char *buf) {
    Launcher *L = (Launcher *)o;
    encode_tail_into(L, buf, buf + L->tail_off);
}
static int api_launch(PyObject *o, unsigned char *buf, const unsigned g[3], void *stream) {
    return launch_packed((Launcher *)o, buf, g, stream, 0);
}
static hk_launcher_api c_api = {HK_LAUNCHER_ABI, api_size, api_tail_offset, api_encode_tail, api_launch};

static PyMethodDef module_methods[] = {
    {"record_into", record_into, METH_O, "record_into(list | None): record this thread's launches into the list"},
    {"signature", signature, METH_O, "signature(args) -> the flat argument-kind key of a kernel call"},
    {"set_tensor_type", set_tensor_type, METH_O, "set_tensor_type(torch.Tensor)"},
    {"grid3", grid3, METH_O, "grid3(grid) -> (gx, gy, gz), or None when the grid needs the Python check"},
    {"fastcall", (PyCFunction)(void (*)(void))fastcall, METH_FASTCALL, "Kernel.__call__'s fast path (see clauncher.c)"},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, "configure(context_var, env_store, env_key, env_fn)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hk_launcher", "hk_portable's compiled launcher (runtime/clauncher.py)", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hk_launcher(void) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_get_device, "get_device");
    INTERN(s_stride, "stride");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_ndim, "ndim");
    INTERN(s_device, "device");
#undef INTERN
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&ByDeviceType) < 0) return NULL;
    if ((empty_tuple = PyTuple_New(0)) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&LauncherType);
    Py_INCREF(&ByDeviceType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0 ||
        PyModule_AddObject(m, "ByDevice", (PyObject *)&ByDeviceType) < 0 ||
        PyModule_AddIntConstant(m, "ABI", HK_LAUNCHER_ABI) < 0 ||
        PyModule_AddIntConstant(m, "LAUNCH_REFUSED", LAUNCH_REFUSED) < 0 ||
        PyModule_AddIntConstant(m, "GRID_REFUSED", GRID_REFUSED) < 0 ||
        PyModule_AddIntConstant(m, "STREAM_NOT_A_HANDLE", STREAM_NOT_A_HANDLE) < 0 ||
        PyModule_AddIntConstant(m, "STACK_BYTES", STACK_BYTES) < 0 ||
        PyModule_AddObject(m, "_C_API", PyCapsule_New(&c_api, "hk_portable._hk_launcher._C_API", NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

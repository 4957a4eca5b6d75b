/*
 * Compiled region index for the Python simulator: a thin Python type around the
 * algorithm in _regions_core.h (the same rules as dtrlab/runtime/regions.py).
 *
 * Shared buffers (owned by the Python simulator):
 *   material            bytearray, 1 when the storage is resident
 *   compute             array('q'), each storage's own compute
 *   region_compute      array('q'), written here: forward region compute
 *   region_rev_compute  array('q'), written here: reverse region compute
 */
#include "_regions_core.h"
#include "_pytype.h"

typedef struct {
    PyObject_HEAD
    Py_buffer material_buf, compute_buf, fwd_buf, rev_buf;
    Regions regions;
    IntVec batch; /* storage ids of one materialized() call */
} RegionIndex;

static int check_storage(RegionIndex *self, Py_ssize_t s) {
    if (s < 0 || s >= self->regions.n) {
        PyErr_Format(PyExc_IndexError, "storage id %zd out of range [0, %zd)", s, self->regions.n);
        return -1;
    }
    return 0;
}

static void RegionIndex_dealloc(RegionIndex *self) {
    regions_release(&self->regions);
    PyMem_Free(self->batch.items);
    if (self->material_buf.obj) PyBuffer_Release(&self->material_buf);
    if (self->compute_buf.obj) PyBuffer_Release(&self->compute_buf);
    if (self->fwd_buf.obj) PyBuffer_Release(&self->fwd_buf);
    if (self->rev_buf.obj) PyBuffer_Release(&self->rev_buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n, int writable,
                      const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->itemsize != itemsize || view->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd items of %zd bytes", what, n, itemsize);
        return -1;
    }
    return 0;
}

static int RegionIndex_init(RegionIndex *self, PyObject *args, PyObject *kwds) {
    Py_ssize_t n;
    PyObject *material, *compute, *fwd, *rev;
    if (!PyArg_ParseTuple(args, "nOOOO", &n, &material, &compute, &fwd, &rev)) return -1;
    if (n < 0 || n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "storage count out of range");
        return -1;
    }
    if (get_buffer(material, &self->material_buf, 1, n, 0, "material") < 0 ||
        get_buffer(compute, &self->compute_buf, 8, n, 0, "compute") < 0 ||
        get_buffer(fwd, &self->fwd_buf, 8, n, 1, "region_compute") < 0 ||
        get_buffer(rev, &self->rev_buf, 8, n, 1, "region_rev_compute") < 0)
        return -1;
    return regions_init(&self->regions, n, self->material_buf.buf, self->compute_buf.buf, self->fwd_buf.buf,
                        self->rev_buf.buf);
}

static PyObject *RegionIndex_link(RegionIndex *self, PyObject *args) {
    Py_ssize_t parent, child;
    if (!PyArg_ParseTuple(args, "nn", &parent, &child)) return NULL;
    if (check_storage(self, parent) < 0 || check_storage(self, child) < 0 ||
        regions_link(&self->regions, (int32_t)parent, (int32_t)child) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *RegionIndex_materialized(RegionIndex *self, PyObject *storages) {
    PyObject *seq = PySequence_Fast(storages, "materialized() takes a sequence of storage ids");
    if (!seq) return NULL;
    self->batch.len = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if ((s == -1 && PyErr_Occurred()) || check_storage(self, s) < 0 || vec_push(&self->batch, (int32_t)s) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    /* The Python simulator and analyses read regions at any time: no rebuild is left owed. */
    if (regions_materialized(&self->regions, self->batch.items, self->batch.len) < 0 ||
        regions_flush(&self->regions) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *RegionIndex_evicted(RegionIndex *self, PyObject *arg) {
    Py_ssize_t s = PyLong_AsSsize_t(arg);
    if ((s == -1 && PyErr_Occurred()) || check_storage(self, s) < 0 || regions_evicted(&self->regions, (int32_t)s) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *bits_to_list(const uint64_t *bits, Py_ssize_t words) {
    PyObject *list = PyList_New(0);
    if (!list || !bits) return list;
    for (Py_ssize_t w = 0; w < words; w++) {
        uint64_t word = bits[w];
        while (word) {
            PyObject *item = PyLong_FromSsize_t((w << 6) + __builtin_ctzll(word));
            if (!item || PyList_Append(list, item) < 0) { Py_XDECREF(item); Py_DECREF(list); return NULL; }
            Py_DECREF(item);
            word &= word - 1;
        }
    }
    return list;
}

static PyObject *RegionIndex_region(RegionIndex *self, PyObject *args) {
    Py_ssize_t s;
    int forward = 1;
    if (!PyArg_ParseTuple(args, "n|p", &s, &forward)) return NULL;
    if (check_storage(self, s) < 0) return NULL;
    Region *region = &self->regions.regions[forward ? 0 : 1][s];
    PyObject *interior = bits_to_list(region->interior, self->regions.words);
    PyObject *frontier = bits_to_list(region->frontier, self->regions.words);
    if (!interior || !frontier) { Py_XDECREF(interior); Py_XDECREF(frontier); return NULL; }
    return Py_BuildValue("(NN)", interior, frontier);
}

static PyObject *RegionIndex_dense_words(RegionIndex *self, void *closure) {
    return PyLong_FromLongLong(self->regions.dense_words);
}

static PyGetSetDef RegionIndex_getset[] = {
    {"dense_words", (getter)RegionIndex_dense_words, NULL,
     "Region bitset words written by transposing a dense block (the batched walks' fast path).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef RegionIndex_methods[] = {
    {"link", (PyCFunction)RegionIndex_link, METH_VARARGS, "link(parent, child): a child storage was computed from parent."},
    {"materialized", (PyCFunction)RegionIndex_materialized, METH_O, "Storages just became resident: rebuild regions."},
    {"evicted", (PyCFunction)RegionIndex_evicted, METH_O, "A storage was just evicted: neighbours absorb it."},
    {"region", (PyCFunction)RegionIndex_region, METH_VARARGS, "region(s, forward=True) -> (interior, frontier) lists."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RegionIndexType = {
    DTRLAB_PLAIN_TYPE("dtrlab.runtime._regions.RegionIndex", RegionIndex, RegionIndex_dealloc, RegionIndex_init,
                      "Compiled evicted-neighbourhood index; see dtrlab/runtime/regions.py."),
    .tp_methods = RegionIndex_methods,
    .tp_getset = RegionIndex_getset,
};

static struct PyModuleDef regions_module = {
    PyModuleDef_HEAD_INIT, "_regions", "Compiled region index for dtrlab's simulator.", -1, NULL,
};

PyMODINIT_FUNC PyInit__regions(void) {
    if (PyType_Ready(&RegionIndexType) < 0) return NULL;
    PyObject *regions = PyImport_ImportModule("dtrlab.runtime.regions");
    if (!regions) return NULL;
    RegionError = PyObject_GetAttrString(regions, "RegionError");
    Py_DECREF(regions);
    if (!RegionError) return NULL;
    PyObject *module = PyModule_Create(&regions_module);
    if (!module) return NULL;
    Py_INCREF(&RegionIndexType);
    if (PyModule_AddObject(module, "RegionIndex", (PyObject *)&RegionIndexType) < 0) {
        Py_DECREF(&RegionIndexType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

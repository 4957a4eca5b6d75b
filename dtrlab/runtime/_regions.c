/*
 * Compiled region index: the same rules as dtrlab/runtime/regions.py (read that
 * file first; its docstring explains what a region is and why it is maintained
 * this way). This version keeps each region's interior and frontier as bitsets
 * and walks the storage graph with a generation-stamped visited array, so a
 * rebuild allocates nothing and touches only the storages it reaches.
 *
 * Shared buffers (owned by the Python simulator):
 *   material            bytearray, 1 when the storage is resident
 *   compute             array('q'), each storage's own compute
 *   region_compute      array('q'), written here: forward region compute
 *   region_rev_compute  array('q'), written here: reverse region compute
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *RegionError; /* dtrlab.runtime.regions.RegionError */

typedef struct {
    int32_t *items;
    Py_ssize_t len, cap;
} IntVec;

typedef struct {
    uint64_t *interior, *frontier; /* NULL until the region is first built */
} Region;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, words;
    Py_buffer material_buf, compute_buf, fwd_buf, rev_buf;
    const uint8_t *material;
    const int64_t *compute;
    int64_t *region_compute[2]; /* [0] forward, [1] reverse */
    IntVec *edges[2];           /* [0] children storages, [1] parent storages */
    Region *regions[2];
    uint32_t *seen;             /* generation stamps for walks */
    uint32_t generation;
    int32_t *stack;
    uint64_t *scratch[2];       /* affected-storage bitsets for materialized() */
} RegionIndex;

static int vec_push(IntVec *vec, int32_t value) {
    if (vec->len == vec->cap) {
        Py_ssize_t cap = vec->cap ? 2 * vec->cap : 4;
        int32_t *items = PyMem_Realloc(vec->items, cap * sizeof(int32_t));
        if (!items) { PyErr_NoMemory(); return -1; }
        vec->items = items;
        vec->cap = cap;
    }
    vec->items[vec->len++] = value;
    return 0;
}

static int vec_contains(const IntVec *vec, int32_t value) {
    for (Py_ssize_t i = 0; i < vec->len; i++)
        if (vec->items[i] == value) return 1;
    return 0;
}

#define BIT_GET(bits, i) (((bits)[(i) >> 6] >> ((i) & 63)) & 1u)
#define BIT_SET(bits, i) ((bits)[(i) >> 6] |= (uint64_t)1 << ((i) & 63))
#define BIT_CLEAR(bits, i) ((bits)[(i) >> 6] &= ~((uint64_t)1 << ((i) & 63)))

static int region_ensure(RegionIndex *self, Region *region) {
    if (region->interior) return 0;
    region->interior = PyMem_Calloc(2 * self->words, sizeof(uint64_t));
    if (!region->interior) { PyErr_NoMemory(); return -1; }
    region->frontier = region->interior + self->words;
    return 0;
}

static void region_clear(RegionIndex *self, Region *region) {
    if (region->interior) memset(region->interior, 0, 2 * self->words * sizeof(uint64_t));
}

/* An evicted storage has no regions until it is resident again: give the memory back. */
static void region_free(Region *region) {
    PyMem_Free(region->interior);
    region->interior = region->frontier = NULL;
}

static int check_storage(RegionIndex *self, Py_ssize_t s) {
    if (s < 0 || s >= self->n) {
        PyErr_Format(PyExc_IndexError, "storage id %zd out of range [0, %zd)", s, self->n);
        return -1;
    }
    return 0;
}

/* Walk the region of `base` in direction `dir` afresh. */
static int walk(RegionIndex *self, int32_t base, int dir) {
    Region *region = &self->regions[dir][base];
    if (region_ensure(self, region) < 0) return -1;
    region_clear(self, region);
    uint64_t *interior = region->interior, *frontier = region->frontier;
    IntVec *edges = self->edges[dir];
    const uint8_t *material = self->material;
    const int64_t *compute = self->compute;
    uint32_t *seen = self->seen;

    if (++self->generation == 0) { /* wrapped: reset stamps */
        memset(seen, 0, self->n * sizeof(uint32_t));
        self->generation = 1;
    }
    uint32_t generation = self->generation;
    int64_t gained = 0;
    Py_ssize_t top = 0;
    self->stack[top++] = base;
    while (top) {
        IntVec *out = &edges[self->stack[--top]];
        for (Py_ssize_t i = 0; i < out->len; i++) {
            int32_t us = out->items[i];
            if (material[us]) {
                if (us != base) BIT_SET(frontier, us);
            } else if (seen[us] != generation) {
                seen[us] = generation;
                gained += compute[us];
                BIT_SET(interior, us);
                self->stack[top++] = us;
            }
        }
    }
    self->region_compute[dir][base] = gained;
    return 0;
}

/* Region `owner` (direction dir) absorbs the just-evicted storage s and s's region. */
static int absorb(RegionIndex *self, int32_t owner, int32_t s, int dir) {
    Region *region = &self->regions[dir][owner];
    Region *evicted = &self->regions[dir][s];
    if (region_ensure(self, region) < 0 || region_ensure(self, evicted) < 0) return -1;
    if (!BIT_GET(region->frontier, s)) {
        PyErr_Format(RegionError, "storage %d is not on the frontier of a region it should join "
                     "(simrd fails the same assertion here)", (int)s);
        return -1;
    }
    BIT_CLEAR(region->frontier, s);
    /* simrd adds (evicted interior - own interior) plus s itself, as a set: s counts once. */
    int s_in_difference = BIT_GET(evicted->interior, s) && !BIT_GET(region->interior, s);
    int64_t gained = 0;
    const int64_t *compute = self->compute;
    for (Py_ssize_t w = 0; w < self->words; w++) {
        region->frontier[w] |= evicted->frontier[w];
        uint64_t added = evicted->interior[w] & ~region->interior[w];
        region->interior[w] |= added;
        while (added) {
            gained += compute[(w << 6) + __builtin_ctzll(added)];
            added &= added - 1;
        }
    }
    /* s joins the interior and is counted even if it was there already (as simrd does). */
    BIT_SET(region->interior, s);
    if (!s_in_difference) gained += compute[s];
    self->region_compute[dir][owner] += gained;
    return 0;
}

static void RegionIndex_dealloc(RegionIndex *self) {
    for (int dir = 0; dir < 2; dir++) {
        if (self->edges[dir]) {
            for (Py_ssize_t i = 0; i < self->n; i++) PyMem_Free(self->edges[dir][i].items);
            PyMem_Free(self->edges[dir]);
        }
        if (self->regions[dir]) {
            for (Py_ssize_t i = 0; i < self->n; i++) PyMem_Free(self->regions[dir][i].interior);
            PyMem_Free(self->regions[dir]);
        }
        PyMem_Free(self->scratch[dir]);
    }
    PyMem_Free(self->seen);
    PyMem_Free(self->stack);
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
    self->n = n;
    self->words = (n + 63) / 64;
    if (get_buffer(material, &self->material_buf, 1, n, 0, "material") < 0 ||
        get_buffer(compute, &self->compute_buf, 8, n, 0, "compute") < 0 ||
        get_buffer(fwd, &self->fwd_buf, 8, n, 1, "region_compute") < 0 ||
        get_buffer(rev, &self->rev_buf, 8, n, 1, "region_rev_compute") < 0)
        return -1;
    self->material = self->material_buf.buf;
    self->compute = self->compute_buf.buf;
    self->region_compute[0] = self->fwd_buf.buf;
    self->region_compute[1] = self->rev_buf.buf;
    Py_ssize_t count = n ? n : 1;
    for (int dir = 0; dir < 2; dir++) {
        self->edges[dir] = PyMem_Calloc(count, sizeof(IntVec));
        self->regions[dir] = PyMem_Calloc(count, sizeof(Region));
        self->scratch[dir] = PyMem_Calloc(self->words ? self->words : 1, sizeof(uint64_t));
    }
    self->seen = PyMem_Calloc(count, sizeof(uint32_t));
    self->stack = PyMem_Calloc(count, sizeof(int32_t));
    if (!self->edges[0] || !self->edges[1] || !self->regions[0] || !self->regions[1] || !self->seen ||
        !self->stack || !self->scratch[0] || !self->scratch[1]) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *RegionIndex_link(RegionIndex *self, PyObject *args) {
    Py_ssize_t parent, child;
    if (!PyArg_ParseTuple(args, "nn", &parent, &child)) return NULL;
    if (check_storage(self, parent) < 0 || check_storage(self, child) < 0) return NULL;
    if (parent != child) {
        /* Keep edges unique, as the reference's sets do; duplicates would only slow walks. */
        if (!vec_contains(&self->edges[0][parent], (int32_t)child) &&
            (vec_push(&self->edges[0][parent], (int32_t)child) < 0 ||
             vec_push(&self->edges[1][child], (int32_t)parent) < 0))
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *RegionIndex_materialized(RegionIndex *self, PyObject *storages) {
    PyObject *seq = PySequence_Fast(storages, "materialized() takes a sequence of storage ids");
    if (!seq) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    uint64_t *affected = self->scratch[0], *affected_rev = self->scratch[1];
    memset(affected, 0, self->words * sizeof(uint64_t));
    memset(affected_rev, 0, self->words * sizeof(uint64_t));
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if ((s == -1 && PyErr_Occurred()) || check_storage(self, s) < 0 ||
            walk(self, (int32_t)s, 0) < 0 || walk(self, (int32_t)s, 1) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        for (Py_ssize_t w = 0; w < self->words; w++) {
            affected[w] |= self->regions[1][s].frontier[w];
            affected_rev[w] |= self->regions[0][s].frontier[w];
        }
    }
    Py_DECREF(seq);
    for (int dir = 0; dir < 2; dir++) {
        uint64_t *bits = self->scratch[dir];
        for (Py_ssize_t w = 0; w < self->words; w++) {
            uint64_t word = bits[w];
            while (word) {
                if (walk(self, (int32_t)((w << 6) + __builtin_ctzll(word)), dir) < 0) return NULL;
                word &= word - 1;
            }
        }
    }
    Py_RETURN_NONE;
}

static PyObject *RegionIndex_evicted(RegionIndex *self, PyObject *arg) {
    Py_ssize_t s = PyLong_AsSsize_t(arg);
    if ((s == -1 && PyErr_Occurred()) || check_storage(self, s) < 0) return NULL;
    for (int dir = 0; dir < 2; dir++) {
        Region *evicted = &self->regions[dir][s];
        if (!evicted->interior) continue;
        /* Forward regions of the evicted storage's reverse frontier absorb it, and vice versa. */
        const uint64_t *owners = self->regions[1 - dir][s].frontier;
        if (!owners) continue;
        for (Py_ssize_t w = 0; w < self->words; w++) {
            uint64_t word = owners[w];
            while (word) {
                if (absorb(self, (int32_t)((w << 6) + __builtin_ctzll(word)), (int32_t)s, dir) < 0) return NULL;
                word &= word - 1;
            }
        }
    }
    for (int dir = 0; dir < 2; dir++) {
        region_free(&self->regions[dir][s]);
        self->region_compute[dir][s] = 0;
    }
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
    Region *region = &self->regions[forward ? 0 : 1][s];
    PyObject *interior = bits_to_list(region->interior, self->words);
    PyObject *frontier = bits_to_list(region->frontier, self->words);
    if (!interior || !frontier) { Py_XDECREF(interior); Py_XDECREF(frontier); return NULL; }
    return Py_BuildValue("(NN)", interior, frontier);
}

static PyMethodDef RegionIndex_methods[] = {
    {"link", (PyCFunction)RegionIndex_link, METH_VARARGS, "link(parent, child): a child storage was computed from parent."},
    {"materialized", (PyCFunction)RegionIndex_materialized, METH_O, "Storages just became resident: rebuild regions."},
    {"evicted", (PyCFunction)RegionIndex_evicted, METH_O, "A storage was just evicted: neighbours absorb it."},
    {"region", (PyCFunction)RegionIndex_region, METH_VARARGS, "region(s, forward=True) -> (interior, frontier) lists."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RegionIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dtrlab.runtime._regions.RegionIndex",
    .tp_basicsize = sizeof(RegionIndex),
    .tp_dealloc = (destructor)RegionIndex_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Compiled evicted-neighbourhood index; see dtrlab/runtime/regions.py.",
    .tp_methods = RegionIndex_methods,
    .tp_init = (initproc)RegionIndex_init,
    .tp_new = PyType_GenericNew,
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

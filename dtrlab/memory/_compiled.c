/*
 * dtrlab.memory._compiled.MemoryCore: a thin Python type around the memory models of
 * _memory_core.h, for tests (equality with dtrlab/memory/ after every call) and for anyone who
 * wants a fast allocator. A Python model gives the constructor's arguments itself
 * (MemoryModel.core_args; dtrlab/memory/core_args.py).
 *
 *   MemoryCore(kind, capacity, granularity, expandable, max_split, divisions, limit_before_mapping,
 *              reuse_addresses)        kind: MEM_BYTES or MEM_CACHING; max_split -1: none;
 *                                      divisions: 16 ints (the caching model's divisions table)
 *   request_bytes(size) -> int
 *   allocate(block_id, size) -> bool   ValueError if block_id already holds a block
 *   free(block_id)                     KeyError if it holds none
 *   stats() -> (allocated, reserved, peak_allocated, peak_reserved, largest_free_block, segments)
 *   layout() -> [(address, size, pool, ((address, size, requested, block_id or None), ...)), ...]
 *   block_of(block_id) -> (address, size, requested, block_id) or None (0 bytes); KeyError if none
 *   pool_of(size) -> 0 small, 1 large, 2 byte counting
 *   replay(ids, sizes, stats_each=False) -> allocations refused (a whole call sequence in C, benchmarks)
 */
#include "_memory_core.h"

typedef struct {
    PyObject_HEAD
    MemoryCore core;
    MemLayout layout;
    int ready;
} MemoryCoreObject;

static const char *const POOL_NAMES[] = {"small", "large", "flat"};

static void MemoryCore_dealloc(MemoryCoreObject *self) {
    memory_release(&self->core);
    memory_layout_release(&self->layout);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int MemoryCore_init(MemoryCoreObject *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"kind", "capacity", "granularity", "expandable", "max_split", "divisions",
                               "limit_before_mapping", "reuse_addresses", NULL};
    int kind, expandable, limit_before_mapping, reuse_addresses;
    long long capacity, granularity, max_split;
    PyObject *divisions_arg;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iLLpLOpp", keywords, &kind, &capacity, &granularity, &expandable,
                                     &max_split, &divisions_arg, &limit_before_mapping, &reuse_addresses))
        return -1;
    PyObject *seq = PySequence_Fast(divisions_arg, "divisions must be a sequence of 16 ints");
    if (!seq) return -1;
    int32_t divisions[MEM_ROUNDUP_INTERVALS];
    if (PySequence_Fast_GET_SIZE(seq) != MEM_ROUNDUP_INTERVALS) {
        PyErr_Format(PyExc_ValueError, "divisions must hold %d ints", MEM_ROUNDUP_INTERVALS);
        Py_DECREF(seq);
        return -1;
    }
    for (int i = 0; i < MEM_ROUNDUP_INTERVALS; i++) {
        long value = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (value == -1 && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
        if (value < INT32_MIN || value > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "divisions must be 0 or powers of 2 up to 2^30");
            Py_DECREF(seq);
            return -1;
        }
        divisions[i] = (int32_t)value;
    }
    Py_DECREF(seq);
    memory_release(&self->core);
    self->ready = 0;
    if (memory_init(&self->core, kind, capacity, granularity, expandable, max_split, divisions, limit_before_mapping,
                    reuse_addresses, 0) < 0)
        return -1;
    self->ready = 1;
    return 0;
}

static int check_ready(MemoryCoreObject *self) {
    if (!self->ready) PyErr_SetString(PyExc_RuntimeError, "MemoryCore is not initialized");
    return self->ready;
}

/* A block id: a non-negative int32. */
static int parse_block_id(PyObject *arg, int32_t *out) {
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred()) return -1;
    if (value < 0 || value >= INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "block ids must be in [0, 2^31 - 1), got %ld", value);
        return -1;
    }
    *out = (int32_t)value;
    return 0;
}

static int parse_size(PyObject *arg, int64_t *out) {
    long long value = PyLong_AsLongLong(arg);
    if (value == -1 && PyErr_Occurred()) return -1;
    if (value < 0 || value > MEM_MAX_BYTES) {
        PyErr_Format(PyExc_ValueError, "sizes must be in [0, 2^62], got %lld", value);
        return -1;
    }
    *out = value;
    return 0;
}

static PyObject *MemoryCore_request_bytes(MemoryCoreObject *self, PyObject *arg) {
    int64_t size;
    if (!check_ready(self) || parse_size(arg, &size) < 0) return NULL;
    return PyLong_FromLongLong(memory_request_bytes(&self->core, size));
}

static PyObject *MemoryCore_pool_of(MemoryCoreObject *self, PyObject *arg) {
    int64_t size;
    if (!check_ready(self) || parse_size(arg, &size) < 0) return NULL;
    return PyLong_FromLong(memory_block_pool(&self->core, size));
}

static PyObject *MemoryCore_allocate(MemoryCoreObject *self, PyObject *args) {
    PyObject *id_arg, *size_arg;
    int32_t block_id;
    int64_t size;
    if (!check_ready(self) || !PyArg_ParseTuple(args, "OO", &id_arg, &size_arg) ||
        parse_block_id(id_arg, &block_id) < 0 || parse_size(size_arg, &size) < 0 ||
        memory_grow_ids(&self->core, (Py_ssize_t)block_id + 1) < 0)
        return NULL;
    int placed = memory_allocate(&self->core, block_id, size);
    if (placed < 0) return NULL;
    return PyBool_FromLong(placed);
}

static PyObject *MemoryCore_free(MemoryCoreObject *self, PyObject *arg) {
    int32_t block_id;
    if (!check_ready(self) || parse_block_id(arg, &block_id) < 0) return NULL;
    if (!memory_holds(&self->core, block_id)) {
        PyErr_SetObject(PyExc_KeyError, arg);
        return NULL;
    }
    memory_free(&self->core, block_id);
    Py_RETURN_NONE;
}

static PyObject *MemoryCore_stats(MemoryCoreObject *self, PyObject *unused) {
    if (!check_ready(self)) return NULL;
    MemStats s;
    memory_stats(&self->core, &s);
    return Py_BuildValue("(LLLLLL)", (long long)s.allocated, (long long)s.reserved, (long long)s.peak_allocated,
                         (long long)s.peak_reserved, (long long)s.largest_free_block, (long long)s.segments);
}

static PyObject *block_tuple(int64_t address, int64_t size, int64_t requested, int32_t owner) {
    if (owner < 0) return Py_BuildValue("(LLLO)", (long long)address, (long long)size, (long long)requested, Py_None);
    return Py_BuildValue("(LLLi)", (long long)address, (long long)size, (long long)requested, (int)owner);
}

static PyObject *MemoryCore_layout(MemoryCoreObject *self, PyObject *unused) {
    if (!check_ready(self)) return NULL;
    MemLayout *l = &self->layout;
    if (memory_layout(&self->core, l) < 0) return NULL;
    PyObject *out = PyList_New(l->n_segments);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < l->n_segments; i++) {
        Py_ssize_t first = l->seg_first[i], end = l->seg_first[i + 1];
        PyObject *blocks = PyTuple_New(end - first);
        if (!blocks) { Py_DECREF(out); return NULL; }
        for (Py_ssize_t j = first; j < end; j++) {
            PyObject *block = block_tuple(l->block_address[j], l->block_size[j], l->block_requested[j], l->block_owner[j]);
            if (!block) { Py_DECREF(blocks); Py_DECREF(out); return NULL; }
            PyTuple_SET_ITEM(blocks, j - first, block);
        }
        PyObject *segment = Py_BuildValue("(LLsN)", (long long)l->seg_address[i], (long long)l->seg_size[i],
                                          POOL_NAMES[l->seg_pool[i]], blocks);
        if (!segment) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, segment);
    }
    return out;
}

static PyObject *MemoryCore_block_of(MemoryCoreObject *self, PyObject *arg) {
    int32_t block_id;
    int64_t address = 0, size = 0, requested = 0;
    if (!check_ready(self) || parse_block_id(arg, &block_id) < 0) return NULL;
    int found = memory_block_of(&self->core, block_id, &address, &size, &requested);
    if (found < 0) {
        PyErr_SetObject(PyExc_KeyError, arg);
        return NULL;
    }
    if (!found) Py_RETURN_NONE;
    return block_tuple(address, size, requested, block_id);
}

/* replay(ids, sizes, stats_each=False): a whole call sequence in C, for benchmarks. ids: array('i'),
   sizes: array('q'), a size of -1 frees the id's block. With stats_each, memory_stats after every
   placement (as the replay core does to track the reserved peak). Returns the allocations refused. */
static PyObject *MemoryCore_replay(MemoryCoreObject *self, PyObject *args) {
    PyObject *ids_arg, *sizes_arg;
    int stats_each = 0;
    if (!check_ready(self) || !PyArg_ParseTuple(args, "OO|p", &ids_arg, &sizes_arg, &stats_each)) return NULL;
    Py_buffer ids, sizes;
    if (PyObject_GetBuffer(ids_arg, &ids, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(sizes_arg, &sizes, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&ids);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = ids.len / 4;
    if (ids.itemsize != 4 || sizes.itemsize != 8 || sizes.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "replay takes ids as array('i') and sizes as array('q') of one length");
        goto done;
    }
    const int32_t *id = ids.buf;
    const int64_t *size = sizes.buf;
    int32_t top = -1;
    for (Py_ssize_t i = 0; i < n; i++) top = id[i] > top ? id[i] : top;
    if (top >= INT32_MAX - 1 || memory_grow_ids(&self->core, (Py_ssize_t)top + 1) < 0) goto done;
    long long refused = 0;
    int64_t sink = 0;
    MemStats stats;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (size[i] == -1) {
            if (!memory_holds(&self->core, id[i])) {
                PyErr_Format(PyExc_KeyError, "call %zd frees block %d, which holds none", i, id[i]);
                goto done;
            }
            memory_free(&self->core, id[i]);
            continue;
        }
        int placed = memory_allocate(&self->core, id[i], size[i]);
        if (placed < 0) goto done;
        if (!placed) refused++;
        else if (stats_each) {
            memory_stats(&self->core, &stats);
            sink += stats.peak_reserved + stats.largest_free_block;
        }
    }
    if (sink < 0) refused = -1;  /* keeps the stats calls from being optimized away; never true */
    result = PyLong_FromLongLong(refused);
done:
    PyBuffer_Release(&ids);
    PyBuffer_Release(&sizes);
    return result;
}

static PyMethodDef MemoryCore_methods[] = {
    {"replay", (PyCFunction)MemoryCore_replay, METH_VARARGS,
     "replay(ids, sizes, stats_each=False) -> allocations refused; a size of -1 frees (benchmarks)."},
    {"request_bytes", (PyCFunction)MemoryCore_request_bytes, METH_O, "What a request of size bytes counts (rounded)."},
    {"pool_of", (PyCFunction)MemoryCore_pool_of, METH_O, "The pool a request goes to: 0 small, 1 large, 2 bytes."},
    {"allocate", (PyCFunction)MemoryCore_allocate, METH_VARARGS, "allocate(block_id, size) -> placed (bool)."},
    {"free", (PyCFunction)MemoryCore_free, METH_O, "Release the block of block_id (KeyError if it holds none)."},
    {"stats", (PyCFunction)MemoryCore_stats, METH_NOARGS,
     "(allocated, reserved, peak_allocated, peak_reserved, largest_free_block, segments)."},
    {"layout", (PyCFunction)MemoryCore_layout, METH_NOARGS,
     "[(address, size, pool, ((address, size, requested, block_id or None), ...)), ...] in address order."},
    {"block_of", (PyCFunction)MemoryCore_block_of, METH_O,
     "(address, size, requested, block_id), None for a 0-byte request; KeyError if it holds none."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject MemoryCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dtrlab.memory._compiled.MemoryCore",
    .tp_basicsize = sizeof(MemoryCoreObject),
    .tp_dealloc = (destructor)MemoryCore_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled memory models of _memory_core.h; see dtrlab/memory/core_args.py.",
    .tp_methods = MemoryCore_methods,
    .tp_init = (initproc)MemoryCore_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef memory_module = {
    PyModuleDef_HEAD_INIT, "_compiled", "Compiled memory models (flat, aligned, caching) for dtrlab.", -1, NULL,
};

PyMODINIT_FUNC PyInit__compiled(void) {
    if (PyType_Ready(&MemoryCoreType) < 0) return NULL;
    PyObject *module = PyModule_Create(&memory_module);
    if (!module) return NULL;
    Py_INCREF(&MemoryCoreType);
    if (PyModule_AddObject(module, "MemoryCore", (PyObject *)&MemoryCoreType) < 0 ||
        PyModule_AddIntConstant(module, "MEM_BYTES", MEM_BYTES) < 0 ||
        PyModule_AddIntConstant(module, "MEM_CACHING", MEM_CACHING) < 0 ||
        PyModule_AddIntConstant(module, "MAX_BYTES", MEM_MAX_BYTES) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

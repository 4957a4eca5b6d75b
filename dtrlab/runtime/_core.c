/*
 * Compiled replay core: the whole replay of dtrlab/runtime/simulator.py for the
 * flat memory model and the built-in score policies, decision for decision.
 * simulator.py is the readable reference; every rule below mirrors a line there
 * (pool order, last-minimum choice stopping at a score of 0, exact int/int score
 * divisions, regions from _regions_core.h, equivalence classes with their quirks,
 * eager eviction on release, rematerialization order, thrash check, OOM).
 *
 * Python side: dtrlab/runtime/compiled.py flattens a Trace once into a CoreTrace
 * and calls replay(); it decides which runs may come here.
 *
 * Each layer owns its compiled form: the policies' (_policy_spec.h, _policy_core.h) lives in
 * dtrlab/policies/ and the memory models' (_memory_core.h) in dtrlab/memory/ (setup.py's
 * include_dirs); the runtime consumes the specs they build (core_spec(), core_args()).
 */
#include "_regions_core.h"
#include "_policy_spec.h"
#include "_memory_core.h"
#include <math.h>

static PyObject *SimulationError; /* dtrlab.runtime.simulator.SimulationError */

enum { K_COMPUTE = 0, K_GET = 1, K_PIN = 2, K_RELEASE = 3 };
#define NEVER INT64_MIN /* last_access of a storage never accessed: -inf in the reference */
/* An OOM's cause, as Failure.cause: simrd's bytes, no block placeable although the bytes fit,
 * or the device's allocator failing under enforce="allocated". */
enum { CAUSE_NONE, CAUSE_BYTES, CAUSE_FRAGMENTATION, CAUSE_DEVICE };

/* What the runtime must place while a policy chooses under a memory model (simulator.py's
 * PlacementRequest, the fields the compiled address-aware policies read). */
typedef struct {
    int32_t tensor, block_id;
    int64_t needed, block_size;
    int bytes_fit;
} Request;

/* ------------------------------------------------------------------ trace */
typedef struct {
    PyObject_HEAD
    Py_ssize_t n, n_ops, n_steps;
    int64_t *op_cost, *op_total;
    int32_t *op_arg_off, *op_args;    /* CSR: args of op i are op_args[op_arg_off[i] .. op_arg_off[i+1]) */
    int32_t *op_out_off, *op_outs;    /* CSR over outputs; sizes and aliases are parallel to op_outs */
    int64_t *out_size;
    int32_t *out_alias;
    int32_t *tensor_op, *tensor_index;
    int32_t *step_kind, *step_operand;
    PyObject *tensor_names;           /* tuple, for error messages */
    int well_formed;                  /* every index in range: replay() refuses the trace otherwise */
} CoreTrace;

static void CoreTrace_dealloc(CoreTrace *self) {
    PyMem_Free(self->op_cost); PyMem_Free(self->op_total); PyMem_Free(self->op_arg_off); PyMem_Free(self->op_args);
    PyMem_Free(self->op_out_off); PyMem_Free(self->op_outs); PyMem_Free(self->out_size); PyMem_Free(self->out_alias);
    PyMem_Free(self->tensor_op); PyMem_Free(self->tensor_index); PyMem_Free(self->step_kind);
    PyMem_Free(self->step_operand);
    Py_XDECREF(self->tensor_names);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Copy a buffer of `count` items of `itemsize` bytes into fresh memory. */
static void *copy_buffer(PyObject *obj, Py_ssize_t itemsize, Py_ssize_t count, const char *what) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (view.itemsize != itemsize || view.len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd items of %zd bytes", what, count, itemsize);
        PyBuffer_Release(&view);
        return NULL;
    }
    void *copy = PyMem_Malloc(view.len ? view.len : 1);
    if (!copy) PyErr_NoMemory();
    else memcpy(copy, view.buf, view.len);
    PyBuffer_Release(&view);
    return copy;
}

/* Every index the replay follows is in range (the reference would raise IndexError instead). */
static int trace_well_formed(const CoreTrace *tr) {
    Py_ssize_t n = tr->n;
    if (tr->op_arg_off[0] != 0 || tr->op_out_off[0] != 0) return 0;
    for (Py_ssize_t i = 0; i < tr->n_ops; i++) {
        int32_t arg_begin = tr->op_arg_off[i], arg_end = tr->op_arg_off[i + 1];
        if (arg_end < arg_begin || tr->op_out_off[i + 1] <= tr->op_out_off[i] || tr->op_cost[i] < 0) return 0;
        for (int32_t j = arg_begin; j < arg_end; j++)
            if (tr->op_args[j] < 0 || tr->op_args[j] >= n) return 0;
        for (int32_t j = tr->op_out_off[i]; j < tr->op_out_off[i + 1]; j++) {
            int32_t t = tr->op_outs[j], alias = tr->out_alias[j];
            if (t < 0 || t >= n || alias < -1 || alias >= arg_end - arg_begin || tr->out_size[j] < 0) return 0;
            if (tr->tensor_op[t] != i || tr->op_out_off[i] + tr->tensor_index[t] != j) return 0;
        }
    }
    for (Py_ssize_t i = 0; i < tr->n_steps; i++) {
        int32_t kind = tr->step_kind[i], operand = tr->step_operand[i];
        if (kind < K_COMPUTE || kind > K_RELEASE || operand < 0) return 0;
        if (operand >= (kind == K_COMPUTE ? tr->n_ops : n)) return 0;
    }
    return 1;
}

static int CoreTrace_init(CoreTrace *self, PyObject *args, PyObject *kwds) {
    PyObject *names, *cost, *arg_off, *op_args, *out_off, *outs, *sizes, *aliases, *t_op, *t_index, *kind, *operand;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOOOO", &PyTuple_Type, &names, &cost, &arg_off, &op_args, &out_off, &outs,
                          &sizes, &aliases, &t_op, &t_index, &kind, &operand))
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n > INT32_MAX - 1) { PyErr_SetString(PyExc_ValueError, "too many tensors"); return -1; }
    Py_buffer view;
    if (PyObject_GetBuffer(cost, &view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    Py_ssize_t n_ops = view.len / 8;
    PyBuffer_Release(&view);
    if (PyObject_GetBuffer(kind, &view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    Py_ssize_t n_steps = view.len / 4;
    PyBuffer_Release(&view);
    self->n = n;
    self->n_ops = n_ops;
    self->n_steps = n_steps;
    Py_INCREF(names);
    self->tensor_names = names;
    if (!(self->op_cost = copy_buffer(cost, 8, n_ops, "op_cost")) ||
        !(self->op_arg_off = copy_buffer(arg_off, 4, n_ops + 1, "op_arg_off")) ||
        !(self->op_out_off = copy_buffer(out_off, 4, n_ops + 1, "op_out_off")))
        return -1;
    Py_ssize_t n_args = self->op_arg_off[n_ops], n_outs = self->op_out_off[n_ops];
    if (!(self->op_args = copy_buffer(op_args, 4, n_args, "op_args")) ||
        !(self->op_outs = copy_buffer(outs, 4, n_outs, "op_outs")) ||
        !(self->out_size = copy_buffer(sizes, 8, n_outs, "out_size")) ||
        !(self->out_alias = copy_buffer(aliases, 4, n_outs, "out_alias")) ||
        !(self->tensor_op = copy_buffer(t_op, 4, n, "tensor_op")) ||
        !(self->tensor_index = copy_buffer(t_index, 4, n, "tensor_index")) ||
        !(self->step_kind = copy_buffer(kind, 4, n_steps, "step_kind")) ||
        !(self->step_operand = copy_buffer(operand, 4, n_steps, "step_operand")))
        return -1;
    self->op_total = PyMem_Calloc(n_ops ? n_ops : 1, sizeof(int64_t));
    if (!self->op_total) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n_ops; i++)
        for (int32_t j = self->op_out_off[i]; j < self->op_out_off[i + 1]; j++) self->op_total[i] += self->out_size[j];
    self->well_formed = trace_well_formed(self);
    return 0;
}

static PyObject *CoreTrace_well_formed(CoreTrace *self, void *closure) { return PyBool_FromLong(self->well_formed); }

static PyGetSetDef CoreTrace_getset[] = {
    {"well_formed", (getter)CoreTrace_well_formed, NULL, "every index in range", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoreTraceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dtrlab.runtime._core.CoreTrace",
    .tp_basicsize = sizeof(CoreTrace),
    .tp_dealloc = (destructor)CoreTrace_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A Trace flattened into C arrays (built by dtrlab.runtime.compiled).",
    .tp_getset = CoreTrace_getset,
    .tp_init = (initproc)CoreTrace_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------- sim state */
typedef struct {
    int32_t t, begin, end, next; /* tensor; its undefined parents are undefined[begin..end), next to do */
    uint8_t remat, waiting;      /* waiting: undefined[next] is being materialized by the frame above */
} Frame;

typedef struct {
    const CoreTrace *tr;
    PolicySpec policy;
    int64_t budget, remat_limit; /* exceeded when memory + x > budget / remat_compute > remat_limit */
    const uint8_t *withhold;     /* NULL or one flag per storage */
    int track_regions, track_eq;

    uint8_t *defined, *material, *pinned;
    int32_t *storage;
    int64_t *size, *compute_cost, *ref_int, *ref_ext, *last_access;
    int32_t *tensor_next, *tensor_last, *tensor_first; /* tensors of a storage, as a linked list */
    int64_t *region_compute, *region_rev_compute;
    Regions regions;

    /* the pool: an insertion-ordered set as a doubly linked list */
    int32_t *pool_prev, *pool_next;
    uint8_t *in_pool;
    int32_t pool_head, pool_tail;
    Py_ssize_t pool_count;

    /* equivalence classes */
    int32_t *eq_node;
    int32_t *eq_parent;
    int64_t *eq_value;
    uint32_t *eq_seen;
    uint32_t eq_generation;
    Py_ssize_t eq_len, eq_cap;

    int64_t clock, memory, peak, model_compute, remat_compute, remats;
    IntVec evicted, undefined;
    Frame *frames;
    Py_ssize_t step;
    int failed; /* 0, 1 oom, 2 thrash */
    int64_t fail_step, fail_op, fail_tensor, fail_needed, fail_memory, fail_candidates;
    int32_t *scratch;    /* remat storages of one computation */
    int32_t *candidates; /* the storages offered to the policy, in pool order */
    IntVec chosen;       /* what the policy chose */

    /* A memory model (simulator.py's memory_model), when has_model: every storage of nonzero
     * size holds one block while it is materialized. */
    int has_model, enforce_allocated, place_first;
    MemoryCore model;
    int64_t charged;                   /* the model's counted (rounded) bytes of the live blocks */
    int64_t peak_reserved, allocated_at_peak, fragmentation_evictions;
    Request request;                   /* set while the policy chooses under the model */
    int32_t *block_id;                 /* one operator's output blocks: ids (temporaries n + u) ... */
    int64_t *block_size;               /* ... and sizes */
    Py_ssize_t block_count;
    int fail_cause;
    int64_t fail_largest_free;
    PyObject *region_reads; /* with record_steps and regions: what each choice's scores could read */
} Sim;

/* ----------------------------------------------------------------- pool */
static void pool_add(Sim *sim, int32_t s) { /* pool[s] = None: a no-op when present */
    if (sim->in_pool[s]) return;
    sim->in_pool[s] = 1;
    sim->pool_prev[s] = sim->pool_tail;
    sim->pool_next[s] = -1;
    if (sim->pool_tail >= 0) sim->pool_next[sim->pool_tail] = s;
    else sim->pool_head = s;
    sim->pool_tail = s;
    sim->pool_count++;
}

static void pool_remove(Sim *sim, int32_t s) {
    if (!sim->in_pool[s]) return;
    sim->in_pool[s] = 0;
    int32_t prev = sim->pool_prev[s], next = sim->pool_next[s];
    if (prev >= 0) sim->pool_next[prev] = next;
    else sim->pool_head = next;
    if (next >= 0) sim->pool_prev[next] = prev;
    else sim->pool_tail = prev;
    sim->pool_count--;
}

static Py_ssize_t candidate_count(Sim *sim) {
    if (!sim->withhold) return sim->pool_count;
    Py_ssize_t count = 0;
    for (int32_t s = sim->pool_head; s >= 0; s = sim->pool_next[s]) count += !sim->withhold[s];
    return count;
}

static void lock(Sim *sim, int32_t s) {
    if (sim->ref_int[s] == 0) pool_remove(sim, s);
    sim->ref_int[s]++;
}

static void unlock(Sim *sim, int32_t s) {
    if (--sim->ref_int[s] == 0) pool_add(sim, s);
}

/* ------------------------------------------------- equivalence classes */
static int eq_new(Sim *sim, int64_t value) {
    if (sim->eq_len == sim->eq_cap) {
        Py_ssize_t cap = sim->eq_cap ? 2 * sim->eq_cap : 64;
        int32_t *parent = PyMem_Realloc(sim->eq_parent, cap * sizeof(int32_t));
        if (parent) sim->eq_parent = parent;
        int64_t *values = PyMem_Realloc(sim->eq_value, cap * sizeof(int64_t));
        if (values) sim->eq_value = values;
        uint32_t *seen = PyMem_Realloc(sim->eq_seen, cap * sizeof(uint32_t));
        if (seen) sim->eq_seen = seen;
        if (!parent || !values || !seen) { PyErr_NoMemory(); return -1; }
        memset(seen + sim->eq_cap, 0, (cap - sim->eq_cap) * sizeof(uint32_t));
        sim->eq_cap = cap;
    }
    sim->eq_parent[sim->eq_len] = -1;
    sim->eq_value[sim->eq_len] = value;
    return (int)sim->eq_len++;
}

/* The reference indexes a Python list, where node -1 is the last node. */
static int32_t eq_index(Sim *sim, int32_t node) { return node < 0 ? (int32_t)(sim->eq_len + node) : node; }

static int32_t eq_root(Sim *sim, int32_t node) {
    int32_t *parent = sim->eq_parent;
    node = eq_index(sim, node);
    int32_t root = node;
    while (parent[root] != -1) root = parent[root];
    while (parent[node] != -1 && parent[node] != root) { /* path compression */
        int32_t next = parent[node];
        parent[node] = root;
        node = next;
    }
    return root;
}

static void eq_merge(Sim *sim, int32_t lhs, int32_t rhs) {
    int32_t left = eq_root(sim, lhs), right = eq_root(sim, rhs);
    if (left != right) {
        sim->eq_parent[left] = right;
        sim->eq_value[right] += sim->eq_value[left];
    }
}

/* Compute of s plus the distinct equivalence classes of its evicted neighbours. */
static int64_t eq_class_compute(Sim *sim, int32_t s) {
    if (++sim->eq_generation == 0) {
        memset(sim->eq_seen, 0, sim->eq_cap * sizeof(uint32_t));
        sim->eq_generation = 1;
    }
    uint32_t generation = sim->eq_generation;
    int64_t total = sim->compute_cost[s];
    for (int dir = 0; dir < 2; dir++) {
        const IntVec *edges = &sim->regions.edges[dir][s];
        for (Py_ssize_t i = 0; i < edges->len; i++) {
            int32_t u = edges->items[i];
            if (sim->material[u]) continue;
            int32_t root = eq_root(sim, sim->eq_node[u]);
            if (sim->eq_seen[root] != generation) {
                sim->eq_seen[root] = generation;
                total += sim->eq_value[root];
            }
        }
    }
    return total;
}

#include "_policy_core.h"

/* ------------------------------------------------------------- replay */
static int evict(Sim *sim, int32_t s) {
    if (sim->track_regions && regions_flush(&sim->regions) < 0) return -1; /* walks owed before s goes */
    if (sim->has_model && sim->size[s]) {
        memory_free(&sim->model, s);
        sim->charged -= memory_request_bytes(&sim->model, sim->size[s]);
    }
    sim->material[s] = 0;
    sim->memory -= sim->size[s];
    pool_remove(sim, s);
    for (int32_t t = sim->tensor_first[s]; t >= 0; t = sim->tensor_next[t]) sim->defined[t] = 0;
    if (sim->track_regions && regions_evicted(&sim->regions, s) < 0) return -1;
    if (sim->track_eq) {
        int node = eq_new(sim, sim->compute_cost[s]);
        if (node < 0) return -1;
        sim->eq_node[s] = node;
        /* Merging every evicted neighbour's class into the new node: the order does not matter. */
        for (int dir = 0; dir < 2; dir++) {
            const IntVec *edges = &sim->regions.edges[dir][s];
            for (Py_ssize_t i = 0; i < edges->len; i++) {
                int32_t u = edges->items[i];
                if (!sim->material[u]) eq_merge(sim, sim->eq_node[u], node);
            }
        }
    }
    return 0;
}

static void fail(Sim *sim, int kind, int32_t t, int64_t needed, int cause) {
    if (sim->failed) return;
    sim->fail_cause = cause;
    if (sim->has_model) {
        MemStats stats;
        memory_stats(&sim->model, &stats);
        sim->fail_largest_free = stats.largest_free_block;
    }
    sim->failed = kind;
    sim->fail_step = sim->step;
    sim->fail_op = sim->tr->tensor_op[t];
    sim->fail_tensor = t;
    sim->fail_needed = needed;
    sim->fail_memory = sim->memory;
    sim->fail_candidates = candidate_count(sim);
}

/* The candidates in pool order, without withheld storages and, when op >= 0, without op's
 * outputs' storages (enforce="allocated": the prototype pools an operator's outputs only after
 * its eviction loop). */
static Py_ssize_t collect_candidates(Sim *sim, int32_t op) {
    const CoreTrace *tr = sim->tr;
    const uint8_t *withhold = sim->withhold;
    Py_ssize_t n = 0;
    for (int32_t s = sim->pool_head; s >= 0; s = sim->pool_next[s]) {
        if (withhold && withhold[s]) continue;
        if (op >= 0) {
            int output = 0;
            for (int32_t j = tr->op_out_off[op]; j < tr->op_out_off[op + 1] && !output; j++)
                output = sim->storage[tr->op_outs[j]] == s;
            if (output) continue;
        }
        sim->candidates[n++] = s;
    }
    return n;
}

/* Ask the policy among n collected candidates and evict what it chose; the count, or -1. */
static Py_ssize_t evict_chosen(Sim *sim, Py_ssize_t n) {
    sim->chosen.len = 0;
    if (policy_choose(sim, sim->candidates, n, &sim->chosen) < 0) return -1;
    if (sim->chosen.len == 0) {
        PyErr_Format(PyExc_RuntimeError, "the policy chose nothing to evict from %zd candidates", n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < sim->chosen.len; i++) {
        int32_t s = sim->chosen.items[i];
        if (vec_push(&sim->evicted, s) < 0 || evict(sim, s) < 0) return -1;
    }
    return sim->chosen.len;
}

/* Evict by the policy until `needed` more bytes fit; 1 on OOM, -1 on error. */
static int free_memory(Sim *sim, int64_t needed, int32_t t) {
    while (sim->memory + needed > sim->budget) {
        Py_ssize_t n = collect_candidates(sim, -1);
        if (n == 0) {
            fail(sim, 1, t, needed, CAUSE_BYTES);
            return 1;
        }
        sim->chosen.len = 0;
        if (policy_choose(sim, sim->candidates, n, &sim->chosen) < 0) return -1;
        for (Py_ssize_t i = 0; i < sim->chosen.len; i++) {
            int32_t s = sim->chosen.items[i];
            if (vec_push(&sim->evicted, s) < 0 || evict(sim, s) < 0) return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------- memory model */
/* simulator.py's _output_blocks: (block id, size) of op's non-alias outputs with bytes, in output
 * order; a still-resident output (an operator recomputing all its outputs) gets a temporary id n + u. */
static void output_blocks(Sim *sim, int32_t op) {
    const CoreTrace *tr = sim->tr;
    Py_ssize_t count = 0;
    for (int32_t j = tr->op_out_off[op]; j < tr->op_out_off[op + 1]; j++) {
        if (!tr->out_size[j] || tr->out_alias[j] != -1) continue;
        int32_t u = tr->op_outs[j];
        sim->block_id[count] = sim->material[u] ? (int32_t)(tr->n + u) : u;
        sim->block_size[count++] = tr->out_size[j];
    }
    sim->block_count = count;
}

/* _try_place: place every block (-1) or none (the index of the first that did not fit); -2 on error. */
static Py_ssize_t try_place(Sim *sim) {
    for (Py_ssize_t i = 0; i < sim->block_count; i++) {
        int placed = memory_allocate(&sim->model, sim->block_id[i], sim->block_size[i]);
        if (placed < 0) return -2;
        if (!placed) {
            for (Py_ssize_t k = 0; k < i; k++) memory_free(&sim->model, sim->block_id[k]);
            return i;
        }
    }
    return -1;
}

/* _note_reserved_peak */
static void note_reserved_peak(Sim *sim) {
    MemStats stats;
    memory_stats(&sim->model, &stats);
    if (stats.reserved > sim->peak_reserved) {
        sim->peak_reserved = stats.reserved;
        sim->allocated_at_peak = stats.allocated;
    } else if (stats.reserved == sim->peak_reserved && stats.allocated > sim->allocated_at_peak) {
        sim->allocated_at_peak = stats.allocated;
    }
}

/* _free_temporaries: drop the temporary blocks of still-resident outputs. */
static void free_temporaries(Sim *sim) {
    for (Py_ssize_t i = 0; i < sim->block_count; i++) {
        if (sim->block_id[i] < sim->tr->n) continue;
        memory_free(&sim->model, sim->block_id[i]);
        sim->charged -= memory_request_bytes(&sim->model, sim->block_size[i]);
    }
}

static void set_request(Sim *sim, int32_t t, int64_t needed, Py_ssize_t index, int bytes_fit) {
    sim->request.tensor = t;
    sim->request.needed = needed;
    sim->request.bytes_fit = bytes_fit;
    if (index < sim->block_count) {
        sim->request.block_id = sim->block_id[index];
        sim->request.block_size = sim->block_size[index];
    } else { /* no block: the reference names (storage of t, 0) */
        sim->request.block_id = sim->storage[t];
        sim->request.block_size = 0;
    }
}

/* enforce="reserved" (Simulator._place): evict by the policy until the rounded bytes fit and every
 * block is placed; evictions made while the bytes already fit count as fragmentation evictions.
 * 0, 1 on OOM (recorded), -1 on error. */
static int place(Sim *sim, int32_t t, int32_t op) {
    const CoreTrace *tr = sim->tr;
    int64_t needed = 0;
    for (int32_t j = tr->op_out_off[op]; j < tr->op_out_off[op + 1]; j++)
        if (tr->out_size[j] && tr->out_alias[j] == -1) needed += memory_request_bytes(&sim->model, tr->out_size[j]);
    for (;;) {
        output_blocks(sim, op); /* a resident output may have been evicted meanwhile */
        int bytes_fit = sim->charged + needed <= sim->budget;
        Py_ssize_t unplaced = 0;
        if (bytes_fit || sim->place_first) {
            unplaced = try_place(sim);
            if (unplaced == -2) return -1;
            if (unplaced < 0) break;
        }
        Py_ssize_t n = collect_candidates(sim, -1);
        if (n == 0) {
            fail(sim, 1, t, needed, bytes_fit ? CAUSE_FRAGMENTATION : CAUSE_BYTES);
            return 1;
        }
        set_request(sim, t, needed, unplaced, bytes_fit);
        Py_ssize_t chosen = evict_chosen(sim, n);
        if (chosen < 0) return -1;
        if (bytes_fit) sim->fragmentation_evictions += chosen;
    }
    sim->charged += needed;
    note_reserved_peak(sim);
    free_temporaries(sim);
    return 0;
}

/* enforce="allocated" (Simulator._allocate_outputs): allocate the outputs one at a time, evicting
 * nothing; a failed allocation frees the earlier ones and is a device OOM. */
static int allocate_outputs(Sim *sim, int32_t t, int32_t op) {
    output_blocks(sim, op);
    for (Py_ssize_t i = 0; i < sim->block_count; i++) {
        int placed = memory_allocate(&sim->model, sim->block_id[i], sim->block_size[i]);
        if (placed < 0) return -1;
        if (!placed) {
            for (Py_ssize_t k = 0; k < i; k++) memory_free(&sim->model, sim->block_id[k]);
            fail(sim, 1, t, memory_request_bytes(&sim->model, sim->block_size[i]), CAUSE_DEVICE);
            return 1;
        }
    }
    for (Py_ssize_t i = 0; i < sim->block_count; i++) sim->charged += memory_request_bytes(&sim->model, sim->block_size[i]);
    note_reserved_peak(sim);
    return 0;
}

/* enforce="allocated" (Simulator._evict_over_budget): after the operator ran, evict while the
 * allocated bytes exceed the budget (the prototype's auto_evict); op's outputs are no candidates. */
static int evict_over_budget(Sim *sim, int32_t t, int32_t op) {
    MemStats stats;
    memory_stats(&sim->model, &stats);
    while (stats.allocated > sim->budget) {
        Py_ssize_t n = collect_candidates(sim, op);
        if (n == 0) {
            fail(sim, 1, t, stats.allocated - sim->budget, CAUSE_BYTES);
            return 1;
        }
        set_request(sim, t, stats.allocated - sim->budget, 0, 0);
        if (evict_chosen(sim, n) < 0) return -1;
        memory_stats(&sim->model, &stats);
    }
    free_temporaries(sim);
    return 0;
}

static int compute(Sim *sim, int32_t t, int rematerialize) {
    const CoreTrace *tr = sim->tr;
    int32_t op = tr->tensor_op[t];
    int32_t begin = tr->op_out_off[op], end = tr->op_out_off[op + 1];
    int32_t *storage = sim->storage;
    uint8_t *material = sim->material, *defined = sim->defined;
    /* Decide everything from the state before the computation, as the reference does. */
    Py_ssize_t count = 0;
    int32_t *remat = sim->scratch;
    for (int32_t j = begin; j < end; j++) {
        int32_t u = tr->op_outs[j];
        if (u != t && !material[storage[u]]) remat[count++] = storage[u];
    }
    if (!material[storage[t]]) remat[count++] = storage[t];
    int64_t duplicate_bytes = 0;
    for (int32_t j = begin; j < end; j++) {
        int32_t u = tr->op_outs[j];
        if (u != t && defined[u]) duplicate_bytes += tr->out_size[begin + tr->tensor_index[u]];
    }

    int64_t cost = tr->op_cost[op];
    /* compiled.py admits traces whose totals fit; without a thrash limit recompute can still grow. */
    if (__builtin_add_overflow(sim->clock, cost, &sim->clock) ||
        (rematerialize && __builtin_add_overflow(sim->remat_compute, cost, &sim->remat_compute))) {
        PyErr_SetString(PyExc_OverflowError, "the clock outgrew the compiled core's 64-bit counter; run with engine='python'");
        return -1;
    }
    sim->memory += tr->op_total[op];
    if (sim->memory > sim->peak) sim->peak = sim->memory;
    if (rematerialize) sim->remats++;
    else sim->model_compute += cost;
    for (int32_t j = begin; j < end; j++) { /* t and its undefined siblings */
        int32_t u = tr->op_outs[j];
        material[storage[u]] = 1;
        defined[u] = 1;
    }
    /* The operator recomputed outputs that were still resident; drop the copies. */
    sim->memory -= duplicate_bytes;
    for (Py_ssize_t i = 0; i < count; i++) pool_add(sim, remat[i]);
    if (sim->track_regions && regions_materialized(&sim->regions, remat, count) < 0) return -1;
    if (sim->track_eq) {
        for (Py_ssize_t i = 0; i < count; i++) {
            int32_t s = remat[i];
            sim->eq_value[eq_root(sim, sim->eq_node[s])] -= sim->compute_cost[s];
            sim->eq_node[s] = -1;
        }
    }
    return 0;
}

static int undefined_push(Sim *sim, int32_t t) { return vec_push(&sim->undefined, t); }

/* Enter materialize(t): touch and lock the defined parents, list the undefined ones. */
static int frame_enter(Sim *sim, Py_ssize_t depth, int32_t t, int rematerialize) {
    const CoreTrace *tr = sim->tr;
    int32_t op = tr->tensor_op[t];
    int32_t begin = tr->op_arg_off[op], end = tr->op_arg_off[op + 1];
    Frame *frame = &sim->frames[depth];
    frame->t = t;
    frame->remat = (uint8_t)rematerialize;
    frame->waiting = 0;
    frame->begin = frame->next = (int32_t)sim->undefined.len;
    for (int32_t j = begin; j < end; j++) sim->last_access[sim->storage[tr->op_args[j]]] = sim->clock;
    for (int32_t j = begin; j < end; j++)
        if (!sim->defined[tr->op_args[j]] && undefined_push(sim, tr->op_args[j]) < 0) return -1;
    frame->end = (int32_t)sim->undefined.len;
    for (int32_t j = begin; j < end; j++)
        if (sim->defined[tr->op_args[j]]) lock(sim, sim->storage[tr->op_args[j]]);
    return 0;
}

/* materialize(t, rematerialize) of the reference, with an explicit stack instead of recursion.
 * Returns 0, 1 on a failure (recorded), -1 on a Python error. */
static int materialize(Sim *sim, int32_t t, int rematerialize) {
    const CoreTrace *tr = sim->tr;
    Py_ssize_t depth = 0;
    if (frame_enter(sim, depth++, t, rematerialize) < 0) return -1;
    while (depth) {
        Frame *frame = &sim->frames[depth - 1];
        if (frame->waiting) {
            lock(sim, sim->storage[sim->undefined.items[frame->next++]]);
            frame->waiting = 0;
        }
        if (frame->next < frame->end) {
            int32_t p = sim->undefined.items[frame->next];
            if (!sim->defined[p]) { /* a sibling's rematerialization may have defined it */
                frame->waiting = 1;
                if (depth >= tr->n + 1) {
                    PyErr_SetString(PyExc_RuntimeError, "rematerialization deeper than the tensor count");
                    return -1;
                }
                if (frame_enter(sim, depth++, p, 1) < 0) return -1;
            } else {
                lock(sim, sim->storage[p]);
                frame->next++;
            }
            continue;
        }
        int32_t u = frame->t, op = tr->tensor_op[u];
        int status = 0;
        if (!sim->has_model) {
            int64_t total = tr->op_total[op];
            if (sim->memory + total > sim->budget) status = free_memory(sim, total, u);
        } else {
            status = sim->enforce_allocated ? allocate_outputs(sim, u, op) : place(sim, u, op);
        }
        if (status) return status;
        if (compute(sim, u, frame->remat) < 0) return -1;
        if (sim->has_model && sim->enforce_allocated && (status = evict_over_budget(sim, u, op))) return status;
        for (int32_t j = tr->op_arg_off[op]; j < tr->op_arg_off[op + 1]; j++) unlock(sim, sim->storage[tr->op_args[j]]);
        sim->undefined.len = frame->begin;
        depth--;
        if (sim->remat_compute > sim->remat_limit) {
            fail(sim, 2, u, 0, CAUSE_NONE);
            return 1;
        }
    }
    return 0;
}

static int compute_op(Sim *sim, int32_t op) {
    const CoreTrace *tr = sim->tr;
    int32_t begin = tr->op_out_off[op], end = tr->op_out_off[op + 1];
    int32_t abegin = tr->op_arg_off[op], aend = tr->op_arg_off[op + 1];
    int32_t *storage = sim->storage;
    for (int32_t j = begin; j < end; j++) {
        int32_t t = tr->op_outs[j], alias = tr->out_alias[j], s;
        if (alias == -1) {
            s = t;
            sim->size[s] = tr->out_size[j];
        } else {
            s = storage[tr->op_args[abegin + alias]];
        }
        storage[t] = s;
        /* A storage's compute counts each operator once. */
        int32_t last = sim->tensor_last[s];
        if (last < 0 || tr->tensor_op[last] != op) {
            if (sim->track_regions && regions_compute_changing(&sim->regions, s) < 0) return -1;
            sim->compute_cost[s] += tr->op_cost[op];
        }
        if (last < 0) sim->tensor_first[s] = t;
        else sim->tensor_next[last] = t;
        sim->tensor_last[s] = t;
        sim->ref_ext[s]++;
    }
    for (int32_t j = begin; j < end; j++)
        for (int32_t k = abegin; k < aend; k++)
            if (regions_link(&sim->regions, storage[tr->op_args[k]], storage[tr->op_outs[j]]) < 0) return -1;
    if (sim->track_eq) {
        for (int32_t j = begin; j < end; j++) {
            if (tr->out_alias[j] != -1) continue;
            int node = eq_new(sim, 0);
            if (node < 0) return -1;
            sim->eq_node[tr->op_outs[j]] = node;
        }
    }
    int status = materialize(sim, tr->op_outs[begin], 0);
    if (status) return status;
    for (int32_t j = begin; j < end; j++) sim->last_access[storage[tr->op_outs[j]]] = sim->clock;
    return 0;
}

static int simulation_error(Sim *sim, const char *format, int32_t t) {
    PyObject *name = PyTuple_GET_ITEM(sim->tr->tensor_names, t);
    PyErr_Format(SimulationError, format, name);
    return -1;
}

static int run_step(Sim *sim, int kind, int32_t operand) {
    int32_t s;
    switch (kind) {
    case K_COMPUTE:
        return compute_op(sim, operand);
    case K_GET:
        s = sim->storage[operand];
        if (s < 0 || sim->ref_ext[s] <= 0)
            return simulation_error(sim, "get of %U after its storage lost every reference", operand);
        sim->ref_ext[s]++;
        return 0;
    case K_RELEASE:
        s = sim->storage[operand];
        if (s < 0 || sim->ref_ext[s] <= 0)
            return simulation_error(sim, "release of %U whose storage has no references", operand);
        if (--sim->ref_ext[s] == 0 && sim->material[s] && !sim->pinned[s]) return evict(sim, s);
        return 0;
    case K_PIN:
        if (!sim->defined[operand]) {
            int status = materialize(sim, operand, 1);
            if (status) return status;
        }
        s = sim->storage[operand];
        if (sim->pinned[s]) return 0;
        lock(sim, s);
        sim->pinned[s] = 1;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "unknown step kind %d", kind);
    return -1;
}

static void sim_free(Sim *sim) {
    regions_release(&sim->regions);
    policy_spec_release(&sim->policy);
    memory_release(&sim->model);
    void *buffers[] = {sim->defined, sim->material, sim->pinned, sim->storage, sim->size, sim->compute_cost,
                       sim->ref_int, sim->ref_ext, sim->last_access, sim->tensor_next, sim->tensor_last,
                       sim->tensor_first, sim->region_compute, sim->region_rev_compute, sim->pool_prev,
                       sim->pool_next, sim->in_pool, sim->eq_node, sim->eq_parent, sim->eq_value, sim->eq_seen,
                       sim->evicted.items, sim->undefined.items, sim->frames, sim->scratch, sim->candidates,
                       sim->chosen.items, sim->block_id, sim->block_size};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++) PyMem_Free(buffers[i]);
}

static int sim_alloc(Sim *sim) {
    Py_ssize_t n = sim->tr->n ? sim->tr->n : 1;
#define ALLOC(field, count) ((sim->field = PyMem_Calloc((count), sizeof(*sim->field))) != NULL)
    if (!(ALLOC(defined, n) && ALLOC(material, n) && ALLOC(pinned, n) && ALLOC(storage, n) && ALLOC(size, n) &&
          ALLOC(compute_cost, n) && ALLOC(ref_int, n) && ALLOC(ref_ext, n) && ALLOC(last_access, n) &&
          ALLOC(tensor_next, n) && ALLOC(tensor_last, n) && ALLOC(tensor_first, n) && ALLOC(region_compute, n) &&
          ALLOC(region_rev_compute, n) && ALLOC(pool_prev, n) && ALLOC(pool_next, n) && ALLOC(in_pool, n) &&
          ALLOC(eq_node, n) && ALLOC(frames, n + 1) && ALLOC(scratch, n + 1) && ALLOC(candidates, n) &&
          ALLOC(block_id, n) && ALLOC(block_size, n))) {
        PyErr_NoMemory();
        return -1;
    }
#undef ALLOC
    for (Py_ssize_t i = 0; i < n; i++) {
        sim->storage[i] = sim->tensor_next[i] = sim->tensor_last[i] = sim->tensor_first[i] = -1;
        sim->eq_node[i] = -1;
        sim->last_access[i] = NEVER;
    }
    sim->pool_head = sim->pool_tail = -1;
    sim->clock = 1;
    return regions_init(&sim->regions, sim->tr->n, sim->material, sim->compute_cost, sim->region_compute,
                        sim->region_rev_compute);
}

/* Build sim->model from the tuple of the Python model's core_args() (dtrlab/memory/core_args.py)
 * (kind, capacity, granularity, expandable, max_split, divisions, limit_before_mapping, reuse_addresses). */
static int model_init(Sim *sim, PyObject *args) {
    int kind, expandable, limit_before_mapping, reuse_addresses;
    long long capacity, granularity, max_split;
    PyObject *divisions_obj;
    if (!PyArg_ParseTuple(args, "iLLpLOpp", &kind, &capacity, &granularity, &expandable, &max_split, &divisions_obj,
                          &limit_before_mapping, &reuse_addresses))
        return -1;
    int32_t divisions[16];
    PyObject *items = PySequence_Fast(divisions_obj, "divisions must be a sequence of 16 ints");
    if (!items) return -1;
    if (PySequence_Fast_GET_SIZE(items) != 16) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_ValueError, "divisions must hold 16 ints");
        return -1;
    }
    for (int i = 0; i < 16; i++) {
        long value = PyLong_AsLong(PySequence_Fast_GET_ITEM(items, i));
        if (value == -1 && PyErr_Occurred()) { Py_DECREF(items); return -1; }
        divisions[i] = (int32_t)value;
    }
    Py_DECREF(items);
    if (sim->tr->n > INT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "too many tensors for the compiled memory model's block ids");
        return -1;
    }
    sim->has_model = 1;
    /* Block ids: storages, and temporaries n + u for resident outputs recomputed. */
    return memory_init(&sim->model, kind, capacity, granularity, expandable, max_split, divisions,
                       limit_before_mapping, reuse_addresses, 2 * sim->tr->n + 1);
}

/* replay(trace, policy, budget, remat_limit, withhold, record_steps[, memory, enforce_allocated, place_first])
 *   -> (status, clock, model_compute, remat_compute, peak_memory, remats, evicted, failure, steps)
 * policy: the spec tuple of dtrlab.policies.core_spec.policy_spec;
 * memory: None (simrd's byte counter) or the arguments of model_init; enforce_allocated: the
 * "allocated" semantics (else "reserved"); place_first: an address-aware policy (place before evicting).
 * status: 0 pass, 1 oom, 2 thrash; failure: None or (step, operator, tensor, requested, memory, candidates,
 * cause, largest free block or None); steps: None or a list of (clock, memory, evictions, remat_compute)
 * after each completed step, with (allocated, reserved) appended under a model; memory_result: None, or
 * (fragmentation_evictions, peak_reserved, allocated_at_peak, (the model's MemStats at the end));
 * region_reads: None, or with record_steps and a region policy, one tuple per choice of
 * (storage, forward, reverse region compute) of every resident storage. */
static PyObject *replay(PyObject *module, PyObject *args) {
    CoreTrace *tr;
    int record_steps;
    long long budget, remat_limit;
    PyObject *withhold_obj, *policy, *memory = Py_None;
    int enforce_allocated = 0, place_first = 0;
    if (!PyArg_ParseTuple(args, "O!O!LLOp|Opp", &CoreTraceType, &tr, &PyTuple_Type, &policy, &budget, &remat_limit,
                          &withhold_obj, &record_steps, &memory, &enforce_allocated, &place_first))
        return NULL;
    if (!tr->well_formed) return PyErr_Format(PyExc_ValueError, "the trace has an index out of range");
    Sim sim;
    memset(&sim, 0, sizeof(sim));
    if (policy_spec_parse(policy, &sim.policy, tr->n) < 0) {
        policy_spec_release(&sim.policy);
        return NULL;
    }
    sim.tr = tr;
    sim.budget = budget;
    sim.remat_limit = remat_limit;
    sim.track_regions = policy_tracks_regions(&sim.policy);
    sim.track_eq = policy_tracks_eq(&sim.policy);
    Py_buffer withhold = {0};
    PyObject *steps = NULL, *result = NULL;
    if (withhold_obj != Py_None) {
        if (PyObject_GetBuffer(withhold_obj, &withhold, PyBUF_C_CONTIGUOUS) < 0) return NULL;
        if (withhold.len != tr->n) {
            PyErr_Format(PyExc_ValueError, "withhold must hold %zd flags", tr->n);
            goto done;
        }
        sim.withhold = withhold.buf;
    }
    if (sim_alloc(&sim) < 0) goto done;
    if (memory != Py_None && model_init(&sim, memory) < 0) goto done;
    sim.enforce_allocated = enforce_allocated;
    sim.place_first = place_first;
    if (record_steps && !(steps = PyList_New(0))) goto done;
    if (record_steps && sim.track_regions && !(sim.region_reads = PyList_New(0))) goto done;

    int status = 0;
    for (sim.step = 0; sim.step < tr->n_steps; sim.step++) {
        if ((sim.step & 4095) == 0 && PyErr_CheckSignals() < 0) goto done; /* Ctrl-C stops a long replay */
        status = run_step(&sim, tr->step_kind[sim.step], tr->step_operand[sim.step]);
        if (status < 0) goto done;
        if (status) break;
        if (steps) {
            PyObject *row;
            if (sim.has_model) {
                MemStats stats;
                memory_stats(&sim.model, &stats);
                row = Py_BuildValue("(LLnLLL)", (long long)sim.clock, (long long)sim.memory, sim.evicted.len,
                                    (long long)sim.remat_compute, (long long)stats.allocated, (long long)stats.reserved);
            } else {
                row = Py_BuildValue("(LLnL)", (long long)sim.clock, (long long)sim.memory, sim.evicted.len,
                                    (long long)sim.remat_compute);
            }
            if (!row || PyList_Append(steps, row) < 0) { Py_XDECREF(row); goto done; }
            Py_DECREF(row);
        }
    }
    PyObject *evicted = PyList_New(sim.evicted.len);
    if (!evicted) goto done;
    for (Py_ssize_t i = 0; i < sim.evicted.len; i++) {
        PyObject *item = PyLong_FromLong(sim.evicted.items[i]);
        if (!item) { Py_DECREF(evicted); goto done; }
        PyList_SET_ITEM(evicted, i, item);
    }
    PyObject *failure;
    if (sim.failed)
        failure = Py_BuildValue("(LLLLLLiN)", (long long)sim.fail_step, (long long)sim.fail_op,
                                (long long)sim.fail_tensor, (long long)sim.fail_needed, (long long)sim.fail_memory,
                                (long long)sim.fail_candidates, sim.fail_cause,
                                sim.has_model ? PyLong_FromLongLong(sim.fail_largest_free) : Py_NewRef(Py_None));
    else
        failure = Py_NewRef(Py_None);
    if (!failure) { Py_DECREF(evicted); goto done; }
    PyObject *memory_result;
    if (sim.has_model) {
        MemStats stats;
        memory_stats(&sim.model, &stats);
        memory_result = Py_BuildValue("(LLL(LLLLLL))", (long long)sim.fragmentation_evictions,
                                      (long long)sim.peak_reserved, (long long)sim.allocated_at_peak,
                                      (long long)stats.allocated, (long long)stats.reserved,
                                      (long long)stats.peak_allocated, (long long)stats.peak_reserved,
                                      (long long)stats.largest_free_block, (long long)stats.segments);
    } else {
        memory_result = Py_NewRef(Py_None);
    }
    if (!memory_result) { Py_DECREF(evicted); Py_DECREF(failure); goto done; }
    result = Py_BuildValue("(iLLLLLNNONO)", sim.failed, (long long)sim.clock, (long long)sim.model_compute,
                           (long long)sim.remat_compute, (long long)sim.peak, (long long)sim.remats, evicted, failure,
                           steps ? steps : Py_None, memory_result, sim.region_reads ? sim.region_reads : Py_None);
done:
    Py_XDECREF(steps);
    Py_XDECREF(sim.region_reads);
    if (withhold.obj) PyBuffer_Release(&withhold);
    sim_free(&sim);
    return result;
}

/* The unbounded baseline of dtrlab/runtime/baseline.py (_replay), rule for rule: simrd's
 * V1 runtime banishes a storage as soon as its last external reference goes, pinned or
 * not. Returns (peak, compute), or None when a get or release names a tensor that was
 * never computed (the reference's behaviour there is Python's, so it keeps the run). */
static PyObject *baseline(PyObject *module, PyObject *args) {
    CoreTrace *tr;
    if (!PyArg_ParseTuple(args, "O!", &CoreTraceType, &tr)) return NULL;
    if (!tr->well_formed) {
        PyErr_SetString(PyExc_ValueError, "the trace has an index out of range");
        return NULL;
    }
    Py_ssize_t n = tr->n ? tr->n : 1;
    int32_t *storage = PyMem_Malloc(n * sizeof(int32_t));
    int64_t *size = PyMem_Calloc(n, sizeof(int64_t)), *ref_ext = PyMem_Calloc(n, sizeof(int64_t));
    char *resident = PyMem_Calloc(n, 1);
    if (!storage || !size || !ref_ext || !resident) {
        PyMem_Free(storage); PyMem_Free(size); PyMem_Free(ref_ext); PyMem_Free(resident);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t t = 0; t < n; t++) storage[t] = -1;
    int64_t memory = 0, peak = 0, compute = 0;
    int never_computed = 0;
#define BANISH_IF_UNREFERENCED(s) do { if (ref_ext[s] == 0 && resident[s]) { resident[s] = 0; memory -= size[s]; } } while (0)
    for (Py_ssize_t i = 0; i < tr->n_steps && !never_computed; i++) {
        int32_t kind = tr->step_kind[i], operand = tr->step_operand[i], s;
        if (kind == K_COMPUTE) {
            int32_t arg_begin = tr->op_arg_off[operand];
            for (int32_t j = tr->op_out_off[operand]; j < tr->op_out_off[operand + 1]; j++) {
                int32_t t = tr->op_outs[j], alias = tr->out_alias[j];
                s = alias == -1 ? t : storage[tr->op_args[arg_begin + alias]];
                if (s < 0) { never_computed = 1; break; }
                storage[t] = s;
                if (alias == -1) { size[s] = tr->out_size[j]; resident[s] = 1; }
                ref_ext[s]++;
            }
            if (never_computed) break;
            compute += tr->op_cost[operand];
            memory += tr->op_total[operand];
            if (memory > peak) peak = memory;
            for (int32_t j = arg_begin; j < tr->op_arg_off[operand + 1]; j++) {
                s = storage[tr->op_args[j]];
                if (s < 0) { never_computed = 1; break; }
                BANISH_IF_UNREFERENCED(s);
            }
        } else if (kind == K_GET || kind == K_RELEASE) {
            s = storage[operand];
            if (s < 0) { never_computed = 1; break; }
            if (kind == K_GET) ref_ext[s]++;
            else { ref_ext[s]--; BANISH_IF_UNREFERENCED(s); }
        } /* K_PIN: at an infinite budget every pinned tensor is already resident */
    }
#undef BANISH_IF_UNREFERENCED
    PyMem_Free(storage); PyMem_Free(size); PyMem_Free(ref_ext); PyMem_Free(resident);
    if (never_computed) Py_RETURN_NONE;
    return Py_BuildValue("(LL)", (long long)peak, (long long)compute);
}

/* exact_sum(floats): coop's window sum (exact_sum), exposed so that tests compare it with math.fsum. */
static PyObject *exact_sum_of(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sequence;
    if (!PyArg_ParseTuple(args, "O", &sequence)) return NULL;
    PyObject *fast = PySequence_Fast(sequence, "exact_sum takes a sequence of floats");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    double *xs = PyMem_Malloc(sizeof(double) * (size_t)(2 * n + 1)), total = 0.0;
    if (!xs) { Py_DECREF(fast); return PyErr_NoMemory(); }
    int failed = 0;
    for (Py_ssize_t k = 0; k < n && !failed; k++) {
        xs[k] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, k));
        failed = xs[k] == -1.0 && PyErr_Occurred();
    }
    if (!failed) failed = exact_sum(xs, n, xs + n, &total) < 0;
    PyMem_Free(xs);
    Py_DECREF(fast);
    return failed ? NULL : PyFloat_FromDouble(total);
}

static PyMethodDef core_methods[] = {
    {"replay", replay, METH_VARARGS, "Run one replay; see dtrlab/runtime/compiled.py."},
    {"baseline", baseline, METH_VARARGS, "The unbounded baseline (peak, compute); see dtrlab/runtime/baseline.py."},
    {"exact_sum", exact_sum_of, METH_VARARGS, "math.fsum of costs >= 0 as coop's compiled window sum computes it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core", "Compiled replay core for dtrlab's simulator.", -1, core_methods,
};

static PyObject *import_attribute(const char *module_name, const char *name) {
    PyObject *module = PyImport_ImportModule(module_name);
    if (!module) return NULL;
    PyObject *value = PyObject_GetAttrString(module, name);
    Py_DECREF(module);
    return value;
}

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&CoreTraceType) < 0) return NULL;
    if (!(RegionError = import_attribute("dtrlab.runtime.regions", "RegionError"))) return NULL;
    if (!(SimulationError = import_attribute("dtrlab.runtime.simulator", "SimulationError"))) return NULL;
    PyObject *module = PyModule_Create(&core_module);
    if (!module) return NULL;
    Py_INCREF(&CoreTraceType);
    if (PyModule_AddObject(module, "CoreTrace", (PyObject *)&CoreTraceType) < 0) {
        Py_DECREF(&CoreTraceType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

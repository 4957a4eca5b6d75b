/*
 * The region index's algorithm, shared by the compiled region index
 * (_regions.c, used by the Python simulator) and the compiled replay core
 * (_core.c). The rules are those of dtrlab/runtime/regions.py (read that file
 * first; its docstring explains what a region is and why it is maintained this
 * way). Each region's interior and frontier are bitsets; walks go over a
 * storage-level graph with a generation-stamped visited array, so a rebuild
 * allocates nothing and touches only the storages it reaches. Rebuilds after a
 * materialization are owed until a region is read (regions_flush(), which the core calls
 * before a policy chooses and before an eviction; the index of _regions.c at once).
 *
 * The including module sets RegionError (dtrlab.runtime.regions.RegionError).
 * Functions return 0, or -1 with a Python exception set.
 */
#ifndef DTRLAB_REGIONS_CORE_H
#define DTRLAB_REGIONS_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *RegionError;

typedef struct {
    int32_t *items;
    Py_ssize_t len, cap;
} IntVec;

typedef struct {
    uint64_t *interior, *frontier; /* NULL until the region is first built */
    Py_ssize_t lo, hi;             /* every nonzero word of both bitsets is in [lo, hi) */
} Region;

typedef struct {
    Py_ssize_t n, words;
    const uint8_t *material;    /* 1 when the storage is resident */
    const int64_t *compute;     /* each storage's own compute */
    int64_t *region_compute[2]; /* written here: [0] forward, [1] reverse region compute */
    IntVec *edges[2];           /* [0] children storages, [1] parent storages */
    Region *regions[2];
    uint32_t *seen;             /* generation stamps for walks */
    uint32_t generation;
    int32_t *stack;
    uint64_t *owed[2];          /* resident storages owed a rebuild in each direction (regions_flush()) */
    int any_owed;
    /* walk_batch(): per-storage base bit, bases-reaching-me mask, frontier mask; base_seen stamps */
    uint64_t *base_bit, *reach, *front;
    uint32_t *base_seen;
    IntVec pairs;               /* (storage, resident out-neighbour) pairs seen by a batch */
    uint64_t *batch_bits;       /* the evicted storages a batch reaches */
    uint64_t *front_bits;       /* the resident storages on a batch's frontiers */
    long long dense_words;      /* bitset words written by a transpose (tests check that path runs) */
} Regions;

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

static int regions_init(Regions *self, Py_ssize_t n, const uint8_t *material, const int64_t *compute,
                        int64_t *region_compute, int64_t *region_rev_compute) {
    if (n < 0 || n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "storage count out of range");
        return -1;
    }
    self->n = n;
    self->words = (n + 63) / 64;
    self->material = material;
    self->compute = compute;
    self->region_compute[0] = region_compute;
    self->region_compute[1] = region_rev_compute;
    Py_ssize_t count = n ? n : 1;
    for (int dir = 0; dir < 2; dir++) {
        self->edges[dir] = PyMem_Calloc(count, sizeof(IntVec));
        self->regions[dir] = PyMem_Calloc(count, sizeof(Region));
        self->owed[dir] = PyMem_Calloc(self->words ? self->words : 1, sizeof(uint64_t));
    }
    self->any_owed = 0;
    self->seen = PyMem_Calloc(count, sizeof(uint32_t));
    self->generation = 0;
    self->dense_words = 0;
    self->stack = PyMem_Calloc(count, sizeof(int32_t));
    self->base_bit = PyMem_Calloc(count, sizeof(uint64_t));
    self->reach = PyMem_Calloc(count, sizeof(uint64_t));
    self->front = PyMem_Calloc(count, sizeof(uint64_t));
    self->base_seen = PyMem_Calloc(count, sizeof(uint32_t));
    self->batch_bits = PyMem_Calloc(self->words ? self->words : 1, sizeof(uint64_t));
    self->front_bits = PyMem_Calloc(self->words ? self->words : 1, sizeof(uint64_t));
    if (!self->edges[0] || !self->edges[1] || !self->regions[0] || !self->regions[1] || !self->seen ||
        !self->stack || !self->owed[0] || !self->owed[1] || !self->base_bit || !self->reach || !self->front ||
        !self->base_seen || !self->batch_bits || !self->front_bits) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Frees what regions_init allocated (safe on a zeroed or partly initialized struct). */
static void regions_release(Regions *self) {
    for (int dir = 0; dir < 2; dir++) {
        if (self->edges[dir]) {
            for (Py_ssize_t i = 0; i < self->n; i++) PyMem_Free(self->edges[dir][i].items);
            PyMem_Free(self->edges[dir]);
            self->edges[dir] = NULL;
        }
        if (self->regions[dir]) {
            for (Py_ssize_t i = 0; i < self->n; i++) PyMem_Free(self->regions[dir][i].interior);
            PyMem_Free(self->regions[dir]);
            self->regions[dir] = NULL;
        }
        PyMem_Free(self->owed[dir]);
        self->owed[dir] = NULL;
    }
    PyMem_Free(self->pairs.items);
    self->pairs.items = NULL;
    self->pairs.len = self->pairs.cap = 0;
    void *buffers[] = {self->seen, self->stack, self->base_bit, self->reach, self->front, self->base_seen,
                       self->batch_bits, self->front_bits};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++) PyMem_Free(buffers[i]);
    self->seen = NULL;
    self->stack = NULL;
    self->base_bit = self->reach = self->front = self->batch_bits = self->front_bits = NULL;
    self->base_seen = NULL;
}

static int region_ensure(Regions *self, Region *region) {
    if (region->interior) return 0;
    region->interior = PyMem_Calloc(2 * self->words, sizeof(uint64_t));
    if (!region->interior) { PyErr_NoMemory(); return -1; }
    region->frontier = region->interior + self->words;
    region->lo = self->words;
    region->hi = 0;
    return 0;
}

/* Empty a region, touching only the words that can be nonzero. */
static void region_clear(Regions *self, Region *region) {
    if (region->lo < region->hi) {
        Py_ssize_t count = (region->hi - region->lo) * sizeof(uint64_t);
        memset(region->interior + region->lo, 0, count);
        memset(region->frontier + region->lo, 0, count);
    }
    region->lo = self->words;
    region->hi = 0;
}

/* Set bit i of one of the region's bitsets, keeping the word range. */
static inline void region_set(Region *region, uint64_t *bits, int32_t i) {
    Py_ssize_t w = i >> 6;
    bits[w] |= (uint64_t)1 << (i & 63);
    if (w < region->lo) region->lo = w;
    if (w >= region->hi) region->hi = w + 1;
}

/* An evicted storage has no regions until it is resident again: give the memory back. */
static void region_free(Region *region) {
    PyMem_Free(region->interior);
    region->interior = region->frontier = NULL;
}

/* A fresh stamp for seen and base_seen. */
static uint32_t next_generation(Regions *self) {
    if (++self->generation == 0) { /* wrapped: reset stamps */
        memset(self->seen, 0, self->n * sizeof(uint32_t));
        memset(self->base_seen, 0, self->n * sizeof(uint32_t));
        self->generation = 1;
    }
    return self->generation;
}

/* Walk the region of `base` in direction `dir` afresh. */
static int walk(Regions *self, int32_t base, int dir) {
    Region *region = &self->regions[dir][base];
    if (region_ensure(self, region) < 0) return -1;
    region_clear(self, region);
    uint64_t *interior = region->interior, *frontier = region->frontier;
    IntVec *edges = self->edges[dir];
    const uint8_t *material = self->material;
    const int64_t *compute = self->compute;
    uint32_t *seen = self->seen;

    uint32_t generation = next_generation(self);
    int64_t gained = 0;
    Py_ssize_t top = 0;
    self->stack[top++] = base;
    while (top) {
        IntVec *out = &edges[self->stack[--top]];
        for (Py_ssize_t i = 0; i < out->len; i++) {
            int32_t us = out->items[i];
            if (material[us]) {
                if (us != base) region_set(region, frontier, us);
            } else if (seen[us] != generation) {
                seen[us] = generation;
                gained += compute[us];
                region_set(region, interior, us);
                self->stack[top++] = us;
            }
        }
    }
    self->region_compute[dir][base] = gained;
    return 0;
}

/* Population count without a libgcc call (the default x86-64 target has no popcnt instruction). */
static inline int bit_count(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
    return (int)((x * 0x0101010101010101ULL) >> 56);
}

/* Transpose a 64x64 bit matrix in place: afterwards bit r of a[i] is bit i of a[r] before. */
static void transpose64(uint64_t a[64]) {
    uint64_t m = 0x00000000FFFFFFFFULL;
    for (int j = 32; j; j >>= 1, m ^= m << j)
        for (int k = 0; k < 64; k = ((k | j) + 1) & ~j) {
            uint64_t t = ((a[k] >> j) ^ a[k | j]) & m;
            a[k] ^= t << j;
            a[k | j] ^= t;
        }
}

/* From about this many (storage, base) pairs in a word, a transpose beats setting bits one by
 * one (measured on the DTR logs with benchmarks/bench_ab.py: 256-1024 are within noise). */
#define DENSE_WORD_PAIRS 512

/*
 * In dense words, interior compute is summed per run of storages with one mask, then added
 * to each base of the mask: the storages of a large evicted component mostly share theirs
 * (every base reaching it reaches all of it). -fwrapv: the sums equal the per-storage ones.
 */
typedef struct {
    uint64_t mask;
    int64_t compute;
} ComputeRun;

static inline void run_flush(ComputeRun *run, int64_t *gained) {
    for (uint64_t mask = run->mask; mask; mask &= mask - 1) gained[__builtin_ctzll(mask)] += run->compute;
    run->mask = 0;
    run->compute = 0;
}

static inline void run_add(ComputeRun *run, uint64_t mask, int64_t compute, int64_t *gained) {
    if (mask != run->mask) {
        run_flush(run, gained);
        run->mask = mask;
    }
    run->compute += compute;
}

/*
 * Word w of every base's bitset in `of`: storage 64w+r is in base i's set when bit r of
 * `word` is set and bit i of masks[64w+r] is. Word ranges lo/hi are widened to cover it.
 * With exclude_base, a base is never put in its own set (frontiers); with a run, the
 * storages' compute is added to the bases' in `gained` (interiors). A dense word is one
 * 64x64 bit matrix transposed; a sparse one is set bit by bit. Returns 1 if transposed.
 */
static inline int set_word_bits(uint64_t word, const uint64_t *masks, Py_ssize_t w, uint64_t **of,
                                 Py_ssize_t *lo, Py_ssize_t *hi, int exclude_base, const int32_t *bases,
                                 ComputeRun *run, const int64_t *compute, int64_t *gained) {
    uint64_t in_word = 0; /* the bases with a bit in this word */
    /* Estimated from the first storage's mask: a component's storages mostly share theirs. */
    int storages = bit_count(word), dense = 0;
    if (storages >= 4 && storages * bit_count(masks[(w << 6) + __builtin_ctzll(word)]) >= DENSE_WORD_PAIRS) {
        uint64_t rows[64] = {0};
        ComputeRun local = run ? *run : (ComputeRun){0, 0}; /* in registers, not through the pointer */
        for (uint64_t left = word; left; left &= left - 1) {
            int r = __builtin_ctzll(left);
            rows[r] = masks[(w << 6) + r];
            in_word |= rows[r];
            if (run) run_add(&local, rows[r], compute[(w << 6) + r], gained);
        }
        if (run) *run = local;
        transpose64(rows);
        for (uint64_t left = in_word; left; left &= left - 1) {
            int i = __builtin_ctzll(left);
            of[i][w] |= rows[i];
        }
        dense = 1;
    } else {
        for (uint64_t left = word; left; left &= left - 1) {
            int32_t v = (int32_t)((w << 6) + __builtin_ctzll(left));
            uint64_t mask = masks[v];
            in_word |= mask;
            if (run) {
                int64_t cost = compute[v];
                for (; mask; mask &= mask - 1) {
                    int i = __builtin_ctzll(mask);
                    BIT_SET(of[i], v);
                    gained[i] += cost;
                }
            } else {
                for (; mask; mask &= mask - 1) BIT_SET(of[__builtin_ctzll(mask)], v);
            }
        }
    }
    for (; in_word; in_word &= in_word - 1) {
        int i = __builtin_ctzll(in_word);
        if (exclude_base && (bases[i] >> 6) == w) {
            of[i][w] &= ~((uint64_t)1 << (bases[i] & 63));
            if (!of[i][w]) continue;
        }
        if (w < lo[i]) lo[i] = w;
        if (w >= hi[i]) hi[i] = w + 1;
    }
    return dense;
}

/*
 * The walks of up to 64 bases in one direction at once, with the same results as
 * walk() on each: every walk of one regions_materialized() call sees the same
 * resident set, so the evicted storages reachable from the bases are found once,
 * each with the mask of the bases that reach it, and every region is read off the
 * masks. Masks are pushed along edges in storage-id order, which is nearly
 * topological (only alias edges can point back); a pass that changed a storage
 * already passed is repeated, so cycles are handled too.
 */
static int walk_batch(Regions *self, const int32_t *bases, int count, int dir) {
    IntVec *out_edges = self->edges[dir];
    const uint8_t *material = self->material;
    const int64_t *compute = self->compute;
    uint32_t *seen = self->seen, *base_seen = self->base_seen;
    uint64_t *base_bit = self->base_bit, *reach = self->reach, *front = self->front, *bits = self->batch_bits;
    uint64_t *front_bits = self->front_bits;
    uint32_t generation = next_generation(self);
    int64_t gained[64] = {0};
    Py_ssize_t top = 0, words = self->words;
    uint64_t *interior_of[64], *frontier_of[64];
    Py_ssize_t lo[64], hi[64]; /* each base's word range, applied at the end */

    memset(bits, 0, words * sizeof(uint64_t));
    memset(front_bits, 0, words * sizeof(uint64_t));
    for (int i = 0; i < count; i++) {
        int32_t base = bases[i];
        Region *region = &self->regions[dir][base];
        if (region_ensure(self, region) < 0) return -1;
        region_clear(self, region);
        interior_of[i] = region->interior;
        frontier_of[i] = region->frontier;
        lo[i] = words;
        hi[i] = 0;
        base_seen[base] = generation;
        base_bit[base] = (uint64_t)1 << i;
        self->stack[top++] = base;
    }
    /* The evicted storages reachable from any base through evicted storages; the bases'
     * own bits go to their evicted neighbours, and edges into resident storages are kept. */
    self->pairs.len = 0;
    while (top) {
        int32_t u = self->stack[--top];
        IntVec *out = &out_edges[u];
        uint64_t own = base_seen[u] == generation ? base_bit[u] : 0;
        for (Py_ssize_t j = 0; j < out->len; j++) {
            int32_t us = out->items[j];
            if (material[us]) {
                if (vec_push(&self->pairs, u) < 0 || vec_push(&self->pairs, us) < 0) return -1;
                continue;
            }
            if (seen[us] != generation) {
                seen[us] = generation;
                reach[us] = 0;
                BIT_SET(bits, us);
                self->stack[top++] = us;
            }
            reach[us] |= own;
        }
    }
    /* reach[v]: the bases with a path to v through evicted storages. */
    for (int again = 1; again;) {
        again = 0;
        for (Py_ssize_t k = 0; k < words; k++) {
            Py_ssize_t w = dir ? words - 1 - k : k;
            uint64_t word = bits[w];
            while (word) {
                int b = dir ? 63 - __builtin_clzll(word) : __builtin_ctzll(word);
                int32_t u = (int32_t)((w << 6) + b);
                word &= ~((uint64_t)1 << b);
                uint64_t mask = reach[u];
                if (!mask) continue;
                IntVec *out = &out_edges[u];
                for (Py_ssize_t j = 0; j < out->len; j++) {
                    int32_t us = out->items[j];
                    if (material[us] || !(mask & ~reach[us])) continue;
                    reach[us] |= mask;
                    if (dir ? us > u : us < u) again = 1; /* already passed in this order */
                }
            }
        }
    }
    /* Interiors and their compute. */
    ComputeRun run = {0, 0};
    for (Py_ssize_t w = 0; w < words; w++)
        if (bits[w])
            self->dense_words += set_word_bits(bits[w], reach, w, interior_of, lo, hi, 0, bases, &run, compute, gained);
    run_flush(&run, gained);
    /* Frontiers: the resident storages at the end of an edge from a base or its interior. */
    for (Py_ssize_t j = 0; j < self->pairs.len; j += 2) {
        int32_t u = self->pairs.items[j], us = self->pairs.items[j + 1];
        uint64_t mask = base_seen[u] == generation ? base_bit[u] : reach[u];
        if (!BIT_GET(front_bits, us)) {
            BIT_SET(front_bits, us);
            front[us] = 0;
        }
        front[us] |= mask;
    }
    for (Py_ssize_t w = 0; w < words; w++)
        if (front_bits[w])
            self->dense_words += set_word_bits(front_bits[w], front, w, frontier_of, lo, hi, 1, bases, NULL, NULL, NULL);
    for (int i = 0; i < count; i++) {
        Region *region = &self->regions[dir][bases[i]];
        region->lo = lo[i];
        region->hi = hi[i];
        self->region_compute[dir][bases[i]] = gained[i];
    }
    return 0;
}

/* Rebuild every storage flagged in `bits` in direction `dir`, batching the walks. */
static int rebuild_flagged(Regions *self, const uint64_t *bits, int dir) {
    int32_t bases[64];
    int count = 0;
    for (Py_ssize_t w = 0; w < self->words; w++) {
        uint64_t word = bits[w];
        while (word) {
            bases[count++] = (int32_t)((w << 6) + __builtin_ctzll(word));
            word &= word - 1;
            if (count == 64) {
                if (walk_batch(self, bases, count, dir) < 0) return -1;
                count = 0;
            }
        }
    }
    /* A lone walk is cheaper than a batch of one. */
    if (count == 1) return walk(self, bases[0], dir);
    return count ? walk_batch(self, bases, count, dir) : 0;
}

/*
 * Rebuilds are owed, not done at once: a region is read only when a policy chooses (or an
 * eviction absorbs into it), and between two reads a storage is often marked several times.
 * Taking its walk at the read gives what the last walk at the mark gave, because in between
 * there are only materializations (a storage that becomes resident changes a walk only if
 * the walk reached it; then the walk's base is on that storage's frontier and is marked
 * again), new edges (regions_link() takes the walks the edge would change first) and new
 * compute of an evicted storage (regions_compute_changing() takes every owed walk first);
 * every eviction takes all owed walks before the storage stops being resident. Reverse
 * walks of a storage's frontier are owed the same way.
 */
static int regions_flush(Regions *self) {
    if (!self->any_owed) return 0;
    self->any_owed = 0;
    for (int dir = 0; dir < 2; dir++) {
        if (rebuild_flagged(self, self->owed[dir], dir) < 0) return -1;
        memset(self->owed[dir], 0, self->words * sizeof(uint64_t));
    }
    return 0;
}

/* Take s's walk in direction dir now if it is owed. */
static int take_owed_walk(Regions *self, int32_t s, int dir) {
    if (!BIT_GET(self->owed[dir], s)) return 0;
    BIT_CLEAR(self->owed[dir], s);
    return walk(self, s, dir);
}

/* link(parent, child): a tensor of storage `child` was computed from one of `parent`. */
static int regions_link(Regions *self, int32_t parent, int32_t child) {
    /* A self-edge never changes a walk; keep edges unique, as the reference's sets do. */
    if (parent == child || vec_contains(&self->edges[0][parent], child)) return 0;
    /* The new edge is followed only by walks that reach parent (forward) or child (reverse):
     * with both resident, or child new and childless, those are parent's forward walk and
     * child's reverse walk; otherwise any owed walk may reach them. Owed walks are taken
     * without the edge, as they would have been when they were marked. */
    if (!self->material[parent] || (!self->material[child] && self->edges[0][child].len)) {
        if (regions_flush(self) < 0) return -1;
    } else if (take_owed_walk(self, parent, 0) < 0 || take_owed_walk(self, child, 1) < 0) {
        return -1;
    }
    if (vec_push(&self->edges[0][parent], child) < 0 || vec_push(&self->edges[1][child], parent) < 0) return -1;
    return 0;
}

/* The compute of storage `s` is about to change (an operator aliasing it, maybe while it is
 * evicted): a walk that reaches s sums it, so owed walks are taken first, with the old value.
 * Walks stop at resident storages and cannot reach one without edges (a new output). */
static inline int regions_compute_changing(Regions *self, int32_t s) {
    if (self->material[s] || (!self->edges[0][s].len && !self->edges[1][s].len)) return 0;
    return regions_flush(self);
}

/* `storages` just became resident: walk them now, and owe their frontiers' regions a rebuild. */
static int regions_materialized(Regions *self, const int32_t *storages, Py_ssize_t count) {
    uint64_t *owed = self->owed[0], *owed_rev = self->owed[1];
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t s = storages[i];
        if (walk(self, s, 0) < 0 || walk(self, s, 1) < 0) return -1;
        const Region *forward = &self->regions[0][s], *reverse = &self->regions[1][s];
        for (Py_ssize_t w = reverse->lo; w < reverse->hi; w++) owed[w] |= reverse->frontier[w];
        for (Py_ssize_t w = forward->lo; w < forward->hi; w++) owed_rev[w] |= forward->frontier[w];
        self->any_owed = 1;
    }
    /* Every storage of this call was resident for all its walks: none owes one. */
    for (Py_ssize_t i = 0; i < count; i++) {
        BIT_CLEAR(owed, storages[i]);
        BIT_CLEAR(owed_rev, storages[i]);
    }
    return 0;
}

/* Region `owner` (direction dir) absorbs the just-evicted storage s and s's region. */
static int absorb(Regions *self, int32_t owner, int32_t s, int dir) {
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
    for (Py_ssize_t w = evicted->lo; w < evicted->hi; w++) {
        region->frontier[w] |= evicted->frontier[w];
        uint64_t added = evicted->interior[w] & ~region->interior[w];
        region->interior[w] |= added;
        while (added) {
            gained += compute[(w << 6) + __builtin_ctzll(added)];
            added &= added - 1;
        }
    }
    if (evicted->lo < region->lo) region->lo = evicted->lo;
    if (evicted->hi > region->hi) region->hi = evicted->hi;
    /* s joins the interior and is counted even if it was there already (as simrd does). */
    region_set(region, region->interior, s);
    if (!s_in_difference) gained += compute[s];
    self->region_compute[dir][owner] += gained;
    return 0;
}

/* `s` was just evicted (after regions_flush()): its frontier storages absorb it, then its
 * regions are cleared. */
static int regions_evicted(Regions *self, int32_t s) {
    if (self->any_owed) { /* the walks had to see s resident: regions_flush() comes first */
        PyErr_SetString(RegionError, "a storage was evicted while region rebuilds were owed");
        return -1;
    }
    for (int dir = 0; dir < 2; dir++) {
        Region *evicted = &self->regions[dir][s];
        if (!evicted->interior) continue;
        /* Forward regions of the evicted storage's reverse frontier absorb it, and vice versa. */
        const Region *opposite = &self->regions[1 - dir][s];
        if (!opposite->frontier) continue;
        for (Py_ssize_t w = opposite->lo; w < opposite->hi; w++) {
            uint64_t word = opposite->frontier[w];
            while (word) {
                if (absorb(self, (int32_t)((w << 6) + __builtin_ctzll(word)), s, dir) < 0) return -1;
                word &= word - 1;
            }
        }
    }
    for (int dir = 0; dir < 2; dir++) {
        region_free(&self->regions[dir][s]);
        self->region_compute[dir][s] = 0;
    }
    return 0;
}

#endif

/*
 * The memory models in C: byte counting (flat, aligned) and PyTorch's caching allocator, the same
 * rules as dtrlab/memory/{flat,aligned,caching}.py, block for block (caching.py is the readable
 * reference and cites c10/cuda/CUDACachingAllocator.cpp; each function below names the PyTorch
 * function, or the Python method, it mirrors). Header-only: included by the replay core (_core.c)
 * and by the test wrapper (_compiled.c, dtrlab.memory._compiled.MemoryCore).
 *
 * API (issue 23): the enum, MemStats, MemLayout and the functions memory_init, memory_release,
 * memory_request_bytes, memory_allocate, memory_free, memory_stats, memory_layout,
 * memory_layout_release, memory_block_pool as specified there. Additions:
 *   memory_grow_ids(m, n)      raise max_block_id to at least n (the Python wrapper takes any id);
 *   memory_holds(m, id)        1 when id holds a block (a 0-byte request included), else 0;
 *   memory_block_of(m, id, &address, &size, &requested)
 *                              1 and the block, 0 for a 0-byte request, -1 when id holds none;
 *   MEM_MAX_BYTES (2^62)       the largest capacity, granularity and request accepted: memory_init
 *                              refuses more (ValueError), and so does memory_allocate for a request
 *                              (the core takes traces of < 2^56 bytes in all).
 * memory_allocate refuses (ValueError, -1) an id that already holds a block, as the Python models do.
 *
 * Data structures: blocks are a pool of structs linked by int32 indices (no malloc per block);
 * each pool's free blocks are a treap in (size, address) order (lower bound, insert, delete,
 * successor and maximum in O(log n)), its unmapped blocks (expandable segments) a treap in address
 * order; block ids index an owner table; live segments form a list in address order. Every
 * growth of an array happens before a call changes anything, so -1 (no memory) leaves the model as
 * it was. Addresses: a new segment must start at or below INT64_MAX (and a cudaMalloc segment end
 * there); the bump pointer itself is unsigned, since with a 2^62-byte device the large pool's
 * expandable range ends past 2^63. Beyond that, memory_allocate fails with OverflowError (possibly
 * after releasing cached blocks; no trace the core accepts comes near it).
 */
#ifndef DTRLAB_MEMORY_CORE_H
#define DTRLAB_MEMORY_CORE_H

#ifndef PY_SSIZE_T_CLEAN
#define PY_SSIZE_T_CLEAN
#endif
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The API's functions are static; unused ones (an includer need not call them all) draw no warning. */
#define MEM_API static __attribute__((unused))

enum { MEM_BYTES = 0, MEM_CACHING = 1 };           /* byte counting (flat: granularity 1; aligned) or caching */
typedef struct { int64_t allocated, reserved, peak_allocated, peak_reserved, largest_free_block, segments; } MemStats;
typedef struct {                                    /* one layout walk, reused between calls (arrays grow) */
    Py_ssize_t n_segments, n_blocks;
    Py_ssize_t *seg_first;                           /* blocks of segment i: [seg_first[i], seg_first[i+1]) */
    int64_t *seg_address, *seg_size; int8_t *seg_pool; /* pool: 0 small, 1 large, 2 flat (byte counting) */
    int64_t *block_address, *block_size, *block_requested; int32_t *block_owner; /* owner -1: free block */
    Py_ssize_t seg_cap, block_cap;
} MemLayout;

#define MEM_MIB ((int64_t)1 << 20)
#define MEM_MIN_BLOCK_SIZE ((int64_t)512)        /* kMinBlockSize */
#define MEM_SMALL_SIZE MEM_MIB                    /* kSmallSize */
#define MEM_SMALL_BUFFER (2 * MEM_MIB)            /* kSmallBuffer (and small expandable page) */
#define MEM_LARGE_BUFFER (20 * MEM_MIB)           /* kLargeBuffer (and large expandable page) */
#define MEM_MIN_LARGE_ALLOC (10 * MEM_MIB)        /* kMinLargeAlloc */
#define MEM_ROUND_LARGE (2 * MEM_MIB)             /* kRoundLarge */
#define MEM_ROUNDUP_INTERVALS 16                  /* kRoundUpPowerOfTwoIntervals */
#define MEM_MAX_BYTES ((int64_t)1 << 62)
#define MEM_NO_SPLIT INT64_MAX                    /* max_split_size's default (SIZE_MAX in PyTorch) */
#define MEM_MAX_DIVISIONS (1 << 30)
enum { MEM_POOL_SMALL = 0, MEM_POOL_LARGE = 1, MEM_POOL_FLAT = 2 };
enum { MEM_NIL = -1, MEM_ERR = -2 };               /* block/segment index: none, or a Python error set */
#define MEM_ZERO_BYTES (-2)                        /* owner table: the id holds a 0-byte request */

typedef struct {
    int64_t addr, size, requested;
    int32_t owner;          /* block id, -1 when free (or unmapped) */
    int32_t prev, next;     /* caching: neighbours in the segment; bytes: allocation order */
    int32_t seg;
    int32_t left, right;    /* treap children (free tree or unmapped tree of the pool) */
    uint32_t prio;
    int8_t mapped;
} MemBlock;

typedef struct {
    int64_t addr, size, page;   /* page > 0: an expandable segment's virtual range */
    int32_t head;               /* lowest-address block; merges keep it */
    int32_t prev, next;         /* live segments in address order (next: free list when unused) */
    int8_t pool;
} MemSegment;

typedef struct MemoryCore MemoryCore;
struct MemoryCore {
    int kind, expandable, limit_before_mapping, reuse_addresses, rounds_power2;
    int64_t capacity, granularity, max_split;
    int32_t divisions[MEM_ROUNDUP_INTERVALS];
    int64_t allocated, reserved, peak_allocated, peak_reserved, mapped_runs;
    Py_ssize_t max_block_id;
    int32_t *owned;             /* block id -> block index, MEM_NIL, or MEM_ZERO_BYTES */
    MemBlock *blocks;
    Py_ssize_t block_used, block_cap, block_live;
    int32_t block_free;         /* free list of block slots, through .next */
    MemSegment *segs;
    Py_ssize_t seg_used, seg_cap, n_segments;
    int32_t seg_free, seg_first, seg_last;
    int32_t free_root[2], unmapped_root[2];  /* treaps per pool (0 small, 1 large) */
    Py_ssize_t free_count[2];
    uint64_t next_address;      /* bump pointer */
    uint64_t *released;         /* reuse: [start, end) pairs of released ranges, address order */
    Py_ssize_t n_released, released_cap;
    int32_t *scratch;
    Py_ssize_t scratch_cap;
    int32_t order_first, order_last;  /* byte counting: blocks in allocation order */
    uint32_t rng;
};

/* ------------------------------------------------------------------ storage */

static int mem_grow(void **items, Py_ssize_t *cap, Py_ssize_t need, size_t itemsize) {
    if (need <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 16;
    while (cap2 < need) cap2 *= 2;
    if (cap2 > INT32_MAX || (size_t)cap2 > PY_SSIZE_T_MAX / itemsize) { PyErr_NoMemory(); return -1; }
    void *grown = PyMem_Realloc(*items, (size_t)cap2 * itemsize);
    if (!grown) { PyErr_NoMemory(); return -1; }
    *items = grown;
    *cap = cap2;
    return 0;
}

/* Make room for `extra` more blocks and `extra_segs` more segments, before anything changes. */
static int mem_reserve(MemoryCore *m, Py_ssize_t extra, Py_ssize_t extra_segs) {
    if (mem_grow((void **)&m->blocks, &m->block_cap, m->block_live + extra, sizeof(MemBlock)) < 0) return -1;
    if (mem_grow((void **)&m->segs, &m->seg_cap, m->n_segments + extra_segs, sizeof(MemSegment)) < 0) return -1;
    /* Released ranges are disjoint gaps between live segments: at most one more than the segments. */
    if (m->reuse_addresses && mem_grow((void **)&m->released, &m->released_cap, 2 * (m->seg_cap + 1),
                                       sizeof(uint64_t)) < 0)
        return -1;
    return 0;
}

static uint32_t mem_rand(MemoryCore *m) {  /* xorshift32: treap priorities, deterministic */
    uint32_t x = m->rng;
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    return m->rng = x;
}

static int32_t mem_new_block(MemoryCore *m, int64_t addr, int64_t size, int32_t seg, int mapped) {
    int32_t i;
    if (m->block_free != MEM_NIL) {
        i = m->block_free;
        m->block_free = m->blocks[i].next;
    } else {
        i = (int32_t)m->block_used++;  /* mem_reserve made room */
    }
    m->block_live++;
    MemBlock *b = &m->blocks[i];
    b->addr = addr; b->size = size; b->requested = 0; b->owner = -1;
    b->prev = b->next = b->left = b->right = MEM_NIL;
    b->seg = seg; b->prio = mem_rand(m); b->mapped = (int8_t)mapped;
    return i;
}

static void mem_drop_block(MemoryCore *m, int32_t i) {
    m->blocks[i].next = m->block_free;
    m->block_free = i;
    m->block_live--;
}

/* ------------------------------------------------------------------ treaps */
/* by_addr: the unmapped trees, ordered by address; otherwise (size, address), BlockComparatorSize. */

static int mem_less(const MemoryCore *m, int by_addr, int32_t a, int32_t b) {
    const MemBlock *x = &m->blocks[a], *y = &m->blocks[b];
    if (!by_addr && x->size != y->size) return x->size < y->size;
    return x->addr < y->addr;
}

static void mem_split(MemoryCore *m, int by_addr, int32_t t, int32_t key, int32_t *lo, int32_t *hi) {
    if (t == MEM_NIL) { *lo = *hi = MEM_NIL; return; }
    if (mem_less(m, by_addr, t, key)) {
        mem_split(m, by_addr, m->blocks[t].right, key, &m->blocks[t].right, hi);
        *lo = t;
    } else {
        mem_split(m, by_addr, m->blocks[t].left, key, lo, &m->blocks[t].left);
        *hi = t;
    }
}

static int32_t mem_merge(MemoryCore *m, int32_t a, int32_t b) {
    if (a == MEM_NIL) return b;
    if (b == MEM_NIL) return a;
    if (m->blocks[a].prio > m->blocks[b].prio) {
        m->blocks[a].right = mem_merge(m, m->blocks[a].right, b);
        return a;
    }
    m->blocks[b].left = mem_merge(m, a, m->blocks[b].left);
    return b;
}

static int32_t mem_insert(MemoryCore *m, int by_addr, int32_t t, int32_t x) {
    if (t == MEM_NIL) { m->blocks[x].left = m->blocks[x].right = MEM_NIL; return x; }
    if (m->blocks[x].prio > m->blocks[t].prio) {
        mem_split(m, by_addr, t, x, &m->blocks[x].left, &m->blocks[x].right);
        return x;
    }
    if (mem_less(m, by_addr, x, t)) m->blocks[t].left = mem_insert(m, by_addr, m->blocks[t].left, x);
    else m->blocks[t].right = mem_insert(m, by_addr, m->blocks[t].right, x);
    return t;
}

static int32_t mem_erase(MemoryCore *m, int by_addr, int32_t t, int32_t x) {
    if (t == x) return mem_merge(m, m->blocks[x].left, m->blocks[x].right);
    if (t == MEM_NIL) return MEM_NIL;  /* not in the tree: cannot happen */
    if (mem_less(m, by_addr, x, t)) m->blocks[t].left = mem_erase(m, by_addr, m->blocks[t].left, x);
    else m->blocks[t].right = mem_erase(m, by_addr, m->blocks[t].right, x);
    return t;
}

/* The first block of the free tree with size >= `size` (bisect_left on (size, -1)). */
static int32_t mem_lower_bound(const MemoryCore *m, int32_t t, int64_t size) {
    int32_t found = MEM_NIL;
    while (t != MEM_NIL) {
        if (m->blocks[t].size >= size) { found = t; t = m->blocks[t].left; }
        else t = m->blocks[t].right;
    }
    return found;
}

/* The block after x in the tree's order. */
static int32_t mem_successor(const MemoryCore *m, int by_addr, int32_t t, int32_t x) {
    int32_t found = MEM_NIL;
    while (t != MEM_NIL) {
        if (mem_less(m, by_addr, x, t)) { found = t; t = m->blocks[t].left; }
        else t = m->blocks[t].right;
    }
    return found;
}

static int32_t mem_first(const MemoryCore *m, int32_t t) {
    if (t == MEM_NIL) return MEM_NIL;
    while (m->blocks[t].left != MEM_NIL) t = m->blocks[t].left;
    return t;
}

static int32_t mem_last(const MemoryCore *m, int32_t t) {
    if (t == MEM_NIL) return MEM_NIL;
    while (m->blocks[t].right != MEM_NIL) t = m->blocks[t].right;
    return t;
}

static void mem_in_order(const MemoryCore *m, int32_t t, int32_t *out, Py_ssize_t *n) {
    while (t != MEM_NIL) {
        mem_in_order(m, m->blocks[t].left, out, n);
        out[(*n)++] = t;
        t = m->blocks[t].right;
    }
}

static int mem_pool_of(const MemoryCore *m, int32_t b) { return m->segs[m->blocks[b].seg].pool; }

/* caching.py _add_free / _remove_free / _add_unmapped / _remove_unmapped */
static void mem_add_free(MemoryCore *m, int32_t b) {
    int p = mem_pool_of(m, b);
    m->free_root[p] = mem_insert(m, 0, m->free_root[p], b);
    m->free_count[p]++;
}

static void mem_remove_free(MemoryCore *m, int32_t b) {
    int p = mem_pool_of(m, b);
    m->free_root[p] = mem_erase(m, 0, m->free_root[p], b);
    m->free_count[p]--;
}

static void mem_add_unmapped(MemoryCore *m, int32_t b) {
    int p = mem_pool_of(m, b);
    m->unmapped_root[p] = mem_insert(m, 1, m->unmapped_root[p], b);
}

static void mem_remove_unmapped(MemoryCore *m, int32_t b) {
    int p = mem_pool_of(m, b);
    m->unmapped_root[p] = mem_erase(m, 1, m->unmapped_root[p], b);
}

static void mem_remove_cached(MemoryCore *m, int32_t b) {
    if (m->blocks[b].mapped) mem_remove_free(m, b);
    else mem_remove_unmapped(m, b);
}

/* ------------------------------------------------------------------ sizes */

static int mem_bit_length(int64_t x) { return x ? 64 - __builtin_clzll((uint64_t)x) : 0; }

/* roundup_power2_next_division: the next of `divisions` equal steps between the powers of 2 around size. */
static int64_t mem_roundup_power2_next_division(int64_t size, int64_t divisions) {
    if ((size & (size - 1)) == 0) return size;
    int64_t floor = (int64_t)1 << (mem_bit_length(size) - 1);
    int64_t step = floor >> (mem_bit_length(divisions) - 1);
    if (step == 0) return floor << 1;
    int64_t rounded = size & ~(step - 1);
    return rounded == size ? size : rounded + step;
}

/* round_size (caching) or the granularity's rounding (bytes); size in [0, MEM_MAX_BYTES]. */
MEM_API int64_t memory_request_bytes(const MemoryCore *m, int64_t size) {
    if (m->kind == MEM_BYTES) {
        int64_t g = m->granularity;
        return g == 1 ? size : (size + g - 1) / g * g;
    }
    if (size < MEM_MIN_BLOCK_SIZE) return size ? MEM_MIN_BLOCK_SIZE : 0;
    if (m->rounds_power2) {
        int index = mem_bit_length(size) - 21;
        index = index < 0 ? 0 : index > MEM_ROUNDUP_INTERVALS - 1 ? MEM_ROUNDUP_INTERVALS - 1 : index;
        int64_t divisions = m->divisions[index];
        if (divisions > 1 && size > MEM_MIN_BLOCK_SIZE * divisions)
            return mem_roundup_power2_next_division(size, divisions);
    }
    return (size + MEM_MIN_BLOCK_SIZE - 1) / MEM_MIN_BLOCK_SIZE * MEM_MIN_BLOCK_SIZE;
}

/* get_allocation_size: the segment a request reserves when no cached block fits. */
static int64_t mem_allocation_size(int64_t size) {
    if (size <= MEM_SMALL_SIZE) return MEM_SMALL_BUFFER;
    if (size < MEM_MIN_LARGE_ALLOC) return MEM_LARGE_BUFFER;
    return (size + MEM_ROUND_LARGE - 1) / MEM_ROUND_LARGE * MEM_ROUND_LARGE;
}

/* get_pool: the pool a request goes to (0 small, 1 large; 2 for byte counting). */
MEM_API int memory_block_pool(const MemoryCore *m, int64_t size) {
    if (m->kind == MEM_BYTES) return MEM_POOL_FLAT;
    return memory_request_bytes(m, size) <= MEM_SMALL_SIZE ? MEM_POOL_SMALL : MEM_POOL_LARGE;
}

/* ------------------------------------------------------------------ segments and addresses */

static void mem_grow_reserved(MemoryCore *m, int64_t nbytes) {  /* caching.py _grow_reserved */
    m->reserved += nbytes;
    if (m->reserved > m->peak_reserved) m->peak_reserved = m->reserved;
}

/* caching.py _reused_address: the low end of the lowest released range that holds size, or UINT64_MAX. */
static uint64_t mem_reused_address(MemoryCore *m, int64_t size) {
    for (Py_ssize_t i = 0; i < m->n_released; i++) {
        uint64_t start = m->released[2 * i], end = m->released[2 * i + 1];
        if (end - start >= (uint64_t)size) {
            if (end - start == (uint64_t)size) {
                memmove(&m->released[2 * i], &m->released[2 * i + 2], (size_t)(m->n_released - i - 1) * 2 * sizeof(uint64_t));
                m->n_released--;
            } else {
                m->released[2 * i] = start + (uint64_t)size;
            }
            return start;
        }
    }
    return UINT64_MAX;
}

/* caching.py _new_segment (cudaMalloc's address: bump pointer, or a released range under "reuse"). */
static int32_t mem_new_segment(MemoryCore *m, int64_t size, int pool, int64_t page) {
    uint64_t address = m->n_released ? mem_reused_address(m, size) : UINT64_MAX;
    int bump = address == UINT64_MAX;
    if (bump) address = m->next_address;
    /* An expandable range may end past 2^63 (its mapped pages are checked in mem_map_block); a
       cudaMalloc segment's blocks must all have int64 addresses. */
    if (address > (uint64_t)INT64_MAX || (!page && address > (uint64_t)(INT64_MAX - size))) {
        PyErr_SetString(PyExc_OverflowError, "memory model: segment addresses passed 2^63");
        return MEM_ERR;
    }
    if (bump) m->next_address += (uint64_t)size;
    int32_t s;
    if (m->seg_free != MEM_NIL) { s = m->seg_free; m->seg_free = m->segs[s].next; }
    else s = (int32_t)m->seg_used++;  /* mem_reserve made room */
    MemSegment *seg = &m->segs[s];
    seg->addr = (int64_t)address; seg->size = size; seg->page = page; seg->pool = (int8_t)pool;
    seg->head = MEM_NIL;
    /* Insert into the address-ordered list, searching from the top (the bump pointer's end). */
    int32_t after = m->seg_last;
    while (after != MEM_NIL && m->segs[after].addr > seg->addr) after = m->segs[after].prev;
    seg->prev = after;
    seg->next = after == MEM_NIL ? m->seg_first : m->segs[after].next;
    if (seg->next != MEM_NIL) m->segs[seg->next].prev = s; else m->seg_last = s;
    if (after != MEM_NIL) m->segs[after].next = s; else m->seg_first = s;
    m->n_segments++;
    return s;
}

/* caching.py _drop_segment: forget a released segment; under "reuse" its range becomes reusable
   (merged with released neighbours; a range reaching the bump pointer lowers it). */
static void mem_drop_segment(MemoryCore *m, int32_t s) {
    MemSegment *seg = &m->segs[s];
    uint64_t start = (uint64_t)seg->addr, end = start + (uint64_t)seg->size;
    if (seg->prev != MEM_NIL) m->segs[seg->prev].next = seg->next; else m->seg_first = seg->next;
    if (seg->next != MEM_NIL) m->segs[seg->next].prev = seg->prev; else m->seg_last = seg->prev;
    seg->next = m->seg_free;
    m->seg_free = s;
    m->n_segments--;
    if (!m->reuse_addresses) return;
    uint64_t *r = m->released;
    Py_ssize_t i = 0;
    while (i < m->n_released && r[2 * i] < start) i++;  /* bisect_left on the start */
    if (i < m->n_released && r[2 * i] == end) {
        end = r[2 * i + 1];
        memmove(&r[2 * i], &r[2 * i + 2], (size_t)(m->n_released - i - 1) * 2 * sizeof(uint64_t));
        m->n_released--;
    }
    if (i > 0 && r[2 * i - 1] == start) {
        i--;
        start = r[2 * i];
        memmove(&r[2 * i], &r[2 * i + 2], (size_t)(m->n_released - i - 1) * 2 * sizeof(uint64_t));
        m->n_released--;
    }
    if (end == m->next_address) {
        m->next_address = start;
    } else {
        memmove(&r[2 * i + 2], &r[2 * i], (size_t)(m->n_released - i) * 2 * sizeof(uint64_t));
        r[2 * i] = start;
        r[2 * i + 1] = end;
        m->n_released++;
    }
}

/* ------------------------------------------------------------------ blocks */

static void mem_link_after(MemoryCore *m, int32_t b, int32_t x) {  /* caching.py _link_after */
    MemBlock *block = &m->blocks[b], *nw = &m->blocks[x];
    nw->prev = b;
    nw->next = block->next;
    if (block->next != MEM_NIL) m->blocks[block->next].prev = x;
    block->next = x;
}

/* try_merge_blocks with both neighbours (caching.py _merge_neighbours): absorb each neighbour that is
   unallocated and in the same mapped state; the lower block survives. */
static int32_t mem_merge_neighbours(MemoryCore *m, int32_t b) {
    int32_t p = m->blocks[b].prev;
    if (p != MEM_NIL && m->blocks[p].owner < 0 && m->blocks[p].mapped == m->blocks[b].mapped) {
        mem_remove_cached(m, p);
        MemBlock *prev = &m->blocks[p], *block = &m->blocks[b];
        prev->size += block->size;
        prev->next = block->next;
        if (block->next != MEM_NIL) m->blocks[block->next].prev = p;
        mem_drop_block(m, b);
        b = p;
    }
    int32_t n = m->blocks[b].next;
    if (n != MEM_NIL && m->blocks[n].owner < 0 && m->blocks[n].mapped == m->blocks[b].mapped) {
        mem_remove_cached(m, n);
        MemBlock *block = &m->blocks[b], *nxt = &m->blocks[n];
        block->size += nxt->size;
        block->next = nxt->next;
        if (nxt->next != MEM_NIL) m->blocks[nxt->next].prev = b;
        mem_drop_block(m, n);
    }
    return b;
}

static int64_t mem_expandable_size(const MemoryCore *m, int32_t b) {  /* caching.py _expandable_size */
    int32_t n = m->blocks[b].next;
    return m->blocks[b].size + (n != MEM_NIL && !m->blocks[n].mapped ? m->blocks[n].size : 0);
}

/* get_free_block: best fit in (size, address) order, with max_split_size's limits; removes the block. */
static int32_t mem_get_free_block(MemoryCore *m, int pool, int64_t size) {
    int32_t b = mem_lower_bound(m, m->free_root[pool], size);
    if (b == MEM_NIL) return MEM_NIL;
    if (m->expandable) {
        /* A block followed by unmapped space counts as the size it could grow to: walk on while the
           next block in size order could grow to less. */
        for (;;) {
            int32_t n = mem_successor(m, 0, m->free_root[pool], b);
            if (n == MEM_NIL || mem_expandable_size(m, n) >= mem_expandable_size(m, b)) break;
            b = n;
        }
    }
    int64_t found = m->blocks[b].size;
    if (size < m->max_split && m->max_split <= found) return MEM_NIL;  /* no splitting an oversize block */
    if (size >= m->max_split && found >= size + MEM_LARGE_BUFFER) return MEM_NIL;  /* rounds up by < 20 MiB */
    mem_remove_free(m, b);
    return b;
}

/* alloc_found_block with should_split: the request takes the low end, the remainder may stay cached. */
static void mem_alloc_found_block(MemoryCore *m, int32_t b, int pool, int64_t size, int64_t requested,
                                  int32_t block_id) {
    int64_t remaining = m->blocks[b].size - size;
    int split = (pool == MEM_POOL_SMALL || m->expandable) ? remaining >= MEM_MIN_BLOCK_SIZE
                                                          : size < m->max_split && remaining > MEM_SMALL_SIZE;
    if (split) {
        int32_t rest = mem_new_block(m, m->blocks[b].addr + size, remaining, m->blocks[b].seg, 1);
        mem_link_after(m, b, rest);
        m->blocks[b].size = size;
        mem_add_free(m, rest);
    }
    MemBlock *block = &m->blocks[b];
    block->owner = block_id;
    block->requested = requested;
    m->owned[block_id] = b;
    m->allocated += block->size;
    if (m->allocated > m->peak_allocated) m->peak_allocated = m->allocated;
}

/* map_block: map the pages covering the first `size` bytes of the unmapped block b (all or none);
   return the resulting free block, merged with free neighbours, or MEM_NIL / MEM_ERR. */
static int32_t mem_map_block(MemoryCore *m, int32_t b, int64_t size) {
    int32_t s = m->blocks[b].seg;
    int64_t page = m->segs[s].page, offset = m->blocks[b].addr - m->segs[s].addr;
    int64_t first = offset / page, end = (offset + size + page - 1) / page;
    int64_t nbytes = (end - first) * page;
    if (nbytes == 0 || (!m->limit_before_mapping && nbytes > m->capacity - m->reserved)) return MEM_NIL;
    if (nbytes > INT64_MAX - m->blocks[b].addr) {
        PyErr_SetString(PyExc_OverflowError, "memory model: mapped addresses passed 2^63");
        return MEM_ERR;
    }
    mem_remove_unmapped(m, b);
    if (nbytes < m->blocks[b].size) {
        int32_t rest = mem_new_block(m, m->blocks[b].addr + nbytes, m->blocks[b].size - nbytes, s, 0);
        mem_link_after(m, b, rest);
        mem_add_unmapped(m, rest);
        m->blocks[b].size = nbytes;
    }
    MemBlock *block = &m->blocks[b];
    block->mapped = 1;
    m->mapped_runs += 1 - (block->prev != MEM_NIL && m->blocks[block->prev].mapped)
                        - (block->next != MEM_NIL && m->blocks[block->next].mapped);
    mem_grow_reserved(m, nbytes);
    b = mem_merge_neighbours(m, b);
    mem_add_free(m, b);
    return b;
}

/* unmap_block: unmap the whole pages inside the free block b; partial pages at either end stay free
   and mapped. Return the unmapped block (merged with unmapped neighbours), or MEM_NIL. */
static int32_t mem_unmap_block(MemoryCore *m, int32_t b) {
    int32_t s = m->blocks[b].seg;
    int64_t page = m->segs[s].page, seg_addr = m->segs[s].addr;
    int64_t offset = m->blocks[b].addr - seg_addr;
    int64_t first = (offset + page - 1) / page, end = (offset + m->blocks[b].size) / page;
    if (first >= end) return MEM_NIL;
    mem_remove_free(m, b);
    int64_t start = seg_addr + first * page, nbytes = (end - first) * page;
    int64_t after = m->blocks[b].addr + m->blocks[b].size - (start + nbytes);
    int32_t unmapped;
    if (start > m->blocks[b].addr) {  /* keep the low partial page as the (still free) block */
        m->blocks[b].size = start - m->blocks[b].addr;
        mem_add_free(m, b);
        unmapped = mem_new_block(m, start, nbytes, s, 0);
        mem_link_after(m, b, unmapped);
    } else {
        unmapped = b;
        m->blocks[b].size = nbytes;
        m->blocks[b].mapped = 0;
    }
    if (after) {
        int32_t tail = mem_new_block(m, start + nbytes, after, s, 1);
        mem_link_after(m, unmapped, tail);
        mem_add_free(m, tail);
    }
    m->reserved -= nbytes;
    MemBlock *u = &m->blocks[unmapped];
    m->mapped_runs += (u->prev != MEM_NIL && m->blocks[u->prev].mapped)
                    + (u->next != MEM_NIL && m->blocks[u->next].mapped) - 1;
    unmapped = mem_merge_neighbours(m, unmapped);
    mem_add_unmapped(m, unmapped);
    return unmapped;
}

/* find_expandable_block: the lowest-address run of free and unmapped blocks with `size` bytes, starting
   at an unmapped block or the free block just before it; else a new expandable segment. */
static int32_t mem_find_expandable_block(MemoryCore *m, int pool, int64_t size) {
    int32_t root = m->unmapped_root[pool];
    for (int32_t u = mem_first(m, root); u != MEM_NIL; u = mem_successor(m, 1, root, u)) {
        int32_t start = u, p = m->blocks[u].prev;
        if (p != MEM_NIL && m->blocks[p].owner < 0) start = p;
        int64_t room = 0;
        int32_t b = start;
        while (room < size && b != MEM_NIL && m->blocks[b].owner < 0) {
            room += m->blocks[b].size;
            b = m->blocks[b].next;
        }
        if (room >= size) return start;
    }
    int64_t page = pool == MEM_POOL_SMALL ? MEM_SMALL_BUFFER : MEM_LARGE_BUFFER;
    /* PyTorch reserves address space for 1 1/8 of the device memory. */
    int64_t pages = (m->capacity + m->capacity / 8 + page - 1) / page;
    if (pages * page < size) return MEM_NIL;  /* no fresh segment could hold it either */
    int32_t s = mem_new_segment(m, pages * page, pool, page);
    if (s == MEM_ERR) return MEM_ERR;
    int32_t head = mem_new_block(m, m->segs[s].addr, pages * page, s, 0);
    m->segs[s].head = head;
    mem_add_unmapped(m, head);
    return head;
}

/* try_allocate_expandable_block: map pages for `size` at the run find_expandable_block chose. */
static int32_t mem_try_allocate_expandable_block(MemoryCore *m, int pool, int64_t size) {
    int32_t c = mem_find_expandable_block(m, pool, size);
    if (c < 0) return c;
    if (!m->blocks[c].mapped) {
        int64_t want = m->blocks[c].size < size ? m->blocks[c].size : size;
        c = mem_map_block(m, c, want);
        if (c < 0) return c;
    }
    while (m->blocks[c].size < size) {  /* free and mapped, followed by unmapped space: map more of it */
        int32_t n = m->blocks[c].next;
        if (n == MEM_NIL || m->blocks[n].mapped || m->blocks[n].owner >= 0) return MEM_NIL;  /* cannot happen */
        int64_t want = size - m->blocks[c].size < m->blocks[n].size ? size - m->blocks[c].size : m->blocks[n].size;
        c = mem_map_block(m, n, want);
        if (c < 0) return c;
    }
    mem_remove_free(m, c);
    return c;
}

/* alloc_block: a new segment for `size` (not in the pool yet), MEM_NIL when it exceeds the capacity. */
static int32_t mem_alloc_block(MemoryCore *m, int pool, int64_t size) {
    int64_t alloc_size = mem_allocation_size(size);
    if (m->limit_before_mapping && alloc_size > m->capacity - m->reserved) return MEM_NIL;  /* checked before mapping */
    if (m->expandable) return mem_try_allocate_expandable_block(m, pool, size);
    if (alloc_size > m->capacity - m->reserved) return MEM_NIL;
    int32_t s = mem_new_segment(m, alloc_size, pool, 0);
    if (s == MEM_ERR) return MEM_ERR;
    int32_t head = mem_new_block(m, m->segs[s].addr, alloc_size, s, 1);
    m->segs[s].head = head;
    mem_grow_reserved(m, alloc_size);
    return head;
}

/* release_block of a whole cudaMalloc segment (caching.py _release_segment). */
static void mem_release_segment(MemoryCore *m, int32_t b) {
    mem_remove_free(m, b);
    m->reserved -= m->blocks[b].size;
    mem_drop_segment(m, m->blocks[b].seg);
    mem_drop_block(m, b);
}

/* release_available_cached_blocks (only with a max_split_size): release the smallest cached block of
   at least max(size, max_split_size), else the largest oversize ones until that many bytes are gone. */
static int mem_release_available_cached_blocks(MemoryCore *m, int pool, int64_t size) {
    if (m->max_split == MEM_NO_SPLIT) return 0;
    int64_t target = size > m->max_split ? size : m->max_split;
    int32_t b = mem_lower_bound(m, m->free_root[pool], target);
    if (b != MEM_NIL) {
        mem_release_segment(m, b);
        return 1;
    }
    int64_t released = 0;
    while (released < target && (b = mem_last(m, m->free_root[pool])) != MEM_NIL && m->blocks[b].size >= m->max_split) {
        released += m->blocks[b].size;
        mem_release_segment(m, b);
    }
    return released >= target;
}

/* release_cached_blocks: release every wholly free segment (large pool first, then small); with
   expandable segments unmap the free whole pages and drop a segment left with no mapped page. */
static void mem_release_cached_blocks(MemoryCore *m) {  /* memory_allocate made room */
    for (int pool = MEM_POOL_LARGE; pool >= MEM_POOL_SMALL; pool--) {
        Py_ssize_t n = 0;
        mem_in_order(m, m->free_root[pool], m->scratch, &n);
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t b = m->scratch[i];
            if (m->expandable) {
                int32_t u = mem_unmap_block(m, b);
                if (u != MEM_NIL && m->blocks[u].prev == MEM_NIL && m->blocks[u].next == MEM_NIL) {
                    mem_remove_unmapped(m, u);
                    mem_drop_segment(m, m->blocks[u].seg);
                    mem_drop_block(m, u);
                }
            } else if (m->blocks[b].prev == MEM_NIL && m->blocks[b].next == MEM_NIL) {
                mem_release_segment(m, b);
            }
        }
    }
}

/* ------------------------------------------------------------------ the API */

MEM_API int memory_grow_ids(MemoryCore *m, Py_ssize_t max_block_id) {
    if (max_block_id <= m->max_block_id) return 0;
    if (max_block_id > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "memory model: block ids must be below 2^31 - 1");
        return -1;
    }
    Py_ssize_t cap = m->max_block_id;
    if (mem_grow((void **)&m->owned, &cap, max_block_id, sizeof(int32_t)) < 0) return -1;
    for (Py_ssize_t i = m->max_block_id; i < cap; i++) m->owned[i] = MEM_NIL;
    m->max_block_id = cap;
    return 0;
}

/* CachingModel.__init__ / ByteCountingModel.__init__. */
MEM_API int memory_init(MemoryCore *m, int kind, int64_t capacity, int64_t granularity, int expandable,
                       int64_t max_split, const int32_t *divisions, int limit_before_mapping, int reuse_addresses,
                       Py_ssize_t max_block_id) {
    if (kind != MEM_BYTES && kind != MEM_CACHING) {
        PyErr_Format(PyExc_ValueError, "memory model: kind must be %d (bytes) or %d (caching), got %d",
                     MEM_BYTES, MEM_CACHING, kind);
        return -1;
    }
    if (capacity < 0 || capacity > MEM_MAX_BYTES) {
        PyErr_Format(PyExc_ValueError, "memory model: capacity must be in [0, 2^62] bytes, got %lld",
                     (long long)capacity);
        return -1;
    }
    if (kind == MEM_BYTES && (granularity < 1 || granularity > MEM_MAX_BYTES)) {
        PyErr_Format(PyExc_ValueError, "memory model: granularity must be in [1, 2^62], got %lld", (long long)granularity);
        return -1;
    }
    if (max_split != -1 && max_split <= 0) {
        PyErr_Format(PyExc_ValueError, "memory model: max_split must be -1 (none) or positive, got %lld",
                     (long long)max_split);
        return -1;
    }
    if (expandable && max_split != -1) {
        PyErr_SetString(PyExc_ValueError, "memory model: max_split_size cannot be combined with expandable segments");
        return -1;
    }
    if (max_block_id < 0) {
        PyErr_SetString(PyExc_ValueError, "memory model: max_block_id must be >= 0");
        return -1;
    }
    memset(m, 0, sizeof(*m));
    m->kind = kind;
    m->capacity = capacity;
    m->granularity = kind == MEM_BYTES ? granularity : 1;
    m->expandable = kind == MEM_CACHING && expandable;
    m->max_split = max_split == -1 ? MEM_NO_SPLIT : max_split;
    m->limit_before_mapping = limit_before_mapping != 0;
    m->reuse_addresses = reuse_addresses != 0;
    for (int i = 0; i < MEM_ROUNDUP_INTERVALS; i++) {
        int32_t d = divisions ? divisions[i] : 0;
        if (d < 0 || d > MEM_MAX_DIVISIONS || (d & (d - 1))) {
            PyErr_Format(PyExc_ValueError, "memory model: divisions must be 0 or powers of 2 up to 2^30, got %d", d);
            return -1;
        }
        m->divisions[i] = d;
        if (d > 1) m->rounds_power2 = 1;
    }
    m->block_free = m->seg_free = m->seg_first = m->seg_last = MEM_NIL;
    m->free_root[0] = m->free_root[1] = m->unmapped_root[0] = m->unmapped_root[1] = MEM_NIL;
    m->order_first = m->order_last = MEM_NIL;
    m->rng = 2463534242u;
    if (memory_grow_ids(m, max_block_id) < 0 || mem_reserve(m, 16, 4) < 0) return -1;
    return 0;
}

MEM_API void memory_release(MemoryCore *m) {
    PyMem_Free(m->owned);
    PyMem_Free(m->blocks);
    PyMem_Free(m->segs);
    PyMem_Free(m->released);
    PyMem_Free(m->scratch);
    memset(m, 0, sizeof(*m));
}

MEM_API int memory_holds(const MemoryCore *m, int32_t block_id) {
    return block_id >= 0 && block_id < m->max_block_id && m->owned[block_id] != MEM_NIL;
}

/* caching.py malloc (CachingModel.allocate) / ByteCountingModel.allocate: 1 placed, 0 cannot be
   placed now, -1 error (id out of range or already holding a block, request above 2^62, no memory). */
MEM_API int memory_allocate(MemoryCore *m, int32_t block_id, int64_t size) {
    if (block_id < 0 || block_id >= m->max_block_id) {
        PyErr_Format(PyExc_IndexError, "memory model: block id %d out of range [0, %zd)", block_id, m->max_block_id);
        return -1;
    }
    if (m->owned[block_id] != MEM_NIL) {
        PyErr_Format(PyExc_ValueError, "block %d is already allocated", block_id);
        return -1;
    }
    if (size < 0 || size > MEM_MAX_BYTES) {
        PyErr_Format(PyExc_ValueError, "memory model: request of %lld bytes outside [0, 2^62]", (long long)size);
        return -1;
    }
    /* Room for the worst case, so that nothing fails halfway: a failed expandable attempt leaves at
       most two more cached blocks, and unmapping splits each cached block into up to three. */
    Py_ssize_t cached = m->free_count[0] + m->free_count[1] + 2;
    if (mem_reserve(m, 2 * cached + 16, 4) < 0 ||
        mem_grow((void **)&m->scratch, &m->scratch_cap, cached, sizeof(int32_t)) < 0)
        return -1;
    if (m->kind == MEM_BYTES) {
        int64_t counted = memory_request_bytes(m, size);
        if (counted > m->capacity - m->allocated) return 0;
        int32_t b = mem_new_block(m, 0, counted, MEM_NIL, 1);
        m->blocks[b].requested = size;
        m->blocks[b].owner = block_id;
        m->blocks[b].prev = m->order_last;
        if (m->order_last != MEM_NIL) m->blocks[m->order_last].next = b; else m->order_first = b;
        m->order_last = b;
        m->owned[block_id] = b;
        m->allocated += counted;
        if (m->allocated > m->peak_allocated) m->peak_allocated = m->allocated;
        return 1;
    }
    if (size == 0) {  /* PyTorch returns a null pointer: no block */
        m->owned[block_id] = MEM_ZERO_BYTES;
        return 1;
    }
    int64_t rounded = memory_request_bytes(m, size);
    int pool = rounded <= MEM_SMALL_SIZE ? MEM_POOL_SMALL : MEM_POOL_LARGE;
    int32_t b = mem_get_free_block(m, pool, rounded);
    if (b == MEM_NIL) {
        b = mem_alloc_block(m, pool, rounded);
        if (b == MEM_NIL && mem_release_available_cached_blocks(m, pool, rounded)) b = mem_alloc_block(m, pool, rounded);
        if (b == MEM_NIL) {
            mem_release_cached_blocks(m);
            b = mem_alloc_block(m, pool, rounded);
        }
        if (b == MEM_ERR) return -1;
        if (b == MEM_NIL) return 0;
    }
    mem_alloc_found_block(m, b, pool, rounded, size, block_id);
    return 1;
}

/* free_block (CachingModel.free) / ByteCountingModel.free; an id holding no block is ignored. */
MEM_API void memory_free(MemoryCore *m, int32_t block_id) {
    if (!memory_holds(m, block_id)) return;
    int32_t b = m->owned[block_id];
    m->owned[block_id] = MEM_NIL;
    if (b == MEM_ZERO_BYTES) return;
    MemBlock *block = &m->blocks[b];
    m->allocated -= block->size;
    if (m->kind == MEM_BYTES) {
        if (block->prev != MEM_NIL) m->blocks[block->prev].next = block->next; else m->order_first = block->next;
        if (block->next != MEM_NIL) m->blocks[block->next].prev = block->prev; else m->order_last = block->prev;
        mem_drop_block(m, b);
        return;
    }
    block->owner = -1;
    block->requested = 0;
    mem_add_free(m, mem_merge_neighbours(m, b));
}

/* CachingModel.stats / ByteCountingModel.stats; O(log n): the largest free block is a tree maximum. */
MEM_API void memory_stats(const MemoryCore *m, MemStats *out) {
    out->allocated = m->allocated;
    out->peak_allocated = m->peak_allocated;
    if (m->kind == MEM_BYTES) {
        out->reserved = m->allocated;
        out->peak_reserved = m->peak_allocated;
        out->largest_free_block = 0;
        out->segments = m->allocated ? 1 : 0;
        return;
    }
    out->reserved = m->reserved;
    out->peak_reserved = m->peak_reserved;
    int64_t largest = 0;
    for (int pool = 0; pool < 2; pool++) {
        int32_t b = mem_last(m, m->free_root[pool]);
        if (b != MEM_NIL && m->blocks[b].size > largest) largest = m->blocks[b].size;
    }
    out->largest_free_block = largest;
    out->segments = m->expandable ? m->mapped_runs : m->n_segments;
}

/* CachingModel.block_of: 1 and the block, 0 for a 0-byte request, -1 when the id holds none. */
MEM_API int memory_block_of(const MemoryCore *m, int32_t block_id, int64_t *address, int64_t *size, int64_t *requested) {
    if (!memory_holds(m, block_id)) return -1;
    int32_t b = m->owned[block_id];
    if (b == MEM_ZERO_BYTES || !m->blocks[b].size) return 0;
    if (m->kind == MEM_BYTES) {  /* its address in the packed layout (a walk: for tests, not hot paths) */
        int64_t at = 0;
        for (int32_t o = m->order_first; o != b; o = m->blocks[o].next) at += m->blocks[o].size;
        *address = at;
    } else {
        *address = m->blocks[b].addr;
    }
    *size = m->blocks[b].size;
    *requested = m->blocks[b].requested;
    return 1;
}

static int mem_layout_room(MemLayout *l, Py_ssize_t segments, Py_ssize_t blocks) {
    if (segments + 1 > l->seg_cap) {
        Py_ssize_t cap = l->seg_cap;
        if (mem_grow((void **)&l->seg_first, &cap, segments + 1, sizeof(Py_ssize_t)) < 0) return -1;
        cap = l->seg_cap;
        if (mem_grow((void **)&l->seg_address, &cap, segments + 1, sizeof(int64_t)) < 0) return -1;
        cap = l->seg_cap;
        if (mem_grow((void **)&l->seg_size, &cap, segments + 1, sizeof(int64_t)) < 0) return -1;
        cap = l->seg_cap;
        if (mem_grow((void **)&l->seg_pool, &cap, segments + 1, sizeof(int8_t)) < 0) return -1;
        l->seg_cap = cap;
    }
    if (blocks > l->block_cap) {
        Py_ssize_t cap = l->block_cap;
        if (mem_grow((void **)&l->block_address, &cap, blocks, sizeof(int64_t)) < 0) return -1;
        cap = l->block_cap;
        if (mem_grow((void **)&l->block_size, &cap, blocks, sizeof(int64_t)) < 0) return -1;
        cap = l->block_cap;
        if (mem_grow((void **)&l->block_requested, &cap, blocks, sizeof(int64_t)) < 0) return -1;
        cap = l->block_cap;
        if (mem_grow((void **)&l->block_owner, &cap, blocks, sizeof(int32_t)) < 0) return -1;
        l->block_cap = cap;
    }
    return 0;
}

static void mem_layout_block(MemLayout *l, const MemBlock *b) {
    Py_ssize_t i = l->n_blocks++;
    l->block_address[i] = b->addr;
    l->block_size[i] = b->size;
    l->block_requested[i] = b->requested;
    l->block_owner[i] = b->owner;
}

static void mem_layout_segment(MemLayout *l, Py_ssize_t first, int pool) {
    Py_ssize_t i = l->n_segments++, last = l->n_blocks - 1;
    l->seg_first[i] = first;
    l->seg_address[i] = l->block_address[first];
    l->seg_size[i] = l->block_address[last] + l->block_size[last] - l->block_address[first];
    l->seg_pool[i] = (int8_t)pool;
    l->seg_first[i + 1] = l->n_blocks;
}

/* CachingModel.layout / ByteCountingModel.layout: segments in address order, one per mapped run of an
   expandable segment (as torch.cuda.memory_snapshot()); byte counting packs the blocks from 0. */
MEM_API int memory_layout(const MemoryCore *m, MemLayout *out) {
    out->n_segments = out->n_blocks = 0;
    if (mem_layout_room(out, m->kind == MEM_BYTES ? 1 : m->n_segments + m->mapped_runs, m->block_live) < 0) return -1;
    if (out->seg_first) out->seg_first[0] = 0;
    if (m->kind == MEM_BYTES) {
        int64_t at = 0;
        for (int32_t b = m->order_first; b != MEM_NIL; b = m->blocks[b].next) {
            if (!m->blocks[b].size) continue;  /* a 0-byte block occupies no address */
            MemBlock placed = m->blocks[b];
            placed.addr = at;
            at += placed.size;
            mem_layout_block(out, &placed);
        }
        if (out->n_blocks) mem_layout_segment(out, 0, MEM_POOL_FLAT);
        return 0;
    }
    for (int32_t s = m->seg_first; s != MEM_NIL; s = m->segs[s].next) {
        Py_ssize_t run = -1;  /* first layout block of the current mapped run */
        for (int32_t b = m->segs[s].head; b != MEM_NIL; b = m->blocks[b].next) {
            const MemBlock *block = &m->blocks[b];
            if (block->mapped) {
                if (run < 0) run = out->n_blocks;
                mem_layout_block(out, block);
            }
            if (run >= 0 && (!block->mapped || block->next == MEM_NIL)) {
                mem_layout_segment(out, run, m->segs[s].pool);
                run = -1;
            }
        }
    }
    return 0;
}

MEM_API void memory_layout_release(MemLayout *l) {
    PyMem_Free(l->seg_first); PyMem_Free(l->seg_address); PyMem_Free(l->seg_size); PyMem_Free(l->seg_pool);
    PyMem_Free(l->block_address); PyMem_Free(l->block_size); PyMem_Free(l->block_requested);
    PyMem_Free(l->block_owner);
    memset(l, 0, sizeof(*l));
}

#endif /* DTRLAB_MEMORY_CORE_H */

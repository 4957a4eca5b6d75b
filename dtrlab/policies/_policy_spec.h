/*
 * The eviction policy the compiled core runs, as decoded from the spec tuple that a
 * policy's core_spec() builds (dtrlab/policies/core_spec.py). Included by the replay core
 * (dtrlab/runtime/_core.c) before its Sim struct; the policy code itself is in _policy_core.h.
 */
#ifndef DTRLAB_POLICY_SPEC_H
#define DTRLAB_POLICY_SPEC_H
#include <Python.h>
#include <stdint.h>
#include "_memory_core.h"

/* Policy codes, as core_spec.py's P_* codes: simrd's built-ins, then
 * the score formula (score family, score_search, ablations), twophase, and the
 * address-aware coop and dtr_fit (policies/coop.py; under a memory model only). */
enum { P_DTR, P_DTR_EQ_CLASS, P_DTR_LOCAL, P_MSPS, P_LRU, P_LARGEST_STORAGE, P_RANDOM, P_FORMULA, P_TWOPHASE,
       P_COOP, P_DTR_FIT, P_COUNT };
/* The compute a formula charges an eviction (ablations.py's cost_function; core_spec.py's COST_CODES). */
enum { COST_ESTAR, COST_EQCLASS, COST_LOCAL, COST_ONE, COST_COUNT };

/* One score policy. P_FORMULA is
 *     cost^a / ([size^b] x [(staleness + stale_offset)^c]) x (1 + evicted neighbours)^d,
 * the bracketed factors present when use_size / use_stale, the neighbour factor when has_d;
 * without size and staleness the score is the bare integer cost (an ablation). */
typedef struct {
    int code;
    PyObject *randrange; /* P_RANDOM: the bound randrange of the policy's seeded random.Random (borrowed) */
    int cost, use_size, use_stale, floating, tie_by_id, has_d; /* cost: also coop's */
    int64_t a, b, c;     /* exact arithmetic: the integer exponents */
    double fa, fb, fc;   /* float64: the exponents */
    int offset_is_float; /* stale_offset a float (the staleness factor is then a float) */
    int64_t offset;
    double foffset;
    int d_is_float;
    int64_t d;
    double fd;
    /* The parameters as Python objects (borrowed from the spec tuple), for the scores whose
     * integers outgrow 128 bits: those are computed by Python's own arithmetic. */
    PyObject *a_obj, *b_obj, *c_obj, *offset_obj, *d_obj;
} ScoreSpec;

typedef struct {
    int twophase;         /* phase[0] among the candidates with no evicted neighbour, else phase[1] */
    ScoreSpec phase[2];   /* phase[0] alone unless twophase */
    int32_t *isolated;    /* twophase's scratch: the candidates with no evicted neighbour */
    uint32_t *seen;       /* stamps for counting distinct evicted neighbours, NULL until needed */
    uint32_t generation;
    /* coop and dtr_fit's scratch, allocated by the spec parse */
    MemLayout layout;
    uint8_t *evictable;   /* per storage: among this call's candidates */
    int64_t *run;         /* dtr_fit: per storage, the free run its eviction opens (-1: holds no block) */
    uint8_t *run_fits;    /* dtr_fit: that run holds the request, in the request's pool */
    double *block_cost;   /* coop: per layout block, its cost (0 free); NaN: breaks a window */
    double *partials;     /* coop: math.fsum's partial sums */
    Py_ssize_t cost_cap;  /* capacity of block_cost and partials */
    PyObject *odd_score;  /* a score that is not a float (complex), handed from the scorer to the chooser */
} PolicySpec;

#endif

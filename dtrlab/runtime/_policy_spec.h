/*
 * The eviction policy the compiled core runs, as decoded from the spec tuple that
 * dtrlab/runtime/compiled_policies.py builds (policy_spec). Included by _core.c
 * before the Sim struct; the policy code itself is in _policy_core.h.
 */
#ifndef DTRLAB_POLICY_SPEC_H
#define DTRLAB_POLICY_SPEC_H
#include <Python.h>
#include <stdint.h>

/* Policy codes, in the order of compiled_policies.py's codes. */
enum { P_DTR, P_DTR_EQ_CLASS, P_DTR_LOCAL, P_MSPS, P_LRU, P_LARGEST_STORAGE, P_RANDOM, P_COUNT };

typedef struct {
    int code;
    PyObject *randrange; /* P_RANDOM: the bound randrange of the policy's seeded random.Random (borrowed) */
    uint32_t *seen;      /* per-run scratch of the policy code, NULL until needed */
    uint32_t generation;
} PolicySpec;

#endif

/*
 * The compiled core's eviction policies: scores and the choice among candidates,
 * decision for decision like dtrlab/policies (see _policy_spec.h for the spec).
 * Included by _core.c after the Sim struct and the pool and equivalence-class helpers.
 */
#define EXACT_LIMIT ((int64_t)1 << 53)

/* Python's int / int, correctly rounded: a double division is exact-rounded when both
 * operands are integers below 2^53; otherwise let Python's long division do it. */
static int true_divide(int64_t numerator, __int128 denominator, double *out) {
    if (numerator > -EXACT_LIMIT && numerator < EXACT_LIMIT && denominator < EXACT_LIMIT) {
        *out = (double)numerator / (double)(int64_t)denominator;
        return 0;
    }
    PyObject *num = PyLong_FromLongLong(numerator);
    PyObject *high = PyLong_FromUnsignedLongLong((unsigned long long)(denominator >> 62));
    PyObject *low = PyLong_FromLongLong((int64_t)(denominator & (((__int128)1 << 62) - 1)));
    PyObject *shift = PyLong_FromLong(62);
    PyObject *shifted = high && shift ? PyNumber_Lshift(high, shift) : NULL;
    PyObject *den = shifted && low ? PyNumber_Or(shifted, low) : NULL;
    PyObject *quotient = num && den ? PyNumber_TrueDivide(num, den) : NULL;
    Py_XDECREF(num); Py_XDECREF(high); Py_XDECREF(low); Py_XDECREF(shift); Py_XDECREF(shifted); Py_XDECREF(den);
    if (!quotient) return -1;
    *out = PyFloat_AsDouble(quotient);
    Py_DECREF(quotient);
    return 0;
}

/* numerator / (size x staleness), or inf when that is not positive (the DTR family). */
static int staleness_score(Sim *sim, int32_t s, int64_t numerator, double *out) {
    int64_t size = sim->size[s];
    if (sim->last_access[s] == NEVER) { /* staleness inf: size x inf is inf, or nan when size is 0 */
        *out = size > 0 ? (double)numerator / INFINITY : INFINITY;
        return 0;
    }
    __int128 denominator = (__int128)size * (__int128)(sim->clock - sim->last_access[s]);
    if (denominator <= 0) { *out = INFINITY; return 0; }
    return true_divide(numerator, denominator, out);
}

static int score(Sim *sim, int32_t s, double *out) {
    switch (sim->policy.code) {
    case P_DTR:
        return staleness_score(sim, s, sim->compute_cost[s] + sim->region_compute[s] + sim->region_rev_compute[s], out);
    case P_DTR_EQ_CLASS:
        return staleness_score(sim, s, eq_class_compute(sim, s), out);
    case P_DTR_LOCAL:
        return staleness_score(sim, s, sim->compute_cost[s], out);
    case P_MSPS:
        if (sim->size[s] <= 0) { *out = INFINITY; return 0; }
        return true_divide(sim->compute_cost[s] + sim->region_rev_compute[s], sim->size[s], out);
    case P_LARGEST_STORAGE:
        if (sim->size[s] <= 0) { *out = INFINITY; return 0; }
        return true_divide(1, sim->size[s], out);
    }
    PyErr_SetString(PyExc_SystemError, "unknown policy code");
    return -1;
}

/* Choose storages to evict among cand[0..n) (pool order; withheld and excluded storages already removed).
   Append the chosen storage ids to *out (at least one when n > 0; none when n == 0).
   Return 0, or -1 with a Python error set. */
static int policy_choose(Sim *sim, const int32_t *cand, Py_ssize_t n, IntVec *out) {
    if (n == 0) return 0;
    Py_ssize_t best = -1;
    if (sim->policy.code == P_RANDOM) { /* ordered[randrange(0, len(ordered))], the same generator calls */
        PyObject *drawn = PyObject_CallFunction(sim->policy.randrange, "in", 0, n);
        if (!drawn) return -1;
        best = PyLong_AsSsize_t(drawn);
        Py_DECREF(drawn);
        if (best == -1 && PyErr_Occurred()) return -1;
        if (best < 0 || best >= n) {
            PyErr_SetString(PyExc_IndexError, "randrange drew an index out of range");
            return -1;
        }
    } else if (sim->policy.code == P_LRU) { /* the score is the last access, compared as integers */
        int64_t best_score = INT64_MAX;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t value = sim->last_access[cand[i]];
            if (best < 0 || value <= best_score) {
                best_score = value;
                best = i;
            }
            if (value == 0) break;
        }
    } else { /* the last candidate with the minimal score, stopping at a score of 0 (simrd's scan) */
        double best_score = INFINITY;
        for (Py_ssize_t i = 0; i < n; i++) {
            double value;
            if (score(sim, cand[i], &value) < 0) return -1;
            if (value <= best_score) {
                best_score = value;
                best = i;
            }
            if (value == 0) break;
        }
    }
    if (best < 0) { /* only NaN scores: the reference would evict None */
        PyErr_SetString(PyExc_TypeError, "the policy scored no candidate (every score is NaN)");
        return -1;
    }
    return vec_push(out, cand[best]);
}

/* Decode the spec tuple (code, randrange) of compiled_policies.policy_spec; the tuple
   outlives the replay, so the references stay borrowed. */
static int policy_spec_parse(PyObject *obj, PolicySpec *spec) {
    PyObject *randrange;
    if (!PyArg_ParseTuple(obj, "iO;policy spec", &spec->code, &randrange)) return -1;
    if (spec->code < 0 || spec->code >= P_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown policy code %d", spec->code);
        return -1;
    }
    if (spec->code == P_RANDOM && !PyCallable_Check(randrange)) {
        PyErr_SetString(PyExc_TypeError, "the random policy needs a randrange callable");
        return -1;
    }
    spec->randrange = randrange;
    return 0;
}

/* What the runtime must maintain for the policy. */
static int policy_tracks_regions(const PolicySpec *spec) { return spec->code == P_DTR || spec->code == P_MSPS; }
static int policy_tracks_eq(const PolicySpec *spec) { return spec->code == P_DTR_EQ_CLASS; }

/* Free what the policy code allocated during a run. */
static void policy_spec_release(PolicySpec *spec) { PyMem_Free(spec->seen); spec->seen = NULL; }

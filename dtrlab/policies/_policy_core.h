/*
 * The compiled core's eviction policies: scores and the choice among candidates,
 * decision for decision like dtrlab/policies (see _policy_spec.h for the spec).
 * Included by the replay core (dtrlab/runtime/_core.c) after its Sim struct and its pool and
 * equivalence-class helpers: the state a policy reads, as the Python policies read the Simulator's.
 *
 * Every score is computed as Python computes it: exact int / int divisions rounded
 * once, floats through C's pow() with CPython's float ** special cases. Where a value
 * leaves what C can prove exact (integers past 2^53 or 128 bits, a pow() that overflows
 * or underflows), the score is computed by Python's own arithmetic on the same values,
 * which also raises Python's errors (OverflowError) where the reference raises them.
 */
#include <float.h>

#define EXACT_LIMIT ((int64_t)1 << 53)

/* An __int128 as a Python int. */
static PyObject *long_from_i128(__int128 value) {
    PyObject *high = PyLong_FromLongLong((long long)(value >> 64));
    PyObject *low = PyLong_FromUnsignedLongLong((unsigned long long)value);
    PyObject *shift = PyLong_FromLong(64);
    PyObject *shifted = high && shift ? PyNumber_Lshift(high, shift) : NULL;
    PyObject *result = shifted && low ? PyNumber_Add(shifted, low) : NULL;
    Py_XDECREF(high); Py_XDECREF(low); Py_XDECREF(shift); Py_XDECREF(shifted);
    return result;
}

/* A Python float (or int) result as a double; steals the reference. */
static int take_double(PyObject *value, double *out) {
    if (!value) return -1;
    *out = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* Python's int / int, correctly rounded: a double division is exact-rounded when both
 * operands are integers below 2^53; otherwise let Python's long division do it. */
static int true_divide(__int128 numerator, __int128 denominator, double *out) {
    if (numerator > -EXACT_LIMIT && numerator < EXACT_LIMIT && denominator > -EXACT_LIMIT &&
        denominator < EXACT_LIMIT) {
        *out = (double)(int64_t)numerator / (double)(int64_t)denominator;
        return 0;
    }
    PyObject *num = long_from_i128(numerator), *den = num ? long_from_i128(denominator) : NULL;
    PyObject *quotient = den ? PyNumber_TrueDivide(num, den) : NULL;
    Py_XDECREF(num); Py_XDECREF(den);
    return take_double(quotient, out);
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

/* ------------------------------------------------------------ formulas */
static int64_t cost_of(Sim *sim, int cost, int32_t s) {
    switch (cost) {
    case COST_ESTAR: return sim->compute_cost[s] + sim->region_compute[s] + sim->region_rev_compute[s];
    case COST_EQCLASS: return eq_class_compute(sim, s);
    case COST_LOCAL: return sim->compute_cost[s];
    }
    return 1;
}

/* Distinct evicted storages adjacent to s (Simulator.evicted_neighbours; s itself is resident). */
static int evicted_neighbour_count(Sim *sim, int32_t s, int64_t *count) {
    PolicySpec *spec = &sim->policy;
    if (!spec->seen && !(spec->seen = PyMem_Calloc(sim->tr->n ? sim->tr->n : 1, sizeof(uint32_t)))) {
        PyErr_NoMemory();
        return -1;
    }
    if (++spec->generation == 0) {
        memset(spec->seen, 0, (sim->tr->n ? sim->tr->n : 1) * sizeof(uint32_t));
        spec->generation = 1;
    }
    int64_t found = 0;
    for (int dir = 0; dir < 2; dir++) {
        const IntVec *edges = &sim->regions.edges[dir][s];
        for (Py_ssize_t i = 0; i < edges->len; i++) {
            int32_t u = edges->items[i];
            if (!sim->material[u] && spec->seen[u] != spec->generation) {
                spec->seen[u] = spec->generation;
                found++;
            }
        }
    }
    *count = found;
    return 0;
}

static int has_evicted_neighbour(Sim *sim, int32_t s) {
    for (int dir = 0; dir < 2; dir++) {
        const IntVec *edges = &sim->regions.edges[dir][s];
        for (Py_ssize_t i = 0; i < edges->len; i++)
            if (!sim->material[edges->items[i]]) return 1;
    }
    return 0;
}

/* base ** exponent for integers, or 1 when the result reaches 2^120 (then Python computes it). */
static int int_power(__int128 base, int64_t exponent, __int128 *out) {
    const __int128 limit = (__int128)1 << 120;
    __int128 result = 1;
    if (base == 0 || base == 1) { *out = exponent == 0 ? 1 : base; return 0; }
    for (int64_t i = 0; i < exponent; i++) /* |base| >= 2: at most 120 rounds before the limit */
        if (__builtin_mul_overflow(result, base, &result) || result >= limit || result <= -limit) return 1;
    *out = result;
    return 0;
}

/* pow()'s answers by (base, exponent), direct-mapped: a sweep raises the same sizes, costs and stalenesses to
 * the same few exponents millions of times (perf: pow() was 39% of the shipped recompute's CPU). A pure
 * function memoised, so every answer is pow()'s own. Zeroed slots never match: base 0 returns before the lookup.
 * No lock: the core holds the GIL throughout and calls no Python between the lookup and the store. */
typedef struct {
    double base, exponent, result;
} PowMemo;
static PowMemo pow_memo[4096];

/* Python's float ** for a base >= 0 (or inf) and a finite exponent >= 0 (what the spec admits):
 * CPython's special cases, then pow(); 1 when Python would raise or the result is subnormal or 0
 * through pow() (errno cases), so that Python computes it. */
static int float_power(double base, double exponent, double *out) {
    if (exponent == 0) { *out = 1.0; return 0; }
    if (base < 0) return 1; /* a negative base (an eq-class cost can be one): Python's rules, even complex */
    if (isnan(base)) { *out = base; return 0; }
    if (isinf(base)) { *out = INFINITY; return 0; }
    if (base == 0) { *out = 0.0; return 0; }
    if (base == 1) { *out = 1.0; return 0; }
    double result;
    if (exponent == 1.0) {
        result = base; /* x ** 1.0 is x: pow() errs by under 0.52 ULP (glibc) and x is a double, so it returns x */
    } else {
        uint64_t bits[2];
        memcpy(&bits[0], &base, sizeof base);
        memcpy(&bits[1], &exponent, sizeof exponent);
        PowMemo *slot = &pow_memo[((bits[0] ^ (bits[1] * 0x9E3779B97F4A7C15u)) * 0x9E3779B97F4A7C15u) >> 52];
        if (slot->base != base || slot->exponent != exponent) {
            slot->base = base;
            slot->exponent = exponent;
            slot->result = pow(base, exponent);
        }
        result = slot->result;
    }
    if (isinf(result) || result < DBL_MIN) return 1;
    *out = result;
    return 0;
}

/* The staleness plus offset, as Python forms it: an int, or a float when the offset is a
 * float or the storage was never accessed (clock - (-inf)). */
typedef struct {
    int is_float;
    __int128 value;
    double fvalue;
} Staleness;

static Staleness staleness_of(Sim *sim, const ScoreSpec *p, int32_t s) {
    Staleness st = {0, 0, 0.0};
    if (sim->last_access[s] == NEVER) {
        st.is_float = 1;
        st.fvalue = INFINITY;
    } else if (p->offset_is_float) {
        st.is_float = 1;
        st.fvalue = (double)(sim->clock - sim->last_access[s]) + p->foffset;
    } else {
        st.value = (__int128)(sim->clock - sim->last_access[s]) + p->offset;
    }
    return st;
}

/* The formula by Python's own arithmetic on the same values (the rare large cases). 2 when the
 * score is not a float (complex): then sim->policy.odd_score holds it, for Python to compare. */
static int formula_score_python(Sim *sim, const ScoreSpec *p, int32_t s, int64_t cost, double *out) {
    PyObject *num = NULL, *size = NULL, *stale = NULL, *den = NULL, *zero = NULL, *result = NULL, *tmp;
    int status = -1;
    if (!(num = PyLong_FromLongLong(cost)) || !(size = PyLong_FromLongLong(sim->size[s]))) goto done;
    if (sim->last_access[s] == NEVER) stale = PyFloat_FromDouble(INFINITY);
    else stale = PyLong_FromLongLong(sim->clock - sim->last_access[s]);
    if (!stale) goto done;
    if (!p->floating && !p->use_size && !p->use_stale) { /* never reached: integer scores stay integers */
        PyErr_SetString(PyExc_SystemError, "an integer score has no Python fallback");
        goto done;
    }
    tmp = PyNumber_Add(stale, p->offset_obj);
    Py_SETREF(stale, tmp);
    if (!stale) goto done;
    if (p->floating) { /* float(size) ** b * float(staleness + offset) ** c; float(cost) ** a */
        if (!(tmp = PyNumber_Float(size))) goto done;
        Py_SETREF(size, tmp);
        if (!(tmp = PyNumber_Float(stale))) goto done;
        Py_SETREF(stale, tmp);
        if (!(tmp = PyNumber_Float(num))) goto done;
        Py_SETREF(num, tmp);
    }
    if (!(tmp = PyNumber_Power(num, p->a_obj, Py_None))) goto done;
    Py_SETREF(num, tmp);
    if (p->use_size && !(den = PyNumber_Power(size, p->b_obj, Py_None))) goto done;
    if (p->use_stale) {
        if (!(tmp = PyNumber_Power(stale, p->c_obj, Py_None))) goto done;
        if (den) {
            PyObject *product = PyNumber_Multiply(den, tmp);
            Py_DECREF(tmp);
            Py_SETREF(den, product);
            if (!den) goto done;
        } else {
            den = tmp;
        }
    }
    if (!(zero = PyLong_FromLong(0))) goto done;
    int positive = PyObject_RichCompareBool(den, zero, Py_GT);
    if (positive < 0) goto done;
    result = positive ? PyNumber_TrueDivide(num, den) : PyFloat_FromDouble(INFINITY);
    if (!result) goto done;
    if (p->has_d) { /* score * (1 + n) ** d */
        int64_t n;
        PyObject *base = NULL, *factor = NULL;
        if (evicted_neighbour_count(sim, s, &n) < 0) goto done;
        if ((base = PyLong_FromLongLong(n + 1))) factor = PyNumber_Power(base, p->d_obj, Py_None);
        Py_XDECREF(base);
        if (!factor) goto done;
        tmp = PyNumber_Multiply(result, factor);
        Py_DECREF(factor);
        Py_SETREF(result, tmp);
        if (!result) goto done;
    }
    if (!PyFloat_Check(result)) { /* complex: a negative cost to a fractional power */
        sim->policy.odd_score = result;
        result = NULL;
        status = 2;
        goto done;
    }
    status = take_double(result, out);
    result = NULL;
done:
    Py_XDECREF(num); Py_XDECREF(size); Py_XDECREF(stale); Py_XDECREF(den); Py_XDECREF(zero); Py_XDECREF(result);
    return status;
}

/* The formula's score in C, or 1 when it needs Python's arithmetic. */
static int formula_score_c(Sim *sim, const ScoreSpec *p, int32_t s, int64_t cost, double *out) {
    double score;
    Staleness st = staleness_of(sim, p, s);
    if (p->floating) {
        double size_factor = 1.0, stale_factor = 1.0, numerator, stale = st.fvalue;
        int have_size = p->use_size, have_stale = p->use_stale;
        if (!st.is_float) {
            if (st.value >= EXACT_LIMIT) return 1; /* float(int) past 2^53: Python rounds it */
            stale = (double)(int64_t)st.value;
        }
        if (have_size && float_power((double)sim->size[s], p->fb, &size_factor)) return 1;
        if (have_stale && float_power(stale, p->fc, &stale_factor)) return 1;
        double den = have_size && have_stale ? size_factor * stale_factor : have_size ? size_factor : stale_factor;
        if (!(den > 0)) {
            score = INFINITY;
        } else {
            if (float_power((double)cost, p->fa, &numerator)) return 1;
            score = numerator / den;
        }
    } else {
        __int128 numerator, size_factor = 1;
        if (int_power(cost, p->a, &numerator) || numerator >= EXACT_LIMIT || numerator <= -EXACT_LIMIT) return 1;
        if (p->use_size && int_power(sim->size[s], p->b, &size_factor)) return 1;
        if (p->use_stale && st.is_float) { /* int * float: the integer rounds to a float first */
            double stale_factor, den;
            if (float_power(st.fvalue, (double)p->c, &stale_factor)) return 1;
            if (size_factor >= EXACT_LIMIT) return 1;
            den = p->use_size ? (double)(int64_t)size_factor * stale_factor : stale_factor;
            score = den > 0 ? (double)(int64_t)numerator / den : INFINITY;
        } else {
            __int128 den = size_factor, stale_factor;
            if (p->use_stale) {
                if (int_power(st.value, p->c, &stale_factor)) return 1;
                if (__builtin_mul_overflow(den, stale_factor, &den)) return 1;
            }
            if (den <= 0) score = INFINITY;
            else if (true_divide(numerator, den, &score) < 0) return -1;
        }
    }
    if (p->has_d) {
        int64_t n;
        double factor;
        if (evicted_neighbour_count(sim, s, &n) < 0) return -1;
        if (p->d_is_float) {
            if (float_power((double)(n + 1), p->fd, &factor)) return 1;
        } else {
            __int128 power;
            if (int_power(n + 1, p->d, &power) || power >= EXACT_LIMIT) return 1;
            factor = (double)(int64_t)power;
        }
        score *= factor;
    }
    *out = score;
    return 0;
}

static int formula_score(Sim *sim, const ScoreSpec *p, int32_t s, double *out) {
    int64_t cost = cost_of(sim, p->cost, s);
    int status = formula_score_c(sim, p, s, cost, out);
    return status == 1 ? formula_score_python(sim, p, s, cost, out) : status;
}


/* ------------------------------------------------ address-aware policies */
/* coop and dtr_fit (policies/coop.py) read the memory model's layout and the request. */

/* math.fsum of xs[0..n) (costs >= 0 or inf): the exactly rounded sum, by Shewchuk's
 * non-overlapping partials, then the round-half-even correction of the last two. An inf
 * resets the partials, as CPython's fsum does, so finite sums after it cannot overflow. */
static int exact_sum(const double *xs, Py_ssize_t n, double *partials, double *out) {
    Py_ssize_t count = 0;
    double special = 0.0;
    for (Py_ssize_t k = 0; k < n; k++) {
        double x = xs[k];
        if (!isfinite(x)) { special += x; count = 0; continue; }
        Py_ssize_t kept = 0;
        for (Py_ssize_t j = 0; j < count; j++) {
            double y = partials[j];
            if (fabs(x) < fabs(y)) { double swap = x; x = y; y = swap; }
            double high = x + y, low = y - (high - x);
            if (low != 0.0) partials[kept++] = low;
            x = high;
        }
        if (!isfinite(x)) {
            PyErr_SetString(PyExc_OverflowError, "intermediate overflow in fsum");
            return -1;
        }
        if (x != 0.0) partials[kept++] = x;
        count = kept;
    }
    if (special != 0.0) { *out = special; return 0; } /* inf (costs are never -inf or nan) */
    double high = 0.0, low = 0.0;
    if (count > 0) {
        high = partials[--count];
        while (count > 0) { /* add down from the largest until the sum is inexact */
            double x = high, y = partials[--count];
            high = x + y;
            low = y - (high - x);
            if (low != 0.0) break;
        }
        /* Half-way case: round toward the next partial's sign, as a sticky bit would. */
        if (count > 0 && ((low < 0 && partials[count - 1] < 0) || (low > 0 && partials[count - 1] > 0))) {
            double twice = low * 2, x = high + twice;
            if (twice == x - high) high = x;
        }
    }
    *out = high;
    return 0;
}

/* Coop.cost_of: the cost over the staleness, inf at staleness 0. */
static int coop_cost(Sim *sim, int cost, int32_t s, double *out) {
    int64_t numerator = cost_of(sim, cost, s);
    if (sim->last_access[s] == NEVER) { *out = (double)numerator / INFINITY; return 0; }
    int64_t stale = sim->clock - sim->last_access[s];
    if (stale <= 0) { *out = INFINITY; return 0; }
    return true_divide(numerator, stale, out);
}

/* The layout and room for one value per layout block. */
static int address_layout(Sim *sim) {
    PolicySpec *spec = &sim->policy;
    if (!sim->has_model) {
        PyErr_SetString(PyExc_ValueError, "an address-aware policy needs an address-aware memory model");
        return -1;
    }
    if (memory_layout(&sim->model, &spec->layout) < 0) return -1;
    Py_ssize_t need = spec->layout.n_blocks + 1;
    if (need > spec->cost_cap) {
        double *costs = PyMem_Realloc(spec->block_cost, need * sizeof(double));
        if (costs) spec->block_cost = costs;
        double *partials = PyMem_Realloc(spec->partials, need * sizeof(double));
        if (partials) spec->partials = partials;
        if (!costs || !partials) { PyErr_NoMemory(); return -1; }
        spec->cost_cap = need;
    }
    return 0;
}

/* The request's pool under the caching model (request_pool), or -1: any segment. */
static int request_pool_of(Sim *sim, int64_t size) {
    return sim->model.kind == MEM_CACHING ? memory_block_pool(&sim->model, size) : -1;
}

/* _cheapest_window over blocks [first, last) of the layout: the least fsum of costs over a run of
 * unbroken blocks with >= need bytes holding at least one block; the lowest address wins a tie. */
static int cheapest_window(Sim *sim, Py_ssize_t first, Py_ssize_t last, int64_t need, int *found, double *best,
                           Py_ssize_t *best_first, Py_ssize_t *best_last) {
    PolicySpec *spec = &sim->policy;
    const MemLayout *l = &spec->layout;
    const double *costs = spec->block_cost;
    Py_ssize_t start = first;
    int64_t span = 0;
    *found = 0;
    for (Py_ssize_t end = first; end < last; end++) {
        if (isnan(costs[end])) { start = end + 1; span = 0; continue; }
        span += l->block_size[end];
        while (start < end && span - l->block_size[start] >= need) span -= l->block_size[start++];
        if (span < need) continue;
        int holds = 0;
        for (Py_ssize_t i = start; i <= end && !holds; i++) holds = l->block_owner[i] >= 0;
        if (!holds) continue;
        double cost;
        if (exact_sum(costs + start, end + 1 - start, spec->partials, &cost) < 0) return -1;
        if (!*found || cost < *best) {
            *found = 1;
            *best = cost;
            *best_first = start;
            *best_last = end;
        }
    }
    return 0;
}

/* Coop.choose */
static int coop_choose(Sim *sim, const ScoreSpec *p, const int32_t *cand, Py_ssize_t n, IntVec *out) {
    PolicySpec *spec = &sim->policy;
    if (address_layout(sim) < 0) return -1;
    const MemLayout *l = &spec->layout;
    int64_t size = sim->request.block_size, need = memory_request_bytes(&sim->model, size);
    int pool = request_pool_of(sim, size), status = 0;
    for (Py_ssize_t i = 0; i < n; i++) spec->evictable[cand[i]] = 1;
    for (Py_ssize_t b = 0; b < l->n_blocks && !status; b++) {
        int32_t owner = l->block_owner[b];
        if (owner < 0) spec->block_cost[b] = 0.0;
        else if (owner < sim->tr->n && spec->evictable[owner]) status = coop_cost(sim, p->cost, owner, &spec->block_cost[b]);
        else spec->block_cost[b] = NAN; /* locked, pinned, withheld or a temporary block */
    }
    for (Py_ssize_t i = 0; i < n; i++) spec->evictable[cand[i]] = 0;
    if (status < 0) return -1;
    int found = 0;
    double best = 0.0;
    Py_ssize_t best_first = 0, best_last = -1;
    for (Py_ssize_t seg = 0; seg < l->n_segments; seg++) {
        if (pool >= 0 && l->seg_pool[seg] != pool) continue;
        int window;
        double cost = 0.0;
        Py_ssize_t first = 0, last = -1;
        if (cheapest_window(sim, l->seg_first[seg], l->seg_first[seg + 1], need, &window, &cost, &first, &last) < 0)
            return -1;
        if (window && (!found || cost < best)) {
            found = 1;
            best = cost;
            best_first = first;
            best_last = last;
        }
    }
    if (!found) { /* no segment holds the request: the cheapest wholly evictable segment */
        for (Py_ssize_t seg = 0; seg < l->n_segments; seg++) {
            Py_ssize_t first = l->seg_first[seg], last = l->seg_first[seg + 1];
            int broken = 0, holds = 0;
            for (Py_ssize_t b = first; b < last; b++) {
                broken |= isnan(spec->block_cost[b]);
                holds |= l->block_owner[b] >= 0;
            }
            if (broken || !holds) continue;
            double cost;
            if (exact_sum(spec->block_cost + first, last - first, spec->partials, &cost) < 0) return -1;
            if (!found || cost < best) {
                found = 1;
                best = cost;
                best_first = first;
                best_last = last - 1;
            }
        }
    }
    if (!found) { /* nothing contiguous can be freed: the first candidate of least cost */
        Py_ssize_t chosen = 0;
        double least = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) {
            double cost;
            if (coop_cost(sim, p->cost, cand[i], &cost) < 0) return -1;
            if (i == 0 || cost < least) { least = cost; chosen = i; }
        }
        return vec_push(out, cand[chosen]);
    }
    for (Py_ssize_t b = best_first; b <= best_last; b++)
        if (l->block_owner[b] >= 0 && vec_push(out, l->block_owner[b]) < 0) return -1;
    return 0;
}

/* DTRFit.choose */
static int dtr_fit_choose(Sim *sim, const int32_t *cand, Py_ssize_t n, IntVec *out) {
    PolicySpec *spec = &sim->policy;
    if (address_layout(sim) < 0) return -1;
    const MemLayout *l = &spec->layout;
    int64_t size = sim->request.block_size, need = memory_request_bytes(&sim->model, size);
    int pool = request_pool_of(sim, size);
    for (Py_ssize_t i = 0; i < n; i++) spec->run[cand[i]] = 0; /* a 0-byte storage holds no block */
    for (Py_ssize_t seg = 0; seg < l->n_segments; seg++) {
        Py_ssize_t first = l->seg_first[seg], last = l->seg_first[seg + 1];
        for (Py_ssize_t b = first; b < last; b++) {
            int32_t owner = l->block_owner[b];
            if (owner < 0 || owner >= sim->tr->n) continue; /* free, or a temporary block: no candidate */
            int64_t run = l->block_size[b];
            if (b > first && l->block_owner[b - 1] < 0) run += l->block_size[b - 1];
            if (b + 1 < last && l->block_owner[b + 1] < 0) run += l->block_size[b + 1];
            spec->run[owner] = run;
            spec->run_fits[owner] = run >= need && (pool < 0 || l->seg_pool[seg] == pool);
        }
    }
    int tiered = sim->request.bytes_fit, best_tier = 2;
    double best_score = INFINITY;
    Py_ssize_t best = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t s = cand[i];
        int64_t run = spec->run[s];
        int fits = run > 0 && spec->run_fits[s];
        double score;
        int64_t numerator = sim->compute_cost[s] + sim->region_compute[s] + sim->region_rev_compute[s];
        if (sim->last_access[s] == NEVER) { /* run x inf: inf, or nan at run 0 */
            score = run > 0 ? (double)numerator / INFINITY : INFINITY;
        } else {
            __int128 denominator = (__int128)run * (sim->clock - sim->last_access[s]);
            if (denominator <= 0) score = INFINITY;
            else if (true_divide(numerator, denominator, &score) < 0) return -1;
        }
        int tier = fits || !tiered ? 0 : 1;
        if (tier < best_tier || (tier == best_tier && score <= best_score)) {
            best_tier = tier;
            best_score = score;
            best = i;
        }
        if (tier == 0 && score == 0) break;
    }
    if (best < 0) {
        PyErr_SetString(PyExc_TypeError, "dtr_fit scored no candidate");
        return -1;
    }
    return vec_push(out, cand[best]);
}

/* ------------------------------------------------------------- scores */
static int score(Sim *sim, const ScoreSpec *p, int32_t s, double *out) {
    switch (p->code) {
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
    case P_FORMULA:
        return formula_score(sim, p, s, out);
    }
    PyErr_SetString(PyExc_SystemError, "unknown policy code");
    return -1;
}

/* Integer scores (LRU's last access, an ablation's bare cost) compare as integers. */
static int integer_scored(const ScoreSpec *p) {
    return p->code == P_LRU || (p->code == P_FORMULA && !p->use_size && !p->use_stale);
}

/* One score policy's choice among cand[0..n), n > 0: an index into cand. */
static int score_choose(Sim *sim, const ScoreSpec *p, const int32_t *cand, Py_ssize_t n, Py_ssize_t *chosen) {
    Py_ssize_t best = -1;
    if (p->code == P_RANDOM) { /* ordered[randrange(0, len(ordered))], the same generator calls */
        PyObject *drawn = PyObject_CallFunction(p->randrange, "in", 0, n);
        if (!drawn) return -1;
        best = PyLong_AsSsize_t(drawn);
        Py_DECREF(drawn);
        if (best == -1 && PyErr_Occurred()) return -1;
        if (best < 0 || best >= n) {
            PyErr_SetString(PyExc_IndexError, "randrange drew an index out of range");
            return -1;
        }
    } else if (integer_scored(p)) { /* the last minimal candidate, stopping at 0 */
        int64_t best_score = INT64_MAX;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t value = p->code == P_LRU ? sim->last_access[cand[i]] : cost_of(sim, p->cost, cand[i]);
            if (best < 0 || value <= best_score) {
                best_score = value;
                best = i;
            }
            if (value == 0) break;
        }
    } else if (p->tie_by_id) { /* min over (score, storage id) */
        double best_score = INFINITY;
        PyObject *best_key = NULL; /* once a score is not a float, min's comparisons are Python's */
        for (Py_ssize_t i = 0; i < n; i++) {
            double value;
            int status = score(sim, p, cand[i], &value);
            if (status < 0) { Py_XDECREF(best_key); return -1; }
            if (status == 2 || best_key) {
                PyObject *odd = status == 2 ? sim->policy.odd_score : PyFloat_FromDouble(value);
                sim->policy.odd_score = NULL;
                PyObject *key = odd ? Py_BuildValue("(Ni)", odd, cand[i]) : NULL;
                if (key && best >= 0 && !best_key) best_key = Py_BuildValue("(di)", best_score, cand[best]);
                int less = !key || (best >= 0 && !best_key) ? -1 : best < 0 ? 1 : PyObject_RichCompareBool(key, best_key, Py_LT);
                if (less < 0) { Py_XDECREF(key); Py_XDECREF(best_key); return -1; }
                if (less) { Py_XSETREF(best_key, key); best = i; }
                else Py_DECREF(key);
                continue;
            }
            if (best < 0 || value < best_score || (value == best_score && cand[i] < cand[best])) {
                best_score = value;
                best = i;
            }
        }
        Py_XDECREF(best_key);
    } else { /* the last candidate with the minimal score, stopping at a score of 0 (simrd's scan) */
        double best_score = INFINITY;
        for (Py_ssize_t i = 0; i < n; i++) {
            double value;
            int status = score(sim, p, cand[i], &value);
            if (status < 0) return -1;
            if (status == 2) { /* value <= best_score in Python: raises for a complex value */
                PyObject *odd = sim->policy.odd_score, *bound = PyFloat_FromDouble(best_score);
                sim->policy.odd_score = NULL;
                int le = bound ? PyObject_RichCompareBool(odd, bound, Py_LE) : -1;
                Py_DECREF(odd);
                Py_XDECREF(bound);
                if (le >= 0) PyErr_SetString(PyExc_TypeError, "a score that is not a float compared as one");
                return -1;
            }
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
    *chosen = best;
    return 0;
}

/* record_steps: the regions of every resident storage as this choice sees them (the tests
   compare them with the Python simulator's, which rebuilds at once: see regions_flush()). */
static int record_region_read(Sim *sim) {
    PyObject *row = PyList_New(0);
    if (!row) return -1;
    for (Py_ssize_t s = 0; s < sim->tr->n; s++) {
        if (!sim->material[s]) continue;
        PyObject *item = Py_BuildValue("(nLL)", s, (long long)sim->region_compute[s],
                                       (long long)sim->region_rev_compute[s]);
        if (!item || PyList_Append(row, item) < 0) { Py_XDECREF(item); Py_DECREF(row); return -1; }
        Py_DECREF(item);
    }
    PyObject *read = PyList_AsTuple(row);
    Py_DECREF(row);
    if (!read || PyList_Append(sim->region_reads, read) < 0) { Py_XDECREF(read); return -1; }
    Py_DECREF(read);
    return 0;
}

/* Choose storages to evict among cand[0..n) (pool order; withheld and excluded storages already removed).
   Append the chosen storage ids to *out (at least one when n > 0; none when n == 0).
   Return 0, or -1 with a Python error set. */
static int policy_choose(Sim *sim, const int32_t *cand, Py_ssize_t n, IntVec *out) {
    if (n == 0) return 0;
    if (sim->track_regions) { /* the scores read regions: take the owed rebuilds first */
        if (regions_flush(&sim->regions) < 0) return -1;
        if (sim->region_reads && record_region_read(sim) < 0) return -1;
    }
    PolicySpec *spec = &sim->policy;
    const ScoreSpec *phase = &spec->phase[0];
    Py_ssize_t chosen;
    if (phase->code == P_COOP) return coop_choose(sim, phase, cand, n, out);
    if (phase->code == P_DTR_FIT) return dtr_fit_choose(sim, cand, n, out);
    if (spec->twophase) { /* phase 1 among the candidates with no evicted neighbour, if any */
        Py_ssize_t isolated = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!has_evicted_neighbour(sim, cand[i])) spec->isolated[isolated++] = cand[i];
        if (isolated) {
            if (score_choose(sim, phase, spec->isolated, isolated, &chosen) < 0) return -1;
            return vec_push(out, spec->isolated[chosen]);
        }
        phase = &spec->phase[1];
    }
    if (score_choose(sim, phase, cand, n, &chosen) < 0) return -1;
    return vec_push(out, cand[chosen]);
}

/* ---------------------------------------------------------------- spec */
static int parse_int64(PyObject *value, int64_t *out, const char *what) {
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "policy spec: %s must be >= 0", what);
        return -1;
    }
    *out = v;
    return 0;
}

/* A score policy's tuple: (code, randrange) for simrd's built-ins, or
 * (P_FORMULA, None, cost, use_size, use_stale, floating, tie_by_id, a, b, c, stale_offset, d). */
static int score_spec_parse(PyObject *obj, ScoreSpec *p) {
    memset(p, 0, sizeof(*p));
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) < 2) {
        PyErr_SetString(PyExc_TypeError, "policy spec: expected a tuple (code, randrange, ...)");
        return -1;
    }
    long code = PyLong_AsLong(PyTuple_GET_ITEM(obj, 0));
    if (code == -1 && PyErr_Occurred()) return -1;
    if (code < 0 || code >= P_COUNT || code == P_TWOPHASE) {
        PyErr_Format(PyExc_ValueError, "unknown score policy code %ld", code);
        return -1;
    }
    p->code = (int)code;
    p->randrange = PyTuple_GET_ITEM(obj, 1);
    if (p->code == P_RANDOM && !PyCallable_Check(p->randrange)) {
        PyErr_SetString(PyExc_TypeError, "the random policy needs a randrange callable");
        return -1;
    }
    if (p->code == P_COOP) { /* (P_COOP, None, cost) */
        if (!PyArg_ParseTuple(obj, "iOi;coop spec", &p->code, &p->randrange, &p->cost)) return -1;
        if (p->cost < 0 || p->cost >= COST_ONE) {
            PyErr_Format(PyExc_ValueError, "coop needs a recompute cost, got cost code %d", p->cost);
            return -1;
        }
        return 0;
    }
    if (p->code != P_FORMULA) return 0;
    PyObject *randrange;
    if (!PyArg_ParseTuple(obj, "iOippppOOOOO;formula spec", &p->code, &randrange, &p->cost, &p->use_size,
                          &p->use_stale, &p->floating, &p->tie_by_id, &p->a_obj, &p->b_obj, &p->c_obj,
                          &p->offset_obj, &p->d_obj))
        return -1;
    if (p->cost < 0 || p->cost >= COST_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown cost code %d", p->cost);
        return -1;
    }
    if (p->floating) {
        if ((p->fa = PyFloat_AsDouble(p->a_obj)) == -1.0 && PyErr_Occurred()) return -1;
        if ((p->fb = PyFloat_AsDouble(p->b_obj)) == -1.0 && PyErr_Occurred()) return -1;
        if ((p->fc = PyFloat_AsDouble(p->c_obj)) == -1.0 && PyErr_Occurred()) return -1;
        if (!(p->fa >= 0 && p->fb >= 0 && p->fc >= 0 && isfinite(p->fa) && isfinite(p->fb) && isfinite(p->fc))) {
            PyErr_SetString(PyExc_ValueError, "policy spec: exponents must be finite and >= 0");
            return -1;
        }
    } else if (parse_int64(p->a_obj, &p->a, "a") < 0 || parse_int64(p->b_obj, &p->b, "b") < 0 ||
               parse_int64(p->c_obj, &p->c, "c") < 0) {
        return -1;
    }
    p->offset_is_float = PyFloat_Check(p->offset_obj);
    if (p->offset_is_float) {
        p->foffset = PyFloat_AS_DOUBLE(p->offset_obj);
        if (!(p->foffset >= 0 && isfinite(p->foffset))) {
            PyErr_SetString(PyExc_ValueError, "policy spec: stale_offset must be finite and >= 0");
            return -1;
        }
    } else if (parse_int64(p->offset_obj, &p->offset, "stale_offset") < 0) {
        return -1;
    }
    p->d_is_float = PyFloat_Check(p->d_obj);
    if (p->d_is_float) {
        p->fd = PyFloat_AS_DOUBLE(p->d_obj);
        if (!(p->fd >= 0 && isfinite(p->fd))) {
            PyErr_SetString(PyExc_ValueError, "policy spec: d must be finite and >= 0");
            return -1;
        }
        p->has_d = p->fd != 0;
    } else {
        if (parse_int64(p->d_obj, &p->d, "d") < 0) return -1;
        p->has_d = p->d != 0;
    }
    if (!p->floating && !p->use_size && !p->use_stale && (p->a != 1 || p->has_d)) {
        PyErr_SetString(PyExc_ValueError, "policy spec: a score without size and staleness is the bare cost");
        return -1;
    }
    return 0;
}

/* Decode core_spec.policy_spec's tuple: a score policy's tuple, or
 * (P_TWOPHASE, phase1, phase2). The tuple outlives the replay, so references stay borrowed. */
static int policy_spec_parse(PyObject *obj, PolicySpec *spec, Py_ssize_t n_tensors) {
    memset(spec, 0, sizeof(*spec));
    if (PyTuple_Check(obj) && PyTuple_GET_SIZE(obj) == 3 && PyLong_Check(PyTuple_GET_ITEM(obj, 0)) &&
        PyLong_AsLong(PyTuple_GET_ITEM(obj, 0)) == P_TWOPHASE) {
        spec->twophase = 1;
        if (score_spec_parse(PyTuple_GET_ITEM(obj, 1), &spec->phase[0]) < 0 ||
            score_spec_parse(PyTuple_GET_ITEM(obj, 2), &spec->phase[1]) < 0)
            return -1;
        if (!(spec->isolated = PyMem_Malloc((n_tensors ? n_tensors : 1) * sizeof(int32_t)))) {
            PyErr_NoMemory();
            return -1;
        }
        return 0;
    }
    if (score_spec_parse(obj, &spec->phase[0]) < 0) return -1;
    int code = spec->phase[0].code;
    if (code == P_COOP || code == P_DTR_FIT) {
        Py_ssize_t n = n_tensors ? n_tensors : 1;
        if (!(spec->evictable = PyMem_Calloc(n, 1)) || !(spec->run = PyMem_Calloc(n, sizeof(int64_t))) ||
            !(spec->run_fits = PyMem_Calloc(n, 1))) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* What the runtime must maintain for one score policy. */
static int score_tracks_regions(const ScoreSpec *p) {
    return p->code == P_DTR || p->code == P_MSPS || p->code == P_DTR_FIT ||
           ((p->code == P_FORMULA || p->code == P_COOP) && p->cost == COST_ESTAR);
}
static int score_tracks_eq(const ScoreSpec *p) {
    return p->code == P_DTR_EQ_CLASS || ((p->code == P_FORMULA || p->code == P_COOP) && p->cost == COST_EQCLASS);
}
static int policy_tracks_regions(const PolicySpec *spec) {
    return score_tracks_regions(&spec->phase[0]) || (spec->twophase && score_tracks_regions(&spec->phase[1]));
}
static int policy_tracks_eq(const PolicySpec *spec) {
    return score_tracks_eq(&spec->phase[0]) || (spec->twophase && score_tracks_eq(&spec->phase[1]));
}

/* Free what the policy code allocated. */
static void policy_spec_release(PolicySpec *spec) {
    void *buffers[] = {spec->seen, spec->isolated, spec->evictable, spec->run, spec->run_fits, spec->block_cost,
                       spec->partials};
    for (size_t i = 0; i < sizeof(buffers) / sizeof(buffers[0]); i++) PyMem_Free(buffers[i]);
    memory_layout_release(&spec->layout);
    Py_XDECREF(spec->odd_score);
    memset(spec, 0, sizeof(*spec));
}

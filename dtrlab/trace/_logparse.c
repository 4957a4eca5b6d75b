/* The compiled reader of simrd's JSON-lines logs: dtrlab.trace.simrd_log.parse_lines for the logs real
 * training steps produce, giving the same trace as flat arrays (the parsed-trace cache's layout).
 *
 * It accepts a strict subset of what the Python parser accepts: ASCII lines, one JSON object each, the
 * log's known fields only (each once), strings without escapes, integers as JSON integers or as strings
 * of ASCII digits, and lists of names or of integers. Anything else, valid or not, and every condition
 * the Python parser reports as an error, returns None: the Python parser then builds the trace or names
 * the file and line. So this file never decides what a log means on its own; tests/test_trace.py
 * compares the two on every log we have and on random and damaged ones.
 *
 * The build below follows parse_lines statement for statement (CALL, RELEASE, COPY, CONSTANT, MUTATE,
 * ANNOTATE, COPY_FROM, then the output pins in the order the names were first defined). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct { const char *s; Py_ssize_t n; } Str;

/* ---- growable arrays ---------------------------------------------------------------------------- */

typedef struct { int64_t *v; Py_ssize_t n, cap; } Ints;
typedef struct { char *v; Py_ssize_t n, cap; } Bytes;

static int grow(void **v, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *v2 = PyMem_Realloc(*v, (size_t)cap2 * item);
    if (!v2) { PyErr_NoMemory(); return -1; }
    *v = v2; *cap = cap2;
    return 0;
}

static int ints_push(Ints *a, int64_t x) {
    if (grow((void **)&a->v, &a->cap, a->n + 1, sizeof(int64_t))) return -1;
    a->v[a->n++] = x;
    return 0;
}

static int bytes_push(Bytes *b, const char *s, Py_ssize_t n) {
    if (grow((void **)&b->v, &b->cap, b->n + n, 1)) return -1;
    memcpy(b->v + b->n, s, (size_t)n);
    b->n += n;
    return 0;
}

/* ---- one log line ------------------------------------------------------------------------------- */

/* The fields a log line may have (anything else: None). */
enum { F_INSTRUCTION, F_NAME, F_MEMORY, F_DST, F_SRC, F_ARGS, F_RESULT, F_TIME, F_ALIAS, F_MUTATE, F_ANNOTATION,
       N_FIELDS };
static const char *const FIELD_NAMES[N_FIELDS] = {"INSTRUCTION", "NAME", "MEMORY", "DST", "SRC", "ARGS", "RESULT",
                                                   "TIME", "ALIAS", "MUTATE", "ANNOTATION"};
/* simrd_log._KNOWN */
enum { I_CONSTANT, I_MEMORY, I_COPY, I_RELEASE, I_CALL, I_MUTATE, I_ANNOTATE, I_COPY_FROM, I_ALIAS, N_INSTRUCTIONS };
static const char *const INSTRUCTION_NAMES[N_INSTRUCTIONS] = {"CONSTANT", "MEMORY", "COPY", "RELEASE", "CALL",
                                                               "MUTATE", "ANNOTATE", "COPY_FROM", "ALIAS"};

enum { V_STR = 1, V_INT, V_STR_LIST, V_INT_LIST, V_EMPTY_LIST };

typedef struct {
    int instruction;
    unsigned char type[N_FIELDS]; /* 0: absent */
    Str str[N_FIELDS];
    int64_t num[N_FIELDS];
    Py_ssize_t at[N_FIELDS], count[N_FIELDS]; /* a list's items in `names` or `numbers` */
    Str *names; Py_ssize_t n_names, cap_names;
    int64_t *numbers; Py_ssize_t n_numbers, cap_numbers;
} Record;

static void record_free(Record *r) { PyMem_Free(r->names); PyMem_Free(r->numbers); }

/* 1: parsed; 0: not one this reader takes (the Python parser decides); -1: an exception is set. */
#define NOT_MINE 0

static int equals(Str a, const char *b) { return (size_t)a.n == strlen(b) && memcmp(a.s, b, (size_t)a.n) == 0; }
static int same(Str a, Str b) { return a.n == b.n && memcmp(a.s, b.s, (size_t)a.n) == 0; }

static const char *skip_space(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    return p;
}

/* A JSON string without escapes of printable ASCII (json.loads rejects raw control characters). */
static const char *read_string(const char *p, const char *end, Str *out) {
    if (p >= end || *p != '"') return NULL;
    const char *s = ++p;
    while (p < end && *p != '"') {
        if (*p == '\\' || (unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) return NULL;
        p++;
    }
    if (p >= end) return NULL;
    out->s = s; out->n = p - s;
    return p + 1;
}

/* A JSON integer (-?(0|[1-9][0-9]*), no fraction or exponent) that fits in 64 bits. */
static const char *read_integer(const char *p, const char *end, int64_t *out) {
    int negative = p < end && *p == '-';
    if (negative) p++;
    if (p >= end || *p < '0' || *p > '9') return NULL;
    if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9') return NULL;
    uint64_t value = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (value > (UINT64_MAX - 9) / 10) return NULL;
        value = value * 10 + (uint64_t)(*p - '0');
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return NULL;
    if (value > (uint64_t)INT64_MAX + (negative ? 1u : 0u)) return NULL;
    *out = negative ? (int64_t)(0 - value) : (int64_t)value;
    return p;
}

static int push_name(Record *r, Str s) {
    if (grow((void **)&r->names, &r->cap_names, r->n_names + 1, sizeof(Str))) return -1;
    r->names[r->n_names++] = s;
    return 0;
}

static int push_number(Record *r, int64_t x) {
    if (grow((void **)&r->numbers, &r->cap_numbers, r->n_numbers + 1, sizeof(int64_t))) return -1;
    r->numbers[r->n_numbers++] = x;
    return 0;
}

/* A list of strings or of integers (not mixed). Returns the position after it, NULL if not one. */
static const char *read_list(Record *r, int field, const char *p, const char *end, int *failed) {
    p = skip_space(p + 1, end);  /* after '[' */
    r->at[field] = -1;
    r->count[field] = 0;
    r->type[field] = V_EMPTY_LIST;
    if (p < end && *p == ']') return p + 1;
    int kind = (p < end && *p == '"') ? V_STR_LIST : V_INT_LIST;
    r->type[field] = (unsigned char)kind;
    r->at[field] = kind == V_STR_LIST ? r->n_names : r->n_numbers;
    for (;;) {
        if (kind == V_STR_LIST) {
            Str s;
            if (!(p = read_string(p, end, &s))) return NULL;
            if (push_name(r, s)) { *failed = 1; return NULL; }
        } else {
            int64_t x;
            if (!(p = read_integer(p, end, &x))) return NULL;
            if (push_number(r, x)) { *failed = 1; return NULL; }
        }
        r->count[field]++;
        p = skip_space(p, end);
        if (p < end && *p == ']') return p + 1;
        if (p >= end || *p != ',') return NULL;
        p = skip_space(p + 1, end);
    }
}

/* One line (without its newline) as a record: 1, 0 (not mine: the Python parser decides) or -1. */
static int read_record(const char *p, const char *end, Record *r) {
    memset(r->type, 0, sizeof r->type);
    r->n_names = r->n_numbers = 0;
    p = skip_space(p, end);
    if (p >= end || *p != '{') return NOT_MINE;
    p = skip_space(p + 1, end);
    if (p < end && *p == '}') return NOT_MINE;  /* {} has no INSTRUCTION */
    for (;;) {
        Str key;
        if (!(p = read_string(p, end, &key))) return NOT_MINE;
        int field = -1;
        for (int f = 0; f < N_FIELDS; f++)
            if (equals(key, FIELD_NAMES[f])) { field = f; break; }
        if (field < 0 || r->type[field]) return NOT_MINE;  /* an unknown or repeated key */
        p = skip_space(p, end);
        if (p >= end || *p != ':') return NOT_MINE;
        p = skip_space(p + 1, end);
        if (p >= end) return NOT_MINE;
        if (*p == '"') {
            if (!(p = read_string(p, end, &r->str[field]))) return NOT_MINE;
            r->type[field] = V_STR;
        } else if (*p == '[') {
            int failed = 0;
            if (!(p = read_list(r, field, p, end, &failed))) return failed ? -1 : NOT_MINE;
        } else {
            if (!(p = read_integer(p, end, &r->num[field]))) return NOT_MINE;
            r->type[field] = V_INT;
        }
        p = skip_space(p, end);
        if (p < end && *p == '}') break;
        if (p >= end || *p != ',') return NOT_MINE;
        p = skip_space(p + 1, end);
    }
    if (skip_space(p + 1, end) != end) return NOT_MINE;  /* a second value on the line */
    if (r->type[F_INSTRUCTION] != V_STR) return NOT_MINE;
    for (int i = 0; i < N_INSTRUCTIONS; i++)
        if (equals(r->str[F_INSTRUCTION], INSTRUCTION_NAMES[i])) { r->instruction = i; return 1; }
    return NOT_MINE;
}

/* The next non-blank line of the log as a record: 1, 0 at the end of the log, NOT_MINE as -2, or -1. */
typedef struct { const char *p, *end; } Cursor;

static int next_record(Cursor *c, Record *r) {
    while (c->p < c->end) {
        const char *line = c->p;
        const char *newline = memchr(line, '\n', (size_t)(c->end - line));
        const char *line_end = newline ? newline : c->end;
        c->p = newline ? newline + 1 : c->end;
        if (skip_space(line, line_end) == line_end) continue;  /* a blank line */
        int got = read_record(line, line_end, r);
        return got == 1 ? 1 : got == NOT_MINE ? -2 : -1;
    }
    return 0;
}

/* simrd_log's number(): a JSON integer, or a string of ASCII digits with an optional sign, >= minimum.
 * 1 with *out set, else 0 (absent, another type, a string int() reads another way, out of range). */
static int number(const Record *r, int field, int has_minimum, int64_t minimum, int64_t *out) {
    int64_t value;
    if (r->type[field] == V_INT) {
        value = r->num[field];
    } else if (r->type[field] == V_STR) {
        const char *p = r->str[field].s, *end = p + r->str[field].n;
        int negative = p < end && *p == '-';
        if (p < end && (*p == '-' || *p == '+')) p++;
        if (p >= end) return 0;
        uint64_t magnitude = 0;
        for (; p < end; p++) {
            if (*p < '0' || *p > '9' || magnitude > (UINT64_MAX - 9) / 10) return 0;
            magnitude = magnitude * 10 + (uint64_t)(*p - '0');
        }
        if (magnitude > (uint64_t)INT64_MAX + (negative ? 1u : 0u)) return 0;
        value = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
    } else {
        return 0;
    }
    if (has_minimum && value < minimum) return 0;
    *out = value;
    return 1;
}

static int is_str(const Record *r, int field) { return r->type[field] == V_STR; }
static int is_str_list(const Record *r, int field) {
    return r->type[field] == V_STR_LIST || r->type[field] == V_EMPTY_LIST;
}
static int is_int_list(const Record *r, int field) {
    return r->type[field] == V_INT_LIST || r->type[field] == V_EMPTY_LIST;
}
static Str list_name(const Record *r, int field, Py_ssize_t i) { return r->names[r->at[field] + i]; }

/* ---- the build ---------------------------------------------------------------------------------- */

static uint64_t hash_str(const char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* A log name -> tensor id map that remembers the order names were first defined (a Python dict). The
 * names point into the log's bytes. */
typedef struct { Str name; int64_t tensor; } Entry;
typedef struct {
    Entry *entries; Py_ssize_t n, cap;
    int32_t *slots; Py_ssize_t n_slots;  /* open addressing; -1 empty */
} NameMap;

static int slots_rebuild(int32_t **slots, Py_ssize_t *n_slots, Py_ssize_t n_slots2) {
    int32_t *s2 = PyMem_Malloc((size_t)n_slots2 * sizeof(int32_t));
    if (!s2) { PyErr_NoMemory(); return -1; }
    memset(s2, 0xff, (size_t)n_slots2 * sizeof(int32_t));
    PyMem_Free(*slots);
    *slots = s2; *n_slots = n_slots2;
    return 0;
}

static int32_t *map_slot(NameMap *m, Str name) {
    Py_ssize_t mask = m->n_slots - 1, i = (Py_ssize_t)(hash_str(name.s, name.n) & (uint64_t)mask);
    while (m->slots[i] >= 0 && !same(m->entries[m->slots[i]].name, name)) i = (i + 1) & mask;
    return &m->slots[i];
}

static Entry *map_get(NameMap *m, Str name) {
    if (!m->n_slots) return NULL;
    int32_t slot = *map_slot(m, name);
    return slot >= 0 ? &m->entries[slot] : NULL;
}

/* names[name] = tensor (a name already there keeps its place in the order). */
static int map_set(NameMap *m, Str name, int64_t tensor) {
    Entry *e = map_get(m, name);
    if (e) { e->tensor = tensor; return 0; }
    if (m->n + 1 > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "too many tensor names"); return -1; }
    if (2 * (m->n + 1) > m->n_slots) {
        if (slots_rebuild(&m->slots, &m->n_slots, m->n_slots ? 2 * m->n_slots : 1024)) return -1;
        for (Py_ssize_t k = 0; k < m->n; k++) *map_slot(m, m->entries[k].name) = (int32_t)k;
    }
    if (grow((void **)&m->entries, &m->cap, m->n + 1, sizeof(Entry))) return -1;
    m->entries[m->n] = (Entry){name, tensor};
    *map_slot(m, name) = (int32_t)m->n;
    m->n++;
    return 0;
}

typedef struct {
    Ints op_cost, op_backward, op_args, op_args_offsets, op_outputs, op_sizes, op_aliases, op_outputs_offsets;
    Ints tensor_op, tensor_index, tensor_refs, tensor_name_at, schedule;
    Bytes op_names, tensor_names;  /* NUL-separated */
    NameMap names;
    /* the set of defined tensor names: tensor ids hashed by name (names live in tensor_names) */
    int32_t *defined; Py_ssize_t n_defined_slots;
    Bytes scratch;  /* a MUTATE's new names */
    Str *new_names; Py_ssize_t new_names_cap;  /* ... as strings into scratch (kept between MUTATEs) */
    int in_backward;
} Build;

static Str tensor_name(const Build *b, int64_t t) {
    Py_ssize_t at = b->tensor_name_at.v[t];
    Py_ssize_t end = t + 1 < b->tensor_name_at.n ? b->tensor_name_at.v[t + 1] - 1 : b->tensor_names.n;
    return (Str){b->tensor_names.v + at, end - at};
}

static int32_t *defined_slot(Build *b, Str name) {
    Py_ssize_t mask = b->n_defined_slots - 1, i = (Py_ssize_t)(hash_str(name.s, name.n) & (uint64_t)mask);
    while (b->defined[i] >= 0 && !same(tensor_name(b, b->defined[i]), name)) i = (i + 1) & mask;
    return &b->defined[i];
}

static int is_defined(Build *b, Str name) { return b->n_defined_slots && *defined_slot(b, name) >= 0; }

static void build_free(Build *b) {
    Ints *all[] = {&b->op_cost, &b->op_backward, &b->op_args, &b->op_args_offsets, &b->op_outputs, &b->op_sizes,
                   &b->op_aliases, &b->op_outputs_offsets, &b->tensor_op, &b->tensor_index, &b->tensor_refs,
                   &b->tensor_name_at, &b->schedule};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) PyMem_Free(all[i]->v);
    PyMem_Free(b->op_names.v); PyMem_Free(b->tensor_names.v); PyMem_Free(b->scratch.v);
    PyMem_Free(b->names.entries); PyMem_Free(b->names.slots); PyMem_Free(b->defined); PyMem_Free(b->new_names);
}

static int schedule_push(Build *b, int64_t kind, int64_t operand) {
    return ints_push(&b->schedule, kind) || ints_push(&b->schedule, operand) ? -1 : 0;
}

/* simrd_log.Trace's step kinds (dtrlab.trace.model). */
enum { COMPUTE = 0, GET = 1, PIN = 2, RELEASE = 3 };

/* _Builder.add_operator for an operator whose n_args arguments, sizes and aliases are already pushed; the
 * result names (each pointing into the log or into scratch) are defined here. 1, NOT_MINE or -1. */
static int add_operator(Build *b, Str op_name, int64_t cost, Py_ssize_t n_args, const Str *results,
                        Py_ssize_t n_results) {
    int64_t op = b->op_cost.n, outputs_at = b->op_outputs.n;
    for (Py_ssize_t i = 0; i < n_results; i++) {
        if (is_defined(b, results[i])) return NOT_MINE;  /* "defined twice" (within the results too) */
        int64_t t = b->tensor_op.n;
        if (t && bytes_push(&b->tensor_names, "", 1)) return -1;  /* the separator: "\0" */
        if (ints_push(&b->tensor_name_at, b->tensor_names.n) || bytes_push(&b->tensor_names, results[i].s, results[i].n)
            || ints_push(&b->tensor_op, op) || ints_push(&b->tensor_index, i) || ints_push(&b->tensor_refs, 1)
            || ints_push(&b->op_outputs, t))
            return -1;
        if (2 * (t + 1) > b->n_defined_slots) {
            if (slots_rebuild(&b->defined, &b->n_defined_slots, b->n_defined_slots ? 2 * b->n_defined_slots : 1024))
                return -1;
            for (int64_t u = 0; u < t; u++) *defined_slot(b, tensor_name(b, u)) = (int32_t)u;
        }
        if (t + 1 > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "too many tensors"); return -1; }
        *defined_slot(b, tensor_name(b, t)) = (int32_t)t;
    }
    if (op && bytes_push(&b->op_names, "", 1)) return -1;
    if (bytes_push(&b->op_names, op_name.s, op_name.n) || ints_push(&b->op_cost, cost)
        || ints_push(&b->op_backward, b->in_backward) || ints_push(&b->op_args_offsets, b->op_args.n - n_args)
        || ints_push(&b->op_outputs_offsets, outputs_at) || schedule_push(b, COMPUTE, op))
        return -1;
    return 1;
}

static int64_t storage_size(const Build *b, int64_t t) {
    for (;;) {
        int64_t op = b->tensor_op.v[t], at = b->op_outputs_offsets.v[op] + b->tensor_index.v[t];
        if (b->op_aliases.v[at] == -1) return b->op_sizes.v[at];
        t = b->op_args.v[b->op_args_offsets.v[op] + b->op_aliases.v[at]];
    }
}

static int contains_backward(Str s) {
    for (Py_ssize_t i = 0; i + 8 <= s.n; i++)
        if (memcmp(s.s + i, "backward", 8) == 0) return 1;
    return 0;
}

#define TRY(expression) do { int got_ = (expression); if (got_ != 1) return got_; } while (0)
#define NEED(condition) do { if (!(condition)) return NOT_MINE; } while (0)
#define OK(expression) do { if ((expression) < 0) return -1; } while (0)

/* take(): the next record must be `instruction` for `name`. */
static int take(Cursor *c, Record *r, int instruction, Str name) {
    int got = next_record(c, r);
    if (got != 1) return got == -1 ? -1 : NOT_MINE;
    NEED(r->instruction == instruction && is_str(r, F_NAME) && same(r->str[F_NAME], name));
    return 1;
}

static int lookup(Build *b, Str name, int64_t *tensor) {
    Entry *e = map_get(&b->names, name);
    if (!e) return NOT_MINE;
    *tensor = e->tensor;
    return 1;
}

static int build_call(Build *b, Cursor *c, Record *r, Record *memory, Record *alias) {
    NEED(is_str(r, F_NAME) && is_str_list(r, F_RESULT) && is_str_list(r, F_ARGS));
    Str op_name = r->str[F_NAME];
    Py_ssize_t n_results = r->count[F_RESULT], n_args = r->count[F_ARGS];
    b->in_backward |= contains_backward(op_name);
    for (Py_ssize_t i = 0; i < n_results; i++) {
        Str result = list_name(r, F_RESULT, i);
        int64_t alias_index, size;
        TRY(take(c, memory, I_MEMORY, result));
        TRY(take(c, alias, I_ALIAS, result));
        NEED(number(alias, F_ALIAS, 0, 0, &alias_index) && number(memory, F_MEMORY, 1, 0, &size));
        NEED(-1 <= alias_index && alias_index < n_args);
        OK(ints_push(&b->op_sizes, alias_index != -1 ? 0 : size));
        OK(ints_push(&b->op_aliases, alias_index));
    }
    for (Py_ssize_t i = 0; i < n_args; i++) {
        int64_t tensor;
        TRY(lookup(b, list_name(r, F_ARGS, i), &tensor));
        OK(ints_push(&b->op_args, tensor));
    }
    for (Py_ssize_t i = 0; i < n_results; i++) NEED(!map_get(&b->names, list_name(r, F_RESULT, i)));
    int64_t cost;
    NEED(number(r, F_TIME, 1, 0, &cost));
    int64_t first = b->tensor_op.n;
    TRY(add_operator(b, op_name, cost, n_args, r->names + (n_results ? r->at[F_RESULT] : 0), n_results));
    for (Py_ssize_t i = 0; i < n_results; i++) OK(map_set(&b->names, list_name(r, F_RESULT, i), first + i));
    return 1;
}

static int build_mutate(Build *b, Record *r) {
    NEED(is_str(r, F_NAME) && is_str_list(r, F_ARGS) && is_int_list(r, F_MUTATE));
    Str op_name = r->str[F_NAME];
    Py_ssize_t n_args = r->count[F_ARGS], n_mutated = r->count[F_MUTATE];
    const int64_t *mutated = r->numbers + (n_mutated ? r->at[F_MUTATE] : 0);
    b->in_backward |= contains_backward(op_name);
    Py_ssize_t args_at = b->op_args.n;
    for (Py_ssize_t i = 0; i < n_args; i++) {
        int64_t tensor;
        TRY(lookup(b, list_name(r, F_ARGS, i), &tensor));
        OK(ints_push(&b->op_args, tensor));
    }
    for (Py_ssize_t k = 0; k < n_mutated; k++) NEED(0 <= mutated[k] && mutated[k] < n_args);
    /* the new names ("name$" of each mutated argument's tensor), gathered in scratch first */
    b->scratch.n = 0;
    for (Py_ssize_t k = 0; k < n_mutated; k++) {
        int64_t arg = b->op_args.v[args_at + mutated[k]];
        Str old = tensor_name(b, arg);
        OK(ints_push(&b->op_sizes, storage_size(b, arg)));
        OK(ints_push(&b->op_aliases, -1));
        OK(bytes_push(&b->scratch, old.s, old.n));
        OK(bytes_push(&b->scratch, "$", 1));
    }
    if (n_mutated > b->new_names_cap) {
        Str *grown = PyMem_Realloc(b->new_names, (size_t)n_mutated * sizeof(Str));
        if (!grown) { PyErr_NoMemory(); return -1; }
        b->new_names = grown;
        b->new_names_cap = n_mutated;
    }
    Str *new_names = b->new_names;
    for (Py_ssize_t k = 0, at = 0; k < n_mutated; k++) {
        Py_ssize_t n = tensor_name(b, b->op_args.v[args_at + mutated[k]]).n + 1;
        new_names[k] = (Str){b->scratch.v + at, n};
        at += n;
    }
    int64_t cost;
    int got = number(r, F_TIME, 1, 0, &cost) ? add_operator(b, op_name, cost, n_args, new_names, n_mutated) : NOT_MINE;
    if (got != 1) return got;
    int64_t first = b->tensor_op.n - n_mutated;
    for (Py_ssize_t k = 0; k < n_mutated; k++) {
        Str arg_name = list_name(r, F_ARGS, mutated[k]);
        Entry *e = map_get(&b->names, arg_name);
        int64_t old = e->tensor;
        e->tensor = first + k;
        b->tensor_refs.v[old] -= 1;
        OK(schedule_push(b, RELEASE, old));
    }
    return 1;
}

/* parse_lines(start=...) over all of the log's records. */
static int build_trace(Build *b, Cursor *c, int start, Record *r, Record *memory, Record *alias) {
    int got;
    int64_t tensor, old;
    if (start) {  /* skip to ANNOTATE START (every line before it is still read and checked) */
        for (;;) {
            got = next_record(c, r);
            if (got != 1) return got == -1 ? -1 : NOT_MINE;  /* no START: the Python parser says so */
            if (r->instruction == I_ANNOTATE && r->type[F_ANNOTATION]) {
                NEED(is_str(r, F_ANNOTATION));
                if (equals(r->str[F_ANNOTATION], "START")) break;
            }
        }
    }
    while ((got = next_record(c, r)) == 1) {
        switch (r->instruction) {
        case I_CALL:
            TRY(build_call(b, c, r, memory, alias));
            break;
        case I_RELEASE: {
            NEED(is_str(r, F_NAME));
            Entry *e = map_get(&b->names, r->str[F_NAME]);
            if (e) {
                b->tensor_refs.v[e->tensor] -= 1;
                OK(schedule_push(b, RELEASE, e->tensor));
            }
            break;
        }
        case I_COPY:
            NEED(is_str(r, F_DST) && is_str(r, F_SRC));
            NEED(!map_get(&b->names, r->str[F_DST]));
            TRY(lookup(b, r->str[F_SRC], &tensor));
            OK(map_set(&b->names, r->str[F_DST], tensor));
            b->tensor_refs.v[tensor] += 1;
            OK(schedule_push(b, GET, tensor));
            break;
        case I_CONSTANT: {
            NEED(is_str(r, F_NAME));
            Str name = r->str[F_NAME];
            int64_t size;
            TRY(take(c, memory, I_MEMORY, name));
            NEED(number(memory, F_MEMORY, 1, 0, &size));
            OK(ints_push(&b->op_sizes, size));
            OK(ints_push(&b->op_aliases, -1));
            TRY(add_operator(b, (Str){"constant", 8}, 0, 0, &name, 1));  /* model.CONSTANT_OP */
            tensor = b->tensor_op.n - 1;
            OK(schedule_push(b, PIN, tensor));
            OK(map_set(&b->names, name, tensor));
            break;
        }
        case I_MUTATE:
            TRY(build_mutate(b, r));
            break;
        case I_ANNOTATE:
            if (r->type[F_ANNOTATION]) {
                NEED(is_str(r, F_ANNOTATION));
                if (equals(r->str[F_ANNOTATION], "BACKWARD")) b->in_backward = 1;
            }
            break;
        case I_COPY_FROM:
            NEED(is_str(r, F_DST) && is_str(r, F_SRC));
            TRY(lookup(b, r->str[F_DST], &old));
            TRY(lookup(b, r->str[F_SRC], &tensor));
            OK(map_set(&b->names, r->str[F_DST], tensor));
            b->tensor_refs.v[old] -= 1;
            b->tensor_refs.v[tensor] += 1;
            OK(schedule_push(b, RELEASE, old));
            OK(schedule_push(b, GET, tensor));
            break;
        default:  /* MEMORY or ALIAS outside a CONSTANT or CALL */
            return NOT_MINE;
        }
    }
    if (got != 0) return got == -1 ? -1 : NOT_MINE;
    for (Py_ssize_t k = 0; k < b->names.n; k++) {  /* the outputs, in the order their names were defined */
        tensor = b->names.entries[k].tensor;
        if (b->tensor_refs.v[tensor] > 0) OK(schedule_push(b, PIN, tensor));
    }
    /* the closing offsets */
    OK(ints_push(&b->op_args_offsets, b->op_args.n));
    OK(ints_push(&b->op_outputs_offsets, b->op_outputs.n));
    return 1;
}

static int put(PyObject *dict, const char *key, PyObject *value) {
    if (!value) return -1;
    int failed = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return failed;
}

static int put_ints(PyObject *dict, const char *key, const Ints *a) {
    return put(dict, key, PyBytes_FromStringAndSize((const char *)a->v, a->n * (Py_ssize_t)sizeof(int64_t)));
}

static PyObject *parse(PyObject *self, PyObject *args) {
    Py_buffer data;
    int start;
    if (!PyArg_ParseTuple(args, "y*p", &data, &start)) return NULL;
    Build b;
    Record r, memory, alias;
    memset(&b, 0, sizeof b);
    memset(&r, 0, sizeof r); memset(&memory, 0, sizeof memory); memset(&alias, 0, sizeof alias);
    Cursor c = {data.buf, (const char *)data.buf + data.len};
    int got = build_trace(&b, &c, start, &r, &memory, &alias);
    PyObject *result = NULL;
    if (got == 1) {
        result = PyDict_New();
        if (result && (put_ints(result, "op_cost", &b.op_cost) || put_ints(result, "op_backward", &b.op_backward)
                       || put_ints(result, "op_args", &b.op_args)
                       || put_ints(result, "op_args_offsets", &b.op_args_offsets)
                       || put_ints(result, "op_outputs", &b.op_outputs) || put_ints(result, "op_sizes", &b.op_sizes)
                       || put_ints(result, "op_aliases", &b.op_aliases)
                       || put_ints(result, "op_outputs_offsets", &b.op_outputs_offsets)
                       || put_ints(result, "tensor_op", &b.tensor_op)
                       || put_ints(result, "tensor_index", &b.tensor_index)
                       || put_ints(result, "schedule", &b.schedule)
                       || put(result, "op_names", PyBytes_FromStringAndSize(b.op_names.v, b.op_names.n))
                       || put(result, "tensor_names", PyBytes_FromStringAndSize(b.tensor_names.v, b.tensor_names.n))
                       || put(result, "operators", PyLong_FromSsize_t(b.op_cost.n))
                       || put(result, "tensors", PyLong_FromSsize_t(b.tensor_op.n)))) {
            Py_CLEAR(result);
        }
    } else if (got == NOT_MINE) {
        result = Py_NewRef(Py_None);
    }
    build_free(&b);
    record_free(&r); record_free(&memory); record_free(&alias);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"parse", parse, METH_VARARGS,
     "parse(data: bytes, start: bool) -> dict | None\n\n"
     "The trace of a simrd log's bytes as flat arrays (int64 bytes, NUL-separated names), or None when\n"
     "the log is not one this reader takes: then dtrlab.trace.simrd_log's Python parser decides."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_logparse", "The compiled simrd log reader.", -1, methods};

PyMODINIT_FUNC PyInit__logparse(void) { return PyModule_Create(&module); }

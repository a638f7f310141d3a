/*
 * agent/_fastsample.c -- dyper's C stack walker (CPython 3.11, 3.12, 3.13).
 *
 * sample(counts, locs, new_loc, skip_ident) -> None
 *
 * Does exactly what the pure-Python reference Agent._sample_python in
 * agent/core.py does, without creating frame objects:
 *
 *     for tid, frame in sys._current_frames().items():
 *         if tid == skip_ident: continue
 *         stack = []
 *         for each frame f, following f_back:
 *             key = (f.f_lasti << 48) | id(f.f_code)
 *             loc = locs.get(key)
 *             if loc is None:
 *                 loc = new_loc(key, f.f_code, f.f_lasti, f.f_lineno)
 *             stack.append(loc)
 *         counts[(tid, tuple(stack))] = counts.get((tid, tuple(stack)), 0) + 1
 *
 * The caller holds the GIL (it is a Python call). The work is split in two
 * phases, and the split is what keeps this safe inside a production process:
 *
 *   1. Snapshot. Under the GIL *and* the runtime's thread-list lock
 *      (HEAD_LOCK, the lock sys._current_frames takes too), walk every thread
 *      state of the current interpreter and copy, for every complete frame,
 *      a strong reference to its code object, its instruction offset and
 *      the line its frame object may be holding. Nothing in this phase runs
 *      Python code, allocates Python objects or can release the GIL, so no
 *      thread can push or pop a frame or go away while it is being read.
 *
 *   2. Record. Build keys, look them up in `locs`, call `new_loc` on a miss,
 *      build the stack tuples and update `counts`. new_loc is Python code,
 *      and any allocation can run the cyclic GC and with it finalizers, so
 *      the GIL may be released and other threads may run (and exit) here:
 *      this phase therefore touches only the snapshot, never a thread state
 *      or an interpreter frame. The code objects stay alive through the
 *      references the snapshot holds.
 *
 * Location cache. Building the int key and looking it up in `locs` is most of
 * the cost of a frame, and in a steady state every lookup hits. The module
 * therefore remembers (code, f_lasti) -> location for lookups that hit, and
 * uses a remembered location only while `locs` is the same dict object (the
 * cache holds a reference to it) with the same ma_version_tag as when it was
 * remembered. Every mutation of a dict gives it a new version (PEP 509; on
 * 3.12+ through the dict-watcher notification every mutation goes through)
 * from a counter that never repeats, so an unchanged version means the dict
 * holds exactly what it held: locs.get(key) would return the same object,
 * and that object is alive (the dict holds it). An import-time self-test
 * disables the cache if version tags do not behave as described.
 *
 * Key reuse. Likewise the (tid, stack) tuple a thread produced in the last
 * sample is kept, and reused (with its hash) when the thread's new stack is
 * made of the very same location objects, all exact ints: the counts lookup
 * then finds the stored key by identity, without hashing or comparing
 * tuples. An equal tuple with an equal hash: counts cannot tell.
 *
 * Which frames appear, and in what order, is decided by the very inline
 * functions CPython's own f_back / sys._current_frames use
 * (_PyFrame_IsIncomplete from the installed internal headers), so the stacks
 * are the ones the Python walker sees. Line numbers follow
 * PyFrame_GetLineNumber of the same version: a line a trace function left in
 * the frame object wins, otherwise PyCode_Addr2Line(code, f_lasti).
 *
 * Known, deliberate differences from the Python walker (see also the tests):
 *   - Only the current interpreter's threads are walked; sys._current_frames
 *     also lists other (sub)interpreters' threads.
 *   - Walks stop after MAX_DEPTH recorded frames per thread (leaf-most
 *     frames are kept) and after MAX_VISITED frames examined, so that a
 *     corrupt or cyclic chain cannot hang the process; and at a frame whose
 *     instruction offset lies outside its code (which CPython never makes).
 *   - The snapshot is atomic: the Python walker lets other threads run
 *     between frames, this one does not. No "sys._current_frames" audit
 *     event is raised and no frame objects are created.
 *   - The calling thread, if not skipped, shows its caller's frame on top
 *     (the Python walker shows its own frame there).
 *   - If two thread states of the interpreter carry the same thread id (a
 *     thread that created a second thread state for itself), both stacks
 *     are counted; sys._current_frames keeps only one of them.
 *
 * The module refuses to build outside CPython 3.11-3.13 (and on
 * free-threaded builds), and refuses to import when its layout self-check
 * fails; the agent then falls back to the Python walker.
 */

/* The frame layout is in CPython's internal headers, which need
 * Py_BUILD_CORE; Py_BUILD_CORE_MODULE (which implies it) is how CPython's own
 * shared extension modules that use internals are built, and it must come
 * before Python.h so that public and internal headers agree. */
#define Py_BUILD_CORE_MODULE 1
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(PYPY_VERSION) || defined(GRAALVM_PYTHON)
#  error "agent._fastsample needs CPython; the agent uses its Python walker here"
#endif
#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#  error "agent._fastsample supports CPython 3.11-3.13 only; the agent uses its Python walker here"
#endif
#if defined(Py_LIMITED_API)
#  error "agent._fastsample reads interpreter internals and cannot use the limited API"
#endif
#if defined(Py_GIL_DISABLED)
#  error "agent._fastsample relies on the GIL; free-threaded builds use the Python walker"
#endif

#include <internal/pycore_frame.h>     /* _PyInterpreterFrame, _PyFrame_IsIncomplete */
#include <internal/pycore_runtime.h>   /* _PyRuntime (thread-list lock, debug offsets) */
#if PY_VERSION_HEX >= 0x030D0000
#  include <internal/pycore_dict.h>    /* _PyDict_SetItem_KnownHash moved here in 3.13 */
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX >= 0x030D0000
#  ifdef MS_WINDOWS
#    include <windows.h>
#  else
#    include <sched.h>
#  endif
#endif

/* Complete frames recorded per thread; deeper stacks keep the leaf-most. */
#define MAX_DEPTH 2048
/* Frames examined per thread, skipped (incomplete, C-stack) ones included. */
#define MAX_VISITED (4 * MAX_DEPTH)


/* ------------------------------------------------------------------------
 * Version-specific access to thread states and interpreter frames.
 * Everything that differs between 3.11, 3.12 and 3.13 is in this section.
 * ------------------------------------------------------------------------ */

/* The innermost frame of a thread, complete or not; NULL if none. */
static inline _PyInterpreterFrame *
thread_top_frame(PyThreadState *tstate)
{
#if PY_VERSION_HEX >= 0x030D0000
    return tstate->current_frame;
#else
    /* cframe points at the innermost _PyEval_EvalFrameDefault's C frame (or
     * at tstate->root_cframe); it is never NULL on a live thread state. */
    _PyCFrame *cframe = tstate->cframe;
    return cframe != NULL ? cframe->current_frame : NULL;
#endif
}

/* The frame's code object if the frame is one f_back and
 * sys._current_frames would show, NULL if they would skip it. */
static inline PyCodeObject *
complete_frame_code(_PyInterpreterFrame *frame)
{
#if PY_VERSION_HEX >= 0x030D0000
    /* Entry frames of the C stack hold no code object (f_executable is
     * None): test the owner before anything else, as
     * _PyFrame_IsIncomplete does. */
    if (frame->owner == FRAME_OWNED_BY_CSTACK) {
        return NULL;
    }
    PyObject *executable = frame->f_executable;
    if (executable == NULL || !PyCode_Check(executable)) {
        return NULL;     /* defensive: CPython would assert here */
    }
#else
#  if PY_VERSION_HEX >= 0x030C0000
    /* 3.12's entry frames live on the C stack, and only some of their fields
     * are set. _PyFrame_IsIncomplete finds them incomplete (their code is the
     * interpreter trampoline); say so before reading anything else. */
    if (frame->owner == FRAME_OWNED_BY_CSTACK) {
        return NULL;
    }
#  endif
    PyObject *executable = (PyObject *)frame->f_code;
    if (executable == NULL || !PyCode_Check(executable)) {
        return NULL;     /* defensive: never the case on a sane chain */
    }
#endif
    if (_PyFrame_IsIncomplete(frame)) {
        /* Not past its first RESUME yet, or a shim frame (3.12+: e.g. the
         * one that checks what a specialized __init__ call returned). */
        return NULL;
    }
    return (PyCodeObject *)executable;
}

/* What frame.f_lineno would return if it is not computed from f_lasti:
 * the line a trace function (or a jump) left in the frame object; 0 (or -1
 * on 3.13) when there is no such line or no frame object. */
static inline int
frame_lineno_field(_PyInterpreterFrame *frame)
{
    PyFrameObject *fo = frame->frame_obj;
    return fo != NULL ? fo->f_lineno : 0;
}

/* PyFrame_GetLineNumber of this version, given the frame object's field. */
static int
line_number(PyCodeObject *code, int lasti_units, int lineno_field)
{
#if PY_VERSION_HEX >= 0x030D0000
    /* 3.13: -1 means "compute once and cache"; the result is the same as
     * computing it now (the cache is not written here). */
    if (lineno_field > 0) {
        return lineno_field;
    }
#else
    if (lineno_field != 0) {
        return lineno_field;
    }
#endif
    /* _PyInterpreterFrame_GetLine / PyUnstable_InterpreterFrame_GetLine */
    return PyCode_Addr2Line(code, (int)(lasti_units * (int)sizeof(_Py_CODEUNIT)));
}


/* The runtime's thread-list lock (HEAD_LOCK in CPython). Held while thread
 * states are read, as sys._current_frames does, so that a thread state
 * cannot be unlinked and freed under us by a thread that does not hold the
 * GIL (PyThreadState_Delete does not require it). Lock order, as in
 * CPython: GIL first, then this lock. Nothing done under it waits for the
 * GIL or runs Python code. */
static void
head_lock(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    /* CPython takes it with PyMutex_LockFlags(..., _Py_LOCK_DONT_DETACH),
     * which is not exported; PyMutex_Lock would release the GIL while
     * waiting and could then deadlock re-taking it while holding this lock.
     * Take it the way PyMutex does when uncontended, and spin (yielding the
     * CPU) otherwise: holders only keep it for a few instructions and never
     * wait for the GIL. The "has parked waiters" bit is preserved, and the
     * unlock below wakes them. */
    uint8_t *bits = &_PyRuntime.interpreters.mutex._bits;
    for (;;) {
        uint8_t v = _Py_atomic_load_uint8_relaxed(bits);
        if ((v & _Py_LOCKED) == 0 &&
            _Py_atomic_compare_exchange_uint8(bits, &v, (uint8_t)(v | _Py_LOCKED))) {
            return;
        }
#  ifdef MS_WINDOWS
        SwitchToThread();
#  else
        sched_yield();
#  endif
    }
#else
    PyThread_acquire_lock(_PyRuntime.interpreters.mutex, WAIT_LOCK);
#endif
}

static void
head_unlock(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyMutex_Unlock(&_PyRuntime.interpreters.mutex);
#else
    PyThread_release_lock(_PyRuntime.interpreters.mutex);
#endif
}


/* ------------------------------------------------------------------------
 * Phase 1: the snapshot.
 * ------------------------------------------------------------------------ */

typedef struct {
    PyCodeObject *code;   /* strong reference */
    int lasti;            /* _PyInterpreterFrame_LASTI: in code units, may be < 0 */
    int lineno_field;     /* see frame_lineno_field() */
} frame_rec;

typedef struct {
    unsigned long tid;
    Py_ssize_t first;     /* index of the leaf frame in snapshot.frames */
    Py_ssize_t depth;     /* 1..MAX_DEPTH */
    Py_ssize_t pos;       /* position among the threads of its sample */
} thread_rec;

/* One sample, or (the ticker's queue, see below) several in a row: a thread
 * record with pos 0 starts a sample. */
typedef struct {
    frame_rec *frames;
    Py_ssize_t nframes, frames_cap;
    thread_rec *threads;
    Py_ssize_t nthreads, threads_cap;
    Py_ssize_t max_depth;
    Py_ssize_t nsamples;  /* snapshots taken into it, threadless ones included */
} snapshot;

/* Record `f` in `r` (a strong reference to its code): 1 if recorded, 0 if
 * the frame is one sys._current_frames would skip, -1 if it is corrupt (its
 * link to the next frame cannot be trusted either: stop the walk). */
static inline int
frame_take(_PyInterpreterFrame *f, frame_rec *r)
{
    PyCodeObject *code = complete_frame_code(f);
    if (code == NULL) {
        return 0;
    }
    int lasti = _PyInterpreterFrame_LASTI(f);
    if (lasti < -1 || lasti >= Py_SIZE(code)) {
        /* Not an offset into this code (PyCode_Addr2Line would read out of
         * bounds with it). */
        return -1;
    }
    Py_INCREF(code);
    r->code = code;
    r->lasti = lasti;
    r->lineno_field = frame_lineno_field(f);
    return 1;
}

/* Make room for one more element; -1 (no exception set) if out of memory.
 * PyMem_Realloc never runs Python code, takes no CPython lock and does not
 * release the GIL, so it is fine under the thread-list lock (CPython itself
 * allocates objects there). */
static int
reserve_one(void **buf, Py_ssize_t *cap, Py_ssize_t used, size_t elsize)
{
    if (used < *cap) {
        return 0;
    }
    Py_ssize_t ncap = *cap > 0 ? *cap : 64;
    if ((size_t)ncap > (size_t)PY_SSIZE_T_MAX / 2 / elsize) {
        return -1;
    }
    ncap *= 2;
    void *p = PyMem_Realloc(*buf, (size_t)ncap * elsize);
    if (p == NULL) {
        return -1;
    }
    *buf = p;
    *cap = ncap;
    return 0;
}

/* Drop the references a snapshot holds and free it. May run arbitrary code
 * (a code object's last reference can go here), so call it last. */
static void
snapshot_clear(snapshot *s)
{
    frame_rec *frames = s->frames;
    Py_ssize_t n = s->nframes;
    s->frames = NULL;
    s->nframes = s->frames_cap = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(frames[i].code);
    }
    PyMem_Free(frames);
    PyMem_Free(s->threads);
    s->threads = NULL;
    s->nthreads = s->threads_cap = 0;
}

/* Walk all threads of `interp`. Called with the GIL and the thread-list lock
 * held; runs no Python code. Returns -1 on allocation failure, without an
 * exception set (the caller sets it once the lock is released); what was
 * recorded so far stays in `s` and is released by snapshot_clear(). */
static int
snapshot_take(snapshot *s, PyInterpreterState *interp,
              int have_skip, unsigned long skip)
{
    Py_ssize_t pos = 0;
    s->nsamples++;
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp);
         t != NULL;
         t = PyThreadState_Next(t))
    {
        unsigned long tid = t->thread_id;
        if (have_skip && tid == skip) {
            continue;
        }
        Py_ssize_t first = s->nframes;
        Py_ssize_t depth = 0;
        int visited = 0;
        for (_PyInterpreterFrame *f = thread_top_frame(t);
             f != NULL && depth < MAX_DEPTH && visited < MAX_VISITED;
             f = f->previous, visited++)
        {
            if (reserve_one((void **)&s->frames, &s->frames_cap,
                            s->nframes, sizeof(frame_rec)) < 0) {
                return -1;
            }
            int took = frame_take(f, &s->frames[s->nframes]);
            if (took < 0) {
                break;
            }
            if (took > 0) {
                s->nframes++;
                depth++;
            }
        }
        if (depth == 0) {
            continue;   /* sys._current_frames lists no thread without a frame */
        }
        if (reserve_one((void **)&s->threads, &s->threads_cap,
                        s->nthreads, sizeof(thread_rec)) < 0) {
            return -1;
        }
        thread_rec *tr = &s->threads[s->nthreads++];
        tr->tid = tid;
        tr->first = first;
        tr->depth = depth;
        tr->pos = pos++;
        if (depth > s->max_depth) {
            s->max_depth = depth;
        }
    }
    return 0;
}


/* ------------------------------------------------------------------------
 * The location cache (see the top of the file). Per interpreter, in the
 * module state; only touched with the GIL held and never across a point
 * where Python code can run, so re-entrant calls (from new_loc, or from
 * another thread while new_loc runs) always find it consistent.
 * ------------------------------------------------------------------------ */

#define CACHE_MIN_SLOTS 1024
#define CACHE_MAX_ENTRIES (1 << 16)     /* past this, stop remembering */

typedef struct {
    uintptr_t code;
    int lasti;            /* in code units, 0 <= lasti < 2**15 */
    uint32_t gen;         /* slot in use iff gen == cache.gen */
    PyObject *loc;        /* borrowed from the dict; see cache_get() */
} cache_entry;

typedef struct {
    int enabled;          /* the version-tag self-test passed */
    PyObject *dict;       /* strong: the locs dict the entries come from */
    uint64_t version;     /* its ma_version_tag when they were valid */
    uint32_t gen;         /* bumped to forget every entry at once */
    size_t mask;          /* slots - 1, slots a power of two */
    size_t used;
    cache_entry *slots;
} loc_cache;

/* The (tid, stack) key each thread position produced in the previous
 * sample. A thread that is where it was last time (same ident, the very same
 * location objects, all exact ints) reuses that tuple and its hash: the
 * counts lookup then matches the stored key by identity, with no hashing or
 * comparing of tuples. The reused tuple is equal to the one the reference
 * would build (same items) and has the same hash (ints hash by value), so
 * the counts dict sees no difference. */
typedef struct {
    PyObject *key;        /* strong reference, or NULL */
    Py_hash_t hash;
    unsigned long tid;
} memo_entry;

typedef struct {
    loc_cache cache;
    memo_entry *memo;     /* by thread position in the last sample */
    Py_ssize_t nmemo;
} module_state;

/* Replace the memo; drops references, so call where code may run. */
static void
memo_replace(module_state *state, memo_entry *fresh, Py_ssize_t n)
{
    memo_entry *old = state->memo;
    Py_ssize_t nold = state->nmemo;
    state->memo = fresh;
    state->nmemo = n;
    for (Py_ssize_t i = 0; i < nold; i++) {
        Py_XDECREF(old[i].key);
    }
    PyMem_Free(old);
}

static inline uint64_t
dict_version(PyObject *dict)
{
    return ((PyDictObject *)dict)->ma_version_tag;
}

static inline size_t
cache_hash(uintptr_t code, int lasti)
{
    uint64_t h = ((uint64_t)code >> 4) ^ ((uint64_t)(unsigned int)lasti << 40);
    h *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 20);
}

/* Only keys that fit in 64 bits (f_lasti < 64 KiB) are remembered. */
static inline int
cacheable(int lasti_units)
{
    return lasti_units >= 0 && lasti_units < (1 << 15);
}

/* The remembered location, borrowed, or NULL. Valid only if `locs` has not
 * changed since it was remembered, which is what the version check says. */
static PyObject *
cache_get(loc_cache *c, PyObject *locs, PyCodeObject *code, int lasti)
{
    if (!c->enabled || c->slots == NULL || c->dict != locs
        || c->version != dict_version(locs) || !cacheable(lasti)) {
        return NULL;
    }
    size_t i = cache_hash((uintptr_t)code, lasti) & c->mask;
    for (size_t probes = 0; probes <= c->mask; probes++, i = (i + 1) & c->mask) {
        cache_entry *e = &c->slots[i];
        if (e->gen != c->gen) {
            return NULL;
        }
        if (e->code == (uintptr_t)code && e->lasti == lasti) {
            return e->loc;
        }
    }
    return NULL;
}

static void
cache_forget(loc_cache *c)
{
    c->used = 0;
    if (++c->gen == 0) {          /* wrapped: really clear the slots */
        if (c->slots != NULL) {
            memset(c->slots, 0, (c->mask + 1) * sizeof(cache_entry));
        }
        c->gen = 1;
    }
}

/* Insert without checks; the slot array has room. */
static void
cache_insert(loc_cache *c, uintptr_t code, int lasti, PyObject *loc)
{
    size_t i = cache_hash(code, lasti) & c->mask;
    while (c->slots[i].gen == c->gen) {
        if (c->slots[i].code == code && c->slots[i].lasti == lasti) {
            c->slots[i].loc = loc;
            return;
        }
        i = (i + 1) & c->mask;
    }
    c->slots[i].code = code;
    c->slots[i].lasti = lasti;
    c->slots[i].gen = c->gen;
    c->slots[i].loc = loc;
    c->used++;
}

/* Add an entry, growing the table; gives up quietly when full or out of memory. */
static void
cache_remember(loc_cache *c, PyCodeObject *code, int lasti, PyObject *loc)
{
    if (c->used >= CACHE_MAX_ENTRIES) {
        return;
    }
    if (c->slots == NULL || (c->used + 1) * 2 > c->mask + 1) {
        size_t nslots = c->slots == NULL ? CACHE_MIN_SLOTS : (c->mask + 1) * 2;
        cache_entry *fresh = PyMem_Calloc(nslots, sizeof(cache_entry));
        if (fresh == NULL) {
            return;
        }
        cache_entry *old = c->slots;
        size_t old_slots = old == NULL ? 0 : c->mask + 1;
        uint32_t old_gen = c->gen;
        c->slots = fresh;
        c->mask = nslots - 1;
        c->used = 0;
        c->gen = 1;
        for (size_t i = 0; i < old_slots; i++) {
            if (old[i].gen == old_gen) {
                cache_insert(c, old[i].code, old[i].lasti, old[i].loc);
            }
        }
        PyMem_Free(old);
    }
    cache_insert(c, (uintptr_t)code, lasti, loc);
}

/* Remember that locs.get(key) returned `loc` (not None), just now: no Python
 * code may have run since that lookup. Failure to remember is harmless.
 * May run arbitrary code (when it lets go of a previous dict), but only once
 * the cache is consistent again. */
static void
cache_put(loc_cache *c, PyObject *locs, PyCodeObject *code, int lasti, PyObject *loc)
{
    if (!c->enabled || !cacheable(lasti)) {
        return;
    }
    PyObject *previous = NULL;
    if (c->dict != locs) {
        previous = c->dict;
        c->dict = Py_NewRef(locs);
        c->version = dict_version(locs);
        cache_forget(c);
    }
    else if (c->version != dict_version(locs)) {
        c->version = dict_version(locs);
        cache_forget(c);
    }
    cache_remember(c, code, lasti, loc);
    Py_XDECREF(previous);
}

/* Does every kind of mutation give a dict a new version, and does a new
 * dict get one nobody had? If not, the cache stays off. */
static int
version_tags_work(void)
{
    int ok = 0;
    PyObject *d = PyDict_New(), *d2 = PyDict_New();
    PyObject *k = PyLong_FromLong(12345), *k2 = PyLong_FromLong(54321);
    PyObject *v = PyLong_FromLong(1000001), *v2 = PyLong_FromLong(1000002);
    if (d == NULL || d2 == NULL || k == NULL || k2 == NULL || v == NULL || v2 == NULL) {
        goto done;
    }
    uint64_t seen[8];
    int n = 0;
    seen[n++] = dict_version(d);
    if (PyDict_SetItem(d, k, v) < 0) goto done;           /* add */
    seen[n++] = dict_version(d);
    if (PyDict_SetItem(d, k, v2) < 0) goto done;          /* replace */
    seen[n++] = dict_version(d);
    if (PyDict_SetItem(d, k2, v) < 0) goto done;
    seen[n++] = dict_version(d);
    if (PyDict_DelItem(d, k2) < 0) goto done;             /* delete */
    seen[n++] = dict_version(d);
    PyDict_Clear(d);                                      /* clear */
    seen[n++] = dict_version(d);
    if (PyDict_SetItem(d2, k, v) < 0) goto done;
    seen[n++] = dict_version(d2);                         /* another dict */
    ok = 1;
    for (int i = 0; i < n && ok; i++) {
        for (int j = i + 1; j < n; j++) {
            if (seen[i] == seen[j]) {
                ok = 0;
                break;
            }
        }
    }
done:
    if (PyErr_Occurred()) {
        PyErr_Clear();
        ok = 0;
    }
    Py_XDECREF(d);
    Py_XDECREF(d2);
    Py_XDECREF(k);
    Py_XDECREF(k2);
    Py_XDECREF(v);
    Py_XDECREF(v2);
    return ok;
}


/* ------------------------------------------------------------------------
 * Phase 2: keys, locations and counts. May run Python code; touches only
 * the snapshot (and the cache, which is consistent at every such point).
 * ------------------------------------------------------------------------ */

/* f.f_lasti: the offset in bytes, or -1 before the first instruction. */
static inline long long
lasti_bytes(int lasti_units)
{
    return lasti_units < 0 ? -1 : (long long)lasti_units * (long long)sizeof(_Py_CODEUNIT);
}

/* (f_lasti << 48) | id(code), as the Python int the reference builds. */
static PyObject *
make_key(long long lasti, PyCodeObject *code)
{
    if (lasti >= 0 && lasti < (1LL << 16)) {
        /* Fits in 64 bits: the common case, no arithmetic on Python ints. */
        unsigned long long k = ((unsigned long long)lasti << 48)
                               | (unsigned long long)(uintptr_t)code;
        return PyLong_FromUnsignedLongLong(k);
    }
    /* Offsets past 64 KiB (huge functions) and -1: exact Python semantics. */
    PyObject *key = NULL, *shifted = NULL, *ident = NULL;
    PyObject *l = PyLong_FromLongLong(lasti);
    PyObject *s = PyLong_FromLong(48);
    if (l != NULL && s != NULL) {
        shifted = PyNumber_Lshift(l, s);
    }
    if (shifted != NULL) {
        ident = PyLong_FromVoidPtr((void *)code);   /* == id(code) */
    }
    if (ident != NULL) {
        key = PyNumber_Or(shifted, ident);
    }
    Py_XDECREF(l);
    Py_XDECREF(s);
    Py_XDECREF(shifted);
    Py_XDECREF(ident);
    return key;
}

/* locs.get(key), or new_loc(key, code, f_lasti, f_lineno) if that is None.
 * Returns a new reference, NULL with an exception set on failure. */
static PyObject *
location(loc_cache *cache, PyObject *locs, PyObject *new_loc, const frame_rec *fr)
{
    PyObject *loc = cache_get(cache, locs, fr->code, fr->lasti);   /* borrowed */
    if (loc != NULL) {
        return Py_NewRef(loc);
    }
    long long lasti = lasti_bytes(fr->lasti);
    PyObject *key = make_key(lasti, fr->code);
    if (key == NULL) {
        return NULL;
    }
    loc = PyDict_GetItemWithError(locs, key);   /* borrowed */
    if (loc != NULL && loc != Py_None) {
        Py_INCREF(loc);
        Py_DECREF(key);     /* an int: no code runs */
        cache_put(cache, locs, fr->code, fr->lasti, loc);
        return loc;
    }
    if (loc == NULL && PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    /* A location seen for the first time: the slow path. */
    PyObject *lasti_obj = PyLong_FromLongLong(lasti);
    if (lasti_obj == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    int line = line_number(fr->code, fr->lasti, fr->lineno_field);
    PyObject *line_obj = line < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(line);
    if (line_obj == NULL) {
        Py_DECREF(key);
        Py_DECREF(lasti_obj);
        return NULL;
    }
    PyObject *args[4] = {key, (PyObject *)fr->code, lasti_obj, line_obj};
    loc = PyObject_Vectorcall(new_loc, args, 4, NULL);
    Py_DECREF(key);
    Py_DECREF(lasti_obj);
    Py_DECREF(line_obj);
    return loc;
}

/* counts[k] = counts.get(k, 0) + 1, `hash` being hash(k): computed once
 * for both dict operations (the reference computes the same value twice). */
static int
increment(PyObject *counts, PyObject *k, Py_hash_t hash)
{
    PyObject *old = _PyDict_GetItem_KnownHash(counts, k, hash);   /* borrowed */
    if (old == NULL && PyErr_Occurred()) {
        return -1;
    }
    PyObject *one = PyLong_FromLong(1);     /* the cached small int */
    if (one == NULL) {
        return -1;
    }
    PyObject *new_value;
    if (old == NULL) {
        new_value = Py_NewRef(one);         /* 0 + 1 */
    }
    else {
        Py_INCREF(old);    /* the __add__ of an odd value could mutate counts */
        new_value = PyNumber_Add(old, one);
        Py_DECREF(old);
    }
    Py_DECREF(one);
    if (new_value == NULL) {
        return -1;
    }
    int rc = _PyDict_SetItem_KnownHash(counts, k, new_value, hash);
    Py_DECREF(new_value);
    return rc;
}

/* The key the thread at `pos` made last time, if this thread's stack is the
 * same: same ident, same depth, the same location objects, all exact ints. */
static PyObject *
memo_match(const module_state *state, Py_ssize_t pos, unsigned long tid,
           PyObject *const *locs, Py_ssize_t depth, Py_hash_t *hash)
{
    if (pos >= state->nmemo) {
        return NULL;
    }
    const memo_entry *m = &state->memo[pos];
    if (m->key == NULL || m->tid != tid) {
        return NULL;
    }
    PyObject *stack = PyTuple_GET_ITEM(m->key, 1);
    if (PyTuple_GET_SIZE(stack) != depth) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < depth; i++) {
        if (PyTuple_GET_ITEM(stack, i) != locs[i]) {
            return NULL;
        }
    }
    *hash = m->hash;
    return m->key;
}

/* Everything for one thread (s->threads[pos]): its stack tuple and its count. `buf` has room
 * for tr->depth references. On failure nothing is counted for this thread,
 * as in the reference (whose exception leaves the loop before `counts[k]`).
 * The key used is left in memo_out (a new reference) if it may be reused. */
static int
record_thread(module_state *state, PyObject *counts, PyObject *locs, PyObject *new_loc,
              const snapshot *s, Py_ssize_t pos, PyObject **buf, memo_entry *memo_out,
              Py_ssize_t *leaf_out)
{
    const thread_rec *tr = &s->threads[pos];
    int rc = -1;
    Py_ssize_t filled = 0;
    PyObject *stack = NULL, *tid = NULL, *k = NULL;
    Py_hash_t hash = -1;

    /* All locations first, into a C array: the tuple is built only once no
     * more Python code can run, so no half-filled tuple is ever reachable
     * (e.g. through gc.get_objects() in new_loc). */
    for (Py_ssize_t i = 0; i < tr->depth; i++) {
        PyObject *loc = location(&state->cache, locs, new_loc, &s->frames[tr->first + i]);
        if (loc == NULL) {
            goto done;
        }
        buf[filled++] = loc;
    }
    int all_ints = 1;
    for (Py_ssize_t i = 0; i < filled; i++) {
        if (!PyLong_CheckExact(buf[i])) {
            all_ints = 0;
            break;
        }
    }
    /* The leaf (stacks are leaf first) tells the activity count what the thread does. */
    *leaf_out = -1;
    if (filled > 0 && PyLong_CheckExact(buf[0])) {
        Py_ssize_t leaf = PyLong_AsSsize_t(buf[0]);
        if (leaf == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        else {
            *leaf_out = leaf;
        }
    }
    if (all_ints) {
        /* No Python code ran since the memo was read: it is the current one. */
        k = memo_match(state, tr->pos, tr->tid, buf, filled, &hash);
        Py_XINCREF(k);
    }
    if (k == NULL) {
        stack = PyTuple_New(tr->depth);
        if (stack == NULL) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < filled; i++) {
            PyTuple_SET_ITEM(stack, i, buf[i]);   /* steals */
        }
        filled = 0;
        tid = PyLong_FromUnsignedLong(tr->tid);
        if (tid == NULL) {
            goto done;
        }
        k = PyTuple_Pack(2, tid, stack);
        if (k == NULL) {
            goto done;
        }
        hash = PyObject_Hash(k);
        if (hash == -1) {
            goto done;
        }
    }
    if (all_ints) {
        memo_out->key = Py_NewRef(k);
        memo_out->hash = hash;
        memo_out->tid = tr->tid;
    }
    rc = increment(counts, k, hash);

done:
    for (Py_ssize_t i = 0; i < filled; i++) {
        Py_DECREF(buf[i]);
    }
    Py_XDECREF(stack);
    Py_XDECREF(tid);
    Py_XDECREF(k);
    return rc;
}


/* Phase 2 for every sample in `s`, in order. The memo follows the samples:
 * each thread position is matched against the same position in the sample
 * before. Returns -1 with an exception set if a thread could not be
 * recorded (new_loc raised, no memory): the samples before it stay counted.
 * Leaves `s` to the caller, who must clear it. */
/* Optional: how many threads were active in each sample. A thread is active
 * unless its leaf location is marked in `waiting` (one byte per location id:
 * 0 undecided, 1 runs, 2 waits; the agent decides them as it learns them).
 * hist[k] counts the samples with k active threads (the last slot takes k
 * and more). Threads without Python frames are not counted. */
typedef struct {
    const unsigned char *waiting;
    Py_ssize_t nwaiting;
    PyObject *hist;   /* a list of ints, or NULL: no histogram */
    PyObject *pending;   /* a list: samples with an undecided leaf go here */
} activity;

/* The bytes of `waiting`: a leaf not yet decided (0, or past the end) makes
 * its sample pending, since counting it either way would be a guess (the
 * first samples of a run are all new leaves). */
#define LEAF_UNDECIDED 0
#define LEAF_WAITS 2

/* One sample's end: into the histogram, or, if a leaf is undecided, its
 * leaves as a tuple into `pending` for the agent to count once it has
 * decided them. */
static int activity_add(const activity *act, Py_ssize_t active);

static int
activity_end_sample(const activity *act, Py_ssize_t active, int undecided,
                    const Py_ssize_t *leaves, Py_ssize_t nleaves)
{
    if (!undecided) {
        return activity_add(act, active);
    }
    PyObject *t = PyTuple_New(nleaves);
    if (t == NULL) {
        return -1;
    }
    for (Py_ssize_t j = 0; j < nleaves; j++) {
        PyObject *v = PyLong_FromSsize_t(leaves[j]);
        if (v == NULL) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, j, v);
    }
    int rc = PyList_Append(act->pending, t);
    Py_DECREF(t);
    return rc;
}

static int
activity_add(const activity *act, Py_ssize_t active)
{
    Py_ssize_t n = PyList_GET_SIZE(act->hist);
    if (n == 0) {
        return 0;
    }
    if (active >= n) {
        active = n - 1;
    }
    PyObject *old = PyList_GET_ITEM(act->hist, active);
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL) {
        return -1;
    }
    PyObject *sum = PyNumber_Add(old, one);
    Py_DECREF(one);
    if (sum == NULL) {
        return -1;
    }
    PyList_SetItem(act->hist, active, sum);   /* steals, drops old */
    return 0;
}

static int
record_snapshot(module_state *state, PyObject *counts, PyObject *locs, PyObject *new_loc,
                const snapshot *s, const activity *act)
{
    int rc = -1;
    Py_ssize_t active = 0, nleaves = 0;
    int in_sample = 0, undecided = 0;
    Py_ssize_t *leaves = NULL;
    PyObject **buf = NULL;
    memo_entry *memo_next = NULL;
    Py_ssize_t nmemo_next = 0;
    if (s->nthreads > 0) {
        buf = PyMem_New(PyObject *, (size_t)s->max_depth);
        if (act != NULL) {
            leaves = PyMem_New(Py_ssize_t, (size_t)s->nthreads);
        }
        if (buf == NULL || (act != NULL && leaves == NULL)) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < s->nthreads; i++) {
        if (s->threads[i].pos == 0) {
            if (act != NULL && in_sample
                    && activity_end_sample(act, active, undecided, leaves, nleaves) < 0) {
                goto done;
            }
            active = 0;
            nleaves = 0;
            undecided = 0;
            in_sample = 1;
            /* A new sample: the previous one's keys become the memo. */
            if (memo_next != NULL) {
                memo_replace(state, memo_next, nmemo_next);
                memo_next = NULL;
            }
            Py_ssize_t n = 1;
            while (i + n < s->nthreads && s->threads[i + n].pos != 0) {
                n++;
            }
            memo_next = PyMem_Calloc((size_t)n, sizeof(memo_entry));
            if (memo_next == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            nmemo_next = n;
        }
        if (memo_next == NULL || s->threads[i].pos >= nmemo_next) {
            PyErr_SetString(PyExc_SystemError, "agent._fastsample: malformed snapshot");
            goto done;
        }
        Py_ssize_t leaf = -1;
        if (record_thread(state, counts, locs, new_loc, s, i, buf,
                          &memo_next[s->threads[i].pos], &leaf) < 0) {
            goto done;
        }
        if (act != NULL && leaf >= 0 && s->threads[i].depth > 0) {
            leaves[nleaves++] = leaf;
            if (leaf >= act->nwaiting || act->waiting[leaf] == LEAF_UNDECIDED) {
                undecided = 1;
            }
            else if (act->waiting[leaf] != LEAF_WAITS) {
                active++;
            }
        }
    }
    if (act != NULL && in_sample
            && activity_end_sample(act, active, undecided, leaves, nleaves) < 0) {
        goto done;
    }
    rc = 0;

done:
    PyMem_Free(buf);
    PyMem_Free(leaves);
    if (memo_next != NULL) {
        /* Can run code (old keys go): keep a pending exception across it. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        memo_replace(state, memo_next, nmemo_next);
        PyErr_Restore(type, value, tb);
    }
    return rc;
}


/* record_snapshot, then release the snapshot: last, since dropping the code
 * objects' references can run arbitrary code; a pending exception is kept
 * across it. */
static int
record_and_clear(module_state *state, PyObject *counts, PyObject *locs, PyObject *new_loc,
                 snapshot *s, const activity *act)
{
    int rc = record_snapshot(state, counts, locs, new_loc, s, act);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    snapshot_clear(s);
    PyErr_Restore(type, value, tb);
    return rc;
}


/* The optional (waiting, hist, pending) arguments of sample() and ticker_drain().
 * On success `view` holds the buffer (release with activity_release). */
static int
activity_parse(PyObject *waiting, PyObject *hist, PyObject *pending, activity *act, Py_buffer *view)
{
    if (!PyList_CheckExact(pending)) {
        PyErr_Format(PyExc_TypeError, "pending must be a list, not %.100s", Py_TYPE(pending)->tp_name);
        return -1;
    }
    if (!PyList_CheckExact(hist)) {
        PyErr_Format(PyExc_TypeError, "hist must be a list, not %.100s", Py_TYPE(hist)->tp_name);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(hist); i++) {
        if (!PyLong_Check(PyList_GET_ITEM(hist, i))) {
            PyErr_SetString(PyExc_TypeError, "hist must hold ints");
            return -1;
        }
    }
    if (PyObject_GetBuffer(waiting, view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    act->waiting = (const unsigned char *)view->buf;
    act->nwaiting = view->len;
    act->hist = hist;
    act->pending = pending;
    return 0;
}

/* ------------------------------------------------------------------------
 * sample()
 * ------------------------------------------------------------------------ */

PyDoc_STRVAR(sample_doc,
"sample(counts, locs, new_loc, skip_ident, [waiting, hist, pending,] /) -> None\n"
"\n"
"Record one snapshot of every thread's Python stack, exactly as\n"
"agent.core.Agent._sample_python does, without creating frame objects.\n"
"\n"
"counts: dict[(thread_ident, tuple[location, ...])] -> int, incremented.\n"
"locs: dict[int, location], key = (f_lasti << 48) | id(code).\n"
"new_loc: called as new_loc(key, code, f_lasti, f_lineno) for a key whose\n"
"    location is missing or None; its result is used as the location.\n"
"    Exceptions propagate; threads already recorded stay counted.\n"
"skip_ident: thread ident to leave out (the sampler's own), or None.\n"
"waiting, hist, pending: optional; waiting is a bytes-like object with one\n"
"    byte per location id (0 or past its end: undecided, 2: a leaf there is\n"
"    waiting, anything else: active), and hist[k] += 1 for a sample with k\n"
"    active threads (the last slot takes k and more). A sample with an\n"
"    undecided leaf is appended to the list pending instead, as the tuple\n"
"    of its threads' leaf locations.");

static PyObject *
fastsample_sample(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 && nargs != 7) {
        PyErr_Format(PyExc_TypeError,
                     "sample() takes 4 or 7 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *counts = args[0], *locs = args[1], *new_loc = args[2], *skip_obj = args[3];
    if (!PyDict_CheckExact(counts)) {
        PyErr_Format(PyExc_TypeError, "counts must be a dict, not %.100s",
                     Py_TYPE(counts)->tp_name);
        return NULL;
    }
    if (!PyDict_CheckExact(locs)) {
        PyErr_Format(PyExc_TypeError, "locs must be a dict, not %.100s",
                     Py_TYPE(locs)->tp_name);
        return NULL;
    }
    int have_skip = 0;
    unsigned long skip = 0;
    if (skip_obj != Py_None) {
        if (!PyLong_Check(skip_obj)) {
            PyErr_Format(PyExc_TypeError, "skip_ident must be an int or None, not %.100s",
                         Py_TYPE(skip_obj)->tp_name);
            return NULL;
        }
        skip = PyLong_AsUnsignedLong(skip_obj);
        if (skip == (unsigned long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                return NULL;
            }
            PyErr_Clear();    /* negative or too large: equal to no thread ident */
        }
        else {
            have_skip = 1;
        }
    }

    module_state *state = PyModule_GetState(module);
    if (state == NULL) {
        return NULL;
    }
    PyThreadState *me = PyThreadState_Get();
    PyInterpreterState *interp = me->interp;

    activity act;
    Py_buffer view = {0};
    if (nargs == 7 && activity_parse(args[4], args[5], args[6], &act, &view) < 0) {
        return NULL;
    }

    /* Phase 1 */
    snapshot s = {0};
    head_lock();
    int taken = snapshot_take(&s, interp, have_skip, skip);
    head_unlock();

    /* Phase 2 */
    if (taken < 0) {
        snapshot_clear(&s);
        if (nargs == 7) {
            PyBuffer_Release(&view);
        }
        return PyErr_NoMemory();
    }
    int rc = record_and_clear(state, counts, locs, new_loc, &s, nargs == 7 ? &act : NULL);
    if (nargs == 7) {
        PyBuffer_Release(&view);
    }
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}


/* ------------------------------------------------------------------------
 * The ticker: sampling inside the thread that holds the GIL.
 *
 * A sampler that is a Python thread must take the GIL for every sample.
 * Behind a busy application thread that costs far more than the walk: the
 * application thread is asked to drop the GIL, the sampler's OS thread is
 * woken on another CPU, walks, drops the GIL, and the application thread is
 * woken again; on a virtual machine those two cross-CPU wake-ups cost the
 * application about a millisecond per sample, and the sampler waits up to
 * the switch interval (5 ms) for its turn, which caps the rate.
 *
 * The ticker avoids all of it. It is a native thread that never touches the
 * GIL: at each planned instant it queues a pending call
 * (_PyEval_AddPendingCall, the mechanism signal handlers use), and whichever
 * thread holds the GIL runs it at its next eval-breaker check (a call or a
 * backward jump, microseconds away). That call takes phase 1 of a sample
 * (the snapshot: a few increfs per frame, no Python code, nothing that can
 * release the GIL) into a queue, and returns. The application thread loses
 * exactly the snapshot's time, measured with its own CPU clock. Phase 2
 * (locations, tuples, counts) runs later, batched, on the agent's thread
 * (ticker_drain), where the agent charges it.
 *
 * When no thread runs bytecode (the process is idle in C), a pending call
 * would wait. The ticker then takes the sample itself, with the GIL and a
 * thread state of its own (ticker_serve_self): with the GIL free that costs
 * the application nothing. But a free GIL is also the moment of a hand-off
 * between busy threads, so the ticker first gives the pending call
 * SELF_SERVE_AFTER_S to be served. While one thread holds the GIL in a long
 * C call the pending call waits, and serves the tick when the call returns.
 * Each tick is served once, by whichever gets there first. The agent's thread is woken (a byte on its wake pipe) only to
 * drain a long queue.
 *
 * CPython 3.11 runs pending calls only on the main thread, and a pending
 * call added from another thread does not even raise the eval breaker
 * there. So on 3.11 the ticker queues one only while the main thread holds
 * the GIL, and raises the breaker itself; otherwise it takes the sample
 * itself, paying (and charging) a GIL hand-off when another thread held it.
 *
 * A token bucket here mirrors the agent's budget guard between two of the
 * agent's wake-ups, so a sudden rise in the cost of a sample (many new
 * threads) cannot overspend before the agent looks: the agent sets the
 * tokens and the rate, every snapshot pays its measured cost, and the
 * ticker waits while the bucket cannot pay for the next one.
 * ------------------------------------------------------------------------ */

#if defined(__linux__)
#  define HAVE_TICKER 1
#  if PY_VERSION_HEX >= 0x030D0000
#    define _Py_IsFinalizing Py_IsFinalizing
#  endif
#  include <internal/pycore_ceval.h>     /* _PyEval_AddPendingCall */
#  if PY_VERSION_HEX < 0x030C0000
#    include <internal/pycore_interp.h>  /* interp->ceval.eval_breaker */
#  endif
#  include <errno.h>
#  include <math.h>
#  include <pthread.h>
#  include <signal.h>
#  include <time.h>
#  include <unistd.h>
#else
#  define HAVE_TICKER 0
#endif

#if HAVE_TICKER

/* Bounds on the queue of snapshots waiting for phase 2: past them a tick is
 * dropped (and counted) until the agent drains. */
#define QUEUE_MAX_SAMPLES 4096
#define QUEUE_MAX_FRAMES (1 << 20)
/* The agent is asked to drain once this many snapshots wait. */
#define QUEUE_DRAIN_AT 512
/* Waiting longer than this for the GIL means someone held it. */
#define HANDOFF_MIN_S 50e-6
/* After a hand-off, the ticker waits at most this long to see the thread it
 * took the GIL from take it back (see ticker_serve_self). */
#define HANDOFF_SPIN_MAX_S 2e-3
/* Ticks over which the least wake-up lateness is taken. */
#define LATENCY_WINDOW 32
/* A tick that finds the GIL free queues its pending call all the same, and
 * the ticker serves it itself only if nobody has this long after. A free GIL
 * is often a hand-off between busy threads (the dropper has let go, the
 * next has not woken yet): taking it then made the ticker one more thread in
 * the queue for the GIL, and on this VM each such turn cost the application
 * about half a millisecond (cpu-4 lost 10.6% to sampling charged at 3.1%).
 * The new holder serves the pending call within microseconds instead; a
 * process idle in C leaves it, and is sampled this much later. */
#define SELF_SERVE_AFTER_S 1e-3

typedef struct {
    /* Set by ticker_start, read-only while the thread runs. */
    PyInterpreterState *interp;
    unsigned long skip;           /* the agent's thread: never sampled */
    int wake_fd;                  /* write end of the agent's wake pipe */
#if PY_VERSION_HEX < 0x030C0000
    PyThreadState *main_tstate;   /* compared, never dereferenced, off the GIL */
#endif
    pthread_t thread;
    int running;                  /* started and not joined; GIL-protected */

    /* Guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    uint64_t gen;                 /* bumped when the parameters change */
    double mean_s, spread;        /* mean delay between ticks (0: paused), relative sd */
    double rate;                  /* bucket: seconds of cost allowed per second */
    double tokens, cap;           /* bucket: seconds available now, at most */
    double tokens_at;             /* when tokens was last brought up to date */
    double cost_s;                /* expected cost of one snapshot (moving average) */
    double latency_s;             /* moving average of how late the ticker wakes */
    double latency_floor_s;       /* the least lateness in the last window */
    double lat_min;
    int lat_n;
    uint64_t rng;

    /* Shared with GIL holders through atomics. */
    uint64_t posted;              /* ticks asked for */
    uint64_t busy;                /* ticks that found the GIL held */
    uint64_t served;              /* the last tick served */
    int queued;                   /* a pending call of ours waits in the interpreter */
    /* What snapshots in application threads cost, for the bucket: added
     * without mu, so a GIL holder never blocks on the ticker (a wait on mu
     * there is a futex sleep with the GIL held). Folded in under mu. */
    uint64_t app_cost_ns, app_snapshots;
    uint64_t folded_ns, folded_snapshots;   /* under mu */

    /* The ticker thread's own thread state, for the samples it takes itself. */
    PyThreadState *tstate;
    PyGILState_STATE gilstate;
    double handoff_s;             /* estimated cost of GIL hand-offs (under mu) */
    double spin_cpu_s;            /* ticker CPU spent watching hand-offs end, in handoff_s already (under mu) */
    /* The ticker thread's CPU time when it ended: its clock goes with it, and
     * the last report must still charge what it spent (not refund it). */
    double exit_cpu_s;

    /* GIL-protected. */
    snapshot queue;
    double app_cpu_s;             /* snapshot time taken from application threads */
    uint64_t in_thread, by_ticker, dropped, failed;
} ticker_state;

static ticker_state ticker = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .wake_fd = -1,
};
static int ticker_cv_ready = 0;

static double
mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double
thread_cpu_now(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
        return 0.0;
    }
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* xorshift64*, then Box-Muller: a gaussian delay around the mean, as the
 * agent's own loop draws them (DYPER section 4: never lock step with a
 * periodic application). Under mu. */
static double
ticker_uniform(void)
{
    uint64_t x = ticker.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    ticker.rng = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}

static double
ticker_delay(void)
{
    double u1 = ticker_uniform(), u2 = ticker_uniform();
    if (u1 < 1e-12) {
        u1 = 1e-12;
    }
    double g = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    double d = ticker.mean_s * (1.0 + ticker.spread * g);
    double floor = ticker.mean_s * 0.1;
    return d < floor ? floor : d;
}

/* Under mu: the snapshots application threads took since the last fold
 * pay the bucket, and their mean cost moves the expected one. */
static void
bucket_fold(void)
{
    uint64_t n = __atomic_load_n(&ticker.app_snapshots, __ATOMIC_ACQUIRE);
    uint64_t ns = __atomic_load_n(&ticker.app_cost_ns, __ATOMIC_RELAXED);
    if (n == ticker.folded_snapshots) {
        return;
    }
    double cost = (double)(ns - ticker.folded_ns) * 1e-9;
    double mean = cost / (double)(n - ticker.folded_snapshots);
    ticker.tokens -= cost;
    ticker.cost_s += 0.1 * (mean - ticker.cost_s);
    ticker.folded_ns = ns;
    ticker.folded_snapshots = n;
}

/* Under mu. */
static void
bucket_accrue(double now)
{
    bucket_fold();
    double elapsed = now - ticker.tokens_at;
    if (elapsed > 0) {
        ticker.tokens += elapsed * ticker.rate;
        if (ticker.tokens > ticker.cap) {
            ticker.tokens = ticker.cap;
        }
    }
    ticker.tokens_at = now;
}

static void
wake_agent(void)
{
    int fd = __atomic_load_n(&ticker.wake_fd, __ATOMIC_ACQUIRE);
    if (fd >= 0) {
        char c = 't';
        ssize_t rc = write(fd, &c, 1);   /* non-blocking; a full pipe wakes it already */
        (void)rc;
    }
}

/* Is the GIL held by anyone? A relaxed read: a hint, not a lock. */
static int
gil_locked(PyInterpreterState *interp)
{
#if PY_VERSION_HEX >= 0x030D0000
    return _Py_atomic_load_int_relaxed(&interp->ceval.gil->locked);
#elif PY_VERSION_HEX >= 0x030C0000
    return _Py_atomic_load_relaxed(&interp->ceval.gil->locked);
#else
    (void)interp;
    return _Py_atomic_load_relaxed(&_PyRuntime.ceval.gil.locked);
#endif
}

/* Take the snapshot for the tick in flight, if it is still unserved. Called
 * with the GIL held, from the pending call or by the ticker itself.
 * Returns 1 if it took one. Runs no Python code. */
static int
serve_tick(int in_app_thread)
{
    uint64_t posted = __atomic_load_n(&ticker.posted, __ATOMIC_ACQUIRE);
    if (ticker.served >= posted) {
        return 0;
    }
    __atomic_store_n(&ticker.served, posted, __ATOMIC_RELEASE);
    if (ticker.queue.nsamples >= QUEUE_MAX_SAMPLES || ticker.queue.nframes >= QUEUE_MAX_FRAMES) {
        ticker.dropped++;
        wake_agent();
        return 0;
    }
    double t0 = in_app_thread ? thread_cpu_now() : 0.0;
    head_lock();
    int rc = snapshot_take(&ticker.queue, ticker.interp, 1, ticker.skip);
    head_unlock();
    if (rc < 0) {
        ticker.failed++;    /* out of memory: what was taken stays queued */
    }
    if (in_app_thread) {
        double cost = thread_cpu_now() - t0;
        ticker.app_cpu_s += cost;
        ticker.in_thread++;
        __atomic_add_fetch(&ticker.app_cost_ns, (uint64_t)(cost > 0 ? cost * 1e9 : 0.0), __ATOMIC_RELAXED);
        __atomic_add_fetch(&ticker.app_snapshots, 1, __ATOMIC_RELEASE);
    }
    else {
        ticker.by_ticker++;
    }
    if (ticker.queue.nsamples == QUEUE_DRAIN_AT) {
        wake_agent();
    }
    return 1;
}

/* The pending call. Runs in whichever thread holds the GIL and reaches an
 * eval-breaker check; must never fail (an error here would surface in the
 * application), so it always returns 0. */
static int
ticker_pending_call(void *arg)
{
    (void)arg;
    __atomic_store_n(&ticker.queued, 0, __ATOMIC_RELEASE);
    if (_Py_IsFinalizing()) {
        return 0;
    }
    PyThreadState *me = PyThreadState_Get();
    if (me->interp != ticker.interp) {
        return 0;
    }
    serve_tick(me->thread_id != ticker.skip);
    return 0;
}

/* Ask for one sample. Returns 0 if a pending call will take it, 1 if the
 * ticker must take it itself, 2 if a pending call was queued while the GIL
 * was free: the ticker takes the sample itself if nobody has served it
 * SELF_SERVE_AFTER_S later. Called on the ticker thread, without mu. */
static int
ticker_tick(void)
{
    __atomic_add_fetch(&ticker.posted, 1, __ATOMIC_ACQ_REL);
#if PY_VERSION_HEX >= 0x030C0000
    int held = gil_locked(ticker.interp);
    if (__atomic_load_n(&ticker.queued, __ATOMIC_ACQUIRE)) {
        /* The last pending call has not run: nobody reached an eval-breaker
         * check for a whole period. With the GIL held (one long C call, or
         * a holder the OS has not run), the call serves this tick when the
         * holder gets to it; taking the sample ourselves would only wait for
         * the same moment, and cost a hand-off. With the GIL free, idle in C
         * or a hand-off under way: look again shortly. */
        if (held) {
            __atomic_add_fetch(&ticker.busy, 1, __ATOMIC_RELAXED);
            return 0;
        }
        return 2;
    }
    if (held) {
        __atomic_add_fetch(&ticker.busy, 1, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&ticker.queued, 1, __ATOMIC_RELEASE);
#  if PY_VERSION_HEX >= 0x030D0000
    int rc = _PyEval_AddPendingCall(ticker.interp, ticker_pending_call, NULL, 0)
             == _Py_ADD_PENDING_SUCCESS ? 0 : -1;
#  else
    int rc = _PyEval_AddPendingCall(ticker.interp, ticker_pending_call, NULL, 0);
#  endif
    if (rc != 0) {
        __atomic_store_n(&ticker.queued, 0, __ATOMIC_RELEASE);
        return 1;
    }
    return held ? 0 : 2;
#else
    if (__atomic_load_n(&ticker.queued, __ATOMIC_ACQUIRE)) {
        /* The last pending call has not run: the main thread reached no
         * eval-breaker check for a whole period (idle in C, or one long C call). */
        if (gil_locked(ticker.interp)) {
            __atomic_add_fetch(&ticker.busy, 1, __ATOMIC_RELAXED);
        }
        return 1;
    }
    if (!gil_locked(ticker.interp)) {
        return 1;          /* idle in C: the GIL is free, no hand-off to pay */
    }
    __atomic_add_fetch(&ticker.busy, 1, __ATOMIC_RELAXED);
    /* 3.11: only the main thread runs pending calls. */
    PyThreadState *holder = (PyThreadState *)_Py_atomic_load_relaxed(&_PyRuntime.gilstate.tstate_current);
    if (ticker.main_tstate == NULL || holder != ticker.main_tstate) {
        return 1;
    }
    __atomic_store_n(&ticker.queued, 1, __ATOMIC_RELEASE);
    if (_PyEval_AddPendingCall(ticker.interp, ticker_pending_call, NULL) != 0) {
        __atomic_store_n(&ticker.queued, 0, __ATOMIC_RELEASE);
        return 1;
    }
    /* Adding it from a thread that cannot run it leaves the breaker down
     * (COMPUTE_EVAL_BREAKER asks the calling thread); raise it for the
     * main thread, which recomputes it once the call has run. */
    _Py_atomic_store_relaxed(&ticker.interp->ceval.eval_breaker, 1);
    return 0;
#endif
}

/* The ticker takes the sample itself, with the GIL: its own thread state is
 * made on first need and kept. Waiting for the GIL here costs the
 * application nothing while the GIL is free; when another thread held it
 * (inside C, or on 3.11 a thread other than the main one), that thread
 * waits for us on its way back: charged as the time we held it plus two
 * wake-ups, ours and its own. Its own is measured: after letting go, the
 * ticker watches for the GIL to be taken again (at most HANDOFF_SPIN_MAX_S,
 * on its own core). Ours is taken to be as long. Both used to be the least
 * wake-up latency the ticker had seen lately; on this VM a thread woken on a
 * core that had gone idle takes several times that (3.11, one busy worker
 * thread sampled 88 times a second, lost 4.4% against 0.9% charged). The
 * ticker's CPU time is charged as a whole (ticker_stats), less the watching,
 * which the hand-off's charge already holds. */
static void
ticker_serve_self(void)
{
    if (_Py_IsFinalizing()) {
        return;
    }
    if (ticker.tstate == NULL) {
        PyGILState_STATE g = PyGILState_Ensure();
        ticker.gilstate = g;
        ticker.tstate = PyEval_SaveThread();
    }
    double t0 = mono_now();
    int contended = gil_locked(ticker.interp);
    PyEval_RestoreThread(ticker.tstate);
    double t1 = mono_now();
    serve_tick(0);
    double held = mono_now() - t1;
    ticker.tstate = PyEval_SaveThread();
    int handoff = contended && t1 - t0 > HANDOFF_MIN_S;
    double back = 0.0, spin_cpu = 0.0;
    if (handoff) {
        double c0 = thread_cpu_now(), r0 = mono_now(), now = r0;
        while (!gil_locked(ticker.interp) && now - r0 < HANDOFF_SPIN_MAX_S) {
            now = mono_now();
        }
        back = now - r0;
        spin_cpu = thread_cpu_now() - c0;
        if (back >= HANDOFF_SPIN_MAX_S) {
            back = 0.0;   /* nobody was waiting for it: no wake-up to charge */
        }
    }
    pthread_mutex_lock(&ticker.mu);
    ticker.tokens -= held;
    if (handoff) {
        double wake = back > ticker.latency_floor_s ? back : ticker.latency_floor_s;
        double cost = held + 2.0 * wake;
        ticker.handoff_s += cost;
        ticker.tokens -= cost;
        ticker.spin_cpu_s += spin_cpu > 0.0 ? spin_cpu : 0.0;
    }
    pthread_mutex_unlock(&ticker.mu);
}

/* On the ticker thread, as it ends: give its thread state back. */
static void
ticker_release_tstate(void)
{
    if (ticker.tstate != NULL && !_Py_IsFinalizing()) {
        PyEval_RestoreThread(ticker.tstate);
        ticker.tstate = NULL;
        PyGILState_Release(ticker.gilstate);
    }
}

static void *
ticker_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&ticker.mu);
    uint64_t gen = ticker.gen;
    double next = mono_now() + (ticker.mean_s > 0 ? ticker_delay() : 0.0);
    /* A tick queued on a free GIL: when to look whether anybody served it. */
    double check_at = INFINITY;
    uint64_t check_tick = 0;
    while (!ticker.stop) {
        double wake_at = ticker.mean_s > 0 ? next : mono_now() + 3600.0;
        if (check_at < wake_at) {
            wake_at = check_at;
        }
        struct timespec ts;
        ts.tv_sec = (time_t)wake_at;
        ts.tv_nsec = (long)((wake_at - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        int rc = pthread_cond_timedwait(&ticker.cv, &ticker.mu, &ts);
        if (ticker.stop) {
            break;
        }
        double now = mono_now();
        if (now >= check_at) {
            check_at = INFINITY;
            if (__atomic_load_n(&ticker.served, __ATOMIC_ACQUIRE) < check_tick
                && __atomic_load_n(&ticker.posted, __ATOMIC_ACQUIRE) == check_tick) {
                /* Nobody ran bytecode since: idle in C. Sample it ourselves. */
                pthread_mutex_unlock(&ticker.mu);
                ticker_serve_self();
                pthread_mutex_lock(&ticker.mu);
            }
            continue;
        }
        if (ticker.gen != gen) {
            gen = ticker.gen;
            /* New tokens or a new delay. A tick already due sooner than the new
             * delay would bring it stays where it is: the agent sets tokens at
             * every wake-up, and when it woke more often than the delay (a
             * collector's own passes), restarting the delay each time meant no
             * tick ever came. */
            double fresh = now + (ticker.mean_s > 0 ? ticker_delay() : 0.0);
            if (!(next > now && next < fresh)) {
                next = fresh;
            }
            continue;
        }
        if (rc != ETIMEDOUT || now < wake_at || ticker.mean_s <= 0) {
            continue;    /* spurious, or paused */
        }
        double late = now - wake_at;
        ticker.latency_s += 0.1 * (late - ticker.latency_s);
        /* The floor: the least lateness of the last LATENCY_WINDOW ticks, what
         * a wake-up costs when no other thread keeps the CPU busy. */
        if (late < ticker.lat_min) {
            ticker.lat_min = late;
        }
        if (++ticker.lat_n >= LATENCY_WINDOW) {
            ticker.latency_floor_s = ticker.lat_min;
            ticker.lat_min = 1e9;
            ticker.lat_n = 0;
        }
        bucket_accrue(now);
        if (ticker.tokens < ticker.cost_s) {
            /* Over budget until the bucket refills (or the agent, waking up,
             * sets new tokens: gen changes and the wait ends). */
            double wait = ticker.rate > 0 ? (ticker.cost_s - ticker.tokens) / ticker.rate : 1.0;
            next = now + (wait < 3600.0 ? wait : 3600.0);
            continue;
        }
        next = now + ticker_delay();
        pthread_mutex_unlock(&ticker.mu);
        int how = ticker_tick();
        if (how == 1) {
            ticker_serve_self();
        }
        pthread_mutex_lock(&ticker.mu);
        if (how == 2) {
            check_at = mono_now() + SELF_SERVE_AFTER_S;
            check_tick = __atomic_load_n(&ticker.posted, __ATOMIC_ACQUIRE);
        }
    }
    pthread_mutex_unlock(&ticker.mu);
    ticker_release_tstate();
    ticker.exit_cpu_s = thread_cpu_now();  /* read after the join, in ticker_stats */
    return NULL;
}

static void
ticker_after_fork_child(void)
{
    /* Only the forking thread survives in the child: no ticker thread, and
     * mu may have been held by it. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    ticker.mu = fresh;
    ticker_cv_ready = 0;
    ticker.running = 0;
    ticker.stop = 0;
    ticker.queued = 0;
    ticker.wake_fd = -1;
    ticker.tstate = NULL;     /* deleted by the child's PyOS_AfterFork_Child */
}

static int
ticker_init_cv(void)
{
    if (ticker_cv_ready) {
        return 0;
    }
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) {
        return -1;
    }
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0) {
        rc = pthread_cond_init(&ticker.cv, &attr);
    }
    pthread_condattr_destroy(&attr);
    if (rc != 0) {
        return -1;
    }
    ticker_cv_ready = 1;
    return 0;
}

PyDoc_STRVAR(ticker_start_doc,
"ticker_start(skip_ident, wake_fd, /) -> None\n"
"\n"
"Start the ticker thread, paused until ticker_set() gives it a delay.\n"
"skip_ident: the calling (agent) thread, never sampled; wake_fd: the write\n"
"end of a non-blocking pipe the agent polls, written when the queue should\n"
"be drained (ticker_drain).");

static PyObject *
fastsample_ticker_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "ticker_start() takes exactly 2 arguments");
        return NULL;
    }
    unsigned long skip = PyLong_AsUnsignedLong(args[0]);
    if (skip == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    long fd_long = PyLong_AsLong(args[1]);
    if (fd_long == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (fd_long < 0 || fd_long > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "wake_fd must be a file descriptor");
        return NULL;
    }
    int fd = (int)fd_long;
    if (ticker.running) {
        PyErr_SetString(PyExc_RuntimeError, "the ticker is already running");
        return NULL;
    }
    if (ticker_init_cv() < 0) {
        PyErr_SetString(PyExc_OSError, "could not set up the ticker's condition variable");
        return NULL;
    }
    static int atfork_done = 0;
    if (!atfork_done) {
        if (pthread_atfork(NULL, NULL, ticker_after_fork_child) != 0) {
            PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
            return NULL;
        }
        atfork_done = 1;
    }
    if (ticker.queue.nsamples > 0 || ticker.queue.nframes > 0) {
        /* Left from an earlier run (or, after a fork, the parent's). */
        snapshot stale = ticker.queue;
        memset(&ticker.queue, 0, sizeof(ticker.queue));
        snapshot_clear(&stale);
    }
    /* Counters start afresh with each run. */
    ticker.app_cpu_s = 0.0;
    ticker.handoff_s = 0.0;
    ticker.spin_cpu_s = 0.0;
    ticker.exit_cpu_s = 0.0;
    ticker.in_thread = ticker.by_ticker = ticker.dropped = ticker.failed = 0;
    PyThreadState *me = PyThreadState_Get();
    ticker.interp = me->interp;
    ticker.skip = skip;
#if PY_VERSION_HEX < 0x030C0000
    ticker.main_tstate = NULL;
    head_lock();
    for (PyThreadState *t = PyInterpreterState_ThreadHead(me->interp); t != NULL; t = PyThreadState_Next(t)) {
        if (t->thread_id == _PyRuntime.main_thread) {
            ticker.main_tstate = t;
        }
    }
    head_unlock();
#endif
    pthread_mutex_lock(&ticker.mu);
    ticker.stop = 0;
    ticker.mean_s = 0.0;
    ticker.spread = 0.25;
    ticker.rate = 0.0;
    ticker.tokens = 0.0;
    ticker.cap = 0.0;
    ticker.tokens_at = mono_now();
    ticker.cost_s = 10e-6;
    ticker.folded_ns = __atomic_load_n(&ticker.app_cost_ns, __ATOMIC_RELAXED);
    ticker.folded_snapshots = __atomic_load_n(&ticker.app_snapshots, __ATOMIC_ACQUIRE);
    ticker.latency_s = 0.0;
    ticker.latency_floor_s = 100e-6;   /* until the first window is in */
    ticker.lat_min = 1e9;
    ticker.lat_n = 0;
    ticker.rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uintptr_t)&ticker ^ (uint64_t)getpid();
    if (ticker.rng == 0) {
        ticker.rng = 88172645463325252ULL;
    }
    __atomic_store_n(&ticker.wake_fd, fd, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ticker.mu);
    __atomic_store_n(&ticker.served, __atomic_load_n(&ticker.posted, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    /* Signals go to the application's threads, never to ours. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&ticker.thread, NULL, ticker_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        __atomic_store_n(&ticker.wake_fd, -1, __ATOMIC_RELEASE);
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    ticker.running = 1;
    /* Named from here, so it carries the name as soon as this returns. */
    pthread_setname_np(ticker.thread, "dyper-ticker");
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ticker_set_doc,
"ticker_set(mean_s, spread, rate, tokens, cap, /) -> None\n"
"\n"
"The mean delay between samples (0 pauses) and its relative spread; the\n"
"bucket: cost allowed per second, seconds available now (negative: in\n"
"debt), and at most.");

static PyObject *
fastsample_ticker_set(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "ticker_set() takes exactly 5 arguments");
        return NULL;
    }
    double v[5];
    for (int i = 0; i < 5; i++) {
        v[i] = PyFloat_AsDouble(args[i]);
        if (v[i] == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        /* Tokens may be negative: the agent is in debt. */
        if (!isfinite(v[i]) || (v[i] < 0 && i != 3)) {
            PyErr_SetString(PyExc_ValueError, "ticker_set() takes finite numbers, all but tokens non-negative");
            return NULL;
        }
    }
    pthread_mutex_lock(&ticker.mu);
    ticker.mean_s = v[0];
    ticker.spread = v[1];
    ticker.rate = v[2];
    ticker.tokens = v[3] < v[4] ? v[3] : v[4];
    ticker.cap = v[4];
    ticker.tokens_at = mono_now();
    /* A new delay takes effect at once; new tokens end a wait for money. */
    ticker.gen++;
    if (ticker_cv_ready) {
        pthread_cond_signal(&ticker.cv);
    }
    pthread_mutex_unlock(&ticker.mu);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ticker_drain_doc,
"ticker_drain(counts, locs, new_loc, [waiting, hist, pending,] /) -> int\n"
"\n"
"Phase 2 for every queued snapshot, as sample() does for one (waiting and\n"
"hist and pending as there); returns the number of samples drained.");

static PyObject *
fastsample_ticker_drain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "ticker_drain() takes 3 or 6 arguments");
        return NULL;
    }
    PyObject *counts = args[0], *locs = args[1], *new_loc = args[2];
    if (!PyDict_CheckExact(counts) || !PyDict_CheckExact(locs)) {
        PyErr_SetString(PyExc_TypeError, "counts and locs must be dicts");
        return NULL;
    }
    module_state *state = PyModule_GetState(module);
    if (state == NULL) {
        return NULL;
    }
    activity act;
    Py_buffer view = {0};
    if (nargs == 6 && activity_parse(args[3], args[4], args[5], &act, &view) < 0) {
        return NULL;
    }
    /* Detach the queue first: phase 2 may run Python code, and with it
     * pending calls that queue new snapshots. */
    snapshot s = ticker.queue;
    memset(&ticker.queue, 0, sizeof(ticker.queue));
    Py_ssize_t n = s.nsamples;
    int rc = record_and_clear(state, counts, locs, new_loc, &s, nargs == 6 ? &act : NULL);
    if (nargs == 6) {
        PyBuffer_Release(&view);
    }
    if (rc < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(n);
}

PyDoc_STRVAR(ticker_stats_doc,
"ticker_stats() -> dict\n"
"\n"
"Counters since ticker_start: app_cpu_s (snapshot time taken in application\n"
"threads), ticker_cpu_s (the ticker thread's own CPU time, kept after\n"
"ticker_stop), handoff_s (GIL\n"
"hand-offs the ticker's own samples cost other threads, estimated),\n"
"ticks (asked for) and busy_ticks (of those, found the GIL held),\n"
"in_thread and by_ticker (samples taken each way), dropped (queue full), failed (out of\n"
"memory), queued (snapshots waiting for ticker_drain), latency_s (how late\n"
"the ticker wakes, a moving average; latency_floor_s, the least of the last\n"
"32 ticks), cost_s (a snapshot's cost, moving\n"
"average), tokens_s (the bucket now).");

static PyObject *
fastsample_ticker_stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    double ticker_cpu = ticker.exit_cpu_s;  /* after ticker_stop: what it had spent */
    if (ticker.running) {
        clockid_t cid;
        struct timespec ts;
        if (pthread_getcpuclockid(ticker.thread, &cid) == 0 && clock_gettime(cid, &ts) == 0) {
            ticker_cpu = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
        }
    }
    pthread_mutex_lock(&ticker.mu);
    double latency = ticker.latency_s, cost = ticker.cost_s, handoff = ticker.handoff_s;
    ticker_cpu -= ticker.spin_cpu_s;
    double floor_s = ticker.latency_floor_s;
    bucket_accrue(mono_now());
    double tokens = ticker.tokens;
    pthread_mutex_unlock(&ticker.mu);
    return Py_BuildValue(
        "{s:d,s:d,s:d,s:K,s:K,s:K,s:K,s:K,s:K,s:n,s:d,s:d,s:d,s:d}",
        "app_cpu_s", ticker.app_cpu_s,
        "ticker_cpu_s", ticker_cpu,
        "handoff_s", handoff,
        "ticks", (unsigned long long)__atomic_load_n(&ticker.posted, __ATOMIC_ACQUIRE),
        "busy_ticks", (unsigned long long)__atomic_load_n(&ticker.busy, __ATOMIC_RELAXED),
        "in_thread", (unsigned long long)ticker.in_thread,
        "by_ticker", (unsigned long long)ticker.by_ticker,
        "dropped", (unsigned long long)ticker.dropped,
        "failed", (unsigned long long)ticker.failed,
        "queued", ticker.queue.nsamples,
        "latency_s", latency,
        "latency_floor_s", floor_s,
        "cost_s", cost,
        "tokens_s", tokens);
}

PyDoc_STRVAR(ticker_stop_doc,
"ticker_stop() -> None\n"
"\n"
"Stop and join the ticker thread (it never waits for the GIL, so this\n"
"cannot deadlock). Queued snapshots stay for a last ticker_drain; a pending\n"
"call still in the interpreter's queue finds nothing to serve.");

static PyObject *
fastsample_ticker_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!ticker.running) {
        Py_RETURN_NONE;
    }
    pthread_mutex_lock(&ticker.mu);
    ticker.stop = 1;
    pthread_cond_signal(&ticker.cv);
    pthread_mutex_unlock(&ticker.mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(ticker.thread, NULL);
    Py_END_ALLOW_THREADS
    ticker.running = 0;
    __atomic_store_n(&ticker.wake_fd, -1, __ATOMIC_RELEASE);
    /* Whatever was asked and not served is forgotten. */
    __atomic_store_n(&ticker.served, __atomic_load_n(&ticker.posted, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

#endif  /* HAVE_TICKER */


/* ------------------------------------------------------------------------
 * Import-time checks: refuse to load (ImportError, the agent falls back to
 * the Python walker) rather than read memory with a wrong layout.
 * ------------------------------------------------------------------------ */

static int
layout_error(const char *what)
{
    PyErr_Format(PyExc_ImportError,
                 "agent._fastsample: layout self-check failed (%s); built for "
                 "CPython " PY_VERSION ", running %s",
                 what, Py_GetVersion());
    return -1;
}

/* First complete frame at or below `f`, per complete_frame_code(). */
static _PyInterpreterFrame *
first_complete(_PyInterpreterFrame *f)
{
    for (int visited = 0; f != NULL && visited < MAX_VISITED; f = f->previous, visited++) {
        if (complete_frame_code(f) != NULL) {
            return f;
        }
    }
    return NULL;
}

static int
self_check(void)
{
    /* The binary matches the interpreter's minor version (the extension
     * suffix already ensures it; this is belt and braces). */
    if ((Py_Version >> 16) != ((unsigned long)PY_VERSION_HEX >> 16)) {
        return layout_error("version");
    }
#if PY_VERSION_HEX >= 0x030D0000
    /* 3.13 publishes the offsets debuggers use: ours must agree. */
    const _Py_DebugOffsets *d = &_PyRuntime.debug_offsets;
    if (memcmp(d->cookie, _Py_Debug_Cookie, sizeof(d->cookie)) != 0 ||
        (d->version >> 16) != ((uint64_t)PY_VERSION_HEX >> 16) ||
        d->free_threaded != 0 ||
        d->thread_state.current_frame != offsetof(PyThreadState, current_frame) ||
        d->thread_state.thread_id != offsetof(PyThreadState, thread_id) ||
        d->thread_state.next != offsetof(PyThreadState, next) ||
        d->interpreter_state.threads_head != offsetof(PyInterpreterState, threads.head) ||
        d->interpreter_frame.previous != offsetof(_PyInterpreterFrame, previous) ||
        d->interpreter_frame.executable != offsetof(_PyInterpreterFrame, f_executable) ||
        d->interpreter_frame.instr_ptr != offsetof(_PyInterpreterFrame, instr_ptr) ||
        d->interpreter_frame.owner != offsetof(_PyInterpreterFrame, owner) ||
        d->code_object.co_code_adaptive != offsetof(PyCodeObject, co_code_adaptive))
    {
        return layout_error("debug offsets");
    }
#endif
    PyThreadState *tstate = PyThreadState_Get();
    if (tstate->thread_id != PyThread_get_thread_ident()) {
        return layout_error("thread id");
    }
    if (PyInterpreterState_ThreadHead(tstate->interp) == NULL) {
        return layout_error("thread list");
    }
    /* Our view of the importing thread's stack must be f_back's view. */
    PyFrameObject *fo = PyEval_GetFrame();   /* borrowed */
    if (fo == NULL) {
        return 0;    /* imported with no Python frame: nothing to compare */
    }
    _PyInterpreterFrame *f = first_complete(thread_top_frame(tstate));
    int checked = 0;
    Py_INCREF(fo);
    while (fo != NULL && checked < 4) {
        int ok = f != NULL && f == fo->f_frame;
        if (ok) {
            PyCodeObject *code = PyFrame_GetCode(fo);           /* new ref */
            ok = code == complete_frame_code(f)
                 && PyFrame_GetLasti(fo) == lasti_bytes(_PyInterpreterFrame_LASTI(f))
                 && PyFrame_GetLineNumber(fo) ==
                    line_number(code, _PyInterpreterFrame_LASTI(f), frame_lineno_field(f));
            Py_DECREF(code);
        }
        if (!ok) {
            Py_DECREF(fo);
            return layout_error("frame chain");
        }
        PyFrameObject *back = PyFrame_GetBack(fo);              /* new ref */
        Py_DECREF(fo);
        fo = back;
        f = first_complete(f->previous);
        checked++;
    }
    if (fo != NULL) {
        Py_DECREF(fo);
    }
    else if (f != NULL) {
        return layout_error("frame chain end");
    }
    return 0;
}


/* ------------------------------------------------------------------------
 * CallCounter: the sys.monitoring callbacks of cpu detailing, in C
 * ------------------------------------------------------------------------ */

/* A Python callback costs ~0.2 us per event, several times a small
 * function's own call; these cost what sys.monitoring's dispatch costs and
 * a pointer compare over at most COUNTER_MAX code objects (the candidates
 * of one burst). Line counts go through a per-code dict from line number
 * to a slot in a C array, so no object is made per event once a line has
 * been seen. */
#define COUNTER_MAX 16

typedef struct {
    Py_ssize_t code;          /* index into codes */
    PyObject *line;           /* the line number object (strong) */
    unsigned long long n;
} line_slot;

/* Native time (the candidates' own time and the time of each C call they
 * make, Paradyn-J's "VM interaction" cost, Python style): per thread, a
 * stack of what is running, pushed at PY_START/PY_RESUME and CALL (of a
 * callable that is not Python code), popped at PY_RETURN/PY_YIELD and
 * C_RETURN/C_RAISE. A frame left by an exception (PY_UNWIND is no local
 * event) is dropped when an outer entry is popped. Recursion is timed once,
 * at its outermost activation. */
#define NATIVE_THREADS 64
#define NATIVE_DEPTH 32
#define NATIVE_CALLEES 256
#define NATIVE_FUNC 1
#define NATIVE_CCALL 2

typedef struct {
    int kind;
    Py_ssize_t code;      /* index into codes */
    const void *key;      /* NATIVE_CCALL: what identifies the C callable */
    long long t0;
} native_entry;

typedef struct {
    const void *tstate;
    int depth;
    native_entry e[NATIVE_DEPTH];
} native_thread;

typedef struct {
    Py_ssize_t code;
    const void *key;
    PyObject *name;       /* str, made once per callee */
    unsigned long long n;
    long long ns;
} native_callee;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncodes;
    PyObject *codes[COUNTER_MAX];
    unsigned long long calls[COUNTER_MAX];
    PyObject *line_index[COUNTER_MAX];   /* dict: line -> slot index */
    line_slot *slots;
    Py_ssize_t nslots, cap;
    /* native time: NULL until the first native event */
    native_thread *threads;
    long long func_ns[COUNTER_MAX];
    native_callee callees[NATIVE_CALLEES];
    Py_ssize_t ncallees;
    unsigned long long native_events;   /* native events that read the clock (the dear ones) */
    unsigned long long native_calls;    /* every native callback, clocked or not */
    int native;           /* time functions and their C calls (CallCounter(codes, native=True)) */
} CallCounter;

static long long
native_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static native_thread *
native_thread_of(CallCounter *self)
{
    if (self->threads == NULL) {
        self->threads = PyMem_Calloc(NATIVE_THREADS, sizeof(native_thread));
        if (self->threads == NULL) {
            return NULL;   /* no native time, no error: counting goes on */
        }
    }
    const void *me = PyThreadState_Get();
    native_thread *free_slot = NULL;
    for (int t = 0; t < NATIVE_THREADS; t++) {
        if (self->threads[t].tstate == me) {
            return &self->threads[t];
        }
        if (free_slot == NULL && self->threads[t].tstate == NULL) {
            free_slot = &self->threads[t];
        }
    }
    if (free_slot != NULL) {
        free_slot->tstate = me;
        free_slot->depth = 0;
    }
    return free_slot;   /* NULL past NATIVE_THREADS threads: not timed */
}

static void
native_push(CallCounter *self, int kind, Py_ssize_t code, const void *key)
{
    native_thread *th = native_thread_of(self);
    if (th == NULL || th->depth >= NATIVE_DEPTH) {
        return;
    }
    native_entry *e = &th->e[th->depth++];
    e->kind = kind;
    e->code = code;
    e->key = key;
    e->t0 = native_now();
    self->native_events++;
}

/* Pop the nearest entry matching (kind, code, key) within a few levels
 * (entries above it were left by exceptions) and return its elapsed ns, or
 * -1 if there is none or an outer activation of the same thing is still
 * running (recursion: timed at the outermost). */
static long long
native_pop(CallCounter *self, int kind, Py_ssize_t code, const void *key)
{
    native_thread *th = native_thread_of(self);
    if (th == NULL) {
        return -1;
    }
    self->native_events++;
    for (int d = th->depth - 1; d >= 0 && d >= th->depth - 4; d--) {
        native_entry *e = &th->e[d];
        if (e->kind == kind && e->code == code && e->key == key) {
            long long elapsed = native_now() - e->t0;
            th->depth = d;
            for (int o = 0; o < d; o++) {
                if (th->e[o].kind == kind && th->e[o].code == code && th->e[o].key == key) {
                    return -1;
                }
            }
            return elapsed;
        }
    }
    return -1;
}

/* What identifies a C callable across calls (bound methods are made per
 * call, their method definition is not), or NULL for Python code, whose
 * call pushes a frame and has no C_RETURN. */
static const void *
native_key(PyObject *callable)
{
    if (PyFunction_Check(callable)) {
        return NULL;
    }
    if (PyMethod_Check(callable) && PyFunction_Check(PyMethod_GET_FUNCTION(callable))) {
        return NULL;
    }
    if (PyCFunction_Check(callable)) {
        return ((PyCFunctionObject *)callable)->m_ml;
    }
    if (Py_IS_TYPE(callable, &PyMethodDescr_Type)) {
        return ((PyMethodDescrObject *)callable)->d_method;
    }
    if (PyType_Check(callable)) {
        return callable;
    }
    return Py_TYPE(callable);
}

static PyObject *
native_name(PyObject *callable)
{
    if (PyCFunction_Check(callable)) {
        PyCFunctionObject *f = (PyCFunctionObject *)callable;
        PyObject *self = f->m_self;
        if (self != NULL && PyModule_Check(self)) {
            const char *mod = PyModule_GetName(self);
            if (mod == NULL) {
                PyErr_Clear();
                mod = "?";
            }
            return PyUnicode_FromFormat("%s.%s", mod, f->m_ml->ml_name);
        }
        if (self == NULL || PyModule_Check(self)) {
            return PyUnicode_FromString(f->m_ml->ml_name);
        }
        return PyUnicode_FromFormat("%s.%s", Py_TYPE(self)->tp_name, f->m_ml->ml_name);
    }
    if (Py_IS_TYPE(callable, &PyMethodDescr_Type)) {
        PyMethodDescrObject *d = (PyMethodDescrObject *)callable;
        return PyUnicode_FromFormat("%s.%s", PyDescr_TYPE(d)->tp_name, d->d_method->ml_name);
    }
    if (PyType_Check(callable)) {
        return PyUnicode_FromFormat("%s()", ((PyTypeObject *)callable)->tp_name);
    }
    return PyUnicode_FromFormat("%s()", Py_TYPE(callable)->tp_name);
}

static void
native_add(CallCounter *self, Py_ssize_t code, const void *key, PyObject *callable, long long ns)
{
    for (Py_ssize_t c = 0; c < self->ncallees; c++) {
        native_callee *ce = &self->callees[c];
        if (ce->key == key && ce->code == code) {
            ce->n++;
            ce->ns += ns;
            return;
        }
    }
    if (self->ncallees == NATIVE_CALLEES) {
        return;   /* bounded: a function calling hundreds of distinct C functions keeps the first */
    }
    PyObject *name = native_name(callable);
    if (name == NULL) {
        PyErr_Clear();
        return;
    }
    native_callee *ce = &self->callees[self->ncallees++];
    ce->code = code;
    ce->key = key;
    ce->name = name;
    ce->n = 1;
    ce->ns = ns;
}

static void
native_forget(CallCounter *self)
{
    for (Py_ssize_t c = 0; c < self->ncallees; c++) {
        Py_CLEAR(self->callees[c].name);
    }
    self->ncallees = 0;
    memset(self->func_ns, 0, sizeof(self->func_ns));
    self->native_events = 0;
    self->native_calls = 0;
    if (self->threads != NULL) {
        memset(self->threads, 0, NATIVE_THREADS * sizeof(native_thread));
    }
}

static Py_ssize_t
counter_find(CallCounter *self, PyObject *code)
{
    for (Py_ssize_t i = 0; i < self->ncodes; i++) {
        if (self->codes[i] == code) {
            return i;
        }
    }
    return -1;
}

static void
counter_forget_lines(CallCounter *self)
{
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        Py_CLEAR(self->slots[j].line);
    }
    self->nslots = 0;
    for (Py_ssize_t i = 0; i < self->ncodes; i++) {
        if (self->line_index[i] != NULL) {
            PyDict_Clear(self->line_index[i]);
        }
    }
}

static PyObject *
CallCounter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *codes;
    int native = 0;
    static char *kwlist[] = {"codes", "native", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|p:CallCounter", kwlist, &codes, &native)) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(codes, "codes must be a sequence of code objects");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > COUNTER_MAX) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "at most %d code objects", COUNTER_MAX);
    }
    CallCounter *self = (CallCounter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *code = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyCode_Check(code)) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return PyErr_Format(PyExc_TypeError, "codes must hold code objects, not %.100s",
                                Py_TYPE(code)->tp_name);
        }
        self->codes[i] = Py_NewRef(code);
        self->line_index[i] = PyDict_New();
        self->ncodes = i + 1;
        if (self->line_index[i] == NULL) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
    }
    Py_DECREF(seq);
    self->native = native;
    return (PyObject *)self;
}

static int
CallCounter_traverse(CallCounter *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    for (Py_ssize_t i = 0; i < self->ncodes; i++) {
        Py_VISIT(self->codes[i]);
        Py_VISIT(self->line_index[i]);
    }
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        Py_VISIT(self->slots[j].line);
    }
    for (Py_ssize_t c = 0; c < self->ncallees; c++) {
        Py_VISIT(self->callees[c].name);
    }
    return 0;
}

static int
CallCounter_clear(CallCounter *self)
{
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        Py_CLEAR(self->slots[j].line);
    }
    self->nslots = 0;
    for (Py_ssize_t i = 0; i < self->ncodes; i++) {
        Py_CLEAR(self->codes[i]);
        Py_CLEAR(self->line_index[i]);
    }
    self->ncodes = 0;
    native_forget(self);
    return 0;
}

static void
CallCounter_dealloc(CallCounter *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    CallCounter_clear(self);
    PyMem_Free(self->slots);
    PyMem_Free(self->threads);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

PyDoc_STRVAR(on_start_doc,
"on_start(code, offset, /) -> None\n\n"
"A PY_START callback: one more call of code (if it is one of the codes).");

static PyObject *
CallCounter_on_start(CallCounter *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs >= 1) {
        Py_ssize_t i = counter_find(self, args[0]);
        if (i >= 0) {
            self->calls[i]++;
            if (self->native) {
                native_push(self, NATIVE_FUNC, i, NULL);
            }
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(on_resume_doc,
"on_resume(code, offset, /) -> None\n\n"
"A PY_RESUME callback (native mode): a candidate's generator or coroutine runs again.");

static PyObject *
CallCounter_on_resume(CallCounter *self, PyObject *const *args, Py_ssize_t nargs)
{
    self->native_calls++;
    if (nargs >= 1 && self->native) {
        Py_ssize_t i = counter_find(self, args[0]);
        if (i >= 0) {
            native_push(self, NATIVE_FUNC, i, NULL);
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(on_return_doc,
"on_return(code, offset, value, /) -> None\n\n"
"A PY_RETURN or PY_YIELD callback (native mode): a candidate stops running.");

static PyObject *
CallCounter_on_return(CallCounter *self, PyObject *const *args, Py_ssize_t nargs)
{
    self->native_calls++;
    if (nargs >= 1 && self->native) {
        Py_ssize_t i = counter_find(self, args[0]);
        if (i >= 0) {
            long long ns = native_pop(self, NATIVE_FUNC, i, NULL);
            if (ns >= 0) {
                self->func_ns[i] += ns;
            }
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(on_call_doc,
"on_call(code, offset, callable, arg0, /) -> None\n\n"
"A CALL callback (native mode): a candidate calls callable; C callables are timed.");

static PyObject *
CallCounter_on_call(CallCounter *self, PyObject *const *args, Py_ssize_t nargs)
{
    self->native_calls++;
    if (nargs >= 3 && self->native) {
        Py_ssize_t i = counter_find(self, args[0]);
        const void *key = i >= 0 ? native_key(args[2]) : NULL;
        if (key != NULL) {
            native_push(self, NATIVE_CCALL, i, key);
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(on_c_return_doc,
"on_c_return(code, offset, callable, arg0, /) -> None\n\n"
"A C_RETURN or C_RAISE callback (native mode): a C call made by a candidate ends.");

static PyObject *
CallCounter_on_c_return(CallCounter *self, PyObject *const *args, Py_ssize_t nargs)
{
    self->native_calls++;
    if (nargs >= 3 && self->native) {
        Py_ssize_t i = counter_find(self, args[0]);
        const void *key = i >= 0 ? native_key(args[2]) : NULL;
        if (key != NULL) {
            long long ns = native_pop(self, NATIVE_CCALL, i, key);
            if (ns >= 0) {
                native_add(self, i, key, args[2], ns);
            }
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(native_doc,
"native() -> (dict[code, float], list[(code, str, int, float)])\n\n"
"Native mode: each candidate's own time in seconds (outermost activations,\n"
"generator and coroutine steps summed), and the C calls each made: callee\n"
"name, calls, seconds.");

static PyObject *
CallCounter_native(CallCounter *self, PyObject *unused)
{
    PyObject *funcs = PyDict_New(), *callees = PyList_New(0);
    if (funcs == NULL || callees == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < self->ncodes; i++) {
        if (self->func_ns[i] == 0) {
            continue;
        }
        PyObject *v = PyFloat_FromDouble((double)self->func_ns[i] / 1e9);
        if (v == NULL || PyDict_SetItem(funcs, self->codes[i], v) < 0) {
            Py_XDECREF(v);
            goto fail;
        }
        Py_DECREF(v);
    }
    for (Py_ssize_t c = 0; c < self->ncallees; c++) {
        native_callee *ce = &self->callees[c];
        PyObject *row = Py_BuildValue("(OOKd)", self->codes[ce->code], ce->name, ce->n, (double)ce->ns / 1e9);
        if (row == NULL || PyList_Append(callees, row) < 0) {
            Py_XDECREF(row);
            goto fail;
        }
        Py_DECREF(row);
    }
    return Py_BuildValue("(NN)", funcs, callees);
fail:
    Py_XDECREF(funcs);
    Py_XDECREF(callees);
    return NULL;
}

PyDoc_STRVAR(on_line_doc,
"on_line(code, line, /) -> None\n\n"
"A LINE callback: one more execution of line in code (if it is one of the codes).");

static PyObject *
CallCounter_on_line(CallCounter *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2) {
        Py_RETURN_NONE;
    }
    Py_ssize_t i = counter_find(self, args[0]);
    if (i < 0) {
        Py_RETURN_NONE;
    }
    PyObject *line = args[1];
    PyObject *slot = PyDict_GetItemWithError(self->line_index[i], line);   /* borrowed */
    if (slot != NULL) {
        self->slots[PyLong_AsSsize_t(slot)].n++;
        Py_RETURN_NONE;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (self->nslots == self->cap) {
        Py_ssize_t cap = self->cap ? 2 * self->cap : 64;
        line_slot *grown = PyMem_Resize(self->slots, line_slot, (size_t)cap);
        if (grown == NULL) {
            return PyErr_NoMemory();
        }
        self->slots = grown;
        self->cap = cap;
    }
    PyObject *index = PyLong_FromSsize_t(self->nslots);
    if (index == NULL) {
        return NULL;
    }
    int rc = PyDict_SetItem(self->line_index[i], line, index);
    Py_DECREF(index);
    if (rc < 0) {
        return NULL;
    }
    self->slots[self->nslots].code = i;
    self->slots[self->nslots].line = Py_NewRef(line);
    self->slots[self->nslots].n = 1;
    self->nslots++;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(counts_doc,
"counts() -> (dict[code, int], dict[(code, line), int])\n\n"
"The calls and line executions counted so far (nonzero only).");

static PyObject *
CallCounter_counts(CallCounter *self, PyObject *unused)
{
    PyObject *calls = PyDict_New(), *lines = PyDict_New();
    if (calls == NULL || lines == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < self->ncodes; i++) {
        if (self->calls[i] == 0) {
            continue;
        }
        PyObject *n = PyLong_FromUnsignedLongLong(self->calls[i]);
        if (n == NULL || PyDict_SetItem(calls, self->codes[i], n) < 0) {
            Py_XDECREF(n);
            goto fail;
        }
        Py_DECREF(n);
    }
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        line_slot *sl = &self->slots[j];
        PyObject *key = PyTuple_Pack(2, self->codes[sl->code], sl->line);
        PyObject *n = PyLong_FromUnsignedLongLong(sl->n);
        if (key == NULL || n == NULL || PyDict_SetItem(lines, key, n) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(n);
            goto fail;
        }
        Py_DECREF(key);
        Py_DECREF(n);
    }
    return Py_BuildValue("(NN)", calls, lines);
fail:
    Py_XDECREF(calls);
    Py_XDECREF(lines);
    return NULL;
}

/* Calls and line executions counted so far: total() and events() both start here. */
static unsigned long long
counter_calls_and_lines(CallCounter *self)
{
    unsigned long long n = 0;
    for (Py_ssize_t i = 0; i < self->ncodes; i++) {
        n += self->calls[i];
    }
    for (Py_ssize_t j = 0; j < self->nslots; j++) {
        n += self->slots[j].n;
    }
    return n;
}

PyDoc_STRVAR(total_doc, "total() -> int\n\nEvery event counted so far: calls, lines and native mode's.");

static PyObject *
CallCounter_total(CallCounter *self, PyObject *unused)
{
    unsigned long long n = counter_calls_and_lines(self);
    n += self->native_calls > self->native_events ? self->native_calls : self->native_events;
    return PyLong_FromUnsignedLongLong(n);
}

PyDoc_STRVAR(events_doc,
"events() -> (int, int)\n\n"
"The events counted so far in two classes by what each cost the application:\n"
"(plain callbacks: calls, lines and native callbacks that read no clock;\n"
"native events that read the clock).");

static PyObject *
CallCounter_events(CallCounter *self, PyObject *unused)
{
    unsigned long long plain = counter_calls_and_lines(self);
    unsigned long long clocked = self->native_events;
    /* a pop without its push still read no clock; never count one twice */
    plain += self->native_calls > clocked ? self->native_calls - clocked : 0;
    return Py_BuildValue("(KK)", plain, clocked);
}

PyDoc_STRVAR(reset_doc, "reset() -> None\n\nForget every count (the codes stay).");

static PyObject *
CallCounter_reset(CallCounter *self, PyObject *unused)
{
    memset(self->calls, 0, sizeof(self->calls));
    counter_forget_lines(self);
    native_forget(self);
    Py_RETURN_NONE;
}

static PyMethodDef CallCounter_methods[] = {
    {"on_start", (PyCFunction)(void (*)(void))CallCounter_on_start, METH_FASTCALL, on_start_doc},
    {"on_line", (PyCFunction)(void (*)(void))CallCounter_on_line, METH_FASTCALL, on_line_doc},
    {"on_resume", (PyCFunction)(void (*)(void))CallCounter_on_resume, METH_FASTCALL, on_resume_doc},
    {"on_return", (PyCFunction)(void (*)(void))CallCounter_on_return, METH_FASTCALL, on_return_doc},
    {"on_call", (PyCFunction)(void (*)(void))CallCounter_on_call, METH_FASTCALL, on_call_doc},
    {"on_c_return", (PyCFunction)(void (*)(void))CallCounter_on_c_return, METH_FASTCALL, on_c_return_doc},
    {"native", (PyCFunction)CallCounter_native, METH_NOARGS, native_doc},
    {"counts", (PyCFunction)CallCounter_counts, METH_NOARGS, counts_doc},
    {"total", (PyCFunction)CallCounter_total, METH_NOARGS, total_doc},
    {"events", (PyCFunction)CallCounter_events, METH_NOARGS, events_doc},
    {"reset", (PyCFunction)CallCounter_reset, METH_NOARGS, reset_doc},
    {NULL, NULL, 0, NULL}
};

PyDoc_STRVAR(CallCounter_doc,
"CallCounter(codes, native=False)\n\n"
"Exact call and line counts for up to 16 code objects, for sys.monitoring's\n"
"PY_START (on_start) and LINE (on_line) events; counts() reads them. With\n"
"native=True it also times the candidates (on_start, on_resume, on_return)\n"
"and the C calls they make (on_call, on_c_return); native() reads those.");

static PyType_Slot CallCounter_slots[] = {
    {Py_tp_new, CallCounter_new},
    {Py_tp_dealloc, CallCounter_dealloc},
    {Py_tp_traverse, CallCounter_traverse},
    {Py_tp_clear, CallCounter_clear},
    {Py_tp_methods, CallCounter_methods},
    {Py_tp_doc, (void *)CallCounter_doc},
    {0, NULL}
};

static PyType_Spec CallCounter_spec = {
    .name = "agent._fastsample.CallCounter",
    .basicsize = sizeof(CallCounter),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = CallCounter_slots,
};

/* ------------------------------------------------------------------------
 * proc_read: one small /proc file, read with the GIL held.
 *
 * Python's open() and os.read() release the GIL around every system call,
 * and getting it back behind busy threads costs up to a switch interval
 * each (5 ms, times the threads queueing). A threads burst reads two files
 * per thread: against four busy threads its start took 1.1 s on a loaded
 * machine, long enough for the watchdog to call it hung. Reading this
 * process's own /proc files takes microseconds and never waits on a
 * device, so the GIL is kept for it: the application loses one short hold
 * instead of a hand-off per system call.
 * ------------------------------------------------------------------------ */
#ifdef __linux__
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#define PROC_READ_MAX 65536

PyDoc_STRVAR(thread_ids_doc,
"thread_ids() -> [(ident, native_id), ...]\n\n"
"Every Python thread of this interpreter: threading's ident and the kernel's thread id.\n"
"Read from the thread states with the GIL held; threading knows only the threads it\n"
"started, and when it is first imported off the main thread (dyper attach's injected\n"
"thread) it takes that thread for the main one.");

/* Copied into a C array before any Python object is made: making one may run a
   collection and its finalizers, which may let the thread list change under us. */
#define THREAD_IDS_MAX 4096

static PyObject *
fastsample_thread_ids(PyObject *module, PyObject *Py_UNUSED(unused))
{
    /* PyMem_Malloc runs no Python code (the list below may: it is made after). */
    unsigned long *ids = PyMem_Malloc(2 * THREAD_IDS_MAX * sizeof(unsigned long));
    if (ids == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t n = 0;
    PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL && n < THREAD_IDS_MAX;
         ts = PyThreadState_Next(ts)) {
        ids[2 * n] = (unsigned long)ts->thread_id;
        ids[2 * n + 1] = (unsigned long)ts->native_thread_id;
        n++;
    }
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *pair = Py_BuildValue("(kk)", ids[2 * i], ids[2 * i + 1]);
        if (pair == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    PyMem_Free(ids);
    return out;
}

PyDoc_STRVAR(proc_read_doc,
"proc_read(path, limit=4096, /) -> bytes\n\n"
"Up to limit bytes of a /proc file, read without releasing the GIL.\n"
"Raises OSError as open() would.");

static PyObject *
fastsample_proc_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "proc_read(path, limit=4096)");
        return NULL;
    }
    if (!PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "proc_read: path must be a str");
        return NULL;
    }
    Py_ssize_t limit = 4096;
    if (nargs == 2) {
        limit = PyLong_AsSsize_t(args[1]);
        if (limit == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    if (limit < 1 || limit > PROC_READ_MAX) {
        PyErr_Format(PyExc_ValueError, "proc_read: limit must be 1 to %d", PROC_READ_MAX);
        return NULL;
    }
    const char *path = PyUnicode_AsUTF8(args[0]);
    if (path == NULL) {
        return NULL;
    }
    if (strncmp(path, "/proc/", 6) != 0) {
        /* Anything else may be a slow device or a network file: not with the GIL held. */
        PyErr_SetString(PyExc_ValueError, "proc_read: only /proc files");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, limit);
    if (out == NULL) {
        return NULL;
    }
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        Py_DECREF(out);
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, args[0]);
    }
    char *buf = PyBytes_AS_STRING(out);
    Py_ssize_t got = 0;
    while (got < limit) {
        ssize_t n = read(fd, buf + got, (size_t)(limit - got));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            int err = errno;
            close(fd);
            Py_DECREF(out);
            errno = err;
            return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, args[0]);
        }
        if (n == 0) {
            break;
        }
        got += n;
    }
    close(fd);
    if (got < limit && _PyBytes_Resize(&out, got) < 0) {
        return NULL;
    }
    return out;
}
#endif


#if PY_VERSION_HEX < 0x030C0000
/* ------------------------------------------------------------------------
 * The frame hook: cpu detailing's call counts on 3.11, which has no
 * sys.monitoring. A profile function (yappi) puts every instruction of every
 * thread on the eval loop's slow path, half a call-free loop's time here.
 * PEP 523's frame evaluation function is called once per Python frame
 * evaluated instead: while one is installed, CPython 3.11 inlines no
 * Python-to-Python call (CALL_PY_EXACT_ARGS and the other inlining
 * instructions DEOPT_IF an eval_frame is set), so every call of every
 * function comes through here, and the instructions between calls run as
 * fast as ever. A call costs a C call and a frame more: 1.27x on a loop of
 * three tiny calls a round, against 8 to 18x for yappi.
 *
 * A frame is a call when it starts at its first instruction; a generator or
 * coroutine resumed, or thrown into, is not. Every frame evaluated, calls and
 * resumptions in any thread, is counted too: that is what the burst costs the
 * application, and the agent charges it at a cost calibrated in the target.
 *
 * The hook is installed only over the default evaluator, and taken out only
 * if it is still ours: a debugger or a JIT that installed its own (pydevd,
 * torch.compile) is never replaced, and the cpu proflet says so and stays
 * off. Setting the default back stores NULL (_PyInterpreterState_SetEvalFrameFunc),
 * so the interpreter inlines calls again. Everything here runs with the GIL held.
 * ------------------------------------------------------------------------ */

static struct PyModuleDef fastsample_module;

static PyObject *hook_counter;            /* the burst's CallCounter (strong), or NULL */
static unsigned long long hook_frames;    /* frames evaluated while the hook was in */

static PyObject *
frame_hook(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag)
{
    hook_frames++;
    CallCounter *counter = (CallCounter *)hook_counter;
    if (counter != NULL && !throwflag && frame->prev_instr == _PyCode_CODE(frame->f_code) - 1) {
        PyObject *code = (PyObject *)frame->f_code;
        for (Py_ssize_t i = 0; i < counter->ncodes; i++) {
            if (counter->codes[i] == code) {
                counter->calls[i]++;
                break;
            }
        }
    }
    return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
}

PyDoc_STRVAR(frame_hook_start_doc,
"frame_hook_start(counter, /) -> bool\n\n"
"Count the calls of counter's code objects (a CallCounter) through a PEP 523\n"
"frame evaluation hook, until frame_hook_stop(). False, and nothing done, if\n"
"another evaluation function is installed.");

static PyObject *
fastsample_frame_hook_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "frame_hook_start(counter) takes one argument");
        return NULL;
    }
    PyObject *mod = PyType_GetModuleByDef(Py_TYPE(args[0]), &fastsample_module);
    if (mod == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "frame_hook_start wants a CallCounter");
        return NULL;
    }
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (current == frame_hook) {
        Py_XSETREF(hook_counter, Py_NewRef(args[0]));   /* a new burst over one not stopped */
        hook_frames = 0;
        Py_RETURN_TRUE;
    }
    if (current != _PyEval_EvalFrameDefault) {
        Py_RETURN_FALSE;
    }
    Py_XSETREF(hook_counter, Py_NewRef(args[0]));
    hook_frames = 0;
    _PyInterpreterState_SetEvalFrameFunc(interp, frame_hook);
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(frame_hook_stop_doc,
"frame_hook_stop() -> int\n\n"
"Take the hook out (if it is still the one installed) and return the frames\n"
"evaluated while it was in. Safe to call when no hook is in.");

static PyObject *
fastsample_frame_hook_stop(PyObject *module, PyObject *unused)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    if (_PyInterpreterState_GetEvalFrameFunc(interp) == frame_hook) {
        _PyInterpreterState_SetEvalFrameFunc(interp, _PyEval_EvalFrameDefault);
    }
    Py_CLEAR(hook_counter);
    unsigned long long n = hook_frames;
    hook_frames = 0;
    return PyLong_FromUnsignedLongLong(n);
}

PyDoc_STRVAR(frame_hook_frames_doc,
"frame_hook_frames() -> int\n\nFrames evaluated since frame_hook_start(), so far.");

static PyObject *
fastsample_frame_hook_frames(PyObject *module, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(hook_counter != NULL ? hook_frames : 0);
}

PyDoc_STRVAR(frame_hook_installed_doc,
"frame_hook_installed() -> bool\n\nWhether the hook is this interpreter's frame evaluator now.");

static PyObject *
fastsample_frame_hook_installed(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(_PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get()) == frame_hook);
}
#endif


/* ------------------------------------------------------------------------
 * Allocation sampling: the memory proflet's bursts when this module loads.
 *
 * A hook over the object and memory domains' allocators (PyMem_SetAllocator,
 * as tracemalloc does) counts every allocation and, at a Poisson process over
 * the bytes allocated (a mean of `mean_bytes` between samples), records the
 * Python stack of the allocating thread: a few reads, no allocation, no
 * Python code. tracemalloc instead records every allocation and every free,
 * which slows allocation-heavy code ten times or more, so its bursts at 1%
 * last a few milliseconds; this one loses a few percent, so its bursts can
 * last seconds and see the threads that hold the GIL a quarter of the time.
 *
 * Both domains are only called with the GIL held, which guards the state.
 * The raw domain (called without it) is left alone.
 * ------------------------------------------------------------------------ */

#define ALLOC_DEPTH 8

typedef struct {
    size_t size;
    int depth;
    frame_rec frames[ALLOC_DEPTH];   /* leaf first */
} alloc_sample;

static struct {
    int installed;      /* our hooks are the domains' allocators (over base_*) */
    int stranded;       /* another hook went over ours: we stay, passing through */
    int active;         /* counting and sampling; else passing through */
    PyInterpreterState *interp;
    PyMemAllocatorEx base_obj, base_mem;
    double mean_bytes;
    int64_t countdown;
    uint64_t rng;
    unsigned long long count, bytes, dropped;
    alloc_sample *samples;  /* malloc'ed: never through the allocators we hook */
    Py_ssize_t nsamples, max_samples;
} alloc = {0};

static double
alloc_uniform(void)
{
    uint64_t x = alloc.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    alloc.rng = x;
    return ((double)((x * 0x2545F4914F6CDD1DULL) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Bytes to the next sample: exponential, so that every byte is equally
 * likely to be sampled whatever the sizes around it. */
static int64_t
alloc_interval(void)
{
    double d = -log(alloc_uniform()) * alloc.mean_bytes;
    return d < 1.0 ? 1 : (d > 9e18 ? (int64_t)9e18 : (int64_t)d);
}

static void
alloc_record(size_t size)
{
    if (alloc.nsamples >= alloc.max_samples) {
        alloc.dropped++;
        return;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyThreadState *ts = PyThreadState_GetUnchecked();
#else
    PyThreadState *ts = _PyThreadState_UncheckedGet();
#endif
    if (ts == NULL || ts->interp != alloc.interp) {
        return;   /* a thread being torn down, or a sub-interpreter with its own GIL */
    }
    alloc_sample *s = &alloc.samples[alloc.nsamples];
    int depth = 0, visited = 0;
    for (_PyInterpreterFrame *f = thread_top_frame(ts);
         f != NULL && depth < ALLOC_DEPTH && visited < MAX_VISITED;
         f = f->previous, visited++)
    {
        int took = frame_take(f, &s->frames[depth]);
        if (took < 0) {
            break;
        }
        depth += took;
    }
    s->size = size;
    s->depth = depth;
    alloc.nsamples++;
}

static inline void
alloc_note(size_t size)
{
    if (!alloc.active) {
        return;
    }
    alloc.count++;
    alloc.bytes += size;
    alloc.countdown -= (int64_t)size;
    if (alloc.countdown > 0) {
        return;
    }
    alloc.countdown = alloc_interval();
    alloc_record(size);
}

static void *
alloc_hook_malloc(void *ctx, size_t size)
{
    PyMemAllocatorEx *base = (PyMemAllocatorEx *)ctx;
    void *p = base->malloc(base->ctx, size);
    if (p != NULL) {
        alloc_note(size);
    }
    return p;
}

static void *
alloc_hook_calloc(void *ctx, size_t nelem, size_t elsize)
{
    PyMemAllocatorEx *base = (PyMemAllocatorEx *)ctx;
    void *p = base->calloc(base->ctx, nelem, elsize);
    if (p != NULL) {
        alloc_note(nelem * elsize);   /* no overflow: the allocation succeeded */
    }
    return p;
}

static void *
alloc_hook_realloc(void *ctx, void *ptr, size_t size)
{
    PyMemAllocatorEx *base = (PyMemAllocatorEx *)ctx;
    void *p = base->realloc(base->ctx, ptr, size);
    if (p != NULL) {
        alloc_note(size);   /* the new size, as an allocation of its own */
    }
    return p;
}

static void
alloc_hook_free(void *ctx, void *ptr)
{
    PyMemAllocatorEx *base = (PyMemAllocatorEx *)ctx;
    base->free(base->ctx, ptr);
}

static int
alloc_ours(PyMemAllocatorDomain domain, PyMemAllocatorEx *base)
{
    PyMemAllocatorEx now;
    PyMem_GetAllocator(domain, &now);
    return now.malloc == alloc_hook_malloc && now.ctx == base;
}

/* Drop the samples' references and free them. May run arbitrary code (a
 * code object's last reference), so with nothing of ours half-done. */
static void
alloc_clear_samples(void)
{
    alloc_sample *samples = alloc.samples;
    Py_ssize_t n = alloc.nsamples;
    alloc.samples = NULL;
    alloc.nsamples = alloc.max_samples = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        for (int d = 0; d < samples[i].depth; d++) {
            Py_DECREF(samples[i].frames[d].code);
        }
    }
    free(samples);
}

PyDoc_STRVAR(alloc_start_doc,
"alloc_start(mean_bytes, max_samples, /) -> None\n"
"\n"
"Count every allocation of the object and memory domains from now on, and\n"
"record the allocating Python stack (8 frames, leaf first) at a Poisson\n"
"process of mean_bytes between samples, at most max_samples of them.\n"
"Raises RuntimeError if already sampling or if another allocator hook that\n"
"went over ours at an earlier stop is still there. Leave tracemalloc off\n"
"while it runs.");

static PyObject *
fastsample_alloc_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "alloc_start() takes exactly 2 arguments");
        return NULL;
    }
    double mean = PyFloat_AsDouble(args[0]);
    if (mean == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t max_samples = PyLong_AsSsize_t(args[1]);
    if (max_samples == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!(mean >= 1.0) || max_samples < 1 || max_samples > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "mean_bytes must be >= 1 and max_samples in 1..2**20");
        return NULL;
    }
    if (alloc.active) {
        PyErr_SetString(PyExc_RuntimeError, "allocation sampling is already running");
        return NULL;
    }
    if (alloc.stranded && alloc_ours(PYMEM_DOMAIN_OBJ, &alloc.base_obj)
        && alloc_ours(PYMEM_DOMAIN_MEM, &alloc.base_mem)) {
        /* Ours is on top again: whoever wrapped it took their hook out. */
        alloc.stranded = 0;
    }
    if (alloc.stranded) {
        PyErr_SetString(PyExc_RuntimeError,
                        "another allocator hook was installed over dyper's allocation sampler");
        return NULL;
    }
    alloc_sample *samples = malloc((size_t)max_samples * sizeof(alloc_sample));
    if (samples == NULL) {
        return PyErr_NoMemory();
    }
    if (alloc.samples != NULL) {
        alloc_clear_samples();   /* a run stopped without being read */
    }
    alloc.samples = samples;
    alloc.nsamples = 0;
    alloc.max_samples = max_samples;
    alloc.count = alloc.bytes = alloc.dropped = 0;
    alloc.mean_bytes = mean;
    alloc.interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    if (alloc.rng == 0) {
        alloc.rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uintptr_t)&alloc;
        if (alloc.rng == 0) {
            alloc.rng = 88172645463325252ULL;
        }
    }
    alloc.countdown = alloc_interval();
    if (!alloc.installed) {
        PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &alloc.base_obj);
        PyMem_GetAllocator(PYMEM_DOMAIN_MEM, &alloc.base_mem);
        PyMemAllocatorEx obj = {&alloc.base_obj, alloc_hook_malloc, alloc_hook_calloc,
                                alloc_hook_realloc, alloc_hook_free};
        PyMemAllocatorEx mem = {&alloc.base_mem, alloc_hook_malloc, alloc_hook_calloc,
                                alloc_hook_realloc, alloc_hook_free};
        PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &obj);
        PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &mem);
        alloc.installed = 1;
    }
    alloc.active = 1;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(alloc_stop_doc,
"alloc_stop() -> (count, bytes, dropped, samples)\n"
"\n"
"Stop counting and sampling, take the hook out, and return what was seen:\n"
"allocations and bytes counted, samples dropped past max_samples, and each\n"
"sample as (size, ((filename, line), ...)) leaf first. None if not running.\n"
"If another hook went over ours, ours stays in place passing through.");

static PyObject *
fastsample_alloc_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!alloc.active) {
        Py_RETURN_NONE;
    }
    alloc.active = 0;
    if (alloc.installed) {
        if (alloc_ours(PYMEM_DOMAIN_OBJ, &alloc.base_obj) && alloc_ours(PYMEM_DOMAIN_MEM, &alloc.base_mem)) {
            PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &alloc.base_obj);
            PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &alloc.base_mem);
            alloc.installed = 0;
        }
        else {
            /* Someone wrapped ours (tracemalloc started meanwhile, say): what
             * they saved calls us, so we stay, inactive, for good. */
            alloc.stranded = 1;
        }
    }
    PyObject *samples = PyList_New(alloc.nsamples);
    if (samples == NULL) {
        alloc_clear_samples();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < alloc.nsamples; i++) {
        alloc_sample *s = &alloc.samples[i];
        PyObject *frames = PyTuple_New(s->depth);
        if (frames == NULL) {
            Py_DECREF(samples);
            alloc_clear_samples();
            return NULL;
        }
        for (int d = 0; d < s->depth; d++) {
            frame_rec *r = &s->frames[d];
            int line = line_number(r->code, r->lasti, r->lineno_field);
            PyObject *pair = Py_BuildValue("(Oi)", r->code->co_filename, line);
            if (pair == NULL) {
                Py_DECREF(frames);
                Py_DECREF(samples);
                alloc_clear_samples();
                return NULL;
            }
            PyTuple_SET_ITEM(frames, d, pair);
        }
        PyObject *item = Py_BuildValue("(nN)", (Py_ssize_t)s->size, frames);
        if (item == NULL) {
            Py_DECREF(samples);
            alloc_clear_samples();
            return NULL;
        }
        PyList_SET_ITEM(samples, i, item);
    }
    unsigned long long count = alloc.count, bytes = alloc.bytes, dropped = alloc.dropped;
    alloc_clear_samples();
    return Py_BuildValue("(KKKN)", count, bytes, dropped, samples);
}

PyDoc_STRVAR(alloc_state_doc,
"alloc_state() -> (installed, stranded, active, allocations, bytes, samples)\n"
"\n"
"Where the allocation sampler's hook is, and what this run has counted so far.");

static PyObject *
fastsample_alloc_state(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue("(iiiKKn)", alloc.installed, alloc.stranded, alloc.active,
                         alloc.count, alloc.bytes, alloc.nsamples);
}


static PyMethodDef fastsample_methods[] = {
    {"sample", (PyCFunction)(void (*)(void))fastsample_sample, METH_FASTCALL, sample_doc},
    {"alloc_start", (PyCFunction)(void (*)(void))fastsample_alloc_start, METH_FASTCALL, alloc_start_doc},
    {"alloc_stop", fastsample_alloc_stop, METH_NOARGS, alloc_stop_doc},
    {"alloc_state", fastsample_alloc_state, METH_NOARGS, alloc_state_doc},
#ifdef __linux__
    {"proc_read", (PyCFunction)(void (*)(void))fastsample_proc_read, METH_FASTCALL, proc_read_doc},
    {"thread_ids", fastsample_thread_ids, METH_NOARGS, thread_ids_doc},
#endif
#if HAVE_TICKER
    {"ticker_start", (PyCFunction)(void (*)(void))fastsample_ticker_start, METH_FASTCALL, ticker_start_doc},
    {"ticker_set", (PyCFunction)(void (*)(void))fastsample_ticker_set, METH_FASTCALL, ticker_set_doc},
    {"ticker_drain", (PyCFunction)(void (*)(void))fastsample_ticker_drain, METH_FASTCALL, ticker_drain_doc},
    {"ticker_stats", fastsample_ticker_stats, METH_NOARGS, ticker_stats_doc},
    {"ticker_stop", fastsample_ticker_stop, METH_NOARGS, ticker_stop_doc},
#endif
#if PY_VERSION_HEX < 0x030C0000
    {"frame_hook_start", (PyCFunction)(void (*)(void))fastsample_frame_hook_start, METH_FASTCALL,
     frame_hook_start_doc},
    {"frame_hook_stop", fastsample_frame_hook_stop, METH_NOARGS, frame_hook_stop_doc},
    {"frame_hook_frames", fastsample_frame_hook_frames, METH_NOARGS, frame_hook_frames_doc},
    {"frame_hook_installed", fastsample_frame_hook_installed, METH_NOARGS, frame_hook_installed_doc},
#endif
    {NULL, NULL, 0, NULL}
};

static int
fastsample_exec(PyObject *module)
{
    if (self_check() < 0) {
        return -1;
    }
    module_state *state = PyModule_GetState(module);
    if (state == NULL) {
        return -1;
    }
    memset(state, 0, sizeof(*state));
    state->cache.gen = 1;
    state->cache.enabled = version_tags_work();
    if (PyModule_AddIntConstant(module, "CACHE_ENABLED", state->cache.enabled) < 0) {
        return -1;
    }
    if (PyModule_AddIntConstant(module, "TICKER", HAVE_TICKER) < 0) {
        return -1;
    }
    if (PyModule_AddIntConstant(module, "MAX_DEPTH", MAX_DEPTH) < 0) {
        return -1;
    }
    if (PyModule_AddStringConstant(module, "BUILT_FOR", PY_VERSION) < 0) {
        return -1;
    }
    PyObject *counter = PyType_FromModuleAndSpec(module, &CallCounter_spec, NULL);
    if (counter == NULL) {
        return -1;
    }
    if (PyModule_AddObject(module, "CallCounter", counter) < 0) {
        Py_DECREF(counter);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot fastsample_slots[] = {
    {Py_mod_exec, fastsample_exec},
    {0, NULL}
};

PyDoc_STRVAR(module_doc,
"dyper's C stack walker: agent.core.Agent._sample_python without frame objects.");

static int
fastsample_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *state = PyModule_GetState(module);
    if (state != NULL) {
        Py_VISIT(state->cache.dict);
        for (Py_ssize_t i = 0; i < state->nmemo; i++) {
            Py_VISIT(state->memo[i].key);
        }
    }
    return 0;
}

static int
fastsample_clear(PyObject *module)
{
    module_state *state = PyModule_GetState(module);
    if (state != NULL) {
        cache_forget(&state->cache);
        Py_CLEAR(state->cache.dict);
        memo_replace(state, NULL, 0);
    }
    return 0;
}

static void
fastsample_free(void *module)
{
    fastsample_clear((PyObject *)module);
    module_state *state = PyModule_GetState((PyObject *)module);
    if (state != NULL) {
        PyMem_Free(state->cache.slots);
        state->cache.slots = NULL;
    }
}

static struct PyModuleDef fastsample_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "agent._fastsample",
    .m_doc = module_doc,
    .m_size = sizeof(module_state),
    .m_methods = fastsample_methods,
    .m_slots = fastsample_slots,
    .m_traverse = fastsample_traverse,
    .m_clear = fastsample_clear,
    .m_free = fastsample_free,
};

PyMODINIT_FUNC
PyInit__fastsample(void)
{
    return PyModuleDef_Init(&fastsample_module);
}

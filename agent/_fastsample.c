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
} thread_rec;

typedef struct {
    frame_rec *frames;
    Py_ssize_t nframes, frames_cap;
    thread_rec *threads;
    Py_ssize_t nthreads, threads_cap;
    Py_ssize_t max_depth;
} snapshot;

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
            PyCodeObject *code = complete_frame_code(f);
            if (code == NULL) {
                continue;
            }
            int lasti = _PyInterpreterFrame_LASTI(f);
            if (lasti < -1 || lasti >= Py_SIZE(code)) {
                /* Not an offset into this code: a corrupt frame, whose link
                 * to the next one cannot be trusted either. (PyCode_Addr2Line
                 * would read out of bounds with it.) */
                break;
            }
            if (reserve_one((void **)&s->frames, &s->frames_cap,
                            s->nframes, sizeof(frame_rec)) < 0) {
                return -1;
            }
            frame_rec *r = &s->frames[s->nframes++];
            Py_INCREF(code);
            r->code = code;
            r->lasti = lasti;
            r->lineno_field = frame_lineno_field(f);
            depth++;
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

/* Everything for one thread: its stack tuple and its count. `buf` has room
 * for tr->depth references. On failure nothing is counted for this thread,
 * as in the reference (whose exception leaves the loop before `counts[k]`).
 * The key used is left in memo_out (a new reference) if it may be reused. */
static int
record_thread(module_state *state, PyObject *counts, PyObject *locs, PyObject *new_loc,
              const snapshot *s, Py_ssize_t pos, PyObject **buf, memo_entry *memo_out)
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
    if (all_ints) {
        /* No Python code ran since the memo was read: it is the current one. */
        k = memo_match(state, pos, tr->tid, buf, filled, &hash);
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


/* ------------------------------------------------------------------------
 * sample()
 * ------------------------------------------------------------------------ */

PyDoc_STRVAR(sample_doc,
"sample(counts, locs, new_loc, skip_ident, /) -> None\n"
"\n"
"Record one snapshot of every thread's Python stack, exactly as\n"
"agent.core.Agent._sample_python does, without creating frame objects.\n"
"\n"
"counts: dict[(thread_ident, tuple[location, ...])] -> int, incremented.\n"
"locs: dict[int, location], key = (f_lasti << 48) | id(code).\n"
"new_loc: called as new_loc(key, code, f_lasti, f_lineno) for a key whose\n"
"    location is missing or None; its result is used as the location.\n"
"    Exceptions propagate; threads already recorded stay counted.\n"
"skip_ident: thread ident to leave out (the sampler's own), or None.");

static PyObject *
fastsample_sample(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "sample() takes exactly 4 arguments (%zd given)", nargs);
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

    /* Phase 1 */
    snapshot s = {0};
    head_lock();
    int taken = snapshot_take(&s, interp, have_skip, skip);
    head_unlock();

    /* Phase 2 */
    PyObject *result = NULL;
    PyObject **buf = NULL;
    memo_entry *memo_next = NULL;
    if (taken < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (s.nthreads > 0) {
        buf = PyMem_New(PyObject *, (size_t)s.max_depth);
        memo_next = PyMem_Calloc((size_t)s.nthreads, sizeof(memo_entry));
        if (buf == NULL || memo_next == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < s.nthreads; i++) {
        if (record_thread(state, counts, locs, new_loc, &s, i, buf, &memo_next[i]) < 0) {
            goto done;
        }
    }
    result = Py_NewRef(Py_None);

done:
    PyMem_Free(buf);
    /* Last: dropping references (old memo keys, code objects) can run
     * arbitrary code. Keep a pending exception across it. */
    {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (memo_next != NULL) {
            memo_replace(state, memo_next, s.nthreads);
        }
        snapshot_clear(&s);
        PyErr_Restore(type, value, tb);
    }
    return result;
}


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


static PyMethodDef fastsample_methods[] = {
    {"sample", (PyCFunction)(void (*)(void))fastsample_sample, METH_FASTCALL, sample_doc},
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
    if (PyModule_AddIntConstant(module, "MAX_DEPTH", MAX_DEPTH) < 0) {
        return -1;
    }
    if (PyModule_AddStringConstant(module, "BUILT_FOR", PY_VERSION) < 0) {
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

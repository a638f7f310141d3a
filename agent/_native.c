/*
 * agent/_native.c -- dyper's native sampler (CPython 3.11, 3.12, 3.13 on Linux).
 *
 * A pthread of our own, with no thread state, that never takes the GIL and
 * never calls the Python C API. At random instants (gaussian delays around a
 * mean the agent sets, never in step with the application) it reads, for
 * every thread of the interpreter: the thread's Python stack (each frame's
 * code object address and instruction offset), its native and Python thread
 * ids, whether it holds the GIL, its kernel state (/proc/self/task/TID/stat)
 * and whether its CPU clock advanced since the last sample. These raw samples
 * go into a bounded ring. The agent's thread, holding the GIL, drains the
 * ring into counts keyed by (thread ident, raw state, interned stack).
 *
 * Why a module of its own and not part of agent/_fastsample.c: the two share
 * no state and no mechanism (the ticker runs inside GIL holders; this never
 * touches the GIL), and this one must be able to fail its own checks (a
 * kernel that refuses process_vm_readv, an unknown layout) while the GIL
 * walker stays the fallback.
 *
 * Safety. The sampler reads memory other threads write and free while it
 * reads. Every such read goes through process_vm_readv on our own pid, which
 * returns an error instead of faulting on an unmapped address; nothing read
 * is dereferenced directly. What is read is checked before it is used or
 * recorded: a thread state must belong to our interpreter, a frame's owner
 * must be a known value, its code object's type must be PyCode_Type, its
 * instruction pointer must lie inside that code, walks are bounded in depth
 * and length (a corrupt chain cannot loop). A walk whose thread's top frame
 * pointer changed while it walked is torn: dropped and counted, as is a
 * sample with any failed check. The drain validates, with the GIL held, every
 * code address the location tables do not hold yet: the object there must
 * still be a live code object (plausible reference count, PyCode_Type, the
 * same co_filename/co_name/co_firstlineno as at sample time) before it is
 * handed to the tables, which keep it alive from then on (so a code address
 * the tables know is that code object). Anything else is dropped and counted.
 *
 * Frames shown are those f_back / sys._current_frames show: incomplete frames
 * (not past their first RESUME) and the C stack's entry frames are skipped,
 * as _PyFrame_IsIncomplete does.
 */

#define Py_BUILD_CORE_MODULE 1
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(PYPY_VERSION) || defined(GRAALVM_PYTHON)
#  error "agent._native needs CPython"
#endif
#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#  error "agent._native supports CPython 3.11-3.13 only"
#endif
#if defined(Py_LIMITED_API) || defined(Py_GIL_DISABLED)
#  error "agent._native reads interpreter internals of GIL builds"
#endif
#if !defined(__linux__)
#  error "agent._native needs Linux (process_vm_readv, /proc)"
#endif

#include <internal/pycore_frame.h>
#include <internal/pycore_runtime.h>
#include <internal/pycore_interp.h>
#include <internal/pycore_gil.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* Complete frames recorded per thread; deeper stacks keep the leaf-most. */
#define MAX_DEPTH 1024
/* Frames examined per thread, skipped ones included. */
#define MAX_VISITED (4 * MAX_DEPTH)
/* Thread states examined per sample. */
#define MAX_THREADS 1024
/* Walks of one thread per sample before its sample is given up as torn. */
#define WALK_ATTEMPTS 3
/* The ring: thread samples, and frames of those samples. */
#define RING_SAMPLES 16384
#define RING_FRAMES (1 << 18)

/* The raw states of a thread sample (see classify()). */
enum {
    NST_GIL = 0,       /* on a CPU (its clock moved while we looked), holding the GIL */
    NST_NOGIL = 1,     /* on a CPU without the GIL: native code that released it */
    NST_RUNQ = 2,      /* kernel R but its clock did not move: the run queue (see classify) */
    NST_SLEEP = 3,     /* kernel S/D (or stopped), no GIL: blocked, or waiting for the GIL */
    NST_SLEEP_GIL = 4, /* kernel S/D holding the GIL: blocked with it */
    NST_UNKNOWN = 5,   /* the kernel's view could not be read (the thread ended) */
    NST_COUNT = 6
};

/* ------------------------------------------------------------------------
 * Reads that cannot fault.
 * ------------------------------------------------------------------------ */

static pid_t self_pid;

/* Guarded copies. process_vm_readv pins every page it reads
 * (get_user_pages): on the VM of docs/measurements.md that was about half
 * of the sampler's CPU per tick. The sampler thread copies with memcpy
 * instead, under SIGSEGV and SIGBUS handlers of ours: a fault in that copy,
 * and only there, jumps back (siglongjmp) and the read fails as
 * process_vm_readv's would, counted. Any other fault goes to the handler
 * that was there before ours, or, for the default action, the instruction
 * faults again with it put back: a crash of the application looks as it
 * would without us (faulthandler's traceback included). The handler reads
 * no thread-local storage (a loaded module's TLS may allocate on first use):
 * the kernel id of the faulting thread says whose fault it is. Each tick
 * checks that our handlers are still the ones installed; if something
 * replaced them (faulthandler enabled after us, an embedded JVM), that tick
 * reads through process_vm_readv. DYPER_NATIVE_READS=syscall keeps to it. */
static struct sigaction guard_prev[2];   /* SIGSEGV's, SIGBUS's before ours */
static int guard_in[2];                  /* ours were installed (under the GIL) */
static volatile pid_t guard_tid;         /* the thread whose copies are guarded */
static volatile sig_atomic_t guard_armed;
static sigjmp_buf guard_env;
static int guard_tick;                   /* this tick copies under the guard (sampler thread) */
static pthread_t guard_thread;
static uint64_t guard_faults, guard_off_ticks;

static void
guard_handler(int sig, siginfo_t *info, void *uctx)
{
    if (guard_armed && guard_tid != 0 && (pid_t)syscall(SYS_gettid) == guard_tid) {
        guard_armed = 0;
        siglongjmp(guard_env, 1);
    }
    const struct sigaction *prev = &guard_prev[sig == SIGBUS];
    if ((prev->sa_flags & SA_SIGINFO) && prev->sa_sigaction != NULL) {
        prev->sa_sigaction(sig, info, uctx);
        return;
    }
    if (!(prev->sa_flags & SA_SIGINFO) && prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
        return;
    }
    /* The default action: put it back. A fault happens again as the
     * instruction runs again; a signal that was sent is raised again. */
    sigaction(sig, prev, NULL);
    if (info == NULL || info->si_code <= 0) {
        raise(sig);
    }
}

/* The calling thread is the one whose copies are guarded. Its faults must
 * reach the guard's handler: a blocked SIGSEGV would make the kernel kill
 * the process instead. */
static void
guard_become(void)
{
    sigset_t faults;
    sigemptyset(&faults);
    sigaddset(&faults, SIGSEGV);
    sigaddset(&faults, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &faults, NULL);
    guard_thread = pthread_self();
    guard_tid = (pid_t)syscall(SYS_gettid);
}

static int
guard_is_ours(int i)
{
    struct sigaction cur;
    return sigaction(i == 0 ? SIGSEGV : SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO)
           && cur.sa_sigaction == guard_handler;
}

/* Under the GIL, before the sampler thread starts. A handler left in
 * another's chain by an earlier stop (see guard_remove) is not installed
 * again: that one calls ours, which must keep calling what it replaced. */
static void
guard_install(void)
{
    const char *reads = getenv("DYPER_NATIVE_READS");
    if (reads != NULL && strcmp(reads, "syscall") == 0) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = guard_handler;
    /* ONSTACK: a stack overflow in an application thread still reaches
     * faulthandler on its alternate stack. NODEFER: nothing is left blocked
     * after the jump back. */
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 2; i++) {
        if (!guard_in[i] && sigaction(i == 0 ? SIGSEGV : SIGBUS, &sa, &guard_prev[i]) == 0) {
            guard_in[i] = 1;
        }
    }
}

/* After the sampler thread ended: the handlers before ours, where ours are
 * still the ones installed. */
static void
guard_remove(void)
{
    for (int i = 0; i < 2; i++) {
        if (guard_in[i] && guard_is_ours(i) && sigaction(i == 0 ? SIGSEGV : SIGBUS, &guard_prev[i], NULL) == 0) {
            guard_in[i] = 0;
        }
    }
}

/* One copy per pair of iovecs (same lengths), in order; the bytes of the
 * pairs copied whole before a fault, like process_vm_readv. */
static ssize_t
guarded_copy(const struct iovec *local, const struct iovec *remote, unsigned long n)
{
    volatile ssize_t done = 0;
    volatile unsigned long i = 0;
    if (sigsetjmp(guard_env, 0) != 0) {
        __atomic_fetch_add(&guard_faults, 1, __ATOMIC_RELAXED);
        return done;
    }
    guard_armed = 1;
    __asm__ __volatile__("" ::: "memory");
    for (; i < n; i++) {
        memcpy(local[i].iov_base, remote[i].iov_base, local[i].iov_len);
        done += (ssize_t)local[i].iov_len;
    }
    __asm__ __volatile__("" ::: "memory");
    guard_armed = 0;
    return done;
}

/* Our own memory, read so that a bad address fails the read instead of
 * faulting the process. local[i] and remote[i] have the same length. */
static ssize_t
self_readv(struct iovec *local, struct iovec *remote, unsigned long n)
{
    if (guard_tick && pthread_equal(pthread_self(), guard_thread)) {
        return guarded_copy(local, remote, n);
    }
    return process_vm_readv(self_pid, local, n, remote, n, 0);
}

static int
safe_read(void *dst, uintptr_t src, size_t n)
{
    if (src == 0) {
        return -1;
    }
    struct iovec local = {dst, n};
    struct iovec remote = {(void *)src, n};
    ssize_t got = self_readv(&local, &remote, 1);
    return got == (ssize_t)n ? 0 : -1;
}

static int
safe_read_ptr(uintptr_t *dst, uintptr_t src)
{
    return safe_read(dst, src, sizeof(*dst));
}

/* ------------------------------------------------------------------------
 * Version-specific layout.
 * ------------------------------------------------------------------------ */

#define FRAME_HEAD_SIZE offsetof(_PyInterpreterFrame, localsplus)
#define CODE_HEAD_SIZE offsetof(PyCodeObject, co_code_adaptive)

static inline uintptr_t
frame_code_addr(const _PyInterpreterFrame *f)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (uintptr_t)f->f_executable;
#else
    return (uintptr_t)f->f_code;
#endif
}

static inline uintptr_t
frame_instr_addr(const _PyInterpreterFrame *f)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (uintptr_t)f->instr_ptr;
#else
    return (uintptr_t)f->prev_instr;
#endif
}

static inline int
owner_known(int owner)
{
#if PY_VERSION_HEX >= 0x030C0000
    return owner >= FRAME_OWNED_BY_THREAD && owner <= FRAME_OWNED_BY_CSTACK;
#else
    return owner >= FRAME_OWNED_BY_THREAD && owner <= FRAME_OWNED_BY_FRAME_OBJECT;
#endif
}

static inline int
owner_is_cstack(int owner)
{
#if PY_VERSION_HEX >= 0x030C0000
    return owner == FRAME_OWNED_BY_CSTACK;
#else
    (void)owner;
    return 0;
#endif
}

/* The top frame pointer of the thread state at `tstate_addr`, whose copy is
 * `ts`. 0 with no frame; -1 if it cannot be read. */
static int
top_frame(const PyThreadState *ts, uintptr_t *out)
{
#if PY_VERSION_HEX >= 0x030D0000
    *out = (uintptr_t)ts->current_frame;
    return 0;
#else
    uintptr_t cframe = (uintptr_t)ts->cframe;
    if (cframe == 0) {
        *out = 0;
        return 0;
    }
    return safe_read_ptr(out, cframe + offsetof(_PyCFrame, current_frame));
#endif
}

/* Where the GIL's "locked" and "last_holder" live. */
static uintptr_t gil_addr;

static uintptr_t
gil_addr_of(PyInterpreterState *interp)
{
#if PY_VERSION_HEX >= 0x030C0000
    return (uintptr_t)interp->ceval.gil;
#else
    (void)interp;
    return (uintptr_t)&_PyRuntime.ceval.gil;
#endif
}

static uintptr_t
gil_holder_at(uintptr_t addr)
{
    struct _gil_runtime_state g;
    if (safe_read(&g, addr, sizeof(g)) < 0) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030D0000
    return g.locked ? (uintptr_t)g.last_holder : 0;
#else
    /* _Py_atomic_address / _Py_atomic_int: plain words inside */
    return g.locked._value ? (uintptr_t)g.last_holder._value : 0;
#endif
}

/* The main interpreter's GIL lives in static memory (_PyRuntime), which
 * cannot go away: read it directly, with relaxed atomic loads. Anything
 * else through a safe read. */
static int gil_static;

typedef struct {
    uintptr_t last_holder;
    unsigned long switch_number;
    int locked;
} gil_view;

/* The GIL's state, with the thread that last took it even if it let go. A
 * change of holder bumps switch_number (take_gil), so a thread that was not
 * the last holder at one reading, with the same switch_number at a later
 * one, did not run Python code in between, and its frames did not change. */
static int
gil_read(gil_view *v)
{
    struct _gil_runtime_state local;
    struct _gil_runtime_state *g = &local;
    if (gil_static) {
        g = (struct _gil_runtime_state *)gil_addr;
    }
    else if (safe_read(&local, gil_addr, sizeof(local)) < 0) {
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    v->locked = __atomic_load_n(&g->locked, __ATOMIC_ACQUIRE);
    v->last_holder = (uintptr_t)__atomic_load_n(&g->last_holder, __ATOMIC_RELAXED);
#else
    v->locked = __atomic_load_n(&g->locked._value, __ATOMIC_ACQUIRE);
    v->last_holder = __atomic_load_n(&g->last_holder._value, __ATOMIC_RELAXED);
#endif
    v->switch_number = __atomic_load_n(&g->switch_number, __ATOMIC_RELAXED);
    return 0;
}

static uintptr_t
gil_holder_of(PyInterpreterState *interp)
{
    return gil_holder_at(gil_addr_of(interp));
}

/* A check word for a code object: what the drain compares, at the same
 * address, to tell the code seen at sample time from another one. */
static inline uint32_t
code_check(const PyCodeObject *c)
{
    uint64_t h = (uint64_t)(uintptr_t)c->co_filename * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)(uintptr_t)c->co_name * 0xC2B2AE3D27D4EB4FULL;
    h ^= (uint64_t)(uint32_t)c->co_firstlineno * 0x165667B19E3779F9ULL;
    h ^= h >> 29;
    return (uint32_t)(h ^ (h >> 32));
}

/* A reference count a live object may have; a freed block holds an
 * allocator's free-list pointer (or NULL) in that word instead. */
static inline int
plausible_refcnt(Py_ssize_t rc)
{
    return rc > 0 && rc < ((Py_ssize_t)1 << 40);
}

/* ------------------------------------------------------------------------
 * The ring.
 * ------------------------------------------------------------------------ */

typedef struct {
    uintptr_t code;
    int32_t lasti;       /* instruction offset in code units, -1 before the first */
    uint32_t check;      /* code_check() at sample time */
} frame_rec;

typedef struct {
    uint64_t tick;
    uint64_t frame_start;   /* index (monotonic) of its leaf frame in the frame ring */
    unsigned long ident;    /* threading.get_ident() of the thread */
    int32_t native_tid;
    uint16_t depth;
    uint8_t state;
    uint8_t truncated;
} sample_rec;

typedef struct {
    pthread_mutex_t mu;
    /* monotonic counters; the index is counter % size */
    uint64_t s_head, s_tail, f_head, f_tail;
    sample_rec samples[RING_SAMPLES];
    frame_rec frames[RING_FRAMES];
} ring_t;

static ring_t *ring;

/* ------------------------------------------------------------------------
 * The sampler thread's state.
 * ------------------------------------------------------------------------ */


typedef struct {
    /* set by start(), read-only while the thread runs */
    uintptr_t interp;
    unsigned long skip;
    pthread_t thread;
    int running;             /* GIL-protected */

    pthread_mutex_t mu;      /* guards stop, mean_s, spread, gen */
    pthread_cond_t cv;
    int cv_ready;
    int stop;
    double mean_s, spread;
    uint64_t gen;
    uint64_t rng;
    /* The agent's budget guard between two of its wake-ups (as the ticker's
     * in _fastsample.c): seconds of the sampler's CPU allowed per second,
     * seconds available now and at most; rate 0: no bucket. Under mu. */
    double rate, tokens, cap, tokens_at, cost_s;
    double late_s;           /* moving average of how late the thread wakes */
    int wake_fd;             /* written when the ring fills: the agent drains */
    int woken;               /* a byte was written since the last drain */
    int starved;             /* waiting for tokens (under mu) */

    /* serialises ticks (the thread's, and sample_once()'s) */
    pthread_mutex_t tick_mu;
    uint64_t tick;
    /* the tick's thread samples before they enter the ring */
    sample_rec scratch_s[MAX_THREADS];
    frame_rec scratch_f[MAX_DEPTH * 8];

    /* counters, atomics */
    uint64_t ticks, thread_samples, torn, bad, overflow, truncated, unread, frames;
    uint64_t drawn;          /* runnable samples counted on a CPU: the thread was owed one (classify()) */
    uint64_t demoted;        /* samples on a CPU not counted so: the thread's clock had not so much (classify()) */
    uint64_t lost;           /* thread samples given up: every walk of it torn or bad */
    uint64_t reused;         /* thread samples given the thread's last stack: its clock stood still */
    uint64_t code_hits, code_misses;   /* read_code()'s cache */
    uint64_t states[NST_COUNT];
    uint64_t cpu_ns;         /* the sampler thread's CPU clock after its last tick */
    uint64_t exit_cpu_ns;    /* ... when it ended */
    uint64_t tick_ns;        /* wall time spent in ticks */
} sampler_t;

static sampler_t *S;

static inline void
add(uint64_t *c, uint64_t n)
{
    __atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

static uint64_t
now_ns(clockid_t clk)
{
    struct timespec ts;
    if (clock_gettime(clk, &ts) != 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* CPUCLOCK_SCHED of one thread (the kernel's posix-cpu-timers encoding:
 * ~tid << 3, per-thread bit 4, clock 2). EINVAL once the thread is gone. */
static int
thread_cpu_ns(int32_t tid, uint64_t *out)
{
    clockid_t clk = (clockid_t)(((unsigned int)~(unsigned int)tid << 3) | 6);
    struct timespec ts;
    if (clock_gettime(clk, &ts) != 0) {
        return -1;
    }
    *out = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    return 0;
}

/* Per-thread memory from one sample to the next (under tick_mu): the CPU
 * clock and wall time of the last sample (classify()), a kept-open
 * /proc/self/task/TID/stat (one pread per reading instead of open, read,
 * close), and the last stack, reused while the thread's CPU clock stands
 * still (tick_once()). */
#define TID_SLOTS 4096
/* /proc files kept open at most; beyond, a reading opens and closes its own. */
#define MAX_STAT_FDS 256
/* How many samples on a CPU a thread may be owed, or owe (classify()): a
 * burst of CPU we never saw is repaid, but not forever. */
#define OWED_MIN (-8.0)
#define OWED_MAX 8.0
typedef struct {
    int32_t tid;
    int fdp1;                 /* the stat file's fd + 1; 0: none */
    dev_t fd_dev;             /* what that fd was when opened: it is closed */
    ino_t fd_ino;             /* only if it still is (the program may close ours) */
    uint64_t cpu_ns, wall_ns, tick;
    /* Samples on a CPU that its clock says it is owed (see classify()). */
    double owed;
    /* The last stack: in the frames of tick `stack_tick` (only the previous
     * tick's are kept), known current while the clock reads `stack_cpu`. */
    uint64_t stack_tick, stack_cpu;
    uintptr_t stack_ts, stack_dstop, stack_key;
    unsigned long stack_ident, stack_switch;
    uint32_t stack_start;
    uint16_t stack_depth;
    uint8_t stack_trunc;
    uint8_t n_extra;
    uintptr_t extra[4];       /* frames the last walk read on their own (read_frame()) */
} tid_slot;
static tid_slot tid_slots[TID_SLOTS];
static int stat_fds_open;
/* What the sampler read from /proc, since import: the kernel counts it in the
 * process's I/O counters (rchar, syscr), which the io proflet reports as the
 * application's. The thread's own counters end with it; these do not. */
static uint64_t proc_read_bytes, proc_reads;

static ssize_t
counted_pread(int fd, char *buf, size_t size)
{
    ssize_t n = pread(fd, buf, size, 0);
    add(&proc_reads, 1);   /* the kernel counts a failed read too */
    if (n > 0) {
        add(&proc_read_bytes, (uint64_t)n);
    }
    return n;
}

/* Close a slot's stat file, if the fd is still the file we opened. */
static void
slot_close(tid_slot *s)
{
    if (s->fdp1 <= 0) {
        return;
    }
    struct stat st;
    int fd = s->fdp1 - 1;
    if (fstat(fd, &st) == 0 && st.st_dev == s->fd_dev && st.st_ino == s->fd_ino) {
        close(fd);
    }
    s->fdp1 = 0;
    stat_fds_open--;
}

static void
slots_close_all(void)
{
    for (int i = 0; i < TID_SLOTS; i++) {
        slot_close(&tid_slots[i]);
        tid_slots[i].stack_tick = 0;
    }
    stat_fds_open = 0;
}

/* Field 3 of /proc/self/task/TID/stat ('R', 'S', 'D', ...), 0 if unreadable.
 * With a slot, its file stays open: one system call a reading. A thread that
 * ended reads ESRCH through its old fd (even if a new thread has its tid):
 * the file is opened again. */
static char
kernel_state(tid_slot *slot, int32_t tid)
{
    char buf[512];
    ssize_t n = -1;
    if (slot != NULL && slot->fdp1 > 0) {
        n = counted_pread(slot->fdp1 - 1, buf, sizeof(buf) - 1);
        if (n <= 0) {
            slot_close(slot);
        }
    }
    if (n <= 0) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            return 0;
        }
        n = counted_pread(fd, buf, sizeof(buf) - 1);
        struct stat st;
        if (slot != NULL && n > 0 && stat_fds_open < MAX_STAT_FDS && fstat(fd, &st) == 0) {
            slot->fdp1 = fd + 1;
            slot->fd_dev = st.st_dev;
            slot->fd_ino = st.st_ino;
            stat_fds_open++;
        }
        else {
            close(fd);
        }
    }
    if (n <= 0) {
        return 0;
    }
    buf[n] = 0;
    char *p = strrchr(buf, ')');   /* the name may hold spaces and parens */
    if (p == NULL || p[1] != ' ' || p[2] == 0) {
        return 0;
    }
    return p[2];
}

static tid_slot *
tid_lookup(int32_t tid, uint64_t tick)
{
    uint32_t h = (uint32_t)tid * 2654435761u;
    for (uint32_t i = 0; i < 16; i++) {
        tid_slot *s = &tid_slots[(h + i) % TID_SLOTS];
        if (s->tid == tid) {
            return s;
        }
        if (s->tid == 0 || s->tick + 2 < tick) {   /* free, or unseen for two samples */
            slot_close(s);
            s->tid = tid;
            s->cpu_ns = UINT64_MAX;
            s->owed = 0;
            s->tick = tick;
            s->stack_tick = 0;
            s->n_extra = 0;
            return s;
        }
    }
    return NULL;
}

/* The state of a thread at this sample. `cpu0` is its CPU clock read just
 * before its stack was walked, `cpu1` read again after (microseconds later):
 * it was on a CPU if the clock moved in between (the kernel brings a running
 * thread's clock up to date when it is read). If it did not move, the
 * kernel's state letter tells a sleeping thread from a runnable one, which
 * is in a run queue.
 *
 * What we see is not quite the instant drawn: our wake-up takes a CPU and
 * the look tens of microseconds. On a machine with few CPUs it puts back in
 * the queue the thread that was running on ours, and the threads it holds
 * up run or queue while we look. In io-mix (two spinners, a writer woken
 * from each 4-kB write, a sleeper, 2 CPUs) a spinner holding the GIL was
 * runnable and off a CPU in a quarter of the samples for 2-3% of its time,
 * and the writer on a CPU in 12% for 6% of its time.
 *
 * What can be read exactly is how much CPU each thread had: its clock's
 * share of the wall time since its last sample, which is the number of
 * samples on a CPU it is owed. So a thread's runnable sample is counted on
 * a CPU when it is owed half a sample or more, and a sample seen on a CPU
 * is not when it has had half a sample too many (it is counted where its
 * clock says it was: off a CPU). Each thread's samples on a CPU then follow
 * its own clock, and the choice does not depend on the stack, which stays
 * the thread's own. */
static uint8_t
classify(tid_slot *slot, int32_t tid, int holds_gil, uint64_t cpu0, uint64_t cpu1)
{
    /* On a CPU: what the kernel's letter says does not matter. */
    char k = cpu1 > cpu0 ? 'R' : kernel_state(slot, tid);
    if (k == 0) {
        return NST_UNKNOWN;
    }
    uint64_t wall = now_ns(CLOCK_MONOTONIC);
    double p = -1.0;
    if (slot != NULL) {
        if (slot->cpu_ns != UINT64_MAX && wall > slot->wall_ns && cpu1 >= slot->cpu_ns) {
            p = (double)(cpu1 - slot->cpu_ns) / (double)(wall - slot->wall_ns);
        }
        slot->cpu_ns = cpu1;
        slot->wall_ns = wall;
        slot->tick = S->tick;
    }
    int on_cpu = cpu1 > cpu0, queued = !on_cpu && k == 'R';
    if (slot != NULL && p >= 0) {
        slot->owed += p < 1.0 ? p : 1.0;
        if (queued && slot->owed >= 0.5) {
            on_cpu = 1;
            queued = 0;
            add(&S->drawn, 1);
        }
        else if (on_cpu && slot->owed < -0.5) {
            on_cpu = 0;
            add(&S->demoted, 1);
        }
        slot->owed -= on_cpu;
        slot->owed = slot->owed < OWED_MIN ? OWED_MIN : slot->owed > OWED_MAX ? OWED_MAX : slot->owed;
    }
    if (queued) {
        return NST_RUNQ;
    }
    if (on_cpu) {
        return holds_gil ? NST_GIL : NST_NOGIL;
    }
    return holds_gil ? NST_SLEEP_GIL : NST_SLEEP;
}

/* What a walk saw of each frame it visited, for verify(). */
typedef struct {
    uintptr_t addr, previous, code, instr;
} seen_frame;

static seen_frame seen_buf[MAX_VISITED];   /* under tick_mu, or import-time only */
static int n_seen;

/* A copy of the top of the walked thread's data stack (where CPython keeps
 * the frames of the running thread's calls): one read for most of a walk
 * instead of one per frame. Frames outside it are read one by one. */
#define REGION_MAX (64 * 1024)
static unsigned char region_buf[REGION_MAX] __attribute__((aligned(16)));
static const unsigned char *region_ptr = region_buf;   /* the copy of [region_lo, region_hi) */
static uintptr_t region_lo, region_hi;   /* empty: lo == hi */

/* Frames outside the data stack (the C stack's entry frames, generators'
 * frames): the walk notes those it read one by one, and the next tick reads
 * them in its batch with the data stacks (read_tops_regions()), as copies
 * of the same moment. */
#define EXTRA_FRAMES 4
static uintptr_t extra_addr[EXTRA_FRAMES];    /* this walk's batch copies, */
static const unsigned char *extra_copy[EXTRA_FRAMES];   /* NULL: not read */
static uintptr_t missed[EXTRA_FRAMES];        /* the frames outside the data stack this walk read */
static int n_missed;

static int
read_frame(_PyInterpreterFrame *dst, uintptr_t f)
{
    if (f >= region_lo && f < region_hi && region_hi - f >= FRAME_HEAD_SIZE) {
        memcpy(dst, region_ptr + (f - region_lo), FRAME_HEAD_SIZE);
        return 0;
    }
    if (n_missed < EXTRA_FRAMES) {
        missed[n_missed++] = f;
    }
    for (int i = 0; i < EXTRA_FRAMES; i++) {
        if (extra_addr[i] == f && extra_copy[i] != NULL) {
            memcpy(dst, extra_copy[i], FRAME_HEAD_SIZE);
            return 0;
        }
    }
    return safe_read(dst, f, FRAME_HEAD_SIZE);
}

/* The headers of the code objects read lately: the threads of a program
 * share most of their code, and run the same code sample after sample. An
 * entry is used for CODE_TTL_NS at most. A frame that really is one points
 * to a live code object, so the entry for its address is that object's
 * unless the object died and another took its place within the TTL; then
 * the check word recorded is the old object's, and the drain, which
 * validates every address the tables do not hold yet, refuses it (a
 * location the tables hold is alive: its address is still it). The frames
 * themselves are verified (verify()), so a torn chain does not get here. */
#define CODE_SLOTS 1024
#define CODE_TTL_NS 250000000ULL
typedef struct {
    uintptr_t addr;
    uint64_t tick;            /* when read (CLOCK_MONOTONIC ns) */
    Py_ssize_t size;
    int firsttraceable;
    uint32_t check;
} code_slot;
static code_slot code_cache[CODE_SLOTS];
static uint64_t code_tick;   /* now (ns) in this tick; 0: do not cache */

/* The header fields walk() needs of the code object at `code`; -1 if it is
 * not one. */
static int
read_code(uintptr_t code, Py_ssize_t *size, int *firsttraceable, uint32_t *check)
{
    code_slot *slot = NULL;
    if (code_tick != 0) {
        slot = &code_cache[((code >> 4) * 0x9E3779B97F4A7C15ULL >> 40) % CODE_SLOTS];
        if (slot->addr == code && code_tick - slot->tick < CODE_TTL_NS) {
            *size = slot->size;
            *firsttraceable = slot->firsttraceable;
            *check = slot->check;
            S->code_hits++;
            return 0;
        }
    }
    if (slot != NULL) {
        S->code_misses++;
    }
    PyCodeObject cbuf;   /* only the first CODE_HEAD_SIZE bytes are read */
    const PyCodeObject *c = &cbuf;
    if ((code & (sizeof(void *) - 1)) != 0 || safe_read(&cbuf, code, CODE_HEAD_SIZE) < 0) {
        return -1;
    }
    if (Py_TYPE((PyObject *)c) != &PyCode_Type || !plausible_refcnt(Py_REFCNT((PyObject *)c))) {
        return -1;
    }
    *size = Py_SIZE((PyObject *)c);
    *firsttraceable = c->_co_firsttraceable;
    *check = code_check(c);
    if (slot != NULL) {
        slot->addr = code;
        slot->tick = code_tick;
        slot->size = *size;
        slot->firsttraceable = *firsttraceable;
        slot->check = *check;
    }
    return 0;
}

/* Walk one thread's frames into `out` (leaf first). Returns the depth, or -1
 * if the walk failed a check (the sample is dropped). */
static int
walk(uintptr_t top, frame_rec *out, int cap, int *truncated)
{
    int depth = 0;
    int visited = 0;
    uintptr_t f = top;
    _PyInterpreterFrame fbuf;   /* only the first FRAME_HEAD_SIZE bytes are read */
    *truncated = 0;
    n_seen = 0;
    while (f != 0) {
        if (++visited > MAX_VISITED) {
            return -1;   /* a chain this long is a loop or garbage */
        }
        if (depth >= cap) {
            *truncated = 1;
            break;
        }
        if ((f & (sizeof(void *) - 1)) != 0 || read_frame(&fbuf, f) < 0) {
            return -1;
        }
        const _PyInterpreterFrame *fr = &fbuf;
        int owner = fr->owner;
        if (!owner_known(owner)) {
            return -1;
        }
        uintptr_t prev = (uintptr_t)fr->previous;
        seen_frame *sf = &seen_buf[n_seen++];
        sf->addr = f;
        sf->previous = prev;
        sf->code = frame_code_addr(fr);
        sf->instr = frame_instr_addr(fr);
        if (owner_is_cstack(owner)) {
            f = prev;
            continue;
        }
        uintptr_t code = frame_code_addr(fr);
        Py_ssize_t size;
        int firsttraceable;
        uint32_t check;
        if (read_code(code, &size, &firsttraceable, &check) < 0) {
            return -1;
        }
        intptr_t diff = (intptr_t)(frame_instr_addr(fr) - (code + CODE_HEAD_SIZE));
        if (size <= 0 || diff % (intptr_t)sizeof(_Py_CODEUNIT) != 0) {
            return -1;
        }
        intptr_t units = diff / (intptr_t)sizeof(_Py_CODEUNIT);
        if (units < -1 || units >= size) {
            return -1;
        }
        if (owner != FRAME_OWNED_BY_GENERATOR && units < firsttraceable) {
            f = prev;    /* incomplete: not shown by f_back either */
            continue;
        }
        out[depth].code = code;
        out[depth].lasti = (int32_t)units;
        out[depth].check = check;
        depth++;
        f = prev;
    }
    return depth;
}

/* Read every frame the last walk visited again, in as few system calls as
 * possible, and compare: a frame popped and its memory reused while the walk
 * went on (the thread kept running) shows as a changed link, code object or,
 * in a caller, instruction. Popped frames stay in memory as they were,
 * above the thread's data-stack top, so the same copy first reads that top
 * (the kernel copies in order, microseconds apart): a frame of the walk in
 * the current chunk but at or above the top is gone, and the walk is torn
 * even if its memory still reads the same. A thread that runs can also come
 * back to the very same top frame address by the time the walk ends, so the
 * top frame pointer alone does not tell either. Returns 0 if all is as the
 * walk saw it. */
#define VERIFY_BATCH 256
_Static_assert(offsetof(PyThreadState, datastack_top) == offsetof(PyThreadState, datastack_chunk) + sizeof(void *)
               && offsetof(PyThreadState, datastack_limit) == offsetof(PyThreadState, datastack_top) + sizeof(void *),
               "verify() reads the data stack's chunk, top and limit in one piece");
/* The same, and the thread's top frame pointer read last, in the last batch:
 * it must still be `top` (through the same `cframe` before 3.13). */
static int
verify(uintptr_t tstate_addr, uintptr_t top, uintptr_t cframe)
{
    static _PyInterpreterFrame again[VERIFY_BATCH];   /* under tick_mu */
    struct iovec local[VERIFY_BATCH + 3], remote[VERIFY_BATCH + 3];
    uintptr_t ds[3];   /* datastack_chunk, datastack_top, datastack_limit */
    uintptr_t top_again[2] = {0, 0};   /* (cframe,) current_frame */
    local[0].iov_base = ds;
    local[0].iov_len = sizeof(ds);
    remote[0].iov_base = (void *)(tstate_addr + offsetof(PyThreadState, datastack_chunk));
    remote[0].iov_len = sizeof(ds);
    int base = 0;
    do {
        int n = n_seen - base < VERIFY_BATCH ? n_seen - base : VERIFY_BATCH;
        int first = base == 0 ? 1 : 0;   /* the data stack's top goes with the first batch */
        int last = base + n >= n_seen;   /* the top frame pointer with the last */
        for (int i = 0; i < n; i++) {
            local[first + i].iov_base = &again[i];
            local[first + i].iov_len = FRAME_HEAD_SIZE;
            remote[first + i].iov_base = (void *)seen_buf[base + i].addr;
            remote[first + i].iov_len = FRAME_HEAD_SIZE;
        }
        int k = first + n, extra = 0;
        if (last) {
#if PY_VERSION_HEX >= 0x030D0000
            (void)cframe;
            local[k].iov_base = &top_again[1];
            local[k].iov_len = sizeof(uintptr_t);
            remote[k].iov_base = (void *)(tstate_addr + offsetof(PyThreadState, current_frame));
            remote[k].iov_len = sizeof(uintptr_t);
            extra = 1;
#else
            if (cframe == 0) {
                return -1;
            }
            local[k].iov_base = &top_again[0];
            local[k].iov_len = sizeof(uintptr_t);
            remote[k].iov_base = (void *)(tstate_addr + offsetof(PyThreadState, cframe));
            remote[k].iov_len = sizeof(uintptr_t);
            local[k + 1].iov_base = &top_again[1];
            local[k + 1].iov_len = sizeof(uintptr_t);
            remote[k + 1].iov_base = (void *)(cframe + offsetof(_PyCFrame, current_frame));
            remote[k + 1].iov_len = sizeof(uintptr_t);
            extra = 2;
#endif
        }
        ssize_t want = (ssize_t)(n * FRAME_HEAD_SIZE) + (first ? (ssize_t)sizeof(ds) : 0)
                       + (ssize_t)(extra * sizeof(uintptr_t));
        ssize_t got = self_readv(local + (1 - first), remote + (1 - first), (unsigned long)(n + first + extra));
        if (got != want) {
            return -1;
        }
        uintptr_t chunk_lo = ds[0] + offsetof(_PyStackChunk, data), ds_top = ds[1], limit = ds[2];
        for (int i = 0; i < n; i++) {
            const seen_frame *sf = &seen_buf[base + i];
            if (sf->addr >= chunk_lo && sf->addr < limit && sf->addr >= ds_top) {
                return -1;   /* above the top: popped */
            }
            if ((uintptr_t)again[i].previous != sf->previous || frame_code_addr(&again[i]) != sf->code) {
                return -1;
            }
            /* The leaf moves on as it runs; a caller's position is fixed while its callee lives. */
            if (base + i > 0 && frame_instr_addr(&again[i]) != sf->instr) {
                return -1;
            }
        }
        if (last) {
#if PY_VERSION_HEX < 0x030D0000
            if (top_again[0] != cframe) {
                return -1;
            }
#endif
            if (top_again[1] != top) {
                return -1;
            }
        }
        base += n;
    } while (base < n_seen);
    return 0;
}

/* The frames of this tick's samples, and of the previous tick's (whose
 * stacks a thread that did not run since gets again): two buffers, swapped
 * at each tick. Under tick_mu. */
static frame_rec scratch_f2[MAX_DEPTH * 8];
static frame_rec *tick_f, *prev_f;

/* Push the scratch samples of a tick into the ring, dropping the oldest to
 * make room. */
static void
ring_commit(int ns, int nf_total)
{
    pthread_mutex_lock(&ring->mu);
    uint64_t dropped = 0;
    for (int i = 0; i < ns; i++) {
        sample_rec *s = &S->scratch_s[i];
        uint64_t d = s->depth;
        while (ring->s_head - ring->s_tail >= RING_SAMPLES
               || ring->f_head + d - ring->f_tail > RING_FRAMES) {
            if (ring->s_tail == ring->s_head) {
                ring->f_tail = ring->f_head;
                break;
            }
            ring->s_tail++;
            ring->f_tail = ring->s_tail == ring->s_head
                ? ring->f_head
                : ring->samples[ring->s_tail % RING_SAMPLES].frame_start;
            dropped++;
        }
        uint64_t start = ring->f_head;
        for (uint64_t j = 0; j < d; j++) {
            ring->frames[(start + j) % RING_FRAMES] = tick_f[s->frame_start + j];
        }
        ring->f_head += d;
        sample_rec *dst = &ring->samples[ring->s_head % RING_SAMPLES];
        *dst = *s;
        dst->frame_start = start;
        ring->s_head++;
    }
    int wake = ring->s_head - ring->s_tail >= RING_SAMPLES / 4 && !S->woken;
    if (wake) {
        S->woken = 1;
    }
    pthread_mutex_unlock(&ring->mu);
    (void)nf_total;
    int fd = __atomic_load_n(&S->wake_fd, __ATOMIC_ACQUIRE);
    if (wake && fd >= 0) {
        char c = 'n';
        ssize_t rc = write(fd, &c, 1);   /* non-blocking pipe; a full one wakes it already */
        (void)rc;
    }
    if (dropped) {
        add(&S->overflow, dropped);
    }
}

/* What identifies the top of a thread's stack in its thread state: the top
 * frame itself (3.13), or the C frame holding it. */
static inline uintptr_t
top_key(const PyThreadState *ts)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (uintptr_t)ts->current_frame;
#else
    return (uintptr_t)ts->cframe;
#endif
}

/* The top frame pointer of the thread state copied in `ts` (0: none), and a
 * copy of the top of its data stack into region_buf, in one system call.
 * -1 if the top frame pointer could not be read; the region is left empty
 * if it could not. */
static int
read_top_region(const PyThreadState *ts, uintptr_t *top)
{
    struct iovec local[2], remote[2];
    int k = 0;
    size_t need = 0;
    region_lo = region_hi = 0;
    region_ptr = region_buf;
#if PY_VERSION_HEX >= 0x030D0000
    *top = (uintptr_t)ts->current_frame;
    if (*top == 0) {
        return 0;
    }
#else
    uintptr_t cframe = (uintptr_t)ts->cframe;
    *top = 0;
    if (cframe == 0) {
        return 0;
    }
    local[0].iov_base = top;
    local[0].iov_len = sizeof(*top);
    remote[0].iov_base = (void *)(cframe + offsetof(_PyCFrame, current_frame));
    remote[0].iov_len = sizeof(*top);
    k = 1;
    need = sizeof(*top);
#endif
    uintptr_t chunk = (uintptr_t)ts->datastack_chunk, ds_top = (uintptr_t)ts->datastack_top, lo = 0;
    if (chunk != 0 && ds_top > chunk + offsetof(_PyStackChunk, data)) {
        lo = chunk + offsetof(_PyStackChunk, data);
        if (ds_top - lo > REGION_MAX) {
            lo = (ds_top - REGION_MAX) & ~(uintptr_t)(sizeof(void *) - 1);
        }
        local[k].iov_base = region_buf;
        local[k].iov_len = ds_top - lo;
        remote[k].iov_base = (void *)lo;
        remote[k].iov_len = ds_top - lo;
        k++;
    }
    if (k == 0) {
        return 0;
    }
    ssize_t got = self_readv(local, remote, (unsigned long)k);
    if (got < 0 || (size_t)got < need) {
        return -1;
    }
    if (lo != 0 && (size_t)got == need + (ds_top - lo)) {
        region_lo = lo;
        region_hi = ds_top;
    }
    return 0;
}

/* A tick's view of one thread, between its phases. */
typedef struct {
    uintptr_t addr;
    PyThreadState ts;
    tid_slot *slot;
    uint64_t cpu0;
    int have_cpu0;
    int top_ok;            /* top read by the batch */
    uintptr_t top;
    uintptr_t cframe_again;   /* before 3.13: the C frame pointer, read again by the batch */
    uintptr_t region_lo, region_hi;   /* the batch's copy, at region_off in region_pool */
    size_t region_off;
    int extra_at;          /* its frames in extra_pool, EXTRA_FRAMES from there */
    uint8_t extra_ok[EXTRA_FRAMES];
} tick_thread;

static tick_thread tick_threads[MAX_THREADS];   /* under tick_mu */
/* The thread states' addresses in list order at the last tick: all read
 * again in one system call, and the list taken as is if it still links them
 * in that order (each `next`, and the head). */
static uintptr_t list_cache[MAX_THREADS];
static int n_list_cache;
/* The batch's copies of the data stacks' tops, REGION_MAX at most each;
 * threads beyond it read theirs on their own. */
#define REGION_POOL (512 * 1024)
static unsigned char region_pool[REGION_POOL] __attribute__((aligned(16)));
static _PyInterpreterFrame extra_pool[MAX_THREADS * EXTRA_FRAMES];   /* only their heads are read */
/* iovecs per process_vm_readv (the kernel's UIO_MAXIOV) */
#define IOV_BATCH 1024

/* Read the thread states into tick_threads, in list order; returns how many
 * (the prefix read before a failure, counted in *bad), -1 if the list's head
 * could not be read. */
static int
read_threads(int *bad)
{
    static struct iovec local[IOV_BATCH], remote[IOV_BATCH];
    uintptr_t head_at = S->interp + offsetof(PyInterpreterState, threads.head);
    uintptr_t head;
    int n = n_list_cache;
    if (n > 0 && n + 1 <= IOV_BATCH) {
        local[0].iov_base = &head;
        local[0].iov_len = sizeof(head);
        remote[0].iov_base = (void *)head_at;
        remote[0].iov_len = sizeof(head);
        for (int i = 0; i < n; i++) {
            local[i + 1].iov_base = &tick_threads[i].ts;
            local[i + 1].iov_len = sizeof(PyThreadState);
            remote[i + 1].iov_base = (void *)list_cache[i];
            remote[i + 1].iov_len = sizeof(PyThreadState);
        }
        ssize_t got = self_readv(local, remote, (unsigned long)(n + 1));
        int ok = got == (ssize_t)(sizeof(head) + (size_t)n * sizeof(PyThreadState)) && head == list_cache[0];
        for (int i = 0; ok && i < n; i++) {
            const PyThreadState *ts = &tick_threads[i].ts;
            uintptr_t want = i + 1 < n ? list_cache[i + 1] : 0;
            ok = (uintptr_t)ts->interp == S->interp && (uintptr_t)ts->next == want;
            tick_threads[i].addr = list_cache[i];
        }
        if (ok) {
            return n;
        }
    }
    /* The list changed (or first time): one thread state after the other. */
    if (safe_read_ptr(&head, head_at) < 0) {
        return -1;
    }
    n = 0;
    uintptr_t ts_addr = head;
    while (ts_addr != 0) {
        if (n >= MAX_THREADS) {
            (*bad)++;
            break;
        }
        PyThreadState *ts = &tick_threads[n].ts;
        if ((ts_addr & (sizeof(void *) - 1)) != 0 || safe_read(ts, ts_addr, sizeof(*ts)) < 0) {
            (*bad)++;
            break;
        }
        if ((uintptr_t)ts->interp != S->interp) {
            (*bad)++;     /* freed and reused under us: the rest of the list is not ours */
            break;
        }
        tick_threads[n].addr = ts_addr;
        list_cache[n] = ts_addr;
        n++;
        ts_addr = (uintptr_t)ts->next;
    }
    n_list_cache = ts_addr == 0 ? n : 0;   /* a list read whole is the guess for the next tick */
    return n;
}

/* The top frame pointers (before 3.13) and data-stack tops of the threads
 * `which[0..m)` in one system call. Those it does not reach read theirs on
 * their own (top_ok 0). */
static void
read_tops_regions(const int *which, int m)
{
    static struct iovec local[IOV_BATCH], remote[IOV_BATCH];
    static int owner[IOV_BATCH], kind[IOV_BATCH];   /* thread, 0: top 1: region 2: C frame */
    size_t pool = 0;
    int k = 0;
    for (int j = 0; j < m; j++) {
        tick_thread *t = &tick_threads[which[j]];
        const PyThreadState *ts = &t->ts;
        t->top_ok = 0;
        t->region_lo = t->region_hi = 0;
        if (k + 3 > IOV_BATCH) {
            continue;
        }
        /* The top frame pointer read again here, after the GIL's state the
         * walk's stillness is judged from (tick_once()): before 3.13 the C
         * frame pointer too, which must be the thread state's copy's. */
#if PY_VERSION_HEX >= 0x030D0000
        local[k].iov_base = &t->top;
        local[k].iov_len = sizeof(t->top);
        remote[k].iov_base = (void *)(t->addr + offsetof(PyThreadState, current_frame));
        remote[k].iov_len = sizeof(t->top);
        owner[k] = which[j];
        kind[k] = 0;
        k++;
#else
        local[k].iov_base = &t->cframe_again;
        local[k].iov_len = sizeof(t->cframe_again);
        remote[k].iov_base = (void *)(t->addr + offsetof(PyThreadState, cframe));
        remote[k].iov_len = sizeof(t->cframe_again);
        owner[k] = which[j];
        kind[k] = 2;
        k++;
        local[k].iov_base = &t->top;
        local[k].iov_len = sizeof(t->top);
        remote[k].iov_base = (void *)((uintptr_t)ts->cframe + offsetof(_PyCFrame, current_frame));
        remote[k].iov_len = sizeof(t->top);
        owner[k] = which[j];
        kind[k] = 0;
        k++;
#endif
        uintptr_t chunk = (uintptr_t)ts->datastack_chunk, ds_top = (uintptr_t)ts->datastack_top;
        if (chunk != 0 && ds_top > chunk + offsetof(_PyStackChunk, data)) {
            uintptr_t lo = chunk + offsetof(_PyStackChunk, data);
            if (ds_top - lo > REGION_MAX) {
                lo = (ds_top - REGION_MAX) & ~(uintptr_t)(sizeof(void *) - 1);
            }
            size_t len = ds_top - lo;
            if (pool + len <= REGION_POOL) {
                t->region_off = pool;
                local[k].iov_base = region_pool + pool;
                local[k].iov_len = len;
                remote[k].iov_base = (void *)lo;
                remote[k].iov_len = len;
                owner[k] = which[j];
                kind[k] = 1;
                k++;
                pool += (len + 15) & ~(size_t)15;
                t->region_lo = lo;   /* hi set once read */
            }
        }
    }
    /* Last, as they may be gone (a thread's C stack unmapped): the frames
     * each thread's last walk read on their own. */
    for (int j = 0; j < m; j++) {
        tick_thread *t = &tick_threads[which[j]];
        t->extra_at = which[j] * EXTRA_FRAMES;
        memset(t->extra_ok, 0, sizeof(t->extra_ok));
        int ne = t->slot != NULL ? t->slot->n_extra : 0;
        for (int e = 0; e < ne && k < IOV_BATCH; e++) {
            local[k].iov_base = &extra_pool[t->extra_at + e];
            local[k].iov_len = FRAME_HEAD_SIZE;
            remote[k].iov_base = (void *)t->slot->extra[e];
            remote[k].iov_len = FRAME_HEAD_SIZE;
            owner[k] = which[j];
            kind[k] = 3 + e;
            k++;
        }
    }
    if (k == 0) {
        return;
    }
    ssize_t got = self_readv(local, remote, (unsigned long)k);
    size_t left = got < 0 ? 0 : (size_t)got;
    for (int i = 0; i < k; i++) {
        tick_thread *t = &tick_threads[owner[i]];
        int whole = left >= local[i].iov_len;
        left = whole ? left - local[i].iov_len : 0;
#if PY_VERSION_HEX < 0x030D0000
        if (kind[i] == 2) {
            t->top_ok = whole && t->cframe_again == (uintptr_t)t->ts.cframe ? 1 : -1;
            continue;
        }
#endif
        if (kind[i] >= 3) {
            t->extra_ok[kind[i] - 3] = (uint8_t)whole;
            continue;
        }
        if (kind[i] == 2) {
            continue;
        }
        if (kind[i] == 0) {
            t->top_ok = whole && t->top_ok >= 0;
        }
        else if (whole) {
            t->region_hi = (uintptr_t)remote[i].iov_base + local[i].iov_len;
        }
        else {
            t->region_lo = 0;
        }
    }
}

/* One sample of every thread. Under tick_mu. Never calls the C API.
 *
 * In phases, so that the reads of all threads go in few system calls: the
 * thread states (one call, if the list is as it was), each thread's CPU
 * clock, the top frames and data-stack tops of those to walk (one call),
 * then each walk, checked as before.
 *
 * A thread whose CPU clock reads what it read just after its last walk (in
 * the previous tick, a walk during which the clock did not move either) has
 * not run a single instruction since: its frames are as they were, and it
 * gets its last stack again without a walk. Its thread state must agree
 * (same address, ident, data-stack top and top frame or C frame). */
static void
tick_once(void)
{
    uint64_t t0 = now_ns(CLOCK_MONOTONIC);
    S->tick++;
    code_tick = t0;
    if (tick_f == NULL || tick_f == scratch_f2) {
        tick_f = S->scratch_f;
        prev_f = scratch_f2;
    }
    else {
        tick_f = scratch_f2;
        prev_f = S->scratch_f;
    }
    int ns = 0, nf = 0;
    const int fcap = (int)(sizeof(S->scratch_f) / sizeof(S->scratch_f[0]));
    int nbad = 0;
    uint64_t torn = 0, bad = 0, trunc = 0, lost = 0, reused = 0;
    /* The GIL's state is read before the thread states: a walk is known
     * still (see below) only if the thread ran no Python code from the
     * moment its top frame pointer was read to the end of the walk. */
    gil_view g_pre = {0, 0, 0};
    int have_g_pre = gil_read(&g_pre) == 0;
    int nthreads = read_threads(&nbad);
    bad += (uint64_t)nbad;
    if (nthreads < 0) {
        add(&S->unread, 1);
        return;
    }
    static int to_walk[MAX_THREADS];
    int n_walk = 0;
    for (int i = 0; i < nthreads; i++) {
        tick_thread *t = &tick_threads[i];
        const PyThreadState *ts = &t->ts;
        int32_t ntid = (int32_t)ts->native_thread_id;
        t->slot = NULL;
        t->have_cpu0 = 0;
        if (ts->thread_id == S->skip || top_key(ts) == 0) {
            continue;
        }
        t->slot = ntid > 0 ? tid_lookup(ntid, S->tick) : NULL;
        t->have_cpu0 = ntid > 0 && thread_cpu_ns(ntid, &t->cpu0) == 0;
        to_walk[n_walk++] = i;
    }
    /* The walks' stillness is judged from here (see read_tops_regions()). */
    gil_view g_mid = {0, 0, 0};
    int have_g_mid = gil_read(&g_mid) == 0;
    if (n_walk > 0) {
        read_tops_regions(to_walk, n_walk);
    }
    for (int j = 0; j < n_walk; j++) {
        tick_thread *t = &tick_threads[to_walk[j]];
        PyThreadState *ts = &t->ts;
        uintptr_t ts_addr = t->addr;
        unsigned long ident = ts->thread_id;
        int32_t ntid = (int32_t)ts->native_thread_id;
        tid_slot *slot = t->slot;
        uint64_t cpu0 = t->cpu0, cpu1 = 0;
        int have_cpu0 = t->have_cpu0;
        if (ns >= MAX_THREADS) {
            break;
        }
        int truncated = 0;
        int room = fcap - nf;
        if (room > MAX_DEPTH) {
            room = MAX_DEPTH;
        }
        if (room <= 0) {
            trunc++;
            continue;
        }
        if (slot != NULL && have_cpu0 && slot->stack_tick != 0 && slot->stack_tick + 1 == S->tick
            && slot->stack_cpu == cpu0 && slot->stack_ts == ts_addr && slot->stack_ident == ident
            && slot->stack_dstop == (uintptr_t)ts->datastack_top && slot->stack_key == top_key(ts)
            && (int)slot->stack_depth <= room
            && !(have_g_pre && g_pre.last_holder == ts_addr && g_pre.switch_number != slot->stack_switch)) {
            /* It did not run since its last walk: the same stack. */
            int depth = slot->stack_depth;
            memcpy(&tick_f[nf], &prev_f[slot->stack_start], (size_t)depth * sizeof(frame_rec));
            int holds = have_g_pre && g_pre.locked && g_pre.last_holder == ts_addr;
            uint8_t st = classify(slot, ntid, holds, cpu0, cpu0);
            slot->stack_tick = S->tick;
            slot->stack_start = (uint32_t)nf;
            sample_rec *s = &S->scratch_s[ns++];
            s->tick = S->tick;
            s->frame_start = (uint64_t)nf;
            s->ident = ident;
            s->native_tid = ntid;
            s->depth = (uint16_t)depth;
            s->state = st;
            s->truncated = slot->stack_trunc;
            trunc += (uint64_t)slot->stack_trunc;
            nf += depth;
            add(&S->states[st], 1);
            reused++;
            continue;
        }
        if (slot != NULL) {
            slot->stack_tick = 0;
        }
        /* A walk of a thread that runs may be torn (its frames changed under
         * us): it is dropped, and the thread walked again from its current
         * top, a few times, so that threads that run are not the ones whose
         * samples go missing. */
        int have_g = 0, depth = -1, torn_now = 0, skip = 0;
        uintptr_t top = 0;
        gil_view g0 = {0, 0, 0}, g1 = {0, 0, 0};
        for (int attempt = 0; attempt < WALK_ATTEMPTS; attempt++) {
            int got_top;
            if (attempt == 0 && t->top_ok > 0) {
                g0 = g_mid;
                have_g = have_g_mid;
            }
            else {
                have_g = gil_read(&g0) == 0;
                if (safe_read(ts, ts_addr, sizeof(*ts)) < 0 || (uintptr_t)ts->interp != S->interp
                    || ts->thread_id != ident) {
                    depth = -1;
                    break;   /* it ended meanwhile */
                }
                have_cpu0 = ntid > 0 && thread_cpu_ns(ntid, &cpu0) == 0;
            }
            if (attempt == 0 && t->top_ok > 0) {
                top = t->top;
                got_top = 0;
                region_ptr = region_pool + t->region_off;
                region_lo = t->region_lo;
                region_hi = t->region_lo != 0 ? t->region_hi : 0;
                if (region_hi == 0) {
                    region_lo = 0;
                }
                for (int e = 0; e < EXTRA_FRAMES; e++) {
                    int have = slot != NULL && e < slot->n_extra && t->extra_ok[e];
                    extra_addr[e] = have ? slot->extra[e] : 0;
                    extra_copy[e] = have ? (const unsigned char *)&extra_pool[t->extra_at + e] : NULL;
                }
            }
            else {
                got_top = read_top_region(ts, &top);
            }
            if (got_top < 0 || top == 0) {
                region_lo = region_hi = 0;
                if (attempt == 0) {
                    skip = 1;   /* no frame (yet, or any more) */
                }
                depth = -1;
                break;
            }
            n_missed = 0;
            depth = walk(top, &tick_f[nf], room, &truncated);
            region_lo = region_hi = 0;
            for (int e = 0; e < EXTRA_FRAMES; e++) {
                extra_addr[e] = 0;
                extra_copy[e] = NULL;
            }
            if (slot != NULL) {
                /* for the next tick's batch */
                slot->n_extra = (uint8_t)n_missed;
                memcpy(slot->extra, missed, sizeof(missed));
            }
            have_g = have_g && gil_read(&g1) == 0;
            /* Not the last holder, and no other thread took the GIL since: it
             * ran no Python code while we walked, so what we read is what it has. */
            int still = have_g && g0.last_holder != ts_addr && g1.last_holder == g0.last_holder
                        && g1.switch_number == g0.switch_number;
#if PY_VERSION_HEX >= 0x030D0000
            uintptr_t cframe = 0;
#else
            uintptr_t cframe = (uintptr_t)ts->cframe;
#endif
            torn_now = 0;
            if (depth < 0) {
                bad++;
            }
            else if (!still && verify(ts_addr, top, cframe) < 0) {
                torn++;
                torn_now = 1;
            }
            else {
                break;
            }
        }
        if (skip) {
            continue;
        }
        if (depth < 0 || torn_now) {
            lost++;
        }
        else if (depth > 0) {
            int holds = have_g && g1.locked && g1.last_holder == ts_addr;
            int have_cpu1 = have_cpu0 && thread_cpu_ns(ntid, &cpu1) == 0;
            uint8_t st = have_cpu1 ? classify(slot, ntid, holds, cpu0, cpu1) : NST_UNKNOWN;
            if (slot != NULL && have_cpu1 && have_g && cpu1 == cpu0 && st != NST_UNKNOWN) {
                /* It did not run while we walked: this stack is what it has,
                 * for as long as its clock stands still. */
                slot->stack_tick = S->tick;
                slot->stack_cpu = cpu1;
                slot->stack_ts = ts_addr;
                slot->stack_ident = ident;
                slot->stack_dstop = (uintptr_t)ts->datastack_top;
                slot->stack_key = top_key(ts);
                slot->stack_switch = g1.switch_number;
                slot->stack_start = (uint32_t)nf;
                slot->stack_depth = (uint16_t)depth;
                slot->stack_trunc = (uint8_t)truncated;
            }
            sample_rec *s = &S->scratch_s[ns++];
            s->tick = S->tick;
            s->frame_start = (uint64_t)nf;
            s->ident = ident;
            s->native_tid = ntid;
            s->depth = (uint16_t)depth;
            s->state = st;
            s->truncated = (uint8_t)truncated;
            trunc += (uint64_t)truncated;
            nf += depth;
            add(&S->states[st], 1);
        }
    }
    region_ptr = region_buf;
    code_tick = 0;
    ring_commit(ns, nf);
    add(&S->ticks, 1);
    add(&S->thread_samples, (uint64_t)ns);
    add(&S->frames, (uint64_t)nf);
    if (reused) {
        add(&S->reused, reused);
    }
    if (torn) {
        add(&S->torn, torn);
    }
    if (bad) {
        add(&S->bad, bad);
    }
    if (trunc) {
        add(&S->truncated, trunc);
    }
    if (lost) {
        add(&S->lost, lost);
    }
    add(&S->tick_ns, now_ns(CLOCK_MONOTONIC) - t0);
}

/* xorshift64*, then Box-Muller: a gaussian delay around the mean. Under mu. */
static double
uniform01(void)
{
    uint64_t x = S->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    S->rng = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}

static double
next_delay(void)
{
    double u1 = uniform01(), u2 = uniform01();
    if (u1 < 1e-12) {
        u1 = 1e-12;
    }
    double g = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    double d = S->mean_s * (1.0 + S->spread * g);
    double floor = S->mean_s * 0.1;
    return d < floor ? floor : d;
}

static struct timespec
abs_time(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (ts.tv_nsec < 0) {
        ts.tv_nsec = 0;
    }
    return ts;
}

static void *
sampler_main(void *arg)
{
    (void)arg;
    guard_become();
    /* Named for the kernel, as the agent's own threads are: the io proflet
     * leaves their I/O counters (our /proc reads) out of the application's. */
    pthread_setname_np(pthread_self(), "dyper-native");
    /* Wake at the instant drawn, not at the next timer of the process's that
     * falls within the default 50-us slack: the kernel fires every timer
     * whose slack has begun when one expires, so a sampler with slack wakes
     * with the application's own timeouts (a GIL waiter's 5-ms wait ends, it
     * runs) and its instants are no longer random. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    uint64_t c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    pthread_mutex_lock(&S->mu);
    uint64_t gen = S->gen;
    double next = (double)now_ns(CLOCK_MONOTONIC) * 1e-9 + (S->mean_s > 0 ? next_delay() : 0.0);
    while (!S->stop) {
        double wake = S->mean_s > 0 ? next : (double)now_ns(CLOCK_MONOTONIC) * 1e-9 + 3600.0;
        struct timespec ts = abs_time(wake);
        int rc = pthread_cond_timedwait(&S->cv, &S->mu, &ts);
        if (S->stop) {
            break;
        }
        double now = (double)now_ns(CLOCK_MONOTONIC) * 1e-9;
        int due = rc == ETIMEDOUT && now >= wake && S->mean_s > 0;
        if (S->gen != gen) {
            gen = S->gen;
            if (!due) {
                double fresh = now + (S->mean_s > 0 ? next_delay() : 0.0);
                if (!(next > now && next < fresh)) {
                    next = fresh;
                }
                continue;
            }
            /* due anyway: sample, the next delay is drawn with the new mean */
        }
        if (!due) {
            if (S->starved && S->rate > 0 && S->tokens >= S->cost_s) {
                next = now;   /* the agent gave it tokens: sample now */
            }
            continue;
        }
        S->late_s += 0.05 * ((now - wake) - S->late_s);
        if (S->rate > 0) {
            double elapsed = now - S->tokens_at;
            if (elapsed > 0) {
                S->tokens += elapsed * S->rate;
                if (S->tokens > S->cap) {
                    S->tokens = S->cap;
                }
            }
            S->tokens_at = now;
            if (S->tokens < S->cost_s) {
                /* over budget until the bucket refills, or the agent sets new tokens */
                double w = (S->cost_s - S->tokens) / S->rate;
                next = now + (w < 3600.0 ? w : 3600.0);
                S->starved = 1;
                continue;
            }
        }
        S->starved = 0;
        next = now + next_delay();
        pthread_mutex_unlock(&S->mu);
        pthread_mutex_lock(&S->tick_mu);
        guard_tick = guard_in[0] && guard_in[1] && guard_is_ours(0) && guard_is_ours(1);
        if (!guard_tick) {
            add(&guard_off_ticks, 1);
        }
        tick_once();
        guard_tick = 0;
        pthread_mutex_unlock(&S->tick_mu);
        /* The tick's cost is the thread's CPU since the last tick's end: its
         * wake-up included, and one clock read a tick. */
        uint64_t c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        __atomic_store_n(&S->cpu_ns, c1, __ATOMIC_RELAXED);
        pthread_mutex_lock(&S->mu);
        double cost = (double)(c1 - c0) * 1e-9;
        c0 = c1;
        S->cost_s += 0.1 * (cost - S->cost_s);
        if (S->rate > 0) {
            S->tokens -= cost;
        }
    }
    pthread_mutex_unlock(&S->mu);
    __atomic_store_n(&S->exit_cpu_ns, now_ns(CLOCK_THREAD_CPUTIME_ID), __ATOMIC_RELAXED);
    return NULL;
}

static void
after_fork_child(void)
{
    /* Only the forking thread survives: no sampler thread, and the locks may
     * have been held by it. */
    if (S == NULL) {
        return;
    }
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    S->mu = fresh;
    S->tick_mu = fresh;
    ring->mu = fresh;
    /* the parent's samples are not the child's */
    ring->s_tail = ring->s_head;
    ring->f_tail = ring->f_head;
    S->cv_ready = 0;
    S->running = 0;
    S->stop = 0;
    S->starved = 0;
    S->wake_fd = -1;
    self_pid = getpid();
    guard_tid = 0;       /* the child has no sampler thread */
    slots_close_all();   /* the parent's threads' files */
}

/* ------------------------------------------------------------------------
 * Python functions (called with the GIL).
 * ------------------------------------------------------------------------ */

static int
init_cv(void)
{
    if (S->cv_ready) {
        return 0;
    }
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) {
        return -1;
    }
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0) {
        rc = pthread_cond_init(&S->cv, &attr);
    }
    pthread_condattr_destroy(&attr);
    if (rc != 0) {
        return -1;
    }
    S->cv_ready = 1;
    return 0;
}

static void
bind_interpreter(unsigned long skip)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    S->interp = (uintptr_t)interp;
    S->skip = skip;
    self_pid = getpid();
    gil_addr = gil_addr_of(interp);
    uintptr_t rt = (uintptr_t)&_PyRuntime;
    gil_static = gil_addr >= rt && gil_addr + sizeof(struct _gil_runtime_state) <= rt + sizeof(_PyRuntime);
}

PyDoc_STRVAR(start_doc,
"start(skip_ident, wake_fd=-1, /) -> None\n\n"
"Start the sampler thread, paused until set() gives it a delay. It never\n"
"samples the thread whose threading ident is skip_ident. wake_fd: the write\n"
"end of a non-blocking pipe, written when the ring is a quarter full.");

static PyObject *
native_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "start() takes 1 or 2 arguments");
        return NULL;
    }
    unsigned long skip = PyLong_AsUnsignedLong(args[0]);
    if (skip == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    long fd = -1;
    if (nargs == 2) {
        fd = PyLong_AsLong(args[1]);
        if (fd == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (fd < -1 || fd > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "wake_fd must be a file descriptor or -1");
            return NULL;
        }
    }
    if (S->running) {
        PyErr_SetString(PyExc_RuntimeError, "the native sampler is running already");
        return NULL;
    }
    if (init_cv() < 0) {
        PyErr_SetString(PyExc_OSError, "cannot make the sampler's condition variable");
        return NULL;
    }
    pthread_mutex_lock(&S->tick_mu);
    bind_interpreter(skip);
    pthread_mutex_unlock(&S->tick_mu);
    pthread_mutex_lock(&S->mu);
    S->stop = 0;
    S->starved = 0;
    S->mean_s = 0.0;
    S->spread = 0.25;
    S->rate = 0.0;
    S->cost_s = 0.0;
    S->late_s = 0.0;
    S->gen++;
    __atomic_store_n(&S->wake_fd, (int)fd, __ATOMIC_RELEASE);
    S->rng = now_ns(CLOCK_MONOTONIC) ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ULL;
    if (S->rng == 0) {
        S->rng = 1;
    }
    pthread_mutex_unlock(&S->mu);
    __atomic_store_n(&S->cpu_ns, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&S->exit_cpu_ns, 0, __ATOMIC_RELAXED);
    guard_install();
    /* Signals go to the application's threads, never to ours (its own
     * faults aside: sampler_main). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&S->thread, NULL, sampler_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        guard_remove();
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    S->running = 1;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_doc,
"set(mean_s, spread, rate=0, tokens=0, cap=0, /) -> None\n\n"
"Sample at gaussian intervals around mean_s (relative sd spread); 0 pauses.\n"
"With rate > 0, the sampler also keeps a token bucket of its own CPU time:\n"
"rate seconds accrue per second up to cap, tokens are there now; each\n"
"sample pays what it cost, and none is taken while the bucket cannot pay.");

static PyObject *
native_set(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "set() takes 2 or 5 arguments");
        return NULL;
    }
    double mean = PyFloat_AsDouble(args[0]);
    double spread = PyFloat_AsDouble(args[1]);
    double rate = 0.0, tokens = 0.0, cap = 0.0;
    if (nargs == 5) {
        rate = PyFloat_AsDouble(args[2]);
        tokens = PyFloat_AsDouble(args[3]);
        cap = PyFloat_AsDouble(args[4]);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!(rate >= 0) || !isfinite(rate) || !isfinite(tokens) || !isfinite(cap)) {
        PyErr_SetString(PyExc_ValueError, "rate >= 0, tokens and cap finite");
        return NULL;
    }
    if (!(mean >= 0) || !(spread >= 0) || spread > 1 || !isfinite(mean)) {
        PyErr_SetString(PyExc_ValueError, "mean_s >= 0 and 0 <= spread <= 1");
        return NULL;
    }
    if (mean > 0 && mean < 20e-6) {
        mean = 20e-6;   /* the highest rate: 50 kHz */
    }
    pthread_mutex_lock(&S->mu);
    if (nargs == 5) {
        S->rate = rate;
        S->cap = cap;
        S->tokens = tokens < cap ? tokens : cap;
        S->tokens_at = (double)now_ns(CLOCK_MONOTONIC) * 1e-9;
        /* Woken only if it waits for money and now has enough: the agent
         * calls this at each of its wake-ups, and every wake-up of the
         * sampler for nothing is CPU charged to the budget. */
        if (S->cv_ready && S->starved && S->tokens >= S->cost_s) {
            pthread_cond_signal(&S->cv);
        }
    }
    if (S->mean_s != mean || S->spread != spread) {
        /* Woken only if the new mean may bring its next sample sooner (a
         * longer one or a pause take effect at its next wake-up). */
        int sooner = mean > 0 && (S->mean_s <= 0 || mean < S->mean_s);
        S->mean_s = mean;
        S->spread = spread;
        S->gen++;
        if (S->cv_ready && sooner) {
            pthread_cond_signal(&S->cv);
        }
    }
    pthread_mutex_unlock(&S->mu);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(stop_doc, "stop() -> None\n\nStop the sampler thread and wait for it. The ring keeps its samples.");

static PyObject *
native_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!S->running) {
        pthread_mutex_lock(&S->tick_mu);
        slots_close_all();   /* sample_once()'s files */
        pthread_mutex_unlock(&S->tick_mu);
        Py_RETURN_NONE;
    }
    pthread_mutex_lock(&S->mu);
    S->stop = 1;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(S->thread, NULL);
    Py_END_ALLOW_THREADS
    S->running = 0;
    guard_tid = 0;
    guard_remove();
    __atomic_store_n(&S->wake_fd, -1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&S->tick_mu);
    slots_close_all();   /* a stopped sampler keeps no file open */
    pthread_mutex_unlock(&S->tick_mu);
    Py_RETURN_NONE;
}

/* guard_probe()'s thread: a guarded copy of a page that cannot be read. */
static void *
probe_main(void *arg)
{
    guard_become();
    uint64_t word = 0;
    struct iovec local = {&word, sizeof(word)};
    struct iovec remote = {arg, sizeof(word)};
    guard_tick = 1;
    ssize_t got = self_readv(&local, &remote, 1);
    guard_tick = 0;
    guard_tid = 0;
    return (void *)(intptr_t)(got == 0 ? 1 : 0);
}

PyDoc_STRVAR(guard_probe_doc,
"guard_probe() -> bool\n\n"
"With the sampler stopped: install the guard's handlers, copy from a page\n"
"mapped without access on a thread of our own as the sampler does, remove\n"
"them. True: the copy faulted, the handler brought it back, the read failed.\n"
"False: the guard is not used here (DYPER_NATIVE_READS=syscall, or\n"
"another handler stands over ours).");

static PyObject *
native_guard_probe(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (S->running) {
        PyErr_SetString(PyExc_RuntimeError, "the native sampler is running");
        return NULL;
    }
    guard_install();
    if (!(guard_in[0] && guard_in[1] && guard_is_ours(0) && guard_is_ours(1))) {
        guard_remove();   /* one of the two may have gone in: nothing of ours is left */
        Py_RETURN_FALSE;
    }
    long page = sysconf(_SC_PAGESIZE);
    void *none = mmap(NULL, (size_t)page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (none == MAP_FAILED) {
        guard_remove();
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    uint64_t faults0 = __atomic_load_n(&guard_faults, __ATOMIC_RELAXED);
    pthread_t th;
    void *ok = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&S->tick_mu);
    rc = pthread_create(&th, NULL, probe_main, none);
    if (rc == 0) {
        pthread_join(th, &ok);
    }
    pthread_mutex_unlock(&S->tick_mu);
    Py_END_ALLOW_THREADS
    munmap(none, (size_t)page);
    guard_remove();
    if (rc != 0) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(ok != NULL && __atomic_load_n(&guard_faults, __ATOMIC_RELAXED) == faults0 + 1);
}

PyDoc_STRVAR(sample_once_doc,
"sample_once(skip_ident, /) -> None\n\n"
"Take one sample now, on the calling thread, exactly as the sampler thread\n"
"does (for tests and the self-check). The calling thread holds the GIL.");

static PyObject *
native_sample_once(PyObject *module, PyObject *arg)
{
    (void)module;
    unsigned long skip = PyLong_AsUnsignedLong(arg);
    if (skip == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    pthread_mutex_lock(&S->tick_mu);
    if (!S->running) {
        bind_interpreter(skip);
    }
    tick_once();
    pthread_mutex_unlock(&S->tick_mu);
    Py_RETURN_NONE;
}

/* --- drain ------------------------------------------------------------- */

/* (code, lasti) -> location, for one drain: most frames repeat. */
typedef struct {
    uintptr_t code;
    int32_t lasti;
    uint32_t check;
    PyObject *loc;     /* strong; NULL: empty; Py_None: invalid (dropped) */
} memo_t;

/* At most; a drain of few frames takes fewer (a power of two, at least
 * twice its frames): clearing and freeing it is part of every drain. */
#define MEMO_SLOTS 8192
#define MEMO_MIN 64

static inline size_t
memo_hash(uintptr_t code, int32_t lasti)
{
    uint64_t h = ((uint64_t)code >> 4) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uint32_t)lasti * 0xC2B2AE3D27D4EB4FULL;
    return (size_t)(h ^ (h >> 31));
}

static PyObject *
make_key(int32_t lasti_units, uintptr_t code)
{
    long long lasti = lasti_units < 0 ? -1 : (long long)lasti_units * (long long)sizeof(_Py_CODEUNIT);
    if (lasti >= 0 && lasti < (1LL << 16)) {
        return PyLong_FromUnsignedLongLong(((unsigned long long)lasti << 48) | (unsigned long long)code);
    }
    PyObject *l = PyLong_FromLongLong(lasti), *s = PyLong_FromLong(48);
    PyObject *shifted = NULL, *ident = NULL, *key = NULL;
    if (l != NULL && s != NULL) {
        shifted = PyNumber_Lshift(l, s);
    }
    if (shifted != NULL) {
        ident = PyLong_FromVoidPtr((void *)code);
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

/* The location of a frame, new reference; Py_None (new ref) if the frame
 * fails validation; NULL with an exception on error. */
/* The code objects of one drain: each address (with the check word seen at
 * sample time) validated once, all in one system call, and held (a strong
 * reference) until the drain ends. */
typedef struct {
    uintptr_t code;
    uint32_t check;
    int8_t state;          /* 0: empty, 1: alive (held), -1: not that code object */
    Py_ssize_t size;
} drain_code;

static drain_code *
drain_code_find(drain_code *t, size_t n, uintptr_t code, uint32_t check)
{
    size_t h = (size_t)(((uint64_t)code >> 4) * 0x9E3779B97F4A7C15ULL ^ check) & (n - 1);
    for (size_t k = 0; k < n; k++) {
        drain_code *d = &t[(h + k) & (n - 1)];
        if (d->state == 0 || (d->code == code && d->check == check)) {
            return d;
        }
    }
    return NULL;
}

/* Fill `t` (n slots, a power of two > the distinct codes) from the frames,
 * then validate them: is the code object seen at sample time still there,
 * alive? Asked even of an address the tables know (they keep that object
 * alive): the one seen may have died before the tables took another one at
 * its address. A live one is held at once, with no Python code run since
 * its read. */
static void
drain_codes(drain_code *t, size_t n, const frame_rec *ff, uint64_t nf)
{
    static struct iovec local[IOV_BATCH], remote[IOV_BATCH];
    static PyCodeObject heads[IOV_BATCH];   /* only the first CODE_HEAD_SIZE bytes are read */
    static drain_code *which[IOV_BATCH];
    for (uint64_t i = 0; i < nf; i++) {
        drain_code *d = drain_code_find(t, n, ff[i].code, ff[i].check);
        if (d != NULL && d->state == 0) {
            d->code = ff[i].code;
            d->check = ff[i].check;
            d->state = 2;   /* to read */
        }
    }
    size_t i = 0;
    while (i < n) {
        int k = 0;
        for (; i < n && k < IOV_BATCH; i++) {
            if (t[i].state != 2) {
                continue;
            }
            local[k].iov_base = &heads[k];
            local[k].iov_len = CODE_HEAD_SIZE;
            remote[k].iov_base = (void *)t[i].code;
            remote[k].iov_len = CODE_HEAD_SIZE;
            which[k] = &t[i];
            k++;
        }
        if (k == 0) {
            break;
        }
        ssize_t got = self_readv(local, remote, (unsigned long)k);
        size_t left = got < 0 ? 0 : (size_t)got;
        for (int j = 0; j < k; j++) {
            drain_code *d = which[j];
            const PyCodeObject *c = &heads[j];
            int whole = left >= CODE_HEAD_SIZE;
            left = whole ? left - CODE_HEAD_SIZE : 0;
            if (!whole && safe_read(&heads[j], d->code, CODE_HEAD_SIZE) < 0) {
                d->state = -1;   /* after the batch's failure, each on its own */
                continue;
            }
            if (Py_TYPE((PyObject *)c) != &PyCode_Type || !plausible_refcnt(Py_REFCNT((PyObject *)c))
                || code_check(c) != d->check) {
                d->state = -1;
                continue;
            }
            d->size = Py_SIZE((PyObject *)c);
            Py_INCREF((PyObject *)d->code);
            d->state = 1;
        }
    }
}

static PyObject *
resolve(PyObject *locs, PyObject *new_loc, const frame_rec *fr, const drain_code *dc, uint64_t *invalid)
{
    if (dc == NULL || dc->state != 1 || fr->lasti >= dc->size) {
        (*invalid)++;
        Py_RETURN_NONE;
    }
    PyObject *key = make_key(fr->lasti, fr->code);
    if (key == NULL) {
        return NULL;
    }
    PyObject *loc = PyDict_GetItemWithError(locs, key);   /* borrowed */
    if (loc != NULL) {
        Py_DECREF(key);
        return Py_NewRef(loc);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    /* drain_codes() holds it: it cannot be freed in between. */
    PyObject *code = Py_NewRef((PyObject *)fr->code);
    int lasti_b = fr->lasti < 0 ? -1 : fr->lasti * (int)sizeof(_Py_CODEUNIT);
    int line = PyCode_Addr2Line((PyCodeObject *)code, lasti_b < 0 ? 0 : lasti_b);
    PyObject *lasti_obj = PyLong_FromLong(lasti_b);
    PyObject *line_obj = line < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(line);
    PyObject *res = NULL;
    if (lasti_obj != NULL && line_obj != NULL) {
        PyObject *args[4] = {key, code, lasti_obj, line_obj};
        res = PyObject_Vectorcall(new_loc, args, 4, NULL);
    }
    Py_DECREF(key);
    Py_DECREF(code);
    Py_XDECREF(lasti_obj);
    Py_XDECREF(line_obj);
    return res;
}

static uint64_t drain_invalid, drain_dropped;

PyDoc_STRVAR(drain_doc,
"drain(raw, locs, new_loc, hist=None, pending=None, /) -> int\n\n"
"Move the ring's samples into raw: raw[(ident, state, stack)] += 1, stack\n"
"being a tuple of locations, leaf first, from locs (the tables' dict of\n"
"(f_lasti << 48) | id(code) -> location) or new_loc(key, code, f_lasti,\n"
"f_lineno) for code not seen before, once validated. Returns how many\n"
"sampling instants were drained. hist, a list of ints: hist[min(n, len - 1)]\n"
"is incremented for each instant at which n threads were ready to run (on a\n"
"CPU, in the run queue, or asleep holding the GIL). With pending, a list: an\n"
"instant with threads asleep without the GIL, which wait for it unless their\n"
"leaf is a blocking call (the caller's tables decide), is appended to it as\n"
"(n, leaf location, ...) instead.");

static PyObject *
native_drain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 3 || nargs > 5 || !PyDict_Check(args[0]) || !PyDict_Check(args[1])
        || (nargs >= 4 && args[3] != Py_None && (!PyList_Check(args[3]) || PyList_GET_SIZE(args[3]) == 0))
        || (nargs == 5 && args[4] != Py_None && !PyList_Check(args[4]))) {
        PyErr_SetString(PyExc_TypeError,
                        "drain(raw: dict, locs: dict, new_loc, hist: list | None = None, pending: list | None = None)");
        return NULL;
    }
    PyObject *raw = args[0], *locs = args[1], *new_loc = args[2];
    PyObject *hist = nargs >= 4 && args[3] != Py_None ? args[3] : NULL;
    PyObject *pending = hist != NULL && nargs == 5 && args[4] != Py_None ? args[4] : NULL;
    /* this instant's leaves of threads asleep without the GIL (references) */
    PyObject *asleep[MAX_THREADS];
    Py_ssize_t n_asleep = 0;

    /* Copy the ring out, so that the sampler never waits on Python code. */
    pthread_mutex_lock(&ring->mu);
    uint64_t ns = ring->s_head - ring->s_tail;
    uint64_t nf = ring->f_head - ring->f_tail;
    sample_rec *ss = ns ? PyMem_RawMalloc(ns * sizeof(sample_rec)) : NULL;
    frame_rec *ff = nf ? PyMem_RawMalloc(nf * sizeof(frame_rec)) : NULL;
    uint64_t f0 = ring->f_tail;
    if ((ns && ss == NULL) || (nf && ff == NULL)) {
        pthread_mutex_unlock(&ring->mu);
        PyMem_RawFree(ss);
        PyMem_RawFree(ff);
        return PyErr_NoMemory();
    }
    for (uint64_t i = 0; i < ns; i++) {
        ss[i] = ring->samples[(ring->s_tail + i) % RING_SAMPLES];
    }
    for (uint64_t i = 0; i < nf; i++) {
        ff[i] = ring->frames[(f0 + i) % RING_FRAMES];
    }
    ring->s_tail = ring->s_head;
    ring->f_tail = ring->f_head;
    S->woken = 0;
    pthread_mutex_unlock(&ring->mu);

    size_t memo_slots = MEMO_MIN;
    while (memo_slots < MEMO_SLOTS && memo_slots < 2 * nf) {
        memo_slots *= 2;
    }
    memo_t *memo = PyMem_Calloc(memo_slots, sizeof(memo_t));

    /* distinct codes fit (or the rest of them is dropped as invalid) */
    size_t code_slots = 16;
    while (code_slots < 2 * nf && code_slots < ((size_t)1 << 17)) {
        code_slots *= 2;
    }
    drain_code *codes = PyMem_Calloc(code_slots, sizeof(drain_code));
    if ((memo == NULL && nf) || codes == NULL) {
        PyMem_Free(memo);
        PyMem_Free(codes);
        PyMem_RawFree(ss);
        PyMem_RawFree(ff);
        return PyErr_NoMemory();
    }
    drain_codes(codes, code_slots, ff, nf);
    uint64_t invalid = 0, dropped = 0, instants = 0, last_tick = 0;
    Py_ssize_t on_cpu = 0;
    PyObject *result = NULL;
    for (uint64_t i = 0; i <= ns; i++) {
        if (hist != NULL && i > 0 && (i == ns || ss[i].tick != last_tick)) {
            /* the instant last_tick is complete */
            if (n_asleep > 0) {
                PyObject *t = PyTuple_New(n_asleep + 1);
                PyObject *n0 = PyLong_FromSsize_t(on_cpu);
                if (t == NULL || n0 == NULL) {
                    Py_XDECREF(t);
                    Py_XDECREF(n0);
                    goto done;
                }
                PyTuple_SET_ITEM(t, 0, n0);
                for (Py_ssize_t j = 0; j < n_asleep; j++) {
                    PyTuple_SET_ITEM(t, j + 1, asleep[j]);   /* the tuple takes the reference */
                }
                n_asleep = 0;
                int rc = PyList_Append(pending, t);
                Py_DECREF(t);
                if (rc < 0) {
                    goto done;
                }
            }
            else {
                Py_ssize_t top = PyList_GET_SIZE(hist) - 1;
                Py_ssize_t at = on_cpu < top ? on_cpu : top;
                PyObject *old = PyList_GET_ITEM(hist, at);
                long v = PyLong_Check(old) ? PyLong_AsLong(old) : 0;
                PyObject *nv = PyLong_FromLong(v + 1);
                if (nv == NULL) {
                    goto done;
                }
                PyList_SetItem(hist, at, nv);
            }
            on_cpu = 0;
            n_asleep = 0;
        }
        if (i == ns) {
            break;
        }
        const sample_rec *s = &ss[i];
        if (s->tick != last_tick) {
            instants++;
            last_tick = s->tick;
        }
        if (s->state == NST_GIL || s->state == NST_NOGIL || s->state == NST_RUNQ || s->state == NST_SLEEP_GIL) {
            on_cpu++;
        }
        PyObject *stack = PyTuple_New(s->depth);
        if (stack == NULL) {
            goto done;
        }
        int ok = 1;
        for (uint16_t j = 0; j < s->depth; j++) {
            const frame_rec *fr = &ff[s->frame_start - f0 + j];
            size_t h = memo_hash(fr->code, fr->lasti);
            PyObject *loc = NULL;
            for (size_t k = 0; k < 8; k++) {
                memo_t *m = &memo[(h + k) & (memo_slots - 1)];
                if (m->loc == NULL) {
                    loc = resolve(locs, new_loc, fr, drain_code_find(codes, code_slots, fr->code, fr->check), &invalid);
                    if (loc == NULL) {
                        Py_DECREF(stack);
                        goto done;
                    }
                    m->code = fr->code;
                    m->lasti = fr->lasti;
                    m->check = fr->check;
                    m->loc = Py_NewRef(loc);
                    break;
                }
                if (m->code == fr->code && m->lasti == fr->lasti && m->check == fr->check) {
                    loc = Py_NewRef(m->loc);
                    break;
                }
            }
            if (loc == NULL) {   /* memo neighbourhood full */
                loc = resolve(locs, new_loc, fr, drain_code_find(codes, code_slots, fr->code, fr->check), &invalid);
                if (loc == NULL) {
                    Py_DECREF(stack);
                    goto done;
                }
            }
            if (loc == Py_None) {
                Py_DECREF(loc);
                ok = 0;
                break;
            }
            PyTuple_SET_ITEM(stack, j, loc);
        }
        if (!ok) {
            Py_DECREF(stack);   /* partly filled: tuple_dealloc skips the NULLs */
            dropped++;
            continue;
        }
        if (pending != NULL && s->state == NST_SLEEP && s->depth > 0 && n_asleep < MAX_THREADS) {
            asleep[n_asleep++] = Py_NewRef(PyTuple_GET_ITEM(stack, 0));
        }
        PyObject *k = Py_BuildValue("(kiN)", s->ident, (int)s->state, stack);
        if (k == NULL) {
            goto done;
        }
        PyObject *old = PyDict_GetItemWithError(raw, k);
        if (old == NULL && PyErr_Occurred()) {
            Py_DECREF(k);
            goto done;
        }
        long n = old == NULL ? 0 : PyLong_AsLong(old);
        PyObject *nv = PyLong_FromLong(n + 1);
        int rc = nv == NULL ? -1 : PyDict_SetItem(raw, k, nv);
        Py_XDECREF(nv);
        Py_DECREF(k);
        if (rc < 0) {
            goto done;
        }
    }
    result = PyLong_FromUnsignedLongLong(instants);
done:
    for (Py_ssize_t j = 0; j < n_asleep; j++) {
        Py_DECREF(asleep[j]);
    }
    if (memo != NULL) {
        for (size_t i = 0; i < memo_slots; i++) {
            Py_XDECREF(memo[i].loc);
        }
        PyMem_Free(memo);
    }
    for (size_t i = 0; i < code_slots; i++) {
        if (codes[i].state == 1) {
            Py_DECREF((PyObject *)codes[i].code);
        }
    }
    PyMem_Free(codes);
    PyMem_RawFree(ss);
    PyMem_RawFree(ff);
    __atomic_fetch_add(&drain_invalid, invalid, __ATOMIC_RELAXED);
    __atomic_fetch_add(&drain_dropped, dropped, __ATOMIC_RELAXED);
    return result;
}

PyDoc_STRVAR(stats_doc,
"stats() -> dict\n\n"
"Counters since import: ticks (sampling instants), thread_samples, frames,\n"
"torn (walks whose top frame changed under them), bad (failed checks),\n"
"overflow (dropped oldest from the ring), truncated, unread, invalid and\n"
"dropped (frames / samples the drain refused), queued (thread samples in\n"
"the ring now), queued_ticks (instants they span), late_s and cost_s (moving\n"
"averages of the thread's wake-up lateness and CPU per sample),\n"
"states (thread samples per raw state), sampler_cpu_s (the sampler thread's\n"
"CPU time, this run), tick_s (wall time inside ticks), running,\n"
"guarded (the sampler copies memory under its fault handlers now),\n"
"guard_faults (guarded copies that faulted: failed reads), guard_off_ticks\n"
"(ticks read through process_vm_readv: our handlers were not in place),\n"
"proc_read_bytes and proc_reads (what it read from /proc: the kernel counts\n"
"them in the process's I/O counters).");

static PyObject *
native_stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    double cpu_s;
    if (S->running) {
        clockid_t cid;
        struct timespec ts;
        if (pthread_getcpuclockid(S->thread, &cid) == 0 && clock_gettime(cid, &ts) == 0) {
            cpu_s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
        }
        else {
            cpu_s = (double)__atomic_load_n(&S->cpu_ns, __ATOMIC_RELAXED) * 1e-9;
        }
    }
    else {
        cpu_s = (double)__atomic_load_n(&S->exit_cpu_ns, __ATOMIC_RELAXED) * 1e-9;
    }
    pthread_mutex_lock(&ring->mu);
    uint64_t queued = ring->s_head - ring->s_tail;
    uint64_t queued_ticks = 0;
    if (queued) {
        queued_ticks = ring->samples[(ring->s_head - 1) % RING_SAMPLES].tick
                       - ring->samples[ring->s_tail % RING_SAMPLES].tick + 1;
    }
    pthread_mutex_unlock(&ring->mu);
    pthread_mutex_lock(&S->mu);
    double late_s = S->late_s, cost_s = S->cost_s;
    pthread_mutex_unlock(&S->mu);
    PyObject *states = PyTuple_New(NST_COUNT);
    if (states == NULL) {
        return NULL;
    }
    for (int i = 0; i < NST_COUNT; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(__atomic_load_n(&S->states[i], __ATOMIC_RELAXED));
        if (v == NULL) {
            Py_DECREF(states);
            return NULL;
        }
        PyTuple_SET_ITEM(states, i, v);
    }
#define LD(x) (unsigned long long)__atomic_load_n(&(x), __ATOMIC_RELAXED)
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsNsdsdsdsdsisKsKsKsKsi}",
        "ticks", LD(S->ticks), "thread_samples", LD(S->thread_samples), "frames", LD(S->frames),
        "torn", LD(S->torn), "bad", LD(S->bad), "overflow", LD(S->overflow),
        "truncated", LD(S->truncated), "unread", LD(S->unread),
        "invalid", LD(drain_invalid), "dropped", LD(drain_dropped),
        "drawn", LD(S->drawn), "demoted", LD(S->demoted), "lost", LD(S->lost), "reused", LD(S->reused),
        "code_hits", LD(S->code_hits), "code_misses", LD(S->code_misses), "queued", (unsigned long long)queued, "queued_ticks", (unsigned long long)queued_ticks,
        "states", states, "sampler_cpu_s", cpu_s, "tick_s", (double)LD(S->tick_ns) * 1e-9,
        "late_s", late_s, "cost_s", cost_s, "running", S->running,
        "guard_faults", LD(guard_faults), "guard_off_ticks", LD(guard_off_ticks),
        "proc_read_bytes", LD(proc_read_bytes), "proc_reads", LD(proc_reads),
        "guarded", guard_in[0] && guard_in[1] && guard_is_ours(0) && guard_is_ours(1));
#undef LD
}

/* ------------------------------------------------------------------------
 * Import-time self-check: refuse to load rather than read with a wrong
 * layout or without a safe reader.
 * ------------------------------------------------------------------------ */

static int
check_error(const char *what)
{
    PyErr_Format(PyExc_ImportError, "agent._native: self-check failed (%s); built for CPython "
                 PY_VERSION ", running %s", what, Py_GetVersion());
    return -1;
}

static int
self_check(void)
{
    if ((Py_Version >> 16) != ((unsigned long)PY_VERSION_HEX >> 16)) {
        return check_error("version");
    }
#if PY_VERSION_HEX >= 0x030D0000
    const _Py_DebugOffsets *d = &_PyRuntime.debug_offsets;
    if (memcmp(d->cookie, _Py_Debug_Cookie, sizeof(d->cookie)) != 0 ||
        (d->version >> 16) != ((uint64_t)PY_VERSION_HEX >> 16) ||
        d->free_threaded != 0 ||
        d->thread_state.current_frame != offsetof(PyThreadState, current_frame) ||
        d->thread_state.thread_id != offsetof(PyThreadState, thread_id) ||
        d->thread_state.native_thread_id != offsetof(PyThreadState, native_thread_id) ||
        d->thread_state.interp != offsetof(PyThreadState, interp) ||
        d->thread_state.next != offsetof(PyThreadState, next) ||
        d->interpreter_state.threads_head != offsetof(PyInterpreterState, threads.head) ||
        d->interpreter_frame.previous != offsetof(_PyInterpreterFrame, previous) ||
        d->interpreter_frame.executable != offsetof(_PyInterpreterFrame, f_executable) ||
        d->interpreter_frame.instr_ptr != offsetof(_PyInterpreterFrame, instr_ptr) ||
        d->interpreter_frame.owner != offsetof(_PyInterpreterFrame, owner) ||
        d->code_object.co_code_adaptive != offsetof(PyCodeObject, co_code_adaptive) ||
        d->code_object.filename != offsetof(PyCodeObject, co_filename) ||
        d->code_object.name != offsetof(PyCodeObject, co_name) ||
        d->code_object.firstlineno != offsetof(PyCodeObject, co_firstlineno))
    {
        return check_error("debug offsets");
    }
#endif
    self_pid = getpid();
    volatile uint64_t probe = 0x5A5A1234ABCD0001ULL;
    uint64_t copy = 0;
    if (safe_read(&copy, (uintptr_t)&probe, sizeof(copy)) < 0 || copy != probe) {
        char what[96];
        snprintf(what, sizeof(what), "process_vm_readv on our own pid: %s", strerror(errno));
        return check_error(what);
    }
    PyThreadState *tstate = PyThreadState_Get();
    if (tstate->thread_id != PyThread_get_thread_ident()) {
        return check_error("thread id");
    }
#ifdef PY_HAVE_THREAD_NATIVE_ID
    if (tstate->native_thread_id != PyThread_get_thread_native_id()) {
        return check_error("native thread id");
    }
#endif
    uintptr_t head;
    if (safe_read_ptr(&head, (uintptr_t)tstate->interp + offsetof(PyInterpreterState, threads.head)) < 0
        || head == 0) {
        return check_error("thread list");
    }
    if (gil_holder_of(tstate->interp) != (uintptr_t)tstate) {
        return check_error("gil holder");
    }
    uintptr_t top;
    if (top_frame(tstate, &top) < 0) {
        return check_error("top frame");
    }
    PyFrameObject *fo = PyEval_GetFrame();   /* borrowed */
    if (fo == NULL) {
        return 0;
    }
    frame_rec recs[8];
    int truncated;
    /* walk() uses the sampler's buffers: a second import (another
     * interpreter) must not share them with a running sampler. */
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&S->tick_mu);
    Py_END_ALLOW_THREADS
    region_lo = region_hi = 0;
    code_tick = 0;
    int depth = walk(top, recs, 8, &truncated);
    pthread_mutex_unlock(&S->tick_mu);
    if (depth < 0) {
        return check_error("walk");
    }
    Py_INCREF(fo);
    int i = 0;
    while (fo != NULL && i < 8) {
        PyCodeObject *code = PyFrame_GetCode(fo);
        int ok = i < depth && (uintptr_t)code == recs[i].code
                 && PyFrame_GetLasti(fo) == (recs[i].lasti < 0 ? -1 : recs[i].lasti * 2);
        Py_DECREF(code);
        if (!ok) {
            Py_DECREF(fo);
            return check_error("frame chain");
        }
        PyFrameObject *back = PyFrame_GetBack(fo);
        Py_DECREF(fo);
        fo = back;
        i++;
    }
    if (fo != NULL) {
        Py_DECREF(fo);
    }
    else if (i < depth) {
        return check_error("frame chain end");
    }
    return 0;
}

static PyMethodDef native_methods[] = {
    {"start", (PyCFunction)(void (*)(void))native_start, METH_FASTCALL, start_doc},
    {"set", (PyCFunction)(void (*)(void))native_set, METH_FASTCALL, set_doc},
    {"stop", (PyCFunction)native_stop, METH_NOARGS, stop_doc},
    {"sample_once", (PyCFunction)native_sample_once, METH_O, sample_once_doc},
    {"drain", (PyCFunction)(void (*)(void))native_drain, METH_FASTCALL, drain_doc},
    {"stats", (PyCFunction)native_stats, METH_NOARGS, stats_doc},
    {"guard_probe", (PyCFunction)native_guard_probe, METH_NOARGS, guard_probe_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    "dyper.agent._native",
    "dyper's native sampler: stacks read without the GIL (see agent/_native.c).",
    -1,
    native_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (S == NULL) {
        S = PyMem_RawCalloc(1, sizeof(sampler_t));
        ring = PyMem_RawCalloc(1, sizeof(ring_t));
        if (S == NULL || ring == NULL) {
            PyMem_RawFree(S);
            PyMem_RawFree(ring);
            S = NULL;
            ring = NULL;
            return PyErr_NoMemory();
        }
        S->wake_fd = -1;
        pthread_mutex_init(&S->mu, NULL);
        pthread_mutex_init(&S->tick_mu, NULL);
        pthread_mutex_init(&ring->mu, NULL);
        pthread_atfork(NULL, NULL, after_fork_child);
    }
    if (self_check() < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) {
        return NULL;
    }
    static const char *names[NST_COUNT] = {"gil", "nogil", "runq", "sleep", "sleep_gil", "unknown"};
    PyObject *st = PyTuple_New(NST_COUNT);
    if (st == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    for (int i = 0; i < NST_COUNT; i++) {
        PyTuple_SET_ITEM(st, i, PyUnicode_FromString(names[i]));
    }
    if (PyModule_AddObject(m, "STATES", st) < 0
        || PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0
        || PyModule_AddIntConstant(m, "RING_SAMPLES", RING_SAMPLES) < 0) {
        Py_DECREF(st);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

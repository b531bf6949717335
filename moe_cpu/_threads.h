/* Thread control of moe_cpu in C: the OpenMP queries, the fork watch and the load sensing.
 *
 * Included by _parallel.pyx only. Without OpenMP every query answers for one thread, so the
 * build without OpenMP needs no omp.h.
 */
#ifndef MOE_THREADS_H
#define MOE_THREADS_H

#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
static int moe_openmp_enabled(void) { return 1; }
static int moe_omp_max_threads(void) { return omp_get_max_threads(); }
static int moe_omp_thread_limit(void) { return omp_get_thread_limit(); }
static int moe_omp_num_procs(void) { return omp_get_num_procs(); }
#else
static int moe_openmp_enabled(void) { return 0; }
static int moe_omp_max_threads(void) { return 1; }
static int moe_omp_thread_limit(void) { return 1; }
static int moe_omp_num_procs(void) { return 1; }
#endif

#if defined(_OPENMP) && (defined(__unix__) || defined(__APPLE__))
#define MOE_POSIX_OPENMP 1
#include <pthread.h>
#include <time.h>
#else
#define MOE_POSIX_OPENMP 0
#endif

#if defined(__GNUC__)
#define MOE_LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define MOE_STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define MOE_ADD(x, v) __atomic_add_fetch(&(x), (v), __ATOMIC_RELAXED)
#else
#define MOE_LOAD(x) (x)
#define MOE_STORE(x, v) ((x) = (v))
#define MOE_ADD(x, v) ((x) += (v))
#endif

/* ------------------------------------------------------------------------------ fork */

/* Set once a team of more than one thread may have started in this process or in the
 * process it was forked from. In a child made by fork after that, every loop runs on one
 * thread: libgomp's pool belongs to the parent, and a child that starts a team waits
 * forever for threads that were never forked. */
static volatile int moe_team_started = 0;
static volatile int moe_forked_after_team = 0;

static void moe_note_team(void) { moe_team_started = 1; }

#if MOE_POSIX_OPENMP
static void moe_after_fork_in_child(void) {
    if (moe_team_started) moe_forked_after_team = 1;
}
/* pthread_atfork rather than os.register_at_fork: it also sees forks that bypass Python */
static int moe_watch_forks(void) { return pthread_atfork(NULL, NULL, moe_after_fork_in_child); }
#else
static int moe_watch_forks(void) { return 0; }
#endif

/* ---------------------------------------------------------------------- load sensing */

/* A team whose threads wait for a processor stalls at every barrier of a call; its caller
 * then waits too, at the barrier and again for a processor once woken. So after a call on
 * w > 1 threads the calling thread samples the time it has waited on a run queue (Linux
 * schedstat) since its previous sample: a wait of more than a quarter of the time means
 * the processors are shared. The team is then halved and held there for a pause, which
 * doubles (up to its maximum) each time this happens again and is reset by an undisturbed
 * sample on all n threads. When a pause ends the team doubles again, one step per shortest
 * pause, unless the caller waited for a processor for more than an eighth of the pause:
 * then the pause starts again, doubled.
 *
 * One thread at a time updates the state (a try-lock; the others keep the current width),
 * and only the thread that took the last sample compares its waits with it. */

typedef struct {
    int64_t backoff_min_ns, backoff_max_ns, backoff_ns;
    int64_t hold_until_ns;                   /* no wider team before this */
    int64_t hold_start_ns, hold_start_wait;  /* start of the pause, the caller's wait then */
    int64_t last_ns, last_wait;              /* the last sample; -1 = unknown */
    int64_t narrowed_calls;                  /* calls given fewer threads than n */
    int width;                               /* threads a call may use now, 0 = all */
    int team;                                /* width at the last sample, 0 = none yet */
} moe_load_state;

static moe_load_state moe_load = {10000000, 1000000000, 10000000, 0, 0, -1, 0, -1, 0, 0, 0};
static int64_t moe_load_last_sample_ns = 0;

static void moe_reset_load(void) {
    moe_load.backoff_ns = moe_load.backoff_min_ns;
    moe_load.hold_until_ns = moe_load.hold_start_ns = moe_load.last_ns = 0;
    moe_load.hold_start_wait = moe_load.last_wait = -1;
    MOE_STORE(moe_load.narrowed_calls, 0);
    MOE_STORE(moe_load.width, 0);
    MOE_STORE(moe_load.team, 0);
    MOE_STORE(moe_load_last_sample_ns, 0);
}

static void moe_start_pause(moe_load_state* s, int64_t now, int64_t wait) {
    s->hold_until_ns = now + s->backoff_ns;
    s->hold_start_ns = now;
    s->hold_start_wait = wait;
    s->backoff_ns = s->backoff_ns < s->backoff_max_ns / 2 ? 2 * s->backoff_ns : s->backoff_max_ns;
}

/* Threads for a call that may use n, given the sample taken at `now`: `wait`, the caller's
 * time on a run queue so far (-1 = unknown, which never narrows). */
static int moe_decide_threads(moe_load_state* s, int n, int64_t wait, int64_t now) {
    int w = s->width >= 1 && s->width <= n ? s->width : n;
    if (s->team > 1 && wait >= 0 && s->last_wait >= 0) {
        if ((wait - s->last_wait) * 4 > now - s->last_ns) {
            w = s->team / 2;
            moe_start_pause(s, now, wait);
        } else if (s->team == n) {
            s->backoff_ns = s->backoff_min_ns;
        }
    }
    if (w < n && now >= s->hold_until_ns) {
        if (wait >= 0 && s->hold_start_wait >= 0 &&
            (wait - s->hold_start_wait) * 8 > now - s->hold_start_ns) {
            moe_start_pause(s, now, wait);
        } else {
            w = 2 * w < n ? 2 * w : n;
            s->hold_until_ns = now + s->backoff_min_ns;
            s->hold_start_ns = now;
            s->hold_start_wait = wait;
        }
    }
    MOE_STORE(s->width, w);
    MOE_STORE(s->team, w);
    s->last_ns = now;
    s->last_wait = wait;
    return w;
}

#if MOE_POSIX_OPENMP && defined(__linux__)
#define MOE_CAN_SENSE_LOAD 1
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

/* Calls closer together than this share one sample and its decision. */
#define MOE_SAMPLE_NS 1000000

/* Each thread reads its own /proc/thread-self/schedstat through a descriptor it keeps
 * (value fd + 1 under this key; closed when the thread exits). */
static pthread_key_t moe_schedstat_key;
static pthread_once_t moe_schedstat_once = PTHREAD_ONCE_INIT;
static void moe_close_schedstat(void* value) { close((int)(intptr_t)value - 1); }
static void moe_make_schedstat_key(void) {
    pthread_key_create(&moe_schedstat_key, moe_close_schedstat);
}

/* ns the calling thread has waited on a run queue (schedstat: run time, wait, slices) */
static int64_t moe_caller_wait_ns(void) {
    char text[128];
    long long run, wait;
    ssize_t got;
    intptr_t value;
    int fd;
    pthread_once(&moe_schedstat_once, moe_make_schedstat_key);
    value = (intptr_t)pthread_getspecific(moe_schedstat_key);
    if (value > 0) {
        fd = (int)value - 1;
    } else {
        fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        pthread_setspecific(moe_schedstat_key, (void*)(intptr_t)(fd + 1));
    }
    got = pread(fd, text, sizeof text - 1, 0);
    if (got <= 0) return -1;
    text[got] = 0;
    return sscanf(text, "%lld %lld", &run, &wait) == 2 ? (int64_t)wait : -1;
}

static int64_t moe_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static char moe_load_lock = 0;
static pthread_t moe_load_sampler;
static int moe_load_has_sampler = 0;

static int moe_threads_for_load(int n) {
    int w;
    int64_t now;
    pthread_t me;
    if (n <= 1) return n;
    now = moe_now_ns();
    w = MOE_LOAD(moe_load.width);
    if (w < 1 || w > n) w = n;
    if ((now - MOE_LOAD(moe_load_last_sample_ns) < MOE_SAMPLE_NS && MOE_LOAD(moe_load.team)) ||
        __atomic_test_and_set(&moe_load_lock, __ATOMIC_ACQUIRE)) {
        if (w < n) MOE_ADD(moe_load.narrowed_calls, 1);
        return w;
    }
    me = pthread_self();
    if (!(moe_load_has_sampler && pthread_equal(me, moe_load_sampler))) {
        /* another thread's waits do not compare with this one's */
        moe_load.last_wait = moe_load.hold_start_wait = -1;
    }
    moe_load_sampler = me;
    moe_load_has_sampler = 1;
    w = moe_decide_threads(&moe_load, n, moe_caller_wait_ns(), now);
    if (w < n) MOE_ADD(moe_load.narrowed_calls, 1);
    MOE_STORE(moe_load_last_sample_ns, now);
    __atomic_clear(&moe_load_lock, __ATOMIC_RELEASE);
    return w;
}
#else
#define MOE_CAN_SENSE_LOAD 0
static int moe_threads_for_load(int n) { return n; }
#endif

/* the decision on a made-up sample, for the tests (it moves the state that calls use) */
static int moe_decide_for_test(int n, int64_t wait, int64_t now) {
    int w = moe_decide_threads(&moe_load, n, wait, now);
    if (w < n) MOE_ADD(moe_load.narrowed_calls, 1);
    return w;
}

#endif /* MOE_THREADS_H */

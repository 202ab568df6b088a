/* Runs a Mojo kernel's work items on the process's OpenMP team.
 *
 * torch keeps its OpenMP worker threads spinning for a while after every parallel operator; a second
 * thread pool (Mojo's) started then competes with them for the cores. Entering the kernel from an
 * OpenMP parallel region instead hands the work to those same, already-running threads. Linked against
 * libgomp.so.1, which resolves to the copy torch has already loaded (same soname), so there is one
 * team; kernels/attention.py checks that before using it.
 */
#include <omp.h>
#include <stdlib.h>

typedef void (*range_fn)(long long params, long long begin, long long end);

/* Where thread t's equal share of n_items begins, in a team of nt (and ends: share_start(n_items, t + 1, nt)). */
static long long share_start(long long n_items, long long t, long long nt) {
    return n_items * t / nt;
}

static void run_share(range_fn fn, long long params, long long n_items) {
    long long t = omp_get_thread_num(), nt = omp_get_num_threads();
    long long begin = share_start(n_items, t, nt), end = share_start(n_items, t + 1, nt);
    if (begin < end) fn(params, begin, end);
}

void mili_omp_run(range_fn fn, long long params, long long n_items) {
#pragma omp parallel
    run_share(fn, params, n_items);
}

/* Equal shares, the rest taken: each thread runs its own share from the front, a step at a time, and a thread
 * that has run out takes the back half of what remains of another's share, and so on. Each thread streams one
 * contiguous range of the weights unless it steals (chunks handed out in turn from a shared counter restarted
 * the hardware prefetcher's stream at every chunk: 25% slower on the default model's small matmuls), and a
 * thread slowed by anything (a busier core, the host's neighbours, costlier items) leaves the rest of its share
 * to the others instead of making them wait at the barrier. Which thread computes an item changes nothing in
 * its result. A share is one 64-bit word, its first and end items, so that its owner's step and a thief's cut
 * are single compare-and-swaps; one cache line each. */
typedef struct { _Alignas(64) unsigned long long range; } share_t;

#define STEPS_PER_SHARE 8  /* the owner claims its share in this many steps, so a thief finds some left */
#define MAX_TEAM 256

static unsigned long long pack(long long begin, long long end) {
    return (unsigned long long)begin | ((unsigned long long)end << 32);
}

/* shares[nt], set up before the team starts (set_shares); every one is run, whatever the team's size. */
static void run_shares(range_fn fn, long long params, share_t *shares, long long nt) {
    long long t = omp_get_thread_num();
    share_t *mine = &shares[t];
    unsigned long long r0 = __atomic_load_n(&mine->range, __ATOMIC_RELAXED);
    long long step = ((long long)(r0 >> 32) - (long long)(r0 & 0xffffffffu)) / STEPS_PER_SHARE;
    if (step < 1) step = 1;
    for (;;) {
        unsigned long long r = __atomic_load_n(&mine->range, __ATOMIC_RELAXED);
        long long begin = r & 0xffffffffu, end = r >> 32;
        if (begin < end) {
            long long take = end - begin < step ? end - begin : step;
            if (__atomic_compare_exchange_n(&mine->range, &r, pack(begin + take, end), 0, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
                fn(params, begin, begin + take);
            continue;
        }
        /* Out of work: cut the back half off the share with the most left. */
        long long victim = -1, most = 0;
        for (long long v = 0; v < nt; v++) {
            unsigned long long rv = __atomic_load_n(&shares[v].range, __ATOMIC_RELAXED);
            long long left = (long long)(rv >> 32) - (long long)(rv & 0xffffffffu);
            if (v != t && left > most) { most = left; victim = v; }
        }
        if (victim < 0) return;
        unsigned long long rv = __atomic_load_n(&shares[victim].range, __ATOMIC_RELAXED);
        long long vb = rv & 0xffffffffu, ve = rv >> 32, cut = (ve - vb + 1) / 2;
        if (cut < 1) continue;
        if (__atomic_compare_exchange_n(&shares[victim].range, &rv, pack(vb, ve - cut), 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            __atomic_store_n(&mine->range, pack(ve - cut, ve), __ATOMIC_RELAXED);
            step = cut / 2 > 0 ? cut / 2 : 1;
        }
    }
}

/* Equal shares of n_items for a team of nt (run_share's split). */
static void set_shares(share_t *shares, long long nt, long long n_items) {
    for (long long t = 0; t < nt; t++)
        shares[t].range = pack(share_start(n_items, t, nt), share_start(n_items, t + 1, nt));
}

static long long team_size(void) {
    long long nt = omp_get_max_threads();
    return nt < MAX_TEAM ? nt : MAX_TEAM;
}

/* Two phases in one parallel region: every thread finishes its share of the first before any starts
 * the second (the quantized matmul quantizes activation rows, then computes column tiles from them, the
 * tiles in shares with stealing: run_shares). */
void mili_omp_run2(range_fn first, long long n_first, range_fn second, long long n_second, long long params) {
    share_t shares[MAX_TEAM];
    long long nt = team_size();
    set_shares(shares, nt, n_second);
#pragma omp parallel num_threads(nt)
    {
        run_share(first, params, n_first);
#pragma omp barrier
        run_shares(second, params, shares, nt);
    }
}

/* A program: many phases in one parallel region, in order. phases: [n_phases][4] int64, each
 * (range entry, params address, work items, flags). Between two phases every thread waits for the others
 * (a barrier), unless the later phase has flag bit 0: it splits the same number of items as the one before
 * and each item reads only what the same item wrote there, so each thread may go on with its own share.
 * Flag bit 1: the phase's shares may be stolen from (run_shares); such a
 * phase's items may not rely on the thread that ran an item before, so it never has bit 0 or follows
 * itself with a bit-0 phase (kernels/omp_program.py checks both).
 * One call runs a whole decode step's layers (worker/runner/decode_program.py) instead of one call per kernel. */
void mili_omp_program(const long long *phases, long long n_phases) {
    long long nt = team_size(), n_taken = 0;
    for (long long i = 0; i < n_phases; i++) n_taken += (phases[4 * i + 3] & 2) != 0;
    share_t *shares = n_taken ? aligned_alloc(64, sizeof(share_t) * nt * n_phases) : 0;  /* [phase][thread] */
    for (long long i = 0; i < n_phases; i++)
        if (phases[4 * i + 3] & 2) set_shares(shares + nt * i, nt, phases[4 * i + 2]);
#pragma omp parallel num_threads(nt)
    {
        for (long long i = 0; i < n_phases; i++) {
            const long long *phase = phases + 4 * i;
            if (i > 0 && !(phase[3] & 1)) {
#pragma omp barrier
            }
            if (phase[3] & 2)
                run_shares((range_fn)phase[0], phase[1], shares + nt * i, nt);
            else
                run_share((range_fn)phase[0], phase[1], phase[2]);
        }
    }
    free(shares);
}

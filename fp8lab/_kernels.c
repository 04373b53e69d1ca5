/* fp8lab's CPU kernels: quantization fused into single passes over memory.

   The torch code in quantize.py / gemm.py is the definition; these loops compute the same
   numbers (tests/test_kernels.py proves it bit for bit) in one pass where torch needs five
   (multiply, clamp, cast, widen, fold), each allocating a temporary. Built on first use by
   fp8lab/kernels.py with the system C compiler and called through ctypes; without a
   compiler fp8lab runs the torch code, and `python -m fp8lab doctor` says why.

   Layout: x is a contiguous float32 [M, K] cut into blocks of r rows x c columns (the last
   blocks may be partial: that is the zero padding of scaling.padded_blocks, which never
   changes an amax or a code). Block (i, j) covers rows i*r.. and columns j*c..; its scale
   sits at s[i * KB + j], KB = ceil(K / c).

   Compiled with -ffp-contract=off: every multiply is rounded on its own, as torch does. */

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* blocks narrower than this are walked a whole row at a time, with per-column state */
#define NARROW 32

/* one row of block values, repeated over each block's c columns: sk[k] = s[k / c] */
static void expand_row(const float *s, int64_t K, int64_t c, float *sk) {
    for (int64_t k0 = 0, j = 0; k0 < K; k0 += c, j++) {
        int64_t k1 = k0 + c < K ? k0 + c : K;
        for (int64_t k = k0; k < k1; k++) sk[k] = s[j];
    }
}

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* max |x| over each block -> amax[MB * KB]; a NaN in a block makes its amax NaN.
   Nonnegative floats order as their bit patterns, and every NaN's |bits| exceed inf's,
   so an integer max over |x|'s bits is the amax with NaN propagating (and vectorizes). */
static inline __attribute__((always_inline)) uint32_t run_amax_bits(const float *x, int64_t n, uint32_t hi) {
    const uint32_t *u = (const uint32_t *)x;
    for (int64_t k = 0; k < n; k++) {
        uint32_t a = u[k] & 0x7FFFFFFFu;
        hi = a > hi ? a : hi;
    }
    return hi;
}

static void block_amax_serial(const float *x, int64_t M, int64_t K, int64_t r, int64_t c, float *amax) {
    int64_t KB = (K + c - 1) / c, MB = (M + r - 1) / r;
    uint32_t *out = (uint32_t *)amax;
    for (int64_t i = 0; i < MB * KB; i++) out[i] = 0u;
    if (MB * KB == 1) { /* one block: the whole tensor is one run */
        out[0] = run_amax_bits(x, M * K, 0u);
        return;
    }
    if (c < NARROW) { /* narrow blocks (e.g. 32 x 1, a column block): a running max per column */
        uint32_t *acc = (uint32_t *)malloc((size_t)K * sizeof(uint32_t));
        if (acc) {
            for (int64_t i = 0; i < MB; i++) {
                for (int64_t k = 0; k < K; k++) acc[k] = 0u;
                int64_t m1 = (i + 1) * r < M ? (i + 1) * r : M;
                for (int64_t m = i * r; m < m1; m++) {
                    const uint32_t *u = (const uint32_t *)(x + m * K);
                    for (int64_t k = 0; k < K; k++) {
                        uint32_t a = u[k] & 0x7FFFFFFFu;
                        acc[k] = a > acc[k] ? a : acc[k];
                    }
                }
                for (int64_t j = 0; j < KB; j++) {
                    int64_t k1 = (j + 1) * c < K ? (j + 1) * c : K;
                    uint32_t hi = 0u;
                    for (int64_t k = j * c; k < k1; k++) hi = acc[k] > hi ? acc[k] : hi;
                    out[i * KB + j] = hi;
                }
            }
            free(acc);
            return;
        }
    }
    /* the MX and NVFP4 widths as constants: each block compiles to whole vectors */
#define AMAX_ROWS(W)                                                                                              \
    for (int64_t m = 0; m < M; m++) {                                                                             \
        const float *row = x + m * K;                                                                             \
        uint32_t *orow = out + (m / r) * KB;                                                                      \
        for (int64_t j = 0; j < KB; j++) orow[j] = run_amax_bits(row + j * W, W, orow[j]);                        \
    }
    if (c == 32 && K % 32 == 0) { AMAX_ROWS(32) return; }
    if (c == 16 && K % 16 == 0) { AMAX_ROWS(16) return; }
#undef AMAX_ROWS
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * K;
        uint32_t *orow = out + (m / r) * KB;
        for (int64_t j = 0; j < KB; j++) {
            int64_t k0 = j * c, k1 = k0 + c < K ? k0 + c : K;
            orow[j] = run_amax_bits(row + k0, k1 - k0, orow[j]);
        }
    }
}

/* The element format (m mantissa bits, smallest normal 2^emin, largest value maxval; all
   three formats here have subnormals) and the byte format its codes are stored in
   (float8_e4m3fn or float8_e5m2; E2M1 values are stored as E4M3 bytes). */
typedef struct {
    uint32_t max_bits, min_normal_bits, shift_bits, drop; /* the element format */
    uint32_t s_min_normal_bits, s_shift_bits, s_drop;     /* the storage format */
    int same;                                              /* storage is the element format */
} fmt_t;

static fmt_t make_fmt(int m_bits, int emin, float maxval, int storage) {
    fmt_t f;
    int s_mbits = storage == 0 ? 3 : 2, s_emin = storage == 0 ? -6 : -14;
    f.max_bits = bits_of(maxval);
    f.min_normal_bits = bits_of(ldexpf(1.0f, emin));
    f.shift_bits = (uint32_t)(23 - m_bits) << 23;
    f.drop = 23u - (uint32_t)m_bits;
    f.s_min_normal_bits = bits_of(ldexpf(1.0f, s_emin));
    f.s_shift_bits = (uint32_t)(23 - s_mbits) << 23;
    f.s_drop = 23u - (uint32_t)s_mbits;
    f.same = m_bits == s_mbits && emin == s_emin;
    return f;
}

/* cast(t) for one element: float arithmetic and integer selects only, so loops of it
   vectorize. Rounding is nearest, ties to even, by the float32 add itself (the default
   rounding mode, which torch assumes too): with
   big = 2^(e + 23 - m), e the binade of |t| (emin below the normal range), float32's ulp
   at big is the format's grid step at |t|, so |t| + big rounds |t| onto the grid and
   subtracting big is exact (a carry into the next binade is the right answer). The same
   sum counts the grid steps: bits(|t| + big) - bits(big) = |r| / 2^(e - m), which is the
   significand with its leading bit, so adding (e - emin) << m gives the code, subnormals
   and the carry included. Beyond maxval saturates; NaN stays NaN (code 0x7F with t's sign,
   as torch writes it). */
static inline void cast_one(float t, fmt_t f, uint8_t *code_out, float *value_out) {
    uint32_t tb = bits_of(t);
    uint32_t sign = tb & 0x80000000u;
    uint32_t ab = tb & 0x7FFFFFFFu;
    uint32_t nan = ab > 0x7F800000u;
    uint32_t cb = ab > f.max_bits ? f.max_bits : ab; /* saturate (NaN handled by `nan`) */
    uint32_t eb = cb & 0x7F800000u;
    eb = eb < f.min_normal_bits ? f.min_normal_bits : eb;
    uint32_t big = eb + f.shift_bits;
    float sum = float_of(cb) + float_of(big);
    float r = sum - float_of(big);
    uint32_t code;
    if (f.same) {
        code = bits_of(sum) - big + ((eb - f.min_normal_bits) >> f.drop);
    } else { /* E2M1 in E4M3 bytes: the same count on the storage format's grid (r is on it) */
        uint32_t seb = bits_of(r) & 0x7F800000u;
        seb = seb < f.s_min_normal_bits ? f.s_min_normal_bits : seb;
        uint32_t sbig = seb + f.s_shift_bits;
        code = bits_of(r + float_of(sbig)) - sbig + ((seb - f.s_min_normal_bits) >> f.s_drop);
    }
    code = nan ? 0x7Fu : code;
    *code_out = (uint8_t)(code | (sign >> 24));
    *value_out = float_of(nan ? tb : (bits_of(r) | sign));
}

/* one run of a block row with inverse scale s; values (if not NULL) = the value times fs:
   1 for the values themselves, the block's scale for the values folded for a GEMM
   (multiplying by 1 changes no bits, -0 and NaN included) */
static inline __attribute__((always_inline)) void run_cast(const float *restrict x, int64_t n, float s, float fs,
                                                           fmt_t f, uint8_t *restrict codes, float *restrict values) {
    float v;
    if (values) {
        for (int64_t k = 0; k < n; k++) {
            cast_one(x[k] * s, f, codes + k, &v);
            values[k] = v * fs;
        }
    } else {
        for (int64_t k = 0; k < n; k++) cast_one(x[k] * s, f, codes + k, &v);
    }
}

static void run_cast_per_element(const float *x, int64_t n, const float *s, const float *fs, fmt_t f,
                                 uint8_t *codes, float *values) {
    float v;
    if (values) {
        for (int64_t k = 0; k < n; k++) {
            cast_one(x[k] * s[k], f, codes + k, &v);
            values[k] = v * fs[k];
        }
    } else {
        for (int64_t k = 0; k < n; k++) cast_one(x[k] * s[k], f, codes + k, &v);
    }
}

/* codes[M, K] = storage bytes of cast(x * inv[block], fmt), saturating at +-maxval, NaN
   staying NaN (code 0x7F with x's sign, as torch writes it); values[M, K] (unless NULL) =
   the same numbers as float32, times fold[block] where fold is not NULL (the block
   scales, for a GEMM that folds them). inv_count 1: one inverse scale (and fold) for all. */
static void scale_cast_serial(const float *x, int64_t row0, int64_t M, int64_t K, int64_t r, int64_t c,
                              const float *inv, int64_t inv_count, const float *fold, int m_bits, int emin,
                              float maxval, int storage, uint8_t *codes, float *values) {
    fmt_t f = make_fmt(m_bits, emin, maxval, storage);
    int64_t KB = (K + c - 1) / c;
    if (inv_count == 1) { /* one scale: the whole tensor is one run */
        run_cast(x, M * K, inv[0], fold ? fold[0] : 1.0f, f, codes, values);
        return;
    }
    if (c < NARROW) { /* narrow blocks: each column's inverse, once per block row */
        float *sk = (float *)malloc(2 * (size_t)K * sizeof(float));
        if (sk) {
            float *fk = sk + K;
            for (int64_t k = 0; k < K; k++) fk[k] = 1.0f;
            for (int64_t m = 0; m < M; m++) {
                if (m == 0 || (row0 + m) % r == 0) {
                    expand_row(inv + ((row0 + m) / r) * KB, K, c, sk);
                    if (fold) expand_row(fold + ((row0 + m) / r) * KB, K, c, fk);
                }
                run_cast_per_element(x + m * K, K, sk, fk, f, codes + m * K, values ? values + m * K : NULL);
            }
            free(sk);
            return;
        }
    }
    /* the MX and NVFP4 widths as constants: each block compiles to whole vectors */
#define CAST_ROWS(W)                                                                                              \
    for (int64_t m = 0; m < M; m++) {                                                                             \
        for (int64_t j = 0; j < KB; j++) {                                                                        \
            int64_t k0 = j * c, b = ((row0 + m) / r) * KB + j;                                                    \
            run_cast(x + m * K + k0, W, inv[b], fold ? fold[b] : 1.0f, f, codes + m * K + k0,                     \
                     values ? values + m * K + k0 : NULL);                                                        \
        }                                                                                                         \
    }
    if (c == 32 && K % 32 == 0) { CAST_ROWS(32) return; }
    if (c == 16 && K % 16 == 0) { CAST_ROWS(16) return; }
#undef CAST_ROWS
    for (int64_t m = 0; m < M; m++) {
        for (int64_t j = 0; j < KB; j++) {
            int64_t k0 = j * c, k1 = k0 + c < K ? k0 + c : K, b = ((row0 + m) / r) * KB + j;
            run_cast(x + m * K + k0, k1 - k0, inv[b], fold ? fold[b] : 1.0f, f, codes + m * K + k0,
                     values ? values + m * K + k0 : NULL);
        }
    }
}

/* out[M, K] = v[M, K] * s[block]: per-block scales folded into the values. */
static void block_mul_serial(const float *v, int64_t row0, int64_t M, int64_t K, int64_t r, int64_t c,
                             const float *s, float *out) {
    int64_t KB = (K + c - 1) / c;
    if (c < NARROW) { /* narrow blocks: each column's scale, once per block row */
        float *sk = (float *)malloc((size_t)K * sizeof(float));
        if (sk) {
            for (int64_t m = 0; m < M; m++) {
                if (m == 0 || (row0 + m) % r == 0) expand_row(s + ((row0 + m) / r) * KB, K, c, sk);
                for (int64_t k = 0; k < K; k++) out[m * K + k] = v[m * K + k] * sk[k];
            }
            free(sk);
            return;
        }
    }
    for (int64_t m = 0; m < M; m++) {
        const float *row = v + m * K;
        const float *srow = s + ((row0 + m) / r) * KB;
        float *orow = out + m * K;
        for (int64_t j = 0; j < KB; j++) {
            float sj = srow[j];
            int64_t k0 = j * c, k1 = k0 + c < K ? k0 + c : K;
            for (int64_t k = k0; k < k1; k++) orow[k] = row[k] * sj;
        }
    }
}

/* ---- the loops above, split over threads ----------------------------------------------------------
   Split at block-row boundaries (or anywhere, where one scale or one amax covers all rows),
   so every thread writes its own rows: the same bits for any number of threads.
   Built with OpenMP (-fopenmp, when fp8lab/kernels.py finds torch running on libgomp), the
   parts run on the OpenMP runtime torch itself uses: its worker threads, already waiting,
   and torch.set_num_threads's count. Torch splits its own elementwise loops beyond 32768
   elements, and so do these. Without OpenMP, POSIX threads (fp8lab_set_threads(n)) for
   tensors of millions of elements only: below that, starting a thread (and waking the
   core torch's idle OpenMP worker is spinning on) costs more than it saves. */

#ifdef _OPENMP
#include <omp.h>
#define PARALLEL_MIN (1 << 15)
#else
#define PARALLEL_MIN (1 << 21)
#endif

static int g_threads = 1;

void fp8lab_set_threads(int n) { g_threads = n < 1 ? 1 : (n > 64 ? 64 : n); }

/* the threads to split `elements` (in `units` indivisible parts) over */
static int64_t threads_for(int64_t elements, int64_t units) {
    if (elements < PARALLEL_MIN) return 1;
#ifdef _OPENMP
    int64_t n = omp_get_max_threads();
#else
    int64_t n = g_threads;
#endif
    n = n > 64 ? 64 : n;
    return n < units ? n : units;
}

/* whether the kernels run on OpenMP (1) or POSIX threads (0) */
int fp8lab_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

typedef struct {
    int kind; /* 0 amax, 1 scale_cast, 2 block_mul */
    const float *x; int64_t row0, M, K, r, c; /* row0: the first row's index in the whole tensor */
    const float *inv; int64_t inv_count; const float *fold; int m_bits, emin; float maxval; int storage;
    uint8_t *codes; float *values; float *amax; float *out;
} task_t;

static void *run_task(void *p) {
    task_t *t = (task_t *)p;
    if (t->kind == 0) block_amax_serial(t->x, t->M, t->K, t->r, t->c, t->amax);
    else if (t->kind == 1)
        scale_cast_serial(t->x, t->row0, t->M, t->K, t->r, t->c, t->inv, t->inv_count, t->fold, t->m_bits,
                          t->emin, t->maxval, t->storage, t->codes, t->values);
    else block_mul_serial(t->x, t->row0, t->M, t->K, t->r, t->c, t->inv, t->out);
    return NULL;
}

static void run_split(task_t base) {
    int64_t MB = (base.M + base.r - 1) / base.r, KB = (base.K + base.c - 1) / base.c;
    /* one block row (per tensor, or one block per column): amaxes of row ranges, combined */
    int one_row = MB == 1;
    /* amaxes split by block rows (or by rows, for one block row); the casts and products by
       rows (each part knows its first row, so a block row may straddle two parts) */
    int64_t unit = base.kind == 0 && !one_row ? base.r : 1;
    int64_t units = unit == 1 ? base.M : MB;
    int64_t n = threads_for(base.M * base.K, units);
    if (n <= 1) { run_task(&base); return; }
    task_t tasks[64];
    float partial_one[64];
    float *partial = base.kind == 0 && one_row && KB > 1 ? (float *)malloc((size_t)(n * KB) * sizeof(float))
                                                         : partial_one;
    if (!partial) { run_task(&base); return; }
    for (int64_t i = 0; i < n; i++) {
        int64_t b0 = units * i / n, b1 = units * (i + 1) / n;
        int64_t m0 = b0 * unit, m1 = b1 * unit < base.M ? b1 * unit : base.M;
        task_t t = base;
        t.row0 = m0;
        t.M = m1 - m0;
        t.x = base.x + m0 * base.K;
        if (base.kind == 0 && one_row) { t.r = t.M; t.amax = partial + i * KB; } /* one block row of its own */
        if (base.kind == 0 && !one_row) { t.row0 = 0; t.amax = base.amax + b0 * KB; }
        if (base.kind == 1) { t.codes = base.codes + m0 * base.K; t.values = base.values ? base.values + m0 * base.K : NULL; }
        if (base.kind == 2) t.out = base.out + m0 * base.K;
        tasks[i] = t;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(n) schedule(static, 1)
    for (int64_t i = 0; i < n; i++) run_task(&tasks[i]);
#else
    pthread_t threads[64];
    int started[64] = {0};
    for (int64_t i = 1; i < n; i++) started[i] = pthread_create(&threads[i], NULL, run_task, &tasks[i]) == 0;
    run_task(&tasks[0]);
    for (int64_t i = 1; i < n; i++) {
        if (started[i]) pthread_join(threads[i], NULL);
        else run_task(&tasks[i]); /* no thread to be had: do it here */
    }
#endif
    if (base.kind == 0 && one_row) { /* each block's amax: the largest part's (NaN's bits are largest) */
        for (int64_t j = 0; j < KB; j++) {
            uint32_t hi = 0u;
            for (int64_t i = 0; i < n; i++) hi = bits_of(partial[i * KB + j]) > hi ? bits_of(partial[i * KB + j]) : hi;
            base.amax[j] = float_of(hi);
        }
    }
    if (partial != partial_one) free(partial);
}

/* max |x| over each block -> amax[MB * KB]; a NaN in a block makes its amax NaN */
void fp8lab_block_amax(const float *x, int64_t M, int64_t K, int64_t r, int64_t c, float *amax) {
    task_t t = {0};
    t.kind = 0; t.x = x; t.M = M; t.K = K; t.r = r; t.c = c; t.amax = amax;
    run_split(t);
}

/* codes (and values, unless NULL) of cast(x * inv[block], fmt): see scale_cast_serial */
void fp8lab_scale_cast(const float *x, int64_t M, int64_t K, int64_t r, int64_t c, const float *inv,
                       int64_t inv_count, const float *fold, int m_bits, int emin, float maxval, int storage,
                       uint8_t *codes, float *values) {
    task_t t = {0};
    t.kind = 1; t.x = x; t.M = M; t.K = K; t.r = r; t.c = c; t.inv = inv; t.inv_count = inv_count; t.fold = fold;
    t.m_bits = m_bits; t.emin = emin; t.maxval = maxval; t.storage = storage; t.codes = codes; t.values = values;
    run_split(t);
}

/* out[M, K] = v[M, K] * s[block] */
void fp8lab_block_mul(const float *v, int64_t M, int64_t K, int64_t r, int64_t c, const float *s, float *out) {
    task_t t = {0};
    t.kind = 2; t.x = v; t.M = M; t.K = K; t.r = r; t.c = c; t.inv = s; t.inv_count = 2; t.out = out;
    run_split(t);
}

/* 2^e for e in [-149, 127], exactly */
static inline float pow2(int e) {
    return e >= -126 ? float_of((uint32_t)(e + 127) << 23) : float_of(1u << (e + 149));
}

/* scale and inverse per block from its amax (scaling.scale_from_amax, same arithmetic):
   rule 0 "exact": inverse = float32(min(max_eff / double(amax), FLT_MAX)), scale = 1 / inverse;
   rule 1 "rceil", 2 "floor": powers of two 2^e, e clamped to [lo, hi], from frexp's exact
   exponent. amax 0 gives 1 and 1; NaN gives NaN. */
static void pow2_scale(float a, int rule, int max_exp, float max_mant, int floor_log2_max, int lo, int hi,
                       float *scale, float *inverse) {
    /* scalar version for the rare amaxes that are not normal floats (subnormal, inf) */
    int exp = 0;
    float mant = isinf(a) ? a : frexpf(a, &exp); /* torch.frexp(inf) = (inf, 0) */
    int e = rule == 2 ? (exp - 1) - floor_log2_max : exp - max_exp + (mant > max_mant);
    e = e < lo ? lo : (e > hi ? hi : e);
    *scale = pow2(e);
    *inverse = pow2(-e);
}

void fp8lab_scales(const float *amax, int64_t n, int rule, double max_eff, int lo, int hi,
                   float *scale, float *inverse) {
    int max_exp;
    float max_mant = (float)frexp(max_eff, &max_exp);
    int floor_log2_max = (int)floor(log2(max_eff));
    if (rule == 0) {
        for (int64_t i = 0; i < n; i++) {
            float a = amax[i];
            double q = max_eff / (double)a;
            float inv = (float)(q > FLT_MAX ? (double)FLT_MAX : q); /* NaN stays NaN */
            inv = a == 0.0f ? 1.0f : inv;
            inverse[i] = inv;
            scale[i] = 1.0f / inv;
        }
        return;
    }
    /* powers of two, branch-free for normal amaxes (frexp read from the bits) */
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = bits_of(amax[i]);
        int32_t biased = (int32_t)((u >> 23) & 0xFFu);
        int32_t exp = biased - 126;
        float mant = float_of((u & 0x807FFFFFu) | (126u << 23));
        int32_t e = rule == 2 ? (exp - 1) - floor_log2_max : exp - max_exp + (mant > max_mant);
        e = e < lo ? lo : (e > hi ? hi : e);
        /* e and -e lie in [-127, 127]; 2^-127 is float32's subnormal 0x00400000 */
        uint32_t sb = e >= -126 ? (uint32_t)(e + 127) << 23 : 0x00400000u;
        uint32_t ib = e <= 126 ? (uint32_t)(127 - e) << 23 : 0x00400000u;
        int special = biased == 0 || biased == 0xFF;                         /* 0, subnormal, inf, NaN */
        scale[i] = float_of(special ? 0x3F800000u : sb);
        inverse[i] = float_of(special ? 0x3F800000u : ib);
    }
    for (int64_t i = 0; i < n; i++) {
        float a = amax[i];
        uint32_t biased = (bits_of(a) >> 23) & 0xFFu;
        if (biased != 0u && biased != 0xFFu) continue;
        if (a != a) { scale[i] = NAN; inverse[i] = NAN; }
        else if (a != 0.0f) pow2_scale(a, rule, max_exp, max_mant, floor_log2_max, lo, hi, scale + i, inverse + i);
    }
}

/* NVFP4's E4M3 block scales (quantize.py, scale_fmt=E4M3, same arithmetic): ideal =
   amax / max_eff, divided by the tensor scale amax_all / (448 * elem_max) when two_level
   (tensor scale 1 if that amax is 0 or NaN), clamped to [2^-6, 448] and rounded to E4M3;
   a NaN amax gives a NaN scale. inverse = (1 / tensor scale) / scale. */
static void e4m3_scales(const float *amax, int64_t n, float max_eff, float elem_max, int two_level,
                        float *tensor_scale, float *scale, float *inverse) {
    float ts = 1.0f;
    if (two_level) {
        uint32_t hi = 0u; /* the largest amax; NaN's bits are the largest */
        for (int64_t i = 0; i < n; i++) hi = bits_of(amax[i]) > hi ? bits_of(amax[i]) : hi;
        float all = float_of(hi);
        ts = all > 0.0f ? all / (448.0f * elem_max) : 1.0f;
        *tensor_scale = ts;
    }
    float inv_ts = 1.0f / ts;
    for (int64_t i = 0; i < n; i++) {
        float a = amax[i];
        float ideal = a / max_eff;
        if (two_level) ideal = ideal / ts;
        ideal = ideal < 0.015625f ? 0.015625f : (ideal > 448.0f ? 448.0f : ideal); /* NaN stays */
        uint32_t u = bits_of(ideal); /* a normal E4M3 value after the clamp: round the mantissa */
        u = (u + ((1u << 19) - 1u) + ((u >> 20) & 1u)) & ~((1u << 20) - 1u);
        float sc = a != a ? NAN : float_of(u);
        scale[i] = sc;
        inverse[i] = inv_ts / sc;
    }
}

/* quantize() in one call where the scales come from x's own amaxes (float32, E8M0, or
   E4M3 with rule 3 and 4): block amaxes, scales by the rule, then the scale-and-cast (values folded with
   the scales if fold is set), and scale_range = the smallest and largest scale (both NaN if
   one is, as torch.aminmax). Returns 1, having written only the amaxes, if one of them is
   infinite (the caller raises), else 0. */
int fp8lab_quantize(const float *x, int64_t M, int64_t K, int64_t r, int64_t c, int rule, double max_eff,
                    int lo, int hi, int m_bits, int emin, float maxval, int storage,
                    float *amax, float *scale, float *inverse, uint8_t *codes, float *values, int fold,
                    float *tensor_scale, float *scale_range) {
    int64_t n = ((M + r - 1) / r) * ((K + c - 1) / c);
    fp8lab_block_amax(x, M, K, r, c, amax);
    const uint32_t *amax_bits = (const uint32_t *)amax;
    uint32_t inf = 0u; /* amaxes are >= 0 or NaN: an infinite one has the bits of +inf */
    for (int64_t i = 0; i < n; i++) inf |= amax_bits[i] == 0x7F800000u;
    if (inf) return 1;
    if (rule >= 3) /* 3: E4M3 block scales, 4: the same under a tensor scale (NVFP4) */
        e4m3_scales(amax, n, (float)max_eff, maxval, rule == 4, tensor_scale, scale, inverse);
    else
        fp8lab_scales(amax, n, rule, max_eff, lo, hi, scale, inverse);
    fp8lab_scale_cast(x, M, K, r, c, inverse, n, fold ? scale : NULL, m_bits, emin, maxval, storage, codes, values);
    /* scales are positive or NaN: they order as their bits, and NaN's bits exceed every
       number's, so integer min and max (which vectorize) find them */
    const uint32_t *scale_bits = (const uint32_t *)scale;
    uint32_t smallest = 0xFFFFFFFFu, largest = 0u;
    for (int64_t i = 0; i < n; i++) {
        smallest = scale_bits[i] < smallest ? scale_bits[i] : smallest;
        largest = scale_bits[i] > largest ? scale_bits[i] : largest;
    }
    int nan = largest > 0x7F800000u;
    scale_range[0] = nan ? NAN : float_of(smallest);
    scale_range[1] = nan ? NAN : float_of(largest);
    return 0;
}

/* For the monitor (metrics.overflow_fraction / underflow_fraction, same arithmetic):
   counts[0] = elements with double(|x|) / double(scale[block]) > limit (they clipped),
   counts[1] = nonzero elements whose code is a zero (they flushed). */
void fp8lab_clip_flush_counts(const float *x, int64_t M, int64_t K, int64_t r, int64_t c, const float *s,
                              int64_t s_count, const uint8_t *codes, double limit, int64_t *counts) {
    int64_t KB = (K + c - 1) / c, clipped = 0, flushed = 0;
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(M * K, M) > 1) num_threads(threads_for(M * K, M)) \
    reduction(+ : clipped, flushed)
#endif
    for (int64_t m = 0; m < M; m++) {
        for (int64_t j = 0; j < KB; j++) {
            int64_t k0 = j * c, k1 = k0 + c < K ? k0 + c : K;
            double sd = (double)(s_count == 1 ? s[0] : s[(m / r) * KB + j]);
            const float *xr = x + m * K;
            const uint8_t *cr = codes + m * K;
            int64_t cl = 0, fl = 0;
            for (int64_t k = k0; k < k1; k++) {
                cl += fabs((double)xr[k]) / sd > limit;
                fl += (xr[k] != 0.0f) & ((cr[k] & 0x7F) == 0);
            }
            clipped += cl;
            flushed += fl;
        }
    }
    counts[0] = clipped;
    counts[1] = flushed;
}

/* out[m, n] *= a[m] * b[n] (the product rounded to float32 first, as torch forms the
   factor matrix outer(a, b)): per-row scales of both GEMM operands, without the matrix. */
void fp8lab_scale_outer(float *out, int64_t M, int64_t N, const float *a, const float *b) {
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(M * N, M) > 1) num_threads(threads_for(M * N, M))
#endif
    for (int64_t m = 0; m < M; m++) {
        float am = a[m];
        float *row = out + m * N;
        for (int64_t n = 0; n < N; n++) {
            float factor = am * b[n];
            row[n] = row[n] * factor;
        }
    }
}

/* fp8lab's CPU kernels: quantization fused into single passes over memory.

   The torch code (scaling.amax_per_block, scaling.scale_from_amax, formats.cast, and
   quantize.quantize_with, which strings them together) is the definition; these loops compute
   the same bits (tests/test_kernels.py proves it) in one pass where torch needs five
   (multiply, clamp, cast, widen, fold), each allocating a temporary. Built on first use by
   fp8lab/numerics/kernels_build.py with the system C compiler and called through ctypes; without a
   compiler fp8lab runs the torch code, and `python -m fp8lab doctor` says why.

   Formats and scale rules are data, as in Python: every number that describes a format
   (mantissa bits, smallest normal, largest value, NaN code, width) or a rule arrives in one
   fp8lab_params block that kernels.py fills from FloatFormat and SCALE_RULES. Nothing here
   knows E4M3 from E5M2. Every entry point checks the block's size and its shapes first and
   returns a negative code instead of touching memory when they are inconsistent.

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

/* the entry points kernels.py calls: exported whatever visibility the compiler is told to default
   to (a wrapper adding -fvisibility=hidden); kernels_build.py lists the functions marked so */
#define FP8LAB_API __attribute__((visibility("default")))

/* ---- the parameter block (fp8lab/kernels.py: _Format, _Params; same fields, same order) ---------------- */

/* a FloatFormat, as the loops need it (signed, with subnormals) */
typedef struct {
    int32_t bits;          /* width of one code (storage formats: 8, one code per byte) */
    int32_t mantissa_bits; /* FloatFormat.mantissa_bits */
    int32_t min_exponent;  /* log2(FloatFormat.min_normal) = 1 - bias */
    float max_value;       /* FloatFormat.max_value */
    uint32_t nan_code;     /* the code torch writes for a positive NaN; the sign bit is added */
} fp8lab_format;

/* scaling.SCALE_RULES, in its order; kernels.py compares its names with fp8lab_rule_names() */
enum { RULE_EXACT, RULE_RCEIL, RULE_FLOOR, RULE_COUNT };
static const char RULE_NAMES[] = "exact rceil floor";

typedef struct {
    int64_t size;                       /* sizeof(fp8lab_params) as kernels.py laid it out */
    int64_t M, K, r, c;                 /* x[M, K] in blocks of r x c (1 <= r <= max(M, 1), same for c) */
    int64_t blocks;                     /* ceil(M/r) * ceil(K/c): the length of amax, scale, inverse */
    fp8lab_format element;              /* the elements' format */
    fp8lab_format storage;              /* the format whose bytes hold the codes (E2M1 in E4M3 bytes) */
    fp8lab_format scale_format;         /* round_scales: the block scales' format (NVFP4: E4M3) */
    int32_t rule;                       /* RULE_*: the index of the rule in scaling.SCALE_RULES */
    int32_t round_scales;               /* exact scales rounded to scale_format, clamped to [scale_floor, its max] */
    int32_t two_level;                  /* ... under a per-tensor scale amax / (scale max * element max) */
    int32_t exponent_min, exponent_max; /* power-of-two scales 2^e: e clamped to this range */
    double max_eff;                     /* element max / 2^margin */
    float min_inverse;                  /* "exact": the smallest inverse (its scale 1 / inverse stays finite) */
    float min_tensor_scale;             /* two-level: the smallest tensor scale (inverses stay finite) */
    float scale_floor;                  /* round_scales: the smallest scale before rounding (TensorScaling.floor) */
    int32_t fold;                       /* values times their block's scale */
    int32_t count;                      /* count the clipped and the flushed elements */
    double clip_limit;                  /* |x| / scale beyond this clipped (FloatFormat.clip_threshold) */
    const float *x;                     /* [M, K] */
    const float *given_amax;            /* [blocks] the amaxes to scale with, or NULL: x's own */
    float *amax;                        /* [blocks] x's own block amaxes (written) */
    float *scale, *inverse;             /* [blocks] (written by scales; read by the cast) */
    uint8_t *codes;                     /* [M, K] storage bytes (written) */
    float *values;                      /* [M, K] or NULL (written) */
    float tensor_scale;                 /* two-level: written */
    float scale_range[2];               /* smallest and largest scale (written by quantize) */
    int64_t counts[2];                  /* clipped, flushed (written by quantize if count) */
    const float *draws;                 /* [M, K] uniform draws in [0, 1): stochastic rounding; NULL: to nearest */
} fp8lab_params;

enum { OK = 0, INFINITE_AMAX = 1, NAN_AMAX = 2, BAD_SIZE = -1, BAD_SHAPE = -2, BAD_FORMAT = -3, BAD_RULE = -4 };

FP8LAB_API const char *fp8lab_rule_names(void) { return RULE_NAMES; }

static int check_format(fp8lab_format f) {
    return f.mantissa_bits >= 0 && f.mantissa_bits <= 22 && f.min_exponent >= -126 && f.min_exponent <= 127 &&
           f.max_value > 0.0f && f.max_value <= FLT_MAX;
}

/* the block and its shapes, before anything is read */
static int check(const fp8lab_params *p) {
    if (p == NULL || p->size != (int64_t)sizeof(fp8lab_params)) return BAD_SIZE;
    if (p->M < 0 || p->K < 0 || p->r < 1 || p->c < 1 || p->r > (p->M > 1 ? p->M : 1) || p->c > (p->K > 1 ? p->K : 1))
        return BAD_SHAPE;
    if (p->blocks != ((p->M + p->r - 1) / p->r) * ((p->K + p->c - 1) / p->c)) return BAD_SHAPE;
    if (!check_format(p->element) || !check_format(p->storage) || p->storage.bits != 8 || p->storage.nan_code > 0x7Fu)
        return BAD_FORMAT;
    if (p->round_scales && !check_format(p->scale_format)) return BAD_FORMAT;
    if (p->rule < 0 || p->rule >= RULE_COUNT || p->exponent_min > p->exponent_max || p->exponent_min < -127 ||
        p->exponent_max > 127)
        return BAD_RULE;
    return OK;
}

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

/* ---- amax ------------------------------------------------------------------------------------------------------ */

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
    /* the MX and NVFP4 widths as constants (ahead of the narrow blocks' running max): whole vectors per block */
#define AMAX_ROWS(W)                                                                                              \
    for (int64_t m = 0; m < M; m++) {                                                                             \
        const float *row = x + m * K;                                                                             \
        uint32_t *orow = out + (m / r) * KB;                                                                      \
        for (int64_t j = 0; j < KB; j++) orow[j] = run_amax_bits(row + j * W, W, orow[j]);                        \
    }
    if (c == 32 && K % 32 == 0) { AMAX_ROWS(32) return; }
    if (c == 16 && K % 16 == 0) { AMAX_ROWS(16) return; }
#undef AMAX_ROWS
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
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * K;
        uint32_t *orow = out + (m / r) * KB;
        for (int64_t j = 0; j < KB; j++) {
            int64_t k0 = j * c, k1 = k0 + c < K ? k0 + c : K;
            orow[j] = run_amax_bits(row + k0, k1 - k0, orow[j]);
        }
    }
}

/* ---- the cast ----------------------------------------------------------------------------------------------- */

/* an element format and the byte format its codes are stored in, as the cast needs them */
typedef struct {
    uint32_t max_bits, min_normal_bits, shift_bits, drop; /* the element format */
    uint32_t s_min_normal_bits, s_shift_bits, s_drop;     /* the storage format */
    uint32_t nan_code, sign_shift;                        /* the storage format's NaN and sign bit */
    int same;                                             /* storage is the element format */
    float max_value, step_scale, min_subnormal;           /* stochastic rounding: max, 2^-m, smallest step */
} fmt_t;

static fmt_t make_fmt(fp8lab_format e, fp8lab_format s) {
    fmt_t f;
    f.max_bits = bits_of(e.max_value);
    f.min_normal_bits = bits_of(ldexpf(1.0f, e.min_exponent));
    f.shift_bits = (uint32_t)(23 - e.mantissa_bits) << 23;
    f.drop = 23u - (uint32_t)e.mantissa_bits;
    f.s_min_normal_bits = bits_of(ldexpf(1.0f, s.min_exponent));
    f.s_shift_bits = (uint32_t)(23 - s.mantissa_bits) << 23;
    f.s_drop = 23u - (uint32_t)s.mantissa_bits;
    f.nan_code = s.nan_code;
    f.sign_shift = 32u - (uint32_t)s.bits;
    f.same = e.mantissa_bits == s.mantissa_bits && e.min_exponent == s.min_exponent;
    f.max_value = e.max_value;
    f.step_scale = ldexpf(1.0f, -e.mantissa_bits);
    f.min_subnormal = ldexpf(1.0f, e.min_exponent - e.mantissa_bits);
    return f;
}

/* cast(t) for one element (formats.cast's twin): float arithmetic and integer selects only,
   so loops of it vectorize. Rounding is nearest, ties to even, by the float32 add itself (the
   default rounding mode, which torch assumes too): with big = 2^(e + 23 - m), e the binade of
   |t| (emin below the normal range), float32's ulp at big is the format's grid step at |t|,
   so |t| + big rounds |t| onto the grid and subtracting big is exact (a carry into the next
   binade is the right answer). The same sum counts the grid steps: bits(|t| + big) - bits(big)
   = |r| / 2^(e - m), which is the significand with its leading bit, so adding (e - emin) << m
   gives the code, subnormals and the carry included. Beyond the largest value (inf included)
   saturates; NaN stays NaN (the storage format's NaN code with t's sign, as torch writes it). */
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
    code = nan ? f.nan_code : code;
    *code_out = (uint8_t)(code | (sign >> f.sign_shift));
    *value_out = float_of(nan ? tb : (bits_of(r) | sign));
}

/* formats.round_stochastic's twin for one element, then its code (cast_one of a value on the grid is
   itself): |t| clamped to the largest value lies between lo and lo + step on its binade's grid, step =
   max(2^floor(log2|t|) * 2^-m, smallest subnormal); it rounds up where draw < |t| / step - floor(|t| / step).
   The same float32 operations in the same order as the torch code (every one exact), NaN staying NaN. */
static inline void cast_stochastic_one(float t, float draw, fmt_t f, uint8_t *code_out, float *value_out) {
    float a = fabsf(t);
    a = a > f.max_value ? f.max_value : a; /* (NaN stays) */
    float step = float_of(bits_of(a) & 0x7F800000u) * f.step_scale;
    step = step < f.min_subnormal ? f.min_subnormal : step;
    /* a / step as a times 1 / step: step is a power of two within the format's range (normal in float32), so is
       its inverse (its exponent negated in the bits), and a times a power of two is exact here as a / step is
       (units >= 1 where a is normal; a subnormal a is multiplied up): the same number, without a division */
    float units = a * float_of(0x7F000000u - bits_of(step));
    float low = floorf(units);
    float out = (low + (draw < units - low ? 1.0f : 0.0f)) * step;
    cast_one(copysignf(out, t), f, code_out, value_out);
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

/* run_cast with a draw per element (stochastic rounding) */
static inline __attribute__((always_inline)) void run_cast_stochastic(const float *restrict x,
                                                                      const float *restrict draws, int64_t n, float s,
                                                                      float fs, fmt_t f, uint8_t *restrict codes,
                                                                      float *restrict values) {
    float v;
    if (values) {
        for (int64_t k = 0; k < n; k++) {
            cast_stochastic_one(x[k] * s, draws[k], f, codes + k, &v);
            values[k] = v * fs;
        }
    } else {
        for (int64_t k = 0; k < n; k++) cast_stochastic_one(x[k] * s, draws[k], f, codes + k, &v);
    }
}

/* run_cast with an inverse s[k] and a fold fs[k] per element (a row of narrow blocks, expanded), and with a draw per
   element where draws is not NULL (stochastic rounding) */
static void run_cast_per_element(const float *restrict x, const float *restrict draws, int64_t n,
                                 const float *restrict s, const float *restrict fs, fmt_t f, uint8_t *restrict codes,
                                 float *restrict values) {
    float v;
    if (draws && values) {
        for (int64_t k = 0; k < n; k++) {
            cast_stochastic_one(x[k] * s[k], draws[k], f, codes + k, &v);
            values[k] = v * fs[k];
        }
    } else if (draws) {
        for (int64_t k = 0; k < n; k++) cast_stochastic_one(x[k] * s[k], draws[k], f, codes + k, &v);
    } else if (values) {
        for (int64_t k = 0; k < n; k++) {
            cast_one(x[k] * s[k], f, codes + k, &v);
            values[k] = v * fs[k];
        }
    } else {
        for (int64_t k = 0; k < n; k++) cast_one(x[k] * s[k], f, codes + k, &v);
    }
}

/* codes[M, K] = storage bytes of cast(x * inv[block], fmt); values[M, K] (unless NULL) = the
   same numbers as float32, times fold[block] where fold is not NULL (the block scales, for a
   GEMM that folds them). inv_count 1: one inverse scale (and fold) for all. row0: the index of
   x's first row in the whole tensor (a part of it, split over threads). */
static void scale_cast_serial(const float *x, int64_t row0, int64_t M, int64_t K, int64_t r, int64_t c,
                              const float *inv, int64_t inv_count, const float *fold, fmt_t f, uint8_t *codes,
                              float *values, const float *draws) {
    int64_t KB = (K + c - 1) / c;
    if (inv_count == 1) { /* one scale: the whole tensor is one run (with stochastic rounding, a draw an element) */
        if (draws) run_cast_stochastic(x, draws, M * K, inv[0], fold ? fold[0] : 1.0f, f, codes, values);
        else run_cast(x, M * K, inv[0], fold ? fold[0] : 1.0f, f, codes, values);
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
                run_cast_per_element(x + m * K, draws ? draws + m * K : NULL, K, sk, fk, f, codes + m * K,
                                     values ? values + m * K : NULL);
            }
            free(sk);
            return;
        }
    }
    /* the MX width as a constant: each block compiles to whole vectors (narrower blocks, NVFP4 16 wide, run above:
       a row of their inverses expanded, then one vector loop, is faster than a short loop per block) */
#define CAST_ROWS(W)                                                                                              \
    for (int64_t m = 0; m < M; m++) {                                                                             \
        for (int64_t j = 0; j < KB; j++) {                                                                        \
            int64_t k0 = j * c, b = ((row0 + m) / r) * KB + j;                                                    \
            run_cast(x + m * K + k0, W, inv[b], fold ? fold[b] : 1.0f, f, codes + m * K + k0,                     \
                     values ? values + m * K + k0 : NULL);                                                        \
        }                                                                                                         \
    }
    if (c == 32 && K % 32 == 0 && !draws) { CAST_ROWS(32) return; }
#undef CAST_ROWS
    for (int64_t m = 0; m < M; m++) {
        for (int64_t j = 0; j < KB; j++) {
            int64_t k0 = j * c, k1 = k0 + c < K ? k0 + c : K, at = m * K + k0, b = ((row0 + m) / r) * KB + j;
            float s = inv[b], fs = fold ? fold[b] : 1.0f;
            float *v = values ? values + at : NULL;
            if (draws) run_cast_stochastic(x + at, draws + at, k1 - k0, s, fs, f, codes + at, v);
            else run_cast(x + at, k1 - k0, s, fs, f, codes + at, v);
        }
    }
}

/* ---- the loops above, split over threads ----------------------------------------------------------
   Split at block-row boundaries (or anywhere, where one scale or one amax covers all rows),
   so every thread writes its own rows: the same bits for any number of threads.
   Built with OpenMP (-fopenmp, when fp8lab/numerics/kernels_build.py finds torch running on libgomp), the
   parts run on the OpenMP runtime torch itself uses: its worker threads, already waiting,
   and torch.set_num_threads's count. Torch splits its own elementwise loops beyond 32768
   elements, and so do these where the threads spin (beyond fp8lab_set_parallel_min's count where they wait
   passively and each split wakes them first). Without OpenMP, POSIX threads (fp8lab_set_threads(n)) for
   tensors of millions of elements only: below that, starting a thread (and waking the
   core torch's idle OpenMP worker is spinning on) costs more than it saves. */

#ifdef _OPENMP
#include <omp.h>
#define PARALLEL_MIN (1 << 15)
#else
#define PARALLEL_MIN (1 << 21)
#endif

static int g_threads = 1;
static int64_t g_parallel_min = PARALLEL_MIN;

FP8LAB_API void fp8lab_set_threads(int n) { g_threads = n < 1 ? 1 : (n > 64 ? 64 : n); }

/* The fewest elements split over threads (PARALLEL_MIN unless set): where OpenMP's threads wait passively, each
   parallel region first wakes them, which costs more than a small tensor's work (fp8lab.numerics.kernels sets it
   from the wait policy in force). */
FP8LAB_API void fp8lab_set_parallel_min(int64_t n) { g_parallel_min = n < 1 ? 1 : n; }
FP8LAB_API int64_t fp8lab_parallel_min(void) { return g_parallel_min; }

/* the threads to split `elements` (in `units` indivisible parts) over */
static int64_t threads_for(int64_t elements, int64_t units) {
    if (elements < g_parallel_min) return 1;
#ifdef _OPENMP
    int64_t n = omp_get_max_threads();
#else
    int64_t n = g_threads;
#endif
    n = n > 64 ? 64 : n;
    return n < units ? n : units;
}

/* whether the kernels run on OpenMP (1) or POSIX threads (0) */
FP8LAB_API int fp8lab_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

typedef struct {
    int kind; /* 0 amax, 1 scale_cast */
    const float *x; int64_t row0, M, K, r, c; /* row0: the first row's index in the whole tensor */
    const float *inv; int64_t inv_count; const float *fold; fmt_t f;
    uint8_t *codes; float *values; float *amax; const float *draws;
} task_t;

static void *run_task(void *p) {
    task_t *t = (task_t *)p;
    if (t->kind == 0) block_amax_serial(t->x, t->M, t->K, t->r, t->c, t->amax);
    else scale_cast_serial(t->x, t->row0, t->M, t->K, t->r, t->c, t->inv, t->inv_count, t->fold, t->f, t->codes,
                           t->values, t->draws);
    return NULL;
}

static void run_split(task_t base) {
    if (base.M == 0 || base.K == 0) {
        if (base.kind == 0) run_task(&base); /* (the amaxes of empty blocks: 0) */
        return;
    }
    int64_t MB = (base.M + base.r - 1) / base.r, KB = (base.K + base.c - 1) / base.c;
    /* one block row (per tensor, or one block per column): amaxes of row ranges, combined */
    int one_row = MB == 1;
    /* amaxes split by block rows (or by rows, for one block row); the casts by rows (each
       part knows its first row, so a block row may straddle two parts) */
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
        if (base.kind == 1) {
            t.codes = base.codes + m0 * base.K;
            t.values = base.values ? base.values + m0 * base.K : NULL;
            t.draws = base.draws ? base.draws + m0 * base.K : NULL;
        }
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

static void block_amax(const fp8lab_params *p, float *amax) {
    task_t t = {0};
    t.kind = 0; t.x = p->x; t.M = p->M; t.K = p->K; t.r = p->r; t.c = p->c; t.amax = amax;
    run_split(t);
}

static void scale_cast(const fp8lab_params *p, const float *inverse, int64_t inv_count, const float *fold) {
    task_t t = {0};
    t.kind = 1; t.x = p->x; t.M = p->M; t.K = p->K; t.r = p->r; t.c = p->c; t.inv = inverse;
    t.inv_count = inv_count; t.fold = fold; t.f = make_fmt(p->element, p->storage); t.codes = p->codes;
    t.values = p->values; t.draws = p->draws;
    run_split(t);
}

/* ---- scales (scaling.scale_from_amax's twin, same arithmetic) ------------------------------------------------ */

/* 2^e for e in [-149, 127], exactly */
static inline float pow2(int32_t e) {
    return e >= -126 ? float_of((uint32_t)(e + 127) << 23) : float_of(1u << (e + 149));
}

/* scale and inverse per block from its amax, for every rule:
   "exact"  inverse = float32(clamp(max_eff / double(amax), min_inverse, FLT_MAX)), scale = 1 / inverse;
            with round_scales (NVFP4): scale = round to scale_format of clamp(amax / max_eff [/ tensor
            scale], scale_floor, its largest value), inverse = (1 / tensor scale) / scale (0 where the
            scale is 0), the tensor scale max(amax of all / (scale_format max * element max),
            min_tensor_scale), 1 where that amax is 0 or NaN;
   "rceil"  2^e, e = ceil(log2(amax / max_eff)); "floor" 2^e, e = floor(log2 amax) - floor(log2 max_eff):
            e from frexp's exact exponent, clamped to [exponent_min, exponent_max].
   amax 0 gives scale 1 and inverse 1; NaN gives NaN and NaN. */
static void block_scales(const fp8lab_params *p, const float *amax, int64_t n, float *scale, float *inverse,
                         float *tensor_scale) {
    double max_eff = p->max_eff;
    if (p->rule == RULE_EXACT && p->round_scales) {
        fmt_t sf = make_fmt(p->scale_format, p->scale_format);
        float lo = p->scale_floor, hi = p->scale_format.max_value;
        float ts = 1.0f;
        if (p->two_level) {
            uint32_t top = 0u; /* the largest amax; NaN's bits are the largest */
            for (int64_t i = 0; i < n; i++) top = bits_of(amax[i]) > top ? bits_of(amax[i]) : top;
            float all = float_of(top);
            float t = all / (p->scale_format.max_value * p->element.max_value);
            t = t < p->min_tensor_scale ? p->min_tensor_scale : t;
            ts = all > 0.0f ? t : 1.0f;
            *tensor_scale = ts;
        }
        float inv_ts = 1.0f / ts;
        uint8_t code;
        for (int64_t i = 0; i < n; i++) {
            float a = amax[i];
            float ideal = a / (float)max_eff;
            if (p->two_level) ideal = ideal / ts;
            ideal = ideal < lo ? lo : (ideal > hi ? hi : ideal); /* NaN stays */
            float sc;
            cast_one(ideal, sf, &code, &sc);
            sc = a != a ? NAN : sc;
            scale[i] = sc;
            inverse[i] = sc == 0.0f ? 0.0f : inv_ts / sc; /* a zero scale holds nothing: codes 0 */
        }
        return;
    }
    if (p->rule == RULE_EXACT) {
        double lo = (double)p->min_inverse;
        for (int64_t i = 0; i < n; i++) {
            float a = amax[i];
            double q = max_eff / (double)a;
            q = q > (double)FLT_MAX ? (double)FLT_MAX : (q < lo ? lo : q); /* NaN stays NaN */
            float inv = a == 0.0f ? 1.0f : (float)q;
            inverse[i] = inv;
            scale[i] = 1.0f / inv;
        }
        return;
    }
    /* powers of two: e from frexp(amax) = (mant, exp), mant in [0.5, 1): floor(log2 amax) = exp - 1 */
    int max_exp;
    float max_mant = (float)frexp(max_eff, &max_exp);
    int32_t floor_log2_max = (int32_t)floor(log2(max_eff)), lo = p->exponent_min, hi = p->exponent_max;
    int floor_rule = p->rule == RULE_FLOOR;
    for (int64_t i = 0; i < n; i++) { /* branch-free for normal amaxes (frexp read from the bits) */
        uint32_t u = bits_of(amax[i]);
        int32_t biased = (int32_t)((u >> 23) & 0xFFu);
        int32_t exp = biased - 126;
        float mant = float_of((u & 0x807FFFFFu) | (126u << 23));
        int32_t e = floor_rule ? (exp - 1) - floor_log2_max : exp - max_exp + (mant > max_mant);
        e = e < lo ? lo : (e > hi ? hi : e);
        int special = biased == 0 || biased == 0xFF; /* 0, subnormal, inf, NaN: below */
        scale[i] = special ? 1.0f : pow2(e);
        inverse[i] = special ? 1.0f : pow2(-e);
    }
    for (int64_t i = 0; i < n; i++) { /* the rare amaxes that are not normal floats */
        float a = amax[i];
        uint32_t biased = (bits_of(a) >> 23) & 0xFFu;
        if (biased != 0u && biased != 0xFFu) continue;
        if (a != a) { scale[i] = NAN; inverse[i] = NAN; continue; }
        if (a == 0.0f) continue;
        int exp = 0;
        float mant = isinf(a) ? a : frexpf(a, &exp); /* torch.frexp(inf) = (inf, 0) */
        int32_t e = floor_rule ? (exp - 1) - floor_log2_max : exp - max_exp + (mant > max_mant);
        e = e < lo ? lo : (e > hi ? hi : e);
        scale[i] = pow2(e);
        inverse[i] = pow2(-e);
    }
}

/* ---- the entry points: each takes one fp8lab_params and checks it first ------------------------------------ */

/* scaling.amax_per_block's twin: p->amax = max |x| per block */
FP8LAB_API int fp8lab_block_amax(fp8lab_params *p) {
    int bad = check(p);
    if (bad) return bad;
    block_amax(p, p->amax);
    return OK;
}

/* scaling.scale_from_amax's twin: p->scale, p->inverse (and p->tensor_scale) from p->given_amax */
FP8LAB_API int fp8lab_scales(fp8lab_params *p) {
    int bad = check(p);
    if (bad) return bad;
    block_scales(p, p->given_amax, p->blocks, p->scale, p->inverse, &p->tensor_scale);
    return OK;
}

/* formats.cast's twin, scaled: p->codes (and p->values) of cast(x * p->inverse[block], element) */
FP8LAB_API int fp8lab_cast(fp8lab_params *p) {
    int bad = check(p);
    if (bad) return bad;
    scale_cast(p, p->inverse, p->blocks, NULL);
    return OK;
}

/* For the monitor (metrics.overflow_fraction / underflow_fraction, same arithmetic):
   counts[0] = elements with double(|x|) / double(scale[block] * tensor scale) > clip_limit (they
   clipped; none in a block whose scale is 0), counts[1] = nonzero elements whose code is a zero (they flushed). */
static void clip_flush_counts(fp8lab_params *p) {
    int64_t M = p->M, K = p->K, r = p->r, c = p->c, KB = (K + c - 1) / c, clipped = 0, flushed = 0;
    const float *x = p->x, *s = p->scale;
    const uint8_t *codes = p->codes;
    float ts = p->two_level ? p->tensor_scale : 1.0f;
    double limit = p->clip_limit;
    uint32_t magnitude = (1u << (p->storage.bits - 1)) - 1u;
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(M * K, M) > 1) num_threads(threads_for(M * K, M)) \
    reduction(+ : clipped, flushed)
#endif
    for (int64_t m = 0; m < M; m++) {
        for (int64_t j = 0; j < KB; j++) {
            int64_t k0 = j * c, k1 = k0 + c < K ? k0 + c : K;
            double sd = (double)(s[(m / r) * KB + j] * ts);
            const float *xr = x + m * K;
            const uint8_t *cr = codes + m * K;
            int64_t cl = 0, fl = 0;
            for (int64_t k = k0; k < k1; k++) {
                cl += (sd != 0.0) & (fabs((double)xr[k]) / sd > limit);
                fl += (xr[k] != 0.0f) & ((cr[k] & magnitude) == 0);
            }
            clipped += cl;
            flushed += fl;
        }
    }
    p->counts[0] = clipped;
    p->counts[1] = flushed;
}

/* quantize() in one call: x's own block amaxes (p->amax), scales from them or from p->given_amax,
   the scale-and-cast (values folded with the scales if p->fold; rounded stochastically with p->draws),
   the smallest and largest scale (both NaN if one is, as torch.aminmax), and the clipped and flushed
   counts if p->count. Returns INFINITE_AMAX, having written only the amaxes, if x holds an infinity
   (the caller raises); else NAN_AMAX where a block of x holds a NaN (its own amax is NaN: the caller
   looks for an infinity it may hide), else OK (or a negative code, having written nothing, for an
   inconsistent block). */
FP8LAB_API int fp8lab_quantize(fp8lab_params *p) {
    int bad = check(p);
    if (bad) return bad;
    int64_t n = p->blocks;
    block_amax(p, p->amax);
    const uint32_t *amax_bits = (const uint32_t *)p->amax;
    uint32_t inf = 0u, nan_amax = 0u; /* amaxes are >= 0 or NaN: an infinite one has the bits of +inf */
    for (int64_t i = 0; i < n; i++) {
        inf |= amax_bits[i] == 0x7F800000u;
        nan_amax |= amax_bits[i] > 0x7F800000u;
    }
    if (inf) return INFINITE_AMAX;
    block_scales(p, p->given_amax ? p->given_amax : p->amax, n, p->scale, p->inverse, &p->tensor_scale);
    scale_cast(p, p->inverse, n, p->fold ? p->scale : NULL);
    /* scales are positive or NaN: they order as their bits, and NaN's bits exceed every
       number's, so integer min and max (which vectorize) find them */
    const uint32_t *scale_bits = (const uint32_t *)p->scale;
    uint32_t smallest = 0xFFFFFFFFu, largest = 0u;
    for (int64_t i = 0; i < n; i++) {
        smallest = scale_bits[i] < smallest ? scale_bits[i] : smallest;
        largest = scale_bits[i] > largest ? scale_bits[i] : largest;
    }
    int nan = largest > 0x7F800000u;
    p->scale_range[0] = nan ? NAN : float_of(smallest);
    p->scale_range[1] = nan ? NAN : float_of(largest);
    if (p->count) clip_flush_counts(p);
    return nan_amax ? NAN_AMAX : OK;
}

/* ---- the random Hadamard transform (hadamard.RandomHadamard.apply's twin) ---------------------------------- */

/* one block v[d] in place: log2(d) stages of (sum, difference) pairs, in Sylvester's order */
static inline __attribute__((always_inline)) void butterfly(float *v, int64_t d) {
    for (int64_t h = 1; h < d; h *= 2) {
        for (int64_t g = 0; g < d; g += 2 * h) {
            for (int64_t i = g; i < g + h; i++) {
                float lo = v[i], hi = v[i + h];
                v[i] = lo + hi;
                v[i + h] = lo - hi;
            }
        }
    }
}

/* out[R, Cp] (Cp = ceil(C / d) * d): each row of x[R, C] zero-padded to Cp, in blocks of d: times signs[d],
   butterflied (log2(d) stages; stage h turns each pair (v[i], v[i + h]) of a group of 2h into (sum,
   difference), Sylvester's order), times norm (1 / sqrt(d), a power of two). The torch code's float32
   operations, one by one, in its order: the same bits. */
#define HADAMARD_TILE 16  /* rows transformed together, element k of each side by side (one vector a butterfly step) */
static void hadamard_tiles(const float *x, int64_t R, int64_t C, int64_t row_stride, int64_t col_stride,
                           const float *signs, int64_t d, float norm, float *out);

static void hadamard_rows(const float *x, int64_t R, int64_t C, int64_t row_stride, int64_t col_stride,
                          const float *signs, int64_t d, float norm, float *out) {
    int64_t Cp = (C + d - 1) / d * d;
    if (d <= 64) {  /* (NVFP4's 16: a tile of rows at once) */
        hadamard_tiles(x, R, C, row_stride, col_stride, signs, d, norm, out);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(R * Cp, R) > 1) num_threads(threads_for(R * Cp, R))
#endif
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * row_stride;
        for (int64_t b = 0; b < Cp; b += d) {
            float *v = out + r * Cp + b;
            for (int64_t k = 0; k < d; k++) v[k] = (b + k < C ? xr[(b + k) * col_stride] : 0.0f) * signs[k];
            /* sizes 16 (NVFP4's) and 64 as constants: their stages unroll (the same operations in the same order) */
            if (d == 16) butterfly(v, 16);
            else if (d == 64) butterfly(v, 64);
            else butterfly(v, d);
            for (int64_t k = 0; k < d; k++) v[k] = v[k] * norm;
        }
    }
}

/* butterfly() for HADAMARD_TILE rows at once: v[k][i] is element k of row i, so each (sum, difference) of a stage
   runs over the tile's rows in one vector; every row goes through butterfly()'s operations in its order. */
static inline __attribute__((always_inline)) void butterfly_tile(float (*v)[HADAMARD_TILE], int64_t d) {
    for (int64_t h = 1; h < d; h *= 2) {
        for (int64_t g = 0; g < d; g += 2 * h) {
            for (int64_t k = g; k < g + h; k++) {
                for (int64_t i = 0; i < HADAMARD_TILE; i++) {
                    float lo = v[k][i], hi = v[k + h][i];
                    v[k][i] = lo + hi;
                    v[k + h][i] = lo - hi;
                }
            }
        }
    }
}

/* hadamard_rows for blocks of at most 64 (NVFP4's 16): HADAMARD_TILE rows at a time, element k of every row of the
   tile side by side (x^T, a view of x, reads each element's tile rows from one stretch of memory instead of one
   cache line per row). Each row's values go through the same float32 operations in the same order: the same bits.
   A last tile's missing rows are zeros, computed and never written. */
static void hadamard_tiles(const float *x, int64_t R, int64_t C, int64_t row_stride, int64_t col_stride,
                           const float *signs, int64_t d, float norm, float *out) {
    int64_t Cp = (C + d - 1) / d * d, tiles = (R + HADAMARD_TILE - 1) / HADAMARD_TILE;
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(R * Cp, tiles) > 1) num_threads(threads_for(R * Cp, tiles))
#endif
    for (int64_t t = 0; t < tiles; t++) {
        int64_t r0 = t * HADAMARD_TILE, rows = R - r0 < HADAMARD_TILE ? R - r0 : HADAMARD_TILE;
        float v[64][HADAMARD_TILE];
        for (int64_t b = 0; b < Cp; b += d) {
            for (int64_t k = 0; k < d; k++) {
                const float *column = x + r0 * row_stride + (b + k) * col_stride;
                if (row_stride == 1 && rows == HADAMARD_TILE && b + k < C) {  /* (x^T's tile: one stretch of x) */
                    for (int64_t i = 0; i < HADAMARD_TILE; i++) v[k][i] = column[i] * signs[k];
                } else {
                    for (int64_t i = 0; i < HADAMARD_TILE; i++)
                        v[k][i] = (i < rows && b + k < C ? column[i * row_stride] : 0.0f) * signs[k];
                }
            }
            if (d == 16) butterfly_tile(v, 16);
            else if (d == 64) butterfly_tile(v, 64);
            else butterfly_tile(v, d);
            for (int64_t i = 0; i < rows; i++) {
                float *o = out + (r0 + i) * Cp + b;
                for (int64_t k = 0; k < d; k++) o[k] = v[k][i] * norm;
            }
        }
    }
}

/* x[R, C] read with its strides (a transposed view as it lies) */
FP8LAB_API int fp8lab_hadamard(const float *x, int64_t R, int64_t C, int64_t row_stride, int64_t col_stride,
                               const float *signs, int64_t d, float norm, float *out) {
    if (x == NULL || signs == NULL || out == NULL || R < 0 || C < 0 || d < 1 || d > 4096 || (d & (d - 1)) ||
        row_stride < 0 || col_stride < 0)
        return BAD_SHAPE;
    hadamard_rows(x, R, C, row_stride, col_stride, signs, d, norm, out);
    return OK;
}

/* The emulated GEMM's definition (gemm/emulation.py's loop over K segments) where every partial sum is exact
   (E2M1 operands: each partial sum a multiple of 1/4 far below 2^24 / 4, whatever the order of its additions):
     out[m, n] = sum over the segments s, in order from out = +0, of part(m, n, s) * (sa[s, m] * sb[s, n])
     part(m, n, s) = sum over k in s of a[m, k] * bt[k, n]           (s: seg columns of K, the last one shorter)
   the factor, then the product, then the sum each rounded to float32 on their own, as the loop's scale_outer_
   forms them. a[M, K] with its strides (a transposed view read as it lies): float32 values, or one-byte codes
   with a_table their format's 256 values (read as it goes: no float32 copy); bt[NP / COLS, K, COLS]: b in panels
   of COLS columns, each transposed (the partial sums run along n in vectors), NP = N rounded up to COLS with zero
   columns; sa[S, M], sb[S, NP] each segment's scales, S = ceil(K / seg); out[M, N]. Each tile of ROWS x COLS
   outputs is summed in registers, its rows sharing each row of bt. A tile's segment whose factors are all zero
   adds nothing: skipped (the same bits, the partial sums being finite). */
#define SEGMENT_ROWS 6
#define SEGMENT_COLS 64
/* a * b + c where every result is exact (the partial sums below): fused or not, the same number */
#ifdef __FMA__
#define EXACT_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define EXACT_MADD(a, b, c) ((c) + (a) * (b))
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#define WIDE_VECTORS __attribute__((target("prefer-vector-width=512")))  /* GCC keeps to 256 bits unless asked */
#else
#define WIDE_VECTORS
#endif
/* whether every factor x[i] * y[j] is 0 or -0: all of x zero, all of y finite (a block of zero scales, as NVFP4's
   tensor scale leaves the ordinary blocks beside a sink far above them) */
static int zero_factors(const float *x, int64_t nx, const float *y, int64_t ny) {
    for (int64_t i = 0; i < nx; i++)
        if (x[i] != 0.0f) return 0;
    for (int64_t j = 0; j < ny; j++)
        if (!isfinite(y[j])) return 0;
    return 1;
}

/* a[m, k]'s value: a float32 a's own, or a one-byte code's from its format's table of 256 values (formats.widen's) */
static inline __attribute__((always_inline)) float a_value(const void *a, const float *table, int64_t i) {
    return table ? table[((const uint8_t *)a)[i]] : ((const float *)a)[i];
}

FP8LAB_API WIDE_VECTORS int fp8lab_segment_mm(const void *a, const float *a_table, int64_t row_stride,
                                              int64_t col_stride, const float *bt, int64_t M, int64_t N, int64_t K,
                                              int64_t seg, const float *sa, const float *sb, float *out) {
    if (a == NULL || bt == NULL || sa == NULL || sb == NULL || out == NULL || M < 0 || N < 0 || K < 1 || seg < 1 ||
        row_stride < 0 || col_stride < 0)
        return BAD_SHAPE;
    int64_t S = (K + seg - 1) / seg, NP = (N + SEGMENT_COLS - 1) / SEGMENT_COLS * SEGMENT_COLS;
    int64_t row_tiles = (M + SEGMENT_ROWS - 1) / SEGMENT_ROWS, tiles = row_tiles * (NP / SEGMENT_COLS);
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(M * N * S, tiles) > 1) num_threads(threads_for(M * N * S, tiles))
#endif
    for (int64_t tile = 0; tile < tiles; tile++) {
        /* the tiles of one panel of columns one after another: its K x COLS values of b stay in the cache */
        int64_t m0 = tile % row_tiles * SEGMENT_ROWS, n0 = tile / row_tiles * SEGMENT_COLS;
        int64_t rows = M - m0 < SEGMENT_ROWS ? M - m0 : SEGMENT_ROWS;
        int64_t cols = N - n0 < SEGMENT_COLS ? N - n0 : SEGMENT_COLS;
        const float *panel = bt + n0 * K;
        int64_t row[SEGMENT_ROWS], arow[SEGMENT_ROWS]; /* the last tile's missing rows repeat its last row */
        for (int r = 0; r < SEGMENT_ROWS; r++) {
            row[r] = m0 + (r < rows ? r : rows - 1);
            arow[r] = row[r] * row_stride;
        }
        float sum[SEGMENT_ROWS][SEGMENT_COLS] = {{0.0f}};
        for (int64_t s = 0; s < S; s++) {
            const float *as = sa + s * M, *bs = sb + s * NP + n0;
            if (zero_factors(as + m0, rows, bs, SEGMENT_COLS) || zero_factors(bs, SEGMENT_COLS, as + m0, rows))
                continue; /* every product 0 or -0, and sum + 0 or -0 is sum (which is never -0) */
            float part[SEGMENT_ROWS][SEGMENT_COLS] = {{0.0f}};
            int64_t k1 = (s + 1) * seg < K ? (s + 1) * seg : K;
            for (int64_t k = s * seg; k < k1; k++) {
                const float *brow = panel + k * SEGMENT_COLS;
                for (int r = 0; r < SEGMENT_ROWS; r++) {
                    float av = a_value(a, a_table, arow[r] + k * col_stride);
                    for (int n = 0; n < SEGMENT_COLS; n++) part[r][n] = EXACT_MADD(av, brow[n], part[r][n]);
                }
            }
            for (int r = 0; r < SEGMENT_ROWS; r++) {
                float am = as[row[r]];
                for (int n = 0; n < SEGMENT_COLS; n++) {
                    float factor = am * bs[n];
                    float product = part[r][n] * factor;
                    sum[r][n] = sum[r][n] + product;
                }
            }
        }
        for (int64_t r = 0; r < rows; r++)
            for (int64_t n = 0; n < cols; n++) out[(m0 + r) * N + n0 + n] = sum[r][n];
    }
    return OK;
}

/* out[m, n] += row[n]: a bias added to each row of an [M, N] output (torch's out.add_(row)) */
FP8LAB_API void fp8lab_add_row(float *out, int64_t M, int64_t N, const float *row) {
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(M * N, M) > 1) num_threads(threads_for(M * N, M))
#endif
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) out[m * N + n] = out[m * N + n] + row[n];
}

/* out[i] = table[codes[i]]: one-byte codes to float32 by a table of their 256 values (formats.widen's) */
FP8LAB_API void fp8lab_widen(const uint8_t *codes, int64_t n, const float *table, float *out) {
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(n, n) > 1) num_threads(threads_for(n, n))
#endif
    for (int64_t i = 0; i < n; i++) out[i] = table[codes[i]];
}

/* The per-row scales of both GEMM operands, a[m] * b[n], applied to an [M, N] output without the factor
   matrix (the factor rounded to float32 first, as torch forms outer(a, b)):
     part NULL:  out[m, n] *= a[m] * b[n]                    (the output's scales, torch's out *= outer(a, b))
     part given: out[m, n] += part[m, n] * (a[m] * b[n])     (one K segment of the emulated GEMM's definition,
                 gemm/emulation.py: the factor, then the product, then the sum, each rounded on its own)
   a_step 1: a scale per row; 0: a[0] for every row; a NULL: none, read as 1 (1 * b[n] is b[n], bit for bit,
   NaN and infinity included); b likewise. */
FP8LAB_API void fp8lab_scale_outer(float *out, const float *part, int64_t M, int64_t N, const float *a,
                                   int64_t a_step, const float *b, int64_t b_step) {
    static const float one = 1.0f;
    if (a == NULL) a = &one, a_step = 0;
    if (b == NULL) b = &one, b_step = 0;
#ifdef _OPENMP
#pragma omp parallel for if (threads_for(M * N, M) > 1) num_threads(threads_for(M * N, M))
#endif
    for (int64_t m = 0; m < M; m++) {
        float *row = out + m * N;
        const float *prow = part ? part + m * N : NULL;
        if (b_step != 0) { /* a factor per column */
            float am = a[m * a_step];
            if (prow) {
                for (int64_t n = 0; n < N; n++) {
                    float factor = am * b[n];
                    float product = prow[n] * factor;
                    row[n] = row[n] + product;
                }
            } else {
                for (int64_t n = 0; n < N; n++) {
                    float factor = am * b[n];
                    row[n] = row[n] * factor;
                }
            }
        } else { /* one factor for the row */
            float factor = a[m * a_step] * b[0];
            if (prow) {
                for (int64_t n = 0; n < N; n++) { float product = prow[n] * factor; row[n] = row[n] + product; }
            } else {
                for (int64_t n = 0; n < N; n++) row[n] = row[n] * factor;
            }
        }
    }
}

/* ---- torch.rand's float32 draws from torch's CPU generator (formats.uniform_draws' twin) ---------------------
   The generator is at::mt19937 (aten/src/ATen/core/MT19937RNGEngine.h): 624 32-bit words, refilled all at once
   (the twist) when `left` counts down to 0, each output a word tempered; torch.rand's float32 is its low 24 bits
   times 2^-24 (at::uniform_real_distribution<float>). `state` holds torch.Generator.get_state()'s bytes, which
   lay the engine out as left (int32 at byte 8), next (uint64 at 16) and the words (each a uint64, at 24); the
   draws advance it in place as torch.rand would. fp8lab.numerics.kernels checks once that its draws are
   torch.rand's before it uses them. */
#define MT_N 624
#define MT_M 397
#define MT_STATE_BYTES 5056

/* the new word i from the old words i and i + 1 and the word M places on (new where it lies below i) */
static inline uint32_t mt_mix(uint32_t word, uint32_t next, uint32_t ahead) {
    uint32_t y = (word & 0x80000000u) | (next & 0x7FFFFFFFu);
    return ahead ^ (y >> 1) ^ ((0u - (next & 1u)) & 0x9908B0DFu);
}

static void mt_twist(uint32_t *s) { /* in place, in order, in three runs (each vectorizes) */
    int i = 0;
    for (; i < MT_N - MT_M; i++) s[i] = mt_mix(s[i], s[i + 1], s[i + MT_M]);
    for (; i < MT_N - 1; i++) s[i] = mt_mix(s[i], s[i + 1], s[i + MT_M - MT_N]);
    s[MT_N - 1] = mt_mix(s[MT_N - 1], s[0], s[MT_M - 1]);
}

static inline float mt_draw(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9D2C5680u;
    y ^= (y << 15) & 0xEFC60000u;
    y ^= y >> 18;
    return (float)(y & 0xFFFFFFu) * 0x1p-24f;
}

FP8LAB_API int fp8lab_uniform(uint8_t *state, int64_t bytes, int64_t n, float *out) {
    int32_t left;
    uint64_t next;
    uint32_t s[MT_N];
    if (state == NULL || bytes != MT_STATE_BYTES || n < 0 || (n > 0 && out == NULL)) return BAD_SHAPE;
    memcpy(&left, state + 8, 4);
    memcpy(&next, state + 16, 8);
    if (left < 1 || next > MT_N || next + (uint64_t)left > MT_N + 1) return BAD_SHAPE; /* reads stay in the words */
    for (int i = 0; i < MT_N; i++) {
        uint64_t word;
        memcpy(&word, state + 24 + 8 * i, 8);
        s[i] = (uint32_t)word;
    }
    for (int64_t i = 0; i < n;) {
        if (left == 1) { /* the next read counts left down to 0: the words are refilled first */
            mt_twist(s);
            left = MT_N + 1;
            next = 0;
        }
        int64_t run = (int64_t)left - 1 < n - i ? (int64_t)left - 1 : n - i;
        for (int64_t j = 0; j < run; j++) out[i + j] = mt_draw(s[next + j]);
        i += run, next += (uint64_t)run, left -= (int32_t)run;
    }
    memcpy(state + 8, &left, 4);
    memcpy(state + 16, &next, 8);
    for (int i = 0; i < MT_N; i++) {
        uint64_t word = s[i];
        memcpy(state + 24 + 8 * i, &word, 8);
    }
    return OK;
}

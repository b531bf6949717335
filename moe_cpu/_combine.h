/* The combine of moe_unpermute for one token, and the exact float conversions it needs.
 *
 * Rounding is part of the contract (docs/contract.rst, "Precision and determinism"), so this
 * file is built with -ffp-contract=off: the only fused multiply-add is the explicit fmaf of the
 * weighted combine.
 * Type punning goes through memcpy (a pointer cast breaks strict aliasing at -O3).
 * The float16 conversions are integer bit operations (plus one exact subtraction for
 * subnormals), written as selects and masks so that the loops vectorise.
 */
#ifndef MOE_COMBINE_H
#define MOE_COMBINE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Data-type codes; must equal DATA_* of _common.pxd (checked at import by _unpermute). */
#define MOE_DATA_FLOAT32 0
#define MOE_DATA_BFLOAT16 1
#define MOE_DATA_FLOAT16 2

/* H is combined in blocks of this many elements: the float32 accumulator of a block stays in
   registers/L1 while the token's rows stream through it. Short blocks switch between the rows
   often, which keeps more of them in flight (measured: docs/design-notes.rst). */
#ifndef MOE_COMBINE_BLOCK
#define MOE_COMBINE_BLOCK 128
#endif

/* Each block of the combine first prefetches the block MOE_PREFETCH_AHEAD blocks further on
   in each of the token's rows, or, past their end, the start of the next token's rows: a
   token's rows lie anywhere in the buffer, and a row of a few kilobytes is over before the
   hardware prefetcher has followed it far (measured: docs/design-notes.rst). */
#ifndef MOE_PREFETCH_AHEAD
#define MOE_PREFETCH_AHEAD 4
#endif
#if defined(__GNUC__) || defined(__clang__)
#define MOE_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define MOE_PREFETCH(p) ((void)(p))
#endif

/* The combine is compiled twice on x86-64 with GCC >= 12 and glibc (ifunc): once for
   x86-64-v3 (AVX2 + FMA: vectorised, fmaf becomes vfmadd) and once for the baseline, picked
   at load time. Other compilers and architectures get the baseline version only. */
#ifndef MOE_CLONES /* -DMOE_CLONES= builds the baseline version only (to test it) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 \
    && defined(__GLIBC__)
#define MOE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MOE_CLONES
#endif
#endif

#if defined(__GNUC__)
#define MOE_INLINE static inline __attribute__((always_inline))
#else
#define MOE_INLINE static inline
#endif

MOE_INLINE float moe_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
MOE_INLINE uint32_t moe_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

MOE_INLINE float moe_bf16_to_f32(uint16_t h) { return moe_bits_to_f32((uint32_t)h << 16); }

/* Round to nearest even; every NaN becomes the canonical quiet NaN. */
MOE_INLINE uint16_t moe_f32_to_bf16(float f) {
    uint32_t u = moe_f32_to_bits(f);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    /* signed compares below: AVX2 has no unsigned one, and |bits| < 2^31 */
    int32_t a = (int32_t)(u & 0x7FFFFFFFu);
    return (uint16_t)(a > 0x7F800000 ? 0x7FC0u : rounded);
}

MOE_INLINE float moe_f16_to_f32(uint16_t h) {
    uint32_t x = h;
    uint32_t sign = (x & 0x8000u) << 16;
    uint32_t em = x & 0x7FFFu; /* exponent and mantissa */
    uint32_t normal = (em << 13) + ((127u - 15u) << 23);
    uint32_t special = (em << 13) | 0x7F800000u; /* inf, and NaN with its payload */
    /* zero and subnormals, m * 2^-24 = (2^-14 + m * 2^-24) - 2^-14: the one float operation
       here, exact (no rounding; every value involved is a normal float32, so FTZ/DAZ do not
       matter either), and cheaper than normalising m with integer shifts. It runs on every
       lane and is merged with masks: a float operation under a condition would stop the
       vectoriser (-ftrapping-math). */
    uint32_t subnormal = moe_f32_to_bits(moe_bits_to_f32((113u << 23) | ((em & 0x3FFu) << 13))
                                         - 0x1p-14f);
    uint32_t is_subnormal = 0u - (uint32_t)(em < 0x400u);
    uint32_t other = em >= 0x7C00u ? special : normal;
    return moe_bits_to_f32(sign | (subnormal & is_subnormal) | (other & ~is_subnormal));
}

/* IEEE binary16, round to nearest even (subnormals, overflow to inf). A NaN stays a NaN of
   its sign and part of its payload: not a constant, which would let the compiler fold the
   widening of the round trip on one side of the select and branch (no vectorising). */
MOE_INLINE uint16_t moe_f32_to_f16_keep_nan(float f) {
    uint32_t u = moe_f32_to_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t a = (int32_t)(u & 0x7FFFFFFFu);
    uint32_t ua = (uint32_t)a;
    /* normal: rebias the exponent (127 -> 15) and round off 13 bits to nearest even (add half
       an ulp less one, plus the lowest kept bit); a carry out of the mantissa correctly bumps
       the exponent */
    uint32_t normal = (ua - (112u << 23) + 0xFFFu + ((ua >> 13) & 1u)) >> 13;
    /* subnormal: the value in units of 2^-24 is m >> s, rounded the same way; s is clamped to
       [1, 25] (25 already gives 0; lanes outside the subnormal range are discarded) */
    uint32_t e = ua >> 23;
    uint32_t s = e >= 125u ? 1u : 126u - e;
    s = s > 25u ? 25u : s;
    uint32_t m = (ua & 0x7FFFFFu) | 0x800000u;
    uint32_t subnormal = (m + (1u << (s - 1u)) - 1u + ((m >> s) & 1u)) >> s;
    /* 0x477FF000 = 65520, the midpoint between the largest float16 and 2^16: ties go to inf */
    uint32_t mag = a >= 0x477FF000 ? 0x7C00u : (a >= 0x38800000 ? normal : subnormal);
    uint32_t nan = 0x7E00u | ((ua >> 13) & 0x3FFu);
    return (uint16_t)(sign | (a > 0x7F800000 ? nan : mag));
}

/* As above, with every NaN made canonical. */
MOE_INLINE uint16_t moe_f32_to_f16(float f) {
    int32_t a = (int32_t)(moe_f32_to_bits(f) & 0x7FFFFFFFu);
    return a > 0x7F800000 ? (uint16_t)0x7E00u : moe_f32_to_f16_keep_nan(f);
}

MOE_INLINE float moe_load(const void *row, int64_t i, int dtype) {
    if (dtype == MOE_DATA_FLOAT32) return ((const float *)row)[i];
    if (dtype == MOE_DATA_BFLOAT16) return moe_bf16_to_f32(((const uint16_t *)row)[i]);
    return moe_f16_to_f32(((const uint16_t *)row)[i]);
}

/* Round to the data type and widen back (the accumulator of using_mix_precision=False). */
MOE_INLINE float moe_round_trip(float v, int dtype) {
    if (dtype == MOE_DATA_BFLOAT16) return moe_bf16_to_f32(moe_f32_to_bf16(v));
    if (dtype == MOE_DATA_FLOAT16) return moe_f16_to_f32(moe_f32_to_f16_keep_nan(v));
    return v; /* float32: already exact (a NaN is made canonical at the end) */
}

MOE_INLINE void moe_store(void *out, int64_t i, float v, int dtype) {
    if (dtype == MOE_DATA_FLOAT32) {
        uint32_t u = moe_f32_to_bits(v);
        ((uint32_t *)out)[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : u;
    } else if (dtype == MOE_DATA_BFLOAT16) {
        ((uint16_t *)out)[i] = moe_f32_to_bf16(v);
    } else {
        ((uint16_t *)out)[i] = moe_f32_to_f16(v);
    }
}

MOE_INLINE float moe_accumulate(float acc, float x, float p, int weighted, int rounded,
                                int dtype) {
    float v = weighted ? fmaf(x, p, acc) : acc + x;
    return rounded ? moe_round_trip(v, dtype) : v;
}

/* Prefetch elements [h, h + MOE_COMBINE_BLOCK) of rows[rows_of[j]] for j < n, no further
   than the row's end (nothing outside the caller's arrays is touched). */
MOE_INLINE void moe_prefetch_block(const char *rows, int64_t H, int64_t size,
                                   const int64_t *rows_of, int64_t n, int64_t h) {
    int64_t m = (H - h < MOE_COMBINE_BLOCK ? H - h : MOE_COMBINE_BLOCK) * size;
    for (int64_t j = 0; j < n; j++) {
        const char *z = rows + (rows_of[j] * H + h) * size;
        for (int64_t b = 0; b < m; b += 64) MOE_PREFETCH(z + b);
    }
}

/* out[h] = the combine of rows[src_rows[j], h] for j < nsrc, in that order, for h < H; the
   next token's rows, next_rows[j] for j < nnext, are prefetched towards the end. acc is
   scratch for MOE_COMBINE_BLOCK floats. dtype, weighted and rounded are constants after
   inlining, so each variant gets its own vectorised loops. */
MOE_INLINE void moe_combine_token_impl(int dtype, int weighted, int rounded,
                                       const char *rows, int64_t H, const int64_t *src_rows,
                                       const float *src_probs, int64_t nsrc,
                                       const int64_t *next_rows, int64_t nnext,
                                       float *restrict acc, char *out) {
    int64_t size = dtype == MOE_DATA_FLOAT32 ? 4 : 2;
    int64_t blocks = (H + MOE_COMBINE_BLOCK - 1) / MOE_COMBINE_BLOCK;
    for (int64_t h0 = 0; h0 < H; h0 += MOE_COMBINE_BLOCK) {
        int64_t n = H - h0 < MOE_COMBINE_BLOCK ? H - h0 : MOE_COMBINE_BLOCK;
        int64_t ahead = h0 / MOE_COMBINE_BLOCK + MOE_PREFETCH_AHEAD; /* a block index */
        if (ahead < blocks)
            moe_prefetch_block(rows, H, size, src_rows, nsrc, ahead * MOE_COMBINE_BLOCK);
        else if (ahead - blocks < blocks)
            moe_prefetch_block(rows, H, size, next_rows, nnext,
                               (ahead - blocks) * MOE_COMBINE_BLOCK);
        if (nsrc == 0) {
            for (int64_t i = 0; i < n; i++) acc[i] = 0.0f;
        }
        for (int64_t j = 0; j < nsrc; j++) {
            const char *restrict x = rows + (src_rows[j] * H + h0) * size;
            float p = src_probs[j];
            if (j == 0) {
                for (int64_t i = 0; i < n; i++)
                    acc[i] = moe_accumulate(0.0f, moe_load(x, i, dtype), p, weighted, rounded,
                                            dtype);
            } else {
                for (int64_t i = 0; i < n; i++)
                    acc[i] = moe_accumulate(acc[i], moe_load(x, i, dtype), p, weighted,
                                            rounded, dtype);
            }
        }
        char *restrict y = out + h0 * size;
        for (int64_t i = 0; i < n; i++) moe_store(y, i, acc[i], dtype);
    }
}

MOE_CLONES static void moe_combine_token(int dtype, int weighted, int mix_precision,
                                         const void *rows, int64_t H, const int64_t *src_rows,
                                         const float *src_probs, int64_t nsrc,
                                         const int64_t *next_rows, int64_t nnext, float *acc,
                                         void *out) {
    const char *r = (const char *)rows;
    char *o = (char *)out;
#define MOE_VARIANT(D, W, M) \
    moe_combine_token_impl(D, W, M, r, H, src_rows, src_probs, nsrc, next_rows, nnext, acc, o)
    int rounded = !mix_precision;
    if (dtype == MOE_DATA_FLOAT32) {
        if (weighted) MOE_VARIANT(MOE_DATA_FLOAT32, 1, 0);
        else MOE_VARIANT(MOE_DATA_FLOAT32, 0, 0);
    } else if (dtype == MOE_DATA_BFLOAT16) {
        if (weighted) {
            if (rounded) MOE_VARIANT(MOE_DATA_BFLOAT16, 1, 1);
            else MOE_VARIANT(MOE_DATA_BFLOAT16, 1, 0);
        } else {
            if (rounded) MOE_VARIANT(MOE_DATA_BFLOAT16, 0, 1);
            else MOE_VARIANT(MOE_DATA_BFLOAT16, 0, 0);
        }
    } else {
        if (weighted) {
            if (rounded) MOE_VARIANT(MOE_DATA_FLOAT16, 1, 1);
            else MOE_VARIANT(MOE_DATA_FLOAT16, 1, 0);
        } else {
            if (rounded) MOE_VARIANT(MOE_DATA_FLOAT16, 0, 1);
            else MOE_VARIANT(MOE_DATA_FLOAT16, 0, 0);
        }
    }
#undef MOE_VARIANT
}

/* Element-wise conversions, for the exhaustive tests of the functions above (vectorised like
   the combine, so that the tests check the code that runs there). */
MOE_CLONES static void moe_widen_array(int dtype, const uint16_t *src, float *dst, int64_t n) {
    if (dtype == MOE_DATA_BFLOAT16) {
        for (int64_t i = 0; i < n; i++) dst[i] = moe_bf16_to_f32(src[i]);
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = moe_f16_to_f32(src[i]);
    }
}

MOE_CLONES static void moe_narrow_array(int dtype, const float *src, uint16_t *dst, int64_t n) {
    if (dtype == MOE_DATA_BFLOAT16) {
        for (int64_t i = 0; i < n; i++) dst[i] = moe_f32_to_bf16(src[i]);
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = moe_f32_to_f16(src[i]);
    }
}

#endif /* MOE_COMBINE_H */

/* The row arithmetic of the two gradient ops (docs/gradients.rst), on top of _combine.h's
 * conversions (bfloat16/float16 <-> float32, round to nearest even, canonical NaN).
 *
 * Like _combine.h this file is built with -ffp-contract=off: the dot product's explicit fmaf
 * calls are its only fused multiply-adds, and the weighted row gradient is one float32
 * product, rounded once.
 */
#ifndef MOE_BACKWARD_H
#define MOE_BACKWARD_H

#include "_combine.h"

/* The dot product follows a warp of MOE_WARP lanes reading 16-byte words: element h belongs
   to lane (h / V) % MOE_WARP, V = 16 / sizeof(element). */
#define MOE_WARP 32

/* The float32 dot product of x[0:H] and y[0:H] in the order of docs/gradients.rst: each lane
   starts at +0.0 and takes acc = fmaf(x[h], y[h], acc) over its elements in ascending h; then
   the butterfly acc[l] = acc[l] + acc[l ^ off] for off = 16, 8, 4, 2, 1. Only lane 0's value
   is needed, and addition commutes, so the butterfly is computed as the halving tree
   lane[l] = lane[l] + lane[l + off], l < off (the same operands in the same order). */
MOE_INLINE float moe_warp_dot_impl(int dtype, const char *x, const char *y, int64_t H) {
    const int64_t V = dtype == MOE_DATA_FLOAT32 ? 4 : 8;
    const int64_t round = MOE_WARP * V; /* elements the lanes take in one pass */
    const int64_t full = H / round * round;
    float lane[MOE_WARP];
    for (int l = 0; l < MOE_WARP; l++) lane[l] = 0.0f;
    if (dtype == MOE_DATA_BFLOAT16) {
        /* lane by lane, each lane's word in ascending h: the lanes are independent, so the
           vectoriser takes several at once (their words form an interleaved group) */
        for (int64_t h0 = 0; h0 < full; h0 += round) {
            for (int l = 0; l < MOE_WARP; l++) {
                float acc = lane[l];
                for (int64_t i = 0; i < V; i++) {
                    int64_t h = h0 + l * V + i;
                    acc = fmaf(moe_load(x, h, dtype), moe_load(y, h, dtype), acc);
                }
                lane[l] = acc;
            }
        }
    } else {
        /* a pass widened into [element of the word][lane] arrays first, then one fmaf per
           lane and element, the lanes innermost: faster for float16 (the widening is the
           costly part) and float32, slower for bfloat16 (measured: docs/design-notes.rst) */
        float xt[8][MOE_WARP], yt[8][MOE_WARP];
        for (int64_t h0 = 0; h0 < full; h0 += round) {
            for (int l = 0; l < MOE_WARP; l++) {
                for (int64_t i = 0; i < V; i++) {
                    xt[i][l] = moe_load(x, h0 + l * V + i, dtype);
                    yt[i][l] = moe_load(y, h0 + l * V + i, dtype);
                }
            }
            for (int64_t i = 0; i < V; i++) {
                for (int l = 0; l < MOE_WARP; l++) lane[l] = fmaf(xt[i][l], yt[i][l], lane[l]);
            }
        }
    }
    for (int l = 0; l < MOE_WARP; l++) { /* the last, partial pass */
        for (int64_t h = full + l * V; h < H && h < full + (l + 1) * V; h++)
            lane[l] = fmaf(moe_load(x, h, dtype), moe_load(y, h, dtype), lane[l]);
    }
    for (int off = MOE_WARP / 2; off >= 1; off /= 2) {
        for (int l = 0; l < off; l++) lane[l] = lane[l] + lane[l + off];
    }
    return lane[0];
}

/* out[h] = rnd(x[h] * p) for h < H: one float32 product rounded once to the data type, NaN
   canonical. */
MOE_INLINE void moe_scale_row_impl(int dtype, const char *x, float p, char *out, int64_t H) {
    for (int64_t h = 0; h < H; h++) moe_store(out, h, moe_load(x, h, dtype) * p, dtype);
}

MOE_CLONES static float moe_warp_dot(int dtype, const void *x, const void *y, int64_t H) {
    const char *a = (const char *)x;
    const char *b = (const char *)y;
    if (dtype == MOE_DATA_FLOAT32) return moe_warp_dot_impl(MOE_DATA_FLOAT32, a, b, H);
    if (dtype == MOE_DATA_BFLOAT16) return moe_warp_dot_impl(MOE_DATA_BFLOAT16, a, b, H);
    return moe_warp_dot_impl(MOE_DATA_FLOAT16, a, b, H);
}

MOE_CLONES static void moe_scale_row(int dtype, const void *x, float p, void *out, int64_t H) {
    const char *a = (const char *)x;
    char *o = (char *)out;
    if (dtype == MOE_DATA_FLOAT32) moe_scale_row_impl(MOE_DATA_FLOAT32, a, p, o, H);
    else if (dtype == MOE_DATA_BFLOAT16) moe_scale_row_impl(MOE_DATA_BFLOAT16, a, p, o, H);
    else moe_scale_row_impl(MOE_DATA_FLOAT16, a, p, o, H);
}

#endif /* MOE_BACKWARD_H */

// Mixture-of-experts routing and the weighted sum of the experts' outputs (src/ops/moe.rs).
// The experts' matvecs are the `_id` kernels of matvec.cuh and matvec_float.cu.
#include "common.cuh"

// The key under which f32 values order as Rust's f32::total_cmp orders them (a NaN of
// positive sign above +inf), compared as signed ints.
__device__ __forceinline__ i32 total_order_key(float v) {
    const i32 bits = __float_as_int(v);
    return bits ^ (i32)(((u32)(bits >> 31)) >> 1);
}

// Routing of token blockIdx.x, as the host's route_tokens (runit-backend src/moe.rs) computes
// it: the softmax of its `experts` logits (the exponentials rounded to f32, summed in f64,
// each scaled by the f32 reciprocal of the sum), the `used` most probable experts (equal
// probabilities: the lower index first) and their probabilities, divided by their f64 sum
// when `renormalise`. Writes ids[t][k] (u32) and weights[t][k] for k < used ordered by expert
// index, the order the host path adds the experts' outputs in.
// Launch: grid.x = tokens, one warp (32 threads) per block, dynamic shared memory of
// experts * 5 bytes (1 <= used <= experts, checked by the host).
extern "C" __global__ void moe_route(const float* __restrict__ logits, u32* __restrict__ ids,
                                     float* __restrict__ weights, u32 experts, u32 used, u32 renormalise) {
    pdl_start();
    extern __shared__ float probs[];
    u8* chosen = (u8*)(probs + experts);
    const u32 t = blockIdx.x;
    const float* row = logits + (u64)t * experts;
    const int lane = threadIdx.x;
    // fmaxf, like the host's f32::max, passes over NaNs.
    float max = __int_as_float((int)0xff800000u);
    for (u32 e = lane; e < experts; e += 32) max = fmaxf(max, row[e]);
    max = warp_max(max);
    // exp in double rounded once to f32: the correctly rounded value, which glibc's expf
    // (the host's) also gives but for rare halfway cases.
    for (u32 e = lane; e < experts; e += 32) {
        probs[e] = (float)exp((double)(row[e] - max));
        chosen[e] = 0;
    }
    __syncwarp();
    // The sum in order, on one lane (as the host adds them).
    float inverse = 0.0f;
    if (lane == 0) {
        double sum = 0.0;
        for (u32 e = 0; e < experts; e++) sum += (double)probs[e];
        inverse = (float)(1.0 / sum);
    }
    inverse = __shfl_sync(0xffffffffu, inverse, 0);
    for (u32 e = lane; e < experts; e += 32) probs[e] = __fmul_rn(probs[e], inverse);
    __syncwarp();
    u32* token_ids = ids + (u64)t * used;
    float* token_weights = weights + (u64)t * used;
    // Each round picks the largest probability not yet chosen, equal ones by the lower index:
    // every lane its best among experts lane, lane + 32, ..., then a butterfly over the warp
    // (which leaves every lane with the same pick). chosen[e] is only touched by lane e % 32.
    // Lane 0 sums the picks in selection order (most probable first), as the host does.
    double total = 0.0;
    for (u32 k = 0; k < used; k++) {
        u32 best = experts;
        i32 best_key = 0;
        for (u32 e = lane; e < experts; e += 32) {
            if (chosen[e]) continue;
            const i32 key = total_order_key(probs[e]);
            if (best == experts || key > best_key) {
                best = e;
                best_key = key;
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            const u32 other = __shfl_xor_sync(0xffffffffu, best, offset);
            const i32 other_key = __shfl_xor_sync(0xffffffffu, best_key, offset);
            if (other != experts &&
                (best == experts || other_key > best_key || (other_key == best_key && other < best))) {
                best = other;
                best_key = other_key;
            }
        }
        if (best % 32 == (u32)lane) chosen[best] = 1;
        if (lane == 0) {
            token_ids[k] = best;
            total += (double)probs[best];
        }
    }
    if (lane != 0) return;
    const float chosen_sum = (float)total;
    for (u32 k = 0; k < used; k++) {
        const float p = probs[token_ids[k]];
        token_weights[k] = renormalise ? __fdiv_rn(p, chosen_sum) : p;
    }
    // Insertion sort of the (id, weight) pairs by id.
    for (u32 k = 1; k < used; k++) {
        const u32 id = token_ids[k];
        const float w = token_weights[k];
        u32 j = k;
        for (; j > 0 && token_ids[j - 1] > id; j--) {
            token_ids[j] = token_ids[j - 1];
            token_weights[j] = token_weights[j - 1];
        }
        token_ids[j] = id;
        token_weights[j] = w;
    }
}

// out[t][c] = sum over k < used of weights[t][k] * src[t * used + k][c], k in order from
// zero, each product rounded before its add: what scatter_add_rows_f32 (rows.cu) leaves in a
// zeroed output after adding the experts one by one in index order.
// Launch: grid.x = tokens, any block size.
extern "C" __global__ void moe_combine(float* __restrict__ out, const float* __restrict__ src,
                                       const float* __restrict__ weights, u32 used, u32 width) {
    pdl_start();
    const u32 t = blockIdx.x;
    const float* w = weights + (u64)t * used;
    const float* rows = src + (u64)t * used * width;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) {
        float sum = 0.0f;
        for (u32 k = 0; k < used; k++) sum = __fadd_rn(sum, __fmul_rn(w[k], rows[(u64)k * width + c]));
        out[(u64)t * width + c] = sum;
    }
}

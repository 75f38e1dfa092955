// Sampling on the device (Backend::sample_pick): each row's token drawn as the host's
// runit_backend::sample::sample_row draws it, so that only token ids cross to the host.
// The host gives each row a header (settings, its uniform draw u) and two short lists,
// (token, count) of the penalty window and (token, bias) in the request's order.
//
//   sample_adjust     one warp per row: biases then penalties, in place, with the host's f32
//                     roundings (no fused multiply-add) and NaNs (as_host); the row's
//                     selection state reset
//   sample_histogram  } up to eight rounds: the k-th largest candidate key found eight bits
//   sample_select     } at a time (radix select), many blocks per row for the counts
//   sample_gather     many blocks per row: the k candidates at or above it
//   sample_draw       one block per row: candidates sorted, then the host's f64 softmax at
//                     temperature 1, top-p, min-p, softmax at the temperature, pick by mass
//
// A candidate's key orders as the host's candidate_order: the logit by f32 total order
// (descending; positive NaNs first, negative NaNs last, -0 below +0), then the lower id, as
// one u64: (ordered logit bits << 32) | ~id. Keys are distinct, so the k largest are exact.
// Greedy rows take the argmax the greedy kernels (pick.cu) compute on the adjusted row,
// with the host's rule that a NaN in the first place is never beaten.
// The only difference from the host: CUDA's f64 exp may differ from the host's by an ulp.
#include "common.cuh"

// Largest k the device selects (the host takes rows with more candidates).
#define SAMPLE_K_MAX 1024
// u32 fields of a row's header (ops/sample.rs writes them).
#define SAMPLE_HEADER 16
#define H_FLAGS 0        // bit 0: greedy; bit 1: penalties apply
#define H_K 1            // candidates kept by top-k (min(top_k, width), or width)
#define H_TEMPERATURE 2  // f32 bits
#define H_TOP_P 3        // f32 bits
#define H_MIN_P 4        // f32 bits
#define H_MIN_P_LOG 5    // f32 bits of (f32)ln(min_p), computed on the host
#define H_REPEAT 6       // f32 bits
#define H_FREQUENCY 7    // f32 bits
#define H_PRESENCE 8     // f32 bits
#define H_PENALIZED 9    // offset of the (token, count) pairs in the packed input
#define H_PENALIZED_LEN 10
#define H_BIAS 11        // offset of the (token, bias bits) pairs
#define H_BIAS_LEN 12
#define H_UNIFORM_LO 13  // f64 bits of u, low half
#define H_UNIFORM_HI 14
#define H_INVALID_NAN 15  // f32 bits of the host's NaN for an invalid operation (inf - inf)
// u32 fields of a row's selection state.
#define SAMPLE_STATE 8
#define S_PREFIX_HI 0  // the key bits decided so far, right-aligned
#define S_PREFIX_LO 1
#define S_BITS 2       // how many of the key's top bits are decided (0 to 64)
#define S_REMAINING 3  // how many candidates are still to find among the keys with the prefix
#define S_DONE 4       // the kept keys are those whose top S_BITS bits are >= the prefix
#define S_COUNT 5      // candidates gathered

#define SAMPLE_FLAG_GREEDY 1u
#define SAMPLE_FLAG_PENALTIES 2u
#define SAMPLE_FLAG_HOST 4u  // a row the host samples: the kernels leave it as it is

// f32 bits whose unsigned order is f32::total_cmp's order, and back.
__device__ __forceinline__ u32 ordered_bits(float v) {
    const u32 bits = __float_as_uint(v);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float from_ordered_bits(u32 key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}
__device__ __forceinline__ u64 candidate_key(float v, u32 id) {
    return ((u64)ordered_bits(v) << 32) | (u64)(~id);
}

// The host's result `r` of an f32 operation on `a` and `b`, NaNs included: a NaN operand
// comes through quieted with its sign and payload (the first one when both are NaN, as x86's
// SSE does), an invalid operation (inf - inf, 0 * inf) gives the host's own NaN `invalid`.
// The GPU answers every NaN with its canonical 0x7fffffff instead, and the sign matters here:
// candidates order by total order, where a positive NaN ranks above everything and a negative
// one below (a penalized -NaN turned into +NaN became the top candidate).
__device__ __forceinline__ float as_host(float a, float b, float r, u32 invalid) {
    if (r == r) return r;
    if (a != a) return __uint_as_float(__float_as_uint(a) | 0x00400000u);
    if (b != b) return __uint_as_float(__float_as_uint(b) | 0x00400000u);
    return __uint_as_float(invalid);
}

// Biases in order (-100 bans, +100 never comes here: the host samples rows that force
// tokens), then the penalties: l / repeat if l > 0 else l * repeat, then
// l - (count * frequency + presence), each operation rounded as the host's f32 code rounds it
// and giving the host's NaN (as_host). Also resets the row's selection state and key histogram.
extern "C" __global__ void sample_adjust_f32(float* __restrict__ logits, u32 width, u32 rows,
                                             const u32* __restrict__ input, u32* __restrict__ state,
                                             u32* __restrict__ histogram) { pdl_start();
    const u32 row = blockIdx.x;
    if (row >= rows) return;
    const u32* header = input + (u64)row * SAMPLE_HEADER;
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) histogram[(u64)row * 256 + i] = 0;
    if (threadIdx.x != 0) return;
    u32* s = state + (u64)row * SAMPLE_STATE;
    if (header[H_FLAGS] & SAMPLE_FLAG_HOST) {
        s[S_DONE] = 1;
        return;
    }
    float* l = logits + (u64)row * width;
    const u32 invalid = header[H_INVALID_NAN];
    const u32* bias = input + header[H_BIAS];
    for (u32 i = 0; i < header[H_BIAS_LEN]; i++) {
        const u32 id = bias[2 * i];
        const float value = __uint_as_float(bias[2 * i + 1]);
        if (id >= width) continue;  // the host refuses such rows before launching
        if (value <= -100.0f) l[id] = -__int_as_float(0x7f800000);
        else if (value < 100.0f) l[id] = as_host(l[id], value, __fadd_rn(l[id], value), invalid);
    }
    if (header[H_FLAGS] & SAMPLE_FLAG_PENALTIES) {
        const float repeat = __uint_as_float(header[H_REPEAT]);
        const float frequency = __uint_as_float(header[H_FREQUENCY]);
        const float presence = __uint_as_float(header[H_PRESENCE]);
        const u32* penalized = input + header[H_PENALIZED];
        for (u32 i = 0; i < header[H_PENALIZED_LEN]; i++) {
            const u32 id = penalized[2 * i];
            if (id >= width) continue;  // as the host skips tokens outside the row
            const float logit = l[id];
            const float v = logit > 0.0f ? as_host(logit, repeat, __fdiv_rn(logit, repeat), invalid)
                                         : as_host(logit, repeat, __fmul_rn(logit, repeat), invalid);
            const float count = __uint2float_rn(penalized[2 * i + 1]);
            const float times = as_host(count, frequency, __fmul_rn(count, frequency), invalid);
            const float total = as_host(times, presence, __fadd_rn(times, presence), invalid);
            l[id] = as_host(v, total, __fsub_rn(v, total), invalid);
        }
    }
    const u32 k = header[H_K];
    const bool greedy = header[H_FLAGS] & SAMPLE_FLAG_GREEDY;
    s[S_PREFIX_HI] = 0;
    s[S_PREFIX_LO] = 0;
    s[S_BITS] = 0;
    s[S_REMAINING] = k;
    // Every key is kept when k covers the row; greedy rows select nothing.
    s[S_DONE] = (greedy || k >= width) ? 1u : 0u;
    s[S_COUNT] = 0;
}

__device__ __forceinline__ u64 state_prefix(const u32* s) {
    return ((u64)s[S_PREFIX_HI] << 32) | (u64)s[S_PREFIX_LO];
}

// One round of the radix select: block (part, row) counts, by their next eight bits, the
// keys of its slice whose decided top bits equal the prefix, into histogram[row][256].
extern "C" __global__ void sample_histogram_f32(const float* __restrict__ logits, u32 width, u32 rows,
                                                u32 chunk, const u32* __restrict__ state,
                                                u32* __restrict__ histogram) { pdl_start();
    __shared__ u32 counts[256];
    const u32 part = blockIdx.x, row = blockIdx.y;
    if (row >= rows) return;
    const u32* s = state + (u64)row * SAMPLE_STATE;
    if (s[S_DONE]) return;
    const u32 bits = s[S_BITS];
    const u64 prefix = state_prefix(s);
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) counts[i] = 0;
    __syncthreads();
    const float* l = logits + (u64)row * width;
    const u32 begin = part * chunk;
    const u32 end = min(width, begin + chunk);
    for (u32 i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const u64 key = candidate_key(l[i], i);
        if (bits == 0 || (key >> (64 - bits)) == prefix) atomicAdd(&counts[(u32)(key >> (56 - bits)) & 255u], 1u);
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x)
        if (counts[i]) atomicAdd(&histogram[(u64)row * 256 + i], counts[i]);
}

// One round's decision, one thread per row: the bin (from the top) that holds the
// remaining-th largest key joins the prefix; when that bin holds exactly the keys still to
// find (always so once all 64 bits are decided: keys are distinct), the row is done.
// Clears the histogram for the next round.
extern "C" __global__ void sample_select(u32 rows, u32* __restrict__ state, u32* __restrict__ histogram) {
    pdl_start();
    const u32 row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    u32* s = state + (u64)row * SAMPLE_STATE;
    u32* h = histogram + (u64)row * 256;
    if (!s[S_DONE]) {
        u32 remaining = s[S_REMAINING], above = 0, digit = 0, in_bin = 0;
        for (int d = 255; d >= 0; d--) {
            const u32 c = h[d];
            if (above + c >= remaining) {
                digit = (u32)d;
                in_bin = c;
                break;
            }
            above += c;
        }
        remaining -= above;
        const u64 prefix = (state_prefix(s) << 8) | digit;
        const u32 bits = s[S_BITS] + 8;
        s[S_PREFIX_HI] = (u32)(prefix >> 32);
        s[S_PREFIX_LO] = (u32)prefix;
        s[S_BITS] = bits;
        s[S_REMAINING] = remaining;
        s[S_DONE] = (in_bin == remaining || bits >= 64) ? 1u : 0u;
    }
    for (u32 i = 0; i < 256; i++) h[i] = 0;
}

// Block (part, row) appends the keys of its slice that the selection keeps to the row's
// candidates (in no particular order: sample_draw sorts them).
extern "C" __global__ void sample_gather_f32(const float* __restrict__ logits, u32 width, u32 rows, u32 chunk,
                                             const u32* __restrict__ input, u32* __restrict__ state,
                                             u64* __restrict__ candidates) { pdl_start();
    const u32 part = blockIdx.x, row = blockIdx.y;
    if (row >= rows) return;
    if (input[(u64)row * SAMPLE_HEADER + H_FLAGS] & (SAMPLE_FLAG_GREEDY | SAMPLE_FLAG_HOST)) return;
    u32* s = state + (u64)row * SAMPLE_STATE;
    const u32 bits = s[S_BITS];
    const u64 prefix = state_prefix(s);
    const float* l = logits + (u64)row * width;
    const u32 begin = part * chunk;
    const u32 end = min(width, begin + chunk);
    for (u32 i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const u64 key = candidate_key(l[i], i);
        if (bits == 0 || (key >> (64 - bits)) >= prefix) {
            const u32 at = atomicAdd(&s[S_COUNT], 1u);
            if (at < SAMPLE_K_MAX) candidates[(u64)row * SAMPLE_K_MAX + at] = key;
        }
    }
}

// One block of SAMPLE_K_MAX threads per row (launch bounds keep its registers within what
// a block that size may have). Greedy rows: the argmax from greedy_ids, or 0
// when the row's first logit is NaN (the host's argmax never moves past a leading NaN).
// Other rows: the candidates sorted by descending key, then the host's draw, the sums in
// order on one thread and the exponentials spread over the block. Writes the token and its
// adjusted logit.
extern "C" __global__ void __launch_bounds__(SAMPLE_K_MAX)
    sample_draw_f32(const float* __restrict__ logits, u32 width, u32 rows, const u32* __restrict__ input,
                    const u32* __restrict__ state, const u64* __restrict__ candidates,
                    const u32* __restrict__ greedy_ids, u32* __restrict__ out_ids, float* __restrict__ out_logits) {
    pdl_start();
    __shared__ u64 keys[SAMPLE_K_MAX];
    __shared__ double terms[SAMPLE_K_MAX];
    __shared__ u32 kept;
    const u32 row = blockIdx.x;
    if (row >= rows) return;
    const u32* header = input + (u64)row * SAMPLE_HEADER;
    const float* l = logits + (u64)row * width;
    if (header[H_FLAGS] & SAMPLE_FLAG_HOST) return;
    if (header[H_FLAGS] & SAMPLE_FLAG_GREEDY) {
        if (threadIdx.x == 0) {
            const u32 id = l[0] != l[0] ? 0u : greedy_ids[row];
            out_ids[row] = id;
            out_logits[row] = l[id];
        }
        return;
    }
    const u32 n = min(state[(u64)row * SAMPLE_STATE + S_COUNT], (u32)SAMPLE_K_MAX);
    // Bitonic sort, descending, of n keys padded with zeros (below every real key: its low
    // half would be ~id of id 0xffffffff).
    u32 size = 1;
    while (size < n) size <<= 1;
    for (u32 i = threadIdx.x; i < size; i += blockDim.x)
        keys[i] = i < n ? candidates[(u64)row * SAMPLE_K_MAX + i] : 0ull;
    __syncthreads();
    for (u32 block = 2; block <= size; block <<= 1) {
        for (u32 stride = block >> 1; stride > 0; stride >>= 1) {
            for (u32 i = threadIdx.x; i < size; i += blockDim.x) {
                const u32 j = i ^ stride;
                if (j > i) {
                    const u64 a = keys[i], b = keys[j];
                    const bool descending = (i & block) == 0;
                    if (descending ? a < b : a > b) {
                        keys[i] = b;
                        keys[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    const float top = from_ordered_bits((u32)(keys[0] >> 32));
    const double top_logit = (double)top;
    // Probabilities at temperature 1 (the host divides by 1.0 too), for top-p and min-p.
    for (u32 i = threadIdx.x; i < n; i += blockDim.x)
        terms[i] = exp(__ddiv_rn(__dsub_rn((double)from_ordered_bits((u32)(keys[i] >> 32)), top_logit), 1.0));
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (u32 i = 0; i < n; i++) sum = __dadd_rn(sum, terms[i]);
        u32 keep = n;
        const float top_p = __uint_as_float(header[H_TOP_P]);
        if (top_p < 1.0f) {
            double cumulative = 0.0;
            for (u32 i = 0; i < n; i++) {
                cumulative = __dadd_rn(cumulative, __ddiv_rn(terms[i], sum));
                if (cumulative >= (double)top_p) {
                    keep = i + 1;
                    break;
                }
            }
            keep = max(keep, 1u);
        }
        if (__uint_as_float(header[H_MIN_P]) > 0.0f) {
            const float threshold = __fadd_rn(top, __uint_as_float(header[H_MIN_P_LOG]));
            u32 above = 0;
            while (above < keep && from_ordered_bits((u32)(keys[above] >> 32)) >= threshold) above++;
            keep = max(above, 1u);
        }
        kept = keep;
    }
    __syncthreads();
    const u32 m = kept;
    const double t = (double)__uint_as_float(header[H_TEMPERATURE]);
    for (u32 i = threadIdx.x; i < m; i += blockDim.x)
        terms[i] = exp(__ddiv_rn(__dsub_rn((double)from_ordered_bits((u32)(keys[i] >> 32)), top_logit), t));
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (u32 i = 0; i < m; i++) sum = __dadd_rn(sum, terms[i]);
        double r = __hiloint2double((int)header[H_UNIFORM_HI], (int)header[H_UNIFORM_LO]);
        u32 pick = m - 1;  // the host's fallback when rounding leaves r beyond the total
        for (u32 i = 0; i < m; i++) {
            const double q = __ddiv_rn(terms[i], sum);
            if (r < q) {
                pick = i;
                break;
            }
            r = __dsub_rn(r, q);
        }
        out_ids[row] = ~(u32)keys[pick];
        out_logits[row] = from_ordered_bits((u32)(keys[pick] >> 32));
    }
}

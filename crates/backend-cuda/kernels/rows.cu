// Row movement for MoE routing: gather rows by index, and the weighted scatter-add back.
#include "common.cuh"

// out[i] = src[rows[i]] for the step's logit rows (rows[] = step + logit_row_ids, count
// logit_rows), rows of `width` values. Indices at or past src_rows are skipped.
// Launch: one block per output row (grid.x = the number of rows), any block size.
extern "C" __global__ void gather_rows_f32(float* out, const float* src, const i32* step, u32 width, u64 src_rows) { pdl_start();
    const StepHeader* h = (const StepHeader*)step;
    const i32 i = blockIdx.x;
    if (i >= h->logit_rows) return;
    const i32 row = step[h->logit_row_ids + i];
    if (row < 0 || (u64)row >= src_rows) return;
    const float* from = src + (u64)row * width;
    float* to = out + (u64)i * width;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) to[c] = from[c];
}

// dst[rows[i]] += scales[i] * src[i], grouped by destination so that each destination row
// adds its sources in the order of `rows` (the product rounded before the sum), without
// atomics. `plan` (see src/ops/rows.rs) holds, as i32: targets[n_targets] (destination rows),
// offsets[n_targets + 1] into order[], order[] (source indices), scales[] (f32 bits, one per
// source index).
// Launch: one block per destination row (grid.x = n_targets), any block size.
extern "C" __global__ void scatter_add_rows_f32(float* dst, const float* src, const i32* plan, u32 n_targets,
                                                u32 n_sources, u32 width, u64 dst_rows) { pdl_start();
    const u32 target = blockIdx.x;
    if (target >= n_targets) return;
    const i32* targets = plan;
    const i32* offsets = plan + n_targets;
    const i32* order = offsets + n_targets + 1;
    const i32* scales = order + n_sources;
    const i32 row = targets[target];
    if (row < 0 || (u64)row >= dst_rows) return;
    float* to = dst + (u64)row * width;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) {
        float sum = to[c];
        for (i32 k = offsets[target]; k < offsets[target + 1]; ++k) {
            const i32 i = order[k];
            sum = __fadd_rn(sum, __fmul_rn(__int_as_float(scales[i]), src[(u64)i * width + c]));
        }
        to[c] = sum;
    }
}

// A planted kernel fault for testing the error path (RUNIT_CUDA_PLANT_FAULT, src/lib.rs): one
// thread stores through `address`, an address no allocation holds (the host passes 0), so the
// kernel dies with an illegal-address error that poisons the context.
#include "common.cuh"

extern "C" __global__ void plant_fault(float* address) {
    pdl_start();
    if (blockIdx.x == 0 && threadIdx.x == 0) *(volatile float*)address = 1.0f;
}

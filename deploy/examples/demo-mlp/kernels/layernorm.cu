// layernorm.cu: LayerNorm over the hidden dimension for BATCH * SEQ tokens
// (sizes from the shape bucket), one warp per token, Welford-free two-pass
// mean and variance with warp shuffles: y = (x - mean) / sqrt(var + eps) *
// gamma + beta.
#ifndef BATCH
#error "BATCH is not defined: the shape bucket did not reach the compiler"
#endif
#ifndef SEQ
#error "SEQ is not defined: the shape bucket did not reach the compiler"
#endif
#ifndef HIDDEN
#define HIDDEN 512
#endif
#define WARPS_PER_BLOCK 4

__device__ static float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)
layernorm(const float *__restrict__ x, const float *__restrict__ gamma,
          const float *__restrict__ beta, float *__restrict__ y, float eps) {
  int lane = threadIdx.x & 31;
  size_t token = (size_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
  if (token >= (size_t)BATCH * SEQ)
    return;
  const float *in = x + token * HIDDEN;
  float *out = y + token * HIDDEN;
  float s = 0.0f;
  for (int i = lane; i < HIDDEN; i += 32)
    s += in[i];
  float mean = warp_sum(s) / HIDDEN;
  float v = 0.0f;
  for (int i = lane; i < HIDDEN; i += 32) {
    float d = in[i] - mean;
    v += d * d;
  }
  float rstd = rsqrtf(warp_sum(v) / HIDDEN + eps);
  for (int i = lane; i < HIDDEN; i += 32)
    out[i] = (in[i] - mean) * rstd * gamma[i] + beta[i];
}

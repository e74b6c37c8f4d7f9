// softmax.cu: row-wise numerically stable softmax over the last dimension
// (SEQ, from the shape bucket) of a [BATCH * HEADS * SEQ, SEQ] score matrix,
// one block per row, a shared-memory tree reduction for max and sum.
#ifndef BATCH
#error "BATCH is not defined: the shape bucket did not reach the compiler"
#endif
#ifndef SEQ
#error "SEQ is not defined: the shape bucket did not reach the compiler"
#endif
#ifndef HEADS
#define HEADS 8
#endif
#define THREADS 256

__device__ static float block_reduce(float v, float *buf, bool is_max) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      float o = buf[threadIdx.x + s];
      buf[threadIdx.x] = is_max ? fmaxf(buf[threadIdx.x], o)
                                : buf[threadIdx.x] + o;
    }
    __syncthreads();
  }
  float r = buf[0];
  __syncthreads();
  return r;
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax(const float *__restrict__ x, float *__restrict__ y) {
  __shared__ float buf[THREADS];
  size_t row = blockIdx.x;
  if (row >= (size_t)BATCH * HEADS * SEQ)
    return;
  const float *in = x + row * SEQ;
  float *out = y + row * SEQ;
  float m = -3.402823466e38f; // -FLT_MAX: NVRTC has no <math.h> INFINITY
  for (int i = threadIdx.x; i < SEQ; i += THREADS)
    m = fmaxf(m, in[i]);
  m = block_reduce(m, buf, true);
  float s = 0.0f;
  for (int i = threadIdx.x; i < SEQ; i += THREADS)
    s += __expf(in[i] - m);
  s = block_reduce(s, buf, false);
  float inv = 1.0f / s;
  for (int i = threadIdx.x; i < SEQ; i += THREADS)
    out[i] = __expf(in[i] - m) * inv;
}

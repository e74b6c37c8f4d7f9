// saxpy.cu: test kernel for tests/test_gpu.c. Each thread handles BATCH
// consecutive elements; BATCH comes from the shape bucket (-DBATCH=<n>).
#ifndef BATCH
#error "BATCH is not defined: the bucket did not reach the compiler"
#endif

extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
  int base = (blockIdx.x * blockDim.x + threadIdx.x) * BATCH;
#pragma unroll
  for (int i = 0; i < BATCH; i++)
    if (base + i < n)
      y[base + i] = a * x[base + i] + y[base + i];
}

extern "C" __global__ void scale(float a, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] *= a;
}

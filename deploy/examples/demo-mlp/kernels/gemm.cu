// gemm.cu: tiled GEMM of the demo MLP, C[M,N] = A[M,K] * B[K,N] (+ bias,
// optional ReLU), row-major fp32. M = BATCH * SEQ rows come from the shape
// bucket (-DBATCH=.. -DSEQ=..); K and N are the model's widths, fixed here.
#ifndef BATCH
#error "BATCH is not defined: the shape bucket did not reach the compiler"
#endif
#ifndef SEQ
#error "SEQ is not defined: the shape bucket did not reach the compiler"
#endif
#ifndef HIDDEN
#define HIDDEN 512
#endif
#ifndef TILE
#define TILE 32
#endif

#define ROWS (BATCH * SEQ)

// One block computes a TILE x TILE tile of C; each thread one element.
// Tiles of A and B are staged in shared memory, so each global element is
// read K/TILE times instead of K times.
extern "C" __global__ void gemm(const float *__restrict__ a,
                                const float *__restrict__ b,
                                const float *__restrict__ bias,
                                float *__restrict__ c, int n, int k,
                                int relu) {
  __shared__ float as[TILE][TILE];
  __shared__ float bs[TILE][TILE + 1]; // +1: no bank conflicts on columns
  int row = blockIdx.y * TILE + threadIdx.y;
  int col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int t = 0; t < k; t += TILE) {
    int ak = t + threadIdx.x, bk = t + threadIdx.y;
    as[threadIdx.y][threadIdx.x] =
        (row < ROWS && ak < k) ? a[(size_t)row * k + ak] : 0.0f;
    bs[threadIdx.y][threadIdx.x] =
        (bk < k && col < n) ? b[(size_t)bk * n + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TILE; i++)
      acc += as[threadIdx.y][i] * bs[i][threadIdx.x];
    __syncthreads();
  }
  if (row < ROWS && col < n) {
    if (bias)
      acc += bias[col];
    c[(size_t)row * n + col] = relu && acc < 0.0f ? 0.0f : acc;
  }
}

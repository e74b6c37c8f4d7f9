// batch8.cu: compiles only when the bucket says batch=8, so a test can tell
// that the define took effect (and with the right value).
#if BATCH != 8
#error "BATCH must be 8"
#endif

extern "C" __global__ void fill8(float *y) {
  y[threadIdx.x] = (float)BATCH;
}

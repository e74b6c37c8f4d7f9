// broken.cu: does not compile (an undeclared identifier); the test checks
// that NVRTC's log comes back and names the error.
extern "C" __global__ void broken(float *y) {
  y[threadIdx.x] = undeclared_thing;
}

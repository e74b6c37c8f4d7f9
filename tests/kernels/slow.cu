// slow.cu: a source NVRTC really spends hours on, for the timeout test:
// L40 expands to 2^40 empty macro invocations. It produces no tokens, so
// memory grows slowly (about 20 MB/s with NVRTC 13.0) while the compiler is
// busy; the test gives the build 1 s and expects KC_TIMEOUT.
#define L0
#define L1 L0 L0
#define L2 L1 L1
#define L3 L2 L2
#define L4 L3 L3
#define L5 L4 L4
#define L6 L5 L5
#define L7 L6 L6
#define L8 L7 L7
#define L9 L8 L8
#define L10 L9 L9
#define L11 L10 L10
#define L12 L11 L11
#define L13 L12 L12
#define L14 L13 L13
#define L15 L14 L14
#define L16 L15 L15
#define L17 L16 L16
#define L18 L17 L17
#define L19 L18 L18
#define L20 L19 L19
#define L21 L20 L20
#define L22 L21 L21
#define L23 L22 L22
#define L24 L23 L23
#define L25 L24 L24
#define L26 L25 L25
#define L27 L26 L26
#define L28 L27 L27
#define L29 L28 L28
#define L30 L29 L29
#define L31 L30 L30
#define L32 L31 L31
#define L33 L32 L32
#define L34 L33 L33
#define L35 L34 L34
#define L36 L35 L35
#define L37 L36 L36
#define L38 L37 L37
#define L39 L38 L38
#define L40 L39 L39
L40

extern "C" __global__ void slow(float *y) { y[threadIdx.x] = 1.0f; }

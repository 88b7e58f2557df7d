// test_cuda_golden.c — the Hugging Face golden fixture on the CUDA backend (fp32 mode, TF32 off,
// the CPU test's tolerances): tests/test_golden.c with the device fixed to cuda.
#define GOLDEN_ON_CUDA 1
#include "../test_golden.c"

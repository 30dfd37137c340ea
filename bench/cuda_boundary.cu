// What a kernel boundary costs inside a CUDA graph, against a grid barrier inside one persistent
// kernel (issue 9: a batch-1 decode step of the 80B-A3B shape is ~250 kernels, and the small
// ones between the products cost ~0.6 ms a step, docs/PERFORMANCE.md). Before building a
// persistent kernel per layer, this measures what it could save: a chain of P phases, each
// reading `bytes` of a 2 GiB buffer (larger than L2, so the reads come from HBM; 0 = no work)
// and writing one float per block that the next phase reads, run three ways:
//   graph        P launches captured in a CUDA graph, plain stream order
//   graph+pdl    the same with programmatic dependent launch (as src/backends/cuda/ops.cu)
//   persistent   one cooperative kernel, a grid barrier (cooperative_groups) between phases
// Every phase uses the same grid (the SMs x the blocks per SM that fit), 256 threads a block.
//   cuda_boundary [--phases 240] [--reps 30]
// prints a markdown table: microseconds per phase, the median of `reps` runs of the chain.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

namespace cg = cooperative_groups;

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

constexpr int kThreads = 256;
constexpr size_t kBufferBytes = size_t{2} << 30;

// One phase: the grid sums its slice of `buf` (uint4 loads, grid-strided) plus the previous
// phase's float of this block, and writes its own. `slice` bytes, 16-byte aligned.
__device__ __forceinline__ void phase_work(const uint4* __restrict__ buf, size_t slice_off,
                                           size_t slice_vec, const float* prev, float* next) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < slice_vec; i += stride) {
    const uint4 v = buf[slice_off + i];
    acc ^= v.x + v.y + v.z + v.w;
  }
  __shared__ uint32_t red[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0;
    for (int w = 0; w < kThreads / 32; ++w) a ^= red[w];
    next[blockIdx.x] = prev[blockIdx.x] + static_cast<float>(a & 1);
  }
}

__global__ void phase_kernel(const uint4* buf, size_t slice_off, size_t slice_vec,
                             const float* prev, float* next, int pdl) {
#if __CUDA_ARCH__ >= 900
  if (pdl) {
    cudaTriggerProgrammaticLaunchCompletion();
    cudaGridDependencySynchronize();
  }
#endif
  phase_work(buf, slice_off, slice_vec, prev, next);
}

__global__ void persistent_kernel(const uint4* buf, size_t slice_vec, size_t buf_vec, int phases,
                                  float* flags) {
  cg::grid_group grid = cg::this_grid();
  for (int p = 0; p < phases; ++p) {
    const size_t off = (static_cast<size_t>(p) * slice_vec) % (buf_vec - slice_vec + 1);
    phase_work(buf, off, slice_vec, flags + (p % 2) * gridDim.x, flags + ((p + 1) % 2) * gridDim.x);
    grid.sync();
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of one call of `launch` (work on stream s) over `reps` calls, after two
// warm-ups.
template <class F>
float time_launch(F launch, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < reps + 2; ++r) {
    CHECK(cudaEventRecord(a, s));
    launch();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (r >= 2) ms.push_back(t);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  int phases = 240, reps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--phases"))
      phases = std::max(2, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::max(3, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: cuda_boundary [--phases N] [--reps N]\n");
      return 2;
    }
  }
  int dev = 0, sms = 0, per_sm = 0;
  cudaDeviceProp prop{};
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaGetDeviceProperties(&prop, dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
  const int blocks = sms * std::min(per_sm, 2);

  uint4* buf = nullptr;
  float* flags = nullptr;
  CHECK(cudaMalloc(&buf, kBufferBytes));
  CHECK(cudaMemset(buf, 1, kBufferBytes));
  CHECK(cudaMalloc(&flags, sizeof(float) * 2 * blocks));
  CHECK(cudaMemset(flags, 0, sizeof(float) * 2 * blocks));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t buf_vec = kBufferBytes / sizeof(uint4);

  std::printf("device: %s, %d SMs, %d blocks of %d threads a phase, %d phases\n\n", prop.name, sms,
              blocks, kThreads, phases);
  std::printf(
      "| bytes a phase | graph us/phase | graph+pdl us/phase | persistent us/phase | "
      "pdl saves us/boundary | persistent saves us/boundary (vs pdl) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (size_t bytes : {size_t{0}, size_t{256} << 10, size_t{2} << 20, size_t{16} << 20}) {
    const size_t slice_vec = bytes / sizeof(uint4);
    float us[3];
    for (int mode = 0; mode < 2; ++mode) {
      cudaGraph_t g;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int p = 0; p < phases; ++p) {
        const size_t off = (static_cast<size_t>(p) * slice_vec) % (buf_vec - slice_vec + 1);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(kThreads);
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = mode == 1 ? 1 : 0;
        const float* prev = flags + (p % 2) * blocks;
        float* next = flags + ((p + 1) % 2) * blocks;
        CHECK(cudaLaunchKernelEx(&cfg, phase_kernel, static_cast<const uint4*>(buf), off, slice_vec,
                                 prev, next, mode));
      }
      CHECK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t exec;
      CHECK(cudaGraphInstantiate(&exec, g, 0));
      us[mode] = time_launch([&] { CHECK(cudaGraphLaunch(exec, s)); }, s, reps) * 1000.0f /
                 static_cast<float>(phases);
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(g));
    }
    // The persistent kernel is one launch (not in a graph: its launch cost, 1/phases of it, is
    // within the rounding).
    const uint4* b = buf;
    size_t sv = slice_vec, bv = buf_vec;
    int ph = phases;
    float* f = flags;
    void* args[] = {&b, &sv, &bv, &ph, &f};
    us[2] = time_launch(
                [&] {
                  CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel),
                                                    dim3(blocks), dim3(kThreads), args, 0, s));
                },
                s, reps) *
            1000.0f / static_cast<float>(phases);
    std::printf("| %zu KiB | %.2f | %.2f | %.2f | %.2f | %.2f |\n", bytes >> 10, us[0], us[1],
                us[2], us[0] - us[1], us[1] - us[2]);
  }
  CHECK(cudaFree(buf));
  CHECK(cudaFree(flags));
  return 0;
}

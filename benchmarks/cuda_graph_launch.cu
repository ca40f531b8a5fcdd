// Host cost of cudaGraphLaunch by node count and kind, without XLA: is the ~3 ms the 27B
// forward's call spends on the host (~1,250 kernels in one CUDA graph) the driver's launch, or
// XLA's work around it (graph_launch_probe.py measures the two together)?
//
//   nvcc -O2 -o /tmp/cuda_graph_launch benchmarks/cuda_graph_launch.cu && /tmp/cuda_graph_launch
//
// For N in 1, 64, 256, 1024, 2048 and three kinds of graph:
//   kernels   N kernel nodes in a chain (what XLA records for fusions)
//   children  N child-graph nodes of one kernel each (XLA records an FFI custom call by stream
//             capture into a nested graph)
//   captured  one stream capture of N launches (a single-level graph, as torch.cuda.graphs do)
// prints one JSON line: medians over 50 launches after 5 warm-ups of the time until
// cudaGraphLaunch returns and until the stream has finished, in microseconds.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e = (x);                                                          \
    if (e != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

__global__ void Tick(int* counter) {
  if (threadIdx.x == 0 && blockIdx.x == 0) ++*counter;
}

using Clock = std::chrono::steady_clock;
double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

cudaGraph_t Captured(cudaStream_t s, int n, int* counter) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) Tick<<<1, 32, 0, s>>>(counter);
  CHECK(cudaStreamEndCapture(s, &g));
  return g;
}

cudaGraph_t Chain(cudaStream_t s, int n, int* counter, bool children) {
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t prev = nullptr;
  void* args[] = {&counter};
  cudaKernelNodeParams kp = {};
  kp.func = reinterpret_cast<void*>(Tick);
  kp.gridDim = dim3(1), kp.blockDim = dim3(32), kp.kernelParams = args;
  for (int i = 0; i < n; ++i) {
    cudaGraphNode_t node;
    const int deps = prev == nullptr ? 0 : 1;
    if (children) {
      cudaGraph_t child = Captured(s, 1, counter);
      CHECK(cudaGraphAddChildGraphNode(&node, g, &prev, deps, child));
      CHECK(cudaGraphDestroy(child));
    } else {
      CHECK(cudaGraphAddKernelNode(&node, g, &prev, deps, &kp));
    }
    prev = node;
  }
  return g;
}

void Measure(const char* kind, int n, cudaGraph_t g, cudaStream_t s) {
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  for (int i = 0; i < 5; ++i) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  std::vector<double> ret, done;
  for (int i = 0; i < 50; ++i) {
    const auto t0 = Clock::now();
    CHECK(cudaGraphLaunch(exec, s));
    const auto t1 = Clock::now();
    CHECK(cudaStreamSynchronize(s));
    const auto t2 = Clock::now();
    ret.push_back(Us(t0, t1));
    done.push_back(Us(t0, t2));
  }
  std::sort(ret.begin(), ret.end());
  std::sort(done.begin(), done.end());
  std::printf(
      "{\"probe\": \"cuda_graph_launch\", \"kind\": \"%s\", \"nodes\": %d, \"return_us\": %.1f, "
      "\"done_us\": %.1f, \"return_us_per_node\": %.3f}\n",
      kind, n, ret[25], done[25], ret[25] / n);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
}

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* counter;
  CHECK(cudaMalloc(&counter, sizeof(int)));
  for (int n : {1, 64, 256, 1024, 2048}) {
    Measure("kernels", n, Chain(s, n, counter, false), s);
    Measure("children", n, Chain(s, n, counter, true), s);
    Measure("captured", n, Captured(s, n, counter), s);
  }
  CHECK(cudaFree(counter));
  return 0;
}

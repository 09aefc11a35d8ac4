// What the probes share: CHECK (a CUDA call that must succeed, else the probe stops and names
// it) and bench_kernel.py's timing method, for probes that time calls the way the benchmark does.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(call)                                                                     \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// How many copies of `bytes` (weights + activations of one call) the graph rotates through:
// bench_kernel's min(64, max(2, ceil(2 x L2 / bytes))), past L2 from ~1.9 MB a call.
inline int rotating_copies(long l2_bytes, long bytes) {
  return static_cast<int>(std::min<long>(64, std::max<long>(2, (2 * l2_bytes + bytes - 1) / bytes)));
}

// bench_kernel.py's SHAPES as (name, K, N): Qwen3-Embedding-0.6B's linear layers and their tp 4
// shards (K a multiple of 128 in all of them).
struct ProbeShape {
  const char* name;
  int k, n;
};
constexpr ProbeShape kShapes[] = {{"qkv", 1024, 4096},         {"o", 2048, 1024},        {"gate_up", 1024, 6144},
                                  {"down", 3072, 1024},        {"qkv/tp4", 1024, 1024},  {"o/tp4", 512, 1024},
                                  {"gate_up/tp4", 1024, 1536}, {"down/tp4", 768, 1024}};

// A layer's packed codes + fp16 scales in bytes (K a multiple of 128).
inline long ternary_bytes(int k, int n) {
  return static_cast<long>(n) * (k / 4) + static_cast<long>(n) * (k / 128) * 2;
}

// Programmatic dependent launch: the launch may start while the previous kernel in the stream
// runs; the kernel's griddepcontrol.wait is where it waits for it.
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

// Graphs written so far under PROBE_DOT (one count for every time_graph instantiation).
inline int g_dot_dumped = 0;

// bench_kernel.time_graph: median us per call of a CUDA graph that makes `copies` calls
// (`call(stream, i)` enqueues call i), after one eager pass and 5 replays of warm-up; 50 replays
// timed with CUDA events.
template <typename Call>
double time_graph(cudaStream_t s, int copies, Call call) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  for (int i = 0; i < copies; ++i) call(s, i);
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < copies; ++i) call(s, i);
  CHECK(cudaStreamEndCapture(s, &g));
  // PROBE_DOT=prefix: the first three graphs as Graphviz files prefix_0.dot .. prefix_2.dot
  // (cudaGraphDebugDotPrint, verbose: node types, launch attributes, edge types)
  if (const char* dot = std::getenv("PROBE_DOT"); dot && g_dot_dumped < 3) {
    const std::string path = std::string(dot) + "_" + std::to_string(g_dot_dumped++) + ".dot";
    CHECK(cudaGraphDebugDotPrint(g, path.c_str(), cudaGraphDebugDotFlagsVerbose));
  }
  // PROBE_GRAPH_FLAGS: cudaGraphInstantiateWithFlags' flags (torch instantiates with 1,
  // cudaGraphInstantiateFlagAutoFreeOnLaunch); 0 if unset
  const char* flags = std::getenv("PROBE_GRAPH_FLAGS");
  CHECK(cudaGraphInstantiateWithFlags(&ge, g, flags ? std::strtoull(flags, nullptr, 10) : 0));
  for (int r = 0; r < 5; ++r) CHECK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < 50; ++r) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0 / copies);
  }
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

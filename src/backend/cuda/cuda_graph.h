// CUDA graphs for the layers above (no CUDA header here: rollout/ includes it).
//
// A Graph records the work a function queues on the backend's stream (kernel
// launches, device copies, cuBLAS GEMMs) once, and replays it with one launch:
// the same kernels on the same addresses with the same arguments, so a replay
// computes exactly what the recorded function computes when it runs eagerly
// on the same inputs. What a capture cannot contain fails the capture naming
// the call (a synchronisation, a copy to or from host memory, a cudaMalloc):
// inputs go into persistent device buffers before replay(), results are read
// after it.
//
// Tensors the function allocates come from a GraphPool (PyTorch's
// graph-private pool in function): device memory reserved for the graphs
// while the pool lives, so their intermediate and output buffers keep their
// addresses across replays. Graphs captured one after another may share a
// pool (they never run concurrently: one stream); an output a caller reads
// after a replay must stay alive (hold its Tensor) until the graph is dropped.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "core/caching_allocator.h"

namespace kestrel::cuda {

// Whether the backend's stream is capturing a graph now (false before init()).
// Ops that read device values back for a host-side check (index bounds) skip
// that read while capturing; the graph's owner checks the same values on its
// host copies before each replay (rollout/decode_graphs.cpp).
bool capturing();

class GraphPool {
 public:
  GraphPool();
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  // The allocator Tensor::empty uses for Device::CUDA during a capture into this pool.
  Allocator& allocator();
  // Device bytes the pool holds (live graph buffers plus its cache).
  size_t reserved_bytes() const;

 private:
  std::unique_ptr<CachingDeviceAllocator> alloc_;
};

class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Records what `work` queues on the stream (nothing runs); every device
  // tensor it allocates comes from `pool`. Run `work` once eagerly before
  // (a warm-up) so that lazy initialisation (cuBLAS, module loading) is done.
  // Fails naming the refused call when `work` does what a capture cannot
  // contain; the graph is then left empty.
  void capture(GraphPool& pool, const std::function<void()>& work);
  // Runs the recorded work once more, on the stream (asynchronous).
  void replay();
  bool captured() const { return exec_ != nullptr; }
  // Replays in this process so far (tests: graphs were replayed, not bypassed).
  static int64_t replays();

 private:
  void reset();
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace kestrel::cuda

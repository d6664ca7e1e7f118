// A process group that only knows a rank and a size: one rank of a layout
// seen from a single process (a pipeline stage, a tp rank), for code that
// asks its group only for rank() and size(). Any collective is a test bug
// and fails loudly, naming the group.
#pragma once
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/status.h"

namespace kestrel::testing {

class RankOnlyGroup final : public comm::ProcessGroup {
 public:
  RankOnlyGroup(int rank, int size, std::string name) : rank_(rank), size_(size), name_(std::move(name)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  void all_reduce(void*, int64_t, DType, comm::ReduceOp) override { fail(); }
  void reduce_scatter(const void*, void*, int64_t, DType, comm::ReduceOp) override { fail(); }
  void all_gather(const void*, void*, int64_t, DType) override { fail(); }
  void broadcast(void*, int64_t, DType, int) override { fail(); }
  void all_to_all(const void*, void*, int64_t, DType) override { fail(); }
  void all_to_allv(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&, DType) override {
    fail();
  }
  void send(const void*, int64_t, DType, int, int) override { fail(); }
  void recv(void*, int64_t, DType, int, int) override { fail(); }
  void barrier() override { fail(); }

 private:
  [[noreturn]] void fail() const {
    KS_FAIL("RankOnlyGroup '", name_, "' (rank ", rank_, " of ", size_, " emulated in one process): a collective");
  }
  int rank_, size_;
  std::string name_;
};

}  // namespace kestrel::testing

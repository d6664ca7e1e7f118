// Helpers of the layout-independent optimizer checkpoint tests
// (tests/train/optimizer_checkpoint_test.cpp, tests/mpi/optimizer_ckpt_mpi_test.cpp):
// the saved state of a checkpoint folder by name, and one training step of a two-slice pipeline
// emulated in one process.
#pragma once
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "common/rank_only_group.h"
#include "io/safetensors.h"
#include "model/scoring.h"
#include "train/engine_testing.h"
#include "train/optimizer_checkpoint.h"

namespace kestrel::train::ckpt_testing {

namespace fs = std::filesystem;
using kestrel::testing::RankOnlyGroup;

inline std::string tmp_dir(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("kestrel_optckpt_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// The saved optimizer state of a folder's stage files: tensor name -> raw
// bytes (with dtype and shape), the lowest stage's where a name (the tied
// embedding) is in two files; those copies must be equal bit for bit.
struct SavedState {
  std::map<std::string, std::vector<uint8_t>> tensors;
  std::map<std::string, std::string> step_count;  // file -> step_count
  std::vector<std::string> duplicates_differ;
};
inline SavedState saved_state(const std::string& dir) {
  SavedState s;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (std::regex_match(e.path().filename().string(), std::regex("optimizer_pp[0-9]+\\.safetensors")))
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    auto f = io::SafetensorsFile::open(path);
    KS_CHECK(f.is_ok(), f.status().message());
    s.step_count[path] = f.value()->metadata().at("step_count");
    for (const auto& info : f.value()->tensors()) {
      Tensor t = f.value()->get(info.name).value();
      std::vector<uint8_t> b(t.nbytes() + 64);
      const std::string head = std::string(dtype_name(t.dtype())) + shape_str(t.shape());
      std::memcpy(b.data(), head.data(), std::min<size_t>(64, head.size()));
      std::memcpy(b.data() + 64, t.raw(), t.nbytes());
      auto [it, fresh] = s.tensors.emplace(info.name, b);
      if (!fresh && it->second != b) s.duplicates_differ.push_back(info.name);
    }
  }
  return s;
}

// Copies every weight of `from` that `to` holds (by HF name).
inline void copy_weights(model::CausalLM& from, model::CausalLM& to) {
  for (model::Param* p : to.params())
    if (model::Param* q = from.find_param(p->name)) p->weight.copy_from(q->weight);
}

// Weight bytes by name over several models (slices): the lowest slice's for a shared name.
inline std::map<std::string, std::vector<uint8_t>> weights_by_name(const std::vector<model::CausalLM*>& models) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (model::CausalLM* m : models)
    for (const model::Param* p : m->params()) {
      std::vector<uint8_t> b(p->weight.nbytes());
      std::memcpy(b.data(), p->weight.raw(), b.size());
      out.emplace(p->name, std::move(b));
    }
  return out;
}

// The largest |a - b| / max|b| over the tensors of two weight maps (f32 or bf16 weights).
inline double max_rel_diff(const std::map<std::string, std::vector<uint8_t>>& a,
                           const std::map<std::string, std::vector<uint8_t>>& b, DType dt) {
  double worst = 0;
  for (const auto& [name, wa] : a) {
    const auto& wb = b.at(name);
    auto val = [&](const std::vector<uint8_t>& w, size_t i) {
      uint32_t u = 0;
      if (dt == DType::F32) std::memcpy(&u, w.data() + 4 * i, 4);
      else {
        uint16_t h;
        std::memcpy(&h, w.data() + 2 * i, 2);
        u = uint32_t(h) << 16;
      }
      float f;
      std::memcpy(&f, &u, 4);
      return double(f);
    };
    const size_t n = wa.size() / (dt == DType::F32 ? 4 : 2);
    double scale = 0, diff = 0;
    for (size_t i = 0; i < n; ++i) {
      scale = std::max(scale, std::abs(val(wb, i)));
      diff = std::max(diff, std::abs(val(wa, i) - val(wb, i)));
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

// The resumed run (2 steps in layout A, 1 in B) against B's and A's
// uninterrupted runs. Across layouts the steps' f32 roundings differ and
// AdamW's normalisation carries that into the updates (an element whose
// gradient is near zero can move by ~lr either way), so the two layouts'
// uninterrupted runs differ by 1e-7 to 5e-3 relative, depending on the data.
// Two checks:
//   - the resumed run differs from A's own run only by its last step's
//     layout: within 1e-6 relative (f32; measured up to 3e-7) and 1e-2 (bf16,
//     one ulp of a weight; measured 0): this is what catches a misplaced
//     shard, owned range or master, which moves weights by about lr = 1e-2;
//   - it is no further from B's run than A's own run is (twice that, plus the
//     same floor).
struct ResumeDiff {
  double to_b = 0, a_to_b = 0, to_a = 0;  // max relative differences (to each tensor's scale)
  std::string str() const {
    char buf[200];
    std::snprintf(buf, sizeof buf, "to the new layout's run %.3g, to the old layout's run %.3g (the two runs: %.3g)",
                  to_b, to_a, a_to_b);
    return buf;
  }
  void expect_close(DType dt) const {
    const double floor = dt == DType::F32 ? 1e-6 : 1e-2;
    EXPECT_LE(to_a, floor) << str();
    EXPECT_LE(to_b, 2 * a_to_b + floor) << str();
  }
};
inline ResumeDiff resume_diff(const std::map<std::string, std::vector<uint8_t>>& resumed,
                              const std::map<std::string, std::vector<uint8_t>>& ref_b,
                              const std::map<std::string, std::vector<uint8_t>>& ref_a, DType dt) {
  return {max_rel_diff(resumed, ref_b, dt), max_rel_diff(ref_a, ref_b, dt), max_rel_diff(resumed, ref_a, dt)};
}

// A two-stage pipeline in one process: layers [0, 1) with the embedding and
// [1, L) with the head (a tied lm_head's own embedding copy), each with its
// own engine, the pp group a RankOnlyGroup (tests/common/rank_only_group.h).
struct Pipe {
  std::unique_ptr<model::CausalLM> s0, s1;
  std::unique_ptr<TrainingEngine> e0, e1;
};
// `real_pp` (a 2-rank pp group, optional) replaces the RankOnlyGroup of the
// stage of its rank: that slice then saves and loads as a real pipeline stage.
inline Pipe make_pipe(const io::ModelConfig& cfg, model::ModelOptions o, uint64_t seed, const EngineOptions& eo,
                      std::shared_ptr<comm::ProcessGroup> real_pp = nullptr) {
  Pipe p;
  model::ModelOptions o0 = o, o1 = o;
  o0.num_layers = 1;
  o0.has_head = false;
  o0.parallel.pp = std::make_shared<RankOnlyGroup>(0, 2, "pp");
  o1.first_layer = 1;
  o1.has_embedding = false;
  o1.parallel.pp = std::make_shared<RankOnlyGroup>(1, 2, "pp");
  if (real_pp) (real_pp->rank() == 0 ? o0 : o1).parallel.pp = real_pp;
  p.s0 = model::CausalLM::init_random(cfg, o0, seed);
  p.s1 = model::CausalLM::init_random(cfg, o1, seed);
  p.e0 = std::make_unique<TrainingEngine>(*p.s0, eo);
  p.e1 = std::make_unique<TrainingEngine>(*p.s1, eo);
  return p;
}

// One optimizer step of the pipe on the micro-batches (what a PP schedule
// does, by hand): forward through both slices, the objective on the logits,
// backward through both, the tied embedding's two gradients summed into both
// copies (Megatron's embedding-group all-reduce), then each stage's AdamW
// step. No clipping (the engines run with clip_grad <= 0 in these tests).
inline void train_pipe(Pipe& p, const std::vector<MicroBatch>& micro, const ObjectiveFn& objective, double lr) {
  p.s0->zero_grads();
  p.s1->zero_grads();
  for (size_t i = 0; i < micro.size(); ++i) {
    const model::PackedBatch& b = micro[i].batch;
    const Objective obj = objective(micro[i], i);
    model::Activations a0, a1;
    const Tensor h = p.s0->forward_hidden(b, Tensor(), a0);
    const Tensor logits = p.s1->forward_hidden(b, h, a1);
    const int64_t T = b.num_tokens;
    Tensor lp = Tensor::empty({T}, DType::F32), ent = Tensor::empty({T}, DType::F32),
           lse = Tensor::empty({T}, DType::F32);
    model::logprob_entropy_fwd(*p.s1, logits, b.targets, lp, &ent, lse);
    const std::vector<float> lph = lp.to_host<float>(), enth = ent.to_host<float>();
    std::vector<float> dlp(size_t(T), 0.f), dent(size_t(T), 0.f);
    TokenView view{lph.data(), enth.data(), T};
    obj.tokens(view, dlp.data(), dent.data());
    const Tensor dlogprob = Tensor::from_host(dlp, {T});
    Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
    model::logprob_entropy_bwd(*p.s1, logits, b.targets, lse, dlogprob, nullptr, &ent, dlogits);
    const Tensor dh = p.s1->backward_hidden(b, a1, dlogits);
    p.s0->backward_hidden(b, a0, dh);
  }
  model::Param* e0 = p.s0->find_param("model.embed_tokens.weight");
  model::Param* e1 = p.s1->find_param("model.embed_tokens.weight");
  if (e0 && e1) {
    std::vector<float> g0 = e0->grad.to_host<float>(), g1 = e1->grad.to_host<float>();
    for (size_t i = 0; i < g0.size(); ++i) g0[i] += g1[i];
    e0->grad.copy_from(Tensor::from_host(g0, e0->grad.shape()));
    e1->grad.copy_from(Tensor::from_host(g0, e1->grad.shape()));
  }
  p.e0->optimizer().step(lr);
  p.e1->optimizer().step(lr);
}

// Step `s`'s data (6 sequences, 2 micro-batches) and its objective.
struct StepData {
  std::vector<MicroBatch> micro;
  ObjectiveFn objective;
};
inline StepData step_data(int s) {
  const auto seqs = engine_testing::sequences(6, s);
  return {engine_testing::split(seqs, 3), engine_testing::mean_nll(seqs)};
}

}  // namespace kestrel::train::ckpt_testing

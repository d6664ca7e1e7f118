// The layout-free optimizer checkpoint (train/optimizer_checkpoint.h). Tensor
// data moves only through ops (parallel::shard_tensor / gather_tensor), the
// groups' tensor collectives and Tensor's copies.
#include "train/optimizer_checkpoint.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "model/ep_state.h"
#include "model/moe_mlp.h"
#include "optim/checkpoint_io.h"
#include "parallel/data_parallel.h"
#include "parallel/sharding.h"

namespace kestrel::train {

namespace {

namespace fs = std::filesystem;

constexpr const char* kExpAvg = "exp_avg.";
constexpr const char* kExpAvgSq = "exp_avg_sq.";
constexpr const char* kMaster = "master.";

// Every rank of the tp x dp plane learns whether all of them succeeded.
bool all_ok(bool ok, comm::ProcessGroup& tp, comm::ProcessGroup& dp) {
  int32_t v = ok ? 1 : 0;
  for (comm::ProcessGroup* g : {&tp, &dp})
    if (g->size() > 1) g->all_reduce(&v, 1, DType::I32, comm::ReduceOp::Min);
  return v == 1;
}

// The layout-independent file gathers each expert whole over its etp group,
// then the ep group; under pipeline stages the etp group must be tp's (the
// same answer on every rank).
Status check_expert_layout(const model::CausalLM& m, const std::string& dir) {
  if (m.experts_split_apart() && m.pp().size() > 1)
    return KS_ERR(dir, ": not supported yet: optimizer checkpoints of a pipelined model with "
                  "expert_tensor_parallel_size ", m.etp().size(), " other than tensor_model_parallel_size ",
                  m.tp().size());
  return Status::ok();
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// "tp=2 dp=2 pp=2 (stage 1: layers [2, 4) + head) distributed_optimizer=true reuse_fp32_param=false weights=bf16"
std::string layout_string(const TrainingEngine& e) {
  const model::CausalLM& m = e.model();
  std::ostringstream os;
  os << "tp=" << m.tp().size() << " dp=" << e.dp_group().size() << " pp=" << m.pp().size() << " (stage "
     << m.pp().rank() << ": " << (m.has_embedding() ? "embedding + " : "") << "layers [" << m.first_layer() << ", "
     << m.first_layer() + m.num_blocks() << ")" << (m.has_head() ? " + head" : "") << ") distributed_optimizer="
     << (e.distributed() && e.options().parallel.distributed_optimizer ? "true" : "false")
     << " reuse_fp32_param=" << (e.optimizer().reuses_fp32() ? "true" : "false")
     << " weights=" << dtype_name(m.dtype());
  if (m.ep().size() > 1) os << " ep=" << m.ep().size() << " edp=" << (e.expert_dp_group() ? e.expert_dp_group()->size() : 1);
  return os.str();
}

// The flat range every dp rank's optimizer owns, in dp rank order.
std::vector<std::pair<int64_t, int64_t>> owned_ranges(const optim::AdamW& opt, comm::ProcessGroup& dp) {
  std::vector<int64_t> mine = {opt.state_begin(), opt.state_end()}, all(size_t(2 * dp.size()));
  dp.all_gather(mine.data(), all.data(), 2, DType::I64);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int q = 0; q < dp.size(); ++q) out.push_back({all[size_t(2 * q)], all[size_t(2 * q + 1)]});
  return out;
}

// Param [off, off + n) of the flat space assembled on dp rank 0 from every
// rank's owned piece (`mine`: f32 [this rank's piece], empty allowed): f32 [n]
// on rank 0, undefined elsewhere. The owned ranges are contiguous and ascend
// with the rank, so the pieces in rank order are the parameter in order.
Tensor gather_on_dp0(comm::ProcessGroup& dp, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                     const Tensor& mine, int64_t off, int64_t n) {
  auto piece = [&](int q) {
    const int64_t lo = std::max(off, ranges[size_t(q)].first), hi = std::min(off + n, ranges[size_t(q)].second);
    return std::max<int64_t>(0, hi - lo);
  };
  const int r = dp.rank(), size = dp.size();
  std::vector<int64_t> send(size_t(size), 0), recv(size_t(size), 0);
  send[0] = piece(r);
  int64_t total = 0;
  if (r == 0)
    for (int q = 0; q < size; ++q) total += recv[size_t(q)] = piece(q);
  KS_CHECK(r != 0 || total == n, "optimizer checkpoint: the dp ranks' owned ranges cover ", total, " of the ", n,
           " elements of a parameter");
  Tensor out = Tensor::empty({r == 0 ? std::max<int64_t>(n, 1) : 1}, DType::F32, MemCategory::Other);
  // Host buffers on every rank (a device optimizer's pieces are copied out): the file is written from the host.
  const Tensor src = send[0] == 0                       ? Tensor::empty({1}, DType::F32, MemCategory::Other)
                     : mine.device() == Device::CPU ? mine.view({-1})
                                                      : mine.view({-1}).copy_to(Device::CPU);
  dp.all_to_allv(src, send, out, recv);
  return r == 0 ? out.slice_rows(0, n) : Tensor();
}

}  // namespace

std::string optimizer_stage_file_name(int64_t stage) { return "optimizer_pp" + std::to_string(stage) + ".safetensors"; }

namespace {

// This rank's piece of slot i's state over its owned range: f32 [hi - lo]
// each (undefined when it owns nothing); master only for bf16/f16 weights.
struct OwnedPiece {
  Tensor m, v, w;
};
OwnedPiece owned_piece(const optim::AdamW& opt, const Tensor& v_clean, size_t i) {
  const auto [lo, hi] = opt.owned_of(i);
  // (lo == hi: nothing owned here; owned_of then names the parameter's start, maybe outside the owned range.)
  if (lo == hi) return {};
  const int64_t b = lo - opt.state_begin(), e = hi - opt.state_begin();
  OwnedPiece p{opt.exp_avg().slice_rows(b, e), v_clean.slice_rows(b, e), Tensor()};
  if (opt.params()[i].model_copy.defined()) p.w = opt.master_view(i);
  return p;
}

// Expert parallelism: every routed expert's state onto the writer's
// list in routed_expert_tensors' order. The experts' optimizer may be sharded
// over the expert-data-parallel group (the distributed optimizer): each
// expert is first assembled on edp rank 0 (collective over edp), then the
// ranks of edp rank 0 (an ep group: every rank of an ep group has the same
// edp rank, and the writer is among them) broadcast it over ep from the rank
// holding it. Collective over edp, then over the ep group of edp rank 0.
void append_expert_states(const TrainingEngine& engine, bool writer, std::vector<io::NamedTensor>& out) {
  const model::CausalLM& model = engine.model();
  const std::vector<model::RoutedExpertTensor> experts = model::routed_expert_tensors(model);
  if (experts.empty()) return;  // a stage without MoE layers
  const optim::AdamW* opt = engine.expert_optimizer();
  comm::ProcessGroup* edp = engine.expert_dp_group();
  KS_CHECK(opt && edp, "optimizer checkpoint: routed experts without the experts' optimizer");
  const auto ranges = owned_ranges(*opt, *edp);
  const bool sharded = std::any_of(ranges.begin(), ranges.end(), [&](const auto& r) {
    return r.first != 0 || r.second != opt->numel();
  });
  const Tensor v_clean = opt->exp_avg_sq_clean();  // f32 [owned]: v without reuse_fp32_param's flags
  // Every expert has the model's dtype: bf16/f16 weights have f32 masters on every rank alike.
  const bool has_master = model.dtype() != DType::F32;
  std::map<std::string, OwnedPiece> whole;  // this rank's experts, whole on edp rank 0
  for (size_t i = 0; i < opt->params().size(); ++i) {
    KS_CHECK(has_master == opt->params()[i].model_copy.defined(), "optimizer checkpoint: expert '",
             opt->params()[i].name, "' has ", has_master ? "no" : "an", " f32 master in a ",
             dtype_name(model.dtype()), " model");
    OwnedPiece p = owned_piece(*opt, v_clean, i);
    if (sharded) {
      const int64_t off = opt->offsets()[i], n = opt->offsets()[i + 1] - off;
      p.m = gather_on_dp0(*edp, ranges, p.m, off, n);
      p.v = gather_on_dp0(*edp, ranges, p.v, off, n);
      if (has_master) p.w = gather_on_dp0(*edp, ranges, p.w, off, n);
    }
    whole[opt->params()[i].name] = p;
  }
  if (edp->rank() != 0) return;
  for (const model::RoutedExpertTensor& t : experts) {
    OwnedPiece p;
    if (t.local) {
      // Under etp each owner holds its shard: gathered whole over the etp
      // group first (its ranks own the same experts, all at edp rank 0).
      p = whole.at(t.name);
      comm::ProcessGroup& etp = model.etp();
      const auto whole_of = [&](const Tensor& piece) {
        const Tensor local = piece.view(t.local->weight.shape());
        return etp.size() == 1 ? local : parallel::gather_tensor(etp, local, t.local->shard, t.full_shape);
      };
      p.m = whole_of(p.m);
      p.v = whole_of(p.v);
      if (has_master) p.w = whole_of(p.w);
    }
    const Tensor fm = model::broadcast_expert_tensor(model, t, p.m, DType::F32);
    const Tensor fv = model::broadcast_expert_tensor(model, t, p.v, DType::F32);
    const Tensor fw = has_master ? model::broadcast_expert_tensor(model, t, p.w, DType::F32) : Tensor();
    if (!writer) continue;
    out.push_back({kExpAvg + t.name, fm});
    out.push_back({kExpAvgSq + t.name, fv});
    if (has_master) out.push_back({kMaster + t.name, fw});
  }
}

}  // namespace

Status save_optimizer_checkpoint(const TrainingEngine& engine, const std::string& dir,
                                 const std::map<std::string, std::string>& extra_metadata) {
  const model::CausalLM& model = engine.model();
  KS_TRY(check_expert_layout(model, dir));
  comm::ProcessGroup& tp = model.tp();
  comm::ProcessGroup& dp = engine.dp_group();
  const optim::AdamW& opt = engine.optimizer();
  const std::string path = dir + "/" + optimizer_stage_file_name(model.pp().rank());
  const bool writer = tp.rank() == 0 && dp.rank() == 0;

  // No file holds a NaN/Inf: every rank checks its share, all agree.
  Status st = engine.check_finite();
  if (!all_ok(st.is_ok(), tp, dp))
    return st.is_ok() ? KS_ERR(path, ": not written: another rank holds a NaN/Inf in its weights or optimizer state "
                                     "(its message is in its log)")
                      : st;

  const auto ranges = owned_ranges(opt, dp);
  const bool dp_sharded = std::any_of(ranges.begin(), ranges.end(), [&](const auto& r) {
    return r.first != 0 || r.second != opt.numel();
  });
  const Tensor v_clean = opt.exp_avg_sq_clean();  // f32 [owned]: v without reuse_fp32_param's flags
  std::vector<io::NamedTensor> out;
  const bool ep = model.ep().size() > 1;
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const optim::ParamSlot& slot = opt.params()[i];
    const model::Param* p = model.find_param(slot.name);
    KS_CHECK(p, "optimizer checkpoint: optimizer parameter '", slot.name, "' is not a parameter of the model");
    if (ep && model::is_routed_expert_param(slot.name)) continue;  // gathered over the ep group below
    const int64_t off = opt.offsets()[i], n = opt.offsets()[i + 1] - off;
    const bool has_master = slot.model_copy.defined();  // bf16/f16 weights; an f32 weight is its own master
    auto [m, v, w] = owned_piece(opt, v_clean, i);
    if (dp_sharded) {  // the distributed optimizer: assemble this rank's tp shard on dp rank 0
      m = gather_on_dp0(dp, ranges, m, off, n);
      v = gather_on_dp0(dp, ranges, v, off, n);
      if (has_master) w = gather_on_dp0(dp, ranges, w, off, n);
    }
    if (dp.rank() != 0) continue;
    // The tp shard [weight shape] -> the full HF tensor (collective over this dp rank 0's tp group).
    auto full = [&](const Tensor& local) {
      return parallel::gather_tensor(tp, local.view(p->weight.shape()), p->shard, p->full_shape,
                                     MemCategory::Other);
    };
    Tensor fm = full(m), fv = full(v), fw = has_master ? full(w) : Tensor();
    if (!writer) continue;
    out.push_back({kExpAvg + slot.name, fm});
    out.push_back({kExpAvgSq + slot.name, fv});
    if (has_master) out.push_back({kMaster + slot.name, fw});
  }

  // The experts' own optimizer: under ep, or kept apart by etp != tp.
  if (engine.expert_optimizer()) append_expert_states(engine, writer, out);

  st = Status::ok();
  if (writer) {
    std::map<std::string, std::string> md = extra_metadata;
    const optim::AdamWConfig& c = opt.config();
    md["format"] = kOptimizerCheckpointFormat;
    md["format_version"] = std::to_string(kOptimizerCheckpointVersion);
    md["optimizer"] = "adamw";
    md["beta1"] = num(c.beta1);
    md["beta2"] = num(c.beta2);
    md["eps"] = num(c.eps);
    md["weight_decay"] = num(c.weight_decay);
    md["step_count"] = std::to_string(opt.step_count());
    md["pp_rank"] = std::to_string(model.pp().rank());
    md["pp_size"] = std::to_string(model.pp().size());
    md["written_layout"] = layout_string(engine);
    st = io::save_safetensors(path, out, md);
  }
  if (!all_ok(st.is_ok(), tp, dp))
    return st.is_ok() ? KS_ERR(path, ": not written: the writing rank (tp 0, dp 0 of stage ", model.pp().rank(),
                               ") failed (its message is in its log)")
                      : st;
  return Status::ok();
}

namespace {

struct StageFile {
  int64_t stage = 0;
  std::string path;
  std::shared_ptr<io::SafetensorsFile> file;
};

std::string meta_of(const io::SafetensorsFile& f, const char* key) {
  auto it = f.metadata().find(key);
  return it == f.metadata().end() ? std::string() : it->second;
}

std::string file_list(const std::vector<StageFile>& files) {
  std::string s;
  for (const auto& f : files) s += (s.empty() ? "" : ", ") + f.path;
  return s;
}

// The stage files of dir, opened and checked against one another; an empty
// list when dir has none (the caller then looks for the old format).
Result<std::vector<StageFile>> open_stage_files(const std::string& dir) {
  std::vector<StageFile> files;
  std::error_code ec;
  const std::regex pat("optimizer_pp([0-9]+)\\.safetensors");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch mt;
    const std::string name = it->path().filename().string();
    if (!std::regex_match(name, mt, pat)) continue;
    StageFile f;
    f.stage = std::strtoll(mt[1].str().c_str(), nullptr, 10);
    f.path = dir + "/" + name;
    files.push_back(std::move(f));
  }
  if (ec) return KS_ERR(dir, ": cannot list the checkpoint folder: ", ec.message());
  std::sort(files.begin(), files.end(), [](const StageFile& a, const StageFile& b) { return a.stage < b.stage; });
  int64_t pp_size = -1;
  std::string step;
  for (StageFile& f : files) {
    KS_ASSIGN(f.file, io::SafetensorsFile::open(f.path));
    const auto& md = f.file->metadata();
    auto meta = [&](const char* k) {
      auto it = md.find(k);
      return it == md.end() ? std::string() : it->second;
    };
    if (meta("format") != kOptimizerCheckpointFormat)
      return KS_ERR(f.path, ": not a Kestrel optimizer checkpoint (metadata format='", meta("format"), "', expected '",
                    kOptimizerCheckpointFormat, "')");
    if (meta("format_version") != std::to_string(kOptimizerCheckpointVersion))
      return KS_ERR(f.path, ": optimizer checkpoint format_version '", meta("format_version"),
                    "' is not the one this Kestrel reads (", kOptimizerCheckpointVersion,
                    "); resume with the Kestrel version that wrote it");
    if (meta("optimizer") != "adamw")
      return KS_ERR(f.path, ": not an AdamW state (metadata optimizer='", meta("optimizer"), "')");
    const int64_t n = std::strtoll(meta("pp_size").c_str(), nullptr, 10);
    if (n < 1 || meta("pp_rank") != std::to_string(f.stage))
      return KS_ERR(f.path, ": metadata pp_rank='", meta("pp_rank"), "' pp_size='", meta("pp_size"),
                    "' do not match the file name; the file was renamed or damaged");
    if (pp_size >= 0 && n != pp_size)
      return KS_ERR(f.path, ": written by ", n, " pipeline stages but ", files.front().path, " by ", pp_size,
                    "; the folder mixes two checkpoints: resume from a folder one run wrote");
    if (!step.empty() && meta("step_count") != step)
      return KS_ERR(f.path, ": step_count ", meta("step_count"), " but ", files.front().path, " has ", step,
                    "; the folder mixes two checkpoints: resume from a folder one run wrote");
    pp_size = n;
    step = meta("step_count");
  }
  if (files.empty()) return files;
  for (int64_t s = 0; s < pp_size; ++s)
    if (std::none_of(files.begin(), files.end(), [&](const StageFile& f) { return f.stage == s; }))
      return KS_ERR(dir, "/", optimizer_stage_file_name(s), ": missing; the checkpoint was written by ", pp_size,
                    " pipeline stages (", meta_of(*files.front().file, "written_layout"),
                    ") and every stage file is needed to resume under any layout: restore the file, or resume from "
                    "another checkpoint");
  if (int64_t(files.size()) != pp_size)
    return KS_ERR(files.back().path, ": stage ", files.back().stage, " is past the ", pp_size,
                  " stages the checkpoint was written by; remove the stray file");
  return files;
}

// What one optimizer slot takes from the files (validated before anything is written).
struct SlotSource {
  Tensor m, v, master;  // full HF-shaped f32, borrowed from the mappings; master undefined for f32 weights
};

Result<SlotSource> find_slot(const std::vector<StageFile>& files, const optim::ParamSlot& slot,
                             const model::Param& p) {
  for (const StageFile& f : files) {
    if (!f.file->contains(kExpAvg + slot.name)) continue;  // the lowest stage holding it (a tied embedding: stage 0)
    const std::string layout = meta_of(*f.file, "written_layout");
    SlotSource s;
    for (auto [prefix, dst] : {std::pair{kExpAvg, &s.m}, std::pair{kExpAvgSq, &s.v}, std::pair{kMaster, &s.master}}) {
      const std::string key = prefix + slot.name;
      const bool want = prefix != std::string(kMaster) || slot.model_copy.defined();
      if (!f.file->contains(key)) {
        if (!want) continue;
        if (prefix == std::string(kMaster))
          return KS_ERR(f.path, ": has no '", key, "': it was written for f32 weights (", layout,
                        "), this model trains ", dtype_name(slot.model_copy.dtype()),
                        " and needs the f32 master; resume with the weight dtype the checkpoint was written with");
        return KS_ERR(f.path, ": has '", kExpAvg, slot.name, "' but no '", key, "'; the file is damaged");
      }
      if (!want)
        return KS_ERR(f.path, ": holds '", key, "': it was written for bf16/f16 weights with f32 masters (", layout,
                      "), this model trains f32; resume with the weight dtype the checkpoint was written with");
      KS_ASSIGN(Tensor t, f.file->get(key));
      if (t.dtype() != DType::F32 || t.shape() != p.full_shape)
        return KS_ERR(f.path, ": '", key, "' is ", t.describe(), " but this model's '", slot.name, "' is f32",
                      shape_str(p.full_shape), " (HF shape); the checkpoint was written for another model (",
                      layout, "): resume with the model it was saved from");
      *dst = t;
    }
    return s;
  }
  return KS_ERR("parameter '", slot.name, "' of this model is in none of the optimizer files (", file_list(files),
                "; written under ",
                meta_of(*files.front().file, "written_layout"),
                "): the checkpoint belongs to another model or architecture; resume with the model it was saved from");
}

// The old per-rank format (optim/checkpoint_io.h), for checkpoints written before the stage files.
Status load_legacy(TrainingEngine& engine, const std::string& dir, std::map<std::string, std::string>* metadata) {
  const std::string mine = dir + "/" + engine.optimizer_file_name();
  if (fs::exists(mine) && engine.expert_dp_group())  // that format was never written under expert parallelism
    return KS_ERR(mine, ": the old per-rank optimizer format has no routed experts' state; resume without "
                  "expert_model_parallel_size, or from a checkpoint in the layout-independent format (",
                  optimizer_stage_file_name(0), ", ...)");
  if (fs::exists(mine)) return optim::load_optimizer_state(mine, engine.optimizer(), metadata);
  std::string others;
  std::error_code ec;
  const std::regex pat("optimizer(_tp[0-9]+_dp[0-9]+)?\\.safetensors");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (std::regex_match(it->path().filename().string(), pat))
      others += (others.empty() ? "" : ", ") + it->path().filename().string();
  if (!others.empty())
    return KS_ERR(mine, ": missing; ", dir, " holds the old per-rank optimizer format (", others,
                  ") written under another process layout, which resumes only under that layout: resume with the "
                  "same mpirun -np, tensor_model_parallel_size and use_distributed_optimizer, or from a checkpoint "
                  "written in the layout-independent format (", optimizer_stage_file_name(0), ", ...)");
  return KS_ERR(dir, ": no optimizer state (neither ", optimizer_stage_file_name(0), " nor ",
                engine.optimizer_file_name(), "); the checkpoint is incomplete or not a Kestrel checkpoint");
}

// Writes every slot of `opt` from its validated sources: this rank's tp shard,
// then its owned range of the flat space.
void restore_slots(optim::AdamW& opt, const model::CausalLM& model, const std::vector<SlotSource>& src,
                   int64_t step) {
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const optim::ParamSlot& slot = opt.params()[i];
    const model::Param& p = *model.find_param(slot.name);
    comm::ProcessGroup& tp = model.shard_group(p);  // a routed expert's shard is over etp
    const int64_t off = opt.offsets()[i];
    const auto [lo, hi] = opt.owned_of(i);
    // (vocabulary padding rows zero)
    auto shard = [&](const Tensor& full) {
      return parallel::shard_tensor(full, p.shard, tp.rank(), tp.size(), slot.name, MemCategory::Other).view({-1});
    };
    const Tensor m = shard(src[i].m), v = shard(src[i].v);
    opt.set_moments(i, m.slice_rows(lo - off, hi - off), v.slice_rows(lo - off, hi - off));
    if (src[i].master.defined()) opt.set_master(i, shard(src[i].master));  // after the moments (reuse's flags in v)
  }
  opt.set_step_count(step);
}

Status load_local(TrainingEngine& engine, const std::string& dir, std::map<std::string, std::string>* metadata) {
  KS_ASSIGN(std::vector<StageFile> files, open_stage_files(dir));
  if (files.empty()) return load_legacy(engine, dir, metadata);
  model::CausalLM& model = engine.model();
  // The dense optimizer and, under expert parallelism, the experts' (each
  // slot finds its whole tensors by name, so any layout wrote them).
  std::vector<optim::AdamW*> opts = {&engine.optimizer()};
  if (engine.expert_optimizer()) opts.push_back(engine.expert_optimizer());
  // Validate everything first: a refused load changes nothing.
  std::vector<std::vector<SlotSource>> src(opts.size());
  for (size_t k = 0; k < opts.size(); ++k)
    for (const optim::ParamSlot& slot : opts[k]->params()) {
      const model::Param* p = model.find_param(slot.name);
      KS_CHECK(p, "optimizer checkpoint: optimizer parameter '", slot.name, "' is not a parameter of the model");
      KS_ASSIGN(SlotSource s, find_slot(files, slot, *p));
      src[k].push_back(std::move(s));
    }
  const auto& md0 = files.front().file->metadata();
  const std::string step_s = md0.count("step_count") ? md0.at("step_count") : "";
  char* end = nullptr;
  const long long step = std::strtoll(step_s.c_str(), &end, 10);
  if (step_s.empty() || *end != '\0' || step < 0)
    return KS_ERR(files.front().path, ": metadata step_count '", step_s, "' is not a count; the file is damaged");
  for (size_t k = 0; k < opts.size(); ++k) restore_slots(*opts[k], model, src[k], step);
  if (metadata) *metadata = md0;
  return Status::ok();
}

}  // namespace

Status load_optimizer_checkpoint(TrainingEngine& engine, const std::string& dir,
                                 std::map<std::string, std::string>* metadata) {
  KS_TRY(check_expert_layout(engine.model(), dir));
  comm::ProcessGroup& tp = engine.model().tp();
  comm::ProcessGroup& dp = engine.dp_group();
  Status st;
  try {
    st = load_local(engine, dir, metadata);
  } catch (const Error& e) {
    st = KS_ERR(dir, ": ", e.what());
  }
  if (!all_ok(st.is_ok(), tp, dp))
    return st.is_ok() ? KS_ERR(dir, ": optimizer state not restored: another rank failed (its message is in its log)")
                      : st;
  if (engine.data_parallel()) engine.data_parallel()->gather_params();  // the owned slices were refreshed only
  if (engine.expert_data_parallel()) engine.expert_data_parallel()->gather_params();
  return Status::ok();
}

}  // namespace kestrel::train

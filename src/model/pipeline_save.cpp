#include "model/pipeline_save.h"

#include "model/ep_state.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "io/safetensors.h"
#include "model/ep_state.h"
#include "model/pipeline_params.h"

namespace kestrel::model {

namespace {

namespace fs = std::filesystem;

constexpr int kSaveTag = 7301;  // the pp group's point-to-point tag for exported tensors

// The writer's side: the shard plan, the tensors of the open shards, and the
// first error (after which it still receives every tensor, writing nothing).
class FolderWriter {
 public:
  FolderWriter(std::string dir, DType disk_dtype, size_t max_shard_bytes, const std::vector<PipelineParam>& params)
      : dir_(std::move(dir)), disk_(disk_dtype), max_(max_shard_bytes), names_(params.size()), f32_(params.size()) {
    std::vector<size_t> bytes;
    for (size_t i = 0; i < params.size(); ++i) {
      names_[i] = params[i].name;
      // Buffers stay f32 on disk in every precision (io::NamedTensor::own_dtype, as CausalLM::save).
      f32_[i] = params[i].buffer;
      bytes.push_back(size_t(shape_numel(params[i].full_shape)) * dtype_size(f32_[i] ? DType::F32 : disk_dtype));
      total_ += bytes.back();
    }
    shards_ = io::hf_shard_plan(bytes, max_shard_bytes);
    shard_of_.resize(params.size());
    left_.resize(shards_.size());
    for (size_t s = 0; s < shards_.size(); ++s) {
      left_[s] = shards_[s].size();
      for (size_t i : shards_[s]) shard_of_[i] = s;
    }
    held_.resize(params.size());
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) status_ = KS_ERR("cannot create model folder ", dir_, ": ", ec.message());
  }

  // Tensor i (full HF shape, any float dtype) has arrived; writes its shard
  // when it was the shard's last.
  void add(size_t i, Tensor t) {
    held_[i] = std::move(t);
    const size_t s = shard_of_[i];
    if (--left_[s] > 0) return;
    std::vector<io::NamedTensor> part;
    for (size_t k : shards_[s]) part.push_back({names_[k], held_[k], /*own_dtype=*/bool(f32_[k])});
    if (status_.is_ok()) {
      if (shards_.size() == 1) {
        status_ = io::save_weights_dir(dir_, part, disk_, max_);  // model.safetensors, exactly io's
      } else {
        const std::map<std::string, std::string> meta = {{"format", "pt"}};
        status_ = io::save_safetensors((fs::path(dir_) / io::hf_shard_file_name(s, shards_.size())).string(), part, meta,
                                       &disk_);
      }
    }
    for (size_t k : shards_[s]) held_[k] = Tensor();
  }

  // After the last tensor: the index of a sharded folder, stale files, config.json.
  Status finish(const std::string& config_text) {
    if (!status_.is_ok()) return status_;
    if (shards_.size() > 1) {
      nlohmann::json weight_map = nlohmann::json::object();
      std::set<std::string> keep;
      for (size_t s = 0; s < shards_.size(); ++s) {
        const std::string name = io::hf_shard_file_name(s, shards_.size());
        for (size_t i : shards_[s]) weight_map[names_[i]] = name;
        keep.insert(name);
      }
      nlohmann::json index = {{"metadata", {{"total_size", total_}}}, {"weight_map", weight_map}};
      KS_TRY(write_file_atomic((fs::path(dir_) / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
      keep.insert("model.safetensors.index.json");
      io::remove_stale_weight_files(dir_, keep);
    }
    // As CausalLM::save: config.json last, renamed into place.
    const std::string path = dir_ + "/config.json", tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << config_text;
      f.flush();
      if (!f) return KS_ERR("cannot write ", tmp);
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) return KS_ERR("cannot rename ", tmp, " to ", path, ": ", ec.message());
    return Status::ok();
  }

 private:
  std::string dir_;
  DType disk_;
  size_t max_;
  std::vector<std::string> names_;
  std::vector<char> f32_;  // per tensor: a buffer, written f32 whatever the disk dtype
  size_t total_ = 0;
  std::vector<std::vector<size_t>> shards_;
  std::vector<size_t> shard_of_, left_;
  std::vector<Tensor> held_;  // tensors of shards not yet written
  Status status_ = Status::ok();
};

}  // namespace

Status save_pipelined_model(const CausalLM& stage, const std::string& dir, DType disk_dtype,
                            size_t max_shard_bytes) {
  return save_pipelined_model(std::vector<const CausalLM*>{&stage}, dir, disk_dtype, max_shard_bytes);
}

Status save_pipelined_model(const std::vector<const CausalLM*>& chunks, const std::string& dir, DType disk_dtype,
                            size_t max_shard_bytes) {
  const bool whole = chunks.size() == 1 && chunks[0] && chunks[0]->pp().size() == 1;
  for (const CausalLM* c : chunks)
    if (c && c->ep().size() > 1 && ((whole && max_shard_bytes != kHfShardBytes) || (!whole && c->tp().size() > 1)))
      return KS_ERR(dir, ": not supported yet: saving a model under expert parallelism (expert_model_parallel_size ",
                    c->ep().size(), ") with tensor and pipeline parallelism at once or, without pipeline stages, a "
                    "shard limit other than ", kHfShardBytes, " bytes");
  if (whole && max_shard_bytes == kHfShardBytes) return chunks[0]->save(dir, disk_dtype);
  for (const CausalLM* c : chunks)
    if (c && c->experts_split_apart())
      return KS_ERR(dir, ": not supported yet: saving a pipelined model whose experts are split over "
                    "expert_tensor_parallel_size ", c->etp().size(), " other than tensor_model_parallel_size ",
                    c->tp().size());
  KS_ASSIGN(std::vector<PipelineParam> params, pipeline_params(chunks));
  const CausalLM& any = *chunks[0];
  comm::ProcessGroup& pp = any.pp();
  comm::ProcessGroup& tp = any.tp();
  const int me = pp.rank();
  // Under expert parallelism every ep rank of a stage calls (the experts come
  // from their holders by an ep broadcast); the pp group of ep rank 0 moves
  // the tensors to its first stage, which writes.
  comm::ProcessGroup& ep = any.ep();
  const bool mover = ep.rank() == 0;
  const bool writer = me == 0 && tp.rank() == 0 && mover;
  // The dtype on the wire: the disk dtype when smaller (converted once, by
  // the sender, as the writer would), else the training dtype.
  const DType wire = dtype_size(disk_dtype) < dtype_size(any.dtype()) ? disk_dtype : any.dtype();
  std::optional<FolderWriter> out;
  if (writer) out.emplace(dir, disk_dtype, max_shard_bytes, params);
  bool score_bias = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const PipelineParam& p = params[i];
    score_bias = score_bias || p.name == "score.bias";
    // A buffer travels and lands in f32, as it is kept and written.
    const DType on_wire = p.buffer ? DType::F32 : wire;
    if (p.owner == me && p.ep_owner >= 0) {  // a routed expert: from its ep rank to the stage's ep rank 0 (tp 1)
      RoutedExpertTensor t{p.name, p.full_shape, p.ep_owner, p.local};
      Tensor full = broadcast_expert_tensor(any, t, p.local ? p.local->weight : Tensor(), on_wire);
      if (writer) out->add(i, std::move(full));
      else if (mover) pp.send(full, 0, kSaveTag);
    } else if (!mover) {
      continue;  // another ep rank's pp group: its stage-0 rank does not write
    } else if (p.owner == me) {
      // Every tp rank of the owner stage takes part in the gather; tp rank 0
      // holds the result (at tp 1 the weight itself, as CausalLM::save). A
      // buffer is whole on every tp rank.
      Tensor full = tp.size() == 1 || p.buffer ? p.local->weight : p.chunk->full_tensor(*p.local);
      KS_CHECK(full.shape() == p.full_shape, "save_pipelined_model: '", p.name, "' gathered as ", full.describe(),
               ", the whole model's shape is ", shape_str(p.full_shape));
      if (writer) {
        out->add(i, std::move(full));
      } else if (tp.rank() == 0) {
        // On the host: the writer receives there (it holds at most a shard,
        // and writes from host memory anyway), and host sends go over MPI, tagged.
        Tensor send = full.dtype() == on_wire ? full : full.to(on_wire, MemCategory::Other);
        if (send.device() != Device::CPU) send = send.copy_to(Device::CPU);
        pp.send(send, 0, kSaveTag);
      }
    } else if (writer) {
      Tensor t = Tensor::empty(p.full_shape, on_wire, MemCategory::Other);  // host: the owner sends from the host
      pp.recv(t, p.owner, kSaveTag);
      out->add(i, std::move(t));
    }
  }
  if (!writer) return Status::ok();
  return out->finish(any.hf_config_json(disk_dtype, score_bias));
}

}  // namespace kestrel::model

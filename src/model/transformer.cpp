#include "model/transformer.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/ep_state.h"
#include "model/moe_mlp.h"

namespace kestrel::model {

namespace {

// The shard of a full HF tensor this tp rank keeps (the full tensor at tp = 1).
Param make_param(std::string name, Shape shape, DType dt, Device dev, bool decay, const comm::ProcessGroup& tp,
                 const parallel::TpHeads& heads, int64_t n_kv_heads, int64_t vocab_multiple) {
  Param p;
  p.shard = parallel::hf_shard_spec(name, n_kv_heads);
  if (p.shard.kind == parallel::ShardKind::Vocab) p.shard.pad_multiple = vocab_multiple;
  p.full_shape = shape;
  p.weight = Tensor::zeros(parallel::shard_shape(shape, p.shard, tp.size(), name), dt, MemCategory::Params, dev);
  p.weight_decay = decay;
  if (p.shard.kind == parallel::ShardKind::Replicated) p.norm_counted = tp.rank() == 0;
  if (p.shard.kind == parallel::ShardKind::KvHeads) p.norm_counted = heads.kv_owner;
  p.name = std::move(name);
  return p;
}

constexpr std::string_view kCausalLM = "ForCausalLM", kTokenCls = "ForTokenClassification";

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct FolderConfig {
  io::ModelConfig cfg;
  std::string file;                 // the config.json read, for messages
  std::string class_name;           // architectures[0] as written
  bool token_classification = false;
  double initializer_range = 0.02;  // transformers' PretrainedConfig default
};

// config.json of a causal LM or of its <Arch>ForTokenClassification value
// model. io/ parses causal LMs only; the backbone of both is the same, so a
// value model's class name is mapped to its causal LM's before parsing.
Result<FolderConfig> read_folder_config(const std::string& dir) {
  namespace fs = std::filesystem;
  FolderConfig fc;
  std::error_code ec;
  fc.file = fs::is_directory(dir, ec) ? (fs::path(dir) / "config.json").string() : dir;
  auto text = read_file(fc.file);
  nlohmann::json j;
  if (text.is_ok()) j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!text.is_ok() || j.is_discarded() || !j.is_object()) {  // io's messages for unreadable or malformed files
    KS_ASSIGN(fc.cfg, io::load_model_config(dir));
    return fc;
  }
  if (j.contains("initializer_range") && j["initializer_range"].is_number())
    fc.initializer_range = j["initializer_range"].get<double>();
  auto arch = j.find("architectures");
  if (arch != j.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string()) {
    fc.class_name = (*arch)[0].get<std::string>();
    if (ends_with(fc.class_name, kTokenCls)) {
      fc.token_classification = true;
      // transformers: num_labels, else the size of id2label, else PretrainedConfig's default of 2.
      int64_t n = 2;
      if (j.contains("num_labels") && j["num_labels"].is_number_integer()) n = j["num_labels"].get<int64_t>();
      else if (j.contains("id2label") && j["id2label"].is_object()) n = int64_t(j["id2label"].size());
      if (n != 1)
        return KS_ERR(fc.file, ": key 'num_labels' is ", n, " for ", fc.class_name,
                      "; a value model (PPO critic) has num_labels 1, one value per token: set \"num_labels\": 1");
      (*arch)[0] = fc.class_name.substr(0, fc.class_name.size() - kTokenCls.size()) + std::string(kCausalLM);
    }
  }
  // A causal LM's text is parsed as written (exactly io::load_model_config).
  auto cfg = io::parse_model_config(fc.token_classification ? j.dump() : *text, fc.file);
  if (!cfg.is_ok() && fc.token_classification)
    return KS_ERR(cfg.status().message(), " (", fc.class_name, " is read as the value head on its causal LM's backbone)");
  KS_ASSIGN(fc.cfg, std::move(cfg));
  return fc;
}

// What transformers writes for <Arch>ForTokenClassification with one label;
// classifier_dropout 0 as verl's critic sets it (Kestrel applies no dropout).
std::string value_model_config_json(const io::ModelConfig& cfg, bool bias) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(io::model_config_to_json(cfg));
  std::string name = io::arch_name(cfg.arch);
  if (ends_with(name, kCausalLM)) name = name.substr(0, name.size() - kCausalLM.size());
  j["architectures"] = {name + std::string(kTokenCls)};
  j["num_labels"] = 1;
  j["id2label"] = {{"0", "LABEL_0"}};
  j["label2id"] = {{"LABEL_0", 0}};
  j["classifier_dropout"] = 0.0;
  j["token_classification_bias"] = bias;
  return j.dump(2) + "\n";
}

// w = float(std * N(0, 1)) with element i drawn from Philox{seed, stream} at
// counter i, rounded to w's dtype as copy_from rounds (nearest even).
void fill_normal(Tensor& w, uint64_t seed, uint64_t stream, double std) {
  const Philox rng{seed, stream};
  std::vector<float> v(size_t(w.numel()));
  // Each value depends only on its index (Philox is counter-based), so the
  // threads change nothing but the time (serial, a 1.5B model's draws outlived a
  // 90 s benchmark limit on the H200's host).
  const int64_t n = int64_t(v.size());
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n > (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(std * rng.normal(uint64_t(i)));
  w.copy_from(Tensor::from_host(v, w.shape()));
}

}  // namespace

CausalLM::CausalLM(io::ModelConfig cfg, ModelOptions opts) : cfg_(std::move(cfg)), opts_(std::move(opts)) {
  KS_CHECK(opts_.dtype == DType::F32 || opts_.dtype == DType::BF16, "model dtype must be f32 or bf16, got ",
           dtype_name(opts_.dtype));
  KS_CHECK(opts_.parallel.tp != nullptr, "ModelParallel.tp must be a process group (size 1 for no tp)");
  KS_CHECK(opts_.parallel.ep != nullptr, "ModelParallel.ep must be a process group (size 1 for no ep)");
  KS_CHECK(opts_.value_head || !opts_.value_head_bias, "value_head_bias needs value_head");
  check_chunks();
  KS_CHECK(opts_.make_vocab_size_divisible_by >= 1, "make_vocab_size_divisible_by must be >= 1, got ",
           opts_.make_vocab_size_divisible_by);
  const int n = opts_.parallel.tp->size(), r = opts_.parallel.tp->rank();
  // An etp group of tp's size is tp's (the grid's default order gives the same ranks).
  if (opts_.parallel.etp && opts_.parallel.etp->size() == n) opts_.parallel.etp.reset();
  heads_ = parallel::tp_heads(cfg_.num_attention_heads, cfg_.num_key_value_heads, r, n);
  padded_vocab_ = parallel::padded_vocab_size(cfg_.vocab_size, opts_.make_vocab_size_divisible_by, n);
  vocab_ = parallel::vocab_range(padded_vocab_, r, n);
  if (cp_size() > 1 && (cfg_.moe.num_experts > 0 || cfg_.mla.enabled))
    KS_FAIL("not supported yet: context parallelism (context_parallel_size ", cp_size(), ") for ",
            io::arch_name(cfg_.arch), " (", cfg_.moe.num_experts > 0 ? "mixture-of-experts" : "latent attention",
            " layers: the router losses and statistics would see a rank's share of each sequence); train it with "
            "context_parallel_size 1");
  if (cp_size() > 1)
    parallel::check_cp_heads(cfg_.num_attention_heads, cfg_.num_key_value_heads, n, cp_size(),
                             cp_groups()->ulysses_degree())
        .throw_if_error();
  if (cfg_.intermediate_size % n != 0)
    KS_FAIL("intermediate_size ", cfg_.intermediate_size, " does not divide by tensor_model_parallel_size ", n,
            "; choose a tp size dividing it");
  allocate_params();
  build_rope();
  // One statistics entry per MoE layer the slice holds, in layer order, from
  // the start: every dp rank reduces the same entries even when its forwards
  // saw no tokens (TrainingEngine::reduced_moe_stats).
  for (const auto& b : blocks_)
    if (cfg_.is_moe_layer(b->index()))
      moe_stats_.layers.push_back(
          MoeLayerStats{b->index(), std::vector<int64_t>(size_t(cfg_.moe.num_experts), 0), 0, 0, 0, 0, 0});
}

void CausalLM::check_chunks() {
  const int64_t L = cfg_.num_hidden_layers;
  if (opts_.chunks.empty()) {
    if (opts_.num_layers < 0) opts_.num_layers = L - opts_.first_layer;
    opts_.chunks = {{opts_.first_layer, opts_.num_layers}};
  }
  int64_t next = 0;  // chunks ascend and do not overlap
  for (const auto& ch : opts_.chunks) {
    KS_CHECK(ch.first_layer >= next && ch.num_layers >= 0 && ch.first_layer + ch.num_layers <= L,
             "model slice: layers [", ch.first_layer, ", ", ch.first_layer + ch.num_layers,
             ") are outside num_hidden_layers ", L, " or overlap the previous chunk");
    next = ch.first_layer + ch.num_layers;
  }
  const auto& first = opts_.chunks.front();
  const auto& last = opts_.chunks.back();
  opts_.first_layer = first.first_layer;
  opts_.num_layers = 0;
  for (const auto& ch : opts_.chunks) opts_.num_layers += ch.num_layers;
  KS_CHECK(!opts_.has_embedding || first.first_layer == 0, "model slice: the embedding feeds layer 0, but the slice "
           "starts at layer ", first.first_layer, " (set has_embedding only on the first slice)");
  KS_CHECK(!opts_.has_head || last.first_layer + last.num_layers == L, "model slice: the head follows layer ", L - 1,
           ", but the slice ends at layer ", last.first_layer + last.num_layers - 1,
           " (set has_head only on the last slice)");
}

void CausalLM::allocate_params() {
  const auto& c = cfg_;
  const DType dt = opts_.dtype;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const auto make_param = [&](std::string name, Shape shape, DType t, bool decay) {
    const comm::ProcessGroup& g = is_routed_expert_param(name) ? etp() : tp();
    return model::make_param(std::move(name), std::move(shape), t, opts_.device, decay, g, heads_,
                             c.num_key_value_heads, opts_.make_vocab_size_divisible_by);
  };
  const bool tied_head = opts_.has_head && !opts_.value_head && c.tie_word_embeddings;
  if (opts_.has_embedding || tied_head) embed_ = make_param("model.embed_tokens.weight", {V, D}, dt, true);
  // The last stage's copy of a tied embedding (Megatron's shared embedding)
  // is the first stage's parameter again: counted once in the gradient norm.
  if (!opts_.has_embedding && tied_head) embed_.norm_counted = false;
  BlockDims dims;
  dims.D = D;
  dims.F = local_ffn();
  dims.hd = c.head_dim;
  dims.heads = heads_;
  dims.eps = float(c.rms_norm_eps);
  dims.dtype = dt;
  dims.device = opts_.device;
  dims.moe = opts_.moe;
  dims.tp = opts_.parallel.tp->size();
  dims.etp = etp().size();
  dims.ep = opts_.parallel.ep ? opts_.parallel.ep->size() : 1;
  dims.ep_rank = opts_.parallel.ep ? opts_.parallel.ep->rank() : 0;
  const ParamFactory factory = [&](std::string name, Shape shape, bool decay) {
    return make_param(std::move(name), std::move(shape), dt, decay);
  };
  blocks_.reserve(size_t(opts_.num_layers));
  chunk_begin_ = {0};
  for (const auto& ch : opts_.chunks) {
    for (int64_t i = ch.first_layer; i < ch.first_layer + ch.num_layers; ++i)
      blocks_.push_back(std::make_unique<Block>(c, dims, i, factory));
    chunk_begin_.push_back(int64_t(blocks_.size()));
  }
  if (!opts_.has_head) return;
  final_norm_ = make_param("model.norm.weight", {D}, dt, false);
  if (opts_.value_head) {
    // Replicated under tp (hf_shard_spec: any name not sharded), decayed like any linear weight.
    score_ = make_param("score.weight", {1, D}, dt, true);
    if (opts_.value_head_bias) score_bias_ = make_param("score.bias", {1}, dt, false);
  } else if (!c.tie_word_embeddings) {
    lm_head_ = make_param("lm_head.weight", {V, D}, dt, true);
  }
}

void CausalLM::build_rope() {
  int64_t n = opts_.max_positions > 0 ? opts_.max_positions : cfg_.max_position_embeddings;
  KS_CHECK(n > 0, "max_position_embeddings must be positive");
  ops::RopeConfig rc = cfg_.rope;
  if (cfg_.mla.enabled) rc.interleaved = cfg_.mla.rope_interleave;  // DeepSeek rotates interleaved pairs
  rope_ = ops::rope_table_to(ops::make_rope_table(rc, n), opts_.device);
}

std::vector<Param*> CausalLM::params() {
  std::vector<Param*> out;
  if (!embed_.name.empty()) out.push_back(&embed_);
  for (auto& b : blocks_)
    for (Param* p : b->params()) out.push_back(p);
  for (Param* p : {&final_norm_, &lm_head_, &score_, &score_bias_})
    if (!p->name.empty()) out.push_back(p);  // allocated (its weight may be released)
  return out;
}

std::vector<Param*> CausalLM::buffers() {
  std::vector<Param*> out;
  for (auto& b : blocks_)
    for (Param* p : b->buffers()) out.push_back(p);
  return out;
}

std::vector<Param*> CausalLM::state_tensors() {
  std::vector<Param*> out = params();
  for (Param* p : buffers()) out.push_back(p);
  return out;
}

int64_t CausalLM::num_moe_layers() const { return model::num_moe_layers(cfg_); }

void CausalLM::update_moe_correction_bias(const MoeStepStats& step, double rate) {
  for (const MoeLayerStats& s : step.layers)
    for (auto& b : blocks_) {
      if (b->index() != s.layer) continue;
      auto* moe = dynamic_cast<MoeMlp*>(&b->mlp());
      if (moe && moe->has_correction_bias()) moe->update_correction_bias(s.tokens_per_expert, rate);
    }
}

comm::ProcessGroup& CausalLM::shard_group(const Param& p) const {
  return is_routed_expert_param(p.name) ? etp() : tp();
}

Tensor CausalLM::full_tensor(const Param& p) const {
  return parallel::gather_tensor(shard_group(p), p.weight, p.shard, p.full_shape);
}

int64_t CausalLM::grad_stage(const Param& p) const {
  static const std::string kLayers = "model.layers.";
  if (p.name.compare(0, kLayers.size(), kLayers) == 0) return std::stoll(p.name.substr(kLayers.size()));
  if (&p == &embed_ && opts_.has_embedding) return -1;  // also the tied lm_head
  return cfg_.num_hidden_layers;  // final norm, untied lm_head, a head slice's copy of the tied embedding
}

Param* CausalLM::find_param(const std::string& name) {
  for (Param* p : params())
    if (p->name == name) return p;
  return nullptr;
}

int64_t CausalLM::num_parameters() const {
  int64_t n = 0;
  for (Param* p : const_cast<CausalLM*>(this)->params()) n += p->weight.numel();
  return n;
}

void CausalLM::enable_grads() {
  for (Param* p : params())
    if (!p->grad.defined()) p->grad = Tensor::zeros(p->weight.shape(), DType::F32, MemCategory::Grads, device());
}

void CausalLM::zero_grads() {
  for (Param* p : params())
    if (p->grad.defined()) p->grad.zero_();
}

std::unique_ptr<CausalLM> CausalLM::init_random(const io::ModelConfig& cfg, const ModelOptions& opts, uint64_t seed,
                                                double init_std) {
  std::unique_ptr<CausalLM> m(new CausalLM(cfg, opts));
  KS_CHECK(m->ep().size() == 1, "not supported yet: random initialisation under expert parallelism "
           "(expert_model_parallel_size ", m->ep().size(), "): load the weights from a folder instead");
  // Each tensor draws from the Philox stream of its place in the whole
  // model's params() (embedding 1, then the layers, then the head), so a
  // slice holds exactly the values of the same tensors of the whole model.
  // Layer i's first stream: 2 + the tensors of the layers before it (dense
  // models: 2 + i * per-layer count; MoE models mix dense and MoE layers).
  const int64_t L = cfg.num_hidden_layers;
  std::vector<uint64_t> layer_stream(size_t(L) + 1, 2);
  for (int64_t i = 0; i < L; ++i) layer_stream[size_t(i) + 1] = layer_stream[size_t(i)] + uint64_t(Block::param_count(cfg, i));
  std::vector<std::pair<Param*, uint64_t>> draws;
  if (m->embed_.weight.defined()) draws.push_back({&m->embed_, 1});
  for (auto& b : m->blocks_) {
    uint64_t j = 0;
    for (Param* p : b->params()) draws.push_back({p, layer_stream[size_t(b->index())] + j++});
  }
  uint64_t head_stream = layer_stream[size_t(L)];
  for (Param* p : {&m->final_norm_, &m->lm_head_, &m->score_, &m->score_bias_})
    if (p->weight.defined()) draws.push_back({p, head_stream++});
  for (auto [p, stream] : draws) {
    comm::ProcessGroup& tp = m->shard_group(*p);
    const bool is_norm = p->name.find("norm") != std::string::npos;
    const bool is_bias = p->name.size() >= 5 && p->name.compare(p->name.size() - 5, 5, ".bias") == 0;
    if (is_norm) {
      p->weight.fill_(1.0f);
    } else if (is_bias) {
      p->weight.zero_();
    } else {
      // Under tp the full tensor is drawn (same values as one process) and cut.
      Tensor full = tp.size() == 1 ? p->weight : Tensor::empty(p->full_shape, p->weight.dtype(), MemCategory::Other);
      fill_normal(full, seed, stream, init_std);
      if (tp.size() > 1) {
        Tensor shard = parallel::shard_tensor(full, p->shard, tp.rank(), tp.size(), p->name);
        if (m->opts_.device == Device::CPU) p->weight = std::move(shard);
        else p->weight.copy_from(shard);  // allocated on the device by the constructor
      }
    }
  }
  return m;
}

Result<std::unique_ptr<CausalLM>> CausalLM::load(const std::string& dir, const ModelOptions& opts) {
  KS_ASSIGN(FolderConfig fc, read_folder_config(dir));
  if (fc.token_classification && !opts.value_head)
    return KS_ERR(fc.file, ": architectures[0] is \"", fc.class_name,
                  "\", a value model (score head, no lm_head); load it as a critic (ModelOptions::value_head) "
                  "or point at a causal LM folder");
  KS_ASSIGN(io::WeightSource src, io::WeightSource::open_dir(dir));
  ModelOptions o = opts;
  if (o.value_head && src.contains("score.bias")) o.value_head_bias = true;
  std::unique_ptr<CausalLM> m(new CausalLM(fc.cfg, o));
  for (Param* p : m->params()) {
    comm::ProcessGroup& tp = m->shard_group(*p);
    const bool head = p == &m->score_ || p == &m->score_bias_;
    if (head && !src.contains(p->name)) {
      // An actor checkpoint: a fresh head, as HF's _init_weights (normal
      // weight, zero bias). Replicated: every tp rank draws the same values.
      if (p == &m->score_bias_) continue;  // zeros already
      fill_normal(p->weight, o.value_head_seed, 0, fc.initializer_range);
      continue;
    }
    // Every rank reads the full tensor and keeps its shard (mmap'd files: only
    // the shard's pages stay hot).
    KS_ASSIGN(Tensor t, src.load(p->name, p->full_shape, opts.dtype,
                                 tp.size() == 1 ? MemCategory::Params : MemCategory::Other));
    Tensor shard = tp.size() == 1 ? std::move(t) : parallel::shard_tensor(t, p->shard, tp.rank(), tp.size(), p->name);
    if (o.device == Device::CPU) p->weight = std::move(shard);
    else p->weight.copy_from(shard);  // allocated on the device by the constructor
  }
  // Buffers keep their own dtype (f32), whatever the folder stores them in.
  for (Param* p : m->buffers()) {
    if (!src.contains(p->name))
      return KS_ERR(dir, ": the weights have no '", p->name, "' (", io::arch_name(fc.cfg.arch),
                    " keeps it beside the router; save the model with transformers or Kestrel)");
    KS_ASSIGN(Tensor t, src.load(p->name, p->full_shape, p->weight.dtype()));
    if (o.device == Device::CPU) p->weight = std::move(t);
    else p->weight.copy_from(t);
  }
  return m;
}

std::string CausalLM::hf_config_json(DType disk_dtype, bool score_bias) const {
  io::ModelConfig cfg = cfg_;
  cfg.torch_dtype = disk_dtype == DType::BF16 ? "bfloat16" : disk_dtype == DType::F16 ? "float16" : "float32";
  return opts_.value_head ? value_model_config_json(cfg, score_bias) : io::model_config_to_json(cfg);
}

Status CausalLM::save(const std::string& dir, DType disk_dtype) const {
  namespace fs = std::filesystem;
  std::vector<io::NamedTensor> tensors;
  for (Param* p : const_cast<CausalLM*>(this)->params())
    tensors.push_back({p->name, shard_group(*p).size() == 1 ? p->weight : full_tensor(*p)});
  for (Param* p : const_cast<CausalLM*>(this)->buffers())  // f32 on disk in every precision, as HF keeps them
    tensors.push_back({p->name, p->weight, /*own_dtype=*/true});
  // Under expert parallelism the other ranks' experts come to ep rank 0 (collective over the ep group),
  // in the disk dtype when smaller, as a pipeline stage sends its tensors; under tp each is first
  // gathered whole on its owners (the ranks of an etp = tp group hold the same experts).
  if (ep().size() > 1) {
    const DType wire = dtype_size(disk_dtype) < dtype_size(dtype()) ? disk_dtype : dtype();
    for (const RoutedExpertTensor& t : routed_expert_tensors(*this)) {
      const Tensor mine = !t.local ? Tensor() : etp().size() > 1 ? full_tensor(*t.local) : t.local->weight;  // over etp
      Tensor full = broadcast_expert_tensor(*this, t, mine, wire);
      if (!t.local && ep().rank() == 0) tensors.push_back({t.name, std::move(full)});
    }
  }
  // tp (and ep, and etp) rank 0 writes the gathered model.
  if (tp().rank() != 0 || ep().rank() != 0 || etp().rank() != 0) return Status::ok();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return KS_ERR("cannot create model folder ", dir, ": ", ec.message());
  KS_TRY(io::save_weights_dir(dir, tensors, disk_dtype));
  const std::string path = dir + "/config.json", tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << hf_config_json(disk_dtype, score_bias_.weight.defined());
    f.flush();
    if (!f) return KS_ERR("cannot write ", tmp);
  }
  fs::rename(tmp, path, ec);
  if (ec) return KS_ERR("cannot rename ", tmp, " to ", path, ": ", ec.message());
  return Status::ok();
}

}  // namespace kestrel::model

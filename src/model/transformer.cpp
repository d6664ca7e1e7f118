#include "model/transformer.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "core/rng.h"
#include "io/safetensors.h"

namespace kestrel::model {

namespace {

// The shard of a full HF tensor this tp rank keeps (the full tensor at tp = 1).
Param make_param(std::string name, Shape shape, DType dt, bool decay, const comm::ProcessGroup& tp,
                 const parallel::TpHeads& heads, int64_t n_kv_heads) {
  Param p;
  p.shard = parallel::hf_shard_spec(name, n_kv_heads);
  p.full_shape = shape;
  p.weight = Tensor::zeros(parallel::shard_shape(shape, p.shard, tp.size(), name), dt, MemCategory::Params);
  p.weight_decay = decay;
  if (p.shard.kind == parallel::ShardKind::Replicated) p.norm_counted = tp.rank() == 0;
  if (p.shard.kind == parallel::ShardKind::KvHeads) p.norm_counted = heads.kv_owner;
  p.name = std::move(name);
  return p;
}

bool has_o_bias(const io::ModelConfig& c) { return c.attention_bias && c.arch != io::Arch::Qwen2; }

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

}  // namespace

CausalLM::CausalLM(io::ModelConfig cfg, ModelOptions opts) : cfg_(std::move(cfg)), opts_(std::move(opts)) {
  KS_CHECK(opts_.dtype == DType::F32 || opts_.dtype == DType::BF16, "model dtype must be f32 or bf16, got ",
           dtype_name(opts_.dtype));
  KS_CHECK(opts_.parallel.tp != nullptr, "ModelParallel.tp must be a process group (size 1 for no tp)");
  KS_CHECK(opts_.value_head || !opts_.value_head_bias, "value_head_bias needs value_head");
  const int n = opts_.parallel.tp->size(), r = opts_.parallel.tp->rank();
  heads_ = parallel::tp_heads(cfg_.num_attention_heads, cfg_.num_key_value_heads, r, n);
  vocab_ = parallel::vocab_range(cfg_.vocab_size, r, n);
  if (cfg_.intermediate_size % n != 0)
    KS_FAIL("intermediate_size ", cfg_.intermediate_size, " does not divide by tensor_model_parallel_size ", n,
            "; choose a tp size dividing it");
  allocate_params();
  build_rope();
}

void CausalLM::allocate_params() {
  const auto& c = cfg_;
  const DType dt = opts_.dtype;
  const int64_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const auto make_param = [&](std::string name, Shape shape, DType t, bool decay) {
    return model::make_param(std::move(name), std::move(shape), t, decay, *opts_.parallel.tp, heads_,
                             c.num_key_value_heads);
  };
  embed_ = make_param("model.embed_tokens.weight", {V, D}, dt, true);
  layers_.resize(size_t(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto& L = layers_[size_t(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    L.input_norm = make_param(p + "input_layernorm.weight", {D}, dt, false);
    L.post_norm = make_param(p + "post_attention_layernorm.weight", {D}, dt, false);
    L.q = make_param(p + "self_attn.q_proj.weight", {c.q_dim(), D}, dt, true);
    L.k = make_param(p + "self_attn.k_proj.weight", {c.kv_dim(), D}, dt, true);
    L.v = make_param(p + "self_attn.v_proj.weight", {c.kv_dim(), D}, dt, true);
    L.o = make_param(p + "self_attn.o_proj.weight", {D, c.q_dim()}, dt, true);
    if (c.attention_bias) {
      L.q_bias = make_param(p + "self_attn.q_proj.bias", {c.q_dim()}, dt, false);
      L.k_bias = make_param(p + "self_attn.k_proj.bias", {c.kv_dim()}, dt, false);
      L.v_bias = make_param(p + "self_attn.v_proj.bias", {c.kv_dim()}, dt, false);
    }
    if (has_o_bias(c)) L.o_bias = make_param(p + "self_attn.o_proj.bias", {D}, dt, false);
    if (c.qk_norm) {
      L.q_norm = make_param(p + "self_attn.q_norm.weight", {c.head_dim}, dt, false);
      L.k_norm = make_param(p + "self_attn.k_norm.weight", {c.head_dim}, dt, false);
    }
    L.gate = make_param(p + "mlp.gate_proj.weight", {F, D}, dt, true);
    L.up = make_param(p + "mlp.up_proj.weight", {F, D}, dt, true);
    L.down = make_param(p + "mlp.down_proj.weight", {D, F}, dt, true);
    if (c.mlp_bias) {
      L.gate_bias = make_param(p + "mlp.gate_proj.bias", {F}, dt, false);
      L.up_bias = make_param(p + "mlp.up_proj.bias", {F}, dt, false);
      L.down_bias = make_param(p + "mlp.down_proj.bias", {D}, dt, false);
    }
  }
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
  rope_ = ops::make_rope_table(cfg_.rope, n);
}

std::vector<Param*> CausalLM::params() {
  std::vector<Param*> out;
  out.push_back(&embed_);
  for (auto& L : layers_) {
    for (Param* p : {&L.input_norm, &L.q, &L.q_bias, &L.k, &L.k_bias, &L.v, &L.v_bias, &L.o, &L.o_bias, &L.q_norm,
                     &L.k_norm, &L.post_norm, &L.gate, &L.gate_bias, &L.up, &L.up_bias, &L.down, &L.down_bias})
      if (p->weight.defined()) out.push_back(p);
  }
  out.push_back(&final_norm_);
  for (Param* p : {&lm_head_, &score_, &score_bias_})
    if (p->weight.defined()) out.push_back(p);
  return out;
}

Tensor CausalLM::full_tensor(const Param& p) const {
  return parallel::gather_tensor(tp(), p.weight, p.shard, p.full_shape);
}

int64_t CausalLM::grad_stage(const Param& p) const {
  static const std::string kLayers = "model.layers.";
  if (p.name.compare(0, kLayers.size(), kLayers) == 0) return std::stoll(p.name.substr(kLayers.size()));
  if (&p == &embed_) return -1;  // also the tied lm_head
  return cfg_.num_hidden_layers;   // final norm, untied lm_head
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
    if (!p->grad.defined()) p->grad = Tensor::zeros(p->weight.shape(), DType::F32, MemCategory::Grads);
}

void CausalLM::zero_grads() {
  for (Param* p : params())
    if (p->grad.defined()) p->grad.zero_();
}

std::unique_ptr<CausalLM> CausalLM::init_random(const io::ModelConfig& cfg, const ModelOptions& opts, uint64_t seed,
                                                double init_std) {
  std::unique_ptr<CausalLM> m(new CausalLM(cfg, opts));
  uint64_t stream = 0;
  comm::ProcessGroup& tp = m->tp();
  for (Param* p : m->params()) {
    ++stream;
    const bool is_norm = p->name.find("norm") != std::string::npos;
    const bool is_bias = p->name.size() >= 5 && p->name.compare(p->name.size() - 5, 5, ".bias") == 0;
    if (is_norm) {
      p->weight.fill_(1.0f);
    } else if (is_bias) {
      p->weight.zero_();
    } else {
      // Under tp the full tensor is drawn (same values as one process) and cut.
      Tensor full = tp.size() == 1 ? p->weight : Tensor::empty(p->full_shape, p->weight.dtype(), MemCategory::Other);
      Philox rng{seed, stream};
      for (int64_t i = 0; i < full.numel(); ++i) full.set(i, float(init_std * rng.normal(uint64_t(i))));
      if (tp.size() > 1) p->weight = parallel::shard_tensor(full, p->shard, tp.rank(), tp.size(), p->name);
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
  comm::ProcessGroup& tp = m->tp();
  for (Param* p : m->params()) {
    const bool head = p == &m->score_ || p == &m->score_bias_;
    if (head && !src.contains(p->name)) {
      // An actor checkpoint: a fresh head, as HF's _init_weights (normal
      // weight, zero bias). Replicated: every tp rank draws the same values.
      if (p == &m->score_bias_) continue;  // zeros already
      Philox rng{o.value_head_seed, 0};
      for (int64_t i = 0; i < p->weight.numel(); ++i)
        p->weight.set(i, float(fc.initializer_range * rng.normal(uint64_t(i))));
      continue;
    }
    // Every rank reads the full tensor and keeps its shard (mmap'd files: only
    // the shard's pages stay hot).
    KS_ASSIGN(Tensor t, src.load(p->name, p->full_shape, opts.dtype,
                                 tp.size() == 1 ? MemCategory::Params : MemCategory::Other));
    p->weight = tp.size() == 1 ? std::move(t) : parallel::shard_tensor(t, p->shard, tp.rank(), tp.size(), p->name);
  }
  return m;
}

Status CausalLM::save(const std::string& dir, DType disk_dtype) const {
  namespace fs = std::filesystem;
  std::vector<io::NamedTensor> tensors;
  for (Param* p : const_cast<CausalLM*>(this)->params())
    tensors.push_back({p->name, tp().size() == 1 ? p->weight : full_tensor(*p)});
  if (tp().rank() != 0) return Status::ok();  // tp rank 0 writes the gathered model
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return KS_ERR("cannot create model folder ", dir, ": ", ec.message());
  KS_TRY(io::save_weights_dir(dir, tensors, disk_dtype));
  io::ModelConfig cfg = cfg_;
  cfg.torch_dtype = disk_dtype == DType::BF16 ? "bfloat16" : disk_dtype == DType::F16 ? "float16" : "float32";
  const std::string path = dir + "/config.json", tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << (opts_.value_head ? value_model_config_json(cfg, score_bias_.weight.defined()) : io::model_config_to_json(cfg));
    f.flush();
    if (!f) return KS_ERR("cannot write ", tmp);
  }
  fs::rename(tmp, path, ec);
  if (ec) return KS_ERR("cannot rename ", tmp, " to ", path, ": ", ec.message());
  return Status::ok();
}

}  // namespace kestrel::model

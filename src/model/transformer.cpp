#include "model/transformer.h"

#include <filesystem>
#include <fstream>

#include "core/rng.h"
#include "io/safetensors.h"

namespace kestrel::model {

namespace {

Param make_param(std::string name, Shape shape, DType dt, bool decay) {
  Param p;
  p.name = std::move(name);
  p.weight = Tensor::zeros(std::move(shape), dt, MemCategory::Params);
  p.weight_decay = decay;
  return p;
}

bool has_o_bias(const io::ModelConfig& c) { return c.attention_bias && c.arch != io::Arch::Qwen2; }

}  // namespace

CausalLM::CausalLM(io::ModelConfig cfg, ModelOptions opts) : cfg_(std::move(cfg)), opts_(std::move(opts)) {
  KS_CHECK(opts_.dtype == DType::F32 || opts_.dtype == DType::BF16, "model dtype must be f32 or bf16, got ",
           dtype_name(opts_.dtype));
  if (opts_.parallel.tp->size() > 1)
    KS_FAIL("not supported yet: tensor_model_parallel_size=", opts_.parallel.tp->size(), " in the model layer");
  allocate_params();
  build_rope();
}

void CausalLM::allocate_params() {
  const auto& c = cfg_;
  const DType dt = opts_.dtype;
  const int64_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
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
  if (!c.tie_word_embeddings) lm_head_ = make_param("lm_head.weight", {V, D}, dt, true);
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
  if (lm_head_.weight.defined()) out.push_back(&lm_head_);
  return out;
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
  for (Param* p : m->params()) {
    ++stream;
    const bool is_norm = p->name.find("norm") != std::string::npos;
    const bool is_bias = p->name.size() >= 5 && p->name.compare(p->name.size() - 5, 5, ".bias") == 0;
    if (is_norm) {
      p->weight.fill_(1.0f);
    } else if (is_bias) {
      p->weight.zero_();
    } else {
      Philox rng{seed, stream};
      for (int64_t i = 0; i < p->weight.numel(); ++i) p->weight.set(i, float(init_std * rng.normal(uint64_t(i))));
    }
  }
  return m;
}

Result<std::unique_ptr<CausalLM>> CausalLM::load(const std::string& dir, const ModelOptions& opts) {
  KS_ASSIGN(io::ModelConfig cfg, io::load_model_config(dir));
  KS_ASSIGN(io::WeightSource src, io::WeightSource::open_dir(dir));
  std::unique_ptr<CausalLM> m(new CausalLM(cfg, opts));
  for (Param* p : m->params()) {
    KS_ASSIGN(Tensor t, src.load(p->name, p->weight.shape(), opts.dtype, MemCategory::Params));
    p->weight = std::move(t);
  }
  return m;
}

Status CausalLM::save(const std::string& dir, DType disk_dtype) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return KS_ERR("cannot create model folder ", dir, ": ", ec.message());
  std::vector<io::NamedTensor> tensors;
  for (Param* p : const_cast<CausalLM*>(this)->params()) tensors.push_back({p->name, p->weight});
  KS_TRY(io::save_weights_dir(dir, tensors, disk_dtype));
  io::ModelConfig cfg = cfg_;
  cfg.torch_dtype = disk_dtype == DType::BF16 ? "bfloat16" : disk_dtype == DType::F16 ? "float16" : "float32";
  const std::string path = dir + "/config.json", tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << io::model_config_to_json(cfg);
    f.flush();
    if (!f) return KS_ERR("cannot write ", tmp);
  }
  fs::rename(tmp, path, ec);
  if (ec) return KS_ERR("cannot rename ", tmp, " to ", path, ": ", ec.message());
  return Status::ok();
}

}  // namespace kestrel::model

#include "data/config_options.h"

#include <cstdlib>

#include "config/schema.h"

namespace kestrel::data {

Result<RlDatasetOptions> rl_dataset_options(const config::Config& cfg, bool validation) {
  RlDatasetOptions o;
  o.prompt_key = cfg.get_string("data.prompt_key");
  o.max_prompt_length = cfg.get_int("data.max_prompt_length");
  o.filter_overlong_prompts = cfg.get_bool("data.filter_overlong_prompts");
  KS_ASSIGN(o.truncation, parse_truncation(cfg.get_string("data.truncation"), "data.truncation"));
  if (config::find_key("data.skip_malformed")) o.skip_malformed = cfg.get_bool("data.skip_malformed");
  o.max_samples = cfg.get_int(validation ? "data.val_max_samples" : "data.train_max_samples");
  o.chat_kwargs = cfg.get_map("data.apply_chat_template_kwargs");
  if (o.max_prompt_length <= 0) return KS_ERR("data.max_prompt_length must be positive, got ", o.max_prompt_length);
  return o;
}

uint64_t data_seed(const config::Config& cfg) {
  return cfg.is_null("data.seed") ? 1 : uint64_t(cfg.get_int("data.seed"));
}

std::vector<std::string> expand_paths(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  const char* home = std::getenv("HOME");
  for (const auto& p : paths) out.push_back(p.rfind("~/", 0) == 0 && home ? std::string(home) + p.substr(1) : p);
  return out;
}

}  // namespace kestrel::data

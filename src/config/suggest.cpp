// "did you mean" for mistyped keys.
#include <algorithm>
#include <tuple>

#include "config/config.h"

namespace kestrel::config {

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string_view last_component(std::string_view p) {
  const size_t dot = p.rfind('.');
  return dot == std::string_view::npos ? p : p.substr(dot + 1);
}

// Typos up to about one edit in four characters count as "close".
size_t budget(std::string_view s) { return std::max<size_t>(2, s.size() / 4); }

// verl's renamed keys (deprecations in verl/workers/config/*.py, the FSDP and
// Megatron trees' names for one thing): a path ending in `from` suggests the
// same path ending in `to`, when that exists.
struct Rename {
  const char* from;
  const char* to;
};
constexpr Rename kRenames[] = {
    {"optim.grad_clip", "optim.clip_grad"},  // optimizer.py: grad_clip is deprecated
    {"optim.grad_clip", "grad_clip"},
    {"grad_clip", "optim.clip_grad"},
    {"optim.clip_grad", "grad_clip"},
    {"optim.warmup_style", "optim.lr_scheduler_type"},
    {"optim.lr_scheduler", "optim.lr_scheduler_type"},
    {"optim.lr_scheduler_type", "optim.lr_decay_style"},
    {"ulysses_sequence_parallel_size", "megatron.context_parallel_size"},
    {"megatron.ulysses_sequence_parallel_size", "megatron.context_parallel_size"},
    {"fsdp_config.ulysses_sequence_parallel_size", "ulysses_sequence_parallel_size"},
    {"megatron.fsdp_size", "fsdp_config.fsdp_size"},
    {"fsdp_config.tensor_model_parallel_size", "megatron.tensor_model_parallel_size"},
    {"fsdp_config.param_offload", "megatron.param_offload"},
    {"megatron.optimizer_offload", "fsdp_config.optimizer_offload"},
    {"model.fsdp_config.param_offload", "fsdp_config.param_offload"},
    {"lora_rank", "lora.rank"},
    {"lora_alpha", "lora.alpha"},
    {"lora.rank", "lora_rank"},
    {"ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"},
    {"log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"},
    {"forward_micro_batch_size", "forward_micro_batch_size_per_gpu"},
    {"micro_batch_size", "micro_batch_size_per_gpu"},
    {"reward_model.reward_manager.name", "reward_model.reward_manager"},
    {"trainer.val_generations_to_log_to_wandb", "trainer.log_val_generations"},
    {"trainer.remove_previous_ckpt_in_save", "trainer.max_actor_ckpt_to_keep"},
};

bool known(const Schema& s, const std::string& p) { return s.find(p) || s.is_section(p); }

// The deepest section of `s` that is a proper prefix of `path` ("" = root).
std::string deepest_section(const Schema& s, const std::string& path) {
  std::string best;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1))
    if (s.is_section(path.substr(0, dot))) best = path.substr(0, dot);
  return best;
}

bool under(const std::string& p, const std::string& section) {
  return section.empty() || p.rfind(section + ".", 0) == 0;
}

}  // namespace

size_t key_edit_distance(std::string_view a, std::string_view b) { return edit_distance(a, b); }

std::vector<std::string> suggest_keys(const std::string& path, const Schema& s) {
  constexpr size_t kMax = 3;
  std::vector<std::string> out;
  auto add = [&](const std::string& p) {
    if (out.size() < kMax && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  // 1) verl's renamed keys.
  for (const auto& r : kRenames) {
    const std::string from = r.from;
    if (path == from || (path.size() > from.size() && path.compare(path.size() - from.size(), from.size(), from) == 0 &&
                         path[path.size() - from.size() - 1] == '.')) {
      const std::string cand = path.substr(0, path.size() - from.size()) + r.to;
      if (known(s, cand)) add(cand);
    }
  }
  if (!out.empty()) return out;
  // 2) Typos inside the deepest section the path names, then inside its
  //    top-level section: closest first; among equals, the longest shared
  //    prefix (the typo is usually late).
  auto shared = [&](const std::string& p) {
    size_t n = 0;
    while (n < p.size() && n < path.size() && p[n] == path[n]) ++n;
    return n;
  };
  const std::string deep = deepest_section(s, path);
  const std::string top = path.substr(0, path.find('.'));
  std::vector<std::string> scopes = {deep};
  if (s.is_section(top) && top != deep) scopes.push_back(top);
  for (const std::string& scope : scopes) {
    std::vector<std::pair<size_t, std::string>> full;
    for (const auto& p : s.all_paths()) {
      if (!under(p, scope)) continue;
      const size_t d = edit_distance(path, p);
      if (d <= budget(path.substr(scope.empty() ? 0 : scope.size() + 1))) full.emplace_back(d, p);
    }
    if (full.empty()) continue;
    std::stable_sort(full.begin(), full.end(), [&](auto& a, auto& b) {
      return a.first != b.first ? a.first < b.first : shared(a.second) > shared(b.second);
    });
    for (const auto& [d, p] : full)
      if (d == full.front().first && shared(p) == shared(full.front().second)) add(p);
    return out;
  }
  // 3) Right name in the wrong section ("actor_rollout_ref.ppo_mini_batch_size",
  //    "trainer.train_batch_size", "temprature"): the last component, close
  //    within the top-level section the path names (anywhere when it names
  //    none), exact anywhere; ranked by whole-path distance.
  const std::string_view last = last_component(path);
  const bool scoped = s.is_section(top);
  std::vector<std::tuple<size_t, size_t, std::string>> by_last;
  for (const auto& d : s.keys()) {
    const size_t dl = edit_distance(last, last_component(d.path));
    if (dl == 0 || (dl <= budget(last) / 2 && (!scoped || under(d.path, top))))
      by_last.emplace_back(dl, edit_distance(path, d.path), d.path);
  }
  std::stable_sort(by_last.begin(), by_last.end());
  for (const auto& [dl, dp, p] : by_last)
    if (dl == std::get<0>(by_last.front())) add(p);
  return out;
}

std::string unknown_key_message(const std::string& path, const Schema& schema) {
  if (const Schema* p = schema.parent(); p && (p->find(path) || p->is_section(path)))
    return "config key '" + path + "' does not apply to " + schema.command() + " (it is a " + p->command() +
           " key; 'kestrel config docs " + schema.name() + "' lists the keys " + schema.command() + " takes)";
  const auto s = suggest_keys(path, schema);
  std::string msg = "unknown config key '" + path + "'";
  const std::string tree = &schema == &ppo_schema() ? "" : " " + schema.name();
  if (s.empty()) return msg + " (see 'kestrel config docs" + tree + "' for every key)";
  msg += " (did you mean ";
  for (size_t i = 0; i < s.size(); ++i) msg += (i ? (i + 1 == s.size() ? " or '" : ", '") : "'") + s[i] + "'";
  return msg + "?)";
}

}  // namespace kestrel::config

// "did you mean" for mistyped keys.
#include <algorithm>

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

}  // namespace

std::vector<std::string> suggest_keys(const std::string& path, const Schema& s) {
  constexpr size_t kMax = 3;
  const auto& paths = s.all_paths();
  // 1) Whole-path typos: keep the closest ones.
  std::vector<std::pair<size_t, std::string>> full;
  for (const auto& p : paths) {
    const size_t d = edit_distance(path, p);
    if (d <= budget(path)) full.emplace_back(d, p);
  }
  std::vector<std::string> out;
  if (!full.empty()) {
    // Closest first; among equals, the longest shared prefix (the typo is usually late).
    auto shared = [&](const std::string& p) {
      size_t n = 0;
      while (n < p.size() && n < path.size() && p[n] == path[n]) ++n;
      return n;
    };
    std::stable_sort(full.begin(), full.end(), [&](auto& a, auto& b) {
      return a.first != b.first ? a.first < b.first : shared(a.second) > shared(b.second);
    });
    for (const auto& [d, p] : full)
      if (d == full.front().first && shared(p) == shared(full.front().second) && out.size() < kMax) out.push_back(p);
    return out;
  }
  // 2) Right name in the wrong section ("actor_rollout_ref.ppo_mini_batch_size"):
  //    match the last component, rank by whole-path distance.
  const std::string_view last = last_component(path);
  std::vector<std::tuple<size_t, size_t, std::string>> by_last;
  for (const auto& d : s.keys()) {
    const size_t dl = edit_distance(last, last_component(d.path));
    if (dl <= budget(last) / 2) by_last.emplace_back(dl, edit_distance(path, d.path), d.path);
  }
  std::stable_sort(by_last.begin(), by_last.end());
  for (const auto& [dl, dp, p] : by_last)
    if (dl == std::get<0>(by_last.front()) && out.size() < kMax) out.push_back(p);
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

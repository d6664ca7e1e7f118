#include "rl/sample_store.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace kestrel::rl {

bool StoredGroup::finished() const {
  return std::all_of(samples.begin(), samples.end(), [](const StoredSample& s) { return s.finished; });
}

int64_t StoredGroup::first_version() const {
  int64_t v = std::numeric_limits<int64_t>::max();
  for (const StoredSample& s : samples)
    for (int32_t x : s.versions) v = std::min<int64_t>(v, x);
  return v == std::numeric_limits<int64_t>::max() ? 0 : v;
}

int32_t StoredGroup::max_rounds() const {
  int32_t r = 0;
  for (const StoredSample& s : samples) r = std::max(r, s.rounds);
  return r;
}

int64_t SampleStore::num_finished() const {
  return std::count_if(groups_.begin(), groups_.end(), [](const StoredGroup& g) { return g.finished(); });
}

std::vector<StoredGroup> SampleStore::take_finished(int64_t count) {
  std::vector<StoredGroup> out;
  for (auto it = groups_.begin(); it != groups_.end() && int64_t(out.size()) < count;) {
    if (it->finished()) {
      out.push_back(std::move(*it));
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
  KS_CHECK(int64_t(out.size()) == count, "sample store: ", out.size(), " finished groups for ", count, " asked");
  return out;
}

int64_t SampleStore::drop_stale(int64_t trainer_version, int64_t max_staleness) {
  int64_t dropped = 0;
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->finished() && trainer_version - it->first_version() > max_staleness) {
      it = groups_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  counters_.dropped_groups += dropped;
  return dropped;
}

namespace {

// Floats as their bit patterns: the checkpoint restores them exactly.
std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::bit_cast<uint32_t>(v[i]);
  return out;
}
std::vector<float> bits_float(const std::vector<uint32_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::bit_cast<float>(v[i]);
  return out;
}

}  // namespace

nlohmann::ordered_json group_to_json(const StoredGroup& g) {
  nlohmann::ordered_json jg;
  jg["stream"] = g.stream;
  jg["prompt"] = g.prompt;
  jg["seed"] = g.seed;
  jg["weight_version"] = g.weight_version;
  nlohmann::ordered_json ss = nlohmann::ordered_json::array();
  for (const StoredSample& s : g.samples)
    ss.push_back({{"tokens", s.tokens},
                  {"logprob_bits", float_bits(s.logprobs)},
                  {"versions", s.versions},
                  {"routed_experts", s.routed_experts},
                  {"finished", s.finished},
                  {"rounds", s.rounds}});
  jg["samples"] = std::move(ss);
  return jg;
}

Result<StoredGroup> group_from_json(const nlohmann::json& jg, const std::string& where) {
  StoredGroup g;
  try {
    g.stream = jg.at("stream").get<int64_t>();
    g.prompt = jg.at("prompt").get<int64_t>();
    g.seed = jg.at("seed").get<uint64_t>();
    g.weight_version = jg.at("weight_version").get<int64_t>();
    for (const auto& js : jg.at("samples")) {
      StoredSample s;
      s.tokens = js.at("tokens").get<std::vector<int32_t>>();
      s.logprobs = bits_float(js.at("logprob_bits").get<std::vector<uint32_t>>());
      s.versions = js.at("versions").get<std::vector<int32_t>>();
      s.routed_experts = js.at("routed_experts").get<std::vector<int32_t>>();
      s.finished = js.at("finished").get<bool>();
      s.rounds = js.at("rounds").get<int32_t>();
      if (s.versions.size() != s.tokens.size() || (!s.logprobs.empty() && s.logprobs.size() != s.tokens.size()))
        return KS_ERR(where, ": group at stream position ", g.stream, ": a response has ", s.tokens.size(),
                      " tokens but ", s.versions.size(), " versions and ", s.logprobs.size(), " log-probs");
      g.samples.push_back(std::move(s));
    }
  } catch (const nlohmann::json::exception& e) {
    return KS_ERR(where, ": ", e.what(), " (a sample-store group written by this version of Kestrel is expected)");
  }
  return g;
}

nlohmann::ordered_json SampleStore::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = "kestrel-sample-store-1";
  j["next_stream"] = next_stream_;
  j["drawn"] = std::vector<int64_t>(drawn_.begin(), drawn_.end());
  j["counters"] = {{"generated_groups", counters_.generated_groups},
                   {"stale_groups_trained", counters_.stale_groups_trained},
                   {"stale_responses_trained", counters_.stale_responses_trained},
                   {"dropped_groups", counters_.dropped_groups},
                   {"rounds_since_take", counters_.rounds_since_take}};
  nlohmann::ordered_json gs = nlohmann::ordered_json::array();
  for (const StoredGroup& g : groups_) gs.push_back(group_to_json(g));
  j["groups"] = std::move(gs);
  return j;
}

Result<SampleStore> SampleStore::from_json(const nlohmann::json& j, const std::string& where) {
  SampleStore st;
  try {
    if (j.at("format").get<std::string>() != "kestrel-sample-store-1")
      return KS_ERR(where, ": format '", j.at("format").get<std::string>(), "' is not kestrel-sample-store-1");
    st.next_stream_ = j.at("next_stream").get<int64_t>();
    for (int64_t d : j.at("drawn").get<std::vector<int64_t>>()) st.drawn_.push_back(d);
    const auto& c = j.at("counters");
    st.counters_.generated_groups = c.at("generated_groups").get<int64_t>();
    st.counters_.stale_groups_trained = c.at("stale_groups_trained").get<int64_t>();
    st.counters_.stale_responses_trained = c.at("stale_responses_trained").get<int64_t>();
    st.counters_.dropped_groups = c.at("dropped_groups").get<int64_t>();
    st.counters_.rounds_since_take = c.at("rounds_since_take").get<int64_t>();
    for (const auto& jg : j.at("groups")) {
      KS_ASSIGN(StoredGroup g, group_from_json(jg, where));
      st.groups_.push_back(std::move(g));
    }
  } catch (const nlohmann::json::exception& e) {
    return KS_ERR(where, ": ", e.what(), " (a sample store written by this version of Kestrel is expected)");
  }
  return st;
}

}  // namespace kestrel::rl

#include "rl/rollout_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/rng.h"
#include "train/micro_batch.h"

namespace kestrel::rl {

void RolloutBatch::finalize_layout() {
  KS_CHECK(prompts.size() == responses.size(), "rollout batch: ", prompts.size(), " prompts but ", responses.size(),
           " responses");
  std::vector<int64_t> lens;
  for (size_t i = 0; i < responses.size(); ++i) {
    KS_CHECK(!prompts[i].empty(), "rollout batch: sequence ", i, " has an empty prompt");
    lens.push_back(int64_t(responses[i].size()));
  }
  layout = Ragged::from_lengths(lens);
}

Result<RouterReplay> parse_router_replay(const std::string& mode, const std::string& key) {
  if (mode == "disabled") return RouterReplay::Disabled;
  if (mode == "R2") return RouterReplay::R2;
  if (mode == "R3") return RouterReplay::R3;
  return KS_ERR(key, ": '", mode, "' is not one of disabled, R2, R3");
}

const char* router_replay_name(RouterReplay r) {
  switch (r) {
    case RouterReplay::R2: return "R2";
    case RouterReplay::R3: return "R3";
    default: return "disabled";
  }
}

void RolloutBatch::check_routing(const std::string& what) const {
  KS_CHECK(int64_t(routed_experts.size()) == size(), what, ": ", routed_experts.size(), " routing records for ",
           size(), " sequences");
  KS_CHECK(routed_layers > 0 && routed_topk > 0, what, ": routing of ", routed_layers, " MoE layers x top-",
           routed_topk);
  const int64_t w = routed_layers * routed_topk;
  for (int64_t i = 0; i < size(); ++i) {
    const int64_t n = int64_t(prompts[size_t(i)].size() + responses[size_t(i)].size());
    KS_CHECK(int64_t(routed_experts[size_t(i)].size()) == n * w, what, ": sequence ", i, " has ",
             routed_experts[size_t(i)].size(), " routing entries, expected its ", n, " prompt and response tokens x ",
             routed_layers, " MoE layers x top-", routed_topk, " = ", n * w);
  }
}

std::vector<int32_t> RolloutBatch::sequence(int64_t i) const {
  std::vector<int32_t> s = prompts[size_t(i)];
  s.insert(s.end(), responses[size_t(i)].begin(), responses[size_t(i)].end());
  return s;
}

std::vector<int64_t> response_rows(const RolloutBatch& b, const std::vector<int64_t>& seqs) {
  std::vector<int64_t> rows;
  int64_t start = 0;  // first packed row of the current sequence
  for (int64_t i : seqs) {
    const int64_t P = int64_t(b.prompts[size_t(i)].size()), R = int64_t(b.responses[size_t(i)].size());
    for (int64_t j = 0; j < R; ++j) rows.push_back(start + P - 1 + j);
    start += P + R;
  }
  return rows;
}

namespace {

// Sequences of `seqs` grouped by equal prompt ids, groups in order of first appearance.
std::vector<std::vector<int64_t>> prompt_groups(const RolloutBatch& b, const std::vector<int64_t>& seqs) {
  std::vector<std::vector<int64_t>> groups;
  for (int64_t i : seqs) {
    auto same = [&](const std::vector<int64_t>& g) { return b.prompts[size_t(g[0])] == b.prompts[size_t(i)]; };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) groups.push_back({i});
    else it->push_back(i);
  }
  return groups;
}


// b's routing of `seqs` laid out over their packed rows: i32 [T, L, k].
Tensor packed_routing(const RolloutBatch& b, const std::vector<int64_t>& seqs, bool share_prompts, int64_t T) {
  b.check_routing("router replay");
  const int64_t w = b.routed_layers * b.routed_topk;
  std::vector<int32_t> out(size_t(T * w), -1);
  std::vector<char> filled(size_t(T), 0);
  const std::vector<int64_t> rows = sequence_token_rows(b, seqs, share_prompts);
  size_t k = 0;
  for (int64_t i : seqs) {
    const std::vector<int32_t>& r = b.routed_experts[size_t(i)];
    const int64_t n = int64_t(r.size()) / w;
    for (int64_t t = 0; t < n; ++t, ++k) {
      const int64_t row = rows[k];
      if (filled[size_t(row)]) continue;  // a shared prompt row: its first sample's routing
      filled[size_t(row)] = 1;
      std::copy(r.begin() + t * w, r.begin() + (t + 1) * w, out.begin() + row * w);
    }
  }
  return Tensor::from_host(out, {T, b.routed_layers, b.routed_topk}, MemCategory::Activations);
}

}  // namespace

std::vector<int64_t> sequence_token_rows(const RolloutBatch& b, const std::vector<int64_t>& seqs, bool share_prompts) {
  std::vector<int64_t> rows;
  if (!share_prompts) {
    int64_t start = 0;
    for (int64_t i : seqs) {
      const int64_t n = int64_t(b.prompts[size_t(i)].size() + b.responses[size_t(i)].size());
      for (int64_t t = 0; t < n; ++t) rows.push_back(start + t);
      start += n;
    }
    return rows;
  }
  // pack_rollout_sequences's shared layout: per prompt group its prefix (the prompt but its last token),
  // then each sample's continuation (the last prompt token and the response).
  std::map<int64_t, int64_t> prefix_row, cont_row;  // sequence -> first row of its prefix / continuation
  int64_t row = 0;
  for (const auto& g : prompt_groups(b, seqs)) {
    const int64_t prefix = int64_t(b.prompts[size_t(g[0])].size()) - 1;
    for (int64_t i : g) prefix_row[i] = row;
    row += prefix;
    for (int64_t i : g) {
      cont_row[i] = row;
      row += 1 + int64_t(b.responses[size_t(i)].size());
    }
  }
  for (int64_t i : seqs) {
    const int64_t P = int64_t(b.prompts[size_t(i)].size()), R = int64_t(b.responses[size_t(i)].size());
    for (int64_t t = 0; t < P - 1; ++t) rows.push_back(prefix_row.at(i) + t);
    for (int64_t t = 0; t <= R; ++t) rows.push_back(cont_row.at(i) + t);
  }
  return rows;
}

void unpack_routing(const RolloutBatch& b, const std::vector<int64_t>& seqs, bool share_prompts,
                    const std::vector<int32_t>& packed, int64_t L, int64_t k,
                    std::vector<std::vector<int32_t>>& routed) {
  const int64_t w = L * k;
  if (int64_t(routed.size()) < b.size()) routed.resize(size_t(b.size()));
  const std::vector<int64_t> rows = sequence_token_rows(b, seqs, share_prompts);
  size_t q = 0;
  for (int64_t i : seqs) {
    const int64_t n = int64_t(b.prompts[size_t(i)].size() + b.responses[size_t(i)].size());
    std::vector<int32_t>& r = routed[size_t(i)];
    r.assign(size_t(n * w), -1);
    for (int64_t t = 0; t < n; ++t, ++q) {
      const int64_t row = rows[q];
      KS_CHECK((row + 1) * w <= int64_t(packed.size()), "unpack_routing: row ", row, " outside the record of ",
               int64_t(packed.size()) / w, " rows");
      std::copy(packed.begin() + row * w, packed.begin() + (row + 1) * w, r.begin() + t * w);
    }
  }
}

PackedSequences pack_rollout_sequences(const RolloutBatch& b, const std::vector<int64_t>& seqs, bool share_prompts,
                                       bool replay_routing) {
  PackedSequences out;
  if (!share_prompts) {
    std::vector<std::vector<int32_t>> toks;
    toks.reserve(seqs.size());
    for (int64_t i : seqs) toks.push_back(b.sequence(i));
    out.batch = model::pack_sequences(toks);
    out.rows = response_rows(b, seqs);
    if (replay_routing) out.batch.routed_experts = packed_routing(b, seqs, false, out.batch.num_tokens);
    return out;
  }
  const auto groups = prompt_groups(b, seqs);
  std::vector<model::PrefixGroup> packed;
  std::map<int64_t, int64_t> first_row;  // sequence -> packed row of its continuation's first token
  int64_t row = 0;
  for (const auto& g : groups) {
    const std::vector<int32_t>& prompt = b.prompts[size_t(g[0])];
    model::PrefixGroup pg;
    pg.prefix.assign(prompt.begin(), prompt.end() - 1);
    row += int64_t(pg.prefix.size());
    for (int64_t i : g) {
      std::vector<int32_t> c = {prompt.back()};
      c.insert(c.end(), b.responses[size_t(i)].begin(), b.responses[size_t(i)].end());
      first_row[i] = row;
      row += int64_t(c.size());
      pg.continuations.push_back(std::move(c));
    }
    packed.push_back(std::move(pg));
  }
  out.batch = model::pack_prefix_groups(packed);
  for (int64_t i : seqs)
    for (int64_t j = 0; j < b.layout.length(i); ++j) out.rows.push_back(first_row.at(i) + j);
  if (replay_routing) out.batch.routed_experts = packed_routing(b, seqs, true, out.batch.num_tokens);
  return out;
}

AggScope mini_batch_scope(const RolloutBatch& b, const std::vector<int64_t>& seqs, AggMode mode,
                          double scale_factor) {
  AggScope s;
  s.mode = mode;
  for (int64_t i : seqs) {
    double kept = 0;
    for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) kept += b.mask_at(t);
    s.global_tokens += kept;
    // verl counts the sequences with a valid token; every sequence when no mask is set (as before).
    s.global_seqs += b.response_mask.empty() || kept > 0 ? 1.0 : 0.0;
  }
  s.scale_factor = scale_factor;
  return s;
}

std::vector<std::vector<int64_t>> split_mini_batch(const RolloutBatch& b, const std::vector<int64_t>& seqs,
                                                   int64_t max_tokens, int64_t max_seqs, bool share_prompts) {
  if (share_prompts && max_tokens > 0) {
    // Greedy in order, as train::split_micro_batches, with a sequence whose
    // prompt the open micro-batch already holds costing its response + 1.
    std::vector<std::vector<int64_t>> out;
    int64_t tokens = 0;
    for (int64_t i : seqs) {
      const int64_t P = int64_t(b.prompts[size_t(i)].size()), R = int64_t(b.responses[size_t(i)].size());
      auto shares = [&](int64_t j) { return b.prompts[size_t(j)] == b.prompts[size_t(i)]; };
      const bool known = !out.empty() && std::any_of(out.back().begin(), out.back().end(), shares);
      const int64_t cost = known ? R + 1 : P + R;
      if (out.empty() || tokens + cost > max_tokens) {
        out.emplace_back();
        tokens = P + R;  // a fresh micro-batch holds the prompt again
      } else {
        tokens += cost;
      }
      out.back().push_back(i);
    }
    return out;
  }
  std::vector<int64_t> lens;
  for (int64_t i : seqs) lens.push_back(int64_t(b.prompts[size_t(i)].size() + b.responses[size_t(i)].size()));
  auto groups = train::split_micro_batches(lens, max_tokens, max_tokens > 0 ? 0 : std::max<int64_t>(1, max_seqs));
  for (auto& g : groups)
    for (auto& k : g) k = seqs[size_t(k)];
  return groups;
}

std::map<std::string, double> LossTotals::metrics() const {
  const double d = tokens > 0 ? tokens : 1.0;
  return {{"actor/pg_loss", pg_loss},
          {"actor/pg_clipfrac", clipfrac_tokens / d},
          {"actor/pg_clipfrac_lower", clipfrac_lower_tokens / d},
          {"actor/ppo_kl", ppo_kl_tokens / d},
          {"actor/entropy", entropy_tokens / d},
          {"actor/kl_loss", kl_loss},
          {"actor/loss", loss}};
}

train::TokenObjective micro_batch_objective(const RolloutBatch& b, const std::vector<int64_t>& seqs,
                                            std::vector<int64_t> rows, const PolicyLossConfig& cfg,
                                            LossTotals* totals, const RolloutCorrectionConfig* corr) {
  const bool correct = corr && corr->active && !b.rollout_logp.empty();
  return [&b, seqs, rows = std::move(rows), cfg, totals, correct, corr](const train::TokenView& v, float* dlogprob,
                                                                        float* dentropy) -> double {
    std::vector<int64_t> lens;
    // [micro-batch response tokens] each, in seqs order.
    std::vector<double> logp, old, adv, ent, ref, mask, isw, rollout;
    logp.reserve(rows.size());
    for (int64_t i : seqs) {
      lens.push_back(b.layout.length(i));
      for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) {
        adv.push_back(b.advantages[size_t(t)]);
        mask.push_back(b.mask_at(t));
        if (!b.old_logp.empty()) old.push_back(b.old_logp[size_t(t)]);
        if (!b.ref_logp.empty()) ref.push_back(b.ref_logp[size_t(t)]);
        if (!b.rollout_is_weights.empty()) isw.push_back(b.rollout_is_weights[size_t(t)]);
        if (correct) rollout.push_back(b.rollout_logp[size_t(t)]);
      }
    }
    for (int64_t r : rows) {
      KS_CHECK(r >= 0 && r < v.num_tokens, "micro-batch objective: row ", r, " outside the packed batch");
      logp.push_back(double(v.logprob[r]));
      ent.push_back(double(v.entropy[r]));
    }
    // On-policy: the ratio is exactly 1 but its gradient is d logp (old is detached).
    if (b.old_logp.empty()) old = logp;
    const Ragged L = Ragged::from_lengths(lens);
    PolicyLossConfig c = cfg;
    PolicyLossInput in;
    in.layout = &L;
    in.logp = &logp;
    in.old_logp = &old;
    in.advantages = &adv;
    in.entropy = &ent;
    in.ref_logp = ref.empty() ? nullptr : &ref;
    in.mask = b.response_mask.empty() ? nullptr : &mask;
    in.is_weights = isw.empty() ? nullptr : &isw;
    RolloutCorrectionResult rc;
    std::map<std::string, double> corr_metrics;
    if (correct && corr->bypass_mode) {
      // verl's compute_policy_loss_bypass_mode: weights and rejection from the current policy vs the rollout's.
      rc = compute_rollout_correction(*corr, L, logp, rollout, &mask);
      in.pg_mask = &rc.mask;
      c.reinforce = corr->loss_type == BypassLoss::Reinforce;
      in.is_weights = c.reinforce && !rc.is_weights.empty() ? &rc.is_weights : nullptr;
      corr_metrics = std::move(rc.metrics);
    } else if (correct) {
      corr_metrics = offpolicy_metrics(L, logp, rollout, mask);  // verl's actor: current policy vs rollout
    }
    const PolicyLossOutput out = policy_loss_vanilla(c, in);
    for (size_t k = 0; k < rows.size(); ++k) {
      dlogprob[rows[k]] = float(out.dloss_dlogp[k]);
      dentropy[rows[k]] = float(out.dloss_dentropy[k]);
    }
    double n = 0, ent_sum = 0;  // valid tokens (the loss's masked means weigh by them)
    for (size_t k = 0; k < mask.size(); ++k) n += mask[k], ent_sum += ent[k] * mask[k];
    totals->loss += out.loss;
    totals->pg_loss += out.pg_loss;
    totals->kl_loss += out.kl_loss;
    totals->clipfrac_tokens += out.pg_clipfrac * n;
    totals->clipfrac_lower_tokens += out.pg_clipfrac_lower * n;
    totals->ppo_kl_tokens += out.ppo_kl * n;
    totals->entropy_tokens += ent_sum;
    if (!corr_metrics.empty()) {
      for (const auto& [k, x] : corr_metrics) totals->corr[k] += x;
      totals->corr_batches += 1;
    }
    if (!b.rollout_logp.empty()) {
      size_t k = 0;
      for (int64_t i : seqs)
        for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t, ++k) {
          const double d = std::abs(std::exp(logp[k]) - std::exp(b.rollout_logp[size_t(t)]));
          totals->rollout_diff_sum += d;
          totals->rollout_diff_max = std::max(totals->rollout_diff_max, d);
          totals->rollout_diff_tokens += 1;
        }
    }
    totals->tokens += n;
    return out.loss;
  };
}

std::vector<int64_t> sequences_with_gradient(const RolloutBatch& b, const std::vector<int64_t>& seqs,
                                             const PolicyLossConfig& cfg) {
  if (cfg.entropy_coeff != 0 || cfg.use_kl_loss) return seqs;
  std::vector<int64_t> out;
  for (int64_t i : seqs) {
    bool any = false;
    for (int64_t t = b.layout.begin(i); t < b.layout.end(i) && !any; ++t)
      any = b.advantages[size_t(t)] != 0.0 && b.mask_at(t) > 0;  // a rejected token has no gradient
    if (any) out.push_back(i);
  }
  return out;
}

std::vector<int64_t> ppo_epoch_order(int64_t n, uint64_t seed, int64_t step, int64_t epoch) {
  const uint64_t stream = uint64_t(step) * 1024 + uint64_t(epoch);
  std::vector<int64_t> order(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto r = philox4x32(uint64_t(i), stream, seed);
    const int64_t j = int64_t(u32x2_to_unit_double(r[0], r[1]) * double(i + 1));
    std::swap(order[size_t(i)], order[size_t(std::min(j, i))]);
  }
  return order;
}

void add_stats(std::map<std::string, double>& m, const std::string& prefix, const std::vector<double>& x) {
  if (x.empty()) return;
  double s = 0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : x) {
    s += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  m[prefix + "/mean"] = s / double(x.size());
  m[prefix + "/max"] = hi;
  m[prefix + "/min"] = lo;
}

}  // namespace kestrel::rl

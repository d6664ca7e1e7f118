#include "rl/policy_loss.h"

#include <algorithm>
#include <cmath>

namespace kestrel::rl {

Result<AggMode> parse_agg_mode(const std::string& s) {
  if (s == "token-mean") return AggMode::TokenMean;
  if (s == "seq-mean-token-sum") return AggMode::SeqMeanTokenSum;
  if (s == "seq-mean-token-mean") return AggMode::SeqMeanTokenMean;
  if (s == "seq-mean-token-sum-norm") return AggMode::SeqMeanTokenSumNorm;
  return KS_ERR("loss_agg_mode: '", s,
                "' is not valid; use token-mean, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm");
}

std::vector<double> agg_weights(const Ragged& L, const std::vector<double>& m, const AggScope& sc) {
  const size_t T = size_t(L.num_tokens());
  std::vector<double> w(T, 0.0);
  auto valid_len = [&](int64_t i) {
    double n = 0;
    for (int64_t t = L.begin(i); t < L.end(i); ++t) n += m[size_t(t)];
    return n;
  };
  switch (sc.mode) {
    case AggMode::TokenMean: {
      double n = sc.global_tokens;
      if (n <= 0)
        for (double x : m) n += x;
      for (size_t t = 0; t < T; ++t) w[t] = m[t] / std::max(n, 1.0);
      break;
    }
    case AggMode::SeqMeanTokenSum:
    case AggMode::SeqMeanTokenMean: {
      double B = sc.global_seqs;
      if (B <= 0)
        for (int64_t i = 0; i < L.num_seqs(); ++i) B += valid_len(i) > 0 ? 1 : 0;
      for (int64_t i = 0; i < L.num_seqs(); ++i) {
        const double len = valid_len(i);
        if (len <= 0) continue;
        const double per = sc.mode == AggMode::SeqMeanTokenSum ? 1.0 : 1.0 / (len + 1e-8);
        for (int64_t t = L.begin(i); t < L.end(i); ++t) w[size_t(t)] = m[size_t(t)] * per / std::max(B, 1.0);
      }
      break;
    }
    case AggMode::SeqMeanTokenSumNorm: {
      double s = sc.scale_factor;
      if (s <= 0)
        for (int64_t i = 0; i < L.num_seqs(); ++i) s = std::max(s, double(L.length(i)));
      for (size_t t = 0; t < T; ++t) w[t] = m[t] / std::max(s, 1.0);
      break;
    }
  }
  return w;
}

namespace {
enum KlKind { K1 = 0, Abs = 1, K2 = 2, K3 = 3 };

bool kl_kind(std::string s, KlKind* k, bool* straight_through) {
  *straight_through = !s.empty() && s.back() == '+';
  if (*straight_through) s.pop_back();
  if (s == "kl" || s == "k1") *k = K1;
  else if (s == "abs") *k = Abs;
  else if (s == "mse" || s == "k2") *k = K2;
  else if (s == "low_var_kl" || s == "k3") *k = K3;
  else return false;
  if (*k == K2) *straight_through = false;  // k2+ is k2
  return true;
}
}  // namespace

Result<int> parse_kl_type(const std::string& s) {
  KlKind k;
  bool st;
  if (!kl_kind(s, &k, &st))
    return KS_ERR("kl type '", s, "' is not valid; use kl/k1, abs, mse/k2, low_var_kl/k3, optionally with a trailing '+'");
  return int(k);
}

KlEstimate kl_estimate(const std::string& type, double logp, double ref) {
  KlKind k;
  bool st;
  KS_CHECK(kl_kind(type, &k, &st), "unknown kl type '", type, "'");
  const double d = logp - ref;
  KlEstimate e;
  switch (k) {
    case K1: e = {d, 1.0}; break;
    case Abs: e = {std::abs(d), d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0)}; break;
    case K2: e = {0.5 * d * d, d}; break;
    case K3: {
      const double raw = ref - logp;
      const double kc = std::clamp(raw, -20.0, 20.0);
      const double v = std::exp(kc) - kc - 1;
      const double vc = std::clamp(v, -10.0, 10.0);
      // d/dlogp of exp(k)-k-1 with k = ref - logp is 1 - exp(k); clamps stop the gradient.
      const bool passes = raw == kc && v == vc;
      e = {vc, passes ? 1.0 - std::exp(kc) : 0.0};
      break;
    }
  }
  if (st) e.dvalue_dlogp = d;  // value of the estimator, gradient of k2
  return e;
}

PolicyLossOutput policy_loss_vanilla(const PolicyLossConfig& cfg, const PolicyLossInput& in) {
  KS_CHECK(in.layout && in.logp && in.old_logp && in.advantages, "policy loss: missing inputs");
  const Ragged& L = *in.layout;
  const size_t T = size_t(L.num_tokens());
  KS_CHECK(in.logp->size() == T && in.old_logp->size() == T && in.advantages->size() == T,
           "policy loss: per-token arrays must have ", T, " values");
  KS_CHECK(cfg.clip_ratio_c > 1.0, "clip_ratio_c must be > 1, got ", cfg.clip_ratio_c);
  const std::vector<double> m = in.mask ? *in.mask : std::vector<double>(T, 1.0);
  const std::vector<double> w = agg_weights(L, m, cfg.agg);
  KS_CHECK(!in.is_weights || in.is_weights->size() == T, "policy loss: is_weights must have ", T, " values");
  KS_CHECK(!in.pg_mask || in.pg_mask->size() == T, "policy loss: pg_mask must have ", T, " values");
  const std::vector<double>& pm = in.pg_mask ? *in.pg_mask : m;
  const std::vector<double> wpg = in.pg_mask ? agg_weights(L, pm, cfg.agg) : w;

  PolicyLossOutput out;
  out.dloss_dlogp.assign(T, 0.0);
  out.dloss_dentropy.assign(T, 0.0);
  double msum = 0, clipped = 0, clipped_lower = 0, kl_sum = 0;
  for (size_t t = 0; t < T; ++t) {
    const double A = (*in.advantages)[t];
    const double raw = (*in.logp)[t] - (*in.old_logp)[t];
    const double delta = std::clamp(raw, -20.0, 20.0);
    const double ratio = std::exp(delta);
    const double dratio = raw == delta ? ratio : 0.0;  // d ratio / d logp
    const double lo = 1 - cfg.clip_ratio_low, hi = 1 + cfg.clip_ratio_high;
    const double clipped_ratio = std::clamp(ratio, lo, hi);
    const double dclipped = (ratio >= lo && ratio <= hi) ? dratio : 0.0;
    const double L1 = -A * ratio, L2 = -A * clipped_ratio;
    double loss_t, grad_t;
    if (L2 > L1) {
      loss_t = L2;
      grad_t = -A * dclipped;
    } else {
      loss_t = L1;
      grad_t = -A * dratio;
    }
    bool is_clipped = L2 > L1;
    bool lower = false;
    if (A < 0) {
      const double L3 = -A * cfg.clip_ratio_c;
      if (loss_t > L3) {
        lower = true;
        loss_t = L3;
        grad_t = 0.0;
      }
    }
    if (cfg.reinforce) {  // -A * logp: d/dlogp = -A
      loss_t = -A * (*in.logp)[t];
      grad_t = -A;
      is_clipped = lower = false;
    }
    if (in.is_weights) {  // detached weights scale the token's loss and its gradient
      loss_t *= (*in.is_weights)[t];
      grad_t *= (*in.is_weights)[t];
    }
    out.pg_loss += wpg[t] * loss_t;
    out.dloss_dlogp[t] += wpg[t] * grad_t;
    msum += pm[t];
    clipped += is_clipped ? pm[t] : 0;
    clipped_lower += lower ? pm[t] : 0;
    kl_sum += (cfg.reinforce ? -raw : -delta) * pm[t];
    if (cfg.entropy_coeff != 0) {
      KS_CHECK(in.entropy && in.entropy->size() == T, "entropy_coeff != 0 needs per-token entropy");
      out.entropy += w[t] * (*in.entropy)[t];
      out.dloss_dentropy[t] = -cfg.entropy_coeff * w[t];
    }
    if (cfg.use_kl_loss) {
      KS_CHECK(in.ref_logp && in.ref_logp->size() == T, "use_kl_loss needs reference logprobs");
      const KlEstimate e = kl_estimate(cfg.kl_loss_type, (*in.logp)[t], (*in.ref_logp)[t]);
      out.kl_loss += w[t] * e.value;
      out.dloss_dlogp[t] += cfg.kl_loss_coef * w[t] * e.dvalue_dlogp;
    }
  }
  const double denom = msum + 1e-8;  // verl's masked_mean
  out.pg_clipfrac = clipped / denom;
  out.pg_clipfrac_lower = clipped_lower / denom;
  out.ppo_kl = kl_sum / denom;
  out.loss = out.pg_loss - cfg.entropy_coeff * out.entropy + (cfg.use_kl_loss ? cfg.kl_loss_coef * out.kl_loss : 0.0);
  return out;
}

ValueLossOutput value_loss(const Ragged& L, const std::vector<double>& v, const std::vector<double>& v_old,
                           const std::vector<double>& G, const std::vector<double>* mask, double c,
                           const AggScope& agg) {
  const size_t T = size_t(L.num_tokens());
  KS_CHECK(v.size() == T && v_old.size() == T && G.size() == T, "value loss: per-token arrays must have ", T, " values");
  const std::vector<double> m = mask ? *mask : std::vector<double>(T, 1.0);
  const std::vector<double> w = agg_weights(L, m, agg);
  ValueLossOutput out;
  out.dloss_dvalue.assign(T, 0.0);
  double msum = 0, clipped = 0;
  for (size_t t = 0; t < T; ++t) {
    const double vc = std::clamp(v[t], v_old[t] - c, v_old[t] + c);
    const double e1 = (v[t] - G[t]) * (v[t] - G[t]);
    const double e2 = (vc - G[t]) * (vc - G[t]);
    const bool inside = v[t] >= v_old[t] - c && v[t] <= v_old[t] + c;
    double loss_t, grad_t;
    if (e2 > e1) {
      loss_t = e2;
      grad_t = inside ? 2 * (vc - G[t]) : 0.0;
    } else {
      loss_t = e1;
      grad_t = 2 * (v[t] - G[t]);
    }
    out.loss += 0.5 * w[t] * loss_t;
    out.dloss_dvalue[t] = 0.5 * w[t] * grad_t;
    msum += m[t];
    clipped += e2 > e1 ? m[t] : 0;
  }
  out.clipfrac = clipped / (msum + 1e-8);
  return out;
}

void KlController::update(double current_kl, int64_t n_steps) {
  if (type == "fixed") return;
  KS_CHECK(type == "adaptive", "kl_ctrl.type must be fixed or adaptive, got '", type, "'");
  const double e = std::clamp(current_kl / target_kl - 1.0, -0.2, 0.2);
  value *= 1.0 + e * double(n_steps) / double(horizon);
}

}  // namespace kestrel::rl

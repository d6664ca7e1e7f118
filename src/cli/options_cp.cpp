// Context parallelism's keys (options.h's read_context_parallel): Megatron's
// context_parallel_size, MindSpeed's context_parallel_algo /
// ulysses_degree_in_cp / cp_attention_mask_type, and verl FSDP's
// ulysses_sequence_parallel_size (Ulysses CP of that size).
#include "cli/options.h"

namespace kestrel::cli {

CpSettings read_context_parallel(const config::Config& c, const std::string& ot, const std::vector<std::string>& fsdp_keys) {
  CpSettings s;
  const std::string ck = ot + "context_parallel_size", ak = ot + "context_parallel_algo",
                    uk = ot + "ulysses_degree_in_cp";
  s.cp = c.get_int(ck);
  if (s.cp < 1) KS_FAIL(c.origin(ck), ": ", ck, "=", s.cp, " must be >= 1");
  const std::string algo = c.get_string(ak);
  s.algo = parallel::parse_cp_algo(algo);
  s.ulysses_degree = c.get_int_or(uk, 0);
  s.size_key = ck;
  // The override defaults to <owner>.megatron.context_parallel_size: name that key when it gave the value.
  const std::string otn = "override_transformer_config.";
  if (ot.size() > otn.size() && ot.compare(ot.size() - otn.size(), otn.size(), otn) == 0) {
    const std::string mk = ot.substr(0, ot.size() - otn.size()) + "context_parallel_size";
    if (c.schema().find(mk) && c.get_int(mk) == s.cp) s.size_key = mk;
  }
  // MindSpeed's mask type (megatron trees only): causal and general are the same packed causal masks here
  // (the schema allows only these two).
  if (c.schema().find(ot + "cp_attention_mask_type")) (void)c.get_string(ot + "cp_attention_mask_type");
  // verl FSDP's Ulysses sequence parallelism: context parallelism of that size, Ulysses algorithm.
  for (const std::string& k : fsdp_keys) {
    const int64_t u = c.get_int(k);
    if (u < 1) KS_FAIL(c.origin(k), ": ", k, "=", u, " must be >= 1");
    if (u == 1) continue;
    if (s.cp > 1 && (s.cp != u || s.algo != parallel::CpAlgo::Ulysses))
      KS_FAIL(c.origin(k), ": ", k, "=", u, " (verl FSDP's Ulysses context parallelism) and ", ck, "=", s.cp, " with ",
              ak, "=", algo, " (from ", c.origin(ck), ") both set context parallelism; set one of them");
    s.cp = u;
    s.algo = parallel::CpAlgo::Ulysses;
    s.size_key = k;
  }
  if (s.cp > 1 && s.algo == parallel::CpAlgo::Hybrid) {
    if (c.is_null(uk))
      KS_FAIL(c.origin(ak), ": ", ak, "=hybrid_cp_algo needs ", uk,
              " (the Ulysses group size inside the cp group; it must divide ", ck, "=", s.cp, ")");
    const int64_t u = s.ulysses_degree;
    if (u <= 1 || u >= s.cp || s.cp % u != 0)
      KS_FAIL(c.origin(uk), ": ", uk, "=", u, " must divide ", ck, "=", s.cp, " and lie strictly between 1 and ", s.cp,
              " (", s.cp, " is ulysses_cp_algo, 1 is megatron_cp_algo)");
  }
  return s;
}

}  // namespace kestrel::cli

// kestrel generate: offline batch generation with the rollout engine.
// Input lines are {"input_ids": [...]}, {"prompt": "text"} or
// {"messages": [...]} (the last two need the model folder's tokenizer and,
// for messages, its chat template); each may carry its own "seed". Output
// lines (input order, written atomically) are
//   {"prompt_ids": [...], "outputs": [{"token_ids", "logprobs", "finish_reason"(, "text")}]}.
// Options are verl's actor_rollout_ref.rollout.* names, as --key value or as
// key=value / actor_rollout_ref.rollout.key=value overrides.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/args.h"
#include "core/files.h"
#include "core/parallel_for.h"
#include "data/chat_tokenizer.h"
#include "rollout/engine.h"

namespace kestrel::cli {

namespace {

using Clock = std::chrono::steady_clock;

// The rollout keys: name, help, default.
const std::vector<FlagSpec>& rollout_flags() {
  static const std::vector<FlagSpec> f = {
      {"temperature", "sampling temperature (0 = greedy)", true, "1.0"},
      {"top_k", "keep the k most likely tokens (-1 = off)", true, "-1"},
      {"top_p", "nucleus sampling mass", true, "1.0"},
      {"min_p", "drop tokens below min_p * p_max", true, "0.0"},
      {"n", "samples per prompt", true, "1"},
      {"response_length", "max new tokens per sample", true, "512"},
      {"max_num_batched_tokens", "tokens per engine step", true, "8192"},
      {"max_num_seqs", "sequences per engine step", true, "256"},
      {"enable_chunked_prefill", "split long prompts across steps (true/false)", true, "true"},
      {"enable_prefix_caching", "reuse K/V of shared prompt prefixes (true/false)", true, "true"},
      {"block_size", "tokens per KV block", true, "16"},
      {"swap_space", "GiB of host swap area for preemption_mode=swap", true, "4"},
      {"preemption_mode", "recompute or swap", true, "recompute"},
      {"seed", "base seed; line i uses seed + i unless it gives its own \"seed\"", true, "0"},
  };
  return f;
}

bool parse_bool(const std::string& k, const std::string& v) {
  if (v == "true" || v == "True" || v == "1") return true;
  if (v == "false" || v == "False" || v == "0") return false;
  KS_FAIL("kestrel generate: ", k, " must be true or false, got '", v, "'");
}
double parse_double(const std::string& k, const std::string& v) {
  try {
    size_t pos = 0;
    const double x = std::stod(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  KS_FAIL("kestrel generate: ", k, " must be a number, got '", v, "'");
}
int64_t parse_int(const std::string& k, const std::string& v) {
  try {
    size_t pos = 0;
    const int64_t x = std::stoll(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  KS_FAIL("kestrel generate: ", k, " must be an integer, got '", v, "'");
}

struct Prompt {
  std::vector<int32_t> ids;
  std::optional<uint64_t> seed;
};

void progress(int64_t done, int64_t total, int64_t out_tokens, double secs) {
  constexpr int kWidth = 30;
  const int fill = total > 0 ? int(kWidth * done / total) : kWidth;
  std::string bar(size_t(fill), '=');
  if (fill < kWidth) bar += '>' + std::string(size_t(kWidth - fill - 1), ' ');
  std::fprintf(stderr, "\r[%s] %lld/%lld prompts  %.0f output tok/s ", bar.c_str(), (long long)done,
               (long long)total, out_tokens / std::max(secs, 1e-9));
  std::fflush(stderr);
}

}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> specs = {
      {"model", "HF model folder (config.json + safetensors; tokenizer.json for text prompts)", true, ""},
      {"input", "JSONL: {\"input_ids\": [...]}, {\"prompt\": \"...\"} or {\"messages\": [...]} per line", true, ""},
      {"output", "JSONL written atomically, one line per input line", true, ""},
      {"dtype", "compute dtype: f32 or bf16", true, "f32"},
      {"threads", "CPU threads (0 = all cores)", true, "0"},
      {"kv_cache_gib", "GiB of KV cache", true, "1"},
      {"max_model_len", "longest prompt + response (0 = max_position_embeddings)", true, "0"},
      {"ignore_eos", "keep generating past EOS", false, ""},
      {"logprobs", "also return the top-k logprobs per token", true, "0"},
      {"quiet", "no progress bar", false, ""},
  };
  const auto& rf = rollout_flags();
  specs.insert(specs.end(), rf.begin(), rf.end());
  ParsedArgs args("generate", specs, argv);
  if (args.help()) {
    std::printf("%s  KEY=VALUE or actor_rollout_ref.rollout.KEY=VALUE overrides any rollout option above.\n",
                args.usage().c_str());
    return 0;
  }
  // Rollout options: flags, then key=value overrides (which win).
  std::map<std::string, std::string> opt;
  for (const auto& f : rf) opt[f.name] = args.get(f.name);
  for (const auto& p : args.positional()) {
    const auto eq = p.find('=');
    if (eq == std::string::npos) KS_FAIL("kestrel generate: unexpected argument '", p, "' (options are --key value or key=value)");
    std::string key = p.substr(0, eq);
    const std::string prefix = "actor_rollout_ref.rollout.";
    if (key.rfind(prefix, 0) == 0) key = key.substr(prefix.size());
    if (!opt.count(key)) {
      std::string valid;
      for (const auto& f : rf) valid += " " + f.name;
      KS_FAIL("kestrel generate: unknown rollout key '", key, "' in override '", p, "'; valid keys:", valid);
    }
    opt[key] = p.substr(eq + 1);
  }

  const std::string model_dir = args.require("model"), in = args.require("input"), out = args.require("output");
  DType dtype;
  if (!parse_dtype(args.get("dtype"), &dtype) || (dtype != DType::F32 && dtype != DType::BF16))
    KS_FAIL("kestrel generate: --dtype must be f32 or bf16, got '", args.get("dtype"), "'");
  set_num_threads(int(args.get_int("threads")));

  model::ModelOptions mo;
  mo.dtype = dtype;
  auto loaded = model::CausalLM::load(model_dir, mo);
  if (!loaded.is_ok()) KS_FAIL(loaded.status().message());
  const model::CausalLM& m = *loaded.value();

  std::optional<data::ChatTokenizer> tok;
  if (std::filesystem::exists(model_dir + "/tokenizer.json")) {
    auto t = data::ChatTokenizer::from_dir(model_dir);
    if (!t.is_ok()) KS_FAIL(t.status().message());
    tok.emplace(std::move(t.value()));
  }

  rollout::EngineConfig ec;
  ec.block_size = parse_int("block_size", opt["block_size"]);
  ec.kv_cache_bytes = int64_t(parse_double("kv_cache_gib", args.get("kv_cache_gib")) * double(int64_t(1) << 30));
  ec.max_num_batched_tokens = parse_int("max_num_batched_tokens", opt["max_num_batched_tokens"]);
  ec.max_num_seqs = parse_int("max_num_seqs", opt["max_num_seqs"]);
  ec.enable_chunked_prefill = parse_bool("enable_chunked_prefill", opt["enable_chunked_prefill"]);
  ec.enable_prefix_caching = parse_bool("enable_prefix_caching", opt["enable_prefix_caching"]);
  ec.preemption_mode = opt["preemption_mode"];
  ec.swap_space_gib = parse_double("swap_space", opt["swap_space"]);
  ec.max_model_len = args.get_int("max_model_len");
  if (tok) ec.detokenize = [&](const std::vector<int32_t>& ids) { return tok->tokenizer().decode(ids); };

  rollout::SamplingParams sp;
  sp.temperature = parse_double("temperature", opt["temperature"]);
  sp.top_k = parse_int("top_k", opt["top_k"]);
  sp.top_p = parse_double("top_p", opt["top_p"]);
  sp.min_p = parse_double("min_p", opt["min_p"]);
  sp.n = parse_int("n", opt["n"]);
  sp.max_tokens = parse_int("response_length", opt["response_length"]);
  sp.ignore_eos = args.has("ignore_eos");
  sp.logprobs = args.get_int("logprobs");
  const uint64_t base_seed = uint64_t(parse_int("seed", opt["seed"]));

  const int64_t V = m.config().vocab_size;
  std::vector<Prompt> prompts;
  Status st = for_each_jsonl(in, [&](const nlohmann::json& j, int64_t) -> Status {
    if (!j.is_object()) return KS_ERR("expected a JSON object per line");
    Prompt p;
    if (j.contains("seed")) {
      if (!j["seed"].is_number_integer()) return KS_ERR("\"seed\" must be an integer");
      p.seed = j["seed"].get<uint64_t>();
    }
    if (j.contains("input_ids")) {
      if (!j["input_ids"].is_array()) return KS_ERR("\"input_ids\" must be an array of token ids");
      for (const auto& x : j["input_ids"]) {
        if (!x.is_number_integer()) return KS_ERR("\"input_ids\" must hold integers, found ", x.dump());
        const int64_t v = x.get<int64_t>();
        if (v < 0 || v >= V) return KS_ERR("token id ", v, " is outside the vocabulary [0, ", V, ")");
        p.ids.push_back(int32_t(v));
      }
    } else if (j.contains("prompt") || j.contains("messages")) {
      if (!tok) return KS_ERR("text prompts need ", model_dir, "/tokenizer.json (or give \"input_ids\")");
      if (j.contains("prompt")) {
        if (!j["prompt"].is_string()) return KS_ERR("\"prompt\" must be a string");
        p.ids = tok->tokenizer().encode(j["prompt"].get<std::string>(), true);
      } else {
        if (!tok->has_chat_template())
          return KS_ERR("\"messages\" need a chat template in ", model_dir, "/tokenizer_config.json");
        auto text = tok->render(nlohmann::ordered_json::parse(j["messages"].dump()), true);
        if (!text.is_ok()) return text.status();
        p.ids = tok->encode(text.value());
      }
    } else {
      return KS_ERR("expected \"input_ids\", \"prompt\" or \"messages\"");
    }
    if (p.ids.empty()) return KS_ERR("empty prompt");
    prompts.push_back(std::move(p));
    return Status::ok();
  });
  if (!st.is_ok()) KS_FAIL(st.message());

  auto created = rollout::Engine::create(m, ec);
  if (!created.is_ok()) KS_FAIL(created.status().message());
  rollout::Engine& eng = *created.value();
  for (size_t i = 0; i < prompts.size(); ++i) {
    rollout::SamplingParams p = sp;
    p.seed = prompts[i].seed ? *prompts[i].seed : base_seed + i;
    Status as = eng.add_request(std::to_string(i), prompts[i].ids, p);
    if (!as.is_ok()) KS_FAIL(in, ":", i + 1, ": ", as.message());
  }

  const bool quiet = args.has("quiet");
  const auto t0 = Clock::now();
  auto last_draw = t0;
  std::vector<std::optional<rollout::RequestOutput>> results(prompts.size());
  int64_t done = 0;
  while (eng.has_unfinished()) {
    for (auto& o : eng.step()) {
      const size_t i = size_t(std::stoll(o.request_id));
      results[i] = std::move(o);
      ++done;
    }
    const auto now = Clock::now();
    if (!quiet && (now - last_draw > std::chrono::milliseconds(250) || !eng.has_unfinished())) {
      progress(done, int64_t(prompts.size()), eng.stats().generated_tokens,
               std::chrono::duration<double>(now - t0).count());
      last_draw = now;
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!quiet) std::fprintf(stderr, "\n");

  AtomicFile f(out);
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = *results[i];
    nlohmann::ordered_json o;
    o["prompt_ids"] = r.prompt_token_ids;
    nlohmann::ordered_json outs = nlohmann::ordered_json::array();
    for (const auto& c : r.outputs) {
      nlohmann::ordered_json x;
      x["token_ids"] = c.token_ids;
      x["logprobs"] = c.logprobs;
      x["finish_reason"] = c.finish_reason;
      if (!c.top_logprobs.empty()) {
        nlohmann::ordered_json tl = nlohmann::ordered_json::array();
        for (const auto& step : c.top_logprobs) {
          nlohmann::ordered_json s = nlohmann::ordered_json::array();
          for (const auto& [id, lp] : step) s.push_back({id, lp});
          tl.push_back(s);
        }
        x["top_logprobs"] = tl;
      }
      if (tok) x["text"] = tok->tokenizer().decode(c.token_ids, true);
      outs.push_back(x);
    }
    o["outputs"] = outs;
    Status ws = f.write(o.dump() + "\n");
    if (!ws.is_ok()) KS_FAIL(ws.message());
  }
  Status cs = f.commit();
  if (!cs.is_ok()) KS_FAIL(cs.message());

  const rollout::EngineStats s = eng.stats();
  std::fprintf(stderr,
               "kestrel generate: %zu prompts x n=%lld in %.2f s -> %s\n"
               "  prompt tokens: %lld (%.0f tok/s)   output tokens: %lld (%.0f tok/s)\n"
               "  prefix-cache hit rate: %.1f%% (%lld of %lld prompt tokens)   preemptions: %lld "
               "(swapped out %lld blocks)   steps: %lld\n",
               prompts.size(), (long long)sp.n, secs, out.c_str(), (long long)s.prompt_tokens,
               s.prompt_tokens / std::max(secs, 1e-9), (long long)s.generated_tokens,
               s.generated_tokens / std::max(secs, 1e-9),
               s.prefix_cache_queries ? 100.0 * double(s.prefix_cache_hits) / double(s.prefix_cache_queries) : 0.0,
               (long long)s.prefix_cache_hits, (long long)s.prefix_cache_queries, (long long)s.preemptions,
               (long long)s.swapped_out_blocks, (long long)s.steps);
  return 0;
}

}  // namespace kestrel::cli

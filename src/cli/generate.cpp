// kestrel generate: offline batch generation with the rollout engine.
// Input lines are {"input_ids": [...]}, {"prompt": "text"} or
// {"messages": [...]} (the last two need the model folder's tokenizer and,
// for messages, its chat template); each may carry its own "seed". Output
// lines (input order, written atomically) are
//   {"prompt_ids": [...], "outputs": [{"token_ids", "logprobs", "finish_reason"(, "text")}]}.
// Options are verl's actor_rollout_ref.rollout.* names, as --key value or as
// key=value / actor_rollout_ref.rollout.key=value overrides.
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "config/config.h"
#include "core/files.h"
#include "core/parallel_for.h"
#include "data/chat_tokenizer.h"
#include "rollout/engine.h"

namespace kestrel::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kRollout = "actor_rollout_ref.rollout.";

// The view's rollout keys a bare name may stand for (`temperature=0`, `--top_p 0.9`).
std::vector<std::string> bare_rollout_keys() {
  std::vector<std::string> out;
  const std::string r = kRollout;
  for (const auto& d : config::generate_schema().keys())
    if (d.path.rfind(r, 0) == 0 && d.status == config::Support::Supported && d.path.find('.', r.size()) == std::string::npos)
      out.push_back(d.path.substr(r.size()));
  return out;
}

// `key=value` with a bare rollout key gets its full name; Hydra's +, ++ and ~ stay in front.
std::string qualify(const std::string& o) {
  size_t ops = 0;
  while (ops < o.size() && (o[ops] == '+' || o[ops] == '~')) ++ops;
  const size_t eq = o.find('=');
  const std::string key = o.substr(ops, eq == std::string::npos ? std::string::npos : eq - ops);
  const config::Schema& s = config::generate_schema();
  if (s.find(key) || s.is_section(key) || !s.find(kRollout + key)) return o;
  return o.substr(0, ops) + kRollout + o.substr(ops);
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

// Input lines -> prompts: token ids, text (tokenizer) or chat messages (chat template).
std::vector<Prompt> read_prompts(const std::string& in, int64_t V, const data::ChatTokenizer* tok,
                                 const std::string& tok_dir) {
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
      if (!tok) return KS_ERR("text prompts need ", tok_dir, "/tokenizer.json (or give \"input_ids\")");
      if (j.contains("prompt")) {
        if (!j["prompt"].is_string()) return KS_ERR("\"prompt\" must be a string");
        p.ids = tok->tokenizer().encode(j["prompt"].get<std::string>(), true);
      } else {
        if (!tok->has_chat_template())
          return KS_ERR("\"messages\" need a chat template in ", tok_dir, "/tokenizer_config.json");
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
  return prompts;
}

// The engine's message in the terms of this command: the input line stands
// for "request 'N'", and the engine's field names become the config keys that
// set them.
std::string with_config_keys(std::string msg) {
  if (msg.rfind("request '", 0) == 0) {
    const size_t end = msg.find("': ");
    if (end != std::string::npos) msg = msg.substr(end + 3);
  }
  const std::pair<const char*, const char*> keys[] = {
      {"raise max_model_len", "raise actor_rollout_ref.rollout.max_model_len (or the model's max_position_embeddings)"},
      {"raise kv_cache_bytes / num_blocks", "raise actor_rollout_ref.rollout.gpu_memory_utilization"},
      {"lower max_tokens", "lower actor_rollout_ref.rollout.response_length"}};
  for (const auto& [from, to] : keys)
    if (size_t at = msg.find(from); at != std::string::npos) msg.replace(at, std::strlen(from), to);
  return msg;
}

// One output line per input line, in input order, written atomically.
void write_outputs(const std::string& out, const std::vector<std::optional<rollout::RequestOutput>>& results,
                   const data::ChatTokenizer* tok) {
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
}

}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> specs = {
      {"model", "HF model folder (config.json + safetensors; tokenizer.json for text prompts)", true, ""},
      {"input", "JSONL: {\"input_ids\": [...]}, {\"prompt\": \"...\"} or {\"messages\": [...]} per line", true, ""},
      {"output", "JSONL written atomically, one line per input line", true, ""},
      {"dtype", "compute dtype f32 | bf16 (actor_rollout_ref.rollout.dtype)", true, "f32"},
      {"threads", "CPU threads (0 = all cores)", true, "0"},
      {"logprobs", "also return the top-k logprobs per token", true, "0"},
      {"quiet", "no progress bar", false, ""},
      {"config", "YAML file of actor_rollout_ref.rollout / model keys", true, ""},
  };
  // Every rollout key as --key VALUE too (help and default from the table).
  const std::vector<std::string> bare = bare_rollout_keys();
  for (const auto& k : bare) {
    const config::KeyDecl* d = config::generate_schema().find(kRollout + k);
    // --ignore_eos stays a switch; the other keys take a value (--enable_prefix_caching false).
    specs.push_back({k, d->doc, k != "ignore_eos", d->default_yaml});
  }
  ParsedArgs args("generate", specs, argv);
  if (args.help()) {
    std::printf("%s  KEY=VALUE or actor_rollout_ref.rollout.KEY=VALUE overrides any rollout key "
                "('kestrel config docs generate' lists them).\n",
                args.usage().c_str());
    return 0;
  }
  // Flags that name keys come first; key=value overrides (which win) after them.
  std::vector<std::string> first, rest;
  if (args.has("model")) first.push_back("actor_rollout_ref.model.path=" + args.get("model"));
  if (args.has("dtype"))
    first.push_back(std::string(kRollout) + "dtype=" +
                    std::string(parse_compute_dtype(args.get("dtype"), "--dtype") == DType::BF16 ? "bfloat16" : "float32"));
  for (const auto& k : bare)
    if (args.has(k)) first.push_back(std::string(kRollout) + k + "=" + args.get(k));
  if (args.has("config")) rest.push_back("--config=" + args.get("config"));
  for (const auto& p : args.positional()) {
    if (p.find('=') == std::string::npos && p[0] != '~')
      KS_FAIL("kestrel generate: unexpected argument '", p, "' (options are --key value or key=value)");
    rest.push_back(qualify(p));
  }
  const config::Config cfg = load_command_config(config::generate_schema(), rest, first);
  GenerateSettings gs = generate_settings(cfg);

  const std::string in = args.require("input"), out = args.require("output");
  // Refused before the model loads: a symlink/FIFO/device, the input itself, a missing or read-only folder.
  check_output_file(out, "--output", {{in, "--input"}}).throw_if_error();
  set_num_threads(int(args.get_int("threads")));
  init_gemm_for_job();

  const std::string model_dir = resolve_model_folder(gs.model_path);
  model::ModelOptions mo;
  mo.dtype = gs.dtype;
  mo.moe.router_logits_fp32 = gs.router_logits_fp32;  // the rollout routes as training does
  auto loaded = model::CausalLM::load(model_dir, mo);
  if (!loaded.is_ok()) KS_FAIL(loaded.status().message());
  const model::CausalLM& m = *loaded.value();

  const std::string tok_dir = gs.tokenizer_path.empty() ? model_dir : gs.tokenizer_path;
  std::optional<data::ChatTokenizer> tok;
  if (std::filesystem::exists(tok_dir + "/tokenizer.json")) {
    auto t = data::ChatTokenizer::from_dir(tok_dir);
    if (!t.is_ok()) KS_FAIL(t.status().message());
    tok.emplace(std::move(t.value()));
  }

  rollout::EngineConfig ec = gs.engine;
  auto mem = rollout::device_memory_bytes(local_ranks());
  if (!mem) KS_FAIL(mem.status().message());
  auto kv = rollout::kv_cache_bytes_for(gs.gpu_memory_utilization, *mem, rollout::weight_bytes(m));
  if (!kv) KS_FAIL(cfg.origin(std::string(kRollout) + "gpu_memory_utilization"), ": ", kv.status().message());
  ec.kv_cache_bytes = *kv;
  if (tok) ec.detokenize = [&](const std::vector<int32_t>& ids) { return tok->tokenizer().decode(ids); };

  rollout::SamplingParams sp = gs.sampling;
  sp.logprobs = args.get_int("logprobs");
  const uint64_t base_seed = gs.base_seed;

  const std::vector<Prompt> prompts = read_prompts(in, m.config().vocab_size, tok ? &*tok : nullptr, tok_dir);

  auto created = rollout::Engine::create(m, ec);
  if (!created.is_ok()) KS_FAIL(created.status().message());
  rollout::Engine& eng = *created.value();
  for (size_t i = 0; i < prompts.size(); ++i) {
    rollout::SamplingParams p = sp;
    p.seed = prompts[i].seed ? *prompts[i].seed : base_seed + i;
    Status as = eng.add_request(std::to_string(i), prompts[i].ids, p);
    if (!as.is_ok()) KS_FAIL(in, ":", i + 1, ": ", with_config_keys(as.message()));
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

  write_outputs(out, results, tok ? &*tok : nullptr);

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

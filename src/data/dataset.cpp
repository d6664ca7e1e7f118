#include "data/dataset.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_limits.h"
#include "io/parquet/parquet.h"

namespace kestrel::data {

namespace {

using oj = nlohmann::ordered_json;

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

Status check_input_file(const std::string& path) {
  if (!std::filesystem::exists(path)) return KS_ERR(path, ": no such file (check data.train_files / data.val_files)");
  return Status::ok();
}

// A field error of a row; the caller prefixes file:line.
Status field_error(const std::string& field, const std::string& what) {
  return KS_ERR("field '", field, "' ", what);
}

// A chat-message list: [{"role": str, "content": str, ...}, ...]. A string is one user turn.
Result<oj> as_messages(const oj& v, const std::string& field) {
  if (v.is_string()) return oj::array({{{"role", "user"}, {"content", v.get<std::string>()}}});
  if (!v.is_array() || v.empty())
    return field_error(field, "must be a non-empty list of chat messages or a string");
  for (size_t i = 0; i < v.size(); ++i) {
    const auto& m = v[i];
    if (!m.is_object()) return field_error(field + "[" + std::to_string(i) + "]", "must be an object with role and content");
    if (!m.contains("role") || !m["role"].is_string())
      return field_error(field + "[" + std::to_string(i) + "].role", "must be a string");
    if (!m.contains("content") || !m["content"].is_string())
      return field_error(field + "[" + std::to_string(i) + "].content", "must be a string");
  }
  return v;
}

// Rows of a Parquet file, one row group in memory at a time, until fn sets
// *stop. A file that cannot be decoded is an error whatever skip_malformed says.
Status read_parquet_rows(const std::string& path, const std::function<Status(oj&, int64_t)>& fn, const bool* stop) {
  KS_ASSIGN(auto file, io::parquet::ParquetFile::open(path));
  int64_t index = 0;
  for (int g = 0; g < file->num_row_groups() && !*stop; ++g) {
    KS_ASSIGN(auto rows, file->read_row_group(g));
    for (auto& r : rows) {
      if (*stop) break;
      KS_TRY(fn(r, index++));
    }
  }
  return Status::ok();
}

// Runs every row of every file through fn, applying the malformed-row policy.
// A row's origin is file:line for JSONL and file:row N (from 0) for Parquet.
Status for_each_row(const std::vector<std::string>& files, bool skip_malformed, int64_t max_samples, LoadStats& st,
                    const std::function<Status(oj&, const std::string& origin)>& fn) {
  for (const auto& f : files) {
    KS_TRY(check_input_file(f));
    const bool parquet = is_parquet_path(f);
    bool stop = false;
    auto where = [&](int64_t n) { return f + (parquet ? ":row " : ":") + std::to_string(n); };
    auto bad = [&](const std::string& err, int64_t n) -> Status {
      const std::string msg = where(n) + ": " + err;
      if (!skip_malformed) return KS_ERR(msg, " (fix the row, or set data.skip_malformed=true to skip such rows)");
      ++st.skipped_malformed;
      if (st.first_skipped.size() < 5) st.first_skipped.push_back(msg);
      return Status::ok();
    };
    auto each = [&](oj& row, int64_t n) -> Status {
      if (stop) return Status::ok();
      if (max_samples >= 0 && st.kept >= max_samples) { stop = true; return Status::ok(); }
      Status s = fn(row, where(n));
      if (!s.is_ok()) return bad(s.message(), n);
      return Status::ok();
    };
    if (parquet) KS_TRY(read_parquet_rows(f, each, &stop));
    else KS_TRY(read_jsonl_rows(f, each, bad));
  }
  return Status::ok();
}

// The columns a loader needs, as paths: {"reward_model", "ground_truth"}.
using Field = std::vector<std::string>;

std::string dotted(const Field& f) {
  std::string s;
  for (const auto& p : f) s += (s.empty() ? "" : ".") + p;
  return s;
}

// `alternatives`: the file must hold every field of at least one of them.
Status check_file_fields(const std::string& path, const std::vector<std::vector<Field>>& alternatives,
                         const std::string& why, bool skip_malformed) {
  KS_TRY(check_input_file(path));
  std::function<bool(const Field&)> has;
  std::string present;
  std::unique_ptr<io::parquet::ParquetFile> pf;
  oj first;
  if (is_parquet_path(path)) {
    KS_ASSIGN(pf, io::parquet::ParquetFile::open(path));
    KS_TRY(pf->check_supported());
    for (const auto& c : pf->columns()) present += (present.empty() ? "" : ", ") + c;
    has = [&](const Field& f) { return pf->has_field(f); };
  } else {
    // JSONL: the first row stands for the file (later rows are checked as they load).
    std::ifstream in(path, std::ios::binary);
    if (!in) return KS_ERR(path, ": cannot open (does the file exist and is it readable?)");
    std::string line;
    bool any = false;
    while (!any && std::getline(in, line)) any = line.find_first_not_of(" \t\r\n") != std::string::npos;
    if (!any) return KS_ERR(path, ": no rows (the file is empty); give a JSONL file with one JSON object per line");
    if (json_nesting_depth(line) > kMaxJsonDepth) return Status::ok();  // reported with its line by the loader
    try {
      first = oj::parse(line);
    } catch (const nlohmann::json::exception&) {
      return Status::ok();  // reported with its line number by the loader
    }
    if (!first.is_object() || skip_malformed) return Status::ok();
    for (const auto& [k, v] : first.items()) present += (present.empty() ? "" : ", ") + k;
    has = [&](const Field& f) {
      const oj* cur = &first;
      for (const auto& p : f) {
        if (!cur->is_object() || !cur->contains(p)) return false;
        cur = &(*cur)[p];
      }
      return true;
    };
  }
  for (const auto& alt : alternatives) {
    bool all = true;
    for (const auto& f : alt) all = all && has(f);
    if (all) return Status::ok();
  }
  std::string missing;
  for (const auto& f : alternatives[0])
    if (!has(f)) missing += (missing.empty() ? "'" : ", '") + dotted(f) + "'";
  return KS_ERR(path, ": no column ", missing, " (", why, "); ", pf ? "the file's columns are: " : "the first row's keys are: ",
                present.empty() ? "(none)" : present);
}

}  // namespace

bool is_parquet_path(const std::string& path) { return ends_with(path, ".parquet"); }

Status check_rl_files(const std::vector<std::string>& files, const RlDatasetOptions& opt) {
  const std::string why = "an RL row needs data.prompt_key='" + opt.prompt_key +
                          "', data_source and reward_model.ground_truth";
  for (const auto& f : files)
    KS_TRY(check_file_fields(f, {{Field{opt.prompt_key}, {"data_source"}, {"reward_model", "ground_truth"}}}, why,
                             opt.skip_malformed));
  return Status::ok();
}

Status check_sft_files(const std::vector<std::string>& files, const SftDatasetOptions& opt) {
  const std::string why = "an SFT row needs '" + opt.messages_key + "', or '" + opt.prompt_key + "' and '" +
                          opt.response_key + "' (data.messages_key / prompt_key / response_key)";
  for (const auto& f : files)
    KS_TRY(check_file_fields(f, {{Field{opt.prompt_key}, Field{opt.response_key}}, {Field{opt.messages_key}}},
                             why, opt.skip_malformed));
  return Status::ok();
}


std::string LoadStats::summary() const {
  std::ostringstream os;
  os << kept << " of " << rows << " rows kept";
  if (skipped_malformed) os << ", " << skipped_malformed << " malformed skipped";
  if (filtered_overlong) os << ", " << filtered_overlong << " overlong filtered";
  if (truncated) os << ", " << truncated << " truncated";
  return os.str();
}

Status read_jsonl_rows(const std::string& path, const std::function<Status(oj&, int64_t)>& fn,
                       const std::function<Status(const std::string&, int64_t)>& on_bad) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return KS_ERR(path, ": cannot open (does the file exist and is it readable?)");
  std::string line;
  int64_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    oj row;
    std::string err;
    try {
      // dump(), copies and the chat template recurse per level: refuse before parsing.
      if (json_nesting_depth(line) > kMaxJsonDepth)
        err = "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels (the limit for a dataset row)";
      else row = oj::parse(line);
      if (err.empty() && !row.is_object()) err = "a row must be a JSON object";
    } catch (const nlohmann::json::exception& e) {
      err = std::string("not valid JSON: ") + e.what();
    }
    if (!err.empty()) {
      if (!on_bad) return KS_ERR(path, ":", no, ": ", err);
      KS_TRY(on_bad(err, no));
      continue;
    }
    KS_TRY(fn(row, no));
  }
  return Status::ok();
}

Result<std::vector<RlSample>> load_rl_dataset(const std::vector<std::string>& files, const ChatTokenizer& tok,
                                              const RlDatasetOptions& opt, LoadStats* stats) {
  LoadStats st;
  std::vector<RlSample> out;
  Status s = for_each_row(files, opt.skip_malformed, opt.max_samples, st, [&](oj& row, const std::string& origin) -> Status {
    ++st.rows;
    RlSample r;
    r.origin = origin;
    if (!row.contains(opt.prompt_key)) return field_error(opt.prompt_key, "is missing (data.prompt_key)");
    KS_ASSIGN(r.messages, as_messages(row[opt.prompt_key], opt.prompt_key));
    if (!row.contains("data_source") || !row["data_source"].is_string())
      return field_error("data_source", "is missing or not a string (it selects the reward rule)");
    r.data_source = row["data_source"].get<std::string>();
    const oj* gt = nullptr;
    if (row.contains("reward_model") && row["reward_model"].is_object() && row["reward_model"].contains("ground_truth"))
      gt = &row["reward_model"]["ground_truth"];
    if (!gt) return field_error("reward_model.ground_truth", "is missing");
    if (gt->is_string()) r.ground_truth = gt->get<std::string>();
    // searchR1's rows hold {"target": [...]}: the JSON text, which its scorer parses.
    else if (gt->is_number() || gt->is_object() || gt->is_array() || gt->is_boolean()) r.ground_truth = gt->dump();
    else return field_error("reward_model.ground_truth", "is null; give a string, number, list or object");
    if (row.contains("ability")) {
      if (!row["ability"].is_string()) return field_error("ability", "must be a string");
      r.ability = row["ability"].get<std::string>();
    }
    if (row.contains("extra_info")) r.extra_info = row["extra_info"];
    auto text = tok.render(r.messages, /*add_generation_prompt=*/true, opt.chat_kwargs);
    if (!text) return text.status().with_context("field '" + opt.prompt_key + "'");
    r.prompt_ids = tok.encode(*text);
    const int64_t n = int64_t(r.prompt_ids.size());
    if (n > opt.max_prompt_length) {
      if (opt.filter_overlong_prompts) {
        ++st.filtered_overlong;
        return Status::ok();
      }
      if (opt.truncation == Truncation::Error) {
        // Not a malformed row: a configuration mismatch, never skipped silently.
        KS_FAIL(origin, ": prompt is ", n, " tokens, longer than data.max_prompt_length=", opt.max_prompt_length,
                " (raise it, set data.filter_overlong_prompts=true, or data.truncation=left|right|middle)");
      }
      truncate_ids(r.prompt_ids, opt.max_prompt_length, opt.truncation);
      ++st.truncated;
    }
    out.push_back(std::move(r));
    ++st.kept;
    return Status::ok();
  });
  if (!s) return s;
  if (stats) *stats = st;
  return out;
}

int64_t SftSample::num_loss_tokens() const {
  int64_t n = 0;
  for (uint8_t m : loss_mask) n += m;
  return n;
}

Result<SftSample> tokenize_sft_row(const oj& row, const ChatTokenizer& tok, const SftDatasetOptions& opt) {
  SftSample s;
  auto append = [&](const std::string& text, uint8_t m) {
    const auto ids = tok.encode(text);
    s.ids.insert(s.ids.end(), ids.begin(), ids.end());
    s.loss_mask.insert(s.loss_mask.end(), ids.size(), m);
  };
  if (row.contains(opt.messages_key)) {
    KS_ASSIGN(oj msgs, as_messages(row[opt.messages_key], opt.messages_key));
    // Render growing prefixes: each message's text is the difference, so
    // tokens of assistant turns (after their header) get the loss.
    std::string done;
    bool any = false;
    for (size_t i = 0; i < msgs.size(); ++i) {
      oj upto = oj::array();
      for (size_t k = 0; k <= i; ++k) upto.push_back(msgs[k]);
      const bool assistant = msgs[i]["role"] == "assistant";
      if (assistant) {
        oj before = upto;
        before.erase(before.size() - 1);
        KS_ASSIGN(std::string head, tok.render(before, true, opt.chat_kwargs));
        if (head.compare(0, done.size(), done) != 0)
          return field_error(opt.messages_key, "renders differently as a prefix (the chat template is not prefix-stable)");
        append(head.substr(done.size()), 0);
        done = head;
      }
      KS_ASSIGN(std::string full, tok.render(upto, false, opt.chat_kwargs));
      if (full.compare(0, done.size(), done) != 0)
        return field_error(opt.messages_key, "renders differently as a prefix (the chat template is not prefix-stable)");
      append(full.substr(done.size()), assistant ? 1 : 0);
      any = any || assistant;
      done = full;
    }
    if (!any) return field_error(opt.messages_key, "has no assistant message to train on");
  } else {
    if (!row.contains(opt.prompt_key)) return field_error(opt.prompt_key, "is missing (or give '" + opt.messages_key + "')");
    if (!row.contains(opt.response_key) || !row[opt.response_key].is_string())
      return field_error(opt.response_key, "is missing or not a string");
    KS_ASSIGN(oj msgs, as_messages(row[opt.prompt_key], opt.prompt_key));
    if (tok.has_chat_template()) {
      KS_ASSIGN(std::string head, tok.render(msgs, true, opt.chat_kwargs));
      append(head, 0);
    } else if (row[opt.prompt_key].is_string()) {
      append(row[opt.prompt_key].get<std::string>(), 0);
    } else {
      return field_error(opt.prompt_key, "is a message list but the tokenizer has no chat template");
    }
    // verl's SFTDataset: response + eos_token.
    append(row[opt.response_key].get<std::string>() + tok.eos_token(), 1);
  }
  if (row.contains("data_source") && row["data_source"].is_string()) s.data_source = row["data_source"].get<std::string>();
  if (row.contains("reward_model") && row["reward_model"].is_object() && row["reward_model"].contains("ground_truth")) {
    const auto& gt = row["reward_model"]["ground_truth"];
    s.ground_truth = gt.is_string() ? gt.get<std::string>() : gt.dump();
  }
  s.prompt_length = 0;
  while (s.prompt_length < int64_t(s.loss_mask.size()) && !s.loss_mask[size_t(s.prompt_length)]) ++s.prompt_length;
  return s;
}

Result<std::vector<SftSample>> load_sft_dataset(const std::vector<std::string>& files, const ChatTokenizer& tok,
                                                const SftDatasetOptions& opt, LoadStats* stats) {
  LoadStats st;
  std::vector<SftSample> out;
  Status s = for_each_row(files, opt.skip_malformed, opt.max_samples, st, [&](oj& row, const std::string& origin) -> Status {
    ++st.rows;
    KS_ASSIGN(SftSample smp, tokenize_sft_row(row, tok, opt));
    smp.origin = origin;
    const int64_t n = int64_t(smp.ids.size());
    if (n > opt.max_length) {
      if (opt.truncation == Truncation::Error)
        KS_FAIL(origin, ": sample is ", n, " tokens, longer than data.max_length=", opt.max_length,
                " (raise it, or set data.truncation=left|right|middle)");
      truncate_ids(smp.ids, opt.max_length, opt.truncation, &smp.loss_mask);
      ++st.truncated;
    }
    out.push_back(std::move(smp));
    ++st.kept;
    return Status::ok();
  });
  if (!s) return s;
  if (stats) *stats = st;
  return out;
}

}  // namespace kestrel::data

// Datasets in verl's schemas, rendered with the tokenizer's chat template and
// tokenized at load time. Files are JSONL (one JSON object a line) or Parquet
// (a name ending in .parquet, as verl's data_preprocess scripts write them:
// io/parquet/parquet.h reads them natively, each row the JSON object its
// JSONL line would be), so both go through the same row checks below.
//
// RL rows (verl's RLHFDataset): `prompt` (data.prompt_key) as a chat-message
// list or a plain string (taken as one user message), `data_source`,
// `reward_model.ground_truth` (string or number), optional `extra_info` and
// `ability`. SFT rows: `messages` (multi-turn; loss on every assistant turn)
// or `prompt` (string or messages) + `response` (loss on the response and the
// EOS token that ends it).
//
// A malformed row is an error naming file:line (JSONL) or file:row N (Parquet,
// N from 0 as pandas counts) and the field; with skip_malformed it is skipped
// and counted instead. A Parquet file that cannot be decoded is an error
// whatever skip_malformed says.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/chat_tokenizer.h"

namespace kestrel::data {

struct LoadStats {
  int64_t rows = 0;               // non-blank lines read
  int64_t kept = 0;
  int64_t skipped_malformed = 0;
  int64_t filtered_overlong = 0;  // dropped by filter_overlong_prompts
  int64_t truncated = 0;
  std::vector<std::string> first_skipped;  // the first few skip reasons (file:line: ...)
  std::string summary() const;             // one line for logs
};

struct RlDatasetOptions {
  std::string prompt_key = "prompt";
  int64_t max_prompt_length = 512;
  bool filter_overlong_prompts = false;
  Truncation truncation = Truncation::Error;
  bool skip_malformed = false;
  int64_t max_samples = -1;  // -1: all rows
  nlohmann::ordered_json chat_kwargs = nlohmann::ordered_json::object();  // apply_chat_template_kwargs
};

struct RlSample {
  std::string origin;  // file:line, or file:row N for Parquet
  std::string data_source;
  nlohmann::ordered_json messages;  // the prompt as chat messages
  std::string ground_truth;
  std::string ability;
  nlohmann::ordered_json extra_info;
  std::vector<int32_t> prompt_ids;  // chat template with the generation prompt, tokenized, truncated
};

Result<std::vector<RlSample>> load_rl_dataset(const std::vector<std::string>& files, const ChatTokenizer& tok,
                                              const RlDatasetOptions& opt, LoadStats* stats = nullptr);

struct SftDatasetOptions {
  std::string prompt_key = "prompt";
  std::string response_key = "response";
  std::string messages_key = "messages";
  int64_t max_length = 1024;
  Truncation truncation = Truncation::Error;
  bool skip_malformed = false;
  int64_t max_samples = -1;
  nlohmann::ordered_json chat_kwargs = nlohmann::ordered_json::object();
};

struct SftSample {
  std::string origin;              // file:line, or file:row N for Parquet
  std::vector<int32_t> ids;        // prompt and response tokens, [L]
  std::vector<uint8_t> loss_mask;  // [L], 1 on tokens the model is trained to produce
  int64_t prompt_length = 0;       // tokens before the first trained token
  // Optional row fields for evaluation by generation: `data_source` and
  // `reward_model.ground_truth` when the row has them ("" otherwise).
  std::string data_source, ground_truth;
  int64_t num_loss_tokens() const;
};

Result<std::vector<SftSample>> load_sft_dataset(const std::vector<std::string>& files, const ChatTokenizer& tok,
                                                const SftDatasetOptions& opt, LoadStats* stats = nullptr);

// Tokenizes one SFT row (exposed for tests and `kestrel tokenize`); errors
// name the field, the caller adds file:line.
Result<SftSample> tokenize_sft_row(const nlohmann::ordered_json& row, const ChatTokenizer& tok,
                                   const SftDatasetOptions& opt);

// Whether a data file is read as Parquet (its name ends in .parquet).
bool is_parquet_path(const std::string& path);

// Checks, without loading rows, that every file exists and holds the fields
// the loader needs: Parquet files by their schema, JSONL files by their first
// row (skipped under skip_malformed). Run before any model loads, so a wrong
// path or column fails at once; the error names the file and the missing
// column and lists the columns present. RL: prompt_key, data_source,
// reward_model.ground_truth. SFT: messages_key, or prompt_key and response_key.
Status check_rl_files(const std::vector<std::string>& files, const RlDatasetOptions& opt);
Status check_sft_files(const std::vector<std::string>& files, const SftDatasetOptions& opt);

// Calls fn(parsed row, line number) for every non-blank line of a JSONL
// file; a JSON syntax error is reported as "file:line: ..." through fn's
// caller, or passed to on_bad when given (for skip_malformed).
Status read_jsonl_rows(const std::string& path,
                       const std::function<Status(nlohmann::ordered_json&, int64_t)>& fn,
                       const std::function<Status(const std::string& error, int64_t line)>& on_bad = nullptr);

}  // namespace kestrel::data

// The built-in offline task `arith`: GSM8K-style arithmetic word problems
// made by a seeded generator, so SFT and RL run with nothing downloaded.
//
// A problem is a short story about one person's count of objects that
// changes over `steps` events (+, -, or "b boxes of c" = b * c added);
// the worked solution shows each step as "x + b = y" and ends in
// "#### <answer>", the line verl's gsm8k/arith reward rules read.
// Every problem is a pure function of (seed, split, index): the same options
// always give the same files, whatever the order they are asked for.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::data {

struct ArithOptions {
  uint64_t seed = 1234;
  int min_steps = 1;         // events per story (difficulty)
  int max_steps = 2;
  int max_operand = 20;      // + and - operands (and the start count) in [1, max_operand]
  int max_mul_operand = 6;   // box count and box size in [2, max_mul_operand]
  bool allow_mul = true;
};

struct ArithProblem {
  std::string question;  // the story and the question, without instructions
  std::string solution;  // worked steps, then "#### <answer>"
  int64_t answer = 0;
  int steps = 0;
};

enum class ArithSplit : uint64_t { Train = 0, Test = 1 };

ArithProblem arith_problem(const ArithOptions& opt, ArithSplit split, uint64_t index);

// The user turn: the question plus verl's GSM8K instruction
// ("Let's think step by step and output the final answer after \"####\".").
std::string arith_user_prompt(const ArithProblem& p);

// verl-schema RL row: data_source "arith", prompt = [{"role": "user", ...}],
// ability "math", reward_model {"style": "rule", "ground_truth": "<answer>"},
// extra_info {"split", "index", "answer" (the worked solution), "question"}.
nlohmann::ordered_json arith_rl_row(const ArithProblem& p, ArithSplit split, uint64_t index);
// SFT row: {"data_source": "arith", "prompt": <user prompt>, "response": <worked
// solution>, "reward_model": {"ground_truth"}} (the last for evaluation by generation).
nlohmann::ordered_json arith_sft_row(const ArithProblem& p);

// Writes <dir>/train.jsonl and <dir>/test.jsonl (RL rows) and
// <dir>/sft_train.jsonl and <dir>/sft_test.jsonl (SFT rows), each atomically.
Status write_arith_dataset(const std::string& dir, int64_t n_train, int64_t n_test, const ArithOptions& opt);

}  // namespace kestrel::data

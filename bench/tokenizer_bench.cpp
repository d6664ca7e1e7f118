// Tokenizer encode throughput on the golden corpus repeated to ~10 MB, cut into ~2 KB documents
// (bench/peers/hf_tokenizer_bench.py builds the same documents for HF tokenizers).
//   bench_tokenizer_bench [names...]   (default: gpt2 qwen2 llama3 from tests/golden/tokenizer)
// Reports the best of 3 passes per thread count; the BPE word cache is warm after the first pass,
// as HF's is. A second table times the merge loop alone (cache off): heap vs linear scan.
#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

#ifndef KESTREL_SOURCE_DIR
#define KESTREL_SOURCE_DIR "."
#endif

using kestrel::tokenizer::Tokenizer;

namespace {

std::vector<std::string> make_docs(const std::string& corpus, size_t target_bytes, size_t doc_bytes) {
  std::vector<std::string> lines;
  size_t b = 0;
  for (size_t i = 0; i < corpus.size(); ++i)
    if (corpus[i] == '\n') { lines.push_back(corpus.substr(b, i + 1 - b)); b = i + 1; }
  if (b < corpus.size()) lines.push_back(corpus.substr(b));
  std::vector<std::string> docs;
  std::string cur;
  size_t total = 0;
  for (size_t i = 0; total < target_bytes; i = (i + 1) % lines.size()) {
    cur += lines[i];
    total += lines[i].size();
    if (cur.size() >= doc_bytes) { docs.push_back(std::move(cur)); cur.clear(); }
  }
  if (!cur.empty()) docs.push_back(std::move(cur));
  return docs;
}

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Wall seconds of f; cpu gets the process CPU seconds (all threads), which the 2-core shared dev
// machine's load does not inflate the way it inflates wall time.
double seconds_of(const std::function<void()>& f, double* cpu = nullptr) {
  const double c0 = cpu_now();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  if (cpu) *cpu = cpu_now() - c0;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  // Run from the repository root, or set KESTREL_SOURCE_DIR to it.
  const char* env_root = std::getenv("KESTREL_SOURCE_DIR");
  const std::string root = std::string(env_root ? env_root : KESTREL_SOURCE_DIR) + "/tests/golden/tokenizer/";
  std::ifstream f(root + "corpus.txt", std::ios::binary);
  if (!f) { std::fprintf(stderr, "cannot read %scorpus.txt\n", root.c_str()); return 1; }
  std::stringstream ss;
  ss << f.rdbuf();
  const auto docs = make_docs(ss.str(), 10'000'000, 2048);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) names.push_back(argv[i]);
  if (names.empty()) names = {"gpt2", "qwen2", "llama3"};
  std::printf("%zu docs, %.2f MB\n", docs.size(), bytes / 1e6);
  std::printf("%-8s %8s %10s %12s %12s\n", "name", "threads", "MB/s", "MB/cpu-s", "tokens");
  for (const auto& name : names) {
    auto r = Tokenizer::from_dir(root + name);
    if (!r) { std::fprintf(stderr, "%s\n", r.status().message().c_str()); return 1; }
    Tokenizer tok = std::move(r).value();
    for (int threads : {1, 2}) {
      double best = 1e30, best_cpu = 1e30;
      size_t n_tokens = 0;
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<std::vector<int32_t>> out;
        double cpu;
        best = std::min(best, seconds_of([&] { out = tok.encode_batch(docs, false, threads); }, &cpu));
        best_cpu = std::min(best_cpu, cpu);
        n_tokens = 0;
        for (const auto& o : out) n_tokens += o.size();
      }
      std::printf("%-8s %8d %10.2f %12.2f %12zu\n", name.c_str(), threads, bytes / 1e6 / best, bytes / 1e6 / best_cpu,
                  n_tokens);
    }
  }
  // Merge loop only (no cache), on 1 MB: which words go to the heap.
  std::vector<std::string> small(docs.begin(), docs.begin() + std::min<size_t>(docs.size(), 500));
  size_t small_bytes = 0;
  for (const auto& d : small) small_bytes += d.size();
  std::printf("\nmerge loop, cache off, 1 thread, %.2f MB\n%-8s %18s %10s\n", small_bytes / 1e6, "name", "linear limit",
              "MB/cpu-s");
  for (const auto& name : names) {
    Tokenizer tok = Tokenizer::from_dir(root + name).value();
    auto& model = *tok.mutable_impl().model;
    model.set_cache_enabled(false);
    for (size_t limit : {size_t{0}, size_t{16}, size_t{48}, size_t{1} << 30}) {
      model.set_linear_merge_limit(limit);
      double best = 1e30, cpu;
      for (int rep = 0; rep < 3; ++rep) {
        seconds_of([&] { tok.encode_batch(small, false, 1); }, &cpu);
        best = std::min(best, cpu);
      }
      std::printf("%-8s %18zu %10.2f\n", name.c_str(), limit, small_bytes / 1e6 / best);
    }
  }
  return 0;
}

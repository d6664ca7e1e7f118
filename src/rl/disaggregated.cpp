#include "rl/disaggregated.h"

#include <chrono>
#include <cstdio>
#include <cstring>

namespace kestrel::rl {

namespace {

// Tags of the channel (the weight buckets use rollout/weight_sync.h's 0x5750..).
constexpr int kTagControl = 0x5760;   // trainer -> rollout ranks: int64[3] {ControlKind, version, actor version}
constexpr int kTagStart = 0x5761;     // trainer -> rollout ranks: int64 bytes, then the start state (JSON)
constexpr int kTagToTrainer = 0x5762; // rollout leader -> trainer: int64[3] {kind, step, bytes}, then the payload

enum MessageKind : int64_t { kBatch = 1, kState = 2, kEnd = 3, kValidation = 4, kResponse = 5 };
// What follows a control word.
enum ControlKind : int64_t { kStop = -1, kWeights = 0, kWeightsThenValidate = 1, kValidateOnly = 2 };

using Clock = std::chrono::steady_clock;

std::vector<const model::Param*> const_tensors(model::CausalLM& m) {
  std::vector<const model::Param*> out;
  for (model::Param* p : m.state_tensors()) out.push_back(p);
  return out;
}

// Ordered: a state saved into a checkpoint keeps the rollout's key order (the same bytes as a colocated run's).
nlohmann::ordered_json parse_payload(const std::string& text, const char* what) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    KS_FAIL("disaggregated rollout: a malformed ", what, " message: ", e.what());
  }
}

// The rollout leader's sends: posted without blocking, their buffers kept until done.
class Outbox {
 public:
  Outbox(comm::ProcessGroup& world, int trainer) : world_(world), trainer_(trainer) {}
  ~Outbox() { flush(); }
  void send(int64_t kind, int64_t step, std::string payload) {
    auto e = std::make_unique<Entry>();
    e->payload = std::move(payload);
    e->header = {kind, step, int64_t(e->payload.size())};
    e->pending.push_back(world_.isend(e->header.data(), 3, DType::I64, trainer_, kTagToTrainer));
    if (!e->payload.empty())
      e->pending.push_back(world_.isend(e->payload.data(), int64_t(e->payload.size()), DType::U8, trainer_,
                                        kTagToTrainer));
    entries_.push_back(std::move(e));
    prune();
  }
  void flush() {
    for (auto& e : entries_)
      for (auto& p : e->pending) p->wait();
    entries_.clear();
  }

 private:
  struct Entry {
    std::vector<int64_t> header;
    std::string payload;
    std::vector<std::unique_ptr<comm::PendingTransfer>> pending;
  };
  void prune() {
    while (!entries_.empty()) {
      bool done = true;
      for (auto& p : entries_.front()->pending) done = done && p->test();
      if (!done) break;
      entries_.pop_front();
    }
  }
  comm::ProcessGroup& world_;
  int trainer_;
  std::deque<std::unique_ptr<Entry>> entries_;
};

}  // namespace

// ---- The trainer's end ----

RemoteRollout::RemoteRollout(comm::ProcessGroup& world, DisaggregatedLayout layout)
    : world_(world), layout_(std::move(layout)) {
  KS_CHECK(!layout_.rollout.empty(), "disaggregated rollout: no rollout ranks");
  KS_CHECK(world_.rank() == layout_.trainer, "disaggregated rollout: the trainer's end on world rank ", world_.rank(),
           " (the trainer is rank ", layout_.trainer, ")");
  rollout::WeightSyncOptions wo;
  wo.bucket_bytes = layout_.bucket_bytes;
  publisher_ = std::make_unique<rollout::WeightPublisher>(world_, layout_.rollout, wo);
}

RemoteRollout::~RemoteRollout() = default;

void RemoteRollout::send_control(int64_t kind, int64_t version, int64_t actor_version) {
  while (!controls_.empty() && controls_.front().second->test()) controls_.pop_front();
  for (int r : layout_.rollout) {
    std::vector<int64_t> word = {kind, version, actor_version};
    auto p = world_.isend(word.data(), 3, DType::I64, r, kTagControl);
    controls_.emplace_back(std::move(word), std::move(p));  // the vector's buffer moves with it
  }
}

void RemoteRollout::start(int64_t step, const nlohmann::json& state, model::CausalLM& actor, int64_t actor_version,
                          bool validate) {
  const std::string text = state.is_null() ? std::string() : state.dump();
  for (int r : layout_.rollout) {
    int64_t n = int64_t(text.size());
    world_.send(&n, 1, DType::I64, r, kTagStart);
    if (n > 0) world_.send(text.data(), n, DType::U8, r, kTagStart);
  }
  publish(actor, step, actor_version, validate);
}

int64_t RemoteRollout::publish(model::CausalLM& actor, int64_t version, int64_t actor_version, bool validate) {
  KS_CHECK(!stopped_, "disaggregated rollout: weights published after stop()");
  KS_CHECK(!validation_asked_, "disaggregated rollout: weights published before the asked validation was received");
  send_control(validate ? kWeightsThenValidate : kWeights, version, actor_version);
  validation_asked_ = validate;
  version_ = version;
  actor_version_ = actor_version;
  ++publishes_;
  return publisher_->publish(const_tensors(actor), version).bytes;
}

RemoteRollout::Message RemoteRollout::receive() {
  std::vector<int64_t> header(3);
  world_.recv(header.data(), 3, DType::I64, layout_.rollout[0], kTagToTrainer);
  Message m;
  m.kind = header[0];
  m.step = header[1];
  KS_CHECK(header[2] >= 0 && header[2] < (int64_t(1) << 40), "disaggregated rollout: a message of ", header[2],
           " bytes");
  m.payload.resize(size_t(header[2]));
  if (header[2] > 0) world_.recv(m.payload.data(), header[2], DType::U8, layout_.rollout[0], kTagToTrainer);
  return m;
}

void RemoteRollout::receive_and_file(const std::string& awaited) {
  Message msg = receive();
  KS_CHECK(msg.kind != kEnd, "disaggregated rollout: the rollout ranks ended before ", awaited);
  if (msg.kind == kState) {
    states_[msg.step] = parse_payload(msg.payload, "state");
  } else if (msg.kind == kBatch) {
    batches_[msg.step] = std::move(msg);
  } else if (msg.kind == kResponse) {
    const nlohmann::ordered_json j = parse_payload(msg.payload, "response");
    KS_CHECK(on_response_ != nullptr, "disaggregated rollout: a streamed response nobody asked for");
    on_response_(j.at("stream").get<int64_t>(), j.at("prompt").get<int64_t>(), j.at("sample").get<int64_t>(),
                 j.at("tokens").get<std::vector<int32_t>>());
  } else {
    KS_CHECK(msg.kind == kValidation && validation_asked_ && !validation_,
             "disaggregated rollout: a message of kind ", msg.kind, " nobody asked for");
    validation_ = std::move(msg);
  }
}

std::vector<StoredGroup> RemoteRollout::receive_batch(int64_t step, std::map<std::string, double>& m) {
  const auto t0 = Clock::now();
  while (!batches_.count(step)) receive_and_file("step " + std::to_string(step) + "'s batch");
  wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  const nlohmann::ordered_json j = parse_payload(batches_[step].payload, "batch");
  batches_.erase(step);
  std::vector<StoredGroup> groups;
  for (const auto& jg : j.at("groups")) groups.push_back(group_from_json(jg, "a rollout batch").value());
  for (const auto& [k, v] : j.at("metrics").items()) m[k] = v.get<double>();
  return groups;
}

const nlohmann::ordered_json& RemoteRollout::state_after(int64_t step) {
  while (!states_.count(step)) receive_and_file("their state of step " + std::to_string(step));
  // Older states are never asked for again.
  while (!states_.empty() && states_.begin()->first < step) states_.erase(states_.begin());
  return states_.at(step);
}

std::vector<WireResponse> RemoteRollout::receive_validation() {
  KS_CHECK(!stopped_, "disaggregated rollout: validation after stop()");
  if (!validation_asked_) send_control(kValidateOnly, version_, actor_version_);
  validation_asked_ = true;
  while (!validation_) receive_and_file("the validation");
  const std::string& bytes = validation_->payload;
  std::vector<int32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), words.size() * 4);
  validation_.reset();
  validation_asked_ = false;
  return decode_responses(words);
}

void RemoteRollout::stop() {
  if (stopped_) return;
  stopped_ = true;
  KS_CHECK(!validation_asked_, "disaggregated rollout: stopped with an asked validation not received");
  send_control(kStop, -1, -1);
  // Drain: the rollout leader ends with an end marker; nothing it posted stays unreceived.
  Message end;
  for (;;) {
    end = receive();
    if (end.kind == kEnd) break;
  }
  publisher_->wait();
  // Every update reached the rollout ranks, and the last one hashes as the trainer's weights did when sent.
  const nlohmann::ordered_json e = parse_payload(end.payload, "end");
  const int64_t got = e.at("updates").get<int64_t>();
  const std::string sum = e.at("checksum").get<std::string>();
  KS_CHECK(got == publishes_, "disaggregated rollout: the rollout ranks received ", got, " weight updates of ",
           publishes_, " sent");
  KS_CHECK(sum == std::to_string(publisher_->last_stats().checksum), "disaggregated rollout: the rollout's weights "
           "hash ", sum, " after the last update, the trainer's sent ", publisher_->last_stats().checksum);
  std::fprintf(stderr, "train: disaggregated rollout: %lld weight updates received by %zu rollout rank(s), the last "
               "one's checksum %s matching the trainer's\n", (long long)got, layout_.rollout.size(), sum.c_str());
  for (auto& c : controls_) c.second->wait();
  controls_.clear();
}

double RemoteRollout::take_wait_seconds() {
  const double w = wait_s_;
  wait_s_ = 0;
  return w;
}

// ---- A rollout rank ----

namespace {

struct RolloutRank {
  const RolloutRankInputs& in;
  int64_t version = 0, actor_version = 0;  // what this rank's weights are
  int64_t updates = 0;                      // weight updates received (the start's included)
  uint64_t last_checksum = 0;               // rollout::weights_checksum after the latest
  bool leader() const { return in.world->rank() == in.layout.rollout[0]; }

  // Blocks for the trainer's next weights, validating first or after when
  // asked (the responses go to the trainer); false on stop.
  bool receive_weights_step(RolloutWorker& worker, Outbox& out) {
    for (;;) {
      std::vector<int64_t> word(3);
      in.world->recv(word.data(), 3, DType::I64, in.layout.trainer, kTagControl);
      if (word[0] == kStop) return false;
      if (word[0] == kValidateOnly) {
        validate(worker, out);
        continue;
      }
      KS_CHECK(word[0] == kWeights || word[0] == kWeightsThenValidate, "disaggregated rollout: control word ",
               word[0]);
      rollout::WeightSyncOptions wo;
      wo.bucket_bytes = in.layout.bucket_bytes;
      const rollout::WeightSyncStats st =
          rollout::receive_weights(*in.world, in.layout.trainer, in.model->state_tensors(), wo);
      KS_CHECK(st.version == word[1], "disaggregated rollout: weights of version ", st.version,
               " after the control word for ", word[1]);
      version = word[1];
      actor_version = word[2];
      ++updates;
      // The received bytes hash as the trainer's did (receive_weights checked every tensor's): kept for the end report.
      last_checksum = rollout::weights_checksum(in.model->state_tensors());
      KS_CHECK(last_checksum == st.checksum, "disaggregated rollout: weights of version ", version,
               " hash differently after receipt");
      if (word[0] == kWeightsThenValidate) validate(worker, out);
      return true;
    }
  }

  // verl's validation on the rollouter: every rollout rank generates its share, the leader sends them all.
  void validate(RolloutWorker& worker, Outbox& out) {
    KS_CHECK(in.val_prompts != nullptr, "disaggregated rollout: asked to validate without validation prompts");
    const std::vector<WireResponse> rs = worker.generate_validation(*in.val_prompts);
    if (!leader()) return;
    const std::vector<int32_t> words = encode_responses(rs);
    std::string bytes(words.size() * 4, '\0');
    std::memcpy(bytes.data(), words.data(), bytes.size());
    out.send(kValidation, version, std::move(bytes));
  }
};

std::string batch_payload(const std::vector<StoredGroup>& groups, const std::map<std::string, double>& m) {
  nlohmann::ordered_json j;
  j["groups"] = nlohmann::ordered_json::array();
  for (const StoredGroup& g : groups) j["groups"].push_back(group_to_json(g));
  j["metrics"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : m) j["metrics"][k] = v;
  return j.dump();
}

}  // namespace

Status run_rollout_rank(const RolloutRankInputs& in) {
  KS_CHECK(in.world && in.model && in.source && in.prompts, "run_rollout_rank: missing inputs");
  RolloutRank rank{in};
  // The engine's view is this rank's model in place; its version is the actor's the trainer last sent.
  RolloutWorker worker(*in.model, [&rank] { return rank.actor_version; }, in.rollout, in.parallel);
  const int trainer = in.layout.trainer;
  Outbox out(*in.world, trainer);
  // The start: the step, the rollout's saved state (the store and the source), the weights.
  int64_t n = 0;
  in.world->recv(&n, 1, DType::I64, trainer, kTagStart);
  std::string text(size_t(n), '\0');
  if (n > 0) in.world->recv(text.data(), n, DType::U8, trainer, kTagStart);
  if (!rank.receive_weights_step(worker, out)) {  // stopped before it began
    if (rank.leader()) out.send(kEnd, 0, R"({"updates":0,"checksum":"0"})");
    return Status::ok();
  }
  const int64_t start = rank.version;

  AsyncRollout ar(
      in.async, [&] { return in.source->next_batch(); },
      [&](int64_t i) -> const std::vector<int32_t>& { return (*in.prompts)[size_t(i)]; },
      [&](const std::vector<RoundRequest>& r, const ResponseSink& sink) { return worker.generate_round(r, sink); },
      [&] { return rank.actor_version; });
  if (in.stream_responses && rank.leader())
    ar.set_on_finished([&](const StoredGroup& g, int64_t k, const std::vector<int32_t>& response) {
      nlohmann::ordered_json j;
      j["stream"] = g.stream;
      j["prompt"] = g.prompt;
      j["sample"] = k;
      j["tokens"] = response;
      out.send(kResponse, 0, j.dump());
    });
  if (n > 0) {
    const nlohmann::ordered_json st = parse_payload(text, "start");
    KS_ASSIGN(SampleStore store, SampleStore::from_json(st.at("store"), "the trainer's checkpoint (sample_store.json)"));
    ar.store() = std::move(store);
    KS_TRY(in.source->restore(st.at("data_loader"), "the trainer's checkpoint (trainer_state.json)"));
  } else {
    ar.store().set_next_stream(start * in.async.batch_prompts);
  }

  bool stopped = false;
  for (int64_t j = start; j < in.total_steps && !stopped; ++j) {
    std::map<std::string, double> m;
    bool sent = false;
    if (ar.ready(j)) {  // generated ahead: hand it over before waiting for the weights it does not need
      const auto groups = ar.take(j, m);
      if (rank.leader()) out.send(kBatch, j, batch_payload(groups, m));
      sent = true;
    }
    if (j > start && !rank.receive_weights_step(worker, out)) {
      stopped = true;
      break;
    }
    KS_CHECK(rank.version == j, "disaggregated rollout: weights of version ", rank.version, " at step ", j);
    ar.generate(j, sent);
    if (!sent) {
      const auto groups = ar.take(j, m);
      if (rank.leader()) out.send(kBatch, j, batch_payload(groups, m));
    }
    if (rank.leader()) {
      nlohmann::ordered_json st;
      st["store"] = ar.store().to_json();
      st["data_loader"] = in.source->state();
      out.send(kState, j, st.dump());
    }
  }
  // The trainer always ends with a stop word (after the last step, or early); the final weights may come first
  // for a last validation.
  if (!stopped)
    while (rank.receive_weights_step(worker, out)) {
    }
  if (rank.leader()) {
    nlohmann::ordered_json end;
    end["updates"] = rank.updates;
    end["checksum"] = std::to_string(rank.last_checksum);
    out.send(kEnd, in.total_steps, end.dump());
  }
  out.flush();
  return Status::ok();
}

}  // namespace kestrel::rl

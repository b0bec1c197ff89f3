#include "node_fast_path.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string_view>

#include "request_id.h"

namespace recstore::rpc {

namespace {

constexpr char kMultiPull[] = "/recstore.v1.ParameterServer/MultiPull";
constexpr char kPull[] = "/recstore.v1.ParameterServer/Pull";

// The request's bytes in one piece: a view of its one slice, else a copy into `storage`.
std::string_view contiguous(const grpc::ByteBuffer& buffer, grpc::Slice& one, std::string& storage) {
  if (buffer.TrySingleSlice(&one).ok()) {
    return {reinterpret_cast<const char*>(one.begin()), one.size()};
  }
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return {};
  storage.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) storage.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return storage;
}

}  // namespace

void FastPath::publish(std::map<std::string, FastTable> tables) {
  std::unique_lock<std::shared_mutex> guard(lock_);
  tables_ = std::move(tables);
  serving_ = true;
}

void FastPath::suspend() {
  std::unique_lock<std::shared_mutex> guard(lock_);  // waits for the pulls in flight
  serving_ = false;
  tables_.clear();
}

bool FastPath::serve(const std::string& method, const grpc::ByteBuffer& request,
                     grpc::ByteBuffer* reply) {
  const bool single = method == kPull;
  if (!single && method != kMultiPull) return false;
  const std::string name = single ? "Pull" : "MultiPull";
  const auto started = std::chrono::steady_clock::now();
  grpc::Slice one;
  std::string storage;
  const std::string_view bytes = contiguous(request, one, storage);
  std::vector<std::pair<std::string, uint64_t>> rows;
  if (!serve_pulls(bytes, single, reply, rows)) return false;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  served_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> guard(counts_lock_);
  for (auto& [table, n] : rows) counts_.rows[{table, name}] += n;
  counts_.calls[name] += 1;
  counts_.seconds[name] += seconds;
  std::vector<uint64_t>& buckets = counts_.buckets[name];
  buckets.resize(latency_bounds_.size() + 1);
  const auto bound = std::lower_bound(latency_bounds_.begin(), latency_bounds_.end(), seconds);
  buckets[static_cast<size_t>(bound - latency_bounds_.begin())] += 1;
  return true;
}

bool FastPath::serve_pulls(std::string_view bytes, bool single, grpc::ByteBuffer* reply,
                           std::vector<std::pair<std::string, uint64_t>>& rows) {
  serve::Request request;
  try {
    request = serve::parse(bytes, single ? serve::Method::kPull : serve::Method::kMultiPull);
  } catch (const std::exception&) {
    return false;  // malformed: the node words the refusal
  }
  if (!request.updates.empty()) return false;  // carried updates: de-dup, log, change capture
  if (!single && request_id::read(bytes, request_id::Method::kMultiPull).found) return false;
  std::shared_lock<std::shared_mutex> guard(lock_);
  if (!serving_) return false;
  std::vector<serve::Hosted> hosted;
  std::vector<std::string> names;
  for (const auto& item : request.pulls) {
    if (item.read_only) return false;
    const std::string name(item.table);
    bool known = false;
    for (const std::string& seen : names) known = known || seen == name;
    if (known) continue;
    const auto found = tables_.find(name);
    if (found == tables_.end()) return false;
    names.push_back(name);
    hosted.push_back(found->second.hosted);
    // Read before any row is: the rows served are at least this new.
    hosted.back().version = found->second.version->load(std::memory_order_acquire);
  }
  serve::Plan plan = serve::plan(request, hosted, reply_limit_);
  if (plan.refusal.code != serve::Code::kNone || !plan.native) return false;
  grpc::Slice out(plan.reply_size);
  size_t updates_applied = 0;
  try {
    serve::apply(plan, hosted, const_cast<uint8_t*>(out.begin()), updates_applied);
  } catch (const std::exception&) {
    return false;  // e.g. a table full: the node serves it again and says why
  }
  *reply = grpc::ByteBuffer(&out, 1);
  for (const serve::Pull& p : plan.pulls) rows.emplace_back(hosted[p.table].name, p.n);
  return true;
}

FastCounts FastPath::take_counts() {
  std::lock_guard<std::mutex> guard(counts_lock_);
  FastCounts out = std::move(counts_);
  counts_ = FastCounts();
  return out;
}

}  // namespace recstore::rpc

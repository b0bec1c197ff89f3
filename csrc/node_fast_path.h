// Pulls a PS node's server answers itself, on gRPC's threads: no Python, no GIL.
//
// The node publishes the tables this path may read (a host engine, no slots
// moving out, no pulled keys to record for an incremental checkpoint) with what
// the multi-table validator needs of each (node_serve.h's Hosted) and a shared
// cell holding the table's version, which the node moves after every write.
// A MultiPull of published tables only, with no carried updates, no request id
// and no read-only item, that the validator passes (node_serve.h's plan, the
// node's one set of checks) is applied by the engine straight into the reply's
// slice; so is a Pull (checked as the MultiPull of its one item). Anything else, a refusal included, goes to the node as before, so
// every error is worded and mapped in one place. The node suspends this path
// (waiting for the pulls in flight) around every call that may change what it
// published, and publishes again afterwards.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "node_serve.h"

namespace recstore::rpc {

// A table's version: read before any row of a pull, moved by the node after each write.
using VersionCell = std::atomic<uint64_t>;

struct FastTable {
  serve::Hosted hosted;  // its `version` is read from `version` at each pull
  std::shared_ptr<VersionCell> version;
};

// Rows served natively since the node last took them, per (table, method).
struct FastCounts {
  std::map<std::pair<std::string, std::string>, uint64_t> rows;
  std::map<std::string, uint64_t> calls;  // per method
  std::map<std::string, double> seconds;  // per method
  // per method, calls per latency bucket (FastPath's bounds, then one past the last)
  std::map<std::string, std::vector<uint64_t>> buckets;
};

class FastPath {
 public:
  // `latency_bounds`: the upper bounds of the latency histogram's buckets, ascending.
  FastPath(size_t reply_limit, std::vector<double> latency_bounds)
      : reply_limit_(reply_limit), latency_bounds_(std::move(latency_bounds)) {}

  // Replaces what is published and serves from it.
  void publish(std::map<std::string, FastTable> tables);
  // Stops serving, once the pulls in flight are done; until the next publish.
  void suspend();

  // Serves `request` of `method` (a full path) when it can: true with `reply` set.
  bool serve(const std::string& method, const grpc::ByteBuffer& request, grpc::ByteBuffer* reply);

  FastCounts take_counts();
  // Calls served here since the server started.
  uint64_t served() const { return served_.load(std::memory_order_relaxed); }

 private:
  // A MultiPull, or (`single`) a Pull.
  bool serve_pulls(std::string_view request, bool single, grpc::ByteBuffer* reply,
                        std::vector<std::pair<std::string, uint64_t>>& rows);

  const size_t reply_limit_;
  const std::vector<double> latency_bounds_;
  std::shared_mutex lock_;
  bool serving_ = false;
  std::map<std::string, FastTable> tables_;
  std::atomic<uint64_t> served_{0};
  std::mutex counts_lock_;
  FastCounts counts_;
};

}  // namespace recstore::rpc

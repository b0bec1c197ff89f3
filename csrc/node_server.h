// A PS node's gRPC server, in C++ (recstore.ps.serve.native_server drives it).
//
// grpc.aio spends ~0.55 ms of CPU on an empty call before the node's own code
// runs; gRPC C++'s callback API answers one for ~0.2 ms (bench/rpc_cost_bench.py,
// bench/transport_floor_bench.py). This server owns the node's one port:
// TLS, message limits, health (gRPC's own health service) and the bearer-token
// rules are applied here, on gRPC's threads, and a refused call is answered
// before its body is read (the pre-auth memory bound: HTTP/2 flow control keeps
// what is in flight to a window). Every admitted call is handed to the node's
// Python handlers as events on one queue whose eventfd the node's event loop
// watches (no GIL is taken on gRPC's threads); the handlers answer through the
// call's handle (write, finish), which any thread may use.
#pragma once

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "data_channel.h"
#include "node_fast_path.h"

namespace recstore::rpc {

// The server's key and certificate chain; `client_ca` set: clients must present a
// certificate it signed (mutual TLS).
struct ServerTlsPems {
  std::string key;
  std::string cert;
  std::string client_ca;
};

// Who may call what: with a token set, every method outside `open_prefixes` needs
// `authorization: Bearer <token>`; holders of `read_only_token` may call only the
// methods named in `read_only_methods` (a MultiPull among them only without carried
// updates) and are refused the others with PERMISSION_DENIED.
struct AccessRules {
  std::string token;  // empty: every call is admitted
  std::string read_only_token;
  std::vector<std::string> open_prefixes;
  std::string service_prefix;  // "/recstore.v1.ParameterServer/"
  std::unordered_set<std::string> read_only_methods;
  std::string read_only_refusal;  // "{method}" is replaced by the method's name
};

struct NodeServerOptions {
  std::string address;                 // host:port; port 0 picks one
  std::vector<ChannelArg> args;        // gRPC server arguments (message limits, reuseport)
  bool tls = false;
  ServerTlsPems tls_pems;
  AccessRules access;
  std::unordered_set<std::string> streamed_requests;  // full method paths read as streams
  size_t reply_limit = 0;  // the node's message limit: no reply is built larger
  std::vector<double> latency_bounds;  // the node's latency histogram buckets
};

class NodeServer;

// One admitted call as the node's handlers see it. Its reactor lives until gRPC
// says the call is done; after that every operation here is a no-op.
class ServerCall {
 public:
  const std::string& method() const { return method_; }
  const Metadata& metadata() const { return metadata_; }
  const std::string& peer() const { return peer_; }
  // The request of a unary-request call (read before the call was handed over).
  const grpc::ByteBuffer& request() const { return request_; }
  bool finished() {
    std::lock_guard<std::recursive_mutex> guard(lock_);
    return finished_;
  }

  // A streamed request's next message: a kRead event brings it (ok false: no more).
  void read();
  // A reply message of a streaming reply: a kWritten event says when it is sent.
  void write(grpc::ByteBuffer message);
  // Ends the call: `reply` (if any) goes out with the status; code 0 is OK.
  void finish(int code, const std::string& details, const Metadata& trailing,
              const grpc::ByteBuffer* reply);

 private:
  friend class CallReactor;
  std::recursive_mutex lock_;  // gRPC may end the call inside an operation made under it
  class CallReactor* reactor_ = nullptr;  // nullptr once done
  bool finished_ = false;
  std::string method_;
  Metadata metadata_;
  std::string peer_;
  grpc::ByteBuffer request_;
};

enum class EventKind { kCall = 0, kRead = 1, kWritten = 2, kCancelled = 3 };

struct Event {
  EventKind kind;
  std::shared_ptr<ServerCall> call;
  grpc::ByteBuffer message;  // kRead: the message read
  bool ok = true;            // kRead: false at the end of the stream; kWritten: false if not sent
};

class NodeServer {
 public:
  explicit NodeServer(NodeServerOptions options);  // listens and serves; throws if it cannot
  ~NodeServer();
  NodeServer(const NodeServer&) = delete;
  NodeServer& operator=(const NodeServer&) = delete;

  int port() const { return port_; }
  // Readable while events wait: the node's event loop watches it.
  int events_fd() const { return event_fd_; }
  std::vector<Event> take_events();
  // The health status of `service` ("" is the server as a whole).
  void set_serving(const std::string& service, bool serving);
  // Health NOT_SERVING, no new call, calls in flight given `grace_s` to finish and then
  // cancelled; returns once every call is done. Blocks: call it off the event loop.
  void shutdown(double grace_s);

  // -- for the reactors --
  void post(Event event);
  const NodeServerOptions& options() const { return options_; }
  FastPath& fast_path() { return fast_path_; }

 private:
  NodeServerOptions options_;
  FastPath fast_path_;
  std::unique_ptr<grpc::CallbackGenericService> service_holder_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int event_fd_ = -1;
  std::mutex events_lock_;
  std::deque<Event> events_;
  bool signalled_ = false;
  bool shut_down_ = false;
};

// The access a call's metadata gives it, checked before its body is read.
enum class Access { kFull, kReadOnly, kPullOnly, kUnauthenticated, kDenied };
Access access_of(const AccessRules& rules, const std::string& method, const Metadata& metadata);
// The token of the first `authorization` entry when it is a bearer token ("" if none).
std::string bearer_token_of(const Metadata& metadata);
// Compares in time independent of where the two differ.
bool same_secret(const std::string& given, const std::string& expected);

}  // namespace recstore::rpc

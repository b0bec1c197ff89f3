#include "node_server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "node_serve.h"

namespace recstore::rpc {

namespace {

constexpr char kAuthorization[] = "authorization";
constexpr char kBearer[] = "bearer";

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string lowered(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

std::string replaced(std::string text, const std::string& what, const std::string& with) {
  const auto at = text.find(what);
  if (at != std::string::npos) text.replace(at, what.size(), with);
  return text;
}

// Whether a MultiPull carries updates (a malformed one: no, its handler refuses it).
bool carries_updates(const grpc::ByteBuffer& request) {
  std::vector<grpc::Slice> slices;
  if (!request.Dump(&slices).ok()) return false;
  std::string bytes;
  bytes.reserve(request.Length());
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  try {
    return !serve::parse(bytes, serve::Method::kMultiPull).updates.empty();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::string bearer_token_of(const Metadata& metadata) {
  for (const auto& [key, value] : metadata) {
    if (key != kAuthorization) continue;
    const auto space = value.find(' ');
    const std::string scheme = value.substr(0, space);
    if (lowered(scheme) != kBearer) return "";
    return space == std::string::npos ? "" : trimmed(value.substr(space + 1));
  }
  return "";
}

bool same_secret(const std::string& given, const std::string& expected) {
  // Every byte of the longer is looked at, whatever differs first.
  const size_t n = std::max(given.size(), expected.size());
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    const unsigned char b = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    diff |= a ^ b;
  }
  return diff == 0;
}

Access access_of(const AccessRules& rules, const std::string& method, const Metadata& metadata) {
  if (rules.token.empty()) return Access::kFull;
  for (const std::string& prefix : rules.open_prefixes) {
    if (starts_with(method, prefix)) return Access::kFull;
  }
  const std::string given = bearer_token_of(metadata);
  if (!given.empty() && same_secret(given, rules.token)) return Access::kFull;
  if (rules.read_only_token.empty() || given.empty() || !same_secret(given, rules.read_only_token)) {
    return Access::kUnauthenticated;
  }
  if (!starts_with(method, rules.service_prefix)) return Access::kDenied;
  const std::string name = method.substr(rules.service_prefix.size());
  if (rules.read_only_methods.count(name) == 0) return Access::kDenied;
  return name == "MultiPull" ? Access::kPullOnly : Access::kReadOnly;
}

// One call on gRPC's side: admits or refuses it, reads a unary request, then relays
// every completion to the node as an event.
class CallReactor : public grpc::ServerGenericBidiReactor {
 public:
  CallReactor(NodeServer* server, grpc::GenericCallbackServerContext* context)
      : server_(server), context_(context), call_(std::make_shared<ServerCall>()) {
    call_->reactor_ = this;
    call_->method_ = context->method();
    call_->peer_ = context->peer();
    for (const auto& [key, value] : context->client_metadata()) {
      call_->metadata_.emplace_back(std::string(key.data(), key.size()),
                                    std::string(value.data(), value.size()));
    }
  }

  void begin() {
    const AccessRules& rules = server_->options().access;
    access_ = access_of(rules, call_->method_, call_->metadata_);
    if (access_ == Access::kUnauthenticated) {
      return refuse(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token"));
    }
    if (access_ == Access::kDenied) {
      const std::string name = starts_with(call_->method_, rules.service_prefix)
                                   ? call_->method_.substr(rules.service_prefix.size())
                                   : call_->method_;
      return refuse(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 replaced(rules.read_only_refusal, "{method}", name)));
    }
    if (server_->options().streamed_requests.count(call_->method_) != 0) {
      server_->post({EventKind::kCall, call_, {}, true});
    } else {
      reading_request_ = true;
      StartRead(&read_);
    }
  }

  void OnReadDone(bool ok) override {
    if (reading_request_) {
      reading_request_ = false;
      if (!ok) {
        return finish_here(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request"));
      }
      if (access_ == Access::kPullOnly && carries_updates(read_)) {
        const AccessRules& rules = server_->options().access;
        return refuse(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                   replaced(rules.read_only_refusal, "{method}", "MultiPull with updates")));
      }
      if (call_->finished()) return;  // cancelled while its request was read
      grpc::ByteBuffer reply;
      if (server_->fast_path().serve(call_->method_, read_, &reply)) {
        read_.Clear();
        return call_->finish(0, "", {}, &reply);
      }
      call_->request_ = std::move(read_);
      read_.Clear();
      return server_->post({EventKind::kCall, call_, {}, true});
    }
    Event event{EventKind::kRead, call_, {}, ok};
    if (ok) event.message = std::move(read_);
    read_.Clear();
    server_->post(std::move(event));
  }

  void OnWriteDone(bool ok) override {
    write_.Clear();
    server_->post({EventKind::kWritten, call_, {}, ok});
  }

  // Ended here at once (its status reaches nobody): a handler that is slow to see the
  // kCancelled event cannot hold up the server's shutdown.
  void OnCancel() override {
    call_->finish(static_cast<int>(grpc::StatusCode::CANCELLED), "cancelled", {}, nullptr);
    server_->post({EventKind::kCancelled, call_, {}, false});
  }

  void OnDone() override {
    {
      std::lock_guard<std::recursive_mutex> guard(call_->lock_);
      call_->reactor_ = nullptr;
    }
    delete this;
  }

  // -- the node's side, under its call's lock --
  void read() { StartRead(&read_); }
  void write(grpc::ByteBuffer message) {
    write_ = std::move(message);
    StartWrite(&write_);
  }
  void finish(const grpc::Status& status, const Metadata& trailing, const grpc::ByteBuffer* reply) {
    for (const auto& [key, value] : trailing) context_->AddTrailingMetadata(key, value);
    if (reply != nullptr && status.ok()) {
      write_ = *reply;
      StartWriteAndFinish(&write_, grpc::WriteOptions(), status);
    } else {
      Finish(status);
    }
  }

 private:
  void refuse(const grpc::Status& status) { finish_here(status); }
  // Ends the call before the node ever saw it.
  void finish_here(const grpc::Status& status) {
    std::lock_guard<std::recursive_mutex> guard(call_->lock_);
    if (call_->finished_) return;  // cancelled meanwhile: ended already
    call_->finished_ = true;
    Finish(status);
  }

  NodeServer* server_;
  grpc::GenericCallbackServerContext* context_;
  std::shared_ptr<ServerCall> call_;
  Access access_ = Access::kFull;
  bool reading_request_ = false;
  grpc::ByteBuffer read_;
  grpc::ByteBuffer write_;
};

void ServerCall::read() {
  std::lock_guard<std::recursive_mutex> guard(lock_);
  if (reactor_ != nullptr && !finished_) reactor_->read();
}

void ServerCall::write(grpc::ByteBuffer message) {
  std::lock_guard<std::recursive_mutex> guard(lock_);
  if (reactor_ != nullptr && !finished_) reactor_->write(std::move(message));
}

void ServerCall::finish(int code, const std::string& details, const Metadata& trailing,
                        const grpc::ByteBuffer* reply) {
  std::lock_guard<std::recursive_mutex> guard(lock_);
  if (reactor_ == nullptr || finished_) return;
  finished_ = true;
  reactor_->finish(grpc::Status(static_cast<grpc::StatusCode>(code), details), trailing, reply);
}

namespace {

class Service : public grpc::CallbackGenericService {
 public:
  explicit Service(NodeServer* server) : server_(server) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    auto* reactor = new CallReactor(server_, context);
    reactor->begin();
    return reactor;
  }

 private:
  NodeServer* server_;
};

}  // namespace

NodeServer::NodeServer(NodeServerOptions options)
    : options_(std::move(options)), fast_path_(options_.reply_limit, options_.latency_bounds) {
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  // The health service is gRPC's own; it is added to servers built from now on.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  for (const ChannelArg& arg : options_.args) {
    if (arg.is_int) {
      builder.AddChannelArgument(arg.name, static_cast<int>(arg.number));
    } else {
      builder.AddChannelArgument(arg.name, arg.text);
    }
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (options_.tls) {
    grpc::SslServerCredentialsOptions ssl(
        options_.tls_pems.client_ca.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = options_.tls_pems.client_ca;
    ssl.pem_key_cert_pairs.push_back({options_.tls_pems.key, options_.tls_pems.cert});
    credentials = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(options_.address, credentials, &port_);
  service_holder_ = std::make_unique<Service>(this);
  builder.RegisterCallbackGenericService(service_holder_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    close(event_fd_);
    throw std::runtime_error("the PS node could not listen on " + options_.address);
  }
}

NodeServer::~NodeServer() {
  if (server_ && !shut_down_) server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  if (event_fd_ >= 0) close(event_fd_);
}

void NodeServer::post(Event event) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> guard(events_lock_);
    events_.push_back(std::move(event));
    if (!signalled_) signalled_ = wake = true;
  }
  if (wake) {
    const uint64_t one = 1;
    ssize_t written;
    do {
      written = ::write(event_fd_, &one, sizeof(one));
    } while (written < 0 && errno == EINTR);
  }
}

std::vector<Event> NodeServer::take_events() {
  // Cleared before the queue is taken: an event posted after the take wakes the loop again.
  uint64_t count = 0;
  while (::read(event_fd_, &count, sizeof(count)) < 0 && errno == EINTR) {
  }
  std::vector<Event> out;
  std::lock_guard<std::mutex> guard(events_lock_);
  out.reserve(events_.size());
  for (Event& event : events_) out.push_back(std::move(event));
  events_.clear();
  signalled_ = false;
  return out;
}

void NodeServer::set_serving(const std::string& service, bool serving) {
  if (server_ && server_->GetHealthCheckService() != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(service, serving);
  }
}

void NodeServer::shutdown(double grace_s) {
  if (!server_ || shut_down_) return;
  shut_down_ = true;
  if (server_->GetHealthCheckService() != nullptr) server_->GetHealthCheckService()->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(
                        std::chrono::duration<double>(grace_s)));
}

}  // namespace recstore::rpc

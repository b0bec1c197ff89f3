// The SDK's data-path channel to one PS node, in C++ (recstore.client.remote.native_channel).
//
// grpcio's client spends more CPU per call than the bytes it moves cost (a
// 2 MiB reply: ~4 ms of client CPU against ~1.8 ms in C++, bench/transport_floor_bench.py),
// and holds the GIL while it copies. Here a unary call goes out through a
// GenericStub (raw ByteBuffers, no protobuf): the request's bytes are sent
// from the caller's buffer as they are (a slice released when gRPC no longer
// needs it), and the caller's own thread drives the call's completion queue
// (no hop through a gRPC callback thread, as gRPC's own blocking calls do),
// waking every few milliseconds so that it can look for signals. Plain C++
// over gRPC: the bindings (data_channel_bindings.h) hold the buffers and the GIL.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace recstore::rpc {

// One channel argument (gRPC's "grpc.*" names): an integer or a string.
struct ChannelArg {
  std::string name;
  bool is_int = true;
  int64_t number = 0;
  std::string text;
};

// What a TLS client trusts and, for mutual TLS, presents (PEM; key and cert empty: none).
struct TlsPems {
  std::string ca;
  std::string key;
  std::string cert;
};

using Metadata = std::vector<std::pair<std::string, std::string>>;

// One unary call: started by DataChannel::start, then waited for by the one thread
// that made it (wait_for and wait drive its completion queue).
class Call {
 public:
  Call(grpc::ByteBuffer request, double timeout_s, bool wait_for_ready, const Metadata& metadata);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // True once the call has finished (status set), waiting at most `wait`.
  bool wait_for(std::chrono::milliseconds wait);
  void wait();
  // Asks gRPC to end the call early (CANCELLED); it still finishes through wait.
  void cancel() { context_.TryCancel(); }

  const grpc::Status& status() const { return status_; }
  const grpc::ByteBuffer& reply() const { return reply_; }
  // The server's trailing metadata (after the call finished).
  Metadata trailing() const;

 private:
  friend class DataChannel;

  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reply_;
  grpc::Status status_;
  bool started_ = false;
  bool done_ = false;
};

class DataChannel {
 public:
  // `tls` null: plaintext.
  DataChannel(const std::string& target, const std::vector<ChannelArg>& args,
              const TlsPems* tls);

  // Sends `call` to `method` ("/package.Service/Method"). Throws std::runtime_error
  // once closed.
  void start(Call& call, const std::string& method);
  // No call starts after this; those in flight finish.
  void close();
  // Whether the channel cannot connect now (TRANSIENT_FAILURE): a call waiting for it
  // has not been sent.
  bool unreachable();

 private:
  std::mutex lock_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

}  // namespace recstore::rpc

// The transport floor's server: what gRPC C++ itself costs per call, no work behind it.
//
// One callback generic service (raw ByteBuffers, gRPC's own threads, no
// completion-queue loop of ours) answers every method:
//   /floor.Floor/Reply  the request starts with a little-endian uint64 n: the
//                       reply is n bytes, a slice of one buffer allocated at
//                       start (what a node's reply framed over its rows costs:
//                       no copy per call);
//   anything else       echoes the request's own slices back (an empty call
//                       costs what gRPC costs for a call).
// Usage: floor_server MAX_MESSAGE_BYTES REPLY_POOL_BYTES PORT
// Prints "listening PORT" once it serves, then runs until stdin closes.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr char kReplyMethod[] = "/floor.Floor/Reply";

// The first 8 bytes of `buffer` as a little-endian uint64; false when shorter.
bool leading_size(const grpc::ByteBuffer& buffer, uint64_t* size) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  unsigned char head[8];
  size_t have = 0;
  for (const grpc::Slice& s : slices) {
    const size_t take = std::min(s.size(), sizeof(head) - have);
    std::memcpy(head + have, s.begin(), take);
    have += take;
    if (have == sizeof(head)) break;
  }
  if (have < sizeof(head)) return false;
  *size = 0;
  for (int i = 7; i >= 0; --i) *size = (*size << 8) | head[i];
  return true;
}

class FloorCall : public grpc::ServerGenericBidiReactor {
 public:
  FloorCall(grpc::GenericCallbackServerContext* context, const grpc::Slice& pool)
      : sized_(context->method() == kReplyMethod), pool_(pool) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client went away before its request arrived
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "no request"));
      return;
    }
    if (sized_) {
      uint64_t size = 0;
      if (!leading_size(request_, &size) || size > pool_.size()) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "Reply needs a leading uint64 of at most the pool's size"));
        return;
      }
      grpc::Slice part = pool_.sub(0, static_cast<size_t>(size));
      reply_ = grpc::ByteBuffer(&part, 1);
    } else {
      reply_ = request_;  // shares the request's slices
    }
    StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  const bool sized_;
  const grpc::Slice& pool_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reply_;
};

class FloorService : public grpc::CallbackGenericService {
 public:
  explicit FloorService(size_t pool_bytes) : pool_(pool_bytes) {
    std::memset(const_cast<uint8_t*>(pool_.begin()), 0x5a, pool_.size());
  }
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new FloorCall(context, pool_);
  }

 private:
  grpc::Slice pool_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: floor_server MAX_MESSAGE_BYTES REPLY_POOL_BYTES PORT\n";
    return 2;
  }
  const int limit = std::atoi(argv[1]);
  FloorService service(static_cast<size_t>(std::strtoull(argv[2], nullptr, 10)));
  const std::string port = argv[3];
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:" + port, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(limit);
  builder.SetMaxSendMessageSize(limit);
  builder.AddChannelArgument("grpc.so_reuseport", 0);  // as the node's server
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::cerr << "floor_server: cannot listen on 127.0.0.1:" << port << "\n";
    return 1;
  }
  std::cout << "listening " << port << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  server->Shutdown();
  return 0;
}

// The transport floor's client: the same bytes as a step's calls, from C++.
//
// One channel per target and gRPC's callback API on a GenericStub (raw
// ByteBuffers). Each round sends one call to every target at once and waits
// for all of them (as the SDK sends one request per node, then collects), and
// copies every reply into an output buffer (as pulled rows are scattered).
// Usage: floor_client METHOD REQUEST_BYTES REPLY_BYTES MAX_MESSAGE_BYTES TARGET...
//   METHOD /floor.Floor/Reply: the request leads with REPLY_BYTES (uint64 LE);
//   any other method echoes, so REPLY_BYTES must equal REQUEST_BYTES.
// Then reads one number of rounds per line on stdin and answers each line with
// {"rounds": R, "wall_s": W, "cpu_s": C} (C: this process's CPU, every thread).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// `reply` copied into `out` (which has room for it); its size.
size_t copy_out(const grpc::ByteBuffer& reply, std::vector<uint8_t>& out) {
  std::vector<grpc::Slice> slices;
  if (!reply.Dump(&slices).ok()) return 0;
  size_t at = 0;
  for (const grpc::Slice& s : slices) {
    if (at + s.size() > out.size()) return at + s.size();
    std::memcpy(out.data() + at, s.begin(), s.size());
    at += s.size();
  }
  return at;
}

struct Target {
  std::unique_ptr<grpc::GenericStub> stub;
  std::vector<uint8_t> out;
};

// One call to every target at once, all awaited; an error message or "".
std::string round_trip(std::vector<Target>& targets, const std::string& method,
                       const grpc::ByteBuffer& request, size_t reply_bytes) {
  std::mutex lock;
  std::condition_variable done;
  size_t pending = targets.size();
  std::string failure;
  std::vector<grpc::ClientContext> contexts(targets.size());
  std::vector<grpc::ByteBuffer> replies(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i].stub->UnaryCall(
        &contexts[i], method, grpc::StubOptions(), &request, &replies[i],
        [&, i](grpc::Status status) {
          std::string error;
          if (!status.ok()) {
            error = "call failed: " + status.error_message();
          } else if (copy_out(replies[i], targets[i].out) != reply_bytes) {
            error = "reply of " + std::to_string(replies[i].Length()) + " bytes, expected " +
                    std::to_string(reply_bytes);
          }
          std::lock_guard<std::mutex> guard(lock);
          if (!error.empty() && failure.empty()) failure = error;
          if (--pending == 0) done.notify_one();
        });
  }
  std::unique_lock<std::mutex> guard(lock);
  done.wait(guard, [&] { return pending == 0; });
  return failure;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::cerr << "usage: floor_client METHOD REQUEST_BYTES REPLY_BYTES MAX_MESSAGE_BYTES "
                 "TARGET...\n";
    return 2;
  }
  const std::string method = argv[1];
  const size_t request_bytes = std::strtoull(argv[2], nullptr, 10);
  const uint64_t reply_bytes = std::strtoull(argv[3], nullptr, 10);
  const int limit = std::atoi(argv[4]);
  const bool sized = method == "/floor.Floor/Reply";
  if (sized ? request_bytes < 8 : reply_bytes != request_bytes) {
    std::cerr << "floor_client: a Reply request holds at least its 8-byte size; an echo "
                 "answers its request's size\n";
    return 2;
  }
  grpc::Slice body(request_bytes);
  auto* bytes = const_cast<uint8_t*>(body.begin());
  std::memset(bytes, 0x33, request_bytes);
  if (sized) {
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(reply_bytes >> (8 * i));
  }
  const grpc::ByteBuffer request(&body, 1);

  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(limit);
  arguments.SetMaxSendMessageSize(limit);
  std::vector<Target> targets;
  for (int i = 5; i < argc; ++i) {
    auto channel =
        grpc::CreateCustomChannel(argv[i], grpc::InsecureChannelCredentials(), arguments);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(60))) {
      std::cerr << "floor_client: no connection to " << argv[i] << "\n";
      return 1;
    }
    targets.push_back({std::make_unique<grpc::GenericStub>(channel),
                       std::vector<uint8_t>(static_cast<size_t>(reply_bytes))});
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    const long rounds = std::atol(line.c_str());
    const double cpu_before = cpu_seconds();
    const auto wall_before = std::chrono::steady_clock::now();
    for (long r = 0; r < rounds; ++r) {
      const std::string failure = round_trip(targets, method, request, reply_bytes);
      if (!failure.empty()) {
        std::cerr << "floor_client: " << failure << "\n";
        return 1;
      }
    }
    const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - wall_before;
    std::cout << "{\"rounds\": " << rounds << ", \"wall_s\": " << wall.count()
              << ", \"cpu_s\": " << cpu_seconds() - cpu_before << "}" << std::endl;
  }
  return 0;
}

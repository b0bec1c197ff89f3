// Python binding of the SDK's native data channel (recstore._native.DataChannel).
//
// Only included by module.cc, after wire_bindings.h (its Buffer holds a request).
// A call's request is the caller's bytes-like object, sent without a copy: its
// buffer is held until gRPC releases the slice, which may happen on one of
// gRPC's threads without the GIL, so released buffers wait in a list that the
// next call (holding the GIL) empties. The GIL is released while the call is
// in flight; every 50 ms the waiter takes it back to look for signals (Ctrl-C
// cancels the call, which still finishes before the error is raised). The
// waiting thread drives the call's own completion queue, as gRPC's blocking calls do.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "data_channel.h"
#include "wire_bindings.h"

namespace recstore::rpc::bindings {

namespace nb = nanobind;

// The details of a call given up on because its node could not be reached (never sent).
inline constexpr char kUnreachable[] = "the PS node could not be reached";
using namespace nb::literals;
using protowire::bindings::Buffer;

// Request buffers gRPC has let go of, released (with the GIL) by the next call.
class Released {
 public:
  static void later(void* buffer) {
    std::lock_guard<std::mutex> guard(lock());
    pending().push_back(static_cast<Buffer*>(buffer));
  }
  static void now() {  // with the GIL
    std::vector<Buffer*> done;
    {
      std::lock_guard<std::mutex> guard(lock());
      done.swap(pending());
    }
    for (Buffer* buffer : done) delete buffer;
  }

 private:
  static std::mutex& lock() {
    static std::mutex m;
    return m;
  }
  static std::vector<Buffer*>& pending() {
    static std::vector<Buffer*> v;
    return v;
  }
};

// A bytes-like object as a slice that holds the object until gRPC releases it.
inline grpc::Slice slice_of(nb::handle part) {
  auto* buffer = new Buffer(part);
  const protowire::Payload p = buffer->payload();
  return grpc::Slice(const_cast<void*>(p.data), p.size, &Released::later, buffer);
}

// A message from a bytes-like object, or a tuple of them (its parts one after the other),
// none copied.
inline grpc::ByteBuffer request_of(nb::handle request) {
  std::vector<grpc::Slice> slices;
  if (nb::isinstance<nb::tuple>(request)) {
    for (nb::handle part : nb::borrow<nb::tuple>(request)) slices.push_back(slice_of(part));
  } else {
    slices.push_back(slice_of(request));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The reply's slices copied into one new bytes object; the copy runs without the GIL
// (nothing else holds the new object yet).
inline nb::bytes reply_bytes(const grpc::ByteBuffer& reply) {
  std::vector<grpc::Slice> slices;
  if (!reply.Dump(&slices).ok()) throw std::runtime_error("unreadable reply");
  uint8_t* out = nullptr;
  nb::bytes bytes = protowire::bindings::new_bytes(reply.Length(), out);
  {
    nb::gil_scoped_release release;
    for (const grpc::Slice& s : slices) {
      std::memcpy(out, s.begin(), s.size());
      out += s.size();
    }
  }
  return bytes;
}

// Trailing metadata as Python sees it from grpcio: str values, bytes for "-bin" keys.
inline nb::tuple trailing_of(const Call& call) {
  nb::list out;
  for (const auto& [key, value] : call.trailing()) {
    const bool binary = key.size() > 4 && key.compare(key.size() - 4, 4, "-bin") == 0;
    nb::object v = binary ? nb::object(nb::bytes(value.data(), value.size()))
                          : nb::object(nb::str(value.data(), value.size()));
    out.append(nb::make_tuple(nb::str(key.data(), key.size()), v));
  }
  return nb::tuple(out);
}

enum class Waited { kFinished, kInterrupted, kUnreachable };

// Waits for `call` without the GIL. kInterrupted: a signal handler raised meanwhile (the
// call was cancelled and has finished; the Python error is set). kUnreachable: the
// channel could not connect for `unreachable_s` seconds in a row (> 0; the call, never
// sent, was cancelled and has finished).
inline Waited wait_interruptibly(Call& call, DataChannel& channel, double unreachable_s) {
  nb::gil_scoped_release release;
  const auto tick = std::chrono::milliseconds(50);
  std::chrono::steady_clock::time_point failing_since{};
  bool failing = false;
  while (!call.wait_for(tick)) {
    if (unreachable_s > 0 && channel.unreachable()) {
      const auto now = std::chrono::steady_clock::now();
      if (!failing) failing_since = now, failing = true;
      if (now - failing_since >= std::chrono::duration<double>(unreachable_s)) {
        call.cancel();
        call.wait();
        return Waited::kUnreachable;
      }
    } else {
      failing = false;
    }
    nb::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() != 0) {
      call.cancel();
      nb::gil_scoped_release again;
      call.wait();
      return Waited::kInterrupted;
    }
  }
  return Waited::kFinished;
}

inline std::vector<ChannelArg> channel_args(const nb::list& options) {
  std::vector<ChannelArg> args;
  for (nb::handle item : options) {
    auto pair = nb::cast<nb::tuple>(item);
    if (pair.size() != 2) throw std::invalid_argument("channel options are (name, value) pairs");
    ChannelArg arg;
    arg.name = nb::cast<std::string>(pair[0]);
    if (nb::isinstance<nb::str>(pair[1])) {
      arg.is_int = false;
      arg.text = nb::cast<std::string>(pair[1]);
    } else {
      arg.number = nb::cast<int64_t>(pair[1]);
    }
    args.push_back(std::move(arg));
  }
  return args;
}

// A call in flight; the channel's Python object is held so the channel outlives it.
struct Pending {
  std::unique_ptr<Call> call;
  nb::object channel;
};

// (0, reply bytes, ()) or (status code, details, trailing metadata), as gRPC answered;
// UNAVAILABLE with kUnreachable when the channel could not connect for unreachable_s.
inline nb::tuple answer(Pending& pending, double unreachable_s) {
  Call& call = *pending.call;
  const Waited waited =
      wait_interruptibly(call, nb::cast<DataChannel&>(pending.channel), unreachable_s);
  if (waited == Waited::kInterrupted) throw nb::python_error();
  if (waited == Waited::kUnreachable) {
    return nb::make_tuple(static_cast<int>(grpc::StatusCode::UNAVAILABLE), nb::str(kUnreachable),
                          nb::tuple());
  }
  const grpc::Status& status = call.status();
  if (status.ok()) return nb::make_tuple(0, reply_bytes(call.reply()), nb::tuple());
  return nb::make_tuple(static_cast<int>(status.error_code()),
                        nb::str(status.error_message().c_str()), trailing_of(call));
}

inline void bind(nb::module_& m) {
  nb::class_<Pending>(m, "PendingCall", "A unary call of a DataChannel, in flight")
      .def("wait", &answer, "unreachable_after"_a = 0.0,
           "Wait for the call (without the GIL): (0, reply bytes, ()) or (status code, "
           "details, trailing metadata); `unreachable_after` > 0: given up on, unsent, once "
           "the channel could not connect for that many seconds in a row (UNAVAILABLE, "
           "UNREACHABLE, ())");
  nb::class_<DataChannel>(m, "DataChannel",
                          "A gRPC channel for raw unary calls (the SDK's data path)")
      .def(
          "__init__",
          [](DataChannel* self, const std::string& target, const nb::list& options,
             std::optional<std::tuple<std::string, std::string, std::string>> tls) {
            TlsPems pems;
            if (tls) pems = {std::get<0>(*tls), std::get<1>(*tls), std::get<2>(*tls)};
            new (self) DataChannel(target, channel_args(options), tls ? &pems : nullptr);
          },
          "target"_a, "options"_a, "tls"_a = nb::none(),
          "`options`: [(grpc channel argument, int or str)]; `tls`: (CA, client key, client "
          "certificate) PEM ('' for no client identity), None: plaintext")
      .def(
          "start",
          [](nb::object self, const std::string& method, nb::handle request, double timeout,
             bool wait_for_ready, const Metadata& metadata) {
            Released::now();
            auto& channel = nb::cast<DataChannel&>(self);
            auto call = std::make_unique<Call>(request_of(request), timeout, wait_for_ready,
                                               metadata);
            channel.start(*call, method);
            return Pending{std::move(call), std::move(self)};
          },
          "method"_a, "request"_a, "timeout"_a, "wait_for_ready"_a, "metadata"_a,
          "Start a unary call (`timeout` <= 0: no deadline); its PendingCall's wait answers it. "
          "Calls started one after another are all in flight while the first is waited for")
      .def_prop_ro_static("UNREACHABLE", [](nb::handle) { return kUnreachable; })
      .def("close", &DataChannel::close, "No call starts after this; those in flight finish");
}

}  // namespace recstore::rpc::bindings

// Python binding of the node's gRPC server (recstore._native.NodeServer, ServerCall).
//
// Only included by module.cc, after data_channel_bindings.h (its request_of holds a
// bytes-like object in a slice, which is how replies go out here: without a copy).
// Events come out as (kind, call, message or None, ok) tuples; the GIL is released
// while the server shuts down (it waits for the calls the handlers still hold).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unordered_set.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "data_channel_bindings.h"
#include "node_serve_bindings.h"
#include "node_server.h"

namespace recstore::rpc::bindings {

// A table's version as the node and the fast path share it.
struct VersionBox {
  std::shared_ptr<VersionCell> cell = std::make_shared<VersionCell>(0);
};

inline void bind_node_server(nb::module_& m) {
  nb::enum_<EventKind>(m, "ServerEvent", "What happened to a call of the node's server")
      .value("CALL", EventKind::kCall, "a new call, admitted (a unary request is read)")
      .value("READ", EventKind::kRead, "a streamed request's message, or its end (not ok)")
      .value("WRITTEN", EventKind::kWritten, "a streamed reply's message went out (ok) or not")
      .value("CANCELLED", EventKind::kCancelled, "the call was cancelled; it is ended");

  m.def(
      "bearer_matches",
      [](const Metadata& metadata, const std::string& token) {
        const std::string given = bearer_token_of(metadata);
        return !given.empty() && same_secret(given, token);
      },
      "metadata"_a, "token"_a, "whether `metadata` carries `authorization: Bearer <token>`");

  nb::class_<VersionBox>(m, "VersionCell", "A table's version, shared with the node's fast path")
      .def(
          "__init__",
          [](VersionBox* self, uint64_t value) {
            new (self) VersionBox();
            self->cell->store(value);
          },
          "value"_a)
      .def_prop_rw(
          "value", [](const VersionBox& self) { return self.cell->load(std::memory_order_acquire); },
          [](VersionBox& self, uint64_t value) { self.cell->store(value, std::memory_order_release); });

  nb::class_<ServerCall>(m, "ServerCall", "One call of the node's server")
      .def_prop_ro("method", &ServerCall::method, "its full method path")
      .def_prop_ro("metadata", &ServerCall::metadata, "its metadata, (key, value) pairs")
      .def_prop_ro("peer", &ServerCall::peer)
      .def("request", [](const ServerCall& call) { return reply_bytes(call.request()); },
           "a unary call's request bytes")
      .def("read", &ServerCall::read, "ask for a streamed request's next message (a READ event)")
      .def(
          "write", [](ServerCall& call, nb::handle message) { call.write(request_of(message)); },
          "message"_a, "send one message of a streaming reply (a WRITTEN event follows)")
      .def(
          "finish",
          [](ServerCall& call, int code, const std::string& details, const Metadata& trailing,
             nb::handle reply) {
            if (reply.is_none()) return call.finish(code, details, trailing, nullptr);
            const grpc::ByteBuffer buffer = request_of(reply);
            call.finish(code, details, trailing, &buffer);
          },
          "code"_a, "details"_a, "trailing"_a, "reply"_a = nb::none(),
          "end the call with status `code` (0: OK), its reply (if any) sent first")
      .def_prop_ro("finished", &ServerCall::finished);

  nb::class_<NodeServer>(m, "NodeServer", "The node's gRPC server (csrc/node_server.h)")
      .def(
          "__init__",
          [](NodeServer* self, const std::string& address, const nb::list& options,
             std::optional<std::tuple<std::string, std::string, std::string>> tls,
             const std::string& token, const std::string& read_only_token,
             const std::vector<std::string>& open_prefixes, const std::string& service_prefix,
             const std::unordered_set<std::string>& read_only_methods,
             const std::string& read_only_refusal,
             const std::unordered_set<std::string>& streamed_requests, size_t reply_limit,
             const std::vector<double>& latency_bounds) {
            NodeServerOptions o;
            o.address = address;
            o.args = channel_args(options);
            if (tls) {
              o.tls = true;
              o.tls_pems = {std::get<0>(*tls), std::get<1>(*tls), std::get<2>(*tls)};
            }
            o.access = {token,          read_only_token,   open_prefixes,
                        service_prefix, read_only_methods, read_only_refusal};
            o.streamed_requests = streamed_requests;
            o.reply_limit = reply_limit;
            o.latency_bounds = latency_bounds;
            nb::gil_scoped_release release;
            new (self) NodeServer(std::move(o));
          },
          "address"_a, "options"_a, "tls"_a, "token"_a, "read_only_token"_a, "open_prefixes"_a,
          "service_prefix"_a, "read_only_methods"_a, "read_only_refusal"_a,
          "streamed_requests"_a, "reply_limit"_a, "latency_bounds"_a,
          "listens on `address` and serves; `tls`: (key, certificate, client CA or '') PEM")
      .def_prop_ro("port", &NodeServer::port)
      .def_prop_ro("events_fd", &NodeServer::events_fd)
      .def(
          "take_events",
          [](NodeServer& self) {
            Released::now();
            std::vector<Event> events = self.take_events();
            nb::list out;
            for (Event& event : events) {
              nb::object message = event.kind == EventKind::kRead && event.ok
                                       ? nb::object(reply_bytes(event.message))
                                       : nb::none();
              out.append(nb::make_tuple(event.kind, event.call, message, event.ok));
            }
            return out;
          },
          "the events since the last take: (kind, call, message or None, ok)")
      .def(
          "publish",
          [](NodeServer& self, const nb::list& tables) {
            std::map<std::string, FastTable> fast;
            for (nb::handle item : tables) {
              auto t = nb::cast<nb::tuple>(item);
              FastTable table;
              table.hosted.name = nb::cast<std::string>(t[0]);
              serve::bindings::OwnedSlots owned;  // the node keeps the mask alive
              serve::bindings::view_into(table.hosted, nb::cast<nb::tuple>(t[1]), owned);
              table.version = nb::cast<VersionBox&>(t[2]).cell;
              fast[table.hosted.name] = std::move(table);
            }
            nb::gil_scoped_release release;
            self.fast_path().publish(std::move(fast));
          },
          "tables"_a,
          "serve pulls of these tables natively: [(name, validator view, VersionCell)]; the "
          "node keeps their engines and slot masks alive until it publishes again or suspends")
      .def(
          "suspend_fast_path", [](NodeServer& self) { self.fast_path().suspend(); },
          nb::call_guard<nb::gil_scoped_release>(),
          "no pull served natively until the next publish; returns once none is in flight")
      .def(
          "take_fast_counts",
          [](NodeServer& self) {
            FastCounts counts = self.fast_path().take_counts();
            nb::list rows, calls;
            for (const auto& [key, n] : counts.rows) rows.append(nb::make_tuple(key.first, key.second, n));
            for (const auto& [method, n] : counts.calls) {
              calls.append(nb::make_tuple(method, n, counts.seconds[method], counts.buckets[method]));
            }
            return nb::make_tuple(rows, calls);
          },
          "what the fast path served since the last take: ([(table, method, rows)], "
          "[(method, calls, seconds, calls per latency bucket)])")
      .def_prop_ro(
          "served_natively", [](NodeServer& self) { return self.fast_path().served(); },
          "calls the fast path answered since the server started")
      .def("set_serving", &NodeServer::set_serving, "service"_a, "serving"_a)
      .def("shutdown", &NodeServer::shutdown, "grace"_a,
           nb::call_guard<nb::gil_scoped_release>(),
           "stop: no new call, `grace` seconds for those in flight, then cancelled");
}

}  // namespace recstore::rpc::bindings

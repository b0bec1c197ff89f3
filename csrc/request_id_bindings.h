// Python binding of the request-id reader (recstore._native.read_request_id).
//
// Only included by module.cc, after wire_decode.h (its Source holds the buffer).
// recstore.core.request_id.read checks what it returns and builds the RequestId.
#pragma once

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>

#include "request_id.h"
#include "wire_decode.h"

namespace recstore::request_id::bindings {

namespace nb = nanobind;
using namespace nb::literals;

inline Method method_of(const std::string& name) {
  if (name == "Update") return Method::kUpdate;
  if (name == "MultiUpdate") return Method::kMultiUpdate;
  if (name == "MultiPull") return Method::kMultiPull;
  throw std::invalid_argument("not a method that names its updates: " + name);
}

inline void bind(nb::module_& m) {
  m.def(
      "read_request_id",
      [](const std::string& method, nb::handle body) -> nb::object {
        const protowire::decode::Source source(body);
        const Named named = read(source.message(), method_of(method));
        if (!named.found) return nb::none();
        nb::list clients;
        for (std::string_view client : named.clients) {
          clients.append(nb::bytes(client.data(), client.size()));
        }
        nb::list rest;
        for (const auto& [start, end] : named.rest) rest.append(nb::make_tuple(start, end));
        return nb::make_tuple(clients, named.seq,
                              nb::bytes(named.digest.data(), named.digest.size()),
                              named.digest_error, nb::tuple(rest));
      },
      "method"_a, "body"_a,
      "None when `body` names no request id, else (every client field's bytes, seq, "
      "digest, the error of a malformed item or '', (start, end) of each field served again)");
}

}  // namespace recstore::request_id::bindings

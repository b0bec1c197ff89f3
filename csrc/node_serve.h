// A PS node's MultiPull / MultiUpdate served natively: parse, check, apply, reply.
//
// On a Python node each multi-table request cost several times the engine
// work it asked for (decoding, per-item numpy checks, framing). Here a request
// is parsed in place, every item is checked exactly as recstore.ps.multi would
// before anything is applied (table hosted, keys whole int64s, slots owned,
// dense ids in range, grads length, dtype, dim, lr, room in a table that
// cannot evict), carried updates are applied, pulls are written straight
// into the reply, and the reply is the bytes recstore.core.wire would frame.
// Anything the checks would refuse, or that this path does not handle
// (read-only pulls, a table on a GPU, an injected clock, a log to append), is
// *declined*: nothing is touched and the node's Python path serves the
// request, raising its precise error. The node holds the update tables'
// locks around `apply`, as it does around its own multi_update.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "table.h"

namespace recstore::serve {

// One hosted table as this path sees it.
struct Hosted {
  std::string name;
  Table* table = nullptr;
  const uint8_t* owned = nullptr;  // per slot, nonzero: owned; nullptr: every slot
  float default_lr = 0;            // the spec's lr, for updates without one
  std::string dtype;               // the table's wire dtype name
};

struct Pull {
  size_t table;  // into the hosted list
  const int64_t* keys;
  int64_t n;
  size_t value_at = 0;  // where its rows go in the reply
};

struct Update {
  size_t table;
  const int64_t* keys;
  int64_t n;
  const void* grads;
  int grad_dtype;  // DTypeCode
  float lr;
};

enum class Method { kMultiPull, kMultiUpdate };

struct Plan {
  bool declined = false;
  std::string why;  // what declined it (for tests and debugging)
  Method method = Method::kMultiPull;
  std::vector<Pull> pulls;
  std::vector<Update> updates;
  size_t reply_size = 0;
  // Copies of payloads that were not 8-byte aligned in the request.
  std::vector<std::vector<int64_t>> aligned;
};

// The table of every pull item and of every update (item or carried), in
// message order. Throws std::invalid_argument for a malformed message.
void item_tables(std::string_view request, Method method, std::vector<std::string>& pulls,
                 std::vector<std::string>& updates);

// Parses and checks `request` against `hosted`; the reply's layout. Touches nothing.
Plan plan(std::string_view request, Method method, const std::vector<Hosted>& hosted);

// Applies the plan's updates, then its pulls into `reply` (plan.reply_size
// bytes), framing the reply. Engine errors propagate; `updates_applied` says
// whether the updates were all applied before one happened.
void apply(Plan& plan, const std::vector<Hosted>& hosted, uint8_t* reply, bool& updates_applied);

}  // namespace recstore::serve

// A PS node's MultiPull / MultiUpdate: parsed once, checked here, applied here or by the node.
//
// This is the one validator of multi-table requests. A request is parsed in
// place (`parse`), then `plan` checks every item against the node's hosted
// tables in the order the node has always made them (pull items: table
// hosted, keys whole int64s and the rows' wire dtype for each, then the reply's size against the
// node's message limit, then slots owned and dense ids in range for each;
// updates, item by item: table hosted, declared dim, grad dtype, keys, grads
// length, lr, slots, ids, finite gradients where the table rejects non-finite
// ones; then room in each table that cannot evict, counted exactly), and
// either refuses with the first failure
// (a code, the item, the table, the reason worded as the node words it) or
// returns the parsed, checked items. `apply` then serves them natively (the
// reply is the bytes recstore.core.wire would frame), or the node applies the
// checked items itself where this path cannot (a table on a GPU or with an
// injected clock, a log to append, read-only pulls). Nothing is touched before
// every check passed. The node holds the update tables' locks around both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hash.h"
#include "ps_decode.h"
#include "table.h"

namespace recstore::serve {

// One hosted table as the validator sees it.
struct Hosted {
  std::string name;
  bool present = false;            // hosted on this node
  Table* table = nullptr;          // its host engine; nullptr: the node applies (and counts room)
  const uint8_t* owned = nullptr;  // per slot, nonzero: owned; nullptr: every slot
  float default_lr = 0;            // the spec's lr, for updates without one
  std::string dtype;               // the table's wire dtype name
  int64_t dim = 0;
  int64_t id_limit = 0;    // dense tables: ids lie in [0, id_limit); 0: hashed
  bool can_fill = false;   // cannot evict: rows it inserts must fit its capacity
  uint64_t epoch = 0;      // its slot map's
  bool logged = false;     // writes are logged: the node applies updates
  int non_finite = kNonFiniteReject;  // its NonFinitePolicy (reject: screened by the plan)
  bool inference = false;  // mode inference: its updates are refused
  uint64_t version = 0;    // its version, read before any row is: PullResponse.version
};

// kPull: a single-table Pull, checked and served as a MultiPull of its one item, its
// reply that item's PullResponse alone.
enum class Method { kMultiPull, kMultiUpdate, kPull };

// A request as it lies in its bytes: its items decoded by ps_decode.h.
struct Request {
  Method method = Method::kMultiPull;
  std::string_view bytes;
  std::vector<protowire::PullRequestView> pulls;
  std::vector<protowire::UpdateRequestView> updates;
};

// Parses `request` (viewed, not copied). Throws protowire::Malformed when malformed.
Request parse(std::string_view request, Method method);

// What refused a request; each is one of the node's exceptions. Exported as
// recstore._native.RefusalCode, the only numbering (recstore.ps.native_path maps them).
enum class Code : int {
  kNone = 0,
  kInvalidArgument = 1,
  kTableNotFound = 2,
  kWrongShard = 3,       // epoch: the table's slot-map epoch
  kCapacityExhausted = 4,
  kMessageTooLarge = 5,  // the reply would be over the node's message limit
  kNonFinite = 6,        // non-finite gradients for a table whose policy is reject
  kInferenceTable = 7,   // an update of an inference table (the node words the reason)
};

struct Refusal {
  Code code = Code::kNone;
  int64_t item = -1;   // index among the pulls, or among the updates; -1: the request
  std::string table;   // the item's table
  std::string reason;
  uint64_t epoch = 0;
};

struct Pull {
  size_t table;  // into the hosted list
  const int64_t* keys;
  int64_t n;
  bool read_only = false;
  int value_dtype = 0;  // DTypeCode the rows travel as (transport.h)
  size_t keys_at = 0;   // offset of the keys in the request
  size_t value_at = 0;  // where its rows go in the reply
};

struct Update {
  size_t table;
  const int64_t* keys;
  int64_t n;
  const void* grads;
  int grad_dtype;  // DTypeCode
  float lr;        // the item's, else the table's
  bool has_lr = false;
  bool screened = false;  // every gradient found finite by the plan (reject tables)
  size_t keys_at = 0, grads_at = 0, grads_size = 0;  // offsets and size in the request
};

struct Plan {
  Refusal refusal;  // code kNone: every check passed
  Method method = Method::kMultiPull;
  std::vector<Pull> pulls;
  std::vector<Update> updates;
  bool native = false;  // apply() can serve it (every table a host engine, no read-only pull)
  size_t reply_size = 0;  // the reply's bytes, counted before the checks that may allocate
  // Copies of payloads that were not 8-byte aligned in the request.
  std::vector<std::vector<int64_t>> aligned;
};

// Checks `request` against `hosted` (which names every table it mentions); touches
// nothing. A reply over `reply_limit` bytes is refused once every pull item's table
// and keys are known, before anything is allocated for it.
Plan plan(const Request& request, const std::vector<Hosted>& hosted, size_t reply_limit);

// Applies a native plan's updates, then its pulls into `reply` (plan.reply_size
// bytes), framing the reply. Engine errors propagate; `updates_applied` counts
// the updates applied whole before one happened (their keys are changed rows).
void apply(Plan& plan, const std::vector<Hosted>& hosted, uint8_t* reply, size_t& updates_applied);

// The sorted distinct slots (slot_of, hash.h) of `n` keys, written to `out` (room for
// min(n, kNumSlots)); returns how many. What a de-dup entry records of a request.
size_t touched_slots(const int64_t* keys, int64_t n, uint16_t* out);

// Why the node refuses rows of a `table_dtype` table travelling as `requested` ("" when
// it does not): `grads` for an update's grad_dtype, else a pull's value_dtype; an empty
// `requested` is the default (float32 gradients, values in the table dtype).
std::string transport_refusal_for(std::string_view requested, std::string_view table_dtype,
                                  bool grads);

// Python's repr() of a str (printable names exactly): how the node quotes names.
std::string py_repr(std::string_view text);
// Python's repr() of a float.
std::string py_repr(double value);

}  // namespace recstore::serve

// A PS node's bound on the messages it sends, checked before a reply is allocated.
//
// The node's message limit (recstore.core.limits.message_limit, also its gRPC
// send limit) comes in from Python; every reply builder counts the reply's
// size first (a counting protowire::Writer) and refuses here when it is over,
// so a small request can never make the node build a huge reply.
// recstore._native raises MessageTooLarge in Python as
// recstore.core.errors.MessageTooLarge.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace recstore::protowire {

class MessageTooLarge : public std::length_error {
 public:
  using std::length_error::length_error;
};

// The one wording of the refusal.
inline std::string message_too_large(size_t size, size_t limit) {
  return "the reply would take " + std::to_string(size) + " bytes, over this node's message " +
         "limit of " + std::to_string(limit) +
         " bytes (grpc.max_send_message_length, set by --max-batch-bytes); request fewer rows "
         "per call";
}

// Throws MessageTooLarge when `size` is over `limit`.
inline void check_reply_size(size_t size, size_t limit) {
  if (size > limit) throw MessageTooLarge(message_too_large(size, limit));
}

}  // namespace recstore::protowire

// What a job spec refers to: every string in it, so that the registry can tell which
// artifacts a job reads (by path, a path inside one, or `ckpt:ID`) whatever the spec's
// message type. Pure.
#pragma once

#include <google/protobuf/message.h>

#include <string>
#include <vector>

namespace stemma::coordinator {

// Appends every string field value of `message` and its sub-messages (repeated fields and
// map keys and values included).
void CollectStrings(const google::protobuf::Message& message, std::vector<std::string>* out);

}  // namespace stemma::coordinator

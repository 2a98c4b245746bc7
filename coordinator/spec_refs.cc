#include "coordinator/spec_refs.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

namespace stemma::coordinator {

void CollectStrings(const google::protobuf::Message& message, std::vector<std::string>* out) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(message, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(message, f); ++i) {
          out->push_back(r->GetRepeatedString(message, f, i));
        }
      } else {
        out->push_back(r->GetString(message, f));
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {  // map entries are repeated messages too
        for (int i = 0; i < r->FieldSize(message, f); ++i) {
          CollectStrings(r->GetRepeatedMessage(message, f, i), out);
        }
      } else {
        CollectStrings(r->GetMessage(message, f), out);
      }
    }
  }
}

}  // namespace stemma::coordinator

#include "core/scalar_type.h"

#include "scalar_type_generated.h"

namespace etb {

// The C++ enum is the program schema's: same name, same code, for every type the runtime
// stores (a renumbered or renamed schema entry fails the build here).
#define ETB_CHECK_SCALAR_TYPE(name, code, bytes)                                  \
  static_assert(int(ScalarType::name) == int(etbuild::schema::ScalarType_##name), \
                "core/scalar_type.h: " #name " differs from schema/scalar_type.fbs");
ETB_FOR_EACH_SCALAR_TYPE(ETB_CHECK_SCALAR_TYPE)
#undef ETB_CHECK_SCALAR_TYPE

size_t element_size(ScalarType t) {
  switch (t) {
#define ETB_SIZE_CASE(name, code, bytes) \
  case ScalarType::name: return bytes;
    ETB_FOR_EACH_SCALAR_TYPE(ETB_SIZE_CASE)
#undef ETB_SIZE_CASE
  }
  return 0;
}

const char* scalar_type_name(ScalarType t) {
  switch (t) {
#define ETB_NAME_CASE(name, code, bytes) \
  case ScalarType::name: return #name;
    ETB_FOR_EACH_SCALAR_TYPE(ETB_NAME_CASE)
#undef ETB_NAME_CASE
  }
  return "Unknown";
}

}  // namespace etb

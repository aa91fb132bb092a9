#include "core/stream.h"

namespace sw {

HostStream& host_stream() {
  static HostStream s;
  return s;
}

}  // namespace sw

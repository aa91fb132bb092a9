// How the engine's unit buffers on a device reach the peers (sharding/comm/group.h,
// device_group): a plain value type, so that ShardingPolicy includes nothing of the groups.
// Native = the device's registered collectives (NCCL; an error without them), Staged = the
// host group through host staging buffers, Auto = Native where it serves, else Staged.
#pragma once
#include <cstdint>
#include <string>

namespace sw {

enum class DeviceComm : uint8_t { Auto, Native, Staged };
const char* device_comm_name(DeviceComm m);             // "auto", "native", "staged"
DeviceComm device_comm_from_name(const std::string& s);  // throws sw::Error naming the value

}  // namespace sw

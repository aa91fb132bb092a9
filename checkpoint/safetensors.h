// A safetensors reader and writer (https://github.com/huggingface/safetensors, format only).
//
// File layout:
//   u64 (little-endian)  N, the header's length in bytes
//   N bytes              JSON: {"__metadata__": {str: str}?, "<name>": {"dtype": "F32",
//                        "shape": [..], "data_offsets": [begin, end]}, ...}
//   data section         tensor bytes; offsets are relative to its start
// The writer pads the header with spaces so the data section starts 8-byte aligned, writes to
// a temporary file beside the target, fsyncs and renames, so a crash never leaves a partial
// file under the final name. The reader validates the whole header before any tensor is read.
// Every error is a one-line sw::Error "safetensors: <file>: [tensor '<name>': ]<problem>".
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sw {

// Element types a safetensors file may declare. The writer emits F32/BF16/F16/I32 (and any
// other); the reader knows all of them so it can skip tensors it does not use.
enum class StDType : uint8_t {
  F64,
  F32,
  F16,
  BF16,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  BOOL,
  F8_E4M3,
  F8_E5M2
};
size_t st_dtype_size(StDType t);
const char* st_dtype_name(StDType t);                         // "F32", ...
bool st_dtype_from_name(const std::string& s, StDType* out);  // false if unknown
StDType st_dtype(DType t);                                    // F32/BF16/F16

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section, [begin, end)
  uint64_t bytes() const { return end - begin; }
  int64_t numel() const { return sw::numel(shape); }
};

// Opens and validates a file; reads tensors (or byte ranges of them) on request with pread,
// so nothing but the header is held in memory. Move-only.
class SafeTensorsReader {
 public:
  explicit SafeTensorsReader(const std::string& path);
  ~SafeTensorsReader();
  SafeTensorsReader(SafeTensorsReader&& o) noexcept;
  SafeTensorsReader& operator=(SafeTensorsReader&& o) noexcept;
  SafeTensorsReader(const SafeTensorsReader&) = delete;
  SafeTensorsReader& operator=(const SafeTensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // In data-offset order.
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensorInfo* find(const std::string& name) const;  // null when absent
  const StTensorInfo& at(const std::string& name) const;    // throws when absent

  // Copies bytes [offset, offset + n) of tensor `name` into dst (raw, file byte order:
  // little-endian). n = UINT64_MAX reads to the end of the tensor.
  void read_bytes(const std::string& name, void* dst, uint64_t offset = 0,
                  uint64_t n = UINT64_MAX) const;
  // Hint that bytes [offset, offset + n) of tensor `name` (clipped to it) will be read soon:
  // the kernel starts reading them in the background (posix_fadvise WILLNEED).
  void prefetch(const std::string& name, uint64_t offset, uint64_t n) const;
  // Reads `count` elements starting at element `first` as f32, converting from F32/BF16/F16
  // (other dtypes throw).
  void read_f32(const std::string& name, float* dst, int64_t first = 0, int64_t count = -1) const;

  uint64_t file_size() const { return file_size_; }
  uint64_t data_start() const { return data_start_; }  // 8 + header length

 private:
  [[noreturn]] void fail_file(const std::string& msg) const;
  void close_fd();
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0, data_start_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

struct StTensorDesc {
  std::string name;
  StDType dtype = StDType::F32;
  Shape shape;
};

// The first bytes of a file holding `tensors` (declared in this order) with `metadata`: the
// 8-byte length and the padded JSON header, exactly what SafeTensorsWriter writes before the
// data section (which therefore starts at the returned size). For writers that lay out the
// whole file themselves (checkpoint/sharded_checkpoint.cpp). `ends` (optional) receives each
// tensor's cumulative end offset in the data section. Throws like the writer, naming `path`.
std::string safetensors_header(const std::string& path, const std::vector<StTensorDesc>& tensors,
                               const std::map<std::string, std::string>& metadata = {},
                               std::vector<uint64_t>* ends = nullptr);

// Streams a file tensor by tensor: all tensors are declared up front (the header holds every
// offset), then their bytes are appended in declaration order in chunks of any size. finish()
// checks that every byte arrived, fsyncs and renames the temporary into place; destroying an
// unfinished writer deletes the temporary.
class SafeTensorsWriter {
 public:
  SafeTensorsWriter(const std::string& path, std::vector<StTensorDesc> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafeTensorsWriter();
  SafeTensorsWriter(const SafeTensorsWriter&) = delete;
  SafeTensorsWriter& operator=(const SafeTensorsWriter&) = delete;

  // Appends the next nbytes of the data section (may span tensors).
  void append(const void* data, size_t nbytes);
  // Appends the whole of tensor `name`, which must be the next one declared.
  void write_tensor(const std::string& name, const void* data);
  // Name of the tensor the next appended byte belongs to ("" when all are written).
  const std::string& next_tensor() const;
  // Asks the kernel to start writing the bytes appended so far to disk, without waiting
  // (sync_file_range on Linux, nothing elsewhere): a caller streaming a large file calls it
  // every few MiB so the disk works while it produces the rest and finish()'s fsync has
  // little left to wait for.
  void start_writeback();
  void finish();
  // Where the data section starts in the file (8 + header length), and the CRC-32C
  // (checkpoint/crc32c.h) of those first data_start() bytes: with the CRCs of the data a
  // caller computes while appending, crc32c_combine gives the whole file's CRC.
  uint64_t data_start() const { return data_start_; }
  uint32_t header_crc32c() const { return header_crc_; }

 private:
  [[noreturn]] void fail_file(const std::string& msg);
  std::string path_, tmp_;
  int fd_ = -1;
  std::vector<StTensorDesc> tensors_;
  std::vector<uint64_t> ends_;  // cumulative data offsets
  uint64_t written_ = 0;        // data-section bytes written
  uint64_t writeback_ = 0;      // file bytes handed to start_writeback()
  size_t cur_ = 0;              // tensor the next byte belongs to
  bool finished_ = false;
  uint64_t data_start_ = 0;
  uint32_t header_crc_ = 0;
};

// One-call writer for tensors already in memory.
struct StTensorRef {
  StTensorDesc desc;
  const void* data = nullptr;  // numel(shape) * st_dtype_size(dtype) bytes
};
void save_safetensors(const std::string& path, const std::vector<StTensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace sw

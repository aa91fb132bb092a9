#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/crc32c.h"
#include "core/error.h"
#include "core/json_depth.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this build assumes a little-endian host");

namespace sw {

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit too

struct DTypeRow {
  StDType t;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::F64, "F64", 8},   {StDType::F32, "F32", 4},         {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I64, "I64", 8},         {StDType::I32, "I32", 4},
    {StDType::I16, "I16", 2},   {StDType::I8, "I8", 1},           {StDType::U64, "U64", 8},
    {StDType::U32, "U32", 4},   {StDType::U16, "U16", 2},         {StDType::U8, "U8", 1},
    {StDType::BOOL, "BOOL", 1}, {StDType::F8_E4M3, "F8_E4M3", 1}, {StDType::F8_E5M2, "F8_E5M2", 1},
};

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

std::string errno_str() { return std::strerror(errno); }

// Full pwrite/pread loops (short transfers and EINTR).
bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Returns bytes read (< n only at end of file), or -1 on error.
int64_t pread_all(int fd, void* dst, uint64_t n, uint64_t off) {
  char* p = static_cast<char*>(dst);
  uint64_t got = 0;
  while (got < n) {
    const ssize_t r =
        ::pread(fd, p + got, static_cast<size_t>(std::min<uint64_t>(n - got, 1ull << 30)),
                static_cast<off_t>(off + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return static_cast<int64_t>(got);
}

std::string offsets_str(uint64_t b, uint64_t e) {
  std::string r("[");  // (built with += : GCC 12 warns falsely on "[" + std::string)
  r += std::to_string(b);
  r += ", ";
  r += std::to_string(e);
  r += "]";
  return r;
}

}  // namespace

size_t st_dtype_size(StDType t) {
  for (const DTypeRow& r : kDTypes)
    if (r.t == t) return r.size;
  return 0;
}

const char* st_dtype_name(StDType t) {
  for (const DTypeRow& r : kDTypes)
    if (r.t == t) return r.name;
  return "?";
}

bool st_dtype_from_name(const std::string& s, StDType* out) {
  for (const DTypeRow& r : kDTypes)
    if (s == r.name) {
      *out = r.t;
      return true;
    }
  return false;
}

StDType st_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return StDType::F32;
    case DType::BF16:
      return StDType::BF16;
    case DType::F16:
      return StDType::F16;
  }
  return StDType::F32;
}

// ---- Reader ----------------------------------------------------------------------------------

void SafeTensorsReader::fail_file(const std::string& msg) const {
  fail("safetensors", path_ + ": " + one_line(msg));
}

void SafeTensorsReader::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

SafeTensorsReader::~SafeTensorsReader() { close_fd(); }

SafeTensorsReader::SafeTensorsReader(SafeTensorsReader&& o) noexcept { *this = std::move(o); }

SafeTensorsReader& SafeTensorsReader::operator=(SafeTensorsReader&& o) noexcept {
  if (this != &o) {
    close_fd();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    file_size_ = o.file_size_;
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafeTensorsReader::SafeTensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail_file("cannot open (" + errno_str() + ")");
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail_file("cannot stat (" + errno_str() + ")");
    if (!S_ISREG(st.st_mode)) fail_file("not a regular file");
    file_size_ = static_cast<uint64_t>(st.st_size);
    if (file_size_ < 8)
      fail_file("file is " + std::to_string(file_size_) +
                " bytes, too short for the 8-byte header length");

    unsigned char len8[8];
    if (pread_all(fd_, len8, 8, 0) != 8) fail_file("cannot read the header length");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | len8[i];
    if (hlen > file_size_ - 8)
      fail_file("header length " + std::to_string(hlen) + " exceeds the file (" +
                std::to_string(file_size_) + " bytes; truncated or not a safetensors file?)");
    if (hlen > kMaxHeader)
      fail_file("header length " + std::to_string(hlen) + " exceeds the limit of " +
                std::to_string(kMaxHeader) + " bytes");
    if (hlen < 2) fail_file("header length " + std::to_string(hlen) + " is too short for JSON");
    data_start_ = 8 + hlen;
    const uint64_t data_size = file_size_ - data_start_;

    std::string header(static_cast<size_t>(hlen), '\0');
    if (pread_all(fd_, header.data(), hlen, 8) != static_cast<int64_t>(hlen))
      fail_file("cannot read the " + std::to_string(hlen) + "-byte header");
    if (header[0] != '{') fail_file("header does not start with '{' (not a safetensors file?)");

    // A header nests 3 levels; one nested thousands deep would overflow the stack in
    // nlohmann's recursive dump/destruction (core/json_depth.h).
    if (const size_t at = json_depth_exceeded(header); at != std::string::npos)
      fail_file("header nests deeper than " + std::to_string(kJsonMaxDepth) + " levels (at byte " +
                std::to_string(8 + at) + ")");
    // Duplicate tensor names would silently keep the last entry: refuse them (top level only).
    std::string dup;
    std::set<std::string> names;
    auto on_event = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
      if (ev == nlohmann::json::parse_event_t::key && depth == 1 && dup.empty() &&
          !names.insert(v.get_ref<const std::string&>()).second)
        dup = v.get<std::string>();
      return true;
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(header, on_event);
    } catch (const nlohmann::json::exception& e) {
      fail_file(std::string("header is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) fail_file("header JSON is not an object");
    if (!dup.empty()) fail_file("tensor '" + dup + "' is declared twice");

    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail_file("__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string())
            fail_file("__metadata__ value of '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string where = "tensor '" + name + "': ";
      if (!v.is_object()) fail_file(where + "entry is not an object");
      for (auto f = v.begin(); f != v.end(); ++f)
        if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
          fail_file(where + "unknown field '" + f.key() + "'");
      StTensorInfo t;
      t.name = name;
      auto d = v.find("dtype");
      if (d == v.end() || !d->is_string()) fail_file(where + "missing or non-string 'dtype'");
      if (!st_dtype_from_name(d->get<std::string>(), &t.dtype))
        fail_file(where + "unknown dtype '" + d->get<std::string>() + "'");
      auto s = v.find("shape");
      if (s == v.end() || !s->is_array()) fail_file(where + "missing or non-array 'shape'");
      // numel * dtype size, overflow-checked against the file size (anything larger is wrong
      // anyway).
      unsigned __int128 nbytes = st_dtype_size(t.dtype);
      bool huge = false;
      for (const nlohmann::json& dim : *s) {
        if (!dim.is_number_unsigned())
          fail_file(where + "shape entry " + dim.dump() + " is not a non-negative integer");
        const uint64_t dv = dim.get<uint64_t>();
        if (dv > (1ull << 62)) huge = true;
        t.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(dv, 1ull << 62)));
        nbytes *= dv;
        if (nbytes > file_size_) huge = true, nbytes = file_size_ + 1;
      }
      auto o = v.find("data_offsets");
      if (o == v.end() || !o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() ||
          !(*o)[1].is_number_unsigned())
        fail_file(where + "'data_offsets' must be two non-negative integers");
      t.begin = (*o)[0].get<uint64_t>();
      t.end = (*o)[1].get<uint64_t>();
      if (t.end < t.begin)
        fail_file(where + "data_offsets " + offsets_str(t.begin, t.end) + " end before they begin");
      if (t.end > data_size)
        fail_file(where + "data_offsets " + offsets_str(t.begin, t.end) +
                  " exceed the file's data section (" + std::to_string(data_size) + " bytes)");
      if (huge || static_cast<uint64_t>(nbytes) != t.end - t.begin)
        fail_file(where + "shape " + shape_str(t.shape) + " of " + st_dtype_name(t.dtype) +
                  " needs " +
                  (huge ? std::string("more bytes than the file has")
                        : std::to_string(static_cast<uint64_t>(nbytes)) + " bytes") +
                  " but data_offsets " + offsets_str(t.begin, t.end) + " span " +
                  std::to_string(t.end - t.begin));
      tensors_.push_back(std::move(t));
    }

    std::sort(tensors_.begin(), tensors_.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    const StTensorInfo* prev = nullptr;  // the non-empty tensor reaching furthest so far
    for (const StTensorInfo& t : tensors_) {
      if (t.bytes() == 0) continue;
      if (prev && t.begin < prev->end)
        fail_file("tensor '" + t.name + "': data_offsets " + offsets_str(t.begin, t.end) +
                  " overlap tensor '" + prev->name + "' " + offsets_str(prev->begin, prev->end));
      if (!prev || t.end > prev->end) prev = &t;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    close_fd();
    throw;
  }
}

const StTensorInfo* SafeTensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const StTensorInfo& SafeTensorsReader::at(const std::string& name) const {
  const StTensorInfo* t = find(name);
  if (!t) fail_file("no tensor '" + name + "'");
  return *t;
}

void SafeTensorsReader::read_bytes(const std::string& name, void* dst, uint64_t offset,
                                   uint64_t n) const {
  const StTensorInfo& t = at(name);
  if (offset > t.bytes())
    fail_file("tensor '" + name + "': read at byte " + std::to_string(offset) +
              " is past its end (" + std::to_string(t.bytes()) + " bytes)");
  if (n == UINT64_MAX) n = t.bytes() - offset;
  if (n > t.bytes() - offset)
    fail_file("tensor '" + name + "': read of bytes [" + std::to_string(offset) + ", " +
              std::to_string(offset + n) + ") is past its end (" + std::to_string(t.bytes()) +
              " bytes)");
  if (n == 0) return;
  const int64_t got = pread_all(fd_, dst, n, data_start_ + t.begin + offset);
  if (got < 0) fail_file("tensor '" + name + "': read failed (" + errno_str() + ")");
  if (static_cast<uint64_t>(got) != n)
    fail_file("tensor '" + name + "': file ended while reading (truncated after it was opened?)");
}

void SafeTensorsReader::prefetch(const std::string& name, uint64_t offset, uint64_t n) const {
  const StTensorInfo& t = at(name);
  if (offset >= t.bytes()) return;
  n = std::min(n, t.bytes() - offset);
  ::posix_fadvise(fd_, static_cast<off_t>(data_start_ + t.begin + offset), static_cast<off_t>(n),
                  POSIX_FADV_WILLNEED);
}

void SafeTensorsReader::read_f32(const std::string& name, float* dst, int64_t first,
                                 int64_t count) const {
  const StTensorInfo& t = at(name);
  const int64_t total = t.numel();
  if (count < 0) count = total - first;
  if (first < 0 || count < 0 || first + count > total)
    fail_file("tensor '" + name + "': elements [" + std::to_string(first) + ", " +
              std::to_string(first + count) + ") are outside its " + std::to_string(total));
  const size_t es = st_dtype_size(t.dtype);
  switch (t.dtype) {
    case StDType::F32:
      read_bytes(name, dst, static_cast<uint64_t>(first) * 4, static_cast<uint64_t>(count) * 4);
      return;
    case StDType::BF16:
    case StDType::F16: {
      constexpr int64_t kChunk = 1 << 16;
      std::vector<uint16_t> tmp(static_cast<size_t>(std::min(count, kChunk)));
      for (int64_t done = 0; done < count;) {
        const int64_t k = std::min(kChunk, count - done);
        read_bytes(name, tmp.data(), static_cast<uint64_t>(first + done) * es,
                   static_cast<uint64_t>(k) * es);
        for (int64_t i = 0; i < k; ++i)
          dst[done + i] = t.dtype == StDType::BF16 ? bf16_to_f32(tmp[static_cast<size_t>(i)])
                                                   : f16_to_f32(tmp[static_cast<size_t>(i)]);
        done += k;
      }
      return;
    }
    default:
      fail_file("tensor '" + name + "': dtype " + st_dtype_name(t.dtype) +
                " cannot be read as f32 (expected F32, BF16 or F16)");
  }
}

// ---- Writer ----------------------------------------------------------------------------------

void SafeTensorsWriter::fail_file(const std::string& msg) {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
  }
  fail("safetensors", path_ + ": " + one_line(msg));
}

std::string safetensors_header(const std::string& path, const std::vector<StTensorDesc>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               std::vector<uint64_t>* ends) {
  auto bad = [&](const std::string& msg) { fail("safetensors", path + ": " + one_line(msg)); };
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t off = 0;
  for (const StTensorDesc& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") bad("invalid tensor name '" + t.name + "'");
    if (!names.insert(t.name).second) bad("tensor '" + t.name + "' is declared twice");
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int64_t d : t.shape) {
      if (d < 0) bad("tensor '" + t.name + "': negative dimension in " + shape_str(t.shape));
      shape.push_back(d);
    }
    const uint64_t bytes = static_cast<uint64_t>(numel(t.shape)) * st_dtype_size(t.dtype);
    h[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                 {"shape", std::move(shape)},
                 {"data_offsets", {off, off + bytes}}};
    off += bytes;
    if (ends) ends->push_back(off);
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header;
}

SafeTensorsWriter::SafeTensorsWriter(const std::string& path, std::vector<StTensorDesc> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  const std::string header = safetensors_header(path_, tensors_, metadata, &ends_);
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    fd_ = -1;
    fail_file("cannot create temporary file " + tmp_ + " (" + errno_str() + ")");
  }
  if (!write_all(fd_, header.data(), header.size()))
    fail_file("cannot write the header (" + errno_str() + ")");
  data_start_ = header.size();
  header_crc_ = crc32c(header.data(), header.size());
  while (cur_ < ends_.size() && ends_[cur_] == 0) ++cur_;  // leading empty tensors
}

SafeTensorsWriter::~SafeTensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

const std::string& SafeTensorsWriter::next_tensor() const {
  static const std::string none;
  return cur_ < tensors_.size() ? tensors_[cur_].name : none;
}

void SafeTensorsWriter::append(const void* data, size_t nbytes) {
  if (fd_ < 0) fail_file(finished_ ? "append after finish()" : "append after a failed write");
  const uint64_t total = ends_.empty() ? 0 : ends_.back();
  if (nbytes > total - written_)
    fail_file("append of " + std::to_string(nbytes) + " bytes past the declared data (" +
              std::to_string(total - written_) + " bytes left)");
  if (!write_all(fd_, data, nbytes))
    fail_file("cannot write tensor '" + next_tensor() + "' (" + errno_str() + ")");
  written_ += nbytes;
  while (cur_ < ends_.size() && ends_[cur_] <= written_) ++cur_;
}

void SafeTensorsWriter::start_writeback() {
  if (fd_ < 0) return;
#if defined(__linux__)
  const uint64_t end = data_start_ + written_;
  if (end > writeback_ &&
      ::sync_file_range(fd_, static_cast<off64_t>(writeback_), static_cast<off64_t>(end - writeback_),
                        SYNC_FILE_RANGE_WRITE) == 0)
    writeback_ = end;  // a failure is harmless: finish()'s fsync writes everything anyway
#endif
}

void SafeTensorsWriter::write_tensor(const std::string& name, const void* data) {
  size_t i = 0;
  while (i < tensors_.size() && tensors_[i].name != name) ++i;
  if (i == tensors_.size()) fail_file("tensor '" + name + "' was not declared");
  const uint64_t begin = i == 0 ? 0 : ends_[i - 1];
  if (written_ != begin)
    fail_file("tensor '" + name + "' written out of order (the next byte belongs to '" +
              next_tensor() + "')");
  append(data, static_cast<size_t>(ends_[i] - begin));
}

void SafeTensorsWriter::finish() {
  if (fd_ < 0) fail_file(finished_ ? "finish() called twice" : "finish after a failed write");
  const uint64_t total = ends_.empty() ? 0 : ends_.back();
  if (written_ != total)
    fail_file("tensor '" + next_tensor() + "' and later ones were not written (" +
              std::to_string(total - written_) + " bytes missing)");
  if (::fsync(fd_) != 0) fail_file("fsync failed (" + errno_str() + ")");
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(tmp_.c_str());
    fail_file("close failed (" + errno_str() + ")");
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string err = errno_str();
    ::unlink(tmp_.c_str());
    fail_file("cannot rename " + tmp_ + " into place (" + err + ")");
  }
  finished_ = true;
  // Make the rename durable: fsync the directory (best effort).
  const size_t slash = path_.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void save_safetensors(const std::string& path, const std::vector<StTensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<StTensorDesc> descs;
  descs.reserve(tensors.size());
  for (const StTensorRef& t : tensors) descs.push_back(t.desc);
  SafeTensorsWriter w(path, std::move(descs), metadata);
  for (const StTensorRef& t : tensors) w.write_tensor(t.desc.name, t.data);
  w.finish();
}

}  // namespace sw

#include "sharding/unit_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/stream.h"
#include "kernels/fp8_ops.h"

namespace sw {

const char* sharded_state_name(ShardedState s) {
  return s == ShardedState::Sharded ? "Sharded" : "Unsharded";
}

const char* training_state_name(TrainingState s) {
  switch (s) {
    case TrainingState::Idle:
      return "Idle";
    case TrainingState::Forward:
      return "Forward";
    case TrainingState::PreBackward:
      return "PreBackward";
    case TrainingState::PostBackward:
      return "PostBackward";
  }
  return "?";
}

namespace {
size_t fbytes(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }
}  // namespace

FlatUnit::FlatUnit(Unit* unit, int index, Kind kind, Group* shard_group, const Ops& ops,
                   float* bucket_grads, const MixedPrecisionPolicy& mp, Tier opt_tier,
                   Tier param_tier, bool release_grads)
    : unit_(unit), index_(index), kind_(kind), shard_(shard_group), ops_(&ops),
      pdt_(mp.param_dtype), rdt_(mp.reduce_dtype) {
  // Kinds B/C keep a persistent full buffer the unit computes with; its master needs a buffer
  // of its own when the full one holds rounded values or when the master lives on another tier.
  split_ = kind != Kind::Sharded && (pdt_ != DType::F32 || param_tier != Tier::Device);
  w16_ = mp.weights16(!ops.device().is_cpu());
  const int S = shard_->size();
  pnvme_ = param_tier == Tier::Nvme;
  release_ = release_grads;
  SW_CHECK(!release_ || ((kind == Kind::Whole && !bucket_grads) ||
                         (kind == Kind::Sharded && param_tier == Tier::Device)),
           "release_grads: only a Whole unit's own gradients or a sharded unit's device shard");
  // On a device, shards on the host tier or staged from NVMe are host memory.
  hm_ = param_tier != Tier::Device && !ops.device().is_cpu();
  SW_CHECK(!pnvme_ || kind == Kind::Sharded, "NVMe parameters need a sharded unit");
  SW_CHECK(kind != Kind::Whole || S == 1, "a Whole unit has a shard group of 1");
  // (One rank with NVMe parameters: every unit takes the sharded path, those that
  // offload_param.max_in_cpu keeps out of the file with their shard on the host tier.)
  SW_CHECK(kind == Kind::Whole || S > 1 || param_tier != Tier::Device,
           "a unit with a shard group of 1 is Whole");
  rank_ = shard_->rank();
  layout_ = FlatLayout::build(unit->params(), S);
  const int64_t P = layout_.padded, Sh = layout_.shard_size(), F = f32_floats();
  const Device dev = ops.device();
  SW_CHECK(!w16_ || split_ || kind == Kind::Sharded, "a 16-bit copy needs a split master");
  // A bucket's all-reduce reads its region directly: zeroed at once, never left unwritten.
  grads_.init(layout_, ops, rdt_, !(kind == Kind::Whole && bucket_grads),
              kind == Kind::FullReplicated && rdt_ != DType::F32);
  // Tier::Device buffers live on the Ops' device, the offload tiers on the CPU (zeroed there).
  auto zeroed = [&](Buffer& b, int64_t n, Mem cat, Tier tier = Tier::Device) {
    b = Buffer(fbytes(n), cat, tier == Tier::Device ? dev : Device::cpu(), tier);
    (tier == Tier::Device ? ops : ops_for(Device::cpu())).fill(b.f32(), 0.f, static_cast<size_t>(n));
    return b.f32();
  };
  switch (kind) {
    case Kind::Sharded:
      if (pnvme_) break;  // staged from the file (OffloadedState, offload/param_file.h)
      master_ = zeroed(master_buf_, Sh, Mem::Params, param_tier);
      if (!release_) grad_shard_ = zeroed(grad_shard_buf_, Sh, Mem::Grads, param_tier);
      break;
    case Kind::FullReplicated:
      full_ = zeroed(full_buf_, F, Mem::Params);
      master_ = split_ ? zeroed(master_buf_, Sh, Mem::Params, param_tier) : full_ + shard_range().lo;
      grads_.make_persistent(nullptr);
      grad_shard_ = zeroed(grad_shard_buf_, Sh, Mem::Grads, param_tier);
      sstate_ = ShardedState::Unsharded;
      break;
    case Kind::Whole:
      full_ = zeroed(full_buf_, F, Mem::Params);
      master_ = split_ ? zeroed(master_buf_, P, Mem::Params, param_tier) : full_;
      if (!release_) grads_.make_persistent(bucket_grads);
      grad_shard_ = grads_.data();  // (null while released)
      sstate_ = ShardedState::Unsharded;
      break;
  }
  if (mp.fp8_all_gather && kind == Kind::Sharded) {
    if (!dev.is_cpu())
      fail("sharding", "fp8.all_gather: the fp8 gather runs on CPU buffers in this build, not on " +
                           dev.str());
    if (!w16_)
      fail("sharding", "fp8.all_gather: needs the units' 16-bit weight copies (bf16 products on "
                       "oneDNN), which this build's CPU path does not keep");
    build_fp8_gather();
  }
  if (w16_ && kind != Kind::Sharded) {  // persistent beside the compute copy: zeros, as it
    make_full16(Mem::Params);
    ops.fill(reinterpret_cast<float*>(full16_), 0.f, static_cast<size_t>(P / 2));  // P: even
  }
  nvme_ = opt_tier == Tier::Nvme;
  if (!nvme_) {
    m_ptr_ = zeroed(m_, Sh, Mem::Optimizer, opt_tier);
    v_ptr_ = zeroed(v_, Sh, Mem::Optimizer, opt_tier);
  }
  point_params();
}

FlatUnit::~FlatUnit() { quiesce(); }

Range FlatUnit::shard_range() const {
  const int64_t off = layout_.shard_offset(rank_);
  return {off, off + layout_.shard_size()};
}

void FlatUnit::make_full16(Mem cat) {
  full16_buf_ = Buffer(static_cast<size_t>(layout_.padded) * 2, cat, ops_->device());
  full16_ = static_cast<uint16_t*>(full16_buf_.data());
}

int64_t FlatUnit::f32_floats() const { return w16_ ? layout_.compact : layout_.padded; }

void FlatUnit::point_params() {
  params_.resize(layout_.specs.size());
  params16_.resize(layout_.specs.size());
  for (size_t s = 0; s < params_.size(); ++s) {
    const int64_t off = w16_ ? layout_.entries[s].f32 : layout_.entries[s].offset;
    params_[s] = full_ && off >= 0 ? full_ + off : nullptr;
    params16_[s] = full16_ ? full16_ + layout_.entries[s].offset : nullptr;
  }
}

float* FlatUnit::init_target() {
  settle();
  SW_CHECK(persistent(), "init_target: a sharded unit is initialised through its master shard");
  if (f32_floats() == layout_.padded) return full_;
  if (init_buf_.empty()) {
    init_buf_ = Buffer(fbytes(layout_.padded), Mem::Workspace, ops_->device());
    ops_->fill(init_buf_.f32(), 0.f, static_cast<size_t>(layout_.padded));
  }
  return init_buf_.f32();
}

void FlatUnit::finish_init() {
  settle();
  if (!split_) return;
  const float* src = init_buf_.empty() ? full_ : init_buf_.f32();
  const Range r = shard_range();
  if (hm_)
    copy_bytes(master_, Device::cpu(), src + r.lo, ops_->device(), fbytes(r.hi - r.lo));
  else
    ops_->copy(master_, src + r.lo, static_cast<size_t>(r.hi - r.lo));
  write_compute(0, layout_.padded, src);
  init_buf_.release();
}

void FlatUnit::write_compute(int64_t off, int64_t n, const float* src) {
  settle();
  SW_CHECK(full_ && split_ && off >= 0 && n >= 0 && off + n <= layout_.padded,
           "write_compute out of range");
  if (!full16_) {  // the padded fp32 compute copy alone, rounded in place
    if (src != full_ + off) ops_->copy(full_ + off, src, static_cast<size_t>(n));
    ops_->round_to(pdt_, full_ + off, static_cast<size_t>(n));
    return;
  }
  // Each run's part: rounded into the fp32 copy and narrowed into the 16-bit one in one pass,
  // or (16-bit only) narrowed (the same bits: the fp32 copy is widen(narrow(x))).
  for (const FlatRun& run : layout_.runs) {
    const Range x = intersect({off, off + n}, {run.lo, run.hi});
    if (x.empty()) continue;
    const float* from = src + (x.lo - off);
    const size_t k = static_cast<size_t>(x.hi - x.lo);
    if (run.f32 >= 0)
      ops_->round_copy_lp(pdt_, full_ + run.f32 + (x.lo - run.lo), full16_ + x.lo, from, k);
    else
      ops_->narrow(pdt_, from, full16_ + x.lo, k);
  }
}

void FlatUnit::widen_runs() {
  for (const FlatRun& run : layout_.runs)
    if (run.f32 >= 0)
      ops_->widen(pdt_, full16_ + run.lo, full_ + run.f32, static_cast<size_t>(run.hi - run.lo));
}

// ---- Parameters ------------------------------------------------------------------------------

void FlatUnit::issue_narrow_gather() {
  const int64_t Sh = layout_.shard_size();
  if (pdt_ == DType::F32) {  // a split master on another tier: its slot, then in place
    if (hm_)
      upload(full_ + rank_ * Sh, master_, fbytes(Sh));
    else
      ops_->copy(full_ + rank_ * Sh, master_, static_cast<size_t>(Sh));
    gather_ = shard_->issue_all_gather(full_ + rank_ * Sh, full_, Sh);
    return;
  }
  // (padded) param_dtype values: the 16-bit copy, or the front of the fp32 buffer
  uint16_t* front = full16_ ? full16_ : reinterpret_cast<uint16_t*>(full_);
  if (hm_) {  // narrowed on the host (the same bits), then its slot
    void* h = host_stage(static_cast<size_t>(Sh) * 2);
    ops_on(Device::cpu()).narrow(pdt_, master_, h, static_cast<size_t>(Sh));
    upload(front + rank_ * Sh, h, static_cast<size_t>(Sh) * 2);
  } else {
    ops_->narrow(pdt_, master_, front + rank_ * Sh, static_cast<size_t>(Sh));
  }
  gather_ = shard_->issue_all_gather(front + rank_ * Sh, front, Sh, pdt_);
}

void FlatUnit::build_fp8_gather() {
  // The tensors the fp8 products quantise: Linear weights kept 16-bit only, a packed one
  // contiguous with the one before it joined to it (the product reads them as one tensor).
  for (size_t s = 0; s < layout_.specs.size(); ++s) {
    const FlatEntry& e = layout_.entries[s];
    const ParamSpec& spec = layout_.specs[s];
    if (!spec.linear || e.f32 >= 0 || e.numel <= 0) continue;
    const bool joins = spec.packed_with_previous && s > 0 && layout_.specs[s - 1].linear &&
                       !f8_tensors_.empty() && f8_tensors_.back().second == e.offset &&
                       layout_.entries[s - 1].offset + layout_.entries[s - 1].numel == e.offset;
    if (joins)
      f8_tensors_.back().second = e.offset + e.numel;
    else
      f8_tensors_.emplace_back(e.offset, e.offset + e.numel);
  }
  std::sort(f8_tensors_.begin(), f8_tensors_.end());
  if (f8_tensors_.empty()) return;  // no Linear weight (embeddings, norms): the bf16 gather
  const int S = shard_->size();
  const int64_t Sh = layout_.shard_size();
  f8_segs_.assign(static_cast<size_t>(S), {});
  for (int r = 0; r < S; ++r) {
    const Range slice{r * Sh, (r + 1) * Sh};
    std::vector<Fp8Seg>& segs = f8_segs_[static_cast<size_t>(r)];
    int64_t codes = 0;
    for (const FlatRun& run : layout_.runs) {
      const Range x = intersect(slice, {run.lo, run.hi});
      if (x.empty()) continue;
      if (run.f32 >= 0) {
        segs.push_back({x.lo, x.hi, 0, run.f32 + (x.lo - run.lo), -2});
        continue;
      }
      // a 16-bit-only run: its tensors' pieces and the gaps between them
      int64_t at = x.lo;
      for (size_t t = 0; t < f8_tensors_.size() && at < x.hi; ++t) {
        const Range piece = intersect(x, {f8_tensors_[t].first, f8_tensors_[t].second});
        if (piece.empty()) continue;
        if (piece.lo > at) segs.push_back({at, piece.lo, 0, -1, -1});
        segs.push_back({piece.lo, piece.hi, 0, -1, static_cast<int>(t)});
        at = piece.hi;
      }
      if (at < x.hi) segs.push_back({at, x.hi, 0, -1, -1});
      codes += x.hi - x.lo;
    }
    // bytes first (in flat order), then the bf16 values from an even offset
    int64_t cpos = 0, rpos = (codes + 1) / 2 * 2;
    for (Fp8Seg& g : segs) {
      int64_t& p = g.tensor == -2 ? rpos : cpos;
      g.pos = p;
      p += (g.hi - g.lo) * (g.tensor == -2 ? 2 : 1);
    }
    f8_slot_ = std::max(f8_slot_, rpos);
  }
  f8_slot_ = (f8_slot_ + 3) / 4 * 4;
  // (Sh is a multiple of kAlign: 2 bytes a value is a multiple of 4.) The in-place unpacking
  // needs every slot within the 16-bit copy's 2 * Sh bytes a rank.
  SW_CHECK(f8_slot_ <= 2 * Sh, "fp8 gather: a slot larger than its share of the 16-bit copy");
  f8_ = true;
}

void FlatUnit::issue_fp8_gather() {
  const int64_t Sh = layout_.shard_size(), lo = rank_ * Sh;
  const std::vector<Fp8Seg>& segs = f8_segs_[static_cast<size_t>(rank_)];
  if (!f8_fresh_) {
    // Each tensor's amax over this slice, then over the shard group (NaNs skipped, as the fp8
    // products' amax skips them); the amax of the bf16 values is the bf16 rounding of it.
    std::vector<float> am(f8_tensors_.size(), 0.f), all(am.size(), 0.f);
    for (const Fp8Seg& g : segs) {
      if (g.tensor < 0) continue;
      float m = am[static_cast<size_t>(g.tensor)];
      for (const float* x = master_ + (g.lo - lo), *e = x + (g.hi - g.lo); x < e; ++x)
        m = std::fmax(m, std::fabs(*x));
      am[static_cast<size_t>(g.tensor)] = m;
    }
    shard_->all_reduce(am.data(), all.data(), static_cast<int64_t>(am.size()), ReduceOp::Max);
    f8_scale_.resize(all.size());
    for (size_t t = 0; t < all.size(); ++t)
      f8_scale_[t] = fp8_scale(bf16_to_f32(f32_to_bf16(all[t])), Fp8Format::E4M3, true);
    f8_fresh_ = true;
  }
  uint8_t* wire = reinterpret_cast<uint8_t*>(full16_);
  uint8_t* mine = wire + rank_ * f8_slot_;
  for (const Fp8Seg& g : segs) {
    const float* x = master_ + (g.lo - lo);
    const int64_t n = g.hi - g.lo;
    if (g.tensor == -2) {
      ops_->narrow(DType::BF16, x, mine + g.pos, static_cast<size_t>(n));
      continue;
    }
    const float sc = g.tensor >= 0 ? f8_scale_[static_cast<size_t>(g.tensor)] : 1.f;
    fp8_e4m3_encode_bf16(x, n, sc, mine + g.pos);
  }
  // in place: each rank's slot at rank * slot of the 16-bit copy (bytes as bf16 pairs)
  gather_ = shard_->issue_all_gather(mine, wire, f8_slot_ / 2, DType::BF16);
}

void FlatUnit::finish_fp8_gather() {
  const uint8_t* wire = reinterpret_cast<const uint8_t*>(full16_);
  const int S = shard_->size();
  // 1. every slot's bf16 values widened into the fp32 buffer (before any byte is overwritten)
  for (int r = 0; r < S; ++r)
    for (const Fp8Seg& g : f8_segs_[static_cast<size_t>(r)])
      if (g.tensor == -2)
        ops_->widen(DType::BF16, wire + r * f8_slot_ + g.pos, full_ + g.f32,
                    static_cast<size_t>(g.hi - g.lo));
  // 2. the bytes decoded into the 16-bit copy, from the last value to the first: value i's
  // byte lies at or below 2 i + 1 (a slot is at most 2 bytes a value, bytes precede the bf16
  // values in it), so writing value i's two bytes never overwrites a byte still to be read.
  uint16_t lut[256];
  for (int r = S - 1; r >= 0; --r) {
    const std::vector<Fp8Seg>& segs = f8_segs_[static_cast<size_t>(r)];
    for (auto g = segs.rbegin(); g != segs.rend(); ++g) {
      if (g->tensor == -2) continue;
      const float inv = 1.f / (g->tensor >= 0 ? f8_scale_[static_cast<size_t>(g->tensor)] : 1.f);
      for (int b = 0; b < 256; ++b)  // q / s: exact in bf16 (s a power of two)
        lut[b] = f32_to_bf16(fp8_e4m3_value(static_cast<uint8_t>(b)) * inv);
      const uint8_t* q = wire + r * f8_slot_ + g->pos;
      for (int64_t i = g->hi - g->lo - 1; i >= 0; --i) full16_[g->lo + i] = lut[q[i]];
    }
  }
  // 3. the bf16 values back into the 16-bit copy (narrow(widen(b)) == b)
  for (int r = 0; r < S; ++r)
    for (const Fp8Seg& g : f8_segs_[static_cast<size_t>(r)])
      if (g.tensor == -2)
        ops_->narrow(DType::BF16, full_ + g.f32, full16_ + g.lo, static_cast<size_t>(g.hi - g.lo));
}

void FlatUnit::set_quantized(const QuantSpec& q, bool weights, PeerComm* grad_peers,
                             QuantWorker* worker) {
  qworker_ = worker;
  SW_CHECK(ops_->device().is_cpu() || (!weights && !grad_peers),
           "quantised collectives run on CPU buffers");
  qspec_ = q;
  qw_ = weights && kind_ == Kind::Sharded && !w16_;
  qpeers_ = kind_ == Kind::Whole ? nullptr : grad_peers;
  qtables_.clear(), qraw_.clear(), qranks_.clear();
  if (!qw_ && !qpeers_) return;
  // parameters by offset; 1-D ones (biases, norm gains) travel exact
  std::vector<std::pair<int64_t, uint8_t>> by_offset;
  for (size_t s = 0; s < layout_.entries.size(); ++s)
    by_offset.emplace_back(layout_.entries[s].offset, layout_.specs[s].shape.size() <= 1);
  std::sort(by_offset.begin(), by_offset.end());
  std::vector<int64_t> starts;
  std::vector<uint8_t> raw;
  for (const auto& [off, r] : by_offset) starts.push_back(off), raw.push_back(r);
  const int S = shard_->size();
  const int64_t Sh = layout_.shard_size();
  qtables_.resize(static_cast<size_t>(S));
  qraw_.resize(static_cast<size_t>(S));
  for (size_t r = 0; r < qtables_.size(); ++r) {
    const int64_t lo = static_cast<int64_t>(r) * Sh;
    qtables_[r] = quant_block_starts(lo, lo + Sh, starts, q.block, &raw, &qraw_[r]);
  }
  for (int r = 0; r < S; ++r) {
    QuantSpec s = q;
    s.starts = &qtables_[static_cast<size_t>(r)];
    s.raw = &qraw_[static_cast<size_t>(r)];
    qranks_.push_back(s);
  }
}

void FlatUnit::issue_unshard() {
  settle();
  if (sstate_ == ShardedState::Unsharded || gather_in_flight_) return;
  const int64_t Sh = layout_.shard_size();
  switch (kind_) {
    case Kind::Sharded:
      if (full_buf_.empty()) {
        full_buf_ = Buffer(fbytes(f32_floats()), Mem::Communication, ops_->device());
        full_ = full_buf_.f32();
        if (w16_) make_full16(Mem::Communication);
        point_params();
      }
      SW_CHECK(master_, "unit '" + unit_->name() +
                            "': its master shard on NVMe was not staged for the gather");
      // NVMe: the staging buffer is free once issued; host shards: copied to the device first
      if (qw_)  // quantised from the (staged) master at once: a staging buffer is free after
        gather_ = issue_quantized_all_gather(*shard_, master_, Sh, qspec_, qwire_, qranks_.data());
      else if (f8_)  // fp8 from the (staged) master at once, as above
        issue_fp8_gather();
      else if (pdt_ != DType::F32 || pnvme_ || hm_)
        issue_narrow_gather();
      else
        gather_ = shard_->issue_all_gather(master_, full_, Sh);
      break;
    case Kind::FullReplicated:  // in place: this rank's slice is already where it belongs
      if (split_)
        issue_narrow_gather();
      else
        gather_ = shard_->issue_all_gather(full_ + shard_range().lo, full_, Sh);
      break;
    case Kind::Whole:
      sstate_ = ShardedState::Unsharded;
      return;
  }
  gather_in_flight_ = true;
}

void FlatUnit::finish_gather() {
  // The compute stream waits for the gather's event (on the CPU: this thread blocks).
  ops_->stream().wait_event(gather_);
  gather_in_flight_ = false;
  sstate_ = ShardedState::Unsharded;
  if (f8_) return finish_fp8_gather();  // (a Sharded unit's: its gathers are all fp8)
  if (!qwire_.empty()) {  // quantised: every rank's slot dequantised, the own one included
    finish_quantized_all_gather(*shard_, qwire_, layout_.shard_size(), qspec_, full_,
                                qranks_.data());
    qwire_.release();
    if (pdt_ != DType::F32) ops_->round_to(pdt_, full_, static_cast<size_t>(layout_.padded));
    return;
  }
  if (full16_)  // out of the 16-bit copy, the parameters that have an fp32 copy
    widen_runs();
  else if (pdt_ != DType::F32)  // in place from the front
    ops_->widen(pdt_, full_, full_, static_cast<size_t>(layout_.padded));
}

void FlatUnit::wait_unshard() {
  settle();
  if (sstate_ == ShardedState::Unsharded) return;
  issue_unshard();
  finish_gather();
}

void FlatUnit::reshard() {
  settle();
  SW_CHECK(!gather_in_flight_, "reshard of unit '" + unit_->name() + "' with a gather in flight");
  if (kind_ != Kind::Sharded || sstate_ == ShardedState::Sharded) return;
  full_buf_.release();
  full16_buf_.release();
  full_ = nullptr;
  full16_ = nullptr;
  point_params();
  sstate_ = ShardedState::Sharded;
}

void FlatUnit::issue_regather() {
  settle();
  if (kind_ == Kind::Whole && split_) {
    const size_t P = static_cast<size_t>(layout_.padded);
    if (hm_ && f32_floats() < layout_.padded) {
      // The fp32 copy is compact: the master narrowed on the host (the same bits), uploaded
      // into the 16-bit copy and widened into the fp32 one.
      void* h = host_stage(P * 2);
      ops_on(Device::cpu()).narrow(pdt_, master_, h, P);
      upload(full16_, h, P * 2);
      widen_runs();
    } else if (hm_) {
      upload(full_, master_, fbytes(layout_.padded));  // the compute stream waits for it
      write_compute(0, layout_.padded, full_);
    } else if (full16_) {  // one pass: the master read once, both copies written
      write_compute(0, layout_.padded, master_);
    } else {  // one pass: 8 bytes a parameter, where copy + round_to moved 16
      ops_->round_copy(pdt_, full_, master_, P);
    }
    return;
  }
  if (kind_ != Kind::FullReplicated) return;
  SW_CHECK(!gather_in_flight_, "regather of unit '" + unit_->name() + "' with a gather in flight");
  sstate_ = ShardedState::Sharded;
  issue_unshard();
}

// ---- Training state --------------------------------------------------------------------------

void FlatUnit::to_forward() {
  settle();
  SW_CHECK(tstate_ == TrainingState::Idle || tstate_ == TrainingState::Forward,
           "unit '" + unit_->name() + "': forward in state " + training_state_name(tstate_));
  tstate_ = TrainingState::Forward;
}

void FlatUnit::to_pre_backward() {
  settle();
  SW_CHECK(tstate_ == TrainingState::Forward || tstate_ == TrainingState::PreBackward,
           "unit '" + unit_->name() + "': backward in state " + training_state_name(tstate_));
  SW_CHECK(sstate_ == ShardedState::Unsharded,
           "unit '" + unit_->name() + "': backward needs gathered parameters");
  tstate_ = TrainingState::PreBackward;
}

void FlatUnit::to_post_backward() {
  SW_CHECK(tstate_ == TrainingState::PreBackward,
           "unit '" + unit_->name() + "': post-backward in state " + training_state_name(tstate_));
  tstate_ = TrainingState::PostBackward;
}

// ---- Gradients -------------------------------------------------------------------------------

void FlatUnit::ensure_grads() {
  settle();
  if (grads_.allocated()) return;
  if (kind_ == Kind::Whole) {  // released (the gradients of its step: Mem::Grads)
    SW_CHECK(release_, "persistent gradients are always allocated");
    grads_.allocate(Mem::Grads);
    grad_shard_ = grads_.data();
    return;
  }
  SW_CHECK(kind_ == Kind::Sharded, "persistent gradients are always allocated");
  grads_.allocate();
}

void FlatUnit::remake_grads() const {
  if (!grads_released()) return;  // (callers settle first: no update pending)
  FlatUnit& self = const_cast<FlatUnit&>(*this);
  if (kind_ == Kind::Whole) {
    self.ensure_grads();
  } else {
    const size_t Sh = static_cast<size_t>(layout_.shard_size());
    self.grad_shard_buf_ = Buffer(fbytes(layout_.shard_size()), Mem::Grads, ops_->device());
    self.grad_shard_ = self.grad_shard_buf_.f32();
    ops_->fill(self.grad_shard_, 0.f, Sh);
    self.grads_zero_ = true;
  }
}

const float* FlatUnit::grad_shard_rounding(DType* round) const {
  settle();
  remake_grads();
  if (kind_ == Kind::Whole) grads_.zero_unwritten();  // (grad_shard)
  *round = grads_.rounding_left() ? rdt_ : DType::F32;
  return grad_shard_;
}

void FlatUnit::open_grads(UnitCtx& ctx) {
  settle();
  grads_.open(ctx);
}

void* FlatUnit::reduced_block() const {
  settle();
  grads_.write_unwritten();
  const int64_t lo = shard_range().lo;
  if (rdt_ == DType::F32) return grads_.data() + lo;
  return reinterpret_cast<uint16_t*>(grads_.data()) + lo;
}

void FlatUnit::round_grads() {
  settle();
  SW_CHECK(kind_ == Kind::Whole, "round_grads is for whole units");
  if (rdt_ == DType::F32 || !grads_.allocated()) return;  // (released: zeros)
  if (ops_->rounds_grads_on_read(rdt_))
    grads_.leave_rounding();
  else
    grads_.round();
}

Work FlatUnit::issue_reduce_scatter(int replicas) {
  settle();
  SW_CHECK(kind_ != Kind::Whole && grads_.allocated(), "reduce-scatter needs unsharded gradients");
  grads_.write_unwritten();
  float* g = grads_.data();
  if (qpeers_) {  // quantised all-to-all with error feedback, averaged over the shard group
    SW_CHECK(rdt_ == DType::F32, "quantised gradients need reduce_dtype fp32");
    float* err = quant_residual(true);
    PeerComm* pc = qpeers_;
    const QuantSpec q = qspec_;
    const QuantSpec* per = qranks_.data();
    const int64_t lo = shard_range().lo, n = layout_.shard_size();
    const float scale = 1.f / static_cast<float>(shard_->size());
    auto run = [pc, g, err, lo, n, q, scale, per] {
      quantized_reduce_scatter(*pc, g, err, g + lo, n, q, scale, 11, per);
    };
    if (qworker_) return qworker_->issue(run);  // overlaps the backward that follows
    run();
    return Work();
  }
  if (rdt_ == DType::F32)
    return shard_->issue_reduce_scatter(g, reduced_block(), layout_.shard_size(), ReduceOp::Avg);
  // 16 bits: divide first, then sum, so partial sums stay within the average's range.
  ops_->scale(g, 1.f / static_cast<float>(shard_->size() * replicas),
              static_cast<size_t>(layout_.padded));
  ops_->narrow(rdt_, g, g, static_cast<size_t>(layout_.padded));
  return shard_->issue_reduce_scatter(g, reduced_block(), layout_.shard_size(), ReduceOp::Sum,
                                      rdt_);
}

void FlatUnit::accumulate_reduced() {
  settle();
  SW_CHECK(kind_ != Kind::Whole && grads_.allocated(), "nothing to accumulate");
  remake_grads();  // (release_grads: the step's first reduction makes the shard)
  const size_t Sh = static_cast<size_t>(layout_.shard_size());
  SW_CHECK(grad_shard_, "unit '" + unit_->name() + "': its gradients on NVMe were not staged");
  if (pnvme_ && grads_zero_) ops_on(grad_device()).fill(grad_shard_, 0.f, Sh);  // file's: stale
  grads_zero_ = false;
  const void* red = reduced_block();
  if (grad_device().is_cpu() && !ops_->device().is_cpu()) {  // to the host, added there
    const size_t bytes = Sh * dtype_size(rdt_);
    void* h = host_stage(bytes);
    copy_bytes(h, Device::cpu(), red, ops_->device(), bytes);
    red = h;
  }
  add_block(ops_on(grad_device()), grad_shard_, red, rdt_, Sh);
  release_reduced();
}

void FlatUnit::add_block(const Ops& o, float* shard, const void* block, DType rdt, size_t n) {
  if (rdt == DType::F32)
    o.add_inplace(shard, static_cast<const float*>(block), n);
  else
    o.add_widened(rdt, block, shard, n);
}

void FlatUnit::release_reduced() {
  settle();
  if (kind_ == Kind::Sharded)
    grads_.release();
  else
    grads_.zero();
  grads_zero_ = false;
  dirty_ = false;
}

void FlatUnit::set_pending_update(std::shared_ptr<Event> done, bool regather) {
  settle();
  pending_ = std::move(done);
  regather_after_ = regather;
  zero_after_ = false;
}

void FlatUnit::finish_update() {
  std::shared_ptr<Event> e = std::move(pending_);
  pending_ = nullptr;
  const bool regather = regather_after_, zero = zero_after_;
  regather_after_ = zero_after_ = false;
  e->synchronize();  // its failure propagates; the unit then counts as settled
  if (regather) issue_regather();
  if (zero) zero_grads();
}

void FlatUnit::zero_grads() {
  if (pending_) {  // the update still reads the gradients: zeroed once it is done
    zero_after_ = true;
    return;
  }
  const size_t Sh = static_cast<size_t>(shard_size());
  switch (kind_) {
    case Kind::Sharded:
      grads_.release();
      if (release_) {
        grad_shard_buf_.release();
        grad_shard_ = nullptr;
      } else if (!pnvme_) {
        ops_on(grad_device()).fill(grad_shard_, 0.f, Sh);
      }
      break;
    case Kind::FullReplicated:
      grads_.zero();
      ops_on(grad_device()).fill(grad_shard_, 0.f, Sh);
      break;
    case Kind::Whole:
      if (release_) {
        grads_.release();
        grad_shard_ = nullptr;
      } else {
        grads_.zero();
      }
      break;
  }
  grads_zero_ = true;
  dirty_ = false;
}

// ---- Export helpers --------------------------------------------------------------------------

void FlatUnit::gather_params_into(float* out) const {
  settle();
  gather_shard_into(master_, master_device(), out);
}
void FlatUnit::gather_grads_into(float* out) const {
  settle();
  remake_grads();
  if (kind_ == Kind::Whole) grads_.write_unwritten();  // (grad_shard)
  gather_shard_into(grad_shard_, grad_device(), out);
}

// `out` is on the Ops' device; a shard on the host goes to its slot of it first (then in place).
void FlatUnit::gather_shard_into(const float* shard, Device where, float* out) const {
  const int64_t Sh = layout_.shard_size();
  const bool host = where != ops_->device();
  if (kind_ == Kind::Whole) {
    if (host)
      copy_bytes(out, ops_->device(), shard, where, fbytes(layout_.padded));
    else
      ops_->copy(out, shard, static_cast<size_t>(layout_.padded));
    return;
  }
  if (!host) {
    shard_->all_gather(shard, out, Sh);
    return;
  }
  copy_bytes(out + rank_ * Sh, ops_->device(), shard, where, fbytes(Sh));
  shard_->all_gather(out + rank_ * Sh, out, Sh);
}

const Ops& FlatUnit::ops_on(Device d) const { return d.is_cpu() ? ops_for(Device::cpu()) : *ops_; }

// Host shard or NVMe staging -> the gather's slot (or a whole unit's host master -> its
// parameters): on the copy stream, which the compute stream (and so the collective after it)
// waits for natively; the host source is written again only after wait_upload, or, for an
// NVMe staging slot, by a read the io queue holds until this upload is done (upload_event();
// the executor's Gather hands it to the slot).
void FlatUnit::upload(void* dst, const void* src, size_t bytes) {
  wait_upload();
  up_ = copy_bytes_async(dst, ops_->device(), src, Device::cpu(), bytes);
  ops_->stream().wait_event(*up_);
}

void FlatUnit::wait_upload() const {
  if (!up_) return;
  std::shared_ptr<Event> e = std::move(up_);
  up_ = nullptr;
  if (!e->query()) e->synchronize();  // the host blocks only for an upload not yet done
}

void* FlatUnit::host_stage(size_t bytes) {
  wait_upload();  // the narrowed shard in it may still be on its way up
  if (stage_.bytes() < bytes) stage_ = Buffer(bytes, Mem::Communication, Device::cpu(), Tier::Host);
  return stage_.data();
}

void FlatUnit::quiesce() noexcept {
  try {
    wait_upload();
  } catch (...) {
  }
  if (pending_) {
    try {
      pending_->synchronize();
    } catch (...) {
    }
    pending_ = nullptr;
    regather_after_ = zero_after_ = false;
  }
  if (!gather_in_flight_) return;
  try {
    finish_gather();
  } catch (...) {
    gather_in_flight_ = false;
    sstate_ = ShardedState::Unsharded;
  }
}

float* FlatUnit::quant_residual(bool create) {
  if (qerr_.empty()) {
    if (!create) return nullptr;
    qerr_ = Buffer(fbytes(layout_.padded), Mem::Grads);
    qerr_.zero();
  }
  return qerr_.f32();
}

}  // namespace sw

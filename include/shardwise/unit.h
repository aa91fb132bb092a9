/// The unit contract (docs/ARCHITECTURE.md, "Units"). A model is a sequence of units; each unit
/// declares its parameters and implements forward and backward on the residual stream.
/// A unit never allocates its parameters and never communicates: the sharding layer owns
/// parameter memory (one flat buffer per unit, declaration order) and hands the unit pointers
/// to the gathered parameters and to the gradient buffers for each call. @file
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "shardwise/alloc.h"
#include "shardwise/tensor.h"
#include "shardwise/ops.h"
#include "shardwise/recompute.h"

namespace sw {

enum class Init : uint8_t { Normal, Zeros, Ones };

/// Tensor parallelism (docs/ARCHITECTURE.md, "Tensor parallelism"): a unit built for tensor rank r
/// of t holds a part of some logical tensors. TensorSplit says which part: the logical rows (dim
/// 0) it holds, in order, as [lo, hi) runs (a column-parallel q|k|v weight holds three runs: its
/// q, k and v heads; a vocabulary-parallel table one), and optionally the columns [col_lo,
/// col_hi) of dim 1 (a row-parallel weight). An empty `logical`: not split, the same tensor on
/// every tensor rank (replicated; with t > 1 its gradient is summed over the tensor group and
/// the gradient norm counts it once).
struct TensorSplit {
  std::vector<int64_t> logical{};            ///< the logical shape; empty: not split
  std::vector<std::array<int64_t, 2>> rows{};  ///< logical rows held, in order; empty: all
  int64_t col_lo = 0, col_hi = 0;            ///< logical columns held; col_hi == 0: all
  bool split() const { return !logical.empty(); }
  /// The logical row-major index of element i of the local tensor of shape `local`.
  int64_t logical_index(int64_t i, const std::vector<int64_t>& local) const;
};

struct ParamSpec {
  std::string name{};  ///< global, unique in the model: "h.3.attn.qkv.weight"
  Shape shape{};
  Init init = Init::Normal;
  float std = 0.02f;         ///< for Init::Normal
  bool weight_decay = true;  ///< AdamW decays matrices, not norms/biases
  /// Export: the Hugging Face tensor name and whether HF stores the transpose of our
  /// (out, in) matrix (GPT-2's Conv1D). Empty hf_name: exported under `name`. (Members are
  /// value-initialised, so that a spec written as {name, shape, init, std, decay} is complete.)
  std::string hf_name{};
  bool hf_transpose = false;
  /// Read only through UnitCtx::weight, never UnitCtx::param (a matrix product's weight, an
  /// embedding table that Ops::embedding_forward reads): where the unit keeps a 16-bit copy
  /// of its parameters (a device in mixed precision), the ops read that copy, so its fp32
  /// compute copy is not kept (UnitCtx::param(i) is null then).
  /// Last, so code that lists the fields above in order still compiles.
  bool products_only = false;
  /// Tensor parallelism: which part of a logical tensor this is (TensorSplit); `name` stays the
  /// logical tensor's.
  TensorSplit split{};
  /// Read only by Ops::linear_forward / linear_backward (a Linear's weight; implies
  /// products_only): the weights FP8 linears quantise, which `fp8.all_gather` gathers as fp8.
  bool linear = false;
  /// A Linear weight applied packed with the one declared before it (the Llama's k and v after
  /// q, up after gate; Packed, models/packed.h): where the two are contiguous in the unit's
  /// flat buffer the product reads them as one tensor, so fp8 scales them as one.
  bool packed_with_previous = false;
};

/// A parameter as the built-in models declare them: weight decay on matrices only; hf the Hugging
/// Face name (hf_t: HF stores the transpose).
ParamSpec param_spec(std::string name, Shape shape, Init init, float std, std::string hf,
                     bool hf_t = false);

/// `p` marked as read only through UnitCtx::weight (ParamSpec::products_only).
inline ParamSpec product_weight(ParamSpec p) {
  p.products_only = true;
  return p;
}
/// `p` marked as a Linear's weight (ParamSpec::linear, and products_only); packed: applied
/// packed with the weight declared before it (ParamSpec::packed_with_previous).
inline ParamSpec linear_weight(ParamSpec p, bool packed = false) {
  p.products_only = p.linear = true;
  p.packed_with_previous = packed;
  return p;
}

/// How a Saved buffer fares under selective activation checkpointing. Always: kept (outputs of
/// matrix products and attention, norm statistics: costly to recompute, or tiny). Cheap: an
/// element-wise result (norm output, GELU/SwiGLU output) that selective checkpointing frees
/// after forward and the unit's recompute_cheap() rebuilds from the Always buffers.
enum class Keep : uint8_t { Always, Cheap };

/// A buffer a unit keeps from forward for its backward, declared once by the unit as a constant
/// (a typed slot of its Saved), so that forward, recompute and backward name the same buffer
/// with its element type, and checkpointing knows how it fares. `id` is unique within one
/// call's Saved (a small number: the slots are a vector, no lookup by name); `name` says which
/// in messages.
template <class T>
struct SavedSlot {
  uint16_t id = 0;
  Keep keep = Keep::Always;
  const char* name = "";
};
/// A flag forward leaves on the host for backward (no device memory, so the host reads it
/// without a copy); ids as SavedSlot's, in a space of their own.
struct SavedFlag {
  uint16_t id = 0;
  const char* name = "";
};

/// Activations a unit keeps from forward for its backward, owned by the engine (one Saved per
/// call site) so that activation checkpointing can drop and recompute them. Tracked as
/// Mem::Activations.
class Saved {
 public:
  /// Forward: n values for slot s (the allocation reused when it is there with the same size).
  template <class T>
  T* put(SavedSlot<T> s, size_t n) {
    return static_cast<T*>(put_bytes(s.id, n * sizeof(T), tag<T>(), s.keep, s.name));
  }
  /// Backward: the slot's values; an error when forward kept none in it (or of another type).
  template <class T>
  T* get(SavedSlot<T> s) const {
    return static_cast<T*>(get_bytes(s.id, tag<T>(), s.name));
  }
  template <class T>
  bool has(SavedSlot<T> s) const {
    return s.id < slots_.size() && slots_[s.id].type != 0;
  }
  void set(SavedFlag f, bool v);
  bool flag(SavedFlag f) const;  ///< throws if forward set none
  /// The nested Saved of part j of a composite unit (sharding/wrap.cpp), owned by this one.
  /// bytes(), cheap_bytes(), clear() and drop_cheap() include the parts.
  Saved& part(size_t j);
  size_t bytes() const;
  size_t cheap_bytes() const;  ///< bytes of the Keep::Cheap buffers
  void clear();                ///< frees everything
  size_t drop_cheap();         ///< frees the Keep::Cheap buffers; returns the bytes freed
  /// Moves every buffer (parts included) to memory of tier `t` (core/alloc.h), same contents:
  /// activation offload. Tier::Device buffers live on `device`, the others on the CPU. The
  /// copies are asynchronous (copy_bytes_async, after the compute stream's work): each copy's
  /// event is appended to `done` and the buffer it copies from to `from`, index for index; the
  /// caller keeps those until the events complete. The new buffers are in place at once and
  /// hold the contents once the copies are done. Returns the bytes moved.
  size_t move_to(Tier t, Device device, std::vector<std::shared_ptr<Event>>& done,
                 std::vector<Buffer>& from);
  /// Activation offload to a file: detach() moves every buffer out (parts included, in a fixed
  /// order) for the caller to write and keep until the write is done, leaving each slot empty
  /// with its size remembered; reattach() allocates them again (device tier, same order) and
  /// returns them to be read into. Between the two, get() of a detached buffer is an error.
  std::vector<Buffer> detach();
  std::vector<Buffer*> reattach();
  /// Where new buffers (and parts' buffers) are allocated: the device the unit computes on
  /// (the CPU unless the engine says otherwise).
  void set_device(Device d) { device_ = d; }
  Device device() const { return device_; }
 private:
  struct Slot {
    Buffer buf;
    Keep keep = Keep::Always;
    uint8_t type = 0;     ///< tag<T>() of what it holds; 0: empty
    size_t detached = 0;  ///< bytes of a buffer moved out by detach()
    const char* name = "";
  };
  template <class T>
  static constexpr uint8_t tag() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint16_t> ||
                  std::is_same_v<T, int32_t>);
    return std::is_same_v<T, float> ? 1 : std::is_same_v<T, uint16_t> ? 2 : 3;
  }
  void* put_bytes(uint16_t id, size_t bytes, uint8_t type, Keep keep, const char* name);
  void* get_bytes(uint16_t id, uint8_t type, const char* name) const;
  std::vector<Slot> slots_;  ///< by SavedSlot::id
  std::vector<std::unique_ptr<Saved>> parts_;
  std::vector<int8_t> flags_;  ///< by SavedFlag::id: -1 unset, else 0 / 1
  Device device_;
};

/// Temporary memory for one call, released (for reuse) when the call returns. Tracked as
/// Mem::Workspace. Bump allocation in 64-byte steps: f32(n) takes bytes_for(n) bytes.
/// reserve(bytes) makes one block of at least that size, so calls whose requests stay within it
/// never allocate; otherwise the scratch grows (a fallback: a unit that under-declares its
/// scratch still runs). high_water() says how much was requested at most, so an
/// under-declaration is detectable.
class Scratch {
 public:
  float* f32(size_t n);  ///< a fresh region each call until reset()
  /// n 16-bit values: the region of f32((n + 1) / 2).
  uint16_t* lp(size_t n) { return reinterpret_cast<uint16_t*>(f32((n + 1) / 2)); }
  /// Releases every region handed out since the innermost live Hold (or all of them).
  void reset();
  /// Replaces the blocks by one of at least `bytes` (nothing allocated when one block that large
  /// already exists). Only between calls: nothing may be handed out.
  void reserve(size_t bytes);
  size_t capacity_bytes() const;
  /// Bytes handed out now / at most since reset_high_water() (bytes_for of each request).
  size_t live_bytes() const { return live_ * sizeof(float); }
  size_t high_water() const { return high_ * sizeof(float); }
  void reset_high_water() { high_ = live_; }
  /// Where the blocks are allocated (the CPU unless the engine says otherwise); only before
  /// the first block.
  void set_device(Device d) { device_ = d; }
  static constexpr size_t bytes_for(size_t n) {
    return (n == 0 ? kAlign : (n + kAlign - 1) / kAlign * kAlign) * sizeof(float);
  }

  /// Keeps the regions handed out so far alive across reset() until it is destroyed (a
  /// composite unit's ping-pong buffers across its parts' calls; the engine's y of a full
  /// recompute). Holds nest; destroy them in reverse order.
  class Hold {
   public:
    explicit Hold(Scratch& s) : s_(s), prev_(s.floor_) { s.floor_ = s.pos(); }
    ~Hold() { s_.floor_ = prev_; }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
   private:
    Scratch& s_;
    struct Pos {
      size_t block = 0, off = 0, live = 0;
    };
    friend class Scratch;
    Pos prev_;
  };

 private:
  static constexpr size_t kAlign = 16;  ///< floats (64 bytes)
  Hold::Pos pos() const { return {cur_, off_, live_}; }
  std::vector<Buffer> blocks_;
  size_t cur_ = 0;   ///< block in use
  size_t off_ = 0;   ///< floats used in blocks_[cur_]
  size_t live_ = 0;  ///< floats handed out (all blocks) since the last reset to zero
  size_t high_ = 0;  ///< most of live_ since reset_high_water()
  Hold::Pos floor_;  ///< where reset() returns to
  Device device_;
};

struct Batch {
  const int32_t* tokens = nullptr;   ///< (B, T)
  const int32_t* targets = nullptr;  ///< (B, T); < 0 = ignore
  int B = 0, T = 0;
  /// The targets counted, when known; -1: count_targets reads them. A batch on a device sets
  /// it, since the host cannot read its targets.
  int64_t counted = -1;
};

/// The targets a loss counts: those >= 0 (a negative target is ignored).
int64_t count_targets(const Batch& b);

/// A matrix product's input that a unit writes for its products and keeps for backward (a norm's
/// output, an MLP's activation): where the Ops compute products in 16 bits (Ops::compute() BF16
/// / F16) it holds their 16-bit values (lp, 2 bytes a value), written by the ops' 16-bit outputs
/// and read as the products' 16-bit operands (kernels/ops.h): the same bits as the fp32 input,
/// which the products would round to these values, without narrowing it on every product; f32
/// otherwise.
struct ProductIn {
  float* f32 = nullptr;
  uint16_t* lp = nullptr;
  Operand operand() const { return lp ? Operand(lp) : Operand(f32); }
  Out out() const { return lp ? Out(lp) : Out(f32); }  ///< as an op's output
  GradIn set() const { return GradIn::set(f32, lp); }  ///< as a written input gradient
};
/// The slot of a Saved a ProductIn is kept in: its fp32 or its 16-bit form, as the Ops compute.
struct ProductSlot {
  uint16_t id = 0;
  Keep keep = Keep::Always;
  const char* name = "";
  SavedSlot<float> f32() const { return {id, keep, name}; }
  SavedSlot<uint16_t> lp() const { return {id, keep, name}; }
};
/// True where `ops` computes products in 16 bits (a unit's ProductIns are then 16-bit).
inline bool lowp(const Ops& ops) { return ops.compute() != DType::F32; }

/// Tensor parallelism: the collectives a unit runs with the other ranks of its tensor group, each
/// one a plan action on the tensor queue (sharding/tensor_parallel.h runs them; the plan lists
/// what each call declares, Unit::declare_tensor_comm, and the engine checks the calls match).
/// Rows: a (rows, width) buffer of the tensor group's rows in rank order (sequence parallelism:
/// rank k holds rows [k n, (k + 1) n) of the N = B T rows).
enum class TensorOp : uint8_t {
  GatherRows,   ///< full (t n) <- every rank's mine (n), in rank order; any element type (bytes)
  ScatterRows,  ///< mine (n) = the sum over ranks of their full (t n)'s rank-th part (fp32)
  AllGather,    ///< as GatherRows (a unit's small per-row statistics)
};
const char* tensor_op_name(TensorOp op);  ///< "tp_gather_rows", "tp_scatter_rows", "tp_all_gather"
/// One declared collective: its op and the bytes of the full (gathered / pre-scatter) buffer.
struct TensorColl {
  TensorOp op = TensorOp::GatherRows;
  int64_t bytes = 0;
  bool operator==(const TensorColl&) const = default;
};
class TensorComm {
 public:
  virtual ~TensorComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// GatherRows / AllGather: full (size() * bytes) <- every rank's `mine` (bytes).
  virtual void gather(TensorOp op, void* full, const void* mine, size_t bytes) = 0;
  /// ScatterRows: mine (n floats) = sum over ranks of their full[rank() n, (rank() + 1) n).
  virtual void scatter(float* mine, const float* full, size_t n) = 0;
};

struct UnitCtx {
  const Ops* ops = nullptr;
  const Batch* batch = nullptr;
  const std::vector<float*>* params = nullptr;  ///< gathered parameters, ParamSpec order
  const std::vector<float*>* grads = nullptr;   ///< gradient buffers (accumulate +=), same order
  /// Where the engine has not zeroed them (a step's first call with gradients): per parameter,
  /// 1 while its gradient is zero in value but its memory unwritten, so that the first op
  /// producing it writes it (grad_out) instead of adding into zeros; grads_n: each one's value
  /// count. Null: every gradient buffer holds values (this is all a unit run outside the engine
  /// sees). grad() zeroes an unwritten one first; the engine zeroes what is left unwritten
  /// before anything else reads it.
  uint8_t* grads_fresh = nullptr;
  const size_t* grads_n = nullptr;
  Saved* saved = nullptr;
  Scratch* scratch = nullptr;
  bool training = true;    ///< false: inference/eval; no gradients will be asked for
  float grad_scale = 1.f;  ///< loss units: multiply d(sum of token losses) by this
  /// Loss units report the sum of token losses and the number of counted tokens (add_loss
  /// below does both): the sum goes into *loss_total when the engine gives one (one double of
  /// ops' device, summed there; the host reads it once per step), else into loss_sum.
  double* loss_total = nullptr;
  double loss_sum = 0.0;
  int64_t loss_count = 0;
  /// Inference only (training == false): when non-null, a loss call writes the (B, V) logits of
  /// the last position of each sequence here instead of computing a loss.
  float* logits = nullptr;

  /// A mixed-precision unit on a device (sharding/unit_state.h): each parameter's 16-bit copy,
  /// in ParamSpec order, holding exactly narrow(param(i)); null where there is none (fp32
  /// compute, the CPU, a unit run outside the engine).
  const std::vector<const uint16_t*>* params16 = nullptr;

  /// Tensor parallelism: the unit's tensor group (null: the unit is not split). Sequence
  /// parallel units get x, y, dy, dx of their rows only (N / t of the batch's B T rows).
  TensorComm* tensor = nullptr;

  /// Backward where the Ops read 16-bit operands and compute products in 16 bits
  /// (Ops::prefers_lp_operands, lowp): room for B*T*d_model 16-bit values that the engine keeps
  /// from one backward call to the next, for the residual stream's gradient in the compute
  /// precision. On entry it holds narrow(dy) where dy16 is true; a unit that leaves narrow(dx)
  /// of its final dx in it sets dx16 (the norm backward helpers below do; no op may change dx
  /// after). Null elsewhere (a unit run outside the engine, the CPU, fp32 products).
  uint16_t* grad16 = nullptr;
  bool dy16 = false;
  bool dx16 = false;

  float* param(size_t i) const { return (*params)[i]; }
  /// Parameter i's gradient to add into (zeroed first where it is unwritten).
  float* grad(size_t i) const {
    if (grads_fresh && grads_fresh[i]) zero_fresh(i);
    return (*grads)[i];
  }
  /// Parameter i's gradient for the op that produces it: written (GradOut::write) where it is
  /// unwritten, so that op must then write every value of it; added into otherwise. Ask for it
  /// only right where an op produces it.
  GradOut grad_out(size_t i) const {
    const bool w = grads_fresh && grads_fresh[i];
    if (w) grads_fresh[i] = 0;
    return {(*grads)[i], w};
  }
  /// Parameter i as a matrix product's operand: its fp32 values and, where the unit has one,
  /// its 16-bit copy beside them (an Operand with both forms; the backend picks).
  Operand weight(size_t i) const {
    return {(*params)[i], params16 ? (*params16)[i] : nullptr};
  }

 private:
  void zero_fresh(size_t i) const;
};

/// A loss call's fused LM head and cross-entropy (Ops::lmhead_xent; dx, dw may be null), reported
/// into ctx: the sum of token losses into ctx.loss_total (Ops::lmhead_xent_into, no host
/// synchronisation) or ctx.loss_sum, and the counted targets into ctx.loss_count.
void add_loss(UnitCtx& ctx, float* losses, float* dx, float* dw, const float* x, Operand w,
              int C, int V);

/// ---- ProductIn's storage: the 16-bit form where lowp(ops), the fp32 one otherwise.
/// A product input of n values kept for backward: in ctx.saved's `slot` when training, in
/// ctx.scratch otherwise.
ProductIn keep_input(UnitCtx& ctx, ProductSlot slot, size_t n);
/// The same buffer in a Saved (recompute_cheap writes it again; backward reads it).
ProductIn saved_input(Saved& s, ProductSlot slot, size_t n, const Ops& ops);
ProductIn saved_input(const Saved& s, ProductSlot slot, const Ops& ops);
/// A fresh product operand of n values in scratch (a gradient fed to products).
ProductIn scratch_input(Scratch& s, size_t n, const Ops& ops);

/// ---- Products with the residual stream added (a block's "x2 = x + proj(h)", then its norm):
/// where the Ops add it in the product (Ops::fuses_product_residual) linear_forward with res,
/// then the plain norm; elsewhere the product, then the fused residual + norm (NormIn::residual,
/// or residual_forward). The same values either way (up to the product's summation order on a
/// device). inp: fp32 or 16-bit (a ProductIn's operand); w: any form (UnitCtx::weight).
void linear_residual_to(const Ops& ops, float* y, Operand inp, Operand w, const float* b,
                        const float* res, int N, int C, int OC);
void linear_residual_rmsnorm_to(const Ops& ops, float* y, ProductIn out, float* rstd,
                                Operand inp, Operand w, const float* b, const float* res,
                                const float* nw, int N, int C, int OC, float eps);
void linear_residual_layernorm_to(const Ops& ops, float* y, ProductIn out, float* mean,
                                  float* rstd, Operand inp, Operand w, const float* b,
                                  const float* res, const float* nw, const float* nb, int N,
                                  int C, int OC);

/// ---- The residual stream's gradient (UnitCtx::grad16).
/// dy as a product's dout: with its 16-bit form beside it where the engine kept one.
Operand dy_operand(const UnitCtx& ctx, const float* dy);
/// A norm's backward adding into the residual gradient dx (Ops::layernorm_backward /
/// rmsnorm_backward), writing narrow(dx) into ctx.grad16 as well where there is one (dinp's
/// 16-bit form, GradIn::add; ctx.dx16 then says so): dx_operand(ctx, dx) is then dx with both
/// forms, for the products that read it next, and a unit's last such norm hands the next unit
/// its dy16.
void layernorm_backward_resid(UnitCtx& ctx, float* dx, float* dw, float* db, const float* dout,
                              const float* inp, const float* w, const float* mean,
                              const float* rstd, int N, int C);
void rmsnorm_backward_resid(UnitCtx& ctx, float* dx, float* dw, const float* dout,
                            const float* inp, const float* w, const float* rstd, int N, int C);
Operand dx_operand(const UnitCtx& ctx, const float* dx);

/// The batch shape a unit's activation sizes depend on, and the precision of the Ops it computes
/// with (Ops::compute(): a ProductIn is 2 bytes a value in BF16 / F16, 4 in F32).
struct BatchShape {
  int B = 0, T = 0;
  DType compute = DType::F32;
  bool lowp() const { return compute != DType::F32; }
  /// Bytes of n values of a ProductIn: in a Saved, and as a Scratch request.
  size_t input_bytes(size_t n) const { return n * (lowp() ? 2 : 4); }
  size_t input_scratch(size_t n) const {
    return Scratch::bytes_for(lowp() ? (n + 1) / 2 : n);
  }
};

/// What one call of a unit allocates, declared before it runs (Unit::declare_activations), so a
/// planner can predict a step's memory without running the model and the engine can reserve
/// Scratch once. Exact, not bounds (tests/models/test_activation_decl.cpp checks equality):
/// Saved bytes are the sum of n * sizeof(T) over Saved::put(slot, n) requests (parts included);
/// Scratch bytes are the high-water mark of a call, the sum of Scratch::bytes_for(n) over the
/// f32(n) requests live at once (a composite's parts run one after another, so it is its held
/// buffers plus the largest part's). Memory kernels keep for themselves (the LM head's logits
/// chunk, attention workspaces: Mem::Workspace) is not a unit's and not declared here.
struct ActivationDecl {
  /// Training, as the engine runs it: forward with gradient buffers, then backward.
  size_t saved = 0;              ///< Saved::bytes() after forward
  size_t saved_cheap = 0;        ///< of which Keep::Cheap (dropped under selective checkpointing)
  size_t scratch_fwd = 0;        ///< forward (also a full-recompute forward, which runs without
                                 /// gradient buffers and keeps the same Saved; loss calls are
                                 /// never recomputed)
  size_t scratch_bwd = 0;        ///< backward
  size_t scratch_recompute = 0;  ///< recompute_cheap (after drop_cheap)
  /// Inference (training == false). The engine clears the Saved after the call; saved_eval is
  /// the most it held during the call (0 for units that keep nothing in inference).
  size_t saved_eval = 0, scratch_eval = 0;      ///< a loss call computes the loss
  size_t saved_logits = 0, scratch_logits = 0;  ///< ctx.logits set (sampling); = eval for non-loss calls
  bool known = true;  ///< false: the unit did not declare (no override); the planner reports it
};

class Unit {
 public:
  virtual ~Unit() = default;
  virtual std::string name() const = 0;         ///< "h.3", "embed_head"
  virtual std::vector<ParamSpec> params() const = 0;
  /// How many times the unit runs per forward (a tied embedding/head unit runs twice). The
  /// model's schedule says which call runs when.
  virtual int num_calls() const { return 1; }
  /// x, y: (B, T, d_model) residual stream; the first call of an embedding ignores x, a loss
  /// call writes no y (y may be null) and reports its loss into ctx (add_loss).
  virtual void forward(UnitCtx& ctx, int call, const float* x, float* y) = 0;
  /// Given dy (null for a loss call), writes (=, not +=) dx (null for an embedding call) and
  /// accumulates parameter gradients into ctx.grads. x is the same input forward saw.
  virtual void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) = 0;
  /// True when backward may be given dx == dy (it reads dy only before it first writes dx): the
  /// engine then passes one buffer and the unit skips copying dy into dx (its residual path).
  virtual bool backward_in_place() const { return false; }

  /// Selective activation checkpointing (the engine calls it right before backward, for a call
  /// whose Keep::Cheap buffers it dropped after forward; only when selective_recompute() is
  /// true, never for a loss call). Must rebuild those buffers exactly as forward left them, bit
  /// for bit, from the Keep::Always buffers still in ctx.saved. ctx.training is true,
  /// ctx.grads is null (no gradient may be touched) and x is forward's input. A fully
  /// checkpointed call (empty ctx.saved) is rebuilt by re-running forward instead, which is
  /// right for every unit whose forward is a pure function of (params, batch, x).
  virtual void recompute_cheap(UnitCtx& ctx, int call, const float* x);
  /// True when recompute_cheap() rebuilds the Keep::Cheap buffers from the others.
  /// When false the engine checkpoints the unit's calls fully under Selective.
  virtual bool selective_recompute() const { return false; }

  /// The activation memory of call `call` for batches of `shape` (see ActivationDecl): what
  /// forward, backward and recompute_cheap will request from ctx.saved and ctx.scratch. The
  /// default returns known = false: the engine still runs the unit (Scratch grows as needed),
  /// and the planner reports the unit as undeclared.
  virtual ActivationDecl declare_activations(int call, BatchShape shape) const;

  /// Tensor parallelism: the collectives call `call` runs through ctx.tensor, in order, in each
  /// pass (the plan lists them as actions; the engine checks the unit asks for exactly these).
  /// The default: none (a unit that is not split).
  enum class Pass : uint8_t { Forward, Backward, Recompute, Eval, Logits };
  virtual std::vector<TensorColl> declare_tensor_comm(int call, Pass pass,
                                                      BatchShape shape) const;
};

}  // namespace sw
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @enum sw::Init
/// How a parameter is initialised: N(0, std), zeros or ones.

/// @var sw::TensorSplit::col_lo
/// First logical column held (see col_hi).

/// @fn sw::TensorSplit::split() const
/// True when the tensor is split over tensor ranks.

/// @struct sw::ParamSpec
/// A parameter a unit declares (Unit::params): its name, shape, initialisation, weight decay
/// and export name. The engine allocates, shards and checkpoints it.

/// @var sw::ParamSpec::shape
/// Its shape on this rank (row-major).

/// @var sw::ParamSpec::init
/// Its initialisation.

/// @var sw::ParamSpec::hf_transpose
/// Hugging Face stores the transpose (see hf_name).

/// @var sw::SavedSlot::id
/// The slot's number, unique within a call's Saved.

/// @var sw::SavedSlot::keep
/// Whether selective checkpointing drops it (Keep::Cheap).

/// @var sw::SavedSlot::name
/// Its name in messages.

/// @var sw::SavedFlag::id
/// The flag's number, unique within a call's Saved.

/// @var sw::SavedFlag::name
/// Its name in messages.

/// @fn sw::Saved::has(SavedSlot< T > s) const
/// True when forward kept a buffer in slot s.

/// @fn sw::Saved::set(SavedFlag f, bool v)
/// Forward: sets the flag f.

/// @fn sw::Saved::bytes() const
/// Bytes held (parts included).

/// @fn sw::Saved::reattach()
/// Allocates the detached buffers again (see detach) and returns them, in detach's order.

/// @fn sw::Saved::device() const
/// Where new buffers are allocated.

/// @fn sw::Scratch::capacity_bytes() const
/// Bytes of the blocks it holds.

/// @fn sw::Scratch::high_water() const
/// The most bytes handed out at once since reset_high_water().

/// @fn sw::Scratch::reset_high_water()
/// high_water() := the bytes handed out now.

/// @fn sw::Scratch::bytes_for(size_t n)
/// Bytes f32(n) takes: n floats rounded up to 64 bytes (at least 64).

/// @fn sw::Scratch::Hold::Hold(Scratch& s)
/// Keeps what `s` handed out so far until destroyed.

/// @struct sw::Batch
/// A micro-batch of token ids and their targets on this rank.

/// @var sw::Batch::B
/// Sequences.

/// @var sw::Batch::T
/// Tokens per sequence.

/// @var sw::ProductIn::f32
/// fp32 form (or null).

/// @var sw::ProductIn::lp
/// 16-bit form (or null).

/// @fn sw::ProductIn::operand() const
/// As an op's input.

/// @var sw::ProductSlot::id
/// As SavedSlot::id.

/// @var sw::ProductSlot::keep
/// As SavedSlot::keep.

/// @var sw::ProductSlot::name
/// As SavedSlot::name.

/// @fn sw::ProductSlot::f32() const
/// The slot of its fp32 form.

/// @fn sw::ProductSlot::lp() const
/// The slot of its 16-bit form.

/// @var sw::TensorColl::op
/// Which collective.

/// @var sw::TensorColl::bytes
/// Bytes of the whole (gathered) tensor.

/// @fn sw::TensorColl::operator==(const TensorColl&) const
/// Same op and size.

/// @class sw::TensorComm
/// A split unit's tensor-parallel group (UnitCtx::tensor): its rank and the row collectives.

/// @fn sw::TensorComm::rank() const
/// This rank in the tensor group.

/// @fn sw::TensorComm::size() const
/// The tensor-parallel degree.

/// @struct sw::UnitCtx
/// What the engine gives a unit's call: the ops, the batch, the gathered parameters and
/// gradient buffers, its Saved and Scratch, and where to report the loss.

/// @var sw::UnitCtx::ops
/// The kernels of the device the call runs on.

/// @var sw::UnitCtx::batch
/// The micro-batch (tokens, targets; its rows only with sequence parallelism).

/// @var sw::UnitCtx::grads_n
/// Per parameter: its value count (with grads_fresh).

/// @var sw::UnitCtx::saved
/// This call's activations kept for backward.

/// @var sw::UnitCtx::scratch
/// Temporaries released when the call returns.

/// @var sw::UnitCtx::loss_sum
/// Loss units: the sum of token losses, when loss_total is null.

/// @var sw::UnitCtx::loss_count
/// Loss units: the targets counted.

/// @var sw::UnitCtx::dy16
/// grad16 holds narrow(dy) on entry.

/// @var sw::UnitCtx::dx16
/// The unit left narrow(dx) in grad16.

/// @fn sw::UnitCtx::param(size_t i) const
/// Parameter i, gathered (fp32; null for a products_only parameter kept 16-bit).

/// @fn sw::saved_input(const Saved& s, ProductSlot slot, const Ops& ops)
/// The buffer of `slot` in a Saved, read (backward).

/// @fn sw::linear_residual_rmsnorm_to(const Ops& ops, float* y, ProductIn out, float* rstd, Operand inp, Operand w, const float* b, const float* res, const float* nw, int N, int C, int OC, float eps)
/// y = res + inp w^T (+ b), then out = RMSNorm(y) with weight nw (rstd saved).

/// @fn sw::linear_residual_layernorm_to(const Ops& ops, float* y, ProductIn out, float* mean, float* rstd, Operand inp, Operand w, const float* b, const float* res, const float* nw, const float* nb, int N, int C, int OC)
/// y = res + inp w^T (+ b), then out = LayerNorm(y) with nw, nb (mean, rstd saved).

/// @fn sw::rmsnorm_backward_resid(UnitCtx& ctx, float* dx, float* dw, const float* dout, const float* inp, const float* w, const float* rstd, int N, int C)
/// The RMSNorm form of layernorm_backward_resid.

/// @fn sw::dx_operand(const UnitCtx& ctx, const float* dx)
/// dx as a product's operand, with the 16-bit form the norm backward helpers left in grad16.

/// @var sw::BatchShape::B
/// Sequences per micro-batch.

/// @var sw::BatchShape::T
/// Tokens per sequence.

/// @var sw::BatchShape::compute
/// The products' precision.

/// @fn sw::BatchShape::lowp() const
/// True when products take 16-bit operands.

/// @fn sw::BatchShape::input_scratch(size_t n) const
/// Scratch bytes of n values of a ProductIn.

/// @var sw::ActivationDecl::saved_logits
/// Saved bytes of an inference call with ctx.logits set (sampling).

/// @class sw::Unit
/// The unit contract: a part of a model that declares its parameters (params) and activation
/// memory (declare_activations) and runs forward and backward on the residual stream.

/// @fn sw::Unit::params() const
/// Its parameters, in the order of ctx.param(i) and ctx.grad(i).

/// @fn sw::Unit::declare_tensor_comm(int call, Pass pass, BatchShape shape) const
/// The tensor collectives (TensorColl) call `call` issues in `pass`, in order, so the step
/// plan lists them (tensor parallelism; empty for an unsplit unit).

// Pipeline schedules as data, their simulator and stage balancing (see pipeline_schedule.h).
#include "sharding/pipeline_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace sw {

namespace {

const char* const kNames[] = {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"};

std::string num(int v) { return std::to_string(v); }

PipeOp op(PipeOpKind k, int m, int c) { return PipeOp{k, m, c}; }

void check_args(PipeSchedule s, int P, int V, int M, int rank) {
  const std::string sched = pipe_schedule_name(s);
  if (P < 1)
    fail("pipeline", "parallelism.pipeline_parallel_degree: P must be >= 1, got " + num(P));
  if (M < 1)
    fail("pipeline", "gradient_accumulation_steps: micro-batches M must be >= 1, got " + num(M));
  if (V < 1) fail("pipeline", sched + ": virtual stages per rank V must be >= 1, got " + num(V));
  if (rank < 0 || rank >= P)
    fail("pipeline", "rank " + num(rank) + " is outside the pipeline of P=" + num(P) + " ranks");
  if (V > 1 && !pipe_schedule_interleaved(s))
    fail("pipeline", sched + ": V=" + num(V) +
                         " virtual stages per rank need an interleaved schedule (Interleaved1F1B, "
                         "InterleavedZeroBubble); GPipe and 1F1B take V=1");
  if (V > 1 && M % P != 0)
    fail("pipeline", sched + ": gradient_accumulation_steps: micro-batches M=" + num(M) +
                         " must be a multiple of parallelism.pipeline_parallel_degree P=" +
                         num(P) + " when V=" + num(V) + " > 1");
}

std::vector<PipeOp> gpipe(int M) {
  std::vector<PipeOp> out;
  for (int m = 0; m < M; ++m) out.push_back(op(PipeOpKind::Forward, m, 0));
  for (int m = 0; m < M; ++m) out.push_back(op(PipeOpKind::Backward, m, 0));
  return out;
}

std::vector<PipeOp> one_f_one_b(int P, int M, int rank) {
  const int warm = std::min(P - rank - 1, M);
  std::vector<PipeOp> out;
  for (int m = 0; m < warm; ++m) out.push_back(op(PipeOpKind::Forward, m, 0));
  for (int k = 0; k < M - warm; ++k) {
    out.push_back(op(PipeOpKind::Forward, warm + k, 0));
    out.push_back(op(PipeOpKind::Backward, k, 0));
  }
  for (int m = M - warm; m < M; ++m) out.push_back(op(PipeOpKind::Backward, m, 0));
  return out;
}

// Megatron's interleaved schedule (M % P == 0). The k-th forward of this rank runs micro-batch
// (k / (P*V)) * P + k % P on chunk (k % (P*V)) / P; the k-th backward the same micro-batch on
// chunk V - 1 - (k % (P*V)) / P.
std::vector<PipeOp> interleaved(int P, int V, int M, int rank) {
  const int total = M * V;
  const int warm = std::min((P - rank - 1) * 2 + (V - 1) * P, total);
  auto fwd = [&](int k) {
    const int g = k % (P * V);
    return op(PipeOpKind::Forward, (k / (P * V)) * P + k % P, g / P);
  };
  auto bwd = [&](int k) {
    const int g = k % (P * V);
    return op(PipeOpKind::Backward, (k / (P * V)) * P + k % P, V - 1 - g / P);
  };
  std::vector<PipeOp> out;
  for (int k = 0; k < warm; ++k) out.push_back(fwd(k));
  for (int k = 0; k < total - warm; ++k) {
    out.push_back(fwd(warm + k));
    out.push_back(bwd(k));
  }
  for (int k = total - warm; k < total; ++k) out.push_back(bwd(k));
  return out;
}

// The zero-bubble order of every rank: the F/I orders are `main` (the interleaved F/B order
// with B -> I); W's are placed by a greedy run of all ranks at once on unit costs (f = i = w =
// 1, no comm): a rank that is free runs its next F/I when that is ready (and, for an F, when
// its live micro-batches -- forward done, W not done -- stay within `cap`, the largest
// interleaved peak in flight over the ranks), else its oldest pending W, else waits for the
// next event.
std::vector<std::vector<PipeOp>> zero_bubble(int P, int V, int M) {
  const int S = P * V;
  const size_t nP = size_t(P);
  std::vector<std::vector<PipeOp>> main(nP), out(nP);
  int cap = 0;
  for (int r = 0; r < P; ++r) {
    main[size_t(r)] = V == 1 ? one_f_one_b(P, M, r) : interleaved(P, V, M, r);
    cap = std::max(cap, pipe_peak_in_flight(main[size_t(r)]));
    for (PipeOp& o : main[size_t(r)])
      if (o.kind == PipeOpKind::Backward) o.kind = PipeOpKind::BackwardInput;
  }
  // End times of F and I per (micro, global stage); < 0: not run yet.
  std::vector<double> f_end(size_t(M * S), -1), i_end(size_t(M * S), -1);
  auto at = [&](int m, int g) { return size_t(m * S + g); };
  std::vector<size_t> pos(nP, 0);
  std::vector<std::vector<PipeOp>> pending(nP);  // W's in the order of their I
  std::vector<size_t> pend_head(nP, 0);
  std::vector<int> live(nP, 0);
  std::vector<double> t(nP, 0);
  auto finished = [&](int r) {
    return pos[size_t(r)] == main[size_t(r)].size() && pend_head[size_t(r)] == pending[size_t(r)].size();
  };
  // The end time of the dependency of main op o on rank r that ends last; -1 when one has not
  // run yet; 0 when it has none.
  auto deps_end = [&](int r, const PipeOp& o) {
    const int g = pipe_stage(P, r, o.chunk);
    double e = 0;
    auto need = [&](double d) { e = (d < 0 || e < 0) ? -1 : std::max(e, d); };
    if (o.kind == PipeOpKind::Forward) {
      if (g > 0) need(f_end[at(o.micro, g - 1)]);
    } else {
      need(f_end[at(o.micro, g)]);
      if (g < S - 1) need(i_end[at(o.micro, g + 1)]);
    }
    return e;
  };
  // Time advances from event to event (with unit costs, all are whole numbers). At each
  // time, every free rank runs one op or is blocked; blocked ones wait for the next event.
  for (;;) {
    double now = std::numeric_limits<double>::infinity();
    for (int q = 0; q < P; ++q)
      if (!finished(q)) now = std::min(now, t[size_t(q)]);
    if (!std::isfinite(now)) break;
    std::vector<int> blocked;
    for (int r = 0; r < P; ++r) {
      const size_t R = size_t(r);
      if (finished(r) || t[R] != now) continue;
      const bool has_w = pend_head[R] < pending[R].size();
      if (pos[R] < main[R].size()) {
        const PipeOp o = main[R][pos[R]];
        const double d = deps_end(r, o);
        const bool mem_ok = o.kind != PipeOpKind::Forward || live[R] + 1 <= cap;
        if (d >= 0 && d <= now && mem_ok) {
          out[R].push_back(o);
          ++pos[R];
          const int g = pipe_stage(P, r, o.chunk);
          if (o.kind == PipeOpKind::Forward) {
            ++live[R];
            f_end[at(o.micro, g)] = now + 1;
          } else {
            i_end[at(o.micro, g)] = now + 1;
            pending[R].push_back(op(PipeOpKind::BackwardWeight, o.micro, o.chunk));
          }
          t[R] = now + 1;
          continue;
        }
        if (!has_w) {
          SW_CHECK(mem_ok, "zero-bubble order: rank " + num(r) + " over its in-flight cap");
          blocked.push_back(r);
          continue;
        }
      }
      out[R].push_back(pending[R][pend_head[R]++]);
      --live[R];
      t[R] = now + 1;
    }
    // Every op that has run ended at some rank's current time (ranks run in time order).
    double next = std::numeric_limits<double>::infinity();
    for (int q = 0; q < P; ++q)
      if (t[size_t(q)] > now) next = std::min(next, t[size_t(q)]);
    for (int r : blocked) {
      SW_CHECK(std::isfinite(next), "zero-bubble order: rank " + num(r) + " cannot run " +
                                        pipe_op_str(main[size_t(r)][pos[size_t(r)]]) +
                                        " (the F/I orders deadlock)");
      t[size_t(r)] = next;
    }
  }
  return out;
}

}  // namespace

PipeSchedule pipe_schedule_from_name(const std::string& s) {
  for (int k = 0; k < 4; ++k)
    if (s == kNames[k]) return PipeSchedule(k);
  fail("config", "parallelism.pipeline_parallel_schedule: unknown schedule '" + s +
                     "' (choose GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble)");
}

const char* pipe_schedule_name(PipeSchedule s) { return kNames[int(s)]; }

bool pipe_schedule_interleaved(PipeSchedule s) {
  return s == PipeSchedule::Interleaved1F1B || s == PipeSchedule::InterleavedZeroBubble;
}

bool pipe_schedule_splits_backward(PipeSchedule s) {
  return s == PipeSchedule::InterleavedZeroBubble;
}

const char* pipe_op_kind_name(PipeOpKind k) {
  switch (k) {
    case PipeOpKind::Forward: return "F";
    case PipeOpKind::Backward: return "B";
    case PipeOpKind::BackwardInput: return "I";
    case PipeOpKind::BackwardWeight: return "W";
  }
  return "?";
}

std::string pipe_op_str(const PipeOp& o) {
  return std::string(pipe_op_kind_name(o.kind)) + "(m" + num(o.micro) + ",c" + num(o.chunk) + ")";
}

std::vector<PipeOp> pipe_order(PipeSchedule s, int P, int V, int M, int rank) {
  check_args(s, P, V, M, rank);
  switch (s) {
    case PipeSchedule::GPipe: return gpipe(M);
    case PipeSchedule::OneFOneB: return one_f_one_b(P, M, rank);
    case PipeSchedule::Interleaved1F1B:
      return V == 1 ? one_f_one_b(P, M, rank) : interleaved(P, V, M, rank);
    case PipeSchedule::InterleavedZeroBubble: return zero_bubble(P, V, M)[size_t(rank)];
  }
  return {};
}

namespace {

// Peak over the order of the number of (micro, chunk) opened by `open` and not yet closed by
// one of `close`.
int peak_between(const std::vector<PipeOp>& order, PipeOpKind open, PipeOpKind close_a,
                 PipeOpKind close_b) {
  int cur = 0, peak = 0;
  for (const PipeOp& o : order) {
    if (o.kind == open) peak = std::max(peak, ++cur);
    else if (o.kind == close_a || o.kind == close_b) --cur;
  }
  return peak;
}

}  // namespace

int pipe_peak_in_flight(const std::vector<PipeOp>& order) {
  return peak_between(order, PipeOpKind::Forward, PipeOpKind::Backward, PipeOpKind::BackwardInput);
}

int pipe_peak_weight_pending(const std::vector<PipeOp>& order) {
  return peak_between(order, PipeOpKind::BackwardInput, PipeOpKind::BackwardWeight,
                      PipeOpKind::BackwardWeight);
}

PipeSim simulate_pipe(const std::vector<std::vector<PipeOp>>& orders, int P, int V,
                      const PipeCosts& c) {
  if (P < 1) fail("pipeline", "simulate: P must be >= 1, got " + num(P));
  if (V < 1) fail("pipeline", "simulate: V must be >= 1, got " + num(V));
  if (int(orders.size()) != P)
    fail("pipeline", "simulate: " + num(int(orders.size())) + " orders for P=" + num(P) + " ranks");
  for (double x : {c.f, c.b, c.i, c.w, c.comm})
    if (!(x >= 0)) fail("pipeline", "simulate: costs must be >= 0, got " + std::to_string(x));
  PipeSim sim;
  sim.busy.assign(size_t(P), 0);
  sim.spans.resize(size_t(P));
  auto bad = [&](const std::string& why) {
    sim.ok = false;
    sim.problem = why;
    return sim;
  };
  // Well-formed: every rank holds, for every (micro, chunk), one F and one B, or one I and one W.
  int M = 0;
  for (int r = 0; r < P; ++r)
    for (const PipeOp& o : orders[size_t(r)]) {
      if (o.micro < 0 || o.chunk < 0 || o.chunk >= V)
        return bad("rank " + num(r) + ": " + pipe_op_str(o) + " has micro < 0 or chunk outside 0.." +
                   num(V - 1));
      M = std::max(M, o.micro + 1);
    }
  const int S = P * V;
  for (int r = 0; r < P; ++r) {
    std::vector<int> count(size_t(M * V * 4), 0);
    for (const PipeOp& o : orders[size_t(r)]) ++count[size_t((o.micro * V + o.chunk) * 4 + int(o.kind))];
    for (int m = 0; m < M; ++m)
      for (int ch = 0; ch < V; ++ch) {
        const int* n = &count[size_t((m * V + ch) * 4)];
        const bool whole = n[0] == 1 && ((n[1] == 1 && n[2] == 0 && n[3] == 0) ||
                                         (n[1] == 0 && n[2] == 1 && n[3] == 1));
        if (!whole)
          return bad("rank " + num(r) + ": micro " + num(m) + " chunk " + num(ch) + " has " +
                     num(n[0]) + " F, " + num(n[1]) + " B, " + num(n[2]) + " I, " + num(n[3]) +
                     " W (want one F and one B, or one F, one I and one W)");
      }
  }
  // End times per (micro, global stage) of F and of B or I; < 0: not run yet.
  std::vector<double> f_end(size_t(M * S), -1), bi_end(size_t(M * S), -1);
  auto at = [&](int m, int g) { return size_t(m * S + g); };
  std::vector<size_t> pos(size_t(P), 0);
  std::vector<double> free_at(size_t(P), 0);
  // The first dependency not run yet, for the deadlock message ("F(m0, stage 2) on rank 0"),
  // and its rank.
  std::string waits_for;
  int waits_on = -1;
  // When op o of rank r may start (>= 0), or -1 with waits_for / waits_on set.
  auto ready_at = [&](int r, const PipeOp& o) -> double {
    const int g = pipe_stage(P, r, o.chunk);
    double t = free_at[size_t(r)];
    auto dep = [&](const std::vector<double>& end, const char* what, int dg) {
      const double e = end[at(o.micro, dg)];
      if (e < 0) {
        waits_on = dg % P;
        waits_for = std::string(what) + "(m" + num(o.micro) + ", stage " + num(dg) + ") on rank " +
                    num(waits_on);
        return false;
      }
      t = std::max(t, e + (dg % P != r ? c.comm : 0.0));
      return true;
    };
    bool ok = true;
    switch (o.kind) {
      case PipeOpKind::Forward:
        if (g > 0) ok = dep(f_end, "F", g - 1);
        break;
      case PipeOpKind::Backward:
      case PipeOpKind::BackwardInput:
        ok = dep(f_end, "F", g);
        if (ok && g < S - 1) ok = dep(bi_end, "B/I", g + 1);
        break;
      case PipeOpKind::BackwardWeight:
        ok = dep(bi_end, "I", g);
        break;
    }
    return ok ? t : -1;
  };
  auto cost = [&](PipeOpKind k) {
    switch (k) {
      case PipeOpKind::Forward: return c.f;
      case PipeOpKind::Backward: return c.b;
      case PipeOpKind::BackwardInput: return c.i;
      case PipeOpKind::BackwardWeight: return c.w;
    }
    return 0.0;
  };
  // Run each rank as far as its dependencies allow, until nothing moves. Start times do not
  // depend on the order ranks are visited in: each op starts at max(its rank free, its deps).
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < P; ++r) {
      const std::vector<PipeOp>& ord = orders[size_t(r)];
      while (pos[size_t(r)] < ord.size()) {
        const PipeOp& o = ord[pos[size_t(r)]];
        const double start = ready_at(r, o);
        if (start < 0) break;
        const double end = start + cost(o.kind);
        const int g = pipe_stage(P, r, o.chunk);
        if (o.kind == PipeOpKind::Forward) f_end[at(o.micro, g)] = end;
        if (o.kind == PipeOpKind::Backward || o.kind == PipeOpKind::BackwardInput)
          bi_end[at(o.micro, g)] = end;
        sim.spans[size_t(r)].push_back({start, end});
        sim.busy[size_t(r)] += end - start;
        free_at[size_t(r)] = end;
        sim.makespan = std::max(sim.makespan, end);
        ++pos[size_t(r)];
        moved = true;
      }
    }
  }
  // A deadlock: follow "waits for" from the first stuck rank until a rank repeats, and name
  // that one (on the cycle), its op, what it waits for, and where that rank is stuck.
  int first = -1;
  for (int r = 0; r < P && first < 0; ++r)
    if (pos[size_t(r)] < orders[size_t(r)].size()) first = r;
  if (first >= 0) {
    std::vector<bool> seen(size_t(P), false);
    int r = first, q = first;
    for (;;) {
      seen[size_t(r)] = true;
      ready_at(r, orders[size_t(r)][pos[size_t(r)]]);
      q = waits_on;
      SW_CHECK(pos[size_t(q)] < orders[size_t(q)].size(), "simulate_pipe: a finished rank is waited for");
      if (seen[size_t(q)]) break;
      r = q;
    }
    // r waits for q, which has been seen: report q (on the cycle).
    r = q;
    const PipeOp& o = orders[size_t(r)][pos[size_t(r)]];
    ready_at(r, o);
    q = waits_on;
    return bad("deadlock: rank " + num(r) + " op " + num(int(pos[size_t(r)])) + " " +
               pipe_op_str(o) + " waits for " + waits_for + ", which is stuck at op " +
               num(int(pos[size_t(q)])) + " " + pipe_op_str(orders[size_t(q)][pos[size_t(q)]]));
  }
  double total = 0;
  for (double b : sim.busy) total += b;
  sim.bubble = sim.makespan > 0 ? 1 - total / (P * sim.makespan) : 0;
  return sim;
}

std::vector<int> balance_stages(const std::vector<double>& cost, int stages) {
  const int n = int(cost.size());
  if (stages < 1) fail("pipeline", "balance_stages: stages must be >= 1, got " + num(stages));
  if (n < stages)
    fail("pipeline", "balance_stages: " + num(n) + " units cannot fill " + num(stages) +
                         " stages (each stage needs at least one)");
  for (int k = 0; k < n; ++k)
    if (!(cost[size_t(k)] >= 0))
      fail("pipeline", "balance_stages: cost of unit " + num(k) + " must be >= 0, got " +
                           std::to_string(cost[size_t(k)]));
  std::vector<double> pre(size_t(n) + 1, 0);
  for (int k = 0; k < n; ++k) pre[size_t(k) + 1] = pre[size_t(k)] + cost[size_t(k)];
  auto sum = [&](int a, int b) { return pre[size_t(b)] - pre[size_t(a)]; };
  // best[j][e]: the smallest largest stage sum of positions 0..e-1 in j stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(n) + 1, inf));
  best[0][0] = 0;
  for (int j = 1; j <= stages; ++j)
    for (int e = j; e <= n - (stages - j); ++e)
      for (int s = j - 1; s < e; ++s)
        best[size_t(j)][size_t(e)] =
            std::min(best[size_t(j)][size_t(e)], std::max(best[size_t(j) - 1][size_t(s)], sum(s, e)));
  const double opt = best[size_t(stages)][size_t(n)];
  // Of the partitions reaching opt, stages as long as they can be, front first (this always
  // reaches n: its j-th boundary is never before any optimal partition's).
  std::vector<int> b{0};
  for (int j = 1; j < stages; ++j) {
    int e = b.back() + 1;
    while (e + 1 <= n - (stages - j) && sum(b.back(), e + 1) <= opt) ++e;
    b.push_back(e);
  }
  b.push_back(n);
  SW_CHECK(sum(b[size_t(stages) - 1], n) <= opt, "balance_stages: the last stage exceeds the optimum");
  return b;
}

}  // namespace sw

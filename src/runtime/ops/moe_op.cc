// Moe: top-k routing and the chosen experts only.
//
// Decode (one token) reads the gate and top_k experts, never the others: at
// batch 1 that is top_k/n_experts of the expert bytes the article's dense
// one-hot-mask formulation reads. For several tokens, entries (token, choice)
// are grouped per expert so each expert runs one matrix product over all its
// tokens and its weights are streamed once per step.
//
// Result rows are combined per token in choice order (j = 0..top_k-1), so a
// token's output does not depend on which other tokens share the step.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "runtime/ops/fast_ops.h"
#include "runtime/ops/prepared_rows.h"
#include "util/checked.h"

namespace k3::runtime {
namespace {

// Most threads the token split (run_by_tokens) serves;
// larger pools take the column split.
constexpr int kMaxBins = 64;

struct MoeLayout {
  // Offsets into the workspace, each 64-byte aligned.
  uint64_t logits, sel, wts, count, offs, slot_of, order, xg, hbuf, gbuf, ybuf, prep, prep_h, bin_offs, bin_of, split,
      sh_h, sh_g, sh_y, sh_logit, total;
};

// dt: the routed experts' weight dtype. s: the shared expert's hidden width
// (0: none). Its buffers come last so the routing table's offsets do not
// depend on it.
MoeLayout moe_layout(int64_t t, int64_t e, int64_t k, int64_t d, int64_t f, bool swiglu, ir::DType dt, int64_t s = 0) {
  MoeLayout l{};
  uint64_t off = 0;
  auto take = [&](uint64_t bytes) {
    uint64_t at = off;
    off = align_up(off + bytes, 64);
    return at;
  };
  const uint64_t tk = static_cast<uint64_t>(t * k);
  l.logits = take(static_cast<uint64_t>(t * e) * 4);                   // [T, E] gate logits
  l.sel = take(tk * 4);                                                // [T, K] chosen expert ids
  l.wts = take(tk * 4);                                                // [T, K] routing weights
  l.count = take(static_cast<uint64_t>(e) * 4);                        // [E] entries per expert
  l.offs = take(static_cast<uint64_t>(e + 1) * 4);                     // [E+1] first entry per expert
  l.slot_of = take(tk * 4);                                            // [T*K] entry -> row in grouped order
  l.order = take(tk * 4);                                              // [T*K] grouped row -> token
  l.xg = take(tk * static_cast<uint64_t>(d) * 4);                      // [T*K, D] inputs grouped by expert
  l.hbuf = take(tk * static_cast<uint64_t>(f) * 4);                    // [T*K, F] hidden
  l.gbuf = swiglu ? take(tk * static_cast<uint64_t>(f) * 4) : l.hbuf;  // [T*K, F] gate branch
  l.ybuf = take(tk * static_cast<uint64_t>(d) * 4);                    // [T*K, D] expert outputs
  // [T*K] rows of xg and of hbuf, rounded for int8 / bf16 dot kernels
  // (prepared_rows.h); 0 bytes for other dtypes. Apart: with the tokens
  // split across threads (run_by_tokens), one thread rounds hidden rows
  // while another still multiplies its rounded inputs.
  l.prep = take(prepared_bytes_bound(dt, t * k, d));
  l.prep_h = take(prepared_bytes_bound(dt, t * k, f));
  // [kMaxBins, 2, E+1] each thread's entries per expert and first entries (run_by_tokens)
  l.bin_offs = take(static_cast<uint64_t>(kMaxBins) * 2 * static_cast<uint64_t>(e + 1) * 4);
  l.bin_of = take(static_cast<uint64_t>(e) * 4);  // [E] each expert's thread (run_by_experts)
  l.split = take(4);                              // the MoeSplit the last call took (moe_split_taken)
  if (s > 0) {
    const uint64_t rows = static_cast<uint64_t>(t);
    l.sh_h = take(rows * static_cast<uint64_t>(s) * 4);  // [T, S] shared hidden
    l.sh_g = take(rows * static_cast<uint64_t>(s) * 4);  // [T, S] shared gate branch
    l.sh_y = take(rows * static_cast<uint64_t>(d) * 4);  // [T, D] shared output
    l.sh_logit = take(rows * 4);                         // [T] shared gate logit
  }
  l.total = off;
  return l;
}

template <typename T>
T* at(void* ws, uint64_t off) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(ws) + off);
}

// The expert activation in place on columns [b, e) of hidden rows [r0, r1)
// (f wide): h = silu(g) * h for SwiGLU experts, else h = gelu(h).
void activate_rows(const OpCall& c, bool swiglu, float* hbuf, const float* gbuf, int64_t f, int64_t r0, int64_t r1,
                   int64_t b, int64_t e) {
  for (int64_t r = r0; r < r1; ++r) {
    float* h = hbuf + r * f + b;
    if (swiglu)
      c.kt->silu_mul(gbuf + r * f + b, h, e - b, h);
    else
      c.kt->gelu(h, e - b, h);
  }
}

// Grouped rows [b, e) of xg (d wide): row r is token order[r]'s row of x.
void gather_rows(float* xg, const float* x, const int32_t* order, int64_t d, int64_t b, int64_t e) {
  for (int64_t r = b; r < e; ++r)
    std::memcpy(xg + r * d, x + static_cast<int64_t>(order[r]) * d, static_cast<size_t>(d) * 4);
}

// The article's formulation: every expert computes every token; a token's
// output adds each expert's result times its routing weight, 0 for experts
// not chosen (the one-hot mask). Same routing, same result up to summation
// order, but all n_experts experts' weights are read every step.
void run_dense(const OpCall& c, const float* x, int64_t rows, int64_t d, int64_t f, int64_t n_exp, int64_t k,
               int64_t per, bool swiglu, const int32_t* sel, const float* wts, float* hbuf, float* gbuf, float* ybuf) {
  float* out = c.out[0].f32();
  std::memset(out, 0, static_cast<size_t>(rows * d) * 4);
  for (int64_t ex = 0; ex < n_exp; ++ex) {
    const TensorArg* w = c.in + 2 + ex * per;
    c.pool->parallel_for(f, 16, [&](int64_t b, int64_t e) {
      gemm_weight(c.kt, rows, b, e, d, x, d, w[0], hbuf, f);
      if (swiglu) gemm_weight(c.kt, rows, b, e, d, x, d, w[1], gbuf, f);
      activate_rows(c, swiglu, hbuf, gbuf, f, 0, rows, b, e);
    });
    c.pool->parallel_for(d, 16,
                         [&](int64_t b, int64_t e) { gemm_weight(c.kt, rows, b, e, f, hbuf, f, w[per - 1], ybuf, d); });
    for (int64_t t = 0; t < rows; ++t) {
      float mask_weight = 0.0f;
      for (int64_t j = 0; j < k; ++j)
        if (sel[t * k + j] == ex) mask_weight = wts[t * k + j];
      c.kt->axpy(mask_weight, ybuf + t * d, d, out + t * d);
    }
  }
}

// The shared expert (inputs after the routed experts) over all rows, added
// to out with weight sigmoid(x . g) per row.
void run_shared(const OpCall& c, const MoeLayout& l, const float* x, int64_t rows, int64_t d, const TensorArg* w,
                float* out) {
  const int64_t s = w[0].dim(0);
  float* h = at<float>(c.workspace, l.sh_h);
  float* g = at<float>(c.workspace, l.sh_g);
  float* y = at<float>(c.workspace, l.sh_y);
  float* logit = at<float>(c.workspace, l.sh_logit);
  c.pool->parallel_for(s, 16, [&](int64_t b, int64_t e) {
    gemm_weight(c.kt, rows, b, e, d, x, d, w[0], h, s);
    gemm_weight(c.kt, rows, b, e, d, x, d, w[1], g, s);
    for (int64_t r = 0; r < rows; ++r) c.kt->silu_mul(g + r * s + b, h + r * s + b, e - b, h + r * s + b);
  });
  c.pool->parallel_for(d, 16, [&](int64_t b, int64_t e) { gemm_weight(c.kt, rows, b, e, s, h, s, w[2], y, d); });
  gemm_weight(c.kt, rows, 0, 1, d, x, d, w[3], logit, 1);
  for (int64_t r = 0; r < rows; ++r) c.kt->axpy(1.0f / (1.0f + std::exp(-logit[r])), y + r * d, d, out + r * d);
}

// Prefill with the tokens or the experts split across the threads
// (run_by_tokens, run_by_experts) needs at least this many routed rows per
// expert on each thread, on average. With fewer, the token split would have
// every thread stream every expert's weights for a few rows, and the expert
// split would leave threads idle; the column split streams each expert once
// over all threads. Chosen, not tuned: two of the int8 tile's 4 rows; a
// 128-token k3-base prefill on 2 threads has 16.
constexpr int64_t kPrefillSplitMinRowsPerExpert = 8;

// The expert split's balance (assign_experts): an expert costs its rows
// plus kExpertStreamRows for streaming its weights, and the split is taken
// only while the busiest thread's cost is at most kMaxExpertImbalance times
// the mean. Chosen, not tuned (they were the split's first version's, under
// which every layer of a 128-token k3-base prefill took it on 2 threads).
constexpr int64_t kExpertStreamRows = 4;
constexpr double kMaxExpertImbalance = 1.1;

struct ExpertPass {
  int64_t n_exp, k, per, d, f;
  bool swiglu, renormalize;
  ir::DType dt;
};

// 1-2 for tokens [b, e): gate logits [E], top-k (ties to the lower index)
// and the softmax over the chosen (or over every expert, the chosen keeping
// their share, without renormalize).
void route_rows(const OpCall& c, const MoeLayout& l, const ExpertPass& p, const float* x, int64_t b, int64_t e) {
  const int64_t n_exp = p.n_exp, k = p.k;
  float* logits = at<float>(c.workspace, l.logits);
  int32_t* sel = at<int32_t>(c.workspace, l.sel);
  float* wts = at<float>(c.workspace, l.wts);
  c.kt->gemm_nt(e - b, 0, n_exp, p.d, x + b * p.d, p.d, c.in[1].f32(), p.d, logits + b * n_exp, n_exp);
  for (int64_t t = b; t < e; ++t) {
    const float* lg = logits + t * n_exp;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t ex = 0; ex < n_exp; ++ex) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= sel[t * k + i] == ex;
        if (!taken && (best < 0 || lg[ex] > lg[best])) best = ex;
      }
      sel[t * k + j] = static_cast<int32_t>(best);
    }
    const float mx = lg[sel[t * k]];
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += (wts[t * k + j] = std::exp(lg[sel[t * k + j]] - mx));
    if (!p.renormalize) {
      sum = 0.0f;
      for (int64_t ex = 0; ex < n_exp; ++ex) sum += std::exp(lg[ex] - mx);
    }
    for (int64_t j = 0; j < k; ++j) wts[t * k + j] /= sum;
  }
}

// offs[0..n_exp]: where each expert's entries start when entries [i0, i1)
// (of sel) are grouped by expert from slot i0 on.
void expert_offsets(const int32_t* sel, int64_t i0, int64_t i1, int64_t n_exp, int32_t* offs) {
  for (int64_t ex = 0; ex <= n_exp; ++ex) offs[ex] = 0;
  for (int64_t i = i0; i < i1; ++i) ++offs[sel[i] + 1];
  offs[0] = static_cast<int32_t>(i0);
  for (int64_t ex = 0; ex < n_exp; ++ex) offs[ex + 1] += offs[ex];
}

// 3. The entries of tokens [b, e) grouped by expert (a counting sort into
// slots b * k .. e * k): expert ex's are slots offs[ex] .. offs[ex + 1],
// order maps a slot to its token and slot_of an entry to its slot. cursor:
// n_exp scratch values.
void group_entries(const OpCall& c, const MoeLayout& l, const ExpertPass& p, int64_t b, int64_t e, int32_t* cursor,
                   int32_t* offs) {
  const int64_t k = p.k;
  const int32_t* sel = at<int32_t>(c.workspace, l.sel);
  int32_t* slot_of = at<int32_t>(c.workspace, l.slot_of);
  int32_t* order = at<int32_t>(c.workspace, l.order);
  expert_offsets(sel, b * k, e * k, p.n_exp, offs);
  for (int64_t ex = 0; ex < p.n_exp; ++ex) cursor[ex] = offs[ex];
  for (int64_t t = b; t < e; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = cursor[sel[t * k + j]]++;
      slot_of[t * k + j] = r;
      order[r] = static_cast<int32_t>(t);
    }
}

// Expert ex over its grouped entries [r0, r1), whole, on this thread:
// gather, round, up (and gate), activation, round, down into ybuf.
void run_expert(const OpCall& c, const MoeLayout& l, const ExpertPass& p, const float* x, int64_t ex, int64_t r0,
                int64_t r1) {
  if (r1 <= r0) return;
  const int32_t* order = at<int32_t>(c.workspace, l.order);
  float* xg = at<float>(c.workspace, l.xg);
  float* hbuf = at<float>(c.workspace, l.hbuf);
  float* gbuf = at<float>(c.workspace, l.gbuf);
  float* ybuf = at<float>(c.workspace, l.ybuf);
  const kernels::PreparedGemm* pg = prepared_gemm(c.kt, p.dt);
  const int64_t d = p.d, f = p.f, cnt = r1 - r0;
  const TensorArg* w = c.in + 2 + ex * p.per;
  gather_rows(xg, x, order, d, r0, r1);
  const ActRows xa = prepare_rows_here(pg, r0, r1, d, xg, d, at<uint8_t>(c.workspace, l.prep));
  gemm_weight(c.kt, cnt, 0, f, d, xa, w[0], hbuf + r0 * f, f, 0,
              p.swiglu ? next_rows(w[1], d, 0, f) : kernels::ReadNext{});
  if (p.swiglu) gemm_weight(c.kt, cnt, 0, f, d, xa, w[1], gbuf + r0 * f, f, 0, next_rows(w[p.per - 1], f, 0, d));
  activate_rows(c, p.swiglu, hbuf, gbuf, f, r0, r1, 0, f);
  const ActRows ha = prepare_rows_here(pg, r0, r1, f, hbuf, f, at<uint8_t>(c.workspace, l.prep_h));
  gemm_weight(c.kt, cnt, 0, d, f, ha, w[p.per - 1], ybuf + r0 * d, d, 0);
}

// The shared expert's inputs (if any), and its hidden width (0: none).
const TensorArg* shared_inputs(const OpCall& c) {
  return c.in + ir::moe_shared_input(*c.node);
}
int64_t shared_ff(const OpCall& c) {
  return c.node->attr_int("shared", 0) != 0 ? shared_inputs(c)[0].dim(0) : 0;
}

// Columns [b, e) of token t's output: its experts' rows weighted in choice
// order, then the residual unless a shared expert still has to be added
// (finish_output does it then). Elementwise, so an element's sum does not
// depend on the column range.
void combine(const OpCall& c, const MoeLayout& l, int64_t t, int64_t d, int64_t k, int64_t b, int64_t e,
             const float* residual) {
  const float* wts = at<float>(c.workspace, l.wts);
  const int32_t* slot_of = at<int32_t>(c.workspace, l.slot_of);
  const float* ybuf = at<float>(c.workspace, l.ybuf);
  float* o = c.out[0].f32() + t * d + b;
  std::memset(o, 0, static_cast<size_t>(e - b) * 4);
  for (int64_t j = 0; j < k; ++j)
    c.kt->axpy(wts[t * k + j], ybuf + static_cast<int64_t>(slot_of[t * k + j]) * d + b, e - b, o);
  if (residual != nullptr && l.sh_h == 0) c.kt->add(o, residual + t * d + b, e - b, o);
}

// Prefill with the tokens split across the threads: each thread routes its
// even share of the rows (the share the norm before it wrote, split as
// ThreadPool::parallel_for_even splits), groups its entries per expert,
// runs every expert its tokens chose over them (run_expert) and combines
// its tokens' outputs: one region, and no activation crosses to the other
// core; each thread streams the weights of every expert its tokens chose.
// The expert split (run_by_experts, which f32 experts and bf16 panels take) gives each
// thread whole experts (no weight read twice) but hands every token's input
// and result rows between the cores; where the two vCPUs sat on different
// L3s (the Zen 4 host, some minutes: a 300-400 ns round trip between them
// against 50-65) two-thread int8 prefill of k3-base took 82-85 ms a step
// that way against 79-80 ms with the token split;
// where they share one, reading each expert once was about 2% faster
// (medians 68.6 against 70.2 ms; docs/performance.md, "The MoE splits
// tokens, not experts"). Each token's result is the
// same bits as on one thread (a product's element does not depend on M).
void run_by_tokens(const OpCall& c, const MoeLayout& l, const ExpertPass& p, const float* x, int64_t rows,
                   const float* residual) {
  const int64_t bins = c.pool->size();
  c.pool->run_chunks(bins, [&](int64_t bin, int64_t n_bins) {
    int64_t b, e;
    ThreadPool::split_range(rows, 1, bin, n_bins, b, e);
    if (b >= e) return;
    int32_t* cursor = at<int32_t>(c.workspace, l.bin_offs) + bin * 2 * (p.n_exp + 1);
    int32_t* offs = cursor + p.n_exp + 1;
    route_rows(c, l, p, x, b, e);
    group_entries(c, l, p, b, e, cursor, offs);
    for (int64_t ex = 0; ex < p.n_exp; ++ex) run_expert(c, l, p, x, ex, offs[ex], offs[ex + 1]);
    for (int64_t t = b; t < e; ++t) combine(c, l, t, p.d, p.k, 0, p.d, residual);
  });
  // All threads' entries per expert, for moe_active_experts.
  expert_offsets(at<int32_t>(c.workspace, l.sel), 0, rows * p.k, p.n_exp, at<int32_t>(c.workspace, l.offs));
}

// Whole experts split across the threads: prefill with f32 experts and bf16
// panels (moe_prefill_split), and decode where they balance (run_Moe). After the
// routing and grouping of every row, each thread runs the experts
// assign_experts gave it (run_expert: gather, multiply, activate,
// multiply), then the tokens' outputs are combined: in a second region,
// split as the norm before split the rows, or for a decode step's few
// rows on the calling thread. Each expert's
// weights are streamed once a step, where the token split streams them
// once per thread; what it costs is the input and result rows that cross
// between the cores. The same bits as one thread (a product's element does
// not depend on M). Returns whether it ran (false: assign_experts found no
// balanced assignment; the caller takes the token split).
bool run_by_experts(const OpCall& c, const MoeLayout& l, const ExpertPass& p, const float* x, int64_t rows,
                    const float* residual) {
  const int64_t bins = c.pool->size();
  const int32_t* offs = at<int32_t>(c.workspace, l.offs);
  int32_t* bin_of = at<int32_t>(c.workspace, l.bin_of);
  if (!assign_experts(offs, p.n_exp, bins, bin_of)) return false;
  c.pool->run_chunks(bins, [&](int64_t bin, int64_t) {
    for (int64_t ex = 0; ex < p.n_exp; ++ex)
      if (bin_of[ex] == bin) run_expert(c, l, p, x, ex, offs[ex], offs[ex + 1]);
  });
  auto combine_rows = [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) combine(c, l, t, p.d, p.k, 0, p.d, residual);
  };
  if (rows * p.d < kParallelValues)
    combine_rows(0, rows);
  else
    c.pool->parallel_for_even(rows, 1, combine_rows);
  return true;
}

// 1-2 for every row: split across the threads as the norm before split
// them (a token's logits do not depend on the rows beside it: gemm_nt's
// contract) when there are enough values; decode's few on this thread.
void route_all(const OpCall& c, const MoeLayout& l, const ExpertPass& p, const float* x, int64_t rows) {
  if (rows * p.d < kParallelValues)
    route_rows(c, l, p, x, 0, rows);
  else
    c.pool->parallel_for_even(rows, 1, [&](int64_t b, int64_t e) { route_rows(c, l, p, x, b, e); });
}

// After the routed experts: the shared expert, if any, then the residual
// (fuse-residual-add), if any and not added by combine.
void finish_output(const OpCall& c, const MoeLayout& l, const float* x, int64_t rows, int64_t d,
                   const float* residual) {
  if (l.sh_h == 0) return;
  float* out = c.out[0].f32();
  run_shared(c, l, x, rows, d, shared_inputs(c), out);
  if (residual != nullptr) c.kt->add(out, residual, rows * d, out);
}

// The layout of this call's workspace (the node's shapes and attributes).
MoeLayout layout_of(const OpCall& c) {
  return moe_layout(c.in[0].dim(0), c.node->attr_int("n_experts"), c.node->attr_int("top_k"), c.in[0].cols(),
                    c.in[2].dim(0), c.node->attr_int("swiglu") != 0, c.in[2].value->dtype, shared_ff(c));
}

}  // namespace

MoeSplit moe_prefill_split(int64_t rows, int64_t top_k, int64_t n_experts, int64_t threads, ir::DType expert_dtype) {
  if (threads < 2 || threads > kMaxBins || rows * top_k < kPrefillSplitMinRowsPerExpert * n_experts * threads)
    return MoeSplit::kColumns;
  // The token split streams every expert once per thread. For f32 weights
  // those extra bytes outweigh the rows the expert split hands between the
  // cores: two-thread fp32 prefill of k3-base (panels, a disturbed AVX2 Zen
  // 3), 12 pairs in turn, step medians 211.6 ms against 224.4 (MoE op
  // 168.9 against 182.8); the final build against the one before, 10
  // pairs, 251.9 against 263.1. For bf16 the same within noise (step
  // medians 303.4 / 299.1 ms, 10 pairs); for int8 the token split's steps
  // were faster (204.1 / 224.4), as it was far apart on the Zen 4 host
  // (docs/performance.md, "Whole experts per thread for f32 weights").
  // In the panel layouts the same held for f32 and bf16 (measured on
  // bf16dot_p16, `--precision bf16`; bf16p16 runs the same panel kernel on
  // f32 activations) on the 480 MiB-L3 Intel host once
  // the panel tile stopped being front-end bound: two-thread k3-base
  // prefill, 4 pairs in turn, fp32 panels 138-151 ms a step against
  // 162-174 (MoE 109-117 against 133-141), bf16 panels 123-126 against
  // 127-136 (docs/performance.md). Each thread's rows of an expert then
  // fill the 12-row tiles, where the token split left 16 a thread (two
  // 8-row tiles reading every panel twice). bf16dot rows were the same
  // either way there (197-206 ms both).
  const bool experts = expert_dtype == ir::DType::kF32 || expert_dtype == ir::DType::kF32P16 ||
                       expert_dtype == ir::DType::kBF16P16 || expert_dtype == ir::DType::kBF16DotP16;
  return experts ? MoeSplit::kExperts : MoeSplit::kTokens;
}

bool assign_experts(const int32_t* offs, int64_t n_experts, int64_t threads, int32_t* bin_of) {
  if (threads < 1 || threads > kMaxBins) return false;
  int64_t load[kMaxBins] = {};
  int64_t total = 0, active = 0;
  for (int64_t e = 0; e < n_experts; ++e) bin_of[e] = -1;
  // Largest first: the unplaced expert with the most rows each time
  // (n_experts is small; no sort buffer), onto the least loaded thread.
  for (;;) {
    int64_t best = -1, best_cost = 0;
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t cnt = offs[e + 1] - offs[e], cost = cnt + kExpertStreamRows;
      if (cnt > 0 && bin_of[e] < 0 && cost > best_cost) best = e, best_cost = cost;
    }
    if (best < 0) break;
    int64_t b = 0;
    for (int64_t i = 1; i < threads; ++i)
      if (load[i] < load[b]) b = i;
    bin_of[best] = static_cast<int32_t>(b);
    load[b] += best_cost;
    total += best_cost;
    ++active;
  }
  const int64_t most = *std::max_element(load, load + threads);
  return active >= threads && static_cast<double>(most * threads) <= kMaxExpertImbalance * static_cast<double>(total);
}

MoeSplit moe_split_taken(const OpCall& c) {
  return static_cast<MoeSplit>(*at<int32_t>(c.workspace, layout_of(c).split));
}

uint64_t moe_workspace_bytes(int64_t max_rows, int64_t n_experts, int64_t top_k, int64_t d_model, int64_t d_ff,
                             bool swiglu, ir::DType expert_dtype, int64_t shared_ff) {
  return moe_layout(max_rows, n_experts, top_k, d_model, d_ff, swiglu, expert_dtype, shared_ff).total;
}

int64_t moe_active_experts(const OpCall& c) {
  const int64_t n_exp = c.node->attr_int("n_experts");
  if (c.node->attr_int("dense") != 0) return n_exp;  // every expert runs
  const int32_t* offs = at<int32_t>(c.workspace, layout_of(c).offs);
  int64_t active = 0;
  for (int64_t e = 0; e < n_exp; ++e) active += offs[e + 1] > offs[e];
  return active;
}

void run_Moe(const OpCall& c) {
  const int64_t n_exp = c.node->attr_int("n_experts"), k = c.node->attr_int("top_k");
  const bool swiglu = c.node->attr_int("swiglu") != 0;
  const int64_t per = ir::moe_matrices_per_expert(*c.node);
  const int64_t rows = c.in[0].rows, d = c.in[0].cols(), f = c.in[2].dim(0);
  const bool renormalize = c.node->attr_int("renormalize", 1) != 0;
  const ir::DType dt = c.in[2].value->dtype;  // every routed expert's matrices have it (weight-precision)
  const MoeLayout l = layout_of(c);
  const int32_t* sel = at<int32_t>(c.workspace, l.sel);
  const float* wts = at<float>(c.workspace, l.wts);
  int32_t* count = at<int32_t>(c.workspace, l.count);
  int32_t* offs = at<int32_t>(c.workspace, l.offs);
  const int32_t* order = at<int32_t>(c.workspace, l.order);
  float* xg = at<float>(c.workspace, l.xg);
  float* hbuf = at<float>(c.workspace, l.hbuf);
  float* gbuf = at<float>(c.workspace, l.gbuf);
  float* ybuf = at<float>(c.workspace, l.ybuf);
  const float* x = c.in[0].f32();
  // The residual (fuse-residual-add), if any: added to each finished output
  // row, as the Add it replaces did.
  const int res = ir::residual_input(*c.node);
  const float* residual = res >= 0 ? c.in[res].f32() : nullptr;
  const ExpertPass pass{n_exp, k, per, d, f, swiglu, renormalize, dt};
  const bool dense = c.node->attr_int("dense") != 0;
  MoeSplit split = dense ? MoeSplit::kColumns : moe_prefill_split(rows, k, n_exp, c.pool->size(), dt);
  int32_t* split_taken = at<int32_t>(c.workspace, l.split);

  if (split == MoeSplit::kExperts) {
    route_all(c, l, pass, x, rows);
    group_entries(c, l, pass, 0, rows, count, offs);
    // No balanced assignment: the token split, each thread routing its share again.
    if (!run_by_experts(c, l, pass, x, rows, residual)) split = MoeSplit::kTokens;
  }
  *split_taken = static_cast<int32_t>(split);
  if (split == MoeSplit::kTokens) run_by_tokens(c, l, pass, x, rows, residual);
  if (split != MoeSplit::kColumns) {
    finish_output(c, l, x, rows, d, residual);
    return;
  }
  // 1-2. Routing.
  route_all(c, l, pass, x, rows);

  if (dense) {
    run_dense(c, x, rows, d, f, n_exp, k, per, swiglu, sel, wts, hbuf, gbuf, ybuf);
    if (residual != nullptr && l.sh_h == 0) c.kt->add(c.out[0].f32(), residual, rows * d, c.out[0].f32());
    finish_output(c, l, x, rows, d, residual);
    return;
  }

  // 3. Group entries by expert.
  group_entries(c, l, pass, 0, rows, count, offs);
  // Decode: whole experts to the threads where assign_experts balances
  // them (a batch-1 top-2 step on 2 threads: one expert each). A thread
  // streams its experts' matrices front to back, up then down, and its
  // hidden rows never leave its core: one region where the column split
  // below takes two, whose chunks are halves of every matrix. k3-base batch-1
  // decode on 2 threads of an AVX2 Zen 3, pairs in turn: MoE medians bf16
  // 6.78 against 7.38 ms a step where the two cores share an L3, 5.29
  // against 6.65 where they do not; int8 3.73 / 3.91 and 3.75 / 4.14; fp32
  // 14.21 / 14.44 and 11.73 / 11.73. Batch 4 and 8 the same within noise
  // (docs/performance.md, "Whole experts per thread at decode"). The same
  // bits as the column split (a product's element does not depend on M or
  // on the column range).
  if (c.pool->size() >= 2 && run_by_experts(c, l, pass, x, rows, residual)) {
    *split_taken = static_cast<int32_t>(MoeSplit::kExperts);
    finish_output(c, l, x, rows, d, residual);
    return;
  }
  // The column split: gather the grouped input rows, the copies split across
  // the threads when there are enough of them.
  const int64_t entries = offs[n_exp];
  auto gather = [&](int64_t b, int64_t e) { gather_rows(xg, x, order, d, b, e); };
  if (entries * d < kParallelValues)
    gather(0, entries);
  else
    c.pool->parallel_for(entries, 1, gather);

  // 4. Up (and gate) projections + activation; chunks of F columns of every
  //    active expert, so a chunk's columns need no barrier before the
  //    activation. int8 and bf16 dot kernels round the rows first: once
  //    here for all experts and chunks.
  uint8_t* prep = at<uint8_t>(c.workspace, l.prep);
  const ActRows xa = prepare_rows(c, dt, offs[n_exp], d, xg, d, prep);
  // The expert after ex with rows routed to it (n_exp: none); each call
  // names that expert's share of the same matrix as the weights it reads
  // next (gemm_weight's ReadNext), so memory streams across experts.
  auto next_active = [&](int64_t ex) {
    for (++ex; ex < n_exp && offs[ex + 1] == offs[ex];) ++ex;
    return ex;
  };
  // The hidden rows are rounded for the down projections by the thread that
  // computed each chunk's columns, while they are in its cache, where the
  // kernel table rounds whole column groups on their own and f still gives
  // every thread two chunks of them (ThreadPool::parallel_for). Rounded by
  // the caller after the region, half of every row comes from the other
  // core: k3-base bf16 batch-8 decode took 4% longer a step where the two
  // cores share no L3 (20.9 against 20.0 ms), 1% where they share one. The
  // int8 rows' groups are 512 values, so at k3-base's d_ff of 1024 there
  // would be one chunk a thread, and that alone made the MoE 5-6% slower
  // in both placements: the caller rounds them (docs/performance.md, "What
  // the far placement costs a step"). The same bytes either way
  // (kernels.h, prepare_cols).
  const kernels::PreparedGemm* pg = prepared_gemm(c.kt, dt);
  uint8_t* prep_h = at<uint8_t>(c.workspace, l.prep_h);
  const int64_t round_align = pg != nullptr && pg->prepare_cols != nullptr ? std::lcm<int64_t>(16, pg->col_group) : 0;
  const bool round_here = round_align > 0 && (f + round_align - 1) / round_align >= 2 * c.pool->size();
  const int64_t h_stride = pg != nullptr ? pg->row_bytes(f) : 0;
  c.pool->parallel_for(f, round_here ? round_align : 16, [&](int64_t b, int64_t e) {
    for (int64_t ex = 0; ex < n_exp; ++ex) {
      const int64_t r0 = offs[ex], cnt = offs[ex + 1] - offs[ex];
      if (cnt == 0) continue;
      const TensorArg* w = c.in + 2 + ex * per;
      const int64_t nx = next_active(ex);
      const kernels::ReadNext after = nx < n_exp ? next_rows(c.in[2 + nx * per], d, b, e) : kernels::ReadNext{};
      gemm_weight(c.kt, cnt, b, e, d, xa.from(r0), w[0], hbuf + r0 * f, f, 0,
                  swiglu ? next_rows(w[1], d, b, e) : after);
      if (swiglu) gemm_weight(c.kt, cnt, b, e, d, xa.from(r0), w[1], gbuf + r0 * f, f, 0, after);
      activate_rows(c, swiglu, hbuf, gbuf, f, r0, r0 + cnt, b, e);
      if (round_here) pg->prepare_cols(cnt, f, b, e, hbuf + r0 * f, f, prep_h + r0 * h_stride);
    }
  });

  // 5. Down projections; chunks of D columns (the hidden rows rounded once,
  //    as in 4). Then, on the same chunk while it is in cache, 6: each
  //    token's weighted sum in choice order (and its residual). A chunk's
  //    columns of every expert's result are this thread's own, so no
  //    barrier comes between.
  const ActRows ha =
      round_here ? ActRows{hbuf, f, prep_h, h_stride} : prepare_rows(c, dt, offs[n_exp], f, hbuf, f, prep_h);
  c.pool->parallel_for(d, 16, [&](int64_t b, int64_t e) {
    for (int64_t ex = 0; ex < n_exp; ++ex) {
      const int64_t r0 = offs[ex], cnt = offs[ex + 1] - offs[ex];
      if (cnt == 0) continue;
      const int64_t nx = next_active(ex);
      gemm_weight(c.kt, cnt, b, e, f, ha.from(r0), c.in[2 + ex * per + per - 1], ybuf + r0 * d, d, 0,
                  nx < n_exp ? next_rows(c.in[2 + nx * per + per - 1], f, b, e) : kernels::ReadNext{});
    }
    for (int64_t t = 0; t < rows; ++t) combine(c, l, t, d, k, b, e, residual);
  });
  finish_output(c, l, x, rows, d, residual);
}

}  // namespace k3::runtime

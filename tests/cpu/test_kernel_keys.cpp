// Kernel keys (runtime/kernel_key.h): how a key is spelled as a name expression, that keys compare
// their text by content, and that the instantiation lists the kernel test compiles still spell the
// kernels as the string-building code that keys replaced did (the expected strings below were
// produced by that code). Launch sites and lists make their keys with the same functions, so the
// name a cache miss builds is the one these lists hold.
#include <gtest/gtest.h>
#include <algorithm>
#include <string>
#include <vector>
#include "ops/attention.h"
#include "ops/fused.h"
#include "ops/indexing.h"
#include "ops/launch.h"
#include "ops/loss.h"
#include "ops/nn.h"
#include "runtime/kernel_key.h"
#include "toolkit/grad_tools.h"

using namespace flame;

namespace {

using S = std::vector<std::string>;

bool has(const S& v, const std::string& name) { return std::find(v.begin(), v.end(), name) != v.end(); }

constexpr KernelTemplate kBlockFwd{"norm.cuh", "flame::norm_fwd_block", {TArg::Dtype, TArg::Int, TArg::Int, TArg::Bool}};
constexpr KernelTemplate kStrided{"elementwise.cuh", "flame::ew_strided",
                                  {TArg::Index, TArg::Text, TArg::Dtype, TArg::Dtype, TArg::Dtype}};
constexpr KernelTemplate kStridedTwin{"elementwise.cuh", "flame::ew_strided",
                                      {TArg::Index, TArg::Text, TArg::Dtype, TArg::Dtype, TArg::Dtype}};
constexpr KernelTemplate kPlain{"attention.cuh", "flame::attn::sdpa_dropout_keep", {}};

TEST(KernelKeys, SpellTheirTemplateArguments) {
  EXPECT_EQ(kernel_name(make_key(kBlockFwd, FLAME_DTYPE_F32, 0, 4, true)), "flame::norm_fwd_block<float, 0, 4, true>");
  EXPECT_EQ(kernel_name(make_key(kBlockFwd, FLAME_DTYPE_BF16, 2, 1, false)),
            "flame::norm_fwd_block<flame::bf16_t, 2, 1, false>");
  EXPECT_EQ(kernel_name(make_key(kStrided, 1, "Where", FLAME_DTYPE_F16, FLAME_DTYPE_BOOL, FLAME_DTYPE_F16)),
            "flame::ew_strided<unsigned long long, flame::Where, flame::half_t, bool, flame::half_t>");
  // An absent argument is left out (kernels whose arity varies with the operand count).
  EXPECT_EQ(kernel_name(make_key(kStrided, 0, "Neg", FLAME_DTYPE_I64, FLAME_DTYPE_I64, KernelKey::kAbsent)),
            "flame::ew_strided<unsigned int, flame::Neg, long long, long long>");
  EXPECT_EQ(kernel_name(make_key(kPlain)), "flame::attn::sdpa_dropout_keep");
}

TEST(KernelKeys, CompareTextByContentAndTemplatesByIdentity) {
  std::string a = "Add", b = "Add", c = "Sub";  // distinct buffers, as a context's kept copy and a caller's literal
  KernelKey ka = make_key(kStrided, 0, a, FLAME_DTYPE_F32, FLAME_DTYPE_F32, FLAME_DTYPE_F32);
  KernelKey kb = make_key(kStrided, 0, b, FLAME_DTYPE_F32, FLAME_DTYPE_F32, FLAME_DTYPE_F32);
  ASSERT_NE(static_cast<const void*>(a.data()), static_cast<const void*>(b.data()));
  EXPECT_TRUE(ka == kb);
  EXPECT_EQ(KernelKeyHash()(ka), KernelKeyHash()(kb));
  EXPECT_FALSE(ka == make_key(kStrided, 0, c, FLAME_DTYPE_F32, FLAME_DTYPE_F32, FLAME_DTYPE_F32));
  EXPECT_FALSE(ka == make_key(kStrided, 1, a, FLAME_DTYPE_F32, FLAME_DTYPE_F32, FLAME_DTYPE_F32));
  EXPECT_FALSE(ka == make_key(kStrided, 0, a, FLAME_DTYPE_F32, FLAME_DTYPE_F32, FLAME_DTYPE_F64));
  // The same spelling in another template constant is another key (templates are compared by address).
  KernelKey twin = make_key(kStridedTwin, 0, a, FLAME_DTYPE_F32, FLAME_DTYPE_F32, FLAME_DTYPE_F32);
  EXPECT_FALSE(ka == twin);
  EXPECT_EQ(kernel_name(ka), kernel_name(twin));
}

TEST(KernelKeys, InstantiationListsKeepTheirNames) {
  const DType f32 = FLAME_DTYPE_F32, f16 = FLAME_DTYPE_F16, bf16 = FLAME_DTYPE_BF16;
  EXPECT_EQ(elementwise_instantiations("Add", f32, {f32, f32}),
            (S{"flame::ew_contig<4, flame::Add, float, float, float>", "flame::ew_contig<1, flame::Add, float, float, float>",
               "flame::ew_strided<unsigned int, flame::Add, float, float, float>",
               "flame::ew_strided<unsigned long long, flame::Add, float, float, float>",
               "flame::ew_rows<4, flame::Add, float, float, float>"}));
  EXPECT_EQ(elementwise_instantiations("Fill", f32, {}),
            (S{"flame::ew_contig<4, flame::Fill, float>", "flame::ew_contig<1, flame::Fill, float>",
               "flame::ew_strided<unsigned int, flame::Fill, float>", "flame::ew_strided<unsigned long long, flame::Fill, float>"}));
  EXPECT_TRUE(has(elementwise_instantiations("Identity", f16, {f32}), "flame::ew_tile<flame::Identity, flame::half_t, float>"));
  EXPECT_TRUE(has(elementwise_instantiations("Where", f32, {FLAME_DTYPE_BOOL, f32, f32}),
                  "flame::ew_strided<unsigned long long, flame::Where, float, bool, float, float>"));
  EXPECT_EQ(reduce_instantiations(ReduceKind::Sum, f16, f32),
            (S{"flame::reduce_general<flame::SumOp, flame::half_t, float, float>",
               "flame::reduce_flat<flame::SumOp, flame::half_t, float, float>",
               "flame::reduce_cols<flame::SumOp, flame::half_t, float, float>",
               "flame::reduce_tall<flame::SumOp, flame::half_t, float, float>",
               "flame::reduce_tall<flame::SumOp, flame::half_t, float, float>",
               "flame::reduce_tall<flame::SumOp, float, float, float>"}));
  EXPECT_TRUE(has(arg_reduce_instantiations(f16), "flame::arg_reduce<true, flame::half_t>"));
  EXPECT_EQ(cumsum_instantiation(FLAME_DTYPE_I32, FLAME_DTYPE_I64), "flame::cumsum_kernel<int, long long, long long>");
  const S norm = ops::norm_kernel_instantiations();
  EXPECT_TRUE(has(norm, "flame::norm_fwd_block<float, 0, 4, true>"));
  EXPECT_TRUE(has(norm, "flame::norm_bwd<flame::bf16_t, 2, 2, 8, 0, true>"));  // row: 0 global, 1 registers, 2 shared
  EXPECT_TRUE(has(norm, "flame::norm_bwd<float, 0, 8, 4, 2, false>"));
  EXPECT_FALSE(has(norm, "flame::norm_bwd<float, 2, 8, 4, 2, true>"));  // group_norm rows are never staged
  EXPECT_TRUE(has(norm, "flame::norm_bwd_ring<flame::bf16_t, 1>"));       // sm_90 long rows, dx only
  EXPECT_FALSE(has(norm, "flame::norm_bwd_ring<float, 2>"));
  const S softmax = ops::softmax_kernel_instantiations();
  EXPECT_TRUE(has(softmax, "flame::softmax_fwd<flame::half_t, true, 2, 8>"));
  EXPECT_TRUE(has(softmax, "flame::softmax_bwd<float, false, 8, 4, true>"));
  EXPECT_FALSE(has(softmax, "flame::softmax_bwd<float, false, 8, 1, true>"));  // staged rows are 16-byte vectors
  const S loss = ops::loss_instantiations();
  EXPECT_TRUE(has(loss, "flame::ce_index_fwd<4, true, false, float, long long, float>"));
  EXPECT_TRUE(has(loss, "flame::ce_index_fwd_grad<8, false, true, flame::bf16_t, long long, float>"));
  EXPECT_TRUE(has(loss, "flame::ce_prob_fwd<8, false, flame::half_t, float>"));
  EXPECT_TRUE(has(loss, "flame::ce_target_weight<int, double>"));
  EXPECT_TRUE(has(ops::indexing_instantiations(), "flame::scatter_add_kernel<flame::half_t, long long, float>"));
  const S attention = ops::attention_instantiations();
  EXPECT_TRUE(has(attention, "flame::attn::sdpa_fwd<flame::bf16_t, 128, true>"));
  EXPECT_TRUE(has(attention, "flame::attn::sdpa_dropout_keep"));
  EXPECT_TRUE(has(toolkit::grad_tools_instantiations(), "flame::gt_factor"));
  EXPECT_TRUE(has(ops::fused_instantiations(bf16), "flame::fused_contig<8, flame::bf16_t>"));
}

}  // namespace

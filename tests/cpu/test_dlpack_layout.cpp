// White-box tests of the DLPack descriptor logic (src/interop/dlpack.h), which needs no GPU: the
// dtype mapping both ways, and import_layout's validation of a foreign DLTensor and the storage
// range it computes (negative and zero strides, offsets, empty tensors, overflow).
#include <gtest/gtest.h>
#include <cstdint>
#include <string>
#include "core/error.h"
#include "interop/dlpack.h"

using namespace flame;

namespace {

struct Desc {
  int64_t shape[FLAME_MAX_DIMS] = {};
  int64_t strides[FLAME_MAX_DIMS] = {};
  DLTensor t{};
  Desc(std::initializer_list<int64_t> sh, std::initializer_list<int64_t> st, uint64_t addr,
       DType d = FLAME_DTYPE_F32) {
    int i = 0;
    for (int64_t s : sh) shape[i++] = s;
    t.ndim = i;
    i = 0;
    for (int64_t s : st) strides[i++] = s;
    t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(addr));
    t.device.device_type = kDLCUDA;
    t.device.device_id = 0;
    t.dtype = dlpack::to_dl(d);
    t.shape = shape;
    t.strides = st.size() ? strides : nullptr;
  }
};

// The status and message of import_layout on d, or FLAME_OK.
flame_status_t status_of(const DLTensor& t, std::string* msg = nullptr) {
  try {
    dlpack::import_layout(t, 0, "src");
    return FLAME_OK;
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.status();
  }
}

TEST(DlpackLayout, DtypesMapBothWays) {
  for (int d = 0; d < kNumDTypes; ++d) {
    DLDataType t = dlpack::to_dl(static_cast<DType>(d));
    EXPECT_EQ(t.lanes, 1);
    EXPECT_EQ(t.bits, 8 * dtype_size(static_cast<DType>(d)));
    EXPECT_EQ(dlpack::from_dl(t), static_cast<DType>(d)) << dtype_name(static_cast<DType>(d));
  }
  EXPECT_EQ(dlpack::to_dl(FLAME_DTYPE_BOOL).code, 6) << "kDLBool";
  EXPECT_EQ(dlpack::to_dl(FLAME_DTYPE_BF16).code, kDLBfloat);
  EXPECT_EQ(dlpack::to_dl(FLAME_DTYPE_F8_E4M3).code, 10) << "kDLFloat8_e4m3fn";
  EXPECT_EQ(dlpack::to_dl(FLAME_DTYPE_F8_E5M2).code, 12) << "kDLFloat8_e5m2";
  for (DLDataType bad : {DLDataType{kDLInt, 8, 1}, DLDataType{kDLInt, 16, 1}, DLDataType{kDLUInt, 16, 1},
                         DLDataType{kDLFloat, 8, 1}, DLDataType{kDLFloat, 32, 4}, DLDataType{5, 64, 1},
                         DLDataType{kDLBfloat, 32, 1}, DLDataType{6, 1, 1}, DLDataType{200, 32, 1},
                         DLDataType{10, 16, 1}, DLDataType{12, 8, 2}, DLDataType{11, 8, 1}, DLDataType{13, 8, 1},
                         DLDataType{14, 8, 1}}) {
    try {
      dlpack::from_dl(bad);
      ADD_FAILURE() << "accepted code " << int(bad.code) << " bits " << int(bad.bits) << " lanes " << bad.lanes;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), FLAME_ERROR_DTYPE_MISMATCH);
    }
  }
}

TEST(DlpackLayout, ContiguousAndNullStrides) {
  Desc a({2, 3}, {}, 0x1000);
  dlpack::Layout l = dlpack::import_layout(a.t, 0, "src");
  EXPECT_EQ(l.shape, (Shape{2, 3}));
  EXPECT_EQ(l.strides, (Strides{3, 1}));
  EXPECT_EQ(l.base, 0x1000u);
  EXPECT_EQ(l.bytes, 24u);
  EXPECT_EQ(l.offset, 0);
  Desc b({2, 3}, {1, 2}, 0x1000, FLAME_DTYPE_F64);  // transposed
  l = dlpack::import_layout(b.t, 0, "src");
  EXPECT_EQ(l.strides, (Strides{1, 2}));
  EXPECT_EQ(l.bytes, 6u * 8);
}

TEST(DlpackLayout, NegativeAndZeroStridesAndOffsets) {
  Desc a({4, 3}, {-3, 1}, 0x1000 + 9 * 4);  // a flipped 4x3: the first element is the last row
  a.t.byte_offset = 0;
  dlpack::Layout l = dlpack::import_layout(a.t, 0, "src");
  EXPECT_EQ(l.base, 0x1000u);
  EXPECT_EQ(l.offset, 9);
  EXPECT_EQ(l.bytes, 12u * 4);
  Desc b({5, 7}, {0, 0}, 0x2000, FLAME_DTYPE_F16);  // a broadcast scalar
  b.t.byte_offset = 6;
  l = dlpack::import_layout(b.t, 0, "src");
  EXPECT_EQ(l.base, 0x2006u);
  EXPECT_EQ(l.bytes, 2u);
  EXPECT_EQ(l.offset, 0);
  Desc c({}, {}, 0x3000, FLAME_DTYPE_U8);  // 0-d
  l = dlpack::import_layout(c.t, 0, "src");
  EXPECT_EQ(l.bytes, 1u);
  EXPECT_TRUE(l.shape.empty());
}

TEST(DlpackLayout, EmptyTensorsNeedNoData) {
  Desc a({0, 5}, {}, 0);
  dlpack::Layout l = dlpack::import_layout(a.t, 0, "src");
  EXPECT_EQ(l.bytes, 0u);
  EXPECT_EQ(l.base, 0u);
  EXPECT_EQ(l.shape, (Shape{0, 5}));
}

TEST(DlpackLayout, BadDescriptors) {
  struct Case {
    const char* what;
    void (*edit)(Desc&);
    flame_status_t status;
  };
  const Case cases[] = {
      {"CPU", [](Desc& d) { d.t.device.device_type = kDLCPU; }, FLAME_ERROR_UNSUPPORTED},
      {"managed", [](Desc& d) { d.t.device.device_type = kDLCUDAManaged; }, FLAME_ERROR_UNSUPPORTED},
      {"other GPU", [](Desc& d) { d.t.device.device_id = 3; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"int8", [](Desc& d) { d.t.dtype = DLDataType{kDLInt, 8, 1}; }, FLAME_ERROR_DTYPE_MISMATCH},
      {"ndim 9", [](Desc& d) { d.t.ndim = 9; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"ndim -2", [](Desc& d) { d.t.ndim = -2; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"shape NULL", [](Desc& d) { d.t.shape = nullptr; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"negative size", [](Desc& d) { d.shape[1] = -4; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"2^64 elements", [](Desc& d) { d.shape[0] = d.shape[1] = int64_t{1} << 32; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"data NULL", [](Desc& d) { d.t.data = nullptr; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"misaligned", [](Desc& d) { d.t.byte_offset = 1; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"byte_offset wraps", [](Desc& d) { d.t.byte_offset = UINT64_MAX - 3; }, FLAME_ERROR_INVALID_ARGUMENT},
      {"stride overflow", [](Desc& d) { d.t.strides = d.strides; d.strides[0] = INT64_MAX; d.strides[1] = 1; },
       FLAME_ERROR_INVALID_ARGUMENT},
      {"below address 0", [](Desc& d) { d.t.strides = d.strides; d.strides[0] = -(int64_t{1} << 40); d.strides[1] = 1; },
       FLAME_ERROR_INVALID_ARGUMENT},
      {"byte count past 2^63", [](Desc& d) { d.t.strides = d.strides; d.strides[0] = int64_t{1} << 61; d.strides[1] = 1; },
       FLAME_ERROR_INVALID_ARGUMENT},
      {"past the address space", [](Desc& d) { d.t.strides = d.strides; d.strides[0] = int64_t{1} << 59; d.strides[1] = 1;
                                               d.t.data = reinterpret_cast<void*>(~uintptr_t{0} - 4095); },
       FLAME_ERROR_INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    Desc d({4, 4}, {}, 0x10000);
    c.edit(d);
    std::string msg;
    EXPECT_EQ(status_of(d.t, &msg), c.status) << c.what << ": " << msg;
    EXPECT_NE(msg.find("src"), std::string::npos) << c.what << ": the message names the argument: " << msg;
  }
}

}  // namespace

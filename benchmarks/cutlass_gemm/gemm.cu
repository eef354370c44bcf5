// CUTLASS 3 (the copy TVM's wheel ships, 3rdparty/cutlass) SM90 GEMMs with BERT's epilogues, for
// benchmarks/cutlass_gemm_study.py: does a warp-specialized kernel with 2-CTA clusters (TMA
// multicast, which Triton 3.6 does not offer) reach cuBLAS where our Triton and Gluon forms do not?
//
// D[M, N] = epilogue(A[M, K] · W[N, K]ᵀ): A row-major, W as PyTorch's Linear stores it (both
// K-major), float16 in and out, float32 accumulation. Epilogues (FUSION, one per translation unit):
//   0 plain: D = acc
//   1 bias:  D = acc + bias[n]
//   2 gelu:  D = gelu_erf(acc + bias[n])
//   3 res:   D = acc + bias[n] + R[m, n]          (R read as CUTLASS's source C, beta = 1)
// Every configuration is an extern "C" function stitch_cutlass_<fusion>_<config>(...).
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"

#ifndef FUSION
#define FUSION 1
#endif

using namespace cute;
using Half = cutlass::half_t;
using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;
constexpr int kAlign = 8;  // 16 bytes of float16

#if FUSION == 3
using ElementC = Half;  // the residual
#else
using ElementC = void;
#endif

#if FUSION == 0
using Fusion = cutlass::epilogue::fusion::LinearCombination<Half, float, Half, float>;
#elif FUSION == 2
using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
    cutlass::epilogue::thread::GELU, Half, float, Half, Half, float>;
#else
using Fusion = cutlass::epilogue::fusion::LinCombPerColBias<Half, float, Half, Half, float>;
#endif

template <int TM, int TN, int TK, int CM, int CN, bool Coop>
struct Config {
  using Tile = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using Cluster = Shape<Int<CM>, Int<CN>, _1>;
  using MainSched = std::conditional_t<Coop, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                       cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpiSched = std::conditional_t<Coop, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                      cutlass::epilogue::TmaWarpSpecialized>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, RowMajor, kAlign,
      Half, RowMajor, kAlign, EpiSched, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Half, RowMajor, kAlign, Half,
      ColumnMajor, kAlign, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      MainSched>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using Op = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

static void* workspace(size_t bytes) {
  static void* ptr = nullptr;
  static size_t have = 0;
  if (bytes > have) {
    if (ptr) cudaFree(ptr);
    cudaMalloc(&ptr, bytes);
    have = bytes;
  }
  return ptr;
}

// 0 on success; negative: CUTLASS refused (can_implement, initialize or run)
template <class Cfg>
static int run_gemm(const void* a, const void* w, const void* bias, const void* res, void* d,
                    int m, int n, int k, int swizzle, cudaStream_t stream) {
  using Op = typename Cfg::Op;
  using Kernel = typename Cfg::Kernel;
  typename Kernel::StrideA sa{};
  typename Kernel::StrideB sb{};
  typename Kernel::StrideC sc{};
  typename Kernel::StrideD sd{};
  get<0>(sa) = k;  // A: (M, K) with K contiguous
  get<2>(sa) = int64_t(m) * k;
  get<0>(sb) = k;  // W: (N, K) with K contiguous
  get<2>(sb) = int64_t(n) * k;
  get<0>(sc) = n;
  get<2>(sc) = int64_t(m) * n;
  get<0>(sd) = n;
  get<2>(sd) = int64_t(m) * n;
  static int sms = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
  typename Op::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {m, n, k, 1};
  args.mainloop.ptr_A = static_cast<const Half*>(a);
  args.mainloop.dA = sa;
  args.mainloop.ptr_B = static_cast<const Half*>(w);
  args.mainloop.dB = sb;
  args.epilogue.ptr_C = static_cast<decltype(args.epilogue.ptr_C)>(res);
  args.epilogue.dC = sc;
  args.epilogue.ptr_D = static_cast<Half*>(d);
  args.epilogue.dD = sd;
  args.epilogue.thread.alpha = 1.0f;
#if FUSION == 3
  args.epilogue.thread.beta = 1.0f;
#endif
#if FUSION != 0
  args.epilogue.thread.bias_ptr = static_cast<const Half*>(bias);
#endif
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = sms;
  args.scheduler.max_swizzle_size = swizzle;
  Op op;
  if (op.can_implement(args) != cutlass::Status::kSuccess) return -1;
  void* ws = workspace(Op::get_workspace_size(args));
  if (op.initialize(args, ws, stream) != cutlass::Status::kSuccess) return -2;
  if (op.run(stream) != cutlass::Status::kSuccess) return -3;
  return 0;
}

#define STR2(x) #x
#define STR(x) STR2(x)
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#if FUSION == 0
#define PREFIX stitch_cutlass_plain_
#elif FUSION == 1
#define PREFIX stitch_cutlass_bias_
#elif FUSION == 2
#define PREFIX stitch_cutlass_gelu_
#else
#define PREFIX stitch_cutlass_res_
#endif

// name: coop|pp _ TMxTNxTK _ cCMxCN
#define GEMM(NAME, TM, TN, TK, CM, CN, COOP)                                                 \
  extern "C" int CAT(PREFIX, NAME)(const void* a, const void* w, const void* bias,           \
                                   const void* res, void* d, int m, int n, int k, int swizzle, \
                                   void* stream) {                                           \
    return run_gemm<Config<TM, TN, TK, CM, CN, COOP>>(a, w, bias, res, d, m, n, k, swizzle,  \
                                                      static_cast<cudaStream_t>(stream));    \
  }

GEMM(coop_128x128x64_c1x1, 128, 128, 64, 1, 1, true)
GEMM(coop_128x128x64_c2x1, 128, 128, 64, 2, 1, true)
GEMM(coop_128x128x64_c1x2, 128, 128, 64, 1, 2, true)
GEMM(coop_128x192x64_c2x1, 128, 192, 64, 2, 1, true)
GEMM(coop_128x256x64_c2x1, 128, 256, 64, 2, 1, true)
GEMM(coop_256x128x64_c1x2, 256, 128, 64, 1, 2, true)
GEMM(coop_256x128x64_c2x1, 256, 128, 64, 2, 1, true)
GEMM(pp_64x128x64_c2x1, 64, 128, 64, 2, 1, false)
GEMM(pp_64x256x64_c1x2, 64, 256, 64, 1, 2, false)
GEMM(pp_128x128x64_c1x2, 128, 128, 64, 1, 2, false)

#if FUSION == 3  // once in the library
extern "C" const char* stitch_cutlass_configs() {
  return "coop_128x128x64_c1x1 coop_128x128x64_c2x1 coop_128x128x64_c1x2 coop_128x192x64_c2x1 "
         "coop_128x256x64_c2x1 coop_256x128x64_c1x2 coop_256x128x64_c2x1 pp_64x128x64_c2x1 "
         "pp_64x256x64_c1x2 pp_128x128x64_c1x2";
}
#endif

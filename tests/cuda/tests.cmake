# tests/cuda: the CUDA backend against the CPU backend.  There is no
# petrel_cuda library (the backend lives in petrel_backend), so the generic
# per-layer loop in tests/CMakeLists.txt skips this folder; the tests are
# declared here.  Without a GPU they exit 77 and CTest reports them skipped.
if(PETREL_CUDA)
  foreach(t test_cuda_ops test_cuda_model test_cuda_kvq test_cuda_qmatmul)
    add_executable(${t} ${CMAKE_CURRENT_LIST_DIR}/${t}.c)
    target_compile_definitions(${t} PRIVATE PETREL_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
    add_test(NAME cuda/${t} COMMAND ${t})
    set_tests_properties(cuda/${t} PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                         TIMEOUT 900 SKIP_RETURN_CODE 77 LABELS cuda)
  endforeach()
  # petrel_quant: moe_ffn's quantized experts (GGUF blocks)
  target_link_libraries(test_cuda_ops PRIVATE petrel_quant PkgConfig::CMOCKA)
  target_link_libraries(test_cuda_model PRIVATE petrel_model PkgConfig::CMOCKA)
  # Quantized KV caches (kv_store and attention over packed pages).
  target_link_libraries(test_cuda_kvq PRIVATE petrel_kv PkgConfig::CMOCKA)
  # Quantized weights (GGUF blocks, MLX affine): matmul and embed.
  target_link_libraries(test_cuda_qmatmul PRIVATE petrel_quant PkgConfig::CMOCKA)
  # Per-op speed against the measured bandwidth (scripts/gpu-run.sh runs it);
  # petrel_kv for the quantized-cache attention arm.
  # Tensor parallel's NCCL side (a one-rank communicator, all ranks when
  # there are several GPUs, and a model run through it); 77 without a GPU
  # or without NCCL in the build.
  add_executable(test_nccl_comm ${CMAKE_CURRENT_LIST_DIR}/test_nccl_comm.c)
  target_compile_definitions(test_nccl_comm PRIVATE PETREL_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_link_libraries(test_nccl_comm PRIVATE petrel_model)
  add_test(NAME cuda/test_nccl_comm COMMAND test_nccl_comm)
  set_tests_properties(cuda/test_nccl_comm PROPERTIES WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                       TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS cuda)
  add_executable(bench_cuda_ops ${CMAKE_CURRENT_LIST_DIR}/bench_cuda_ops.c)
  target_link_libraries(bench_cuda_ops PRIVATE petrel_kv petrel_quant)
endif()

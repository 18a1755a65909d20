# cuda.cmake - the CUDA backend (src/backend/cuda), built into petrel_backend.
#
# PETREL_CUDA defaults to ON when a CUDA compiler is found (nvcc on PATH, in
# CUDACXX, or under /usr/local/cuda), so a GPU-less CI machine with the
# toolkit still compiles and links the backend; the GPU tests then skip.
#
# Targets: sm_90 machine code (H100/H200) plus compute_80 PTX, which the
# driver compiles for any other GPU of compute capability >= 8.0 at start.
# Override with -DCMAKE_CUDA_ARCHITECTURES=... (e.g. "native" on a GPU box).

include(CheckLanguage)
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(PETREL_NVCC nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
               PATH_SUFFIXES bin)
  if(PETREL_NVCC)
    set(CMAKE_CUDA_COMPILER ${PETREL_NVCC} CACHE FILEPATH "CUDA compiler")
  endif()
endif()
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(petrel_cuda_default ON)
else()
  set(petrel_cuda_default OFF)
endif()
option(PETREL_CUDA "Build the CUDA backend (needs the CUDA toolkit)" ${petrel_cuda_default})

if(PETREL_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "90-real;80-virtual")
  endif()
  enable_language(CUDA)
  # Targets made before CUDA was enabled have no architectures; CMake
  # insists on them once the language is on.
  get_property(petrel_targets DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t ${petrel_targets})
    get_target_property(petrel_ttype ${t} TYPE)
    if(NOT petrel_ttype STREQUAL "INTERFACE_LIBRARY")
      set_target_properties(${t} PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    endif()
  endforeach()
  find_package(CUDAToolkit REQUIRED)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)

  file(GLOB petrel_cuda_srcs CONFIGURE_DEPENDS
       ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.c)
  target_sources(petrel_backend PRIVATE ${petrel_cuda_srcs})

  # The top level's add_compile_options (-Wall, sanitizers) are GCC flags:
  # hand them to nvcc's host compiler instead of nvcc itself.
  get_target_property(petrel_be_opts petrel_backend COMPILE_OPTIONS)
  if(petrel_be_opts)
    set(petrel_be_new_opts)
    foreach(o ${petrel_be_opts})
      if(o MATCHES "^\\$<")
        list(APPEND petrel_be_new_opts "${o}")
        continue()
      endif()
      list(APPEND petrel_be_new_opts "$<$<NOT:$<COMPILE_LANGUAGE:CUDA>>:${o}>")
      # nvcc splits -Xcompiler values at commas: -fsanitize=a,b goes as
      # -fsanitize=a and -fsanitize=b.
      if(o MATCHES "^(-f[a-z-]*sanitize[a-z-]*=)(.*)$")
        string(REPLACE "," ";" petrel_parts "${CMAKE_MATCH_2}")
        foreach(part ${petrel_parts})
          list(APPEND petrel_be_new_opts "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${CMAKE_MATCH_1}${part}>")
        endforeach()
      else()
        list(APPEND petrel_be_new_opts "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${o}>")
      endif()
    endforeach()
    set_target_properties(petrel_backend PROPERTIES COMPILE_OPTIONS "${petrel_be_new_opts}")
  endif()
  target_compile_options(petrel_backend PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr -Xptxas=-warn-spills>)
  target_compile_definitions(petrel_backend PUBLIC PETREL_CUDA)
  target_link_libraries(petrel_backend PUBLIC CUDA::cudart CUDA::cublas)

  # NCCL, for tensor parallel's all_reduce across GPUs (src/backend/comm.h,
  # docs/tensor-parallel.md).  AUTO uses it when nccl.h and libnccl are
  # found (the CUDA 13 toolkit on the build machines ships both).  It is
  # compiled against nccl.h and opened at run time (cuda/cuda_comm.c:
  # libnccl.so.2, else the library found here), not linked, so binaries
  # start where NCCL is absent; the CUDA backend then lacks all_reduce.
  set(PETREL_NCCL AUTO CACHE STRING "Use NCCL for tensor parallel: AUTO, ON or OFF")
  set(petrel_nccl_found OFF)
  if(NOT PETREL_NCCL STREQUAL "OFF")
    find_path(PETREL_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
              PATH_SUFFIXES include)
    find_library(PETREL_NCCL_LIBRARY NAMES libnccl.so.2 nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
                 ENV NCCL_HOME PATH_SUFFIXES lib lib64)
    if(PETREL_NCCL_INCLUDE_DIR AND PETREL_NCCL_LIBRARY)
      target_include_directories(petrel_backend PRIVATE ${PETREL_NCCL_INCLUDE_DIR})
      target_compile_definitions(petrel_backend PUBLIC PETREL_NCCL)
      target_compile_definitions(petrel_backend PRIVATE PETREL_NCCL_LIB="${PETREL_NCCL_LIBRARY}")
      target_link_libraries(petrel_backend PUBLIC ${CMAKE_DL_LIBS})
      set(petrel_nccl_found ON)
    elseif(PETREL_NCCL STREQUAL "ON")
      message(FATAL_ERROR "PETREL_NCCL=ON, but nccl.h and libnccl were not found "
                          "(set NCCL_HOME, or -DPETREL_NCCL=OFF)")
    endif()
  endif()
  message(STATUS "Petrel: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}; NCCL ${petrel_nccl_found})")
else()
  message(STATUS "Petrel: CUDA backend OFF")
endif()

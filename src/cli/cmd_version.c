/*
 * cmd_version.c - `petrel version` and `petrel --version`: what this binary
 * is (version, git commit, build type) and what it can run on (CUDA built
 * in or not, the CPU kernel sets and which one this CPU gets).  The commit
 * and build type come from gen/build_info.c, written at build time by
 * cmake/build_info.cmake.
 */
#include <stdio.h>

#include "backend/cpu/quant_kernels.h"
#include "cli/cli.h"

#ifndef PETREL_VERSION
#define PETREL_VERSION "0.0.0"
#endif

extern const char *const petrel_build_commit;
extern const char *const petrel_build_type;
extern const int petrel_build_cuda;

int cmd_version(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "petrel version: takes no arguments\n");
        return 2;
    }
    printf("petrel %s\n", PETREL_VERSION);
    printf("commit:      %s\n", petrel_build_commit);
    printf("build:       %s\n", petrel_build_type);
    printf("cuda:        %s\n", petrel_build_cuda ? "on" : "off (rebuild with nvcc for --device cuda)");
    printf("cpu kernels: avx512, avx2, portable (this CPU: %s)\n",
           pt_qk_cpu_has_avx512() ? "avx512" : pt_qk_cpu_has_avx2() ? "avx2" : "portable");
    return 0;
}

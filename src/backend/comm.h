/*
 * comm.h - a communicator: the ranks of one tensor-parallel group in this
 * process, and the one collective they need, an in-place sum (all_reduce).
 *
 * Two kinds behind one interface, so model code does not know which runs:
 *   host  ranks are threads sharing memory (the CPU reference of tensor
 *         parallel): a barrier, each rank sums its slice of the buffer over
 *         every rank in rank order and writes the sum back to every rank's
 *         buffer, a barrier.  All ranks end with the same floats, and the
 *         same ones from run to run (the order of the additions is fixed).
 *   nccl  ranks are CUDA devices (ncclCommInitAll, one process): the CUDA
 *         backend enqueues ncclAllReduce on its stream.  Built with nccl.h
 *         (cmake PETREL_NCCL) and libnccl.so.2 found at run time; NCCL
 *         chooses its own summation order.
 *
 * Model code reaches both through the all_reduce op (backend.h), which the
 * backend of each rank runs with the rank's index.
 */
#ifndef PETREL_COMM_H
#define PETREL_COMM_H

#include "base/base.h"

typedef struct pt_comm pt_comm;

enum pt_comm_kind { PT_COMM_HOST, PT_COMM_NCCL };

/* A group of n host ranks (threads of this process). */
pt_comm *pt_comm_host_new(int n);
/* A group of n CUDA devices (devices[i] is rank i), through NCCL; -1 with
 * err set when this build has no NCCL or NCCL fails. */
int pt_comm_nccl_new(pt_comm **out, const int *devices, int n, pt_err *err);
void pt_comm_free(pt_comm *c);

int pt_comm_size(const pt_comm *c);
int pt_comm_kind(const pt_comm *c);
/* Whether NCCL communicators can be made: built with nccl.h, and
 * libnccl.so.2 loads. */
bool pt_comm_have_nccl(void);

/* The host kind's all_reduce: rank's buf[count] becomes the sum over the
 * ranks.  Every rank must call it, the same number of times, with equal
 * counts; it returns when all have added. */
void pt_comm_host_all_reduce(pt_comm *c, int rank, float *buf, size_t count);
/* The NCCL kind's communicator of a rank (an ncclComm_t), for the CUDA
 * backend. */
void *pt_comm_nccl_handle(const pt_comm *c, int rank);

#endif

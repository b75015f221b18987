/*
 * dst-pretrain's data-parallel communicator (C99): one process per GPU, gradients averaged over the
 * processes with NCCL all-reduces on a second CUDA stream, bucket by bucket while the backward of earlier
 * layers still runs on the context's stream.
 *
 * The launch is read in this order:
 *   1. built with MPI and started by mpirun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set): MPI gives
 *      rank, world size and the node-local rank, and broadcasts NCCL's unique id;
 *   2. DeepSpeed's launcher variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: rank 0
 *      listens on MASTER_PORT and sends the unique id to every other rank over TCP;
 *   3. neither: one process (rank 0 of 1).
 * With the CUDA backend and a build with NCCL every world size, 1 included, goes through NCCL (the same
 * code path); otherwise (the CPU backend, or no NCCL) only world size 1 is accepted and the all-reduce
 * has nothing to do.
 *
 * Nothing here prints or exits: every failure is a status and a message.
 */
#ifndef DSTP_COMM_H
#define DSTP_COMM_H

#include <dstransformer/dstransformer.h>

#include "pretrain_data.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dstp_launch {
    int rank, world, local_rank;
    const char *method; /* "mpi", "env" or "single" */
} dstp_launch;

/* Reads the launch (MPI_Init when started by mpirun in a build with MPI). DSTP_ERR_ARG with the variable's
 * name for malformed or inconsistent values (RANK >= WORLD_SIZE, WORLD_SIZE > 1 without MASTER_ADDR...). */
dstp_status dstp_launch_read(dstp_launch *out, dstp_error *err);
/* Ends what dstp_launch_read started (MPI_Finalize); a no-op otherwise. */
void dstp_launch_end(const dstp_launch *l);

typedef enum dstp_comm_kind {
    DSTP_COMM_AUTO = 0, /* NCCL with the CUDA backend when built with it and world size > 1, else none */
    DSTP_COMM_NONE = 1, /* world size 1 only, nothing reduced */
    DSTP_COMM_NCCL = 2  /* NCCL; an error when the build or the backend has none */
} dstp_comm_kind;

typedef struct dstp_comm dstp_comm;

/* The communicator of this process on `ctx`'s device (bootstrapped as dstp_launch_read found). */
dstp_status dstp_comm_create(dst_context *ctx, const dstp_launch *launch, dstp_comm_kind kind, dstp_comm **out,
                             dstp_error *err);
void dstp_comm_destroy(dstp_comm *c);
/* "nccl" or "none". */
const char *dstp_comm_name(const dstp_comm *c);
int dstp_comm_world(const dstp_comm *c);

/* A bucket of gradients is final (its last backward op is enqueued on the context's stream): enqueue
 * their in-place average over the ranks on the communicator's stream, after the work queued so far. */
dstp_status dstp_comm_reduce(dstp_comm *c, const dst_tensor *grads, int n, dstp_error *err);
/* Makes the context's stream wait for every reduce enqueued so far (before the optimizer step). */
dstp_status dstp_comm_wait(dstp_comm *c, dstp_error *err);

/* Combines a small set of flags over the ranks (bitwise OR, through NCCL's max of each bit's word): every
 * rank gets the same *flags, so all stop at the same step. Waits for the result (a host synchronisation);
 * with one process *flags is unchanged. */
dstp_status dstp_comm_agree(dstp_comm *c, int *flags, dstp_error *err);

/* The mean over the ranks of n ≤ 16 host values, in place (each rank gets the same means). Waits for the
 * result; with one process the values are unchanged. */
dstp_status dstp_comm_average(dstp_comm *c, double *values, int n, dstp_error *err);
/* *same = 1 when every rank passed the same value, else 0 on every rank. Waits (through NCCL whenever the
 * communicator has it, world size 1 included); without NCCL: 1. */
dstp_status dstp_comm_same(dstp_comm *c, uint64_t value, int *same, dstp_error *err);

/* The watchdog of a run through NCCL (world size 1 included; a no-op without NCCL): a thread that ends
 * the process with a message and `exit_code` when NCCL reports an error or when no heartbeat came for
 * timeout_s seconds (a rank that exited leaves the others waiting in a collective that never completes).
 * The training loop calls dstp_comm_heartbeat once per micro-batch. timeout_s ≤ 0: no watchdog. */
dstp_status dstp_comm_watch(dstp_comm *c, double timeout_s, int exit_code, dstp_error *err);
void dstp_comm_heartbeat(dstp_comm *c);

#ifdef __cplusplus
}
#endif

#endif /* DSTP_COMM_H */

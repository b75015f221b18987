/*
 * The data-parallel communicator of dst-pretrain (comm.h). The CUDA and NCCL parts are compiled with
 * DSTP_HAVE_NCCL (CMake finds NCCL when the library has its CUDA backend), the MPI bootstrap with
 * DSTP_HAVE_MPI (CMake finds MPI, optional).
 *
 * The all-reduce of a bucket: an event recorded on the context's stream after the bucket's last backward
 * op, the communicator's stream waits for it, then one NCCL group of in-place ncclAvg all-reduces (one per
 * tensor of the bucket). dstp_comm_wait records an event on the communicator's stream and makes the
 * context's stream wait for it, so the optimizer step (and the engine's zeroing of the gradients) comes
 * after every reduce, with no host synchronisation.
 */
#include "comm.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifdef DSTP_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif
#ifdef DSTP_HAVE_MPI
#include <mpi.h>
#endif

void dstp_seterr(dstp_error *err, const char *fmt, ...);

/* ---- the launch ------------------------------------------------------------------------------------------ */

/* An environment variable as an integer in [lo, hi]: 1 read, 0 absent, -1 malformed (message set). */
static int env_int(const char *name, long lo, long hi, int *out, dstp_error *err) {
    const char *s = getenv(name);
    char *end = NULL;
    long v;
    if (!s || !*s) return 0;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        dstp_seterr(err, "environment variable %s is \"%s\": expected an integer in [%ld, %ld]", name, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 1;
}

static int started_by_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") || getenv("MPI_LOCALNRANKS");
}

#ifdef DSTP_HAVE_MPI
static int g_mpi_started = 0;
#endif

dstp_status dstp_launch_read(dstp_launch *out, dstp_error *err) {
    int w = 1, r = 0, lr = 0, have_w, have_r, have_lr;
    memset(out, 0, sizeof *out);
    out->world = 1;
    out->method = "single";
    if (started_by_mpirun()) {
#ifdef DSTP_HAVE_MPI
        MPI_Comm local;
        int inited = 0;
        MPI_Initialized(&inited);
        if (!inited) {
            if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
                dstp_seterr(err, "MPI_Init failed (started by mpirun)");
                return DSTP_ERR_STATE;
            }
            g_mpi_started = 1;
        }
        MPI_Comm_rank(MPI_COMM_WORLD, &out->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &out->world);
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, out->rank, MPI_INFO_NULL, &local);
        MPI_Comm_rank(local, &out->local_rank);
        MPI_Comm_free(&local);
        out->method = "mpi";
        return DSTP_OK;
#else
        /* Without MPI in the build, Open MPI's own variables still give the layout; the unique id then
         * travels over TCP as with the launcher variables (MASTER_ADDR, MASTER_PORT). */
        if (env_int("OMPI_COMM_WORLD_SIZE", 1, 1 << 20, &w, err) < 0 ||
            env_int("OMPI_COMM_WORLD_RANK", 0, (1 << 20) - 1, &r, err) < 0 ||
            env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, (1 << 20) - 1, &lr, err) < 0)
            return DSTP_ERR_ARG;
#endif
    }
    have_w = env_int("WORLD_SIZE", 1, 1 << 20, &w, err);
    if (have_w < 0) return DSTP_ERR_ARG;
    have_r = env_int("RANK", 0, (1 << 20) - 1, &r, err);
    if (have_r < 0) return DSTP_ERR_ARG;
    have_lr = env_int("LOCAL_RANK", 0, (1 << 20) - 1, &lr, err);
    if (have_lr < 0) return DSTP_ERR_ARG;
    if (r >= w) {
        dstp_seterr(err, "environment: RANK %d is not below WORLD_SIZE %d", r, w);
        return DSTP_ERR_ARG;
    }
    if (w > 1 && (!getenv("MASTER_ADDR") || !getenv("MASTER_PORT"))) {
        dstp_seterr(err, "environment: WORLD_SIZE is %d but MASTER_ADDR and MASTER_PORT (where rank 0 listens) are "
                         "not both set", w);
        return DSTP_ERR_ARG;
    }
    out->world = w;
    out->rank = r;
    out->local_rank = have_lr ? lr : r;
    out->method = w > 1 || have_w || have_r ? "env" : "single";
    return DSTP_OK;
}

void dstp_launch_end(const dstp_launch *l) {
    (void)l;
#ifdef DSTP_HAVE_MPI
    if (g_mpi_started) {
        MPI_Finalize();
        g_mpi_started = 0;
    }
#endif
}

#ifdef DSTP_HAVE_NCCL
/* ---- the unique id over TCP ------------------------------------------------------------------------------ */

static int send_all(int fd, const void *p, size_t n) {
    const char *b = (const char *)p;
    while (n) {
        const ssize_t k = send(fd, b, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int recv_all(int fd, void *p, size_t n) {
    char *b = (char *)p;
    while (n) {
        const ssize_t k = recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Rank 0: listens on MASTER_PORT and sends `n` bytes to each of the world − 1 other ranks. Other ranks:
 * connect to MASTER_ADDR:MASTER_PORT (retrying for up to 120 s while rank 0 starts) and receive them. */
static dstp_status tcp_exchange(const dstp_launch *l, void *bytes, size_t n, dstp_error *err) {
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    struct addrinfo hints, *res = NULL, *a;
    int fd = -1, rc, i;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (l->rank == 0) {
        const int one = 1;
        hints.ai_flags = AI_PASSIVE;
        rc = getaddrinfo(NULL, port, &hints, &res);
        if (rc != 0) {
            dstp_seterr(err, "MASTER_PORT %s: %s", port, gai_strerror(rc));
            return DSTP_ERR_ARG;
        }
        for (a = res; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd < 0) continue;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
                close(fd);
                fd = -1;
            }
        }
        freeaddrinfo(res);
        if (fd < 0) {
            dstp_seterr(err, "rank 0 cannot listen on MASTER_PORT %s: %s", port, strerror(errno));
            return DSTP_ERR_IO;
        }
        for (i = 1; i < l->world; ++i) {
            const int c = accept(fd, NULL, NULL);
            if (c < 0 && errno == EINTR) {
                --i;
                continue;
            }
            if (c < 0 || send_all(c, bytes, n) != 0) {
                if (c >= 0) close(c);
                close(fd);
                dstp_seterr(err, "rank 0: sending NCCL's unique id to rank %d of %d failed: %s", i, l->world,
                            strerror(errno));
                return DSTP_ERR_IO;
            }
            close(c);
        }
        close(fd);
        return DSTP_OK;
    }
    rc = getaddrinfo(addr, port, &hints, &res);
    if (rc != 0) {
        dstp_seterr(err, "MASTER_ADDR %s, MASTER_PORT %s: %s", addr, port, gai_strerror(rc));
        return DSTP_ERR_ARG;
    }
    for (i = 0; i < 1200 && fd < 0; ++i) { /* 1200 × 0.1 s */
        for (a = res; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
                close(fd);
                fd = -1;
            }
        }
        if (fd < 0) {
            const struct timespec t = {0, 100000000L};
            nanosleep(&t, NULL);
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        dstp_seterr(err, "rank %d: cannot reach rank 0 at MASTER_ADDR %s, MASTER_PORT %s within 120 s", l->rank, addr,
                    port);
        return DSTP_ERR_IO;
    }
    rc = recv_all(fd, bytes, n);
    close(fd);
    if (rc != 0) {
        dstp_seterr(err, "rank %d: receiving NCCL's unique id from rank 0 failed", l->rank);
        return DSTP_ERR_IO;
    }
    return DSTP_OK;
}

#endif /* DSTP_HAVE_NCCL */

/* ---- the communicator ------------------------------------------------------------------------------------ */

struct dstp_comm {
    int world, rank;
    int nccl;
#ifdef DSTP_HAVE_NCCL
    ncclComm_t comm;
    cudaStream_t compute, side;
    cudaEvent_t ready, done;
    int32_t *flags;   /* device [8]: the flag bits to combine */
    double *values;   /* device [kValues]: dstp_comm_average's values, or dstp_comm_same's two words */
#endif
    /* The watchdog (dstp_comm_watch): its thread, the time of the last heartbeat, its limit. */
    int watching;
    pthread_t watcher;
    pthread_mutex_t lock;
    double beat, timeout_s;
    int stop, exit_code;
};
enum { kValues = 16 };

const char *dstp_comm_name(const dstp_comm *c) { return c->nccl ? "nccl" : "none"; }
int dstp_comm_world(const dstp_comm *c) { return c->world; }

#ifdef DSTP_HAVE_NCCL
#define CUDA_TRY(call, what)                                                                                  \
    do {                                                                                                      \
        const cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess) {                                                                              \
            dstp_seterr(err, "%s: %s", what, cudaGetErrorString(e_));                                         \
            return DSTP_ERR_STATE;                                                                            \
        }                                                                                                     \
    } while (0)
#define NCCL_TRY(call, what)                                                                                  \
    do {                                                                                                      \
        const ncclResult_t r_ = (call);                                                                       \
        if (r_ != ncclSuccess) {                                                                              \
            dstp_seterr(err, "%s: %s", what, ncclGetErrorString(r_));                                         \
            return DSTP_ERR_STATE;                                                                            \
        }                                                                                                     \
    } while (0)

static dstp_status nccl_create(dstp_comm *c, dst_context *ctx, const dstp_launch *l, dstp_error *err) {
    ncclUniqueId id;
    void *stream = NULL;
    dstp_status st = DSTP_OK;
    if (dst_context_get_stream(ctx, &stream) != DST_OK) {
        dstp_seterr(err, "dst_context_get_stream: %s", dst_last_error());
        return DSTP_ERR_STATE;
    }
    c->compute = (cudaStream_t)stream;
    CUDA_TRY(cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    CUDA_TRY(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    CUDA_TRY(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    CUDA_TRY(cudaMalloc((void **)&c->flags, 8 * sizeof(int32_t)), "cudaMalloc");
    CUDA_TRY(cudaMalloc((void **)&c->values, kValues * sizeof(double)), "cudaMalloc");
    memset(&id, 0, sizeof id);
    if (l->rank == 0) NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (l->world > 1) {
#ifdef DSTP_HAVE_MPI
        if (strcmp(l->method, "mpi") == 0) {
            if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
                dstp_seterr(err, "MPI_Bcast of NCCL's unique id failed");
                return DSTP_ERR_STATE;
            }
        } else
#endif
        {
            st = tcp_exchange(l, &id, sizeof id, err);
            if (st != DSTP_OK) return st;
        }
    }
    NCCL_TRY(ncclCommInitRank(&c->comm, l->world, id, l->rank), "ncclCommInitRank");
    c->nccl = 1;
    return DSTP_OK;
}
#endif

dstp_status dstp_comm_create(dst_context *ctx, const dstp_launch *launch, dstp_comm_kind kind, dstp_comm **out,
                             dstp_error *err) {
    dst_backend backend = DST_BACKEND_CPU;
    dstp_comm *c;
    int use_nccl;
    if (dst_context_get_backend(ctx, &backend) != DST_OK) {
        dstp_seterr(err, "dst_context_get_backend: %s", dst_last_error());
        return DSTP_ERR_STATE;
    }
#ifdef DSTP_HAVE_NCCL
    /* auto: NCCL only where there is something to average. With one rank an all-reduce is the identity
     * and would only copy every gradient in place on the second stream, beside the backward; --comm nccl
     * still takes that path with one rank (the test pretrain_train_nccl_world1). */
    use_nccl = backend == DST_BACKEND_CUDA &&
               (kind == DSTP_COMM_NCCL || (kind == DSTP_COMM_AUTO && launch->world > 1));
#else
    use_nccl = 0;
#endif
    if (kind == DSTP_COMM_NCCL && !use_nccl) {
        dstp_seterr(err, "--comm nccl: %s", backend == DST_BACKEND_CUDA ? "this dst-pretrain was built without NCCL"
                                                                        : "NCCL needs the CUDA backend");
        return DSTP_ERR_UNSUPPORTED;
    }
    if (!use_nccl && launch->world > 1) {
        dstp_seterr(err, "WORLD_SIZE is %d: data parallelism needs NCCL and the CUDA backend (%s)", launch->world,
                    backend != DST_BACKEND_CUDA ? "this run is on the CPU" : kind == DSTP_COMM_NONE ? "--comm none"
                                                                                             : "built without NCCL");
        return DSTP_ERR_UNSUPPORTED;
    }
    c = (dstp_comm *)calloc(1, sizeof *c);
    if (!c) {
        dstp_seterr(err, "communicator: out of memory");
        return DSTP_ERR_NOMEM;
    }
    c->world = launch->world;
    c->rank = launch->rank;
#ifdef DSTP_HAVE_NCCL
    if (use_nccl) {
        const dstp_status st = nccl_create(c, ctx, launch, err);
        if (st != DSTP_OK) {
            dstp_comm_destroy(c);
            return st;
        }
    }
#endif
    *out = c;
    return DSTP_OK;
}

static void watch_stop(dstp_comm *c);

void dstp_comm_destroy(dstp_comm *c) {
    if (!c) return;
    watch_stop(c);
#ifdef DSTP_HAVE_NCCL
    if (c->side) cudaStreamSynchronize(c->side);
    if (c->nccl) ncclCommDestroy(c->comm);
    if (c->ready) cudaEventDestroy(c->ready);
    if (c->done) cudaEventDestroy(c->done);
    if (c->side) cudaStreamDestroy(c->side);
    if (c->flags) cudaFree(c->flags);
    if (c->values) cudaFree(c->values);
#endif
    free(c);
}

dstp_status dstp_comm_reduce(dstp_comm *c, const dst_tensor *grads, int n, dstp_error *err) {
#ifdef DSTP_HAVE_NCCL
    int i;
    if (!c->nccl || n == 0) return DSTP_OK;
    CUDA_TRY(cudaEventRecord(c->ready, c->compute), "cudaEventRecord");
    CUDA_TRY(cudaStreamWaitEvent(c->side, c->ready, 0), "cudaStreamWaitEvent");
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    for (i = 0; i < n; ++i) {
        const dst_tensor *t = &grads[i];
        size_t count = 1;
        int d;
        ncclDataType_t type;
        for (d = 0; d < t->ndim; ++d) count *= (size_t)t->shape[d];
        switch (t->dtype) {
        case DST_DTYPE_FP32: type = ncclFloat32; break;
        case DST_DTYPE_FP16: type = ncclFloat16; break;
        case DST_DTYPE_BF16: type = ncclBfloat16; break;
        case DST_DTYPE_FP64: type = ncclFloat64; break;
        default:
            ncclGroupEnd();
            dstp_seterr(err, "all-reduce: gradient %d has dtype %s, not a floating-point type", i,
                        dst_dtype_string(t->dtype));
            return DSTP_ERR_ARG;
        }
        if (ncclAllReduce(t->data, t->data, count, type, ncclAvg, c->comm, c->side) != ncclSuccess) {
            ncclGroupEnd();
            dstp_seterr(err, "ncclAllReduce of gradient %d (%zu elements) failed", i, count);
            return DSTP_ERR_STATE;
        }
    }
    NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd");
    return DSTP_OK;
#else
    (void)c;
    (void)grads;
    (void)n;
    (void)err;
    return DSTP_OK;
#endif
}

dstp_status dstp_comm_wait(dstp_comm *c, dstp_error *err) {
#ifdef DSTP_HAVE_NCCL
    if (!c->nccl) return DSTP_OK;
    CUDA_TRY(cudaEventRecord(c->done, c->side), "cudaEventRecord");
    CUDA_TRY(cudaStreamWaitEvent(c->compute, c->done, 0), "cudaStreamWaitEvent");
    return DSTP_OK;
#else
    (void)c;
    (void)err;
    return DSTP_OK;
#endif
}

dstp_status dstp_comm_agree(dstp_comm *c, int *flags, dstp_error *err) {
#ifdef DSTP_HAVE_NCCL
    int32_t bits[8];
    int i;
    if (!c->nccl || c->world == 1) return DSTP_OK;
    for (i = 0; i < 8; ++i) bits[i] = (*flags >> i) & 1;
    CUDA_TRY(cudaMemcpyAsync(c->flags, bits, sizeof bits, cudaMemcpyHostToDevice, c->side), "cudaMemcpyAsync");
    NCCL_TRY(ncclAllReduce(c->flags, c->flags, 8, ncclInt32, ncclMax, c->comm, c->side), "ncclAllReduce");
    CUDA_TRY(cudaMemcpyAsync(bits, c->flags, sizeof bits, cudaMemcpyDeviceToHost, c->side), "cudaMemcpyAsync");
    CUDA_TRY(cudaStreamSynchronize(c->side), "cudaStreamSynchronize");
    *flags = 0;
    for (i = 0; i < 8; ++i) *flags |= (bits[i] != 0) << i;
    return DSTP_OK;
#else
    (void)c;
    (void)flags;
    (void)err;
    return DSTP_OK;
#endif
}

dstp_status dstp_comm_average(dstp_comm *c, double *values, int n, dstp_error *err) {
#ifdef DSTP_HAVE_NCCL
    int i;
    if (!c->nccl || c->world == 1 || n <= 0) return DSTP_OK;
    if (n > kValues) {
        dstp_seterr(err, "dstp_comm_average: %d values, at most %d", n, (int)kValues);
        return DSTP_ERR_ARG;
    }
    CUDA_TRY(cudaMemcpyAsync(c->values, values, (size_t)n * sizeof(double), cudaMemcpyHostToDevice, c->side),
             "cudaMemcpyAsync");
    NCCL_TRY(ncclAllReduce(c->values, c->values, (size_t)n, ncclFloat64, ncclSum, c->comm, c->side), "ncclAllReduce");
    CUDA_TRY(cudaMemcpyAsync(values, c->values, (size_t)n * sizeof(double), cudaMemcpyDeviceToHost, c->side),
             "cudaMemcpyAsync");
    CUDA_TRY(cudaStreamSynchronize(c->side), "cudaStreamSynchronize");
    for (i = 0; i < n; ++i) values[i] /= (double)c->world;
    return DSTP_OK;
#else
    (void)c;
    (void)values;
    (void)n;
    (void)err;
    return DSTP_OK;
#endif
}

dstp_status dstp_comm_same(dstp_comm *c, uint64_t value, int *same, dstp_error *err) {
#ifdef DSTP_HAVE_NCCL
    uint64_t words[2];
    *same = 1;
    if (!c->nccl) return DSTP_OK; /* world size 1 through NCCL too: the path the tests can run on one GPU */
    /* the largest and the smallest value over the ranks: equal exactly when every rank has the same */
    words[0] = value;
    words[1] = ~value;
    CUDA_TRY(cudaMemcpyAsync(c->values, words, sizeof words, cudaMemcpyHostToDevice, c->side), "cudaMemcpyAsync");
    NCCL_TRY(ncclAllReduce(c->values, c->values, 2, ncclUint64, ncclMax, c->comm, c->side), "ncclAllReduce");
    CUDA_TRY(cudaMemcpyAsync(words, c->values, sizeof words, cudaMemcpyDeviceToHost, c->side), "cudaMemcpyAsync");
    CUDA_TRY(cudaStreamSynchronize(c->side), "cudaStreamSynchronize");
    *same = words[0] == value && ~words[1] == value; /* max(v) == v and min(v) == v */
    return DSTP_OK;
#else
    (void)c;
    (void)value;
    (void)err;
    *same = 1;
    return DSTP_OK;
#endif
}

/* ---- the watchdog ------------------------------------------------------------------------------------------- */

/* Ends the process with a message: the other ranks are gone or NCCL failed, so the collectives this process
 * waits on would never finish. The communicator is aborted first (its kernels stop), then _exit: the main
 * thread may be blocked in a CUDA call that only the end of the process releases. */
static void watch_fail(dstp_comm *c, const char *why) {
    fprintf(stderr, "dst-pretrain: rank %d of %d: %s; stopping (exit %d)\n", c->rank, c->world, why, c->exit_code);
    fflush(stderr);
    fflush(stdout);
#ifdef DSTP_HAVE_NCCL
    if (c->nccl) ncclCommAbort(c->comm);
#endif
    _exit(c->exit_code);
}

static void *watch_main(void *arg) {
    dstp_comm *c = (dstp_comm *)arg;
    const struct timespec tick = {0, 250 * 1000 * 1000};
    char why[192];
    for (;;) {
        double beat;
        int stop;
        nanosleep(&tick, NULL);
        pthread_mutex_lock(&c->lock);
        stop = c->stop;
        beat = c->beat;
        pthread_mutex_unlock(&c->lock);
        if (stop) return NULL;
#ifdef DSTP_HAVE_NCCL
        {
            ncclResult_t state = ncclSuccess;
            if (ncclCommGetAsyncError(c->comm, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
                snprintf(why, sizeof why, "NCCL reported an error (%s)", ncclGetErrorString(state));
                watch_fail(c, why);
            }
        }
#endif
        if (dstp_mono_s() - beat > c->timeout_s) {
            snprintf(why, sizeof why, "no progress for %.0f s (--comm-timeout): another rank has probably stopped",
                     c->timeout_s);
            watch_fail(c, why);
        }
    }
}

dstp_status dstp_comm_watch(dstp_comm *c, double timeout_s, int exit_code, dstp_error *err) {
    if (!c->nccl || timeout_s <= 0 || c->watching) return DSTP_OK;
    c->timeout_s = timeout_s;
    c->exit_code = exit_code;
    c->beat = dstp_mono_s();
    c->stop = 0;
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        dstp_seterr(err, "communication watchdog: pthread_mutex_init failed");
        return DSTP_ERR_STATE;
    }
    if (pthread_create(&c->watcher, NULL, watch_main, c) != 0) {
        pthread_mutex_destroy(&c->lock);
        dstp_seterr(err, "communication watchdog: pthread_create failed");
        return DSTP_ERR_STATE;
    }
    c->watching = 1;
    return DSTP_OK;
}

void dstp_comm_heartbeat(dstp_comm *c) {
    if (!c || !c->watching) return;
    pthread_mutex_lock(&c->lock);
    c->beat = dstp_mono_s();
    pthread_mutex_unlock(&c->lock);
}

static void watch_stop(dstp_comm *c) {
    if (!c->watching) return;
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->watcher, NULL);
    pthread_mutex_destroy(&c->lock);
    c->watching = 0;
}

/*
 * NVIDIA's pre-processed BERT shards (HDF5; deepspeed_engine.md §7.5) through libhdf5's C API.
 * HDF5's own error printing is switched off; every failure becomes a message naming the file and the
 * dataset. Without libhdf5 at build time (DSTP_HAVE_HDF5 undefined) dstp_shard_read refuses every file
 * with DSTP_ERR_UNSUPPORTED; the rest of the program is unchanged.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef DSTP_HAVE_HDF5
#include <hdf5.h>
#endif

#include "pretrain_data.h"

void dstp_seterr(dstp_error *err, const char *fmt, ...);

void dstp_shard_free(dstp_shard *s) {
    if (!s) return;
    free(s->input_ids);
    free(s->input_mask);
    free(s->segment_ids);
    free(s->mlm_positions);
    free(s->mlm_ids);
    free(s->nsp);
    memset(s, 0, sizeof *s);
}

#ifdef DSTP_HAVE_HDF5
/* Reads dataset `name` of rank `rank` as `mem_type` (element size `esize`) into a new buffer; dims out. */
static dstp_status read_dataset(hid_t file, const char *path, const char *name, int rank, hid_t mem_type,
                                size_t esize, void **data, hsize_t dims[2], dstp_error *err) {
    hid_t ds, space;
    int r;
    size_t count = 1;
    if (H5Lexists(file, name, H5P_DEFAULT) <= 0) {
        dstp_seterr(err, "%s: dataset %s is missing", path, name);
        return DSTP_ERR_FORMAT;
    }
    ds = H5Dopen2(file, name, H5P_DEFAULT);
    if (ds < 0) {
        dstp_seterr(err, "%s: cannot open dataset %s", path, name);
        return DSTP_ERR_FORMAT;
    }
    space = H5Dget_space(ds);
    r = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    if (r != rank) {
        if (space >= 0) H5Sclose(space);
        H5Dclose(ds);
        dstp_seterr(err, "%s: dataset %s has rank %d, expected %d", path, name, r, rank);
        return DSTP_ERR_FORMAT;
    }
    dims[1] = 1;
    H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    count = (size_t)dims[0] * (rank == 2 ? (size_t)dims[1] : 1);
    *data = malloc(count ? count * esize : 1);
    if (!*data) {
        H5Dclose(ds);
        dstp_seterr(err, "%s: out of memory for %s", path, name);
        return DSTP_ERR_NOMEM;
    }
    if (count && H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, *data) < 0) {
        free(*data);
        *data = NULL;
        H5Dclose(ds);
        dstp_seterr(err, "%s: cannot read dataset %s as integers", path, name);
        return DSTP_ERR_FORMAT;
    }
    H5Dclose(ds);
    return DSTP_OK;
}

dstp_status dstp_shard_read(const char *path, dstp_shard *out, dstp_error *err) {
    struct stat st;
    hid_t file;
    hsize_t d_ids[2], d_mask[2], d_seg[2], d_pos[2], d_mid[2], d_nsp[2];
    dstp_status s = DSTP_OK;
    dstp_shard r;
    memset(&r, 0, sizeof r);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        dstp_seterr(err, "%s: cannot open (not a readable regular file)", path);
        return DSTP_ERR_IO;
    }
    if (st.st_size == 0) {
        dstp_seterr(err, "%s: empty file, not an HDF5 shard", path);
        return DSTP_ERR_FORMAT;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (H5Fis_hdf5(path) <= 0) {
        dstp_seterr(err, "%s: not an HDF5 file", path);
        return DSTP_ERR_FORMAT;
    }
    file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
        dstp_seterr(err, "%s: HDF5 cannot open it", path);
        return DSTP_ERR_FORMAT;
    }
    s = read_dataset(file, path, "input_ids", 2, H5T_NATIVE_INT32, 4, (void **)&r.input_ids, d_ids, err);
    if (s == DSTP_OK) s = read_dataset(file, path, "input_mask", 2, H5T_NATIVE_INT8, 1, (void **)&r.input_mask, d_mask, err);
    if (s == DSTP_OK) s = read_dataset(file, path, "segment_ids", 2, H5T_NATIVE_INT8, 1, (void **)&r.segment_ids, d_seg, err);
    if (s == DSTP_OK)
        s = read_dataset(file, path, "masked_lm_positions", 2, H5T_NATIVE_INT32, 4, (void **)&r.mlm_positions, d_pos, err);
    if (s == DSTP_OK) s = read_dataset(file, path, "masked_lm_ids", 2, H5T_NATIVE_INT32, 4, (void **)&r.mlm_ids, d_mid, err);
    if (s == DSTP_OK) s = read_dataset(file, path, "next_sentence_labels", 1, H5T_NATIVE_INT8, 1, (void **)&r.nsp, d_nsp, err);
    H5Fclose(file);
    if (s == DSTP_OK) {
        const hsize_t n = d_ids[0], S = d_ids[1], P = d_pos[1];
        if (d_mask[0] != n || d_mask[1] != S || d_seg[0] != n || d_seg[1] != S || d_pos[0] != n || d_mid[0] != n ||
            d_mid[1] != P || d_nsp[0] != n) {
            dstp_seterr(err, "%s: the datasets disagree in shape (input_ids [%llu, %llu], masked_lm_positions "
                             "[%llu, %llu])", path, (unsigned long long)n, (unsigned long long)S,
                        (unsigned long long)d_pos[0], (unsigned long long)P);
            s = DSTP_ERR_FORMAT;
        } else if (n == 0 || S < 2 || P < 1 || S > 1000000 || P > S) {
            dstp_seterr(err, "%s: %llu samples of length %llu with %llu predictions: nothing to train on", path,
                        (unsigned long long)n, (unsigned long long)S, (unsigned long long)P);
            s = DSTP_ERR_FORMAT;
        } else {
            r.n = (int64_t)n;
            r.seq = (int64_t)S;
            r.max_pred = (int64_t)P;
        }
    }
    if (s != DSTP_OK) {
        dstp_shard_free(&r);
        return s;
    }
    *out = r;
    return DSTP_OK;
}

#else
dstp_status dstp_shard_read(const char *path, dstp_shard *out, dstp_error *err) {
    (void)out;
    dstp_seterr(err, "%s: this dst-pretrain was built without HDF5 support (install libhdf5-dev and rebuild to "
                     "read NVIDIA's shards)", path);
    return DSTP_ERR_UNSUPPORTED;
}
#endif

dstp_status dstp_shard_example(const dstp_shard *s, int64_t i, int32_t vocab_size, dstp_example *ex, dstp_error *err) {
    const int64_t S = s->seq, P = s->max_pred;
    const int32_t *ids = s->input_ids + i * S, *pos = s->mlm_positions + i * P, *mid = s->mlm_ids + i * P;
    const int8_t *mask = s->input_mask + i * S, *seg = s->segment_ids + i * S;
    int64_t len = 0, j, k = P;
    while (len < S && mask[len]) ++len;
    for (j = len; j < S; ++j)
        if (mask[j]) {
            dstp_seterr(err, "sample %lld: input_mask is not a prefix of ones (1 at %lld after 0 at %lld)", (long long)i,
                        (long long)j, (long long)len);
            return DSTP_ERR_FORMAT;
        }
    if (len == 0) {
        dstp_seterr(err, "sample %lld: input_mask is all zero", (long long)i);
        return DSTP_ERR_FORMAT;
    }
    for (j = 0; j < S; ++j) {
        if (vocab_size > 0 && (ids[j] < 0 || ids[j] >= vocab_size)) {
            dstp_seterr(err, "sample %lld: input_ids[%lld] is %d, outside the vocabulary of %d", (long long)i,
                        (long long)j, (int)ids[j], (int)vocab_size);
            return DSTP_ERR_FORMAT;
        }
        ex->ids[j] = ids[j];
        ex->types[j] = seg[j];
    }
    for (j = 0; j < P; ++j)
        if (pos[j] == 0) {
            k = j;
            break;
        }
    for (j = 0; j < k; ++j) {
        if (pos[j] < 0 || pos[j] >= len || (j > 0 && pos[j] <= pos[j - 1])) {
            dstp_seterr(err, "sample %lld: masked_lm_positions[%lld] is %d (outside 1..%lld or not increasing)",
                        (long long)i, (long long)j, (int)pos[j], (long long)len - 1);
            return DSTP_ERR_FORMAT;
        }
        if (vocab_size > 0 && (mid[j] < 0 || mid[j] >= vocab_size)) {
            dstp_seterr(err, "sample %lld: masked_lm_ids[%lld] is %d, outside the vocabulary", (long long)i, (long long)j,
                        (int)mid[j]);
            return DSTP_ERR_FORMAT;
        }
        ex->pos[j] = pos[j];
        ex->labels[j] = mid[j];
    }
    ex->len = (int32_t)len;
    ex->npred = (int32_t)k;
    ex->nsp = s->nsp[i];
    return DSTP_OK;
}

/*
 * The one SWIG interface of libdstransformer, shared by the Python and the Java bindings.
 *
 * It is a raw and complete wrapping of the public C API (every function, struct and enum of
 * dstransformer/dstransformer.h); the idiomatic layers (the `dstransformer` Python package, the Java
 * classes) are written on top of it in their own language. This file holds only what is neutral:
 *
 *  - the opaque handles (dst_context, dst_layer, dst_saved) stay opaque pointers;
 *  - scalar out-parameters (int *, size_t *, uint64_t *, enum *) become return values through SWIG's
 *    standard OUTPUT typemaps (Python: extra return values; Java: one-element arrays);
 *  - small %extend helpers read and write the fixed-size shape arrays of dst_tensor and dst_param_info
 *    and build a dst_tensor in one call;
 *  - %array_functions for the `dst_layer *const *layers` argument of the checkpoint calls.
 *
 * Each language file must map, before the header is parsed (typemaps apply only to declarations
 * that follow them):
 *  - `void *`, `const void *` (data pointers, streams) to and from an integer (uintptr);
 *  - `void **` out-parameters (dst_malloc, dst_layer_param_arena, ...) to a returned integer;
 *  - `SWIGTYPE **out` (the create functions) to a returned handle;
 *  - dst_status to that language's error reporting (Python: an exception per status family);
 *  - the output char buffers `(char *client_state, size_t client_state_size)` and
 *    `(char *summary, size_t summary_size)`.
 */
%module dstransformer_native

%{
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dstransformer/dstransformer.h"
%}

/* SWIG does not follow #include: the export macro must be defined for its parser. */
#define DST_API

%include "stdint.i"
%include "typemaps.i"
%include "carrays.i"

#ifdef SWIGJAVA
%include "java_typemaps.i"
#endif

/* ---- scalar out-parameters ------------------------------------------------------------------ */
%apply int *OUTPUT { int *id, int *count, int *threads };
%apply size_t *OUTPUT { size_t *bytes, size_t *client_state_len, size_t *summary_len };
%apply uint64_t *OUTPUT { uint64_t *seed, uint64_t *offset, uint64_t *counter };
%apply int *OUTPUT { dst_backend *backend, dst_param *param, dst_index_checks *mode };
%apply int *OUTPUT { int *index, int *boundary, int *enabled };
%apply float *OUTPUT { float *lr, float *norm };
%apply size_t *OUTPUT { size_t *tag_len };

/* ---- an array of layer handles (dst_checkpoint_save / dst_checkpoint_load) --------------------- */
%array_functions(dst_layer *, dst_layer_array);

/* Filled by the library (a static string): read-only, which also avoids SWIG's leaking setter. */
%immutable dst_param_info::name;
/* Owned by the optimizer: read-only for the same reason. */
%immutable dst_optimizer_tensor_info::name;

/* ---- the per-language part ------------------------------------------------------------------- */
#ifdef SWIGPYTHON
%include "python_typemaps.i"
#endif


/* ---- shape helpers (method names avoid the dst_<struct>_<name> C names of the API) ------------ */
%extend dst_tensor {
  /* A tensor view of `ndim` dimensions; extents past ndim are ignored and may be left out. */
  dst_tensor(void *data, dst_dtype dtype, int32_t ndim, int64_t d0, int64_t d1 = 1, int64_t d2 = 1,
             int64_t d3 = 1) {
    dst_tensor *t = (dst_tensor *)calloc(1, sizeof(dst_tensor));
    if (!t) return NULL;
    t->data = data;
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->shape[3] = d3;
    return t;
  }
  dst_tensor() { return (dst_tensor *)calloc(1, sizeof(dst_tensor)); }
  ~dst_tensor() { free($self); }
  /* Extent of dimension i (0 <= i < DST_MAX_DIMS); -1 for an index out of range. */
  int64_t getDim(int i) const { return (i >= 0 && i < DST_MAX_DIMS) ? $self->shape[i] : -1; }
  /* Sets the extent of dimension i; returns 0, or -1 for an index out of range. */
  int setDim(int i, int64_t extent) {
    if (i < 0 || i >= DST_MAX_DIMS) return -1;
    $self->shape[i] = extent;
    return 0;
  }
}

%extend dst_param_info {
  /* Extent of dimension i (0 or 1); -1 for an index out of range. */
  int64_t getDim(int i) const { return (i >= 0 && i < 2) ? $self->shape[i] : -1; }
}

/* ---- the optimizer's and the engine's structs: constructors that fill struct_size (and the
   defaults where the API has a default() call), so that no language has to know sizeof ------------ */
%define DST_DEFAULTED_STRUCT(TYPE, DEFAULT)
%extend TYPE {
  TYPE() {
    TYPE *s = (TYPE *)calloc(1, sizeof(TYPE));
    if (s) DEFAULT(s);
    return s;
  }
  ~TYPE() { free($self); }
}
%enddef
%define DST_SIZED_STRUCT(TYPE)
%extend TYPE {
  TYPE() {
    TYPE *s = (TYPE *)calloc(1, sizeof(TYPE));
    if (s) s->struct_size = sizeof(TYPE);
    return s;
  }
  ~TYPE() { free($self); }
}
%enddef
DST_DEFAULTED_STRUCT(dst_optimizer_config, dst_optimizer_config_default)
DST_DEFAULTED_STRUCT(dst_param_group, dst_param_group_default)
DST_DEFAULTED_STRUCT(dst_engine_load_options, dst_engine_load_options_default)
DST_SIZED_STRUCT(dst_optimizer_tensor_info)
DST_SIZED_STRUCT(dst_engine_state)
%extend dst_optimizer_tensor_info {
  /* Extent of dimension i (0 <= i < DST_MAX_DIMS); -1 for an index out of range. */
  int64_t getDim(int i) const { return (i >= 0 && i < DST_MAX_DIMS) ? $self->shape[i] : -1; }
}

%include "dstransformer/dstransformer.h"
